//! Issue 37, item 3: packets a daemon drops are visible. Each reason has a port counter
//! (`rx_drop_*` in `softverbs stat` and `resources`, `rx_drops` per port in `status --json`,
//! a line per port in `status`), and `--capture-rejected` keeps the dropped packets in the
//! capture (pcapng), each with its reason as a packet comment; without it they are left out.
//!
//! The packets are crafted with the wire crate and sent from plain UDP sockets on loopback
//! addresses of the test's own (run it inside `unshare --net`, docs/guide/capture.md).

mod common;
use common::connect;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use softverbs::{Context, QpInit, QpType};
use softverbs_testkit::Daemon;
use softverbs_wire::ip::{emit_ip_udp, IpRepr, Ipv4Repr, UdpRepr, ROCE_V2_UDP_PORT};
use softverbs_wire::pcap::ethernet_payload;
use softverbs_wire::pcapng::PcapngReader;
use softverbs_wire::{emit_packet, icrc, BthRepr, Headers, Opcode};

/// Far more than the daemon needs, so a loaded machine does not fail the test.
const DEADLINE: Duration = Duration::from_secs(30);

/// IBA Table 38: RC SEND_ONLY.
const RC_SEND_ONLY: u8 = 0x04;

fn dir(name: &str) -> (common::Dir, PathBuf) {
    common::dir("svrejects", name)
}

/// Sends RoCE v2 packets from its own UDP socket, with the ICRC the receiver computes over
/// the headers the kernel puts on the wire (IPv4 identification 0: DF on an unconnected
/// socket), or a wrong one.
struct Sender {
    sock: UdpSocket,
    src: SocketAddr,
}

impl Sender {
    fn bind(ip: Ipv4Addr) -> Sender {
        let sock = softverbs_testkit::roce_udp_socket((ip, 0)).unwrap();
        let src = sock.local_addr().unwrap();
        Sender { sock, src }
    }

    fn send(&self, to: Ipv4Addr, mut ib: Vec<u8>, good_icrc: bool) {
        let IpAddr::V4(src) = self.src.ip() else {
            unreachable!()
        };
        let ip = IpRepr::V4(Ipv4Repr::new(src, to));
        let udp = UdpRepr {
            src_port: self.src.port(),
            dst_port: ROCE_V2_UDP_PORT,
        };
        let mut hdr = [0u8; 48];
        let hl = emit_ip_udp(&ip, &udp, ib.len(), &mut hdr).unwrap();
        icrc::write(&hdr[..hl], &mut ib).unwrap();
        if !good_icrc {
            let n = ib.len();
            ib[n - 1] ^= 0x5a;
        }
        self.sock.send_to(&ib, (to, ROCE_V2_UDP_PORT)).unwrap();
    }
}

/// An RC SEND_ONLY of 8 bytes to QP `qpn`, PSN `psn` (ICRC slot zero).
fn rc_send(qpn: u32, psn: u32) -> Vec<u8> {
    let h = Headers::new(BthRepr::new(Opcode(RC_SEND_ONLY), qpn, psn));
    let mut p = vec![0u8; softverbs_wire::packet_len(&h, 8)];
    emit_packet(&h, b"rejected", &mut p).unwrap();
    p
}

/// The `rx_drop_*` counters of the daemon's one port, from `softverbs stat --json`.
fn drops(d: &Daemon) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&d.cli(&["stat", "--json"])).unwrap();
    v["ports"][0].clone()
}

/// Waits until the port has counted `total` rejected packets in all, then returns its row.
fn wait_for_drops(d: &Daemon, total: u64) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let p = drops(d);
        let sum: u64 = p
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("rx_drop_"))
            .map(|(_, v)| v.as_u64().unwrap())
            .sum();
        if sum >= total {
            return p;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "after {DEADLINE:?} the port counted {sum} of {total} rejected packets: {p}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A packet of a pcapng capture: its IPv4 source and destination, BTH destination QP, and
/// its comment.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    dest_qp: u32,
    comment: Option<String>,
}

/// `(source, destination, BTH destination QP)` of a captured Ethernet frame holding an IPv4
/// RoCE v2 packet.
fn roce_v4(frame: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, u32)> {
    let dgram = ethernet_payload(frame)?;
    let (ip_udp, ib) = softverbs_wire::ip::split_ip_udp(dgram).ok()?;
    if ip_udp.len() < 20 || ip_udp[0] >> 4 != 4 || ib.len() < 12 {
        return None;
    }
    let addr =
        |at: usize| Ipv4Addr::new(ip_udp[at], ip_udp[at + 1], ip_udp[at + 2], ip_udp[at + 3]);
    Some((addr(12), addr(16), softverbs_wire::bth::dest_qp_of(ib)))
}

