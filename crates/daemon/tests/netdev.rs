//! Two devices on different loopback addresses exchange RoCE v2 over real UDP sockets: the
//! transport survives injected loss, duplication, reordering and corruption, and a capture
//! of the real wire (tshark on `lo`) shows good ICRCs — proof that the headers the ICRC is
//! computed over are the ones the kernel sends.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_daemon::netdev::{engine_time, NetDev};
use softverbs_transport::sim::{ConnParams, Faults, Host};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, WcStatus};
use softverbs_transport::MAX_PACKET;
use softverbs_wire::icrc;
use softverbs_wire::ip::{IpRepr, UdpRepr};

struct Side {
    host: Host,
    dev: NetDev,
}

/// Moves packets between the two sides until `done` or `limit` of wall time.
fn pump(sides: &mut [Side; 2], limit: Duration, mut done: impl FnMut(&[Side; 2]) -> bool) -> bool {
    let epoch = Instant::now();
    let mut buf = vec![0u8; MAX_PACKET];
    while epoch.elapsed() < limit {
        if done(sides) {
            return true;
        }
        let now = engine_time(epoch, Instant::now());
        let mut busy = false;
        for s in sides.iter_mut() {
            while let Some(tx) =
                s.host
                    .engine
                    .poll_transmit(now, &s.host.core, &mut s.host.mem, &mut buf)
            {
                s.dev.send(&tx, &mut buf[..tx.len]).unwrap();
                busy = true;
            }
            s.dev.flush().unwrap();
        }
        for s in sides.iter_mut() {
            while let Some((meta, len)) = s.dev.recv(&mut buf).unwrap() {
                s.host
                    .engine
                    .handle_packet(now, &s.host.core, &mut s.host.mem, meta, &buf[..len]);
                busy = true;
            }
            s.host.engine.handle_timeout(now);
            s.host.pump();
        }
        if !busy {
            for s in sides.iter_mut() {
                s.dev.release_held().unwrap();
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    done(sides)
}

fn sides(a: &str, b: &str) -> [Side; 2] {
    let mk = |ip: &str| {
        let ip: IpAddr = ip.parse().unwrap();
        Side {
            host: Host::new(ip, Mtu::M1024),
            dev: NetDev::bind(ip, 4791).unwrap(),
        }
    };
    [mk(a), mk(b)]
}

/// Connects an RC pair and posts `n` sends of varied sizes; returns the message contents and
/// the CQs.
fn rc_stream(s: &mut [Side; 2], n: usize) -> (Vec<Vec<u8>>, u64, u64) {
    let (l, r) = s.split_at_mut(1);
    let (a, b) = (&mut l[0].host, &mut r[0].host);
    let ca = a.context(1, 1 << 22);
    let cb = b.context(2, 1 << 22);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, 1 << 22, Access::LOCAL_WRITE);
    let kb = b.mr(pb, 0, 1 << 22, Access::LOCAL_WRITE);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let (ga, gb) = (a.gid, b.gid);
    // A 1 ms ACK timeout: real time is passing here.
    let p = ConnParams {
        timeout: 8,
        ..ConnParams::default()
    };
    a.connect(qa, gb, qb, p);
    b.connect(qb, ga, qa, p);
    let msgs: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            (0..1 + (i * 37) % 3000)
                .map(|j| (i * 7 + j) as u8)
                .collect()
        })
        .collect();
    for (i, m) in msgs.iter().enumerate() {
        a.mem.space_mut(ca)[i * 4096..][..m.len()].copy_from_slice(m);
        b.engine
            .post_recv(
                qb,
                RecvWr {
                    wr_id: i as u64,
                    sges: vec![Sge {
                        addr: (i * 4096) as u64,
                        length: 4096,
                        lkey: kb,
                    }],
                },
            )
            .unwrap();
        a.engine
            .post_send(
                qa,
                SendWr::new(
                    i as u64,
                    SendOp::Send,
                    Payload::Sges(vec![Sge {
                        addr: (i * 4096) as u64,
                        length: m.len() as u32,
                        lkey: ka,
                    }]),
                ),
            )
            .unwrap();
    }
    (msgs, cqa, cqb)
}

