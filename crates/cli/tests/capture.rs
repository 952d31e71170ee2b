//! Issue 36, item 6: a capture a user can tail. `softverbs daemon --capture DIR` writes
//! what it handles to `DIR/DEVICE.pcap` while it runs (within a second, not only at exit),
//! including traffic between QPs of the one daemon, which no socket carries, as the RoCE v2
//! packets it would have been (device addresses, valid ICRC); and a capture it cannot write
//! stops it at start.

mod common;
use common::connect;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use softverbs::{Access, Context, QpCap, QpInit, QpType, SendOp, SendRequest, WcStatus};
use softverbs_testkit::Daemon;
use softverbs_wire::pcap::{ethernet_payload, PcapReader};

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");

/// How long the capture may take to show what happened: far more than the second a user is
/// promised, so a loaded machine does not fail the test; a daemon that only writes at exit
/// never shows it, however long the test waits.
const DEADLINE: Duration = Duration::from_secs(30);

fn dir(name: &str) -> (common::Dir, PathBuf) {
    common::dir("svcapture", name)
}

/// A RoCE v2 packet of the capture: IPv4 addresses, BTH opcode and destination QP, and
/// whether its ICRC is right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    opcode: u8,
    dest_qp: u32,
    icrc_ok: bool,
}

/// The whole records of the capture file as it is now (a record the daemon is writing may
/// be cut: reading stops there).
fn read_capture(path: &Path) -> Vec<Seen> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let Ok(mut r) = PcapReader::new(&bytes[..]) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Ok(Some(rec)) = r.next_record() {
        out.extend(seen(&rec.data));
    }
    out
}

/// [`read_capture`] of a pcapng capture (`--capture-rejected`), each packet with its comment.
fn read_pcapng(path: &Path) -> Vec<(Seen, Option<String>)> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let Ok(mut r) = softverbs_wire::pcapng::PcapngReader::new(&bytes[..]) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Ok(Some(rec)) = r.next_record() {
        if let Some(s) = seen(&rec.data) {
            out.push((s, rec.comment));
        }
    }
    out
}

/// What a frame of a capture holds, if it is an IPv4 RoCE v2 packet.
fn seen(frame: &[u8]) -> Option<Seen> {
    let dgram = ethernet_payload(frame)?;
    let (ip_udp, ib) = softverbs_wire::ip::split_ip_udp(dgram).ok()?;
    if ip_udp.len() < 20 || ip_udp[0] >> 4 != 4 || ib.len() < 12 {
        return None;
    }
    let addr =
        |at: usize| Ipv4Addr::new(ip_udp[at], ip_udp[at + 1], ip_udp[at + 2], ip_udp[at + 3]);
    Some(Seen {
        src: addr(12),
        dst: addr(16),
        opcode: ib[0],
        dest_qp: softverbs_wire::bth::dest_qp_of(ib),
        icrc_ok: softverbs_wire::parse_roce_v2(dgram).is_ok(),
    })
}

/// IBA Table 38 opcodes: RC SEND_ONLY, RC ACKNOWLEDGE, UD SEND_ONLY (the CM's MADs, to QP1).
const RC_SEND_ONLY: u8 = 0x04;
const RC_ACK: u8 = 0x11;
const UD_SEND_ONLY: u8 = 0x64;

