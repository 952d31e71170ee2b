//! Packets per second through requester + responder (+ completer, for ACKs) on one core,
//! for 64-byte and 4 KiB SENDs, with and without the ICRC a real wire needs (computed at
//! the sender over synthesized IPv4/UDP headers and checked at the receiver).
//!
//! `cargo bench -p softverbs-transport --bench engine`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Host};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge};
use softverbs_transport::{Instant, RxMeta, MAX_PACKET};
use softverbs_wire::icrc;
use softverbs_wire::ip::{emit_ip_udp, IpRepr, Ipv4Repr, UdpRepr, ROCE_V2_UDP_PORT};

const BATCH: u64 = 512;

struct Pair {
    a: Host,
    b: Host,
    qa: u32,
    qb: u32,
    ka: u32,
    kb: u32,
}

fn pair(mtu: Mtu) -> Pair {
    let mut a = Host::new("10.1.0.1".parse().unwrap(), mtu);
    let mut b = Host::new("10.1.0.2".parse().unwrap(), mtu);
    let ca = a.context(1, 1 << 16);
    let cb = b.context(2, 1 << 16);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, 1 << 16, Access::LOCAL_WRITE);
    let kb = b.mr(pb, 0, 1 << 16, Access::LOCAL_WRITE);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let (ga, gb) = (a.gid, b.gid);
    let p = ConnParams {
        mtu,
        ..ConnParams::default()
    };
    a.connect(qa, gb, qb, p);
    b.connect(qb, ga, qa, p);
    Pair {
        a,
        b,
        qa,
        qb,
        ka,
        kb,
    }
}

/// Moves `BATCH` messages of `size` bytes from a to b, with b's ACKs flowing back; returns
/// the number of packets that crossed.
fn run(p: &mut Pair, size: u32, with_icrc: bool, buf: &mut [u8], dgram: &mut [u8]) -> u64 {
    for i in 0..BATCH {
        p.b.engine
            .post_recv(
                p.qb,
                RecvWr {
                    wr_id: i,
                    sges: vec![Sge {
                        addr: 0x8000,
                        length: size,
                        lkey: p.kb,
                    }],
                },
            )
            .unwrap();
        let mut wr = SendWr::new(
            i,
            SendOp::Send,
            Payload::Sges(vec![Sge {
                addr: 0,
                length: size,
                lkey: p.ka,
            }]),
        );
        wr.signaled = i + 1 == BATCH;
        p.a.engine.post_send(p.qa, wr).unwrap();
    }
    let (ma, mb) = (
        RxMeta {
            sgid: p.b.gid,
            dgid: p.a.gid,
        },
        RxMeta {
            sgid: p.a.gid,
            dgid: p.b.gid,
        },
    );
    let ip = IpRepr::V4(Ipv4Repr::new(
        "10.1.0.1".parse().unwrap(),
        "10.1.0.2".parse().unwrap(),
    ));
    let now = Instant(0);
    let mut packets = 0;
    loop {
        let mut moved = false;
        while let Some(tx) = p.a.engine.poll_transmit(now, &p.a.core, &mut p.a.mem, buf) {
            let pkt = wire(&ip, tx.udp_sport, &buf[..tx.len], with_icrc, dgram);
            p.b.engine
                .handle_packet(now, &p.b.core, &mut p.b.mem, mb, pkt);
            packets += 1;
            moved = true;
        }
        while let Some(tx) = p.b.engine.poll_transmit(now, &p.b.core, &mut p.b.mem, buf) {
            let pkt = wire(&ip, tx.udp_sport, &buf[..tx.len], with_icrc, dgram);
            p.a.engine
                .handle_packet(now, &p.a.core, &mut p.a.mem, ma, pkt);
            packets += 1;
            moved = true;
        }
        while p.a.engine.poll_output().is_some() {}
        while p.b.engine.poll_output().is_some() {}
        if !moved {
            break;
        }
    }
    assert_eq!(
        p.a.engine.send_queue_len(p.qa),
        0,
        "every message acknowledged"
    );
    packets
}

/// With `with_icrc`, does what a wire does to a packet: IP/UDP headers, ICRC written,
/// ICRC checked; returns the IB packet to hand over.
fn wire<'a>(
    ip: &IpRepr,
    sport: u16,
    pkt: &'a [u8],
    with_icrc: bool,
    dgram: &'a mut [u8],
) -> &'a [u8] {
    if !with_icrc {
        return pkt;
    }
    let udp = UdpRepr {
        src_port: sport,
        dst_port: ROCE_V2_UDP_PORT,
    };
    let hl = emit_ip_udp(ip, &udp, pkt.len(), dgram).unwrap();
    dgram[hl..hl + pkt.len()].copy_from_slice(pkt);
    let (h, rest) = dgram.split_at_mut(hl);
    icrc::write(h, &mut rest[..pkt.len()]).unwrap();
    icrc::verify(h, &rest[..pkt.len()]).unwrap();
    &rest[..pkt.len()]
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    let mut buf = vec![0u8; MAX_PACKET];
    let mut dgram = vec![0u8; MAX_PACKET + 64];
    for (size, mtu) in [(64u32, Mtu::M1024), (4096, Mtu::M4096)] {
        for with_icrc in [false, true] {
            // Count packets once to set the throughput unit (data packets + ACKs).
            let mut probe = pair(mtu);
            let per_batch = run(&mut probe, size, with_icrc, &mut buf, &mut dgram);
            g.throughput(Throughput::Elements(per_batch));
            let name = format!("rc_send_{size}B{}", if with_icrc { "_icrc" } else { "" });
            g.bench_function(name, |bch| {
                bch.iter_batched_ref(
                    || pair(mtu),
                    |p| run(p, size, with_icrc, &mut buf, &mut dgram),
                    BatchSize::LargeInput,
                )
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