fn check(s: &mut [Side; 2], msgs: &[Vec<u8>], cqa: u64, cqb: u64) {
    let sent = s[0].host.take_completions(cqa);
    assert_eq!(sent.len(), msgs.len());
    assert!(
        sent.iter()
            .enumerate()
            .all(|(i, w)| w.wr_id == i as u64 && w.status == WcStatus::Success),
        "{sent:?}"
    );
    let got = s[1].host.take_completions(cqb);
    assert_eq!(got.len(), msgs.len());
    let cb = softverbs_core::ids::CtxId(1);
    for (i, w) in got.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.byte_len as usize),
            (i as u64, WcStatus::Success, msgs[i].len())
        );
        assert_eq!(
            &s[1].host.mem.space(cb)[i * 4096..][..msgs[i].len()],
            &msgs[i][..],
            "message {i}"
        );
    }
}

#[test]
fn two_devices_on_udp_survive_injected_faults() {
    let mut s = sides("127.77.0.1", "127.77.0.2");
    let f = Faults {
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.02,
        corrupt: 0.01,
        delay: Duration::ZERO,
    };
    s[0].dev.inject(f, 1);
    s[1].dev.inject(f, 2);
    let (msgs, cqa, cqb) = rc_stream(&mut s, 500);
    let ok = pump(&mut s, Duration::from_secs(60), |s| {
        s[0].host.completions.len() == 500 && s[1].host.completions.len() == 500
    });
    assert!(
        ok,
        "stalled: {:?} {:?} failures {:?}",
        s[0].dev.stats, s[1].dev.stats, s[0].host.failures
    );
    assert!(s[0].dev.stats.injected + s[1].dev.stats.injected > 0);
    assert!(
        s[1].dev.stats.rejected > 0 || s[0].dev.stats.rejected > 0,
        "corruption was caught by the ICRC check"
    );
    check(&mut s, &msgs, cqa, cqb);
}

#[test]
fn a_capture_of_the_real_wire_has_good_icrcs() {
    if softverbs_testkit::tshark_available().is_none() {
        return;
    }
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("skipped: capturing on lo needs root");
        return;
    }
    let dir = std::env::temp_dir().join(format!("sv-wire-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("lo.pcap");
    // Capture exactly the packets between the two test addresses.
    let mut cap = std::process::Command::new("tshark")
        .args([
            "-i",
            "lo",
            "-f",
            "udp port 4791 and host 127.78.0.1 and host 127.78.0.2",
            "-w",
        ])
        .arg(&pcap)
        .env("HOME", &dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // tshark reports "Capture started." once packets are being recorded.
    let mut err = std::io::BufReader::new(cap.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("Capture started") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut err, &mut line).unwrap() > 0,
            "tshark did not start"
        );
    }
    let mut s = sides("127.78.0.1", "127.78.0.2");
    // One datagram per packet: a GSO send crosses `lo` unsegmented, so a capture there shows
    // the whole batch as one datagram (tests/gso_wire.rs captures GSO segmented instead).
    for side in s.iter_mut() {
        side.dev.disable_gso();
    }
    let (msgs, cqa, cqb) = rc_stream(&mut s, 50);
    assert!(pump(&mut s, Duration::from_secs(30), |s| s[0]
        .host
        .completions
        .len()
        == 50
        && s[1].host.completions.len() == 50));
    check(&mut s, &msgs, cqa, cqb);
    // Let the last packets reach the capture, then stop it.
    std::thread::sleep(Duration::from_millis(300));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(cap.id() as i32).unwrap(),
        rustix::process::Signal::INT,
    )
    .unwrap();
    cap.wait().unwrap();
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
    assert!(lines.len() >= 50, "captured {} packets", lines.len());
    for l in &lines {
        assert_eq!(
            *l, "\tgood",
            "every captured packet is well formed with a good ICRC: {out}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the daemon's loop relies on when it skips `recvmsg` on a device found empty
/// (`DataPath::gate_receives`): a device that found its socket empty says so until the loop
/// marks it readable, and a datagram that arrives after that raises an edge-triggered epoll
/// event, so marking on events loses nothing. Both ways: A's SENDs to B, then B's ACKs to A.
#[test]
fn a_drained_device_waits_for_an_event_and_then_gets_every_packet() {
    use mio::unix::SourceFd;
    use mio::{Events, Interest, Poll, Token};
    use std::os::fd::AsRawFd;

    let mut s = sides("127.77.1.1", "127.77.1.2");
    let mut poll = Poll::new().unwrap();
    for (i, side) in s.iter().enumerate() {
        let fd = side.dev.fd().as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), Token(i), Interest::READABLE)
            .unwrap();
    }
    let mut buf = vec![0u8; MAX_PACKET];
    for side in s.iter_mut() {
        assert!(
            side.dev.may_have_packets(),
            "a new device has not been read"
        );
        assert!(side.dev.recv(&mut buf).unwrap().is_none());
        assert!(!side.dev.may_have_packets(), "found empty");
    }
    let (msgs, cqa, cqb) = rc_stream(&mut s, 3);
    let epoch = Instant::now();
    let mut events = Events::with_capacity(8);
    for (from, to) in [(0, 1), (1, 0)] {
        let now = engine_time(epoch, Instant::now());
        let mut sent = 0;
        let f = &mut s[from];
        while let Some(tx) =
            f.host
                .engine
                .poll_transmit(now, &f.host.core, &mut f.host.mem, &mut buf)
        {
            f.dev.send(&tx, &mut buf[..tx.len]).unwrap();
            sent += 1;
        }
        f.dev.flush().unwrap();
        assert!(sent > 0, "{from} had packets for {to}");
        assert!(!s[to].dev.may_have_packets(), "nothing marked {to} yet");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = false;
        while !seen && Instant::now() < deadline {
            events.clear();
            poll.poll(&mut events, Some(Duration::from_millis(100)))
                .unwrap();
            seen = events
                .iter()
                .any(|e| e.token() == Token(to) && e.is_readable());
        }
        assert!(seen, "the packets for {to} raised an event");
        s[to].dev.mark_readable();
        assert!(s[to].dev.may_have_packets());
        let mut got = 0;
        let t = &mut s[to];
        while let Some((meta, len)) = t.dev.recv(&mut buf).unwrap() {
            t.host
                .engine
                .handle_packet(now, &t.host.core, &mut t.host.mem, meta, &buf[..len]);
            t.host.pump();
            got += 1;
        }
        assert_eq!(got, sent, "every packet for {to} arrived");
        assert!(!t.dev.may_have_packets(), "{to} drained");
    }
    // The SENDs arrived and their ACKs completed them.
    check(&mut s, &msgs, cqa, cqb);
}