#[test]
fn same_daemon_rc_traffic_reaches_the_capture_while_the_daemon_runs() {
    let (_t, cap) = dir("rc");
    let ip = "127.36.6.1";
    let mut d = Daemon::options("caprc")
        .device("caprc", ip)
        .args(&["--capture", cap.to_str().unwrap()])
        .start();
    let file = cap.join("caprc.pcap");
    // The header is written at start: a reader finds a valid capture at once.
    assert!(
        PcapReader::new(&std::fs::read(&file).unwrap()[..]).is_ok(),
        "no pcap header in {} at start",
        file.display()
    );

    // Two contexts of one daemon that ask for the same-host direct path: a device that
    // captures keeps their pair on the daemon's engine, where the capture sees it
    // (docs/guide/capture.md).
    let a = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let b = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let cap_ = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap_))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap_))
        .unwrap();
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    connect(&qa, gb, qb.qpn());
    connect(&qb, ga, qa.qpn());
    let mut rbuf = vec![0u8; 4 * 64];
    let mr = pb.reg_slice(&mut rbuf, Access(0x0f)).unwrap();
    const SENDS: usize = 3;
    for i in 0..SENDS {
        qb.post_recv(i as u64, &[mr.sge(i * 64, 64).unwrap()])
            .unwrap();
    }
    for i in 0..SENDS {
        let mut w = SendRequest::new(100 + i as u64, SendOp::Send, &[]);
        w.inline = Some(b"captured while it runs");
        qa.post_send(&w).unwrap();
    }
    let wa = cqa.wait(SENDS, Duration::from_secs(30)).unwrap();
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    let wb = cqb.wait(SENDS, Duration::from_secs(30)).unwrap();
    assert!(wb.iter().all(|w| w.status == WcStatus::Success), "{wb:?}");

    // The daemon runs on (nothing tells it to flush): the SENDs and their ACKs appear.
    let dev = ip.parse::<Ipv4Addr>().unwrap();
    let sends = |seen: &[Seen]| {
        seen.iter()
            .filter(|s| s.opcode == RC_SEND_ONLY && s.dest_qp == qb.qpn())
            .count()
    };
    let acks = |seen: &[Seen]| {
        seen.iter()
            .filter(|s| s.opcode == RC_ACK && s.dest_qp == qa.qpn())
            .count()
    };
    let start = Instant::now();
    let seen = loop {
        let seen = read_capture(&file);
        if sends(&seen) >= SENDS && acks(&seen) >= 1 {
            break seen;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "after {DEADLINE:?} the running daemon's capture holds {} of {SENDS} SENDs and {} ACKs: {seen:?}",
            sends(&seen),
            acks(&seen)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    d.assert_alive();
    eprintln!("seen after {:?}: {} packets", start.elapsed(), seen.len());
    // Exactly the SENDs posted (none twice), between the device's own address, each a
    // valid RoCE v2 packet (ICRC computed over the headers the capture shows).
    assert_eq!(sends(&seen), SENDS, "{seen:?}");
    for s in seen
        .iter()
        .filter(|s| [qa.qpn(), qb.qpn()].contains(&s.dest_qp))
    {
        assert_eq!((s.src, s.dst, s.icrc_ok), (dev, dev, true), "{s:?}");
    }

    // And tshark, with the project's plugin checking ICRCs, decodes them as a user would see
    // them (read once the daemon stopped: a record being written would make tshark warn).
    d.stop();
    if softverbs_testkit::tshark_available().is_none() {
        return;
    }
    let home = cap.parent().unwrap().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let filter = format!("infiniband.bth.destqp == {}", qb.qpn());
    let out = softverbs_testkit::tshark(
        &file,
        &home,
        &[
            "-Y",
            &filter,
            "-T",
            "fields",
            "-e",
            "_ws.malformed",
            "-e",
            "softverbs.icrc.status",
        ],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), SENDS, "tshark found {out:?}");
    assert!(lines.iter().all(|l| *l == "\tgood"), "tshark found {out:?}");
}

