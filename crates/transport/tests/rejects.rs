//! Issue 37, item 3: every packet the engine drops is counted once, by the first of IBA
//! 9.6's checks it fails (`softverbs_transport::Reject`), and `handle_packet` says which,
//! so the daemon can mark it in a capture. One packet per reason at a host with an RC QP
//! connected to a peer, a UD QP and an RC QP never connected; then a packet the RC QP takes.

use std::net::IpAddr;

use softverbs_core::device::Gid;
use softverbs_core::types::{Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Host};
use softverbs_transport::{Reject, RxMeta};
use softverbs_wire::{emit_packet, AethRepr, BthRepr, DethRepr, Headers, Opcode, Syndrome};

fn gid(s: &str) -> Gid {
    Gid::from_ip(s.parse::<IpAddr>().unwrap())
}

/// IBA Table 38: RC SEND_ONLY, RC ACKNOWLEDGE, UD SEND_ONLY.
const RC_SEND_ONLY: u8 = 0x04;
const RC_ACK: u8 = 0x11;
const UD_SEND_ONLY: u8 = 0x64;

fn packet(h: &Headers, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; softverbs_wire::packet_len(h, payload.len())];
    emit_packet(h, payload, &mut p).unwrap();
    p
}

fn send(op: u8, qpn: u32, psn: u32) -> Headers {
    Headers::new(BthRepr::new(Opcode(op), qpn, psn))
}

#[test]
fn each_drop_is_counted_once_by_its_reason() {
    let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
    let (me, other_addr) = (b.gid, gid("10.0.0.3"));
    let (peer, stranger) = (gid("10.0.0.1"), gid("10.0.0.66"));
    // The port's addresses: 10.0.0.2 (GID 0, the QPs' own) and 10.0.0.3.
    b.engine.set_gids(vec![me, other_addr]);
    let ctx = b.context(1, 1 << 16);
    let pd = b.pd(ctx);
    let cq = b.cq(ctx);
    let rc = b.qp(QpType::Rc, pd, cq, None);
    b.connect(rc, peer, 5, ConnParams::default());
    let ud = b.qp(QpType::Ud, pd, cq, None);
    b.connect(ud, peer, 0, ConnParams::default());
    let idle = b.qp(QpType::Rc, pd, cq, None);
    let from = |sgid| RxMeta { sgid, dgid: me };

    let bad_pkey = {
        let mut h = send(RC_SEND_ONLY, rc, 0);
        h.bth.pkey = 0x8001;
        h
    };
    let ud_send = |qkey| {
        let mut h = send(UD_SEND_ONLY, ud, 0);
        h.deth = Some(DethRepr { qkey, src_qp: 9 });
        h
    };
    let ghost_ack = {
        let mut h = send(RC_ACK, rc, 0x40_0000);
        h.aeth = Some(AethRepr {
            syndrome: Syndrome::Ack {
                credits: Syndrome::UNLIMITED_CREDITS,
            },
            msn: 0,
        });
        h
    };
    let cases: Vec<(Reject, RxMeta, Vec<u8>)> = vec![
        (Reject::Malformed, from(peer), vec![RC_SEND_ONLY, 0, 0xff]),
        (
            Reject::UnknownQp,
            from(peer),
            packet(&send(RC_SEND_ONLY, 0xABCDE, 0), b"x"),
        ),
        (
            Reject::QpState,
            from(peer),
            packet(&send(RC_SEND_ONLY, idle, 0), b"x"),
        ),
        (
            Reject::BadOpcode,
            from(peer),
            packet(&ud_send(0x1111_1111).with_qp(rc), b"x"),
        ),
        (
            Reject::ForeignSource,
            from(stranger),
            packet(&send(RC_SEND_ONLY, rc, 0), b"x"),
        ),
        (
            Reject::WrongDest,
            RxMeta {
                sgid: peer,
                dgid: other_addr,
            },
            packet(&send(RC_SEND_ONLY, rc, 0), b"x"),
        ),
        (Reject::BadPkey, from(peer), packet(&bad_pkey, b"x")),
        (
            Reject::BadQkey,
            from(peer),
            packet(&ud_send(0x2222_2222), b"x"),
        ),
        (
            Reject::NoRecv,
            from(stranger),
            packet(&ud_send(0x1111_1111), b"x"),
        ),
        (Reject::PsnWindow, from(peer), packet(&ghost_ack, &[])),
    ];
    let now = softverbs_transport::Instant(1);
    for (want, meta, bytes) in &cases {
        let got = b
            .engine
            .handle_packet(now, &b.core, &mut b.mem, *meta, bytes);
        assert_eq!(got, Some(*want), "{want:?}");
    }
    let r = b.engine.rejects();
    for &want in Reject::ALL {
        // The shell's reasons (ICRC, forged own source) are not the engine's.
        let n = u64::from(cases.iter().any(|c| c.0 == want));
        assert_eq!(r.get(want), n, "{}", want.name());
    }
    // The connected QP takes a SEND from its peer at its address (an RNR NAK answers it: no
    // receive is posted), and nothing more is counted as rejected.
    let good = packet(&send(RC_SEND_ONLY, rc, 0), b"x");
    assert_eq!(
        b.engine
            .handle_packet(now, &b.core, &mut b.mem, from(peer), &good),
        None
    );
    assert_eq!(b.engine.rejects().total(), cases.len() as u64);
    let s = b.engine.drop_stats();
    assert_eq!((s.foreign_source, s.outside_window), (1, 1));
}

trait WithQp {
    fn with_qp(self, qpn: u32) -> Headers;
}

impl WithQp for Headers {
    /// The same headers to QP `qpn`.
    fn with_qp(mut self, qpn: u32) -> Headers {
        self.bth.dest_qp = qpn;
        self
    }
}
