//! Feeds arbitrary packets to a host whose QPs of every type are ready (RC, UC, UD and an
//! XRC receive QP with an XRC SRQ), with receive buffers posted and registered memory, then
//! lets the engine answer. The engine must never panic, and whatever it sends must parse.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Host};
use softverbs_transport::wr::{RecvWr, Sge};
use softverbs_transport::{Instant, RxMeta, MAX_PACKET};

fuzz_target!(|data: &[u8]| {
    let mut h = Host::new("192.0.2.9".parse().unwrap(), Mtu::M1024);
    let peer = softverbs_core::device::Gid::from_ip("192.0.2.8".parse().unwrap());
    let c = h.context(1, 1 << 16);
    let pd = h.pd(c);
    let key = h.mr(pd, 0, 1 << 16, Access(0x0f));
    let cq = h.cq(c);
    let mut qpns = Vec::new();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let q = h.qp(t, pd, cq, None);
        h.connect(q, peer, 0x99, ConnParams::default());
        for i in 0..4 {
            let _ = h.engine.post_recv(q, RecvWr { wr_id: i, sges: vec![Sge { addr: i * 4096, length: 4096, lkey: key }] });
        }
        qpns.push(q);
    }
    let x = h.xrcd(c, 5);
    let (srq, srqn) = h.xrc_srq(pd, x, cq, 16);
    let _ = h.engine.post_srq_recv(srq, RecvWr { wr_id: 9, sges: vec![Sge { addr: 0, length: 4096, lkey: key }] });
    let (_, tgt) = h.xrc_recv_qp(c, x);
    h.connect(tgt, peer, 0x98, ConnParams::default());
    qpns.push(tgt);
    let meta = RxMeta { sgid: peer, dgid: h.gid };
    let mut buf = vec![0u8; MAX_PACKET];
    // Packets are separated by 0xFF 0xFE; the first byte of each picks the target QP, so the
    // packet reaches real QP state instead of being dropped for an unknown DestQP.
    for (n, chunk) in data.split(|&b| b == 0xFE).enumerate() {
        let Some((&pick, rest)) = chunk.split_first() else { continue };
        let mut pkt = rest.to_vec();
        if pkt.len() >= 12 {
            let qpn = qpns[pick as usize % qpns.len()];
            pkt[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            if pick & 0x80 != 0 && pkt.len() >= 16 {
                pkt[12..16].copy_from_slice(&srqn.to_be_bytes());
            }
        }
        let now = Instant(n as u64 * 1000);
        h.engine.handle_packet(now, &h.core, &mut h.mem, meta, &pkt);
        while let Some(tx) = h.engine.poll_transmit(now, &h.core, &mut h.mem, &mut buf) {
            assert!(softverbs_wire::Packet::parse(&buf[..tx.len]).is_ok(), "the engine emits only well-formed packets");
        }
        h.pump();
    }
});
