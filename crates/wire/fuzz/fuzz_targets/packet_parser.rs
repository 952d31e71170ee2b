//! Parses arbitrary bytes as an IB transport packet and as a RoCE v2 datagram. Whatever
//! parses must re-emit to the same length and parse back to the same headers and payload
//! (reserved bits and pad contents are not kept, so bytes may differ only there), and
//! emitting must leave the ICRC slot for `icrc::write` to fill consistently.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_wire::{emit_packet, icrc, ip, parse_roce_v2, Packet};

fuzz_target!(|data: &[u8]| {
    if let Ok(pkt) = Packet::parse(data) {
        let mut buf = vec![0u8; data.len()];
        let n = emit_packet(&pkt.headers, pkt.payload, &mut buf).expect("parsed headers re-emit");
        assert_eq!(n, data.len());
        let again = Packet::parse(&buf[..n]).expect("re-emitted packet parses");
        assert_eq!(again.headers, pkt.headers);
        assert_eq!(again.payload, pkt.payload);
        assert_eq!(again.info, pkt.info);
    }

    if let Ok((ip_udp, ib)) = ip::split_ip_udp(data) {
        // Any datagram whose ICRC we rewrite must then verify, and parse_roce_v2 must agree
        // with Packet::parse on the same bytes.
        let mut ib = ib.to_vec();
        if icrc::write(ip_udp, &mut ib).is_ok() {
            icrc::verify(ip_udp, &ib).expect("freshly written ICRC verifies");
        }
        let direct = Packet::parse(&ib).map(|p| (p.headers, p.payload.to_vec()));
        let mut datagram = ip_udp.to_vec();
        datagram.extend_from_slice(&ib);
        if let Ok(d) = parse_roce_v2(&datagram) {
            assert_eq!(direct, Ok((d.packet.headers, d.packet.payload.to_vec())));
        }
    }
});