/// The daemon's zero-copy paths: the engine writes each packet straight into the send batch
/// (`NetDev::stage`, `send_staged`) and takes each received packet from the datagram it came
/// in (`recv_ref`). Messages of 1 to 3,000 bytes at a 1 KiB MTU give full packets and
/// shorter last ones, so batches end both ways (full, and a packet that does not fit moving
/// to the front of the next batch); every message arrives intact and completes.
#[test]
fn staged_sends_and_in_place_receives_deliver_every_message() {
    let mut s = sides("127.77.2.1", "127.77.2.2");
    let (msgs, cqa, cqb) = rc_stream(&mut s, 300);
    let epoch = Instant::now();
    let mut buf = vec![0u8; MAX_PACKET];
    let limit = Duration::from_secs(30);
    let done =
        |s: &[Side; 2]| s[0].host.completions.len() == 300 && s[1].host.completions.len() == 300;
    while !done(&s) && epoch.elapsed() < limit {
        let now = engine_time(epoch, Instant::now());
        let mut busy = false;
        for side in s.iter_mut() {
            assert!(side.dev.can_stage());
            while let Some(tx) = side.host.engine.poll_transmit(
                now,
                &side.host.core,
                &mut side.host.mem,
                side.dev.stage(),
            ) {
                side.dev.send_staged(&tx).unwrap();
                busy = true;
            }
            side.dev.flush().unwrap();
        }
        for side in s.iter_mut() {
            while let Some((meta, pkt)) = side.dev.recv_ref(&mut buf).unwrap() {
                side.host
                    .engine
                    .handle_packet(now, &side.host.core, &mut side.host.mem, meta, pkt);
                busy = true;
            }
            side.host.engine.handle_timeout(now);
            side.host.pump();
        }
        if !busy {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    assert!(
        done(&s),
        "stalled: {:?} {:?}",
        s[0].dev.stats,
        s[1].dev.stats
    );
    assert!(
        s[0].dev.batch.gso_sends > 0,
        "packets left in batches: {:?}",
        s[0].dev.batch
    );
    assert_eq!(
        s[0].dev.stats.rejected + s[1].dev.stats.rejected,
        0,
        "every ICRC good"
    );
    check(&mut s, &msgs, cqa, cqb);
}

/// Staged packets leave in order and byte for byte as the engine wrote them, whichever way
/// their batch ends: full-sized packets, a shorter one that ends the batch, a full one after
/// it that must move to the front of the next batch, a second destination.
#[test]
fn staged_packets_arrive_byte_for_byte_across_batch_ends() {
    use softverbs_core::device::Gid;
    use softverbs_transport::Transmit;
    let a_ip: IpAddr = "127.77.3.1".parse().unwrap();
    let b_ip: IpAddr = "127.77.3.2".parse().unwrap();
    let c_ip: IpAddr = "127.77.3.3".parse().unwrap();
    let mut a = NetDev::bind(a_ip, 4791).unwrap();
    let mut b = NetDev::bind(b_ip, 4791).unwrap();
    let mut c = NetDev::bind(c_ip, 4791).unwrap();
    // (destination, length): BTH (12) + payload + ICRC (4).
    let plan: Vec<(IpAddr, usize)> = [1040, 1040, 1040, 500, 1040, 1040, 300, 1040]
        .iter()
        .map(|&l| (b_ip, l))
        .chain([(c_ip, 1040), (c_ip, 1040), (b_ip, 1040)])
        .collect();
    let mut sent = Vec::new();
    for (i, &(to, len)) in plan.iter().enumerate() {
        let room = a.stage();
        assert!(room.len() >= len);
        // A BTH of opcode 0x04 (RC SEND only), then a pattern unique to the packet.
        room[..12].fill(0);
        room[0] = 0x04;
        for (j, x) in room[12..len - 4].iter_mut().enumerate() {
            *x = (i * 31 + j) as u8;
        }
        room[len - 4..len].fill(0);
        sent.push((to, room[..len - 4].to_vec()));
        let tx = Transmit {
            len,
            dgid: Gid::from_ip(to),
            sgid_index: 0,
            udp_sport: 0,
        };
        a.send_staged(&tx).unwrap();
    }
    a.flush().unwrap();
    let mut buf = vec![0u8; MAX_PACKET];
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got: Vec<(IpAddr, Vec<u8>)> = Vec::new();
    while got.len() < sent.len() && Instant::now() < deadline {
        let mut any = false;
        for (ip, dev) in [(b_ip, &mut b), (c_ip, &mut c)] {
            while let Some((meta, pkt)) = dev.recv_ref(&mut buf).unwrap() {
                assert_eq!(meta.sgid, Gid::from_ip(a_ip));
                got.push((ip, pkt[..pkt.len() - 4].to_vec()));
                any = true;
            }
        }
        if !any {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(b.stats.rejected + c.stats.rejected, 0, "every ICRC good");
    for ip in [b_ip, c_ip] {
        let want: Vec<&Vec<u8>> = sent.iter().filter(|p| p.0 == ip).map(|p| &p.1).collect();
        let have: Vec<&Vec<u8>> = got.iter().filter(|p| p.0 == ip).map(|p| &p.1).collect();
        assert_eq!(have.len(), want.len(), "{ip}: every packet arrived");
        for (k, (h, w)) in have.iter().zip(&want).enumerate() {
            assert!(h == w, "{ip}: packet {k} arrived as staged");
        }
    }
    assert!(a.batch.gso_sends >= 2, "{:?}", a.batch);
}

/// Receives take up to eight datagrams per `recvmmsg` and stop asking the kernel once one
/// found the socket empty: 20 separate datagrams (no GSO, so no GRO either) arrive in order
/// across three calls, then "none"; a datagram sent afterwards is still received.
#[test]
fn many_datagrams_arrive_in_order_across_batched_receives() {
    use softverbs_core::device::Gid;
    use softverbs_transport::Transmit;
    let a_ip: IpAddr = "127.77.4.1".parse().unwrap();
    let b_ip: IpAddr = "127.77.4.2".parse().unwrap();
    let mut a = NetDev::bind(a_ip, 4791).unwrap();
    let mut b = NetDev::bind(b_ip, 4791).unwrap();
    a.disable_gso();
    let tx = Transmit {
        len: 64,
        dgid: Gid::from_ip(b_ip),
        sgid_index: 0,
        udp_sport: 0,
    };
    let packet = |i: usize| {
        let mut p = vec![0u8; 64];
        p[0] = 0x04;
        p[12..60].fill(i as u8);
        p
    };
    let receive = |b: &mut NetDev, want: usize| {
        let mut buf = vec![0u8; MAX_PACKET];
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        while got.len() < want && Instant::now() < deadline {
            match b.recv(&mut buf).unwrap() {
                Some((_, len)) => got.push(buf[12..len - 4].to_vec()),
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        got
    };
    for i in 0..20 {
        a.send(&tx, &mut packet(i)).unwrap();
    }
    a.flush().unwrap();
    // Let all 20 be queued before the first receive.
    std::thread::sleep(Duration::from_millis(50));
    let got = receive(&mut b, 20);
    assert_eq!(got.len(), 20, "every datagram arrived");
    for (i, g) in got.iter().enumerate() {
        assert!(g.iter().all(|&x| x == i as u8), "datagram {i} in order");
    }
    let mut buf = vec![0u8; MAX_PACKET];
    assert!(b.recv(&mut buf).unwrap().is_none(), "then none");
    assert!(!b.may_have_packets());
    a.send(&tx, &mut packet(99)).unwrap();
    a.flush().unwrap();
    let late = receive(&mut b, 1);
    assert_eq!(late.len(), 1, "a later datagram is received");
    assert!(late[0].iter().all(|&x| x == 99));
    assert_eq!(b.stats.rejected, 0);
}

/// A readiness event that comes while datagrams of the last `recvmmsg` are still being handed
/// out (the loop hands out at most 256 packets per round, then polls) must not be lost: that
/// call found the socket empty, but something arrived since, so the receive after the batch
/// asks the kernel again instead of reporting none.
#[test]
fn an_event_during_a_batch_makes_the_next_receive_ask_again() {
    use softverbs_core::device::Gid;
    use softverbs_transport::Transmit;
    let a_ip: IpAddr = "127.77.5.1".parse().unwrap();
    let b_ip: IpAddr = "127.77.5.2".parse().unwrap();
    let mut a = NetDev::bind(a_ip, 4791).unwrap();
    let mut b = NetDev::bind(b_ip, 4791).unwrap();
    a.disable_gso();
    let tx = Transmit {
        len: 64,
        dgid: Gid::from_ip(b_ip),
        sgid_index: 0,
        udp_sport: 0,
    };
    let send = |a: &mut NetDev, i: u8| {
        let mut p = vec![0u8; 64];
        p[0] = 0x04;
        p[12..60].fill(i);
        a.send(&tx, &mut p).unwrap();
        a.flush().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut buf = vec![0u8; MAX_PACKET];
    let mut next = |b: &mut NetDev| b.recv(&mut buf).unwrap().map(|(_, len)| len);
    // Two datagrams queued: one receive takes both (fewer than it had room for: drained) and
    // hands out the first.
    send(&mut a, 1);
    send(&mut a, 2);
    assert!(next(&mut b).is_some());
    // A third arrives while the second is still to be handed out, and the loop reports it.
    send(&mut a, 3);
    b.mark_readable();
    assert!(next(&mut b).is_some(), "the second");
    assert!(
        next(&mut b).is_some(),
        "the third, though the batch had found the socket empty"
    );
    assert!(next(&mut b).is_none());
}

/// A packet for destination QP `dqpn` of `len` bytes: a BTH of opcode 0x04 (RC SEND only),
/// then `fill` repeated, then the ICRC slot.
fn packet_for(dqpn: u32, len: usize, fill: u8) -> Vec<u8> {
    let mut p = vec![fill; len];
    p[..12].fill(0);
    p[0] = 0x04;
    p[5..8].copy_from_slice(&dqpn.to_be_bytes()[1..]);
    p[len - 4..].fill(0);
    p
}

/// A transmit of `len` bytes to `to`.
fn tx_to(to: IpAddr, len: usize) -> softverbs_transport::Transmit {
    softverbs_transport::Transmit {
        len,
        dgid: softverbs_core::device::Gid::from_ip(to),
        sgid_index: 0,
        udp_sport: 0,
    }
}

/// What the daemon forwarded to a net-path socket, each datagram without its ICRC, waiting
/// up to `want` datagrams (2 s at most). Every one came from the device's address and port,
/// the only sender a library accepts.
fn forwarded(
    sock: &std::net::UdpSocket,
    device: std::net::SocketAddr,
    want: usize,
) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 1 << 16];
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while got.len() < want && Instant::now() < deadline {
        match sock.recv_from(&mut buf) {
            Ok((len, from)) => {
                assert_eq!(from, device, "forwarded from the device's port");
                got.push(buf[..len - 4].to_vec())
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("{e}"),
        }
    }
    got
}

/// [`forwarded`] with the ICRC kept.
fn forwarded_whole(
    sock: &std::net::UdpSocket,
    device: std::net::SocketAddr,
    want: usize,
) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 1 << 16];
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while got.len() < want && Instant::now() < deadline {
        match sock.recv_from(&mut buf) {
            Ok((len, from)) => {
                assert_eq!(from, device, "forwarded from the device's port");
                got.push(buf[..len].to_vec())
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("{e}"),
        }
    }
    got
}

/// Nothing is queued on `sock` now (a nonblocking look: called once whatever could have
/// reached it was forwarded or dropped by a receive that already returned).
fn nothing_on(sock: &std::net::UdpSocket) -> bool {
    let mut buf = [0u8; 64];
    matches!(sock.recv_from(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// What the device receives (ICRC checked), without the ICRC; receiving is also what
/// forwards (the device's receive hands net-path packets on before its engine).
fn device_packets(dev: &mut NetDev, want: usize) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; MAX_PACKET];
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(if want == 0 { 50 } else { 2000 });
    while (want == 0 || got.len() < want) && Instant::now() < deadline {
        dev.mark_readable();
        match dev.recv(&mut buf).unwrap() {
            Some((_, len)) => got.push(buf[..len - 4].to_vec()),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    got
}

/// Receives on `dev` until `done` holds (2 s at most): for a packet that is forwarded or
/// dropped, which the caller never sees.
fn receive_until(dev: &mut NetDev, mut done: impl FnMut(&NetDev) -> bool) {
    let mut buf = vec![0u8; MAX_PACKET];
    let deadline = Instant::now() + Duration::from_secs(2);
    while !done(dev) && Instant::now() < deadline {
        dev.mark_readable();
        if dev.recv(&mut buf).unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(done(dev), "{:?}", dev.forward_stats());
}

/// The receiving device binds port 0 and the sender the same port on its own address (a
/// device sends to its own port).
fn device_pair(a: &str, b: &str) -> (NetDev, NetDev, IpAddr, IpAddr) {
    let b_ip: IpAddr = b.parse().unwrap();
    let dev_b = NetDev::bind(b_ip, 0).unwrap();
    let a_ip: IpAddr = a.parse().unwrap();
    let dev_a = NetDev::bind(a_ip, dev_b.port()).unwrap();
    (dev_a, dev_b, a_ip, b_ip)
}

fn gid(ip: IpAddr) -> softverbs_core::device::Gid {
    softverbs_core::device::Gid::from_ip(ip)
}

/// Issue 35, item 1: a net-path QP's packets from its peer reach its context's private
/// socket (each context its own, bound to the device's address and an ephemeral port, no
/// member of any group), forwarded from the device's port, and no other socket; other QPs
/// reach the device; a packet for a net-path QP from another address is dropped and
/// counted (test (c)); a QP forwarded no more, or a context closed, reaches the device
/// again; and a GSO batch for one QP is forwarded whole, in order, byte for byte.
#[test]
fn net_path_qps_reach_their_own_socket_and_nothing_else_does() {
    use nix::sys::socket::{getsockopt, sockopt::UdpGroSegment};
    let (mut a, mut b, a_ip, b_ip) = device_pair("127.77.6.1", "127.77.6.2");
    let device: std::net::SocketAddr = (b_ip, b.port()).into();
    assert!(!rustix::net::sockopt::socket_reuseport(b.fd()).unwrap());
    assert!(!rustix::net::sockopt::socket_reuseaddr(b.fd()).unwrap());
    let (_keep1, fd1, addr1) = b.open_net_socket().unwrap();
    let (_keep2, fd2, addr2) = b.open_net_socket().unwrap();
    assert_eq!(addr1.ip(), b_ip);
    assert_ne!(addr1.port(), b.port());
    assert_ne!(addr1, addr2, "a socket per context");
    assert!(!rustix::net::sockopt::socket_reuseport(&fd1).unwrap());
    assert!(
        getsockopt(&b.fd(), UdpGroSegment).unwrap(),
        "the device keeps GRO"
    );
    let s1 = std::net::UdpSocket::from(fd1);
    let s2 = std::net::UdpSocket::from(fd2);
    b.forward_qp(0x11, gid(a_ip), addr1);
    b.forward_qp(0x0012_3456, gid(a_ip), addr2);
    assert_eq!(b.forwarded_qps(), 2);

    let send = |a: &mut NetDev, p: &[u8]| {
        let mut p = p.to_vec();
        a.send(&tx_to(b_ip, p.len()), &mut p).unwrap();
        a.flush().unwrap();
    };
    let p1 = packet_for(0x11, 64, 1);
    let p2 = packet_for(0x0012_3456, 64, 2);
    let other = packet_for(0x12, 64, 3);
    send(&mut a, &p1);
    send(&mut a, &p2);
    send(&mut a, &other);
    assert_eq!(device_packets(&mut b, 1), vec![other[..60].to_vec()]);
    receive_until(&mut b, |b| b.forward_stats().forwarded == 2);
    assert_eq!(forwarded(&s1, device, 1), vec![p1[..60].to_vec()]);
    assert_eq!(forwarded(&s2, device, 1), vec![p2[..60].to_vec()]);
    assert!(nothing_on(&s1) && nothing_on(&s2));

    // (c) From an address that is not the QP's peer (its ICRC good): dropped, counted.
    let c_ip: IpAddr = "127.77.6.3".parse().unwrap();
    let mut c = NetDev::bind(c_ip, b.port()).unwrap();
    send(&mut c, &p1);
    receive_until(&mut b, |b| b.forward_stats().foreign_source == 1);
    assert!(
        nothing_on(&s1),
        "a foreign source's packet is not forwarded"
    );
    assert_eq!(b.forward_stats().forwarded, 2);

    // A GSO batch of 12 for one QP: forwarded in order, byte for byte.
    let len = 1040;
    let want: Vec<Vec<u8>> = (0..12u8)
        .map(|i| packet_for(0x0012_3456, len, 10 + i))
        .collect();
    for p in &want {
        a.stage()[..len].copy_from_slice(p);
        a.send_staged(&tx_to(b_ip, len)).unwrap();
    }
    a.flush().unwrap();
    receive_until(&mut b, |b| b.forward_stats().forwarded == 14);
    let got = forwarded_whole(&s2, device, 12);
    // Each forwarded datagram's ICRC is right for the header it left with (from the device
    // socket to the context's, a softverbs identification), not the peer's original.
    let mut hdr = [0u8; 48];
    for (i, g) in got.iter().enumerate() {
        let ip = IpRepr::between(b_ip, addr2.ip()).unwrap();
        let udp = UdpRepr {
            src_port: b.port(),
            dst_port: addr2.port(),
        };
        assert!(
            matches!(
                icrc::check_received(ip, &udp, g, 0, 64, false, &mut hdr),
                icrc::Received::Window { .. }
            ),
            "forwarded packet {i}"
        );
    }
    let got: Vec<Vec<u8>> = got.iter().map(|g| g[..g.len() - 4].to_vec()).collect();
    assert_eq!(got.len(), 12);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g[..] == w[..len - 4], "packet {i} as sent");
    }
    assert!(nothing_on(&s1) && nothing_on(&s2));

    // Forwarded no more: the device's again.
    b.unforward_qp(0x11);
    send(&mut a, &p1);
    assert_eq!(device_packets(&mut b, 1), vec![p1[..60].to_vec()]);
    b.unforward_to(addr2);
    assert_eq!(b.forwarded_qps(), 0);
    send(&mut a, &p2);
    assert_eq!(device_packets(&mut b, 1), vec![p2[..60].to_vec()]);
    assert!(nothing_on(&s1) && nothing_on(&s2));
}

/// Issue 35, item 7: a request for a net-path QP whose library's last-ran stamp is older
/// than `STALE` at the clock of the daemon's round comes out of the device's receive (for
/// the daemon to answer, `DataPath::net_answer`) in the very receive that forwards it —
/// without the watcher having held the QP (`hold_qp` is never called here); while the
/// stamp is fresh, and for a response, it is only forwarded. Stamps and clock are fake.
#[test]
fn a_request_for_a_stale_library_is_handed_out_at_once_without_the_watcher() {
    use softverbs_abi::direct::{NS_LEN, NS_RAN};
    use std::sync::atomic::Ordering;
    let (mut a, mut b, a_ip, b_ip) = device_pair("127.77.10.1", "127.77.10.2");
    let device: std::net::SocketAddr = (b_ip, b.port()).into();
    let (_keep, fd, addr) = b.open_net_socket().unwrap();
    let lib = std::net::UdpSocket::from(fd);
    b.forward_qp(0x11, gid(a_ip), addr);
    let region = std::sync::Arc::new(
        softverbs_shm::Region::create("test-stamp", NS_LEN)
            .unwrap()
            .0,
    );
    let ms = 1_000_000u64;
    region.atomic_u64s(NS_RAN, 1)[0].store(1_000 * ms, Ordering::Release);
    b.stamp_from(addr, region.clone());

    let send = |a: &mut NetDev, p: &[u8]| {
        let mut p = p.to_vec();
        a.send(&tx_to(b_ip, p.len()), &mut p).unwrap();
        a.flush().unwrap();
    };
    // Receives until `n` packets were forwarded in all; what the receives handed out.
    let handed_out = |b: &mut NetDev, n: u64| {
        let mut buf = vec![0u8; MAX_PACKET];
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        while b.forward_stats().forwarded < n && Instant::now() < deadline {
            b.mark_readable();
            match b.recv(&mut buf).unwrap() {
                Some((_, len)) => got.push(buf[..len - 4].to_vec()),
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        assert_eq!(b.forward_stats().forwarded, n, "{:?}", b.forward_stats());
        got
    };
    let request = packet_for(0x11, 64, 1);
    let mut response = packet_for(0x11, 64, 2);
    response[0] = 0x11; // RC ACKNOWLEDGE: a response, never the daemon's to answer.

    // Fresh (ran 5 ms ago): forwarded only.
    b.set_clock(1_005 * ms);
    send(&mut a, &request);
    assert!(
        handed_out(&mut b, 1).is_empty(),
        "a running library answers itself"
    );
    assert_eq!(forwarded(&lib, device, 1), vec![request[..60].to_vec()]);

    // Stale (ran 11 ms ago), the watcher never ran: forwarded and handed out at once.
    b.set_clock(1_011 * ms);
    send(&mut a, &request);
    assert_eq!(handed_out(&mut b, 2), vec![request[..60].to_vec()]);
    assert_eq!(forwarded(&lib, device, 1), vec![request[..60].to_vec()]);
    // A response for the stale library goes on to it alone.
    send(&mut a, &response);
    assert!(handed_out(&mut b, 3).is_empty());
    assert_eq!(forwarded(&lib, device, 1), vec![response[..60].to_vec()]);

    // The library ran again: forwarded only.
    region.atomic_u64s(NS_RAN, 1)[0].store(1_010 * ms, Ordering::Release);
    send(&mut a, &request);
    assert!(handed_out(&mut b, 4).is_empty());
    assert_eq!(forwarded(&lib, device, 1), vec![request[..60].to_vec()]);
    assert!(nothing_on(&lib));
}

/// Issue 35, item 1: no socket of any process can join the device's address and port — not
/// with `SO_REUSEPORT` (which on 574da6f joined the device's reuseport group, whose program
/// any member may replace), not with `SO_REUSEADDR`, not on the wildcard address — and a
/// second device is refused with `EADDRINUSE`.
#[test]
fn no_other_socket_binds_the_device_port() {
    use socket2::{Domain, Protocol, Socket, Type};
    let ip: IpAddr = "127.77.9.1".parse().unwrap();
    let first = NetDev::bind(ip, 4791).unwrap();
    let e = NetDev::bind(ip, 4791).err().expect("the address is taken");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    let try_bind = |at: IpAddr, reuse_port: bool, reuse_addr: bool| {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        s.set_reuse_port(reuse_port).unwrap();
        s.set_reuse_address(reuse_addr).unwrap();
        s.bind(&std::net::SocketAddr::new(at, first.port()).into())
    };
    let any: IpAddr = "0.0.0.0".parse().unwrap();
    for (at, rp, ra) in [
        (ip, true, false),
        (ip, false, true),
        (ip, true, true),
        (ip, false, false),
        (any, true, true),
    ] {
        let e = try_bind(at, rp, ra).expect_err("the device's port is the daemon's alone");
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::AddrInUse,
            "{at} reuseport {rp} reuseaddr {ra}: {e}"
        );
    }
    // Held by a plain socket of someone else: refused too.
    let other: IpAddr = "127.77.9.2".parse().unwrap();
    let _held = std::net::UdpSocket::bind((other, 4791)).unwrap();
    let e = NetDev::bind(other, 4791)
        .err()
        .expect("the address is taken");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
}
