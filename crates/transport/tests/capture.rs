//! A capture of a real engine run — RC, UC, UD and XRC traffic between two hosts, every
//! request and response kind — decodes in tshark with the shipped plugin: no malformed
//! packets, every ICRC good, every XRC request's SRQ number decoded; and copies with a
//! flipped byte are flagged as bad ICRCs.

use std::time::Duration;

use softverbs_core::mw::MwType;
use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_testkit::{frame_numbers, tshark, tshark_available};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{BindMw, Payload, RecvWr, SendOp, SendWr, Sge, UdDest};
use softverbs_wire::pcap::{ethernet_frame, PcapWriter};

const ALL: Access = Access(0x0f);

fn traffic() -> (Vec<(u64, Vec<u8>)>, u32) {
    let mut a = Host::new("198.51.100.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("198.51.100.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, 1 << 20);
    let cb = b.context(2, 1 << 20);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, 1 << 20, ALL);
    let kb = b.mr(pb, 0, 1 << 20, ALL | Access::MW_BIND);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let (ga, gb) = (a.gid, b.gid);
    let p = ConnParams::default();
    let sges = |addr, length| {
        Payload::Sges(vec![Sge {
            addr,
            length,
            lkey: ka,
        }])
    };
    let recv = |i: u64| RecvWr {
        wr_id: i,
        sges: vec![Sge {
            addr: 0x80000 + i * 8192,
            length: 8192,
            lkey: kb,
        }],
    };
    // RC: every request kind.
    let (qa, qb) = (
        a.qp(QpType::Rc, pa, cqa, None),
        b.qp(QpType::Rc, pb, cqb, None),
    );
    a.connect(qa, gb, qb, p);
    b.connect(qb, ga, qa, p);
    for i in 0..3 {
        b.engine.post_recv(qb, recv(i)).unwrap();
    }
    // The Send with Invalidate names a type 2 window bound to qb (anything else is an
    // invalid request); the bind runs on B's send queue before any packet arrives.
    let (_, k0) = b.mw(pb, MwType::Two);
    let window = BindMw {
        mw_rkey: k0,
        new_rkey: k0 | 0x77,
        mr_lkey: kb,
        addr: 0x60000,
        length: 4096,
        access: Access::REMOTE_WRITE,
    };
    b.engine
        .post_send(
            qb,
            SendWr::new(90, SendOp::BindMw(window), Payload::Sges(vec![])),
        )
        .unwrap();
    b.pump();
    a.engine
        .post_send(qa, SendWr::new(1, SendOp::Send, sges(0, 3000)))
        .unwrap();
    a.engine
        .post_send(qa, SendWr::new(2, SendOp::SendWithImm(0x1234), sges(0, 10)))
        .unwrap();
    a.engine
        .post_send(
            qa,
            SendWr::new(3, SendOp::SendWithInv(k0 | 0x77), sges(0, 0)),
        )
        .unwrap();
    a.engine
        .post_send(
            qa,
            SendWr::new(
                4,
                SendOp::Write {
                    remote_addr: 0x10000,
                    rkey: kb,
                },
                sges(0, 2500),
            ),
        )
        .unwrap();
    a.engine
        .post_send(
            qa,
            SendWr::new(
                5,
                SendOp::Read {
                    remote_addr: 0x10000,
                    rkey: kb,
                },
                sges(0x20000, 2500),
            ),
        )
        .unwrap();
    a.engine
        .post_send(
            qa,
            SendWr::new(
                6,
                SendOp::CompareSwap {
                    remote_addr: 0x30000,
                    rkey: kb,
                    compare: 0,
                    swap: 9,
                },
                sges(0x30000, 8),
            ),
        )
        .unwrap();
    a.engine
        .post_send(
            qa,
            SendWr::new(
                7,
                SendOp::FetchAdd {
                    remote_addr: 0x30000,
                    rkey: kb,
                    add: 1,
                },
                sges(0x30008, 8),
            ),
        )
        .unwrap();
    // UC.
    let (ua, ub) = (
        a.qp(QpType::Uc, pa, cqa, None),
        b.qp(QpType::Uc, pb, cqb, None),
    );
    a.connect(ua, gb, ub, p);
    b.connect(ub, ga, ua, p);
    b.engine.post_recv(ub, recv(10)).unwrap();
    a.engine
        .post_send(ua, SendWr::new(10, SendOp::Send, sges(0, 2100)))
        .unwrap();
    a.engine
        .post_send(
            ua,
            SendWr::new(
                11,
                SendOp::WriteWithImm {
                    remote_addr: 0x40000,
                    rkey: kb,
                    imm: 5,
                },
                sges(0, 100),
            ),
        )
        .unwrap();
    b.engine.post_recv(ub, recv(11)).unwrap();
    // UD.
    let (da, db) = (
        a.qp(QpType::Ud, pa, cqa, None),
        b.qp(QpType::Ud, pb, cqb, None),
    );
    a.connect(da, gb, db, p);
    b.connect(db, ga, da, p);
    b.engine.post_recv(db, recv(20)).unwrap();
    let mut ud = SendWr::new(20, SendOp::Send, sges(0, 512));
    ud.ud = Some(UdDest {
        dgid: gb,
        dest_qpn: db,
        qkey: p.qkey,
    });
    a.engine.post_send(da, ud).unwrap();
    // XRC.
    let xrcd = b.xrcd(cb, 99);
    let (srq, srqn) = b.xrc_srq(pb, xrcd, cqb, 64);
    let (_h, tgt) = b.xrc_recv_qp(cb, xrcd);
    let xa = a.qp(QpType::XrcSend, pa, cqa, None);
    a.connect(xa, gb, tgt, p);
    b.connect(tgt, ga, xa, p);
    b.engine.post_srq_recv(srq, recv(30)).unwrap();
    for (i, op) in [
        SendOp::Send,
        SendOp::Read {
            remote_addr: 0x10000,
            rkey: kb,
        },
        SendOp::FetchAdd {
            remote_addr: 0x30000,
            rkey: kb,
            add: 2,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let len = if op.is_atomic() { 8 } else { 1500 };
        let mut w = SendWr::new(30 + i as u64, op, sges(0x50000 + i as u64 * 4096, len));
        w.remote_srqn = srqn;
        a.engine.post_send(xa, w).unwrap();
    }
    let mut net = Network::new(vec![a, b], Faults::NONE, 3);
    net.capture = Some(Vec::new());
    assert!(
        net.run_until(Duration::from_secs(1), |n| n.hosts[0].completions.len()
            == 13)
    );
    assert!(net.hosts.iter().all(|h| h.failures.is_empty()));
    let frames = net
        .capture
        .take()
        .unwrap()
        .into_iter()
        .map(|(t, d)| (t.0, d))
        .collect();
    (frames, srqn)
}