/// The CM's MADs between QPs of one daemon (delivered inside it) are in the capture as the
/// RoCE v2 packets to QP1 they would have been: a REQ for a service nobody listens on and
/// its REJ (IBA 12.6.7.2).
#[test]
fn cm_mads_within_one_daemon_are_in_the_capture() {
    let (_t, cap) = dir("cm");
    let ip = "127.36.6.30";
    let mut d = Daemon::options("capcm")
        .device("capcm", ip)
        .args(&["--capture", cap.to_str().unwrap()])
        .start();
    let file = cap.join("capcm.pcap");
    let a = Context::open_at(&d.socket, 0).unwrap();
    let ca = a.cm_channel().unwrap();
    let timers = softverbs::CmTimers {
        response_timeout: 14,
        max_retries: 3,
    };
    let dev: Ipv4Addr = ip.parse().unwrap();
    let id = ca
        .connect(
            dev.into(),
            0x0106_1C06,
            softverbs::CmQp::new(99, 0),
            timers,
            &[],
        )
        .unwrap();
    let ev = ca
        .wait_event(Duration::from_secs(30))
        .unwrap()
        .expect("a CM event");
    assert_eq!(
        (ev.kind, ev.id, ev.status),
        (softverbs::CmEventKind::Rejected, id, 8),
        "{ev:?}"
    );
    let mads = |seen: &[Seen]| -> Vec<Seen> {
        seen.iter()
            .filter(|s| s.opcode == UD_SEND_ONLY && s.dest_qp == 1)
            .copied()
            .collect()
    };
    let start = Instant::now();
    let got = loop {
        let got = mads(&read_capture(&file));
        if got.len() >= 2 {
            break got;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "after {DEADLINE:?} the capture holds {got:?} of the REQ and the REJ"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    d.assert_alive();
    for m in &got {
        assert_eq!((m.src, m.dst, m.icrc_ok), (dev, dev, true), "{m:?}");
    }
}

/// A datagram the daemon drops for its ICRC is in the capture as it arrived (classic pcap
/// cannot flag it; its bad ICRC tells).
#[test]
fn a_packet_dropped_for_its_icrc_is_in_the_capture() {
    let (_t, cap) = dir("drop");
    let ip = "127.36.6.20";
    let d = Daemon::options("capdrop")
        .device("capdrop", ip)
        .args(&["--capture", cap.to_str().unwrap(), "--capture-rejected"])
        .start();
    // Rejected packets are kept only on request, in pcapng, marked
    // (crates/cli/tests/rejects.rs checks every reason and the default's leaving them out).
    let file = cap.join("capdrop.pcapng");
    // An RC SEND_ONLY to QP 0x12345 (BTH, IBA 9.2: opcode, flags, P_Key, DestQP, PSN), then
    // four bytes that are not its ICRC.
    let mut pkt = vec![RC_SEND_ONLY, 0, 0xff, 0xff, 0, 0x01, 0x23, 0x45, 0, 0, 0, 7];
    pkt.extend_from_slice(b"payload!");
    pkt.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    let from: Ipv4Addr = "127.36.6.21".parse().unwrap();
    let sock = std::net::UdpSocket::bind((from, 0)).unwrap();
    sock.send_to(&pkt, (ip.parse::<Ipv4Addr>().unwrap(), 4791))
        .unwrap();
    let start = Instant::now();
    let (bad, comment) = loop {
        let seen = read_pcapng(&file);
        if let Some(s) = seen.into_iter().find(|s| s.0.dest_qp == 0x12345) {
            break s;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "after {DEADLINE:?} the dropped packet is not in the capture: {:?}",
            read_pcapng(&file)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let dev: Ipv4Addr = ip.parse().unwrap();
    assert_eq!(
        (bad.src, bad.dst, bad.opcode, bad.icrc_ok),
        (from, dev, RC_SEND_ONLY, false),
        "{bad:?}"
    );
    assert_eq!(comment.as_deref(), Some("softverbs: rejected: bad ICRC"));
    drop(d);
}

/// `softverbs daemon ARGS`: its exit code (`None`: it served, and was stopped) and its
/// standard error.
fn daemon_outcome(args: &[&std::ffi::OsStr], socket: &Path) -> (Option<i32>, String) {
    let log = socket.with_extension("stderr");
    let mut child = Command::new(BIN)
        .arg("daemon")
        .args(args)
        .env("SOFTVERBS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if softverbs_ipc::connect_seqpacket(socket).is_ok() {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon neither served nor exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

#[test]
fn a_capture_that_cannot_be_written_stops_the_daemon_at_start() {
    let (t, cap) = dir("bad");
    // A directory that does not exist, and a file name taken by a directory (what the
    // daemon would write is not a file it can write, root or not).
    let missing = t.0.join("missing");
    std::fs::create_dir(cap.join("capbad.pcap")).unwrap();
    for (n, dir, why) in [(1, &missing, "No such file"), (2, &cap, "Is a directory")] {
        let sock = t.0.join(format!("sv{n}.sock"));
        let (status, err) = daemon_outcome(
            &[
                "--socket".as_ref(),
                sock.as_os_str(),
                "--device".as_ref(),
                format!("capbad=127.36.6.{}", 10 + n).as_ref(),
                "--capture".as_ref(),
                dir.as_os_str(),
            ],
            &sock,
        );
        assert!(
            status.is_some_and(|c| c != 0) && err.contains("--capture") && err.contains(why),
            "case {n}: the daemon should refuse at start and say why: {status:?} {err}"
        );
    }
}
