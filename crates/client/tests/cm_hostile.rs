//! Hostile senders against the daemon's connection manager (issue 35, items 3 and 4).
//!
//! - A local user who sends from the daemon's own address (any local user can bind another
//!   UDP port of it) REPs, DREQs and REJs naming a pending and then an established
//!   connection of two other clients, by their exact IDs, and SENDs to the passive QP with
//!   its expected PSN: the daemon drops every one of them (`own_source_drops` in
//!   `resources --json` counts them, which is also how the test knows they were all
//!   handled), the connection proceeds and carries only its own data.
//! - 20,000 REQs and 20,000 SIDR_REQs from another host leave at most the listener's
//!   backlog in the CM, and other clients still connect.
//! - An rdma_cm port below 1024 needs root or `CAP_NET_BIND_SERVICE` (`EACCES`).
//!
//! The spoofer and the other uid run as children of this binary as `nobody` (uid 65534)
//! when the test runs as root. Addresses are 127.35.x.y: run inside a network namespace
//! (`unshare -n bash -c 'ip link set lo up && cargo test -p softverbs --test cm_hostile'`).

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{cap, connect_with, RcPath, ALL};
use softverbs::{
    CmChannel, CmEvent, CmEventKind, CmQp, CmTimers, Context, Introspect, Op, QpAttr, QpInit,
    QpState, QpType, SendOp, SendRequest, SendWork, WcStatus,
};
use softverbs_daemon::{spawn_daemon_with, Config, DeviceSpec, TestDaemon};
use softverbs_wire::cm::msg::{Dreq, PathInfo, Rej, Rep, Req, SidrReq};
use softverbs_wire::cm::{gsi_headers, CmMad, CmMessage, RejReason};
use softverbs_wire::icrc;
use softverbs_wire::ip::{emit_ip_udp, IpRepr, Ipv4Repr, UdpRepr, ROCE_V2_UDP_PORT};
use softverbs_wire::{emit_packet, BthRepr, Headers, Opcode};

const T: Duration = Duration::from_secs(30);
const OTHER_UID: u32 = 65534;
/// rdma_cm service IDs of TCP ports 7174, 7175, 7176 and UDP port 7177.
const SID: u64 = 0x0106_1C06;
const SID_FLOOD: u64 = 0x0106_1C07;
const SID_MARK: u64 = 0x0106_1C08;
const SID_SIDR: u64 = 0x0111_1C09;
const FAST: CmTimers = CmTimers {
    response_timeout: 16, // ~268 ms a try
    max_retries: 5,
};
const ROLE: &str = "SV_CM_HOSTILE_ROLE";
const ARG: &str = "SV_CM_HOSTILE_ARG";

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A daemon whose one device has `ip` on the network, in a directory every uid can reach.
fn daemon(name: &str, ip: Ipv4Addr) -> (TestDaemon, Dir) {
    daemon_limits(name, ip, &[])
}

