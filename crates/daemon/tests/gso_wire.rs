//! Batched device sockets (crates/daemon/src/netdev.rs): two devices exchange 64 KiB RC
//! SENDs at a 4 KiB MTU — full-size packets, so the sender's batches are GSO sends of up to 15
//! segments — over real UDP in a network namespace of the test's own (so changing `lo`'s
//! offloads touches nobody else; it goes away with the thread).
//!
//! - With `lo`'s UDP segmentation offload off, the kernel cuts every GSO send into datagrams
//!   before `lo`, as a NIC without USO would, and gives segment i the IPv4 identification i. A
//!   capture of that wire is checked by the tshark plugin and by an ICRC computed here from
//!   the captured bytes with crc32fast (not crates/wire's code): every packet's ICRC is right
//!   for the identification it carries, and some carry one other than 0.
//! - With the offload on, the GSO send reaches the receiving socket whole and UDP GRO hands
//!   it over in one receive, which the device splits.
//! - With GSO refused, the batches go by sendmmsg.
//!
//! Needs root (namespaces, ethtool); tshark and ethtool are in scripts/test.sh's package list.

use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_daemon::netdev::{engine_time, IcrcPolicy, IpHeader, NetDev};
use softverbs_transport::sim::{ConnParams, Host};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, WcStatus};
use softverbs_transport::MAX_PACKET;

const MSG: usize = 64 * 1024;
const COUNT: usize = 24;

struct Side {
    host: Host,
    dev: NetDev,
}

fn is_root() -> bool {
    rustix::process::geteuid().as_raw() == 0
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn sh(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd).args(args).status().expect(cmd);
    assert!(st.success(), "{cmd} {args:?}");
}

/// Runs `f` on a thread of its own in a fresh network namespace with `lo` up.
fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
        sh("ip", &["link", "set", "lo", "up"]);
        f()
    })
    .join()
    .expect("test thread")
}

fn sides() -> [Side; 2] {
    let mk = |ip: &str| {
        let ip: IpAddr = ip.parse().unwrap();
        Side {
            host: Host::new(ip, Mtu::M4096),
            dev: NetDev::bind(ip, 4791).unwrap(),
        }
    };
    [mk("127.0.0.1"), mk("127.0.0.2")]
}

/// [`sides`] receiving on raw sockets (crates/daemon/src/netdev/raw.rs), every ICRC checked
/// over the IP header it arrived with.
fn raw_sides() -> [Side; 2] {
    let mut s = sides();
    for side in s.iter_mut() {
        side.dev
            .set_icrc_policy(IcrcPolicy {
                ip_header: IpHeader::Raw,
                ..IcrcPolicy::default()
            })
            .unwrap();
        assert_eq!(side.dev.rx_mode(), "raw");
    }
    s
}

/// Streams `COUNT` 64 KiB SENDs from side 0 to side 1 and checks every byte.
fn stream(s: &mut [Side; 2]) {
    let (l, r) = s.split_at_mut(1);
    let (a, b) = (&mut l[0].host, &mut r[0].host);
    let mem = COUNT * MSG;
    let ca = a.context(1, mem);
    let cb = b.context(2, mem);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, mem as u64, Access::LOCAL_WRITE);
    let kb = b.mr(pb, 0, mem as u64, Access::LOCAL_WRITE);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let p = ConnParams {
        mtu: Mtu::M4096,
        timeout: 8,
        ..ConnParams::default()
    };
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, p);
    b.connect(qb, ga, qa, p);
    for (i, byte) in a.mem.space_mut(ca)[..mem].iter_mut().enumerate() {
        *byte = (i * 13 + i / MSG) as u8;
    }
    for i in 0..COUNT {
        let sge = |key| {
            vec![Sge {
                addr: (i * MSG) as u64,
                length: MSG as u32,
                lkey: key,
            }]
        };
        b.engine
            .post_recv(
                qb,
                RecvWr {
                    wr_id: i as u64,
                    sges: sge(kb),
                },
            )
            .unwrap();
        let mut wr = SendWr::new(i as u64, SendOp::Send, Payload::Sges(sge(ka)));
        wr.signaled = true;
        a.engine.post_send(qa, wr).unwrap();
    }
    let epoch = Instant::now();
    let mut buf = vec![0u8; MAX_PACKET];
    let done = |s: &[Side; 2]| {
        s[0].host.completions.len() == COUNT && s[1].host.completions.len() == COUNT
    };
    while !done(s) && epoch.elapsed() < Duration::from_secs(60) {
        let now = engine_time(epoch, Instant::now());
        let mut busy = false;
        for side in s.iter_mut() {
            let h = &mut side.host;
            while let Some(tx) = h.engine.poll_transmit(now, &h.core, &mut h.mem, &mut buf) {
                side.dev.send(&tx, &mut buf[..tx.len]).unwrap();
                busy = true;
            }
            side.dev.flush().unwrap();
        }
        for side in s.iter_mut() {
            let h = &mut side.host;
            while let Some((meta, len)) = side.dev.recv(&mut buf).unwrap() {
                h.engine
                    .handle_packet(now, &h.core, &mut h.mem, meta, &buf[..len]);
                busy = true;
            }
            h.engine.handle_timeout(now);
            h.pump();
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    assert!(
        done(s),
        "stalled: {:?} {:?} / {:?} {:?}",
        s[0].dev.stats,
        s[0].dev.batch,
        s[1].dev.stats,
        s[1].dev.batch
    );
    let sent = s[0].host.take_completions(cqa);
    assert!(
        sent.iter().all(|w| w.status == WcStatus::Success),
        "{sent:?}"
    );
    let got = s[1].host.take_completions(cqb);
    for (i, w) in got.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.byte_len as usize),
            (i as u64, WcStatus::Success, MSG)
        );
    }
    let cb_id = softverbs_core::ids::CtxId(1);
    let (src, dst) = (s[0].host.mem.space(ca), s[1].host.mem.space(cb_id));
    assert!(
        src[..mem] == dst[..mem],
        "every message arrived byte-identical"
    );
}

