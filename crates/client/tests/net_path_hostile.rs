//! Issue 35, item 1: a hostile local client can neither see nor disturb another QP's net-path
//! traffic. On 574da6f the daemon handed every net-path client a member of the device's
//! `SO_REUSEPORT` group on port 4791, and any member (or any socket of the daemon's uid that
//! bound the port) could replace the group's program or connect itself, stealing or
//! black-holing everyone's RoCE traffic. Now the device port is the daemon's alone and a
//! client holds a private socket the daemon forwards its own QPs' packets to.
//!
//! Each test runs two daemons on loopback addresses of their own, a victim pair of net-path
//! QPs between them moving checked data, and a hostile child process — as `nobody` (another
//! uid than the victim's) and as the victim's own uid — that gets a net-path socket of its
//! own and then does everything it can: attaches a reuseport program to what it was handed,
//! sets `SO_REUSEPORT` on it, connects it, binds further sockets on the device's address and
//! port 4791 and on its handed port with `SO_REUSEPORT` (and a program on those), and reads
//! all of them while the victim's transfer runs. Pass: the victim's every message arrives
//! once, in order and intact, and the hostile process saw no datagram for any QP but its own.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use softverbs::{BorrowedMr, Context, QpInit, QpType, SendOp, SendRequest, Sge, WcStatus};
use softverbs_daemon::{spawn_daemon_with, Config, DeviceSpec, TestDaemon};

use common::{cap, connect, Reaped, ALL};

const T: Duration = Duration::from_secs(20);

/// `nobody`.
const OTHER_UID: u32 = 65534;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A daemon on `ip` in a directory every uid can reach (the hostile child may be `nobody`).
fn daemon(name: &str, ip: &str) -> (TestDaemon, Dir) {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("svhost-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut c = Config::new(dir.join("sv.sock"));
    c.devices = vec![DeviceSpec {
        name: format!("sv-{name}"),
        ips: vec![ip.parse().unwrap()],
    }];
    c.net.bind = true;
    (spawn_daemon_with(c).unwrap(), Dir(dir))
}

fn sge(mr: &BorrowedMr<'_>, offset: u64, len: u32) -> [Sge; 1] {
    [mr.sge(offset as usize, len as usize).unwrap()]
}

fn message(i: u32) -> Vec<u8> {
    let len = 1 + (i as usize * 997) % 4000;
    (0..len)
        .map(|k| (k as u32 ^ i.wrapping_mul(31)) as u8)
        .collect()
}

/// The BTH destination QP of a RoCE v2 payload (IBA 9.2), if it has one.
fn dest_qp(pkt: &[u8]) -> Option<u32> {
    let b = pkt.get(4..8)?;
    Some(u32::from_be_bytes([0, b[1], b[2], b[3]]))
}

/// A classic BPF program of one instruction, `ret #k` (`BPF_RET | BPF_K`): as a reuseport
/// program it sends every datagram of the group to member `k`.
fn ret_program(k: u32) -> [libc::sock_filter; 1] {
    [libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k,
    }]
}

/// Attaches `ret #k` as `fd`'s reuseport group program; the kernel's answer.
fn attach_reuseport_program(fd: BorrowedFd<'_>, k: u32) -> nix::Result<()> {
    let mut prog = ret_program(k);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::AttachReusePortCbpf, &fprog)
}

/// A nonblocking UDP socket with `SO_REUSEPORT` bound to `at`, if the kernel lets it.
fn reuseport_socket(at: SocketAddr) -> nix::Result<OwnedFd> {
    use nix::sys::socket::{
        bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    let s = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    setsockopt(&s, sockopt::ReusePort, &true)?;
    let SocketAddr::V4(v4) = at else {
        return Err(nix::errno::Errno::EAFNOSUPPORT);
    };
    bind(s.as_raw_fd(), &SockaddrIn::from(v4))?;
    Ok(s)
}

/// This process's UDP sockets bound to `ip` (the library's net-path socket among them).
fn udp_sockets_on(ip: IpAddr) -> Vec<(RawFd, SocketAddr)> {
    use nix::sys::socket::{getsockname, SockaddrIn};
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        if let Ok(a) = getsockname::<SockaddrIn>(fd) {
            let at = SocketAddr::from(std::net::SocketAddrV4::from(a));
            if at.ip() == ip && at.port() != 0 {
                out.push((fd, at));
            }
        }
    }
    out
}