/// [`daemon`] with `limits` (`SCOPE.RESOURCE=N`) on top of the defaults.
fn daemon_limits(name: &str, ip: Ipv4Addr, limits: &[&str]) -> (TestDaemon, Dir) {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("svcmh-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut c = Config::new(dir.join("sv.sock"));
    c.devices = vec![DeviceSpec {
        name: format!("sv-{name}"),
        ips: vec![IpAddr::V4(ip)],
    }];
    c.net.bind = true;
    for l in limits {
        c.limits.apply(l).unwrap();
    }
    (spawn_daemon_with(c).unwrap(), Dir(dir))
}

fn resources(socket: &Path) -> serde_json::Value {
    let json = Introspect::connect_at(socket)
        .unwrap()
        .resources_json()
        .unwrap();
    serde_json::from_str(&json).unwrap()
}

/// Waits (bounded) until `f` holds of the daemon's resources.
fn wait_for(socket: &Path, what: &str, f: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + T;
    loop {
        let r = resources(socket);
        if f(&r) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: own_source_drops {} cm {}",
            r["own_source_drops"],
            r["cm"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait(ch: &CmChannel<'_>, kind: CmEventKind) -> CmEvent {
    let ev = ch
        .wait_event(T)
        .unwrap()
        .unwrap_or_else(|| panic!("no CM event (waiting for {kind:?})"));
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

/// A UDP socket on `ip` sending RoCE v2 packets with a correct ICRC.
struct Sender {
    sock: UdpSocket,
    src: SocketAddr,
    sent: u64,
    /// Where the packets go: 4791, or a closed port for the flood's control phase.
    port: u16,
}

impl Sender {
    fn bind(ip: Ipv4Addr) -> Sender {
        let sock = UdpSocket::bind(SocketAddr::new(IpAddr::V4(ip), 0)).unwrap();
        // DF on an unconnected socket: Linux sends identification 0, the one the ICRC below
        // is computed with; a daemon reading the real header (its raw receive path) drops
        // anything else before the CM sees it (docs/design/roce-wire.md §6).
        let df: libc::c_int = libc::IP_PMTUDISC_DO;
        // SAFETY: an open socket, a live c_int and its size.
        let r = unsafe {
            use std::os::fd::AsRawFd;
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                (&df as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "IP_MTU_DISCOVER: {}", std::io::Error::last_os_error());
        let src = sock.local_addr().unwrap();
        Sender {
            sock,
            src,
            sent: 0,
            port: ROCE_V2_UDP_PORT,
        }
    }

    /// Sends `payload` behind `h` to `to`:4791, paced so that a loaded machine's socket
    /// buffers keep up (a lost packet would never be counted).
    fn send(&mut self, to: Ipv4Addr, h: &Headers, payload: &[u8]) {
        let mut ib = vec![0u8; 64 + payload.len()];
        let n = emit_packet(h, payload, &mut ib).unwrap();
        ib.truncate(n);
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
        self.sock
            .send_to(&ib, SocketAddr::new(IpAddr::V4(to), self.port))
            .unwrap();
        self.sent += 1;
        if self.sent % 32 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn mad(&mut self, to: Ipv4Addr, msg: CmMessage) {
        let mad = CmMad { tid: 1, msg }.emit().unwrap();
        self.send(to, &gsi_headers(0), &mad);
    }
}

/// Runs this binary's test `name` as uid `nobody` with `arg`; false (and a note) when not
/// root, where the caller does the work itself.
fn as_other_uid(name: &str, role: &str, arg: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        eprintln!("not root: {name} runs as this uid");
        return false;
    }
    let st = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(ARG, arg)
        .uid(OTHER_UID)
        .gid(OTHER_UID)
        .status()
        .unwrap();
    assert!(st.success(), "{name} as uid {OTHER_UID}: {st}");
    true
}

/// What the spoofer sends, all from `ip` (the daemon's own address) to `ip`.
#[derive(Clone, Copy, Debug)]
struct Spray {
    ip: Ipv4Addr,
    /// The active side's ID and the passive side's.
    ia: u32,
    ib: u32,
    /// The passive QP and the PSN it expects next.
    qpn: u32,
    psn: u32,
    rounds: u32,
}

impl Spray {
    fn encode(&self) -> String {
        format!(
            "{} {} {} {} {} {}",
            self.ip, self.ia, self.ib, self.qpn, self.psn, self.rounds
        )
    }

    fn decode(s: &str) -> Spray {
        let v: Vec<&str> = s.split(' ').collect();
        Spray {
            ip: v[0].parse().unwrap(),
            ia: v[1].parse().unwrap(),
            ib: v[2].parse().unwrap(),
            qpn: v[3].parse().unwrap(),
            psn: v[4].parse().unwrap(),
            rounds: v[5].parse().unwrap(),
        }
    }

    /// Sends `rounds` × (REP to the active side, DREQ and REJ to each side, a SEND to the
    /// passive QP): 6 packets a round.
    fn run(&self) -> u64 {
        let mut s = Sender::bind(self.ip);
        let (ia, ib) = (self.ia, self.ib);
        for r in 0..self.rounds {
            s.mad(
                self.ip,
                CmMessage::Rep(Box::new(Rep {
                    local_comm_id: ib,
                    remote_comm_id: ia,
                    local_qkey: 0,
                    local_qpn: 0x66,
                    local_eecn: 0,
                    starting_psn: 0x666,
                    responder_resources: 1,
                    initiator_depth: 1,
                    target_ack_delay: 0,
                    failover_accepted: 0,
                    end_to_end_flow_control: true,
                    rnr_retry_count: 7,
                    srq: false,
                    local_ca_guid: 0x666,
                    private_data: [0; 196],
                })),
            );
            for (local, remote) in [(ia, ib), (ib, ia)] {
                s.mad(
                    self.ip,
                    CmMessage::Dreq(Box::new(Dreq {
                        local_comm_id: local,
                        remote_comm_id: remote,
                        remote_qpn: self.qpn,
                        private_data: [0; 220],
                    })),
                );
                s.mad(
                    self.ip,
                    CmMessage::Rej(Box::new(Rej {
                        local_comm_id: local,
                        remote_comm_id: remote,
                        message_rejected: 2,
                        info_length: 0,
                        reason: RejReason::CONSUMER,
                        ari: [0; 72],
                        private_data: [0; 148],
                    })),
                );
            }
            let h = Headers::new(BthRepr::new(
                Opcode(0x04), // RC SEND_ONLY (IBA 9.2, table 35)
                self.qpn,
                (self.psn + r) & 0xFF_FFFF,
            ));
            s.send(self.ip, &h, &[0x66; 64]);
        }
        s.sent
    }
}

/// The spoofer's role: a no-op in a normal run.
#[test]
fn spoofer() {
    if std::env::var(ROLE).as_deref() == Ok("spray") {
        Spray::decode(&std::env::var(ARG).unwrap()).run();
    }
}

/// Sprays from the daemon's own address (as `nobody` when root) and waits until the
/// daemon has dropped all of it.
fn spray_and_wait(socket: &Path, s: Spray) {
    let before = resources(socket)["own_source_drops"].as_u64().unwrap();
    let sent = if as_other_uid("spoofer", "spray", &s.encode()) {
        u64::from(s.rounds) * 6
    } else {
        s.run()
    };
    wait_for(socket, "every spoofed packet dropped", |r| {
        r["own_source_drops"].as_u64().unwrap() >= before + sent
    });
}

#[test]
fn a_spoofer_on_the_daemons_own_address_takes_over_no_connection_and_injects_nothing() {
    let ip = Ipv4Addr::new(127, 35, 1, 1);
    let (d, _dir) = daemon("spoof", ip);
    // Daemon path (no same-host direct path): the engine receives for both QPs.
    let a = Context::open_at_direct(&d.socket, 0, false).unwrap();
    let b = Context::open_at_direct(&d.socket, 0, false).unwrap();
    let (ca, cb) = (a.cm_channel().unwrap(), b.cm_channel().unwrap());
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let gid = a.query_gid(1, 0).unwrap();
    let psn = 0x1234;
    let path = RcPath {
        psn,
        ..RcPath::default()
    };

    let listener = cb.listen(SID).unwrap();
    let ia = ca
        .connect(IpAddr::V4(ip), SID, CmQp::new(qa.qpn(), psn), FAST, b"a")
        .unwrap();
    let req = wait(&cb, CmEventKind::ConnectRequest);
    connect_with(&qb, gid, req.remote_qpn, path);
    let mut mb = pb.alloc_mr(4096, ALL).unwrap();
    qb.post_recv_buf(mb.take(64).unwrap()).unwrap();

    // Pending (REQ received, not accepted): the spoofer knows both IDs exactly.
    let s = Spray {
        ip,
        ia: ia.0,
        ib: req.id.0,
        qpn: qb.qpn(),
        psn,
        rounds: 50,
    };
    spray_and_wait(&d.socket, s);
    assert!(
        ca.try_event().unwrap().is_none(),
        "the active side heard nothing"
    );
    assert!(
        cb.try_event().unwrap().is_none(),
        "the passive side heard nothing"
    );
    assert!(
        cqb.poll_bufs(4).unwrap().is_empty(),
        "no forged SEND was received"
    );

    // The real handshake proceeds with the real numbers.
    cb.accept(req.id, CmQp::new(qb.qpn(), psn), b"b").unwrap();
    let rep = wait(&ca, CmEventKind::ConnectResponse);
    assert_eq!((rep.remote_qpn, rep.starting_psn), (qb.qpn(), psn));
    connect_with(&qa, gid, rep.remote_qpn, path);
    ca.establish(ia).unwrap();
    wait(&ca, CmEventKind::Established);
    wait(&cb, CmEventKind::Established);

    // Established: the same spray again ends nothing.
    spray_and_wait(&d.socket, s);
    assert!(ca.try_event().unwrap().is_none());
    assert!(cb.try_event().unwrap().is_none());

    // The first SEND the passive QP receives is the active side's.
    let mut ma = pa.alloc_mr(4096, ALL).unwrap();
    let mut src = ma.take(64).unwrap();
    src.write(0, &[0x5a; 64]).unwrap();
    qa.post(SendWork::new(Op::Send, src)).unwrap();
    assert_eq!(cqa.wait_bufs(1, T).unwrap()[0].wc.status, WcStatus::Success);
    let got = cqb.wait_bufs(1, T).unwrap().pop().unwrap();
    assert_eq!(got.wc.status, WcStatus::Success);
    assert_eq!(got.buf.unwrap().to_vec(), vec![0x5a; 64]);

    ca.disconnect(ia, b"").unwrap();
    wait(&cb, CmEventKind::Disconnected);
    wait(&ca, CmEventKind::Disconnected);
    ca.destroy(ia).unwrap();
    cb.destroy(req.id).unwrap();
    cb.destroy(listener).unwrap();
}

/// This process's resident set (VmRSS), KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `n` REQs and `n` SIDR_REQs from `s` to `ip`, alternating.
fn flood_mads(s: &mut Sender, ip: Ipv4Addr, n: u32) {
    for i in 1..=n {
        s.mad(ip, req(i, SID_FLOOD));
        s.mad(
            ip,
            CmMessage::SidrReq(Box::new(SidrReq {
                request_id: i,
                pkey: 0xFFFF,
                service_id: SID_SIDR,
                private_data: [0; 216],
            })),
        );
    }
}

fn req(local_comm_id: u32, service_id: u64) -> CmMessage {
    CmMessage::Req(Box::new(Req {
        local_comm_id,
        service_id,
        local_ca_guid: 0x77,
        local_qkey: 0,
        local_qpn: 0x77,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service_type: 0,
        end_to_end_flow_control: true,
        starting_psn: 0,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary: PathInfo {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            hop_limit: 64,
            ..PathInfo::default()
        },
        alternate: PathInfo::default(),
        sap_supported: false,
        private_data: [0; 92],
    }))
}

/// `SOFTVERBS_CM_FLOOD` (default 20,000) REQs and as many SIDR_REQs from another host,
/// then a marker REQ for a third listener: the daemon's one socket is handled in order, so
/// once the marker's connect request arrives everything before it was handled too.
#[test]
fn a_req_and_sidr_flood_leaves_the_cm_bounded_and_others_still_connect() {
    let ip = Ipv4Addr::new(127, 35, 2, 1);
    let flooder = Ipv4Addr::new(127, 35, 2, 9);
    let n: u32 = std::env::var("SOFTVERBS_CM_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let (d, _dir) = daemon("flood", ip);
    let srv = Context::open_at(&d.socket, 0).unwrap();
    let cs = srv.cm_channel().unwrap();
    cs.listen(SID_FLOOD).unwrap();
    cs.listen_backlog(SID_SIDR, 100).unwrap();
    let mark = cs.listen_backlog(SID_MARK, 1).unwrap();
    // Opt-in figures (scripts/cm-flood.sh, docs/design/fuzzing.md): RSS of this process (the
    // daemon is a thread of it) and another client's daemon-path ping-pong before and
    // during the flood. Reported, not asserted.
    let report = std::env::var_os("SOFTVERBS_CM_FLOOD_REPORT").is_some();
    let (pa, pb) = (
        Context::open_at_direct(&d.socket, 0, false).unwrap(),
        Context::open_at_direct(&d.socket, 0, false).unwrap(),
    );
    let (pda, pdb) = (pa.alloc_pd().unwrap(), pb.alloc_pd().unwrap());
    let (cqa, cqb) = (pa.create_cq(64).unwrap(), pb.create_cq(64).unwrap());
    let qa = pa
        .create_qp(&QpInit::new(QpType::Rc, &pda).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = pb
        .create_qp(&QpInit::new(QpType::Rc, &pdb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let gid = pa.query_gid(1, 0).unwrap();
    connect_with(&qa, gid, qb.qpn(), RcPath::default());
    connect_with(&qb, gid, qa.qpn(), RcPath::default());
    let (mut ma, mut mb) = (
        pda.alloc_mr(1 << 16, ALL).unwrap(),
        pdb.alloc_mr(1 << 16, ALL).unwrap(),
    );
    // Every buffer is 64 bytes: whichever comes back from a completion serves next.
    let mut pool_a: Vec<_> = (0..2).map(|_| ma.take(64).unwrap()).collect();
    let mut pool_b: Vec<_> = (0..2).map(|_| mb.take(64).unwrap()).collect();
    // `rounds` SENDs each way, one at a time: the mean round trip.
    let mut ping_pong = |rounds: u32| -> Duration {
        let start = Instant::now();
        for _ in 0..rounds {
            qb.post_recv_buf(pool_b.pop().unwrap()).unwrap();
            qa.post_recv_buf(pool_a.pop().unwrap()).unwrap();
            qa.post(SendWork::new(Op::Send, pool_a.pop().unwrap()))
                .unwrap();
            pool_b.extend(
                cqb.wait_bufs(1, T)
                    .unwrap()
                    .into_iter()
                    .filter_map(|c| c.buf),
            );
            qb.post(SendWork::new(Op::Send, pool_b.pop().unwrap()))
                .unwrap();
            while pool_a.len() < 2 {
                pool_a.extend(
                    cqa.wait_bufs(1, T)
                        .unwrap()
                        .into_iter()
                        .filter_map(|c| c.buf),
                );
            }
            while pool_b.len() < 2 {
                pool_b.extend(
                    cqb.wait_bufs(1, T)
                        .unwrap()
                        .into_iter()
                        .filter_map(|c| c.buf),
                );
            }
        }
        start.elapsed() / rounds.max(1)
    };
    let rss0 = rss_kib();
    let before = if report { Some(ping_pong(2000)) } else { None };
    // The control (reported only): the same packets at the same pace to a closed UDP port
    // of the daemon's address, which no socket takes. It costs the machine what the flood
    // costs the flooder and the kernel, and the daemon nothing: "within noise" of the REQ
    // flood means within the control's figure (docs/design/fuzzing.md).
    let control = report.then(|| {
        let t0 = Instant::now();
        let control = std::thread::spawn(move || {
            let mut s = Sender::bind(flooder);
            s.port = 4793;
            flood_mads(&mut s, ip, n);
        });
        let mut during = Vec::new();
        while !control.is_finished() {
            during.push(ping_pong(200));
        }
        control.join().unwrap();
        (during, t0.elapsed())
    });
    let t0 = Instant::now();
    let flood = std::thread::spawn(move || {
        let mut s = Sender::bind(flooder);
        flood_mads(&mut s, ip, n);
        s
    });
    let mut during = Vec::new();
    while !flood.is_finished() {
        // Another client keeps working meanwhile (measured only when reporting).
        during.push(ping_pong(if report { 200 } else { 1 }));
    }
    let mut s = flood.join().unwrap();
    let flood_took = t0.elapsed();
    // The marker, thrice (a copy is a duplicate of the same request, so a loss of one does
    // not matter and the others add nothing).
    for _ in 0..3 {
        s.mad(ip, req(u32::MAX, SID_MARK));
        std::thread::sleep(Duration::from_millis(5));
    }
    // Everything before the marker was handled; the server never read its events.
    let deadline = Instant::now() + T * 4;
    let marker = loop {
        let ev = cs
            .wait_event(T)
            .unwrap()
            .expect("the marker's connect request");
        if ev.listener == mark {
            break ev;
        }
        assert!(Instant::now() < deadline, "no marker");
    };
    assert_eq!(marker.kind, CmEventKind::ConnectRequest);
    let cm = resources(&d.socket)["cm"].clone();
    // The default backlog (1024) of the flooded listener, the SIDR listener's 100 and
    // the marker: nothing more, however many arrived.
    let held = cm["connections"].as_u64().unwrap();
    assert!(held <= 1024 + 100 + 1, "{cm}");
    eprintln!("after {n} REQs and {n} SIDR_REQs: {cm}");
    if let (Some(before), Some((control, control_took))) = (before, control) {
        let mean = |v: &[Duration]| v.iter().sum::<Duration>() / v.len().max(1) as u32;
        let worst = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
        let after = ping_pong(2000);
        eprintln!(
            "RSS {rss0} KiB before, {} KiB after; ping-pong round trip: baseline {before:?}; \
             control {:?} mean ({:?} worst batch of 200), {} packets in {control_took:?}; \
             REQ flood {:?} mean ({:?} worst), {} packets in {flood_took:?}; after {after:?}",
            rss_kib(),
            mean(&control),
            worst(&control),
            2 * n,
            mean(&during),
            worst(&during),
            2 * n,
        );
    }

    // Other clients still connect through the CM meanwhile.
    let a = Context::open_at(&d.socket, 0).unwrap();
    let b = Context::open_at(&d.socket, 0).unwrap();
    let (ca, cb) = (a.cm_channel().unwrap(), b.cm_channel().unwrap());
    cb.listen(SID).unwrap();
    let ia = ca
        .connect(IpAddr::V4(ip), SID, CmQp::new(0x10, 1), FAST, b"")
        .unwrap();
    let r = wait(&cb, CmEventKind::ConnectRequest);
    cb.accept(r.id, CmQp::new(0x11, 1), b"").unwrap();
    wait(&ca, CmEventKind::ConnectResponse);
    ca.establish(ia).unwrap();
    wait(&cb, CmEventKind::Established);
}

/// The other uid's role: its listen on port 80 is refused, on 8080 not.
#[test]
fn low_port_client() {
    if std::env::var(ROLE).as_deref() != Ok("low-port") {
        return;
    }
    let socket = std::env::var(ARG).unwrap();
    let ctx = Context::open_at(Path::new(&socket), 0).unwrap();
    let ch = ctx.cm_channel().unwrap();
    let err = ch.listen(0x0106_0050).unwrap_err();
    assert_eq!(err.errno(), libc::EACCES, "{err}");
    ch.listen(0x0106_1F90).unwrap();
}

#[test]
fn an_rdma_cm_port_below_1024_needs_cap_net_bind_service() {
    let ip = Ipv4Addr::new(127, 35, 3, 1);
    let (d, _dir) = daemon("lowport", ip);
    if !as_other_uid("low_port_client", "low-port", d.socket.to_str().unwrap()) {
        return;
    }
    // Root may.
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    ctx.cm_channel().unwrap().listen(0x0106_0050).unwrap();
}

/// The other uid's role for the shares: takes its 5 listeners and 5 ids, is refused the
/// sixth of each with ENOMEM, and gets one back when it destroys one.
#[test]
fn share_client() {
    if std::env::var(ROLE).as_deref() != Ok("share") {
        return;
    }
    let (socket, ip) = {
        let a = std::env::var(ARG).unwrap();
        let (s, ip) = a.split_once(' ').unwrap();
        (s.to_string(), ip.parse::<IpAddr>().unwrap())
    };
    // Two contexts: the share is the uid's, not one context's.
    let c1 = Context::open_at(Path::new(&socket), 0).unwrap();
    let c2 = Context::open_at(Path::new(&socket), 0).unwrap();
    let (h1, h2) = (c1.cm_channel().unwrap(), c2.cm_channel().unwrap());
    let mut ls = Vec::new();
    for port in 0..5u64 {
        let ch = if port % 2 == 0 { &h1 } else { &h2 };
        ls.push(ch.listen(0x0106_2000 + port).unwrap());
    }
    assert_eq!(h2.listen(0x0106_2010).unwrap_err().errno(), libc::ENOMEM);
    let mut ids = Vec::new();
    for i in 0..5u64 {
        let ch = if i % 2 == 0 { &h1 } else { &h2 };
        ids.push(
            ch.connect(ip, 0x0106_3000 + i, CmQp::new(0x10, 1), FAST, b"")
                .unwrap(),
        );
    }
    let err = h1
        .connect(ip, 0x0106_3010, CmQp::new(0x10, 1), FAST, b"")
        .unwrap_err();
    assert_eq!(err.errno(), libc::ENOMEM);
    h1.destroy(ls[0]).unwrap();
    h1.listen(0x0106_2011).unwrap();
    h1.destroy(ids[0]).unwrap();
    h1.connect(ip, 0x0106_3011, CmQp::new(0x10, 1), FAST, b"")
        .unwrap();
}

#[test]
fn cm_listeners_and_ids_past_a_uids_share_are_enomem_for_that_uid_only() {
    let ip = Ipv4Addr::new(127, 35, 4, 1);
    let (d, _dir) = daemon_limits("share", ip, &["uid.cm-listeners=5", "uid.cm-ids=5"]);
    let arg = format!("{} {ip}", d.socket.display());
    if !as_other_uid("share_client", "share", &arg) {
        return;
    }
    // This uid has its own share, whatever the other one holds.
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let ch = ctx.cm_channel().unwrap();
    for port in 0..5u64 {
        ch.listen(0x0106_4000 + port).unwrap();
    }
    assert_eq!(ch.listen(0x0106_4010).unwrap_err().errno(), libc::ENOMEM);
}

/// Connects `n` times from a fresh context of the daemon at `socket` to a service nobody
/// listens on: the CM ids it was given.
fn ids_of(socket: &Path, ip: Ipv4Addr, n: u64) -> Vec<u32> {
    let ctx = Context::open_at(socket, 0).unwrap();
    let ch = ctx.cm_channel().unwrap();
    (0..n)
        .map(|i| {
            ch.connect(
                IpAddr::V4(ip),
                0x0106_5000 + i,
                CmQp::new(0x10, 1),
                FAST,
                b"",
            )
            .unwrap()
            .0
        })
        .collect()
}

#[test]
fn cm_ids_are_not_sequential_and_differ_between_daemons() {
    let (ip1, ip2) = (Ipv4Addr::new(127, 35, 5, 1), Ipv4Addr::new(127, 35, 5, 2));
    let (d1, _x1) = daemon("ids1", ip1);
    let (d2, _x2) = daemon("ids2", ip2);
    let (a, b) = (ids_of(&d1.socket, ip1, 32), ids_of(&d2.socket, ip2, 32));
    // Before: (daemon pid << 12) + n, one after the other.
    let close = a
        .windows(2)
        .filter(|w| w[1].wrapping_sub(w[0]) < 1 << 16)
        .count();
    assert!(close < 3, "{a:x?}");
    assert!(a.iter().all(|id| !b.contains(id)), "{a:x?} {b:x?}");
}

#[test]
fn a_ud_qp_posing_as_its_hosts_cm_is_not_heard() {
    let (ip_a, ip_b) = (Ipv4Addr::new(127, 35, 7, 1), Ipv4Addr::new(127, 35, 7, 2));
    let (da, _xa) = daemon("udcm-a", ip_a);
    let (db, _xb) = daemon("udcm-b", ip_b);
    let srv = Context::open_at(&db.socket, 0).unwrap();
    let cs = srv.cm_channel().unwrap();
    cs.listen(SID).unwrap();

    // A local user of host A gives its UD QP the GSI's Q_Key and sends a REQ to B's QP1:
    // it reaches B from A's address, as A's CM's MADs do, but from its own QP.
    let ctx = Context::open_at(&da.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let ud = ctx
        .create_qp(&QpInit::new(QpType::Ud, &pd).cqs(&cq, &cq).cap(cap()))
        .unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey: softverbs_wire::deth::GSI_QKEY,
        ..QpAttr::default()
    };
    use softverbs::AttrMask as M;
    ud.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..init
    };
    ud.modify(&rtr, M::STATE).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..rtr
    };
    ud.modify(&rts, M::STATE | M::SQ_PSN).unwrap();
    let mut mad = CmMad {
        tid: 1,
        msg: req(0x1234, SID),
    }
    .emit()
    .unwrap()
    .to_vec();
    let mr = pd.reg_slice(&mut mad, ALL).unwrap();
    let ah = pd
        .create_ah(&softverbs::AhAttr {
            dgid: softverbs::Gid::from_ip(IpAddr::V4(ip_b)),
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..softverbs::AhAttr::default()
        })
        .unwrap();
    let sge = [mr.sge(0, 256).unwrap()];
    let mut wr = SendRequest::new(1, SendOp::Send, &sge);
    wr.ud = Some(softverbs::UdAddress {
        ah: &ah,
        remote_qpn: 1,
        // High bit set: the QP's Q_Key (IBA 10.2.5), the GSI's.
        remote_qkey: 0x8000_0000,
    });
    ud.post_send(&wr).unwrap();
    let wc = cq.wait(1, T).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");

    // Then A's CM connects for real, through the same socket: B's first connect request
    // must be that one (the forged REQ named QPN 0x77).
    let cli = Context::open_at(&da.socket, 0).unwrap();
    let cc = cli.cm_channel().unwrap();
    cc.connect(IpAddr::V4(ip_b), SID, CmQp::new(0x10, 1), FAST, b"")
        .unwrap();
    let ev = wait(&cs, CmEventKind::ConnectRequest);
    assert_eq!(ev.remote_qpn, 0x10, "the forged REQ was taken: {ev:?}");
}