#[test]
fn a_capture_of_every_transport_decodes_in_tshark_with_good_icrcs() {
    if tshark_available().is_none() {
        return;
    }
    let (frames, srqn) = traffic();
    let dir = std::env::temp_dir().join(format!("sv-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    for (t, d) in &frames {
        w.write_frame(Duration::from_nanos(*t), &ethernet_frame(d).unwrap())
            .unwrap();
    }
    // Copies with one flipped byte in the IB payload area: the plugin must flag them.
    let mut bad = Vec::new();
    for (t, d) in frames.iter().step_by(7).take(4) {
        let mut c = d.clone();
        let at = c.len() - 6;
        c[at] ^= 0x10;
        w.write_frame(Duration::from_nanos(*t), &ethernet_frame(&c).unwrap())
            .unwrap();
        bad.push(frames.len() + bad.len() + 1);
    }
    w.flush().unwrap();
    drop(w);
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let out = tshark(
        &path,
        &home,
        &[
            "-T",
            "fields",
            "-e",
            "frame.number",
            "-e",
            "_ws.malformed",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "softverbs.icrc.status",
            "-e",
            "softverbs.xrceth.srqn",
        ],
    );
    let mut opcodes = std::collections::BTreeSet::new();
    let mut xrc_requests = 0;
    for line in out.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let n: usize = f[0].parse().unwrap();
        assert!(f[1].is_empty(), "frame {n} is malformed: {line}");
        let opcode: u8 = f[2].parse().unwrap();
        opcodes.insert(opcode);
        let want = if bad.contains(&n) { "bad" } else { "good" };
        assert_eq!(f[3], want, "frame {n}: {line}");
        if !f[4].is_empty() {
            assert_eq!(
                u32::from_str_radix(f[4].trim_start_matches("0x"), 16).unwrap(),
                srqn
            );
            xrc_requests += 1;
        }
    }
    assert_eq!(out.lines().count(), frames.len() + bad.len());
    // RC SEND/WRITE/READ/atomics and their responses, UC, UD and XRC all appear.
    for op in [
        0x00u8, 0x01, 0x02, 0x05, 0x17, 0x06, 0x07, 0x08, 0x0c, 0x0d, 0x0e, 0x0f, 0x11, 0x12, 0x13,
        0x14, 0x20, 0x21, 0x22, 0x2b, 0x64, 0xa0, 0xa2, 0xac, 0xad, 0xaf, 0xb1, 0xb2, 0xb4,
    ] {
        assert!(
            opcodes.contains(&op),
            "opcode {op:#04x} missing from the capture: {opcodes:x?}"
        );
    }
    assert!(xrc_requests >= 3);
    let flagged = frame_numbers(&tshark(
        &path,
        &home,
        &[
            "-Y",
            "softverbs.icrc.status == \"bad\"",
            "-T",
            "fields",
            "-e",
            "frame.number",
        ],
    ));
    assert_eq!(flagged, bad);
    let _ = std::fs::remove_dir_all(&dir);
}