fn read_pcapng(path: &Path) -> Vec<Seen> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let Ok(mut r) = PcapngReader::new(&bytes[..]) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Ok(Some(rec)) = r.next_record() {
        let Some((src, dst, dest_qp)) = roce_v4(&rec.data) else {
            continue;
        };
        out.push(Seen {
            src,
            dst,
            dest_qp,
            comment: rec.comment,
        });
    }
    out
}

/// The five kinds of rejected packet the test sends: `(counter, reason in the capture,
/// how many)`.
const SENT: &[(&str, &str, u64)] = &[
    ("rx_drop_bad_icrc", "softverbs: rejected: bad ICRC", 3),
    ("rx_drop_unknown_qp", "softverbs: rejected: unknown QP", 2),
    (
        "rx_drop_foreign_source",
        "softverbs: rejected: source is not the QP's peer",
        2,
    ),
    (
        "rx_drop_wrong_dest",
        "softverbs: rejected: wrong destination address",
        1,
    ),
    ("rx_drop_bad_qkey", "softverbs: rejected: bad Q_Key", 1),
];

/// A daemon whose one device has addresses `net.10` (GID 0) and `net.11` (GID 1), an RC QP
/// of it connected to `net.20` from GID 0, and the rejected packets of [`SENT`]: a bad ICRC
/// (from the peer, to the QP), an unknown QP, a foreign source (`net.21`), and a packet from
/// the peer to the QP at the device's other address, and a MAD for the CM (QP1) with a Q_Key
/// that is not the GSI's. Returns the daemon's port row once it
/// counted them all, the QP's number, and the three addresses.
fn reject_some(d: &Daemon, net: u8) -> (serde_json::Value, u32) {
    let a = Ipv4Addr::new(127, 37, net, 10);
    let b = Ipv4Addr::new(127, 37, net, 11);
    let peer = Ipv4Addr::new(127, 37, net, 20);
    let stranger = Ipv4Addr::new(127, 37, net, 21);
    // Nothing rejected yet.
    let p = drops(d);
    for (name, _, _) in SENT {
        assert_eq!(p[name], 0, "{name} before anything was sent: {p}");
    }
    let c = Context::open_at(&d.socket, 0).unwrap();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16).unwrap();
    let qp = c
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq))
        .unwrap();
    connect(&qp, softverbs::Gid::from_ip(IpAddr::V4(peer)), 0x77);
    let q = qp.qpn();
    let from_peer = Sender::bind(peer);
    for _ in 0..3 {
        from_peer.send(a, rc_send(q, 0), false);
    }
    for k in 0..2 {
        from_peer.send(a, rc_send(0xABC00 + k, 0), true);
    }
    let from_stranger = Sender::bind(stranger);
    for _ in 0..2 {
        from_stranger.send(a, rc_send(q, 0), true);
    }
    from_peer.send(b, rc_send(q, 0), true);
    // IBA Table 38: UD SEND_ONLY to QP1 with a DETH (Q_Key, source QP 1); the GSI's Q_Key is
    // 0x80010000 (IBA 13.5.1).
    let mut mad = Headers::new(BthRepr::new(Opcode(0x64), 1, 0));
    mad.deth = Some(softverbs_wire::DethRepr {
        qkey: 0x1234,
        src_qp: 1,
    });
    let mut p = vec![0u8; softverbs_wire::packet_len(&mad, 256)];
    emit_packet(&mad, &[0u8; 256], &mut p).unwrap();
    from_peer.send(a, p, true);
    let total: u64 = SENT.iter().map(|s| s.2).sum();
    let p = wait_for_drops(d, total);
    drop(qp);
    (p, q)
}