/// The RoCE v2 ICRC of one captured IPv4/UDP datagram, written from the rule in
/// docs/design/roce-wire.md §6 (not from crates/wire): CRC-32 over 8 bytes of 0xFF, the IPv4 header
/// with TOS, TTL and checksum set to ones, the UDP header with its checksum set to ones, the
/// BTH with byte 4 set to ones, and everything after it up to the 4-byte ICRC.
fn independent_icrc(ip_udp_ib: &[u8]) -> (u32, u32) {
    let ihl = usize::from(ip_udp_ib[0] & 0x0F) * 4;
    let mut m = ip_udp_ib[..ip_udp_ib.len() - 4].to_vec();
    m[1] = 0xFF;
    m[8] = 0xFF;
    m[10] = 0xFF;
    m[11] = 0xFF;
    m[ihl + 6] = 0xFF;
    m[ihl + 7] = 0xFF;
    m[ihl + 8 + 4] = 0xFF;
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xFF; 8]);
    h.update(&m);
    let stored = u32::from_le_bytes(ip_udp_ib[ip_udp_ib.len() - 4..].try_into().unwrap());
    (h.finalize(), stored)
}

/// (IPv4 identification, ICRC good) of every RoCE v2 datagram of a classic pcap of `lo`.
/// How many whole records a classic pcap file being written holds so far.
fn complete_records(path: &Path) -> usize {
    let Ok(b) = std::fs::read(path) else { return 0 };
    let (mut off, mut n) = (24, 0);
    while off + 16 <= b.len() {
        let incl = u32::from_le_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
        if off + 16 + incl > b.len() {
            break;
        }
        off += 16 + incl;
        n += 1;
    }
    n
}

fn check_pcap(path: &Path) -> Vec<(u16, bool)> {
    let b = std::fs::read(path).unwrap();
    assert_eq!(
        &b[..4],
        &[0xD4, 0xC3, 0xB2, 0xA1],
        "a little-endian classic pcap"
    );
    let mut off = 24;
    let mut out = Vec::new();
    while off + 16 <= b.len() {
        let incl = u32::from_le_bytes(b[off + 8..off + 12].try_into().unwrap()) as usize;
        let frame = &b[off + 16..off + 16 + incl];
        off += 16 + incl;
        // Ethernet (lo's all-zero addresses), then IPv4.
        if frame.len() < 14 + 28 || frame[12..14] != [0x08, 0x00] {
            continue;
        }
        let ip = &frame[14..];
        let ihl = usize::from(ip[0] & 0x0F) * 4;
        let dport = u16::from_be_bytes([ip[ihl + 2], ip[ihl + 3]]);
        if ip[9] != 17 || dport != 4791 {
            continue;
        }
        let tot = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        assert_eq!(
            tot,
            ip.len(),
            "one RoCE packet per captured datagram (segmented)"
        );
        let (computed, stored) = independent_icrc(ip);
        out.push((u16::from_be_bytes([ip[4], ip[5]]), computed == stored));
    }
    out
}