/// The hostile child's body (does nothing as a test): a net-path QP of its own between the
/// two daemons, then every attack on its socket and on the device's port; it reads all its
/// sockets until told to stop and reports how many datagrams it saw for QPs not its own.
/// A PD, a CQ of `depth` entries and an RC QP on each of two contexts (a macro: the QP
/// borrows its PD and CQ, so the three cannot come back from one function).
macro_rules! rc_qps {
    ($a:ident, $b:ident, $depth:literal => $pa:ident, $pb:ident, $cqa:ident, $cqb:ident,
     $qa:ident, $qb:ident) => {
        let ($pa, $pb) = ($a.alloc_pd().unwrap(), $b.alloc_pd().unwrap());
        let ($cqa, $cqb) = ($a.create_cq($depth).unwrap(), $b.create_cq($depth).unwrap());
        let $qa = $a
            .create_qp(&QpInit::new(QpType::Rc, &$pa).cqs(&$cqa, &$cqa).cap(cap()))
            .unwrap();
        let $qb = $b
            .create_qp(&QpInit::new(QpType::Rc, &$pb).cqs(&$cqb, &$cqb).cap(cap()))
            .unwrap();
    };
}

#[test]
fn hostile_child_process() {
    let (Some(sa), Some(sb), Some(ip)) = (
        std::env::var_os("SV_HOSTILE_A"),
        std::env::var_os("SV_HOSTILE_B"),
        std::env::var("SV_HOSTILE_IP").ok(),
    ) else {
        return;
    };
    let ip: IpAddr = ip.parse().unwrap();
    let port: u16 = std::env::var("SV_HOSTILE_PORT").unwrap().parse().unwrap();
    let a = Context::open_at(Path::new(&sa), 0).unwrap();
    let b = Context::open_at(Path::new(&sb), 0).unwrap();
    rc_qps!(a, b, 64 => pa, pb, cqa, cqb, qa, qb);
    connect(&qa, b.query_gid(1, 0).unwrap(), qb.qpn());
    connect(&qb, a.query_gid(1, 0).unwrap(), qa.qpn());
    assert!(qa.is_net(), "the hostile QP is on the net path too");
    // Its sockets are on A's address: the only QP of A whose packets are its own.
    let mine = [qa.qpn()];

    // What it was handed: every UDP socket of this process on the device's address.
    let handed = udp_sockets_on(ip);
    assert!(!handed.is_empty(), "a net-path socket was handed over");
    let mut watched: Vec<RawFd> = Vec::new();
    let mut log = Vec::new();
    for &(fd, at) in &handed {
        // SAFETY: `fd` is open in this process (the library keeps it) for the whole body.
        let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
        // Index 1 and 2: the first pool members on 574da6f (the victim's, the hostile's);
        // the last program attached stays.
        for k in [1, 0, 2] {
            log.push(format!(
                "{at} program {k}: {:?}",
                attach_reuseport_program(bfd, k)
            ));
        }
        let r = nix::sys::socket::setsockopt(&bfd, nix::sys::socket::sockopt::ReusePort, &true);
        log.push(format!("{at} reuseport: {r:?}"));
        if let Ok(s) = reuseport_socket(at) {
            log.push(format!("joined {at}"));
            let _ = attach_reuseport_program(std::os::fd::AsFd::as_fd(&s), 1);
            watched.push(s.as_raw_fd());
            std::mem::forget(s);
        }
        watched.push(fd);
    }
    // The device's port itself, with a program that takes all of the group.
    let device = SocketAddr::new(ip, port);
    for k in [1, 0] {
        match reuseport_socket(device) {
            Ok(s) => {
                log.push(format!("joined the device port {device}"));
                let _ = attach_reuseport_program(std::os::fd::AsFd::as_fd(&s), k);
                watched.push(s.as_raw_fd());
                std::mem::forget(s);
            }
            Err(e) => log.push(format!("device port {device}: {e}")),
        }
    }
    // Connected to the peer device: on 574da6f a connected member is preferred for its
    // 4-tuple.
    for &(fd, _) in &handed {
        let SocketAddr::V4(peer) = SocketAddr::new(b.query_gid(1, 0).unwrap().to_ip(), port) else {
            continue;
        };
        let r = nix::sys::socket::connect(fd, &nix::sys::socket::SockaddrIn::from(peer));
        log.push(format!("connect {peer}: {r:?}"));
    }
    for l in &log {
        eprintln!("hostile: {l}");
    }
    println!("armed");

    // Read everything until the parent says stop (a line on stdin), then once more.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    std::thread::spawn(move || {
        let mut l = String::new();
        let _ = std::io::stdin().lock().read_line(&mut l);
        s2.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let mut foreign = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let last = stop.load(std::sync::atomic::Ordering::SeqCst);
        for &fd in &watched {
            while let Ok(n) =
                nix::sys::socket::recv(fd, &mut buf, nix::sys::socket::MsgFlags::MSG_DONTWAIT)
            {
                if dest_qp(&buf[..n]).is_none_or(|q| !mine.contains(&q)) {
                    foreign += 1;
                }
            }
        }
        if last {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    println!("foreign {foreign}");
}

/// Runs the hostile child (as `uid` if given), a victim transfer beside it, and checks both.
fn victim_beside_hostile(net: u8, uid: Option<u32>) {
    use std::os::unix::fs::MetadataExt;
    if uid.is_some() && std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        eprintln!("SKIP: only root can run the hostile child as another uid");
        return;
    }
    let (ipa, ipb) = (format!("127.93.{net}.1"), format!("127.93.{net}.2"));
    let (d1, _x) = daemon(&format!("h{net}a"), &ipa);
    let (d2, _y) = daemon(&format!("h{net}b"), &ipb);
    // The victim's pair first: on 574da6f it held the first pool member of each device.
    let va = Context::open_at(&d1.socket, 0).unwrap();
    let vb = Context::open_at(&d2.socket, 0).unwrap();
    rc_qps!(va, vb, 64 => pa, pb, cqa, cqb, qa, qb);
    connect(&qa, vb.query_gid(1, 0).unwrap(), qb.qpn());
    connect(&qb, va.query_gid(1, 0).unwrap(), qa.qpn());
    assert!(qa.is_net() && qb.is_net(), "the victim is on the net path");
    let port = softverbs_wire::ip::ROCE_V2_UDP_PORT;

    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "hostile_child_process", "--nocapture"])
        .env("SV_HOSTILE_A", &d1.socket)
        .env("SV_HOSTILE_B", &d2.socket)
        .env("SV_HOSTILE_IP", &ipa)
        .env("SV_HOSTILE_PORT", port.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    if let Some(u) = uid {
        cmd.uid(u).gid(u);
    }
    let mut child = Reaped(cmd.spawn().unwrap());
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the hostile child ended early"
        );
        if line.trim() == "armed" {
            break;
        }
    }

    // The victim's transfer, both ways, every message checked.
    let mut abuf = vec![0u8; 16 * 4096];
    let mut bbuf = vec![0u8; 16 * 4096];
    let ma = pa.reg_slice(&mut abuf, ALL).unwrap();
    let mb = pb.reg_slice(&mut bbuf, ALL).unwrap();
    for (tx, tx_cq, tx_mr, rx, rx_cq, rx_mr) in [
        (&qa, &cqa, &ma, &qb, &cqb, &mb),
        (&qb, &cqb, &mb, &qa, &cqa, &ma),
    ] {
        for round in 0..5u32 {
            for k in 0..16u32 {
                rx.post_recv(u64::from(k), &sge(rx_mr, u64::from(k) * 4096, 4096))
                    .unwrap();
            }
            for k in 0..16u32 {
                let m = message(round * 16 + k);
                tx_mr.write(k as usize * 4096, &m).unwrap();
                let s = sge(tx_mr, u64::from(k) * 4096, m.len() as u32);
                tx.post_send(&SendRequest::new(u64::from(k), SendOp::Send, &s))
                    .unwrap();
            }
            let sent = tx_cq.wait(16, T).unwrap();
            assert_eq!(sent.len(), 16, "round {round}: sends completed");
            assert!(
                sent.iter().all(|w| w.status == WcStatus::Success),
                "round {round}: {sent:?}"
            );
            let got = rx_cq.wait(16, T).unwrap();
            assert_eq!(got.len(), 16, "round {round}: receives completed");
            for (k, w) in got.iter().enumerate() {
                let m = message(round * 16 + k as u32);
                assert_eq!((w.wr_id, w.status), (k as u64, WcStatus::Success));
                let mut v = vec![0u8; m.len()];
                rx_mr.read(k * 4096, &mut v).unwrap();
                assert_eq!(v, m, "round {round} message {k} intact");
            }
        }
    }
    assert!(qa.is_net() && qb.is_net(), "still on the net path");

    // Stop the child: it reads its sockets once more and reports.
    let mut stdin = child.0.stdin.take().unwrap();
    writeln!(stdin, "stop").unwrap();
    let foreign = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the hostile child ended early"
        );
        if let Some(n) = line.trim().strip_prefix("foreign ") {
            break n.parse::<u64>().unwrap();
        }
    };
    assert_eq!(foreign, 0, "the hostile process saw another QP's packets");
    let st = child.0.wait().unwrap();
    assert!(st.success(), "the hostile child failed: {st}");
}

