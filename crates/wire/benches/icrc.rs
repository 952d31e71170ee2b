//! ICRC cost per packet size, and whole-packet parse cost: the two per-packet costs the
//! datapath pays on every received RoCE v2 packet (docs/design/measurements.md §5 measured
//! ~97 ns per 4 KiB for a bare crc32fast call).

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softverbs_wire::ip::{IpRepr, Ipv4Repr, UdpRepr, ROCE_V2_UDP_PORT};
use softverbs_wire::{emit_roce_v2, icrc, roce_v2_len, Headers, Opcode, Packet, PacketBuilder};

/// An IPv4 RoCE v2 datagram carrying an RC SEND_ONLY with `payload_len` bytes; returns
/// the datagram and where the IB packet starts.
fn datagram(payload_len: usize) -> (Vec<u8>, usize) {
    let ip = IpRepr::V4(Ipv4Repr::new(
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(10, 0, 0, 2),
    ));
    let udp = UdpRepr {
        src_port: 0xC001,
        dst_port: ROCE_V2_UDP_PORT,
    };
    let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
    let headers: Headers = *PacketBuilder::new(Opcode(0x04), 0x11, 0x100)
        .ack_req(true)
        .headers();
    let mut buf = vec![0u8; roce_v2_len(&ip, &headers, payload_len)];
    let n = emit_roce_v2(&ip, &udp, &headers, &payload, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    (buf, ip.header_len() + 8)
}

fn bench_icrc(c: &mut Criterion) {
    let mut group = c.benchmark_group("icrc");
    // "64 B" = a 64-byte IB packet (BTH + 48 B payload + ICRC); "4 KiB" = a full
    // 4096-byte path-MTU payload.
    for (name, payload_len) in [("64B", 48usize), ("4KiB", 4096)] {
        let (buf, ib_at) = datagram(payload_len);
        let (ip_udp, ib) = buf.split_at(ib_at);
        group.throughput(Throughput::Bytes(ib.len() as u64));
        group.bench_function(format!("compute/{name}"), |b| {
            b.iter(|| icrc::compute(black_box(ip_udp), black_box(&ib[..ib.len() - 4])).unwrap())
        });
        group.bench_function(format!("verify/{name}"), |b| {
            b.iter(|| icrc::verify(black_box(ip_udp), black_box(ib)).unwrap())
        });
        // The same packet as a kernel rxe peer's, received on a UDP socket: the header
        // shows identification 0, the ICRC was computed with 0x7be9 (one failed CRC pass,
        // then the solver; docs/design/roce-wire.md §6).
        let mut rxe = buf.clone();
        rxe[4..6].copy_from_slice(&0x7be9u16.to_be_bytes());
        let (rxe_hdr, rxe_ib) = rxe.split_at_mut(ib_at);
        icrc::write(rxe_hdr, rxe_ib).unwrap();
        group.bench_function(format!("solve_identification/{name}"), |b| {
            b.iter(|| icrc::solve_identification(black_box(ip_udp), black_box(&*rxe_ib)).unwrap())
        });
        // Floor: one bare CRC-32 over the same number of bytes, no masking or copying.
        let whole = &buf[..];
        group.bench_function(format!("bare_crc32fast/{name}"), |b| {
            b.iter(|| crc32fast::hash(black_box(whole)))
        });
    }
    group.finish();
}

fn bench_parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse");
    let (buf, ib_at) = datagram(4096);
    let ib = &buf[ib_at..];
    group.throughput(Throughput::Bytes(ib.len() as u64));
    group.bench_function("packet/4KiB", |b| {
        b.iter(|| Packet::parse(black_box(ib)).unwrap().payload.len())
    });
    group.bench_function("datagram_with_icrc/4KiB", |b| {
        b.iter(|| {
            softverbs_wire::parse_roce_v2(black_box(&buf))
                .unwrap()
                .packet
                .payload
                .len()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_icrc, bench_parse);
criterion_main!(benches);