#[test]
fn segmented_gso_traffic_has_the_right_icrc_for_each_identification() {
    if !is_root() || !have("ethtool") || softverbs_testkit::tshark_available().is_none() {
        eprintln!("skipped: needs root, ethtool and tshark");
        return;
    }
    in_netns(|| {
        // Segment in software before lo, as for a NIC without UDP segmentation offload.
        sh("ethtool", &["-K", "lo", "tx-udp-segmentation", "off"]);
        let dir = std::env::temp_dir().join(format!("sv6-gso-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pcap = dir.join("lo.pcap");
        let mut cap = Command::new("tshark")
            .args(["-i", "lo", "-F", "pcap", "-f", "udp port 4791", "-w"])
            .arg(&pcap)
            .env("HOME", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = std::io::BufReader::new(cap.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("Capture started") {
            line.clear();
            assert!(
                std::io::BufRead::read_line(&mut err, &mut line).unwrap() > 0,
                "tshark did not start"
            );
        }
        let mut s = sides();
        stream(&mut s);
        assert!(
            s[0].dev.batch.gso_sends > 0,
            "the sender used GSO: {:?}",
            s[0].dev.batch
        );
        assert!(
            s[1].dev.batch.id_searches > 0,
            "segments with identifications other than their index arrived: {:?}",
            s[1].dev.batch
        );
        // Stopped once the file holds every packet (or after WAIT): dumpcap writes them
        // behind the stream, later still on a loaded machine.
        let deadline = std::time::Instant::now() + softverbs_testkit::WAIT;
        while complete_records(&pcap) < COUNT * 16 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(cap.id() as i32).unwrap(),
            rustix::process::Signal::INT,
        )
        .unwrap();
        cap.wait().unwrap();

        let packets = check_pcap(&pcap);
        assert!(
            packets.len() >= COUNT * 16,
            "captured {} packets",
            packets.len()
        );
        let bad: Vec<_> = packets.iter().filter(|p| !p.1).collect();
        assert!(bad.is_empty(), "independent ICRC check failed for {bad:?}");
        let max_id = packets.iter().map(|p| p.0).max().unwrap();
        assert!(
            (1..64).contains(&max_id),
            "GSO segments carry identifications 0..n (highest {max_id})"
        );

        let home = dir.join("home");
        std::fs::create_dir_all(&home).unwrap();
        let out = softverbs_testkit::tshark(
            &pcap,
            &home,
            &[
                "-T",
                "fields",
                "-e",
                "_ws.malformed",
                "-e",
                "softverbs.icrc.status",
            ],
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), packets.len());
        assert!(
            lines.iter().all(|l| *l == "\tgood"),
            "the plugin finds every packet well formed with a good ICRC: {out}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn a_gso_send_arrives_whole_and_gro_splits_it() {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    in_netns(|| {
        let mut s = sides();
        stream(&mut s);
        assert!(s[0].dev.batch.gso_sends > 0, "{:?}", s[0].dev.batch);
        assert!(
            s[1].dev.batch.gro_recvs > 0,
            "coalesced receives: {:?}",
            s[1].dev.batch
        );
        assert_eq!(s[1].dev.stats.rejected, 0);
    });
}

#[test]
fn without_gso_batches_go_by_sendmmsg() {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    in_netns(|| {
        let mut s = sides();
        for side in s.iter_mut() {
            side.dev.disable_gso();
        }
        stream(&mut s);
        assert_eq!(s[0].dev.batch.gso_sends, 0);
        assert!(s[0].dev.batch.mmsg_sends > 0, "{:?}", s[0].dev.batch);
        assert_eq!(
            s[1].dev.batch.id_searches, 0,
            "every datagram has identification 0"
        );
        assert_eq!(s[1].dev.stats.rejected, 0);
    });
}

#[test]
fn raw_receive_splits_a_gso_send_that_arrived_whole() {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace and raw sockets");
        return;
    }
    in_netns(|| {
        let mut s = raw_sides();
        stream(&mut s);
        assert!(s[0].dev.batch.gso_sends > 0, "{:?}", s[0].dev.batch);
        assert!(
            s[1].dev.batch.gro_recvs > 0,
            "GSO sends reached the raw socket whole: {:?}",
            s[1].dev.batch
        );
        assert_eq!(s[1].dev.stats.rejected, 0);
        assert_eq!(s[1].dev.icrc_errors, 0);
    });
}

#[test]
fn raw_receive_of_segmented_gso_traffic() {
    if !is_root() || !have("ethtool") {
        eprintln!("skipped: needs root and ethtool");
        return;
    }
    in_netns(|| {
        sh("ethtool", &["-K", "lo", "tx-udp-segmentation", "off"]);
        let mut s = raw_sides();
        stream(&mut s);
        assert!(s[0].dev.batch.gso_sends > 0, "{:?}", s[0].dev.batch);
        assert_eq!(s[1].dev.batch.gro_recvs, 0, "{:?}", s[1].dev.batch);
        assert_eq!(s[1].dev.stats.rejected, 0);
        assert_eq!(s[1].dev.icrc_errors, 0);
    });
}

#[test]
fn raw_receive_of_sendmmsg_batches() {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace and raw sockets");
        return;
    }
    in_netns(|| {
        let mut s = raw_sides();
        for side in s.iter_mut() {
            side.dev.disable_gso();
        }
        stream(&mut s);
        assert!(s[0].dev.batch.mmsg_sends > 0, "{:?}", s[0].dev.batch);
        assert_eq!(s[1].dev.stats.rejected, 0);
        assert_eq!(s[1].dev.icrc_errors, 0);
    });
}
