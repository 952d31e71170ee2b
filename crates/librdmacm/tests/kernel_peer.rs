//! An rdma_cm program on the drop-ins against a peer that speaks as the Linux kernel's ib_cm
//! and rxe do (issue 37, defects 2 and 3), played by this test with the wire crate on a UDP
//! socket: REQ/REP/RTU to the daemon's QP1, then one RC SEND with immediate each way.
//!
//! - **Starting PSN** (docs/design/cm.md, "Starting PSN"): the kernel puts in its REQ or REP
//!   the PSN its own receive queue expects (`cm_id_priv->rq_psn`) and sends from the PSN of
//!   the peer's message (`sq_psn`). The peer here does the same, and checks that the first
//!   SEND softverbs makes carries the PSN the peer's message advertised, and that the
//!   peer's own SEND (from the PSN in softverbs' message) is delivered, not taken for a
//!   duplicate and re-ACKed (the silent loss rping showed against rxe).
//! - **Immediate data** (docs/design/roce-wire.md, "Immediate data"): the program sends
//!   `htobe32(0x2d)`; the ImmDt on the wire must be `00 00 00 2d`, and an ImmDt of
//!   `00 00 00 2d` from the peer must reach the program as `wc.imm_data == htobe32(0x2d)`.
//!
//! Both directions: the program as rdma_cm server (`tests/c/kpeer.c server`) and as client;
//! the server case also over IPv6 with the peer's UDP checksums 0, as rxe sends them
//! (docs/design/roce-wire.md §9). Addresses 127.37.N.1 (the daemon's device) and 127.37.N.2
//! (the peer), N = 0 and 1, and fd00:37::1/::2 added to `lo`: run inside a network namespace
//! of its own:
//!
//!     unshare -n sh -c 'ip link set lo up && cargo test -p softverbs-librdmacm --test kernel_peer'

mod support;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use softverbs_testkit::bins::softverbs_bin;
use softverbs_wire::cm::msg::{PathInfo, Rep, Req, Rtu};
use softverbs_wire::cm::{gsi_headers, CmMad, CmMessage, CmaHdr};
use softverbs_wire::ip::{emit_ip_udp, IpRepr, UdpRepr, ROCE_V2_UDP_PORT};
use softverbs_wire::{
    emit_packet, icrc, AethRepr, BthRepr, Headers, ImmDtRepr, Opcode, Packet, Syndrome,
};
use support::{build_c, wait_cm};