#[test]
fn rejected_packets_are_counted_by_reason_and_kept_in_the_capture_with_it() {
    let (_t, cap) = dir("marked");
    let d = Daemon::options("rejmarked")
        .device("rejmarked", "127.37.1.10,127.37.1.11")
        .args(&["--capture", cap.to_str().unwrap(), "--capture-rejected"])
        .start();
    let (p, q) = reject_some(&d, 1);
    for (name, _, n) in SENT {
        assert_eq!(p[name].as_u64(), Some(*n), "{name}: {p}");
    }
    assert_eq!(p["rx_icrc_errors"], p["rx_drop_bad_icrc"], "{p}");
    // Nothing else was rejected.
    let total: u64 = SENT.iter().map(|s| s.2).sum();
    let all: u64 = p
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("rx_drop_"))
        .map(|(_, v)| v.as_u64().unwrap())
        .sum();
    assert_eq!(all, total, "{p}");

    // `status`: per port, in words and in JSON.
    let human = d.cli(&["status"]);
    assert!(
        human.contains(
            "device rejmarked port 1: rejected packets: 9: 3 bad ICRC (rx_drop_bad_icrc)"
        ),
        "{human}"
    );
    let s = d.status();
    let port = &s["device_status"][0]["ports"][0];
    assert_eq!(port["rx_drops"]["rx_drop_unknown_qp"], 2, "{s}");
    assert_eq!(port["rx_drops"]["rx_drop_wrong_dest"], 1, "{s}");
    assert_eq!(s["schema"], 1);

    // The capture: each rejected packet with its reason (the second address's file for the
    // packet sent there), within the flush deadline.
    let file_a = cap.join("rejmarked.pcapng");
    let file_b = cap.join("rejmarked-1.pcapng");
    let start = Instant::now();
    let (seen_a, seen_b) = loop {
        let (a, b) = (read_pcapng(&file_a), read_pcapng(&file_b));
        let marked = a.iter().chain(&b).filter(|s| s.comment.is_some()).count() as u64;
        if marked >= total {
            break (a, b);
        }
        assert!(
            start.elapsed() < DEADLINE,
            "after {DEADLINE:?} {marked} of {total} rejected packets are in the capture: {a:?} {b:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let count = |seen: &[Seen], why: &str| {
        seen.iter()
            .filter(|s| s.comment.as_deref() == Some(why))
            .count() as u64
    };
    assert_eq!(count(&seen_a, SENT[0].1), 3, "{seen_a:?}");
    assert_eq!(count(&seen_a, SENT[1].1), 2, "{seen_a:?}");
    assert_eq!(count(&seen_a, SENT[2].1), 2, "{seen_a:?}");
    assert_eq!(count(&seen_a, SENT[4].1), 1, "{seen_a:?}");
    assert_eq!(count(&seen_b, SENT[3].1), 1, "{seen_b:?}");
    let wrong = seen_b.iter().find(|s| s.comment.is_some()).unwrap();
    assert_eq!(
        (wrong.src, wrong.dst, wrong.dest_qp),
        (
            Ipv4Addr::new(127, 37, 1, 20),
            Ipv4Addr::new(127, 37, 1, 11),
            q
        )
    );

    // tshark shows the reason as the packet's comment.
    if softverbs_testkit::tshark_available().is_some() {
        let home = cap.parent().unwrap().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let out = softverbs_testkit::tshark(
            &file_a,
            &home,
            &["-Y", "frame.comment", "-T", "fields", "-e", "frame.comment"],
        );
        let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 8, "{out}");
        assert_eq!(
            lines.iter().filter(|l| **l == SENT[0].1).count(),
            3,
            "{out}"
        );
    }
}

#[test]
fn without_capture_rejected_the_capture_leaves_rejected_packets_out() {
    let (_t, cap) = dir("left");
    let d = Daemon::options("rejleft")
        .device("rejleft", "127.37.2.10,127.37.2.11")
        .args(&["--capture", cap.to_str().unwrap()])
        .start();
    let (p, _) = reject_some(&d, 2);
    for (name, _, n) in SENT {
        assert_eq!(p[name].as_u64(), Some(*n), "{name}: {p}");
    }
    // A packet the QP takes (from its peer, to its address, the PSN it expects: answered
    // with an RNR NAK, as no receive is posted) is recorded; that it is in the file says
    // everything received before it was judged, and the rejected ones are not there.
    let peer = Ipv4Addr::new(127, 37, 2, 20);
    let c = Context::open_at(&d.socket, 0).unwrap();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16).unwrap();
    let qp = c
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq))
        .unwrap();
    connect(&qp, softverbs::Gid::from_ip(IpAddr::V4(peer)), 0x78);
    Sender::bind(peer).send(Ipv4Addr::new(127, 37, 2, 10), rc_send(qp.qpn(), 0), true);
    let file = cap.join("rejleft.pcap");
    let start = Instant::now();
    let seen = loop {
        let seen = read_pcap(&file);
        if seen.iter().any(|s| s.2 == qp.qpn() && s.0 == peer) {
            break seen;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "after {DEADLINE:?} the accepted packet is not in the capture: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Only the accepted packet came from the test's addresses; the daemon's RNR NAK went
    // the other way.
    let received: Vec<_> = seen.iter().filter(|s| s.1 != peer).collect();
    assert_eq!(received.len(), 1, "{seen:?}");
    assert!(!cap.join("rejleft.pcapng").exists());
}

/// `(source, destination, BTH destination QP)` of each record of a classic pcap.
fn read_pcap(path: &Path) -> Vec<(Ipv4Addr, Ipv4Addr, u32)> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let Ok(mut r) = softverbs_wire::pcap::PcapReader::new(&bytes[..]) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Ok(Some(rec)) = r.next_record() {
        if let Some(seen) = roce_v4(&rec.data) {
            out.push(seen);
        }
    }
    out
}