/// A hostile client of another uid (`nobody`) beside a victim of root's.
#[test]
fn a_hostile_client_of_another_uid_sees_and_disturbs_no_other_qp() {
    victim_beside_hostile(41, Some(OTHER_UID));
}

/// A hostile client of the victim's own uid (and of the daemon's, here root): on 574da6f it
/// could even bind the device's port and join the group.
#[test]
fn a_hostile_client_of_the_same_uid_sees_and_disturbs_no_other_qp() {
    victim_beside_hostile(42, None);
}

/// Issue 35, item 8 (the net path's part): a context's net-path socket is released with the
/// context. On 574da6f the daemon kept every pool socket of the device's group open for the
/// device's life (a uid's next context reused it); now the daemon's copy closes with the
/// context and its private port is free again. The daemon runs in this process, so its
/// sockets on the device's address are among this process's descriptors.
#[test]
fn a_contexts_net_path_socket_is_released_with_the_context() {
    let (d1, _x) = daemon("rel-a", "127.93.43.1");
    let (d2, _y) = daemon("rel-b", "127.93.43.2");
    let ip: IpAddr = "127.93.43.1".parse().unwrap();
    let before = udp_sockets_on(ip).len();
    let handed = {
        let a = Context::open_at(&d1.socket, 0).unwrap();
        let b = Context::open_at(&d2.socket, 0).unwrap();
        rc_qps!(a, b, 16 => pa, pb, cqa, cqb, qa, qb);
        connect(&qa, b.query_gid(1, 0).unwrap(), qb.qpn());
        connect(&qb, a.query_gid(1, 0).unwrap(), qa.qpn());
        assert!(qa.is_net(), "on the net path");
        let during = udp_sockets_on(ip);
        assert!(during.len() > before, "a socket was made for the context");
        during
    };
    // The context is gone: so are its sockets, the daemon's copy included (the progress
    // thread may hold the library's copy until its next wake-up: look until a deadline).
    let deadline = std::time::Instant::now() + T;
    while udp_sockets_on(ip).len() != before {
        assert!(
            std::time::Instant::now() < deadline,
            "sockets on {ip} after the context closed: {:?} (before: {before}, during: {handed:?})",
            udp_sockets_on(ip)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for (_, at) in handed {
        if at.port() != softverbs_wire::ip::ROCE_V2_UDP_PORT {
            std::net::UdpSocket::bind(at).expect("the context's port is free");
        }
    }
}

/// Issue 35, item 1 (c), the library's half: a net-path QP's private socket takes packets
/// only from the device's address and port (only the daemon, which checked the ICRC and the
/// source, sends from there). Forged SENDs at the QP's expected PSN, with good ICRCs, sent
/// straight to the private port from a stranger's address, from the peer's address and
/// from the device's own address on another port, are all queued ahead of the peer's real
/// SEND; the receive still gets the real message.
#[test]
fn a_net_path_socket_takes_only_what_the_daemon_forwards() {
    use softverbs_wire::ip::{emit_ip_udp, IpRepr, Ipv4Repr, UdpRepr};
    use softverbs_wire::{emit_packet, BthRepr, Headers, Opcode};
    let (d1, _x) = daemon("src-a", "127.93.44.1");
    let (d2, _y) = daemon("src-b", "127.93.44.2");
    let (ip_a, ip_b): (IpAddr, IpAddr) = (
        "127.93.44.1".parse().unwrap(),
        "127.93.44.2".parse().unwrap(),
    );
    let a = Context::open_at(&d1.socket, 0).unwrap();
    let b = Context::open_at(&d2.socket, 0).unwrap();
    rc_qps!(a, b, 16 => pa, pb, cqa, cqb, qa, qb);
    connect(&qa, b.query_gid(1, 0).unwrap(), qb.qpn());
    connect(&qb, a.query_gid(1, 0).unwrap(), qa.qpn());
    assert!(qa.is_net() && qb.is_net(), "both on the net path");
    let mut abuf = vec![0u8; 8192];
    let mut bbuf = vec![0u8; 8192];
    let ma = pa.reg_slice(&mut abuf, ALL).unwrap();
    let mb = pb.reg_slice(&mut bbuf, ALL).unwrap();
    qb.post_recv(0, &sge(&mb, 0, 4096)).unwrap();
    qb.post_recv(1, &sge(&mb, 4096, 4096)).unwrap();

    // B's private socket: the port on B's address that is not the device's.
    let private = udp_sockets_on(ip_b)
        .into_iter()
        .map(|(_, at)| at)
        .find(|at| at.port() != softverbs_wire::ip::ROCE_V2_UDP_PORT)
        .expect("B's context has a private socket");
    let forged_payload = [0xEEu8; 64];
    let forge = |from: &std::net::UdpSocket| {
        let h = Headers::new(BthRepr::new(Opcode(0x04), qb.qpn(), 0));
        let mut p = vec![0u8; softverbs_wire::packet_len(&h, forged_payload.len())];
        let n = emit_packet(&h, &forged_payload, &mut p).unwrap();
        p.truncate(n);
        let src = from.local_addr().unwrap();
        let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), private.ip()) else {
            unreachable!()
        };
        let udp = UdpRepr {
            src_port: src.port(),
            dst_port: private.port(),
        };
        let mut hdr = [0u8; 64];
        let hl = emit_ip_udp(&IpRepr::V4(Ipv4Repr::new(s, d)), &udp, p.len(), &mut hdr).unwrap();
        softverbs_wire::icrc::write(&hdr[..hl], &mut p).unwrap();
        from.send_to(&p, private).unwrap();
    };
    for from in [ip_a, ip_b, "127.93.44.3".parse().unwrap()] {
        forge(&std::net::UdpSocket::bind((from, 0)).unwrap());
    }

    let real: Vec<u8> = (0..100u8).collect();
    ma.write(0, &real).unwrap();
    qa.post_send(&SendRequest::new(7, SendOp::Send, &sge(&ma, 0, 100)))
        .unwrap();
    let sent = cqa.wait(1, T).unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, WcStatus::Success, "{sent:?}");
    let got = cqb.wait(1, T).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].wr_id, got[0].status), (0, WcStatus::Success));
    assert_eq!(got[0].byte_len, 100, "the real SEND, not a forged one");
    let mut v = vec![0u8; 100];
    mb.read(0, &mut v).unwrap();
    assert_eq!(v, real);
    assert!(cqb.poll(4).unwrap().is_empty(), "nothing else was received");
}