const T: Duration = Duration::from_secs(30);
/// The peer's RC QP and the PSN its receive queue expects first (what its REQ/REP says).
const PEER_QPN: u32 = 0x00_0a11;
const PEER_RQ_PSN: u32 = 0x0a_0b0c;
/// RC opcodes (IBA 9.2, table 35).
const SEND_ONLY_WITH_IMM: u8 = 0x05;
const ACKNOWLEDGE: u8 = 0x11;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `softverbs daemon` with one device on `ip`, killed on drop.
struct Daemon(Child, PathBuf);
impl Daemon {
    fn start(dir: &Path, ip: IpAddr) -> Daemon {
        let sock = dir.join("sv.sock");
        let child = Command::new(softverbs_bin())
            .arg("daemon")
            .arg("--socket")
            .arg(&sock)
            .arg("--device")
            .arg(format!("softverbs0={ip}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap())
            .spawn()
            .unwrap();
        let d = Daemon(child, sock);
        let deadline = Instant::now() + T;
        while !support::cm_of(&d.1).is_object() {
            assert!(Instant::now() < deadline, "the daemon did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }
}
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A received RoCE v2 packet (BTH through ICRC).
struct Rx(Vec<u8>);
impl Rx {
    fn parse(&self) -> softverbs_wire::PacketRef<'_> {
        Packet::parse(&self.0).expect("a RoCE v2 packet from the daemon")
    }
}

/// The kernel-semantics peer: RoCE v2 packets from `ip`:4791 to the daemon's `daemon`:4791
/// with a correct ICRC.
struct Peer {
    sock: UdpSocket,
    ip: IpAddr,
    daemon: IpAddr,
    gsi_psn: u32,
}

impl Peer {
    fn bind(ip: IpAddr, daemon: IpAddr) -> Peer {
        let sock = UdpSocket::bind(SocketAddr::new(ip, ROCE_V2_UDP_PORT))
            .unwrap_or_else(|e| panic!("bind {ip}:4791 (run in a network namespace): {e}"));
        if ip.is_ipv6() {
            // As rxe (`prepare_udp_hdr`): UDP checksum 0, over IPv6 too.
            no_udp6_checksums(&sock);
        } else {
            // DF set on an unconnected socket: Linux gives every datagram identification 0,
            // which the ICRC below is computed with (docs/design/roce-wire.md §6).
            set_int(
                &sock,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            );
        }
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Peer {
            sock,
            ip,
            daemon,
            gsi_psn: 0,
        }
    }

    fn send(&self, h: &Headers, payload: &[u8]) {
        let mut ib = vec![0u8; 64 + payload.len()];
        let n = emit_packet(h, payload, &mut ib).unwrap();
        ib.truncate(n);
        let ip = IpRepr::between(self.ip, self.daemon).unwrap();
        let udp = UdpRepr {
            src_port: ROCE_V2_UDP_PORT,
            dst_port: ROCE_V2_UDP_PORT,
        };
        let mut hdr = [0u8; 48];
        let hl = emit_ip_udp(&ip, &udp, ib.len(), &mut hdr).unwrap();
        icrc::write(&hdr[..hl], &mut ib).unwrap();
        self.sock
            .send_to(&ib, SocketAddr::new(self.daemon, ROCE_V2_UDP_PORT))
            .unwrap();
    }

    fn mad(&mut self, tid: u64, msg: CmMessage) {
        let mad = CmMad { tid, msg }.emit().unwrap();
        self.send(&gsi_headers(self.gsi_psn), &mad);
        self.gsi_psn += 1;
    }

    /// The next packet from the daemon for which `want` says yes; `what` names it when none
    /// comes within [`T`] (`prog`, the program under test, is killed and its output shown).
    fn next(&self, what: &str, prog: &mut Prog, want: impl Fn(&Rx) -> bool) -> Rx {
        let deadline = Instant::now() + T;
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            match self.sock.recv_from(&mut buf) {
                Ok((n, _)) => {
                    let rx = Rx(buf[..n].to_vec());
                    if Packet::parse(&rx.0).is_ok() && want(&rx) {
                        return rx;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => panic!("recv: {e}"),
            }
        }
        panic!(
            "no {what} from the daemon within {T:?}; program:\n{}",
            prog.kill()
        );
    }

    /// The next CM MAD for which `want` gives a value.
    fn next_mad<R>(
        &self,
        what: &str,
        prog: &mut Prog,
        want: impl Fn(&CmMessage) -> Option<R>,
    ) -> R {
        let take = |rx: &Rx| {
            let p = rx.parse();
            if p.headers.bth.dest_qp != 1 {
                return None;
            }
            CmMad::parse(p.payload).ok().and_then(|m| want(&m.msg))
        };
        let rx = self.next(what, prog, |rx| take(rx).is_some());
        take(&rx).unwrap()
    }

    /// An RC SEND_ONLY with immediate `imm` (the ImmDt's bytes are its big-endian bytes).
    fn send_imm(&self, qpn: u32, psn: u32, imm: u32, payload: &[u8]) {
        let mut bth = BthRepr::new(Opcode(SEND_ONLY_WITH_IMM), qpn, psn);
        bth.ack_req = true;
        let mut h = Headers::new(bth);
        h.imm_dt = Some(ImmDtRepr { imm });
        self.send(&h, payload);
    }

    fn ack(&self, qpn: u32, psn: u32, msn: u32) {
        let mut h = Headers::new(BthRepr::new(Opcode(ACKNOWLEDGE), qpn, psn));
        h.aeth = Some(AethRepr {
            syndrome: Syndrome::Ack {
                credits: Syndrome::UNLIMITED_CREDITS,
            },
            msn,
        });
        self.send(&h, &[]);
    }
}

/// The program under test and its stdout, line by line.
struct Prog {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Prog {
    fn start(socket: &Path, exe: &Path, args: &[&str]) -> Prog {
        let mut child = support::run(None, socket, exe, args);
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Prog {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first line (from now) that starts with `prefix`.
    fn line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + T;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("no line `{prefix}...` from the program:\n{}", self.kill());
    }

    fn kill(&mut self) -> String {
        let _ = self.child.kill();
        let out = self.child.wait_with_output_ref();
        format!("stdout:\n{}\n{out}", self.seen.join("\n"))
    }

    fn wait_ok(&mut self) {
        let deadline = Instant::now() + T;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "program: {st}\n{}", self.kill());
                return;
            }
            assert!(
                Instant::now() < deadline,
                "program did not end:\n{}",
                self.kill()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

trait WaitRef {
    fn wait_with_output_ref(&mut self) -> String;
}
impl WaitRef for Child {
    /// The status and stderr of a child whose stdout another thread reads.
    fn wait_with_output_ref(&mut self) -> String {
        let st = self.wait().map(|s| s.to_string()).unwrap_or_default();
        let mut err = String::new();
        if let Some(mut e) = self.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        format!("status {st}\nstderr:\n{err}")
    }
}

fn gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// `UDP_NO_CHECK6_TX`: the socket sends IPv6 datagrams with UDP checksum 0.
fn no_udp6_checksums(sock: &UdpSocket) {
    set_int(sock, libc::SOL_UDP, libc::UDP_NO_CHECK6_TX, 1);
}

fn set_int(sock: &UdpSocket, level: libc::c_int, name: libc::c_int, v: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: an open socket, a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let e = std::io::Error::last_os_error();
    assert_eq!(r, 0, "setsockopt {level}/{name}: {e}");
}

/// The path a kernel CM puts in a RoCE v2 REQ (cm_format_req with a RoCE path record):
/// permissive LIDs, the IPv4-mapped GIDs, hop limit 64, not subnet-local.
fn path(local: IpAddr, remote: IpAddr) -> PathInfo {
    PathInfo {
        local_lid: 0xFFFF,
        remote_lid: 0xFFFF,
        local_gid: gid(local),
        remote_gid: gid(remote),
        flow_label: 0,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 64,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: 19,
    }
}

/// The 16 bytes of the ImmDt of an RC SEND_ONLY_WITH_IMMEDIATE: right after the 12-byte BTH.
fn imm_bytes(rx: &Rx) -> [u8; 4] {
    rx.0[12..16].try_into().unwrap()
}

/// The daemon on 127.37.`net`.1, the peer on 127.37.`net`.2 (each test its own).
fn setup(name: &str, net: u8) -> Option<(Dir, Daemon, PathBuf, Peer)> {
    let v4 = |h| IpAddr::V4(Ipv4Addr::new(127, 37, net, h));
    setup_at(name, v4(1), v4(2))
}

fn setup_at(name: &str, ip: IpAddr, peer_ip: IpAddr) -> Option<(Dir, Daemon, PathBuf, Peer)> {
    let dir = std::env::temp_dir().join(format!("svkp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = build_c("kpeer", &dir)?;
    let peer = Peer::bind(peer_ip, ip);
    let d = Daemon::start(&dir, ip);
    Some((Dir(dir), d, exe, peer))
}

/// softverbs as the passive side (the rping-server case that lost rxe's SEND silently).
#[test]
fn a_kernel_active_side_connects_and_each_side_sends_from_the_psn_the_other_advertised() {
    let Some((_dir, d, exe, peer)) = setup("server", 0) else {
        return;
    };
    passive_side(&d, &exe, peer, 7437);
}

/// The same over IPv6, with the peer's datagrams carrying UDP checksum 0 as rxe's do: a plain
/// IPv6 UDP socket drops those (the device sockets set `UDP_NO_CHECK6_RX`).
#[test]
fn a_kernel_active_side_connects_over_ipv6_with_zero_udp_checksums() {
    let ips = [0x1u16, 0x2].map(|h| Ipv6Addr::new(0xfd00, 0x37, 0, 0, 0, 0, 0, h));
    let Some(_addrs) = LoAddrs::add(&ips) else {
        return;
    };
    let Some((_dir, d, exe, peer)) = setup_at("server6", ips[0].into(), ips[1].into()) else {
        return;
    };
    passive_side(&d, &exe, peer, 7439);
}

/// IPv6 addresses on `lo` for one test, removed on drop; `None` (with a SKIP line) when
/// `ip` cannot add them (not root).
struct LoAddrs(Vec<Ipv6Addr>);
impl LoAddrs {
    fn add(ips: &[Ipv6Addr]) -> Option<LoAddrs> {
        let mut added = LoAddrs(Vec::new());
        for ip in ips {
            let ok = Command::new("ip")
                .args([
                    "-6",
                    "addr",
                    "add",
                    &format!("{ip}/128"),
                    "dev",
                    "lo",
                    "nodad",
                ])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                assert!(std::env::var_os("CI").is_none(), "ip addr add {ip} failed");
                eprintln!("SKIP: cannot add {ip} to lo (needs root in a network namespace)");
                return None;
            }
            added.0.push(*ip);
        }
        Some(added)
    }
}
impl Drop for LoAddrs {
    fn drop(&mut self) {
        for ip in &self.0 {
            let _ = Command::new("ip")
                .args(["-6", "addr", "del", &format!("{ip}/128"), "dev", "lo"])
                .status();
        }
    }
}

fn passive_side(d: &Daemon, exe: &Path, mut peer: Peer, port: u16) {
    let mut prog = Prog::start(&d.1, exe, &["server", &port.to_string()]);
    prog.line("listening");
    wait_cm(&d.1, "the listener", |cm| cm["listeners"] == 1);

    let mut private_data = [0u8; 92];
    CmaHdr {
        src_port: 40_000,
        src: peer.ip,
        dst: peer.daemon,
    }
    .emit(&mut private_data)
    .unwrap();
    let req = Req {
        local_comm_id: 0x1111_2222,
        service_id: 0x0106_0000 | u64::from(port), // RDMA_PS_TCP
        local_ca_guid: 0x0002_c9ff_fe00_0001,
        local_qkey: 0,
        local_qpn: PEER_QPN,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service_type: 0,
        end_to_end_flow_control: false,
        starting_psn: PEER_RQ_PSN,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary: path(peer.ip, peer.daemon),
        alternate: PathInfo::default(),
        sap_supported: false,
        private_data,
    };
    peer.mad(0x77, CmMessage::Req(Box::new(req)));
    let rep: Rep = peer.next_mad("REP", &mut prog, |m| match m {
        CmMessage::Rep(r) if r.remote_comm_id == 0x1111_2222 => Some((**r).clone()),
        _ => None,
    });
    peer.mad(
        0x78,
        CmMessage::Rtu(Box::new(Rtu {
            local_comm_id: 0x1111_2222,
            remote_comm_id: rep.local_comm_id,
            private_data: [0; 224],
        })),
    );

    // The kernel sends from the PSN of the REP (cm_rep_handler: sq_psn).
    let qpn = rep.local_qpn;
    peer.send_imm(qpn, rep.starting_psn, 0x2d, b"hello from rxe");
    let got = prog.line("recv ");
    assert_eq!(
        got, "recv len=14 imm=0x0000002d bytes=00.00.00.2d data=hello from rxe",
        "the peer's SEND from the REP's Starting PSN, ImmDt 00 00 00 2d"
    );
    let ack = peer.next("ACK of the peer's SEND", &mut prog, |rx| {
        rx.parse().opcode() == Opcode(ACKNOWLEDGE)
    });
    assert_eq!(ack.parse().headers.bth.psn, rep.starting_psn);

    // The program's answer: from the PSN the REQ advertised, ImmDt 00 00 00 2d.
    let ans = peer.next("the program's SEND", &mut prog, |rx| {
        rx.parse().opcode() == Opcode(SEND_ONLY_WITH_IMM)
    });
    let p = ans.parse();
    assert_eq!(p.headers.bth.dest_qp, PEER_QPN);
    assert_eq!(
        p.headers.bth.psn, PEER_RQ_PSN,
        "softverbs' first SEND carries the PSN the REQ advertised"
    );
    assert_eq!(
        imm_bytes(&ans),
        [0, 0, 0, 0x2d],
        "htobe32(0x2d) on the wire"
    );
    assert_eq!(p.payload, b"answer to hello from rxe");
    peer.ack(qpn, PEER_RQ_PSN, 1);
    prog.line("sent");
    prog.wait_ok();
}

/// softverbs as the active side: its REQ advertises the PSN its receive queue expects, it
/// sends from the PSN of the kernel's REP.
#[test]
fn a_kernel_passive_side_accepts_and_each_side_sends_from_the_psn_the_other_advertised() {
    let Some((_dir, d, exe, mut peer)) = setup("client", 1) else {
        return;
    };
    let port = 7438u16;
    let mut prog = Prog::start(
        &d.1,
        &exe,
        &["client", &peer.ip.to_string(), &port.to_string()],
    );
    let (tid, req): (u64, Req) = {
        let take = |rx: &Rx| {
            let p = rx.parse();
            let m = CmMad::parse(p.payload).ok()?;
            match m.msg {
                CmMessage::Req(r) => Some((m.tid, *r)),
                _ => None,
            }
        };
        let rx = peer.next("REQ", &mut prog, |rx| take(rx).is_some());
        take(&rx).unwrap()
    };
    assert_eq!(req.service_id, 0x0106_0000 | u64::from(port));
    let rep = Rep {
        local_comm_id: 0x3333_4444,
        remote_comm_id: req.local_comm_id,
        local_qkey: 0,
        local_qpn: PEER_QPN,
        local_eecn: 0,
        starting_psn: PEER_RQ_PSN,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x0002_c9ff_fe00_0001,
        private_data: [0; 196],
    };
    peer.mad(tid, CmMessage::Rep(Box::new(rep)));
    peer.next_mad("RTU", &mut prog, |m| match m {
        CmMessage::Rtu(r) if r.remote_comm_id == 0x3333_4444 => Some(()),
        _ => None,
    });

    // The program's message: from the PSN the REP advertised (cm_rep_handler: sq_psn).
    let msg = peer.next("the program's SEND", &mut prog, |rx| {
        rx.parse().opcode() == Opcode(SEND_ONLY_WITH_IMM)
    });
    let p = msg.parse();
    assert_eq!(p.headers.bth.dest_qp, PEER_QPN);
    assert_eq!(
        p.headers.bth.psn, PEER_RQ_PSN,
        "softverbs' first SEND carries the PSN the REP advertised"
    );
    assert_eq!(
        imm_bytes(&msg),
        [0, 0, 0, 0x2d],
        "htobe32(0x2d) on the wire"
    );
    assert_eq!(p.payload, b"hello kernel");
    peer.ack(req.local_qpn, PEER_RQ_PSN, 1);
    prog.line("sent");

    // The kernel sends from the PSN of the REQ (cm_req_handler: sq_psn).
    peer.send_imm(req.local_qpn, req.starting_psn, 0x2d, b"hello rdma_cm");
    assert_eq!(
        prog.line("recv "),
        "recv len=13 imm=0x0000002d bytes=00.00.00.2d data=hello rdma_cm",
        "the peer's SEND from the REQ's Starting PSN, ImmDt 00 00 00 2d"
    );
    prog.wait_ok();
}
