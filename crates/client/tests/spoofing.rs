//! Forged and fuzzed RoCE v2 packets at two daemons' UDP port 4791 while they run an RC
//! transfer (RDMA WRITEs, SENDs and multi-packet RDMA READs, every byte checked). RoCE has no
//! authentication; what must hold is that packets from a host other than the QP's peer are
//! dropped, and that responses from the peer's own address whose PSNs lie outside the window
//! of outstanding PSNs are dropped too (IBA 9.7.5.1). The transfer must finish intact and
//! both daemons keep serving.
//!
//! "From the peer's address" means from the peer's IP: RoCE v2 source ports vary per QP and
//! flow (Annex A17), so the check is on the IP, and the forger simply binds another UDP
//! port of the peer's IP (the peer daemon holds port 4791 there).
//!
//! Each daemon here is a real daemon (its event loop and UDP socket, in a thread of the test
//! process); the addresses are 127.102.x.y, so run inside a network namespace when others
//! use loopback addresses too: `unshare -n bash -c 'ip link set lo up && cargo test ...'`.
//!
//! `udp_fuzz_during_a_transfer` sends `SOFTVERBS_UDP_FUZZ_PACKETS` packets (default 20,000);
//! `scripts/udp-fuzz.sh` runs the long version.
//!
//! The transfer's buffers are lent to their MRs with `reg_slice`, filled and checked
//! through the MRs, and posted through their range-checked SGEs (application `wr_id`s, the
//! same slots posted every round).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::{Access, Context, QpCap, QpInit, QpType};
use softverbs::{SendOp, SendRequest, WcStatus};
use softverbs_daemon::{spawn_daemon_with, Config, DeviceSpec, TestDaemon};
use softverbs_transport::sim::Rng;
use softverbs_wire::icrc;
use softverbs_wire::ip::{emit_ip_udp, IpRepr, Ipv4Repr, UdpRepr, ROCE_V2_UDP_PORT};
use softverbs_wire::psn::psn_add;
use softverbs_wire::{
    emit_packet, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Direction,
    HeaderKind, Headers, IethRepr, ImmDtRepr, NakCode, Opcode, Packet, RethRepr, Syndrome,
    XrcethRepr,
};

mod common;
use common::{connect_with, RcPath};

const ALL: Access = Access(0x0f);
/// Both QPs start their PSNs here; the transfer stays within a few 10,000 PSNs of it.
const START: u32 = 0x10_0000;
/// PSNs at least this far from [`START`] (either way) are outside every window of the run.
const FAR: u32 = 1 << 21;
const SLOTS: usize = 16;
const SLOT: usize = 8192;
const READ_LEN: u32 = 3000;

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn daemon(name: &str, ip: Ipv4Addr) -> (TestDaemon, Dir) {
    let dir = std::env::temp_dir().join(format!("svspoof-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = Config::new(dir.join("sv.sock"));
    c.devices = vec![DeviceSpec {
        name: format!("sv-{name}"),
        ips: vec![IpAddr::V4(ip)],
    }];
    c.net.bind = true;
    (spawn_daemon_with(c).unwrap(), Dir(dir))
}

/// What a forger needs to know of the connection: the addresses, the QP numbers (small and
/// sequential, so easy to guess) and, for requests that would do harm if accepted, B's
/// buffer and R_Key.
#[derive(Clone, Copy)]
struct Target {
    ip_a: Ipv4Addr,
    ip_b: Ipv4Addr,
    qa: u32,
    qb: u32,
    b_addr: u64,
    b_rkey: u32,
}

/// An RC transfer from a context on daemon A to one on daemon B, in rounds of SENDs,
/// WRITEs and a READ, each round's data checked. `forger` runs in its own thread until the
/// transfer has done at least `min_rounds` rounds and `forger` has returned (it gets a flag
/// that says when the transfer is over, to stop early: a failed round ends the test).
fn transfer_under(
    name: &str,
    ip_a: Ipv4Addr,
    ip_b: Ipv4Addr,
    min_rounds: usize,
    forger: impl FnOnce(Target, Arc<AtomicBool>) -> String + Send + 'static,
) -> (usize, String) {
    let (da, _x) = daemon(&format!("{name}-a"), ip_a);
    let (db, _y) = daemon(&format!("{name}-b"), ip_b);
    let a = Context::open_at(&da.socket, 0).unwrap();
    let b = Context::open_at(&db.socket, 0).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap))
        .unwrap();
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    connect(&qa, gb, qb.qpn());
    connect(&qb, ga, qa.qpn());

    // Above malloc's mmap threshold, so each buffer has its own pages.
    let mut abuf = vec![0u8; 2 * SLOTS * SLOT + 8192];
    let mut bbuf = vec![0u8; 2 * SLOTS * SLOT + 8192];
    let blen = bbuf.len();
    let ma = pa.reg_slice(&mut abuf, ALL).unwrap();
    let mb = pb.reg_slice(&mut bbuf, ALL).unwrap();
    let b0 = mb.addr();
    let target = Target {
        ip_a,
        ip_b,
        qa: qa.qpn(),
        qb: qb.qpn(),
        b_addr: b0,
        b_rkey: mb.rkey(),
    };
    let over = Arc::new(AtomicBool::new(false));
    let forger = {
        let over = over.clone();
        std::thread::spawn(move || forger(target, over))
    };
    // Tells the forger the transfer is over however this function ends (a failed round
    // panics).
    struct Over(Arc<AtomicBool>);
    impl Drop for Over {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let over = Over(over);

    let mut rng = Rng::new(0x5B00F);
    let wait = Duration::from_secs(60);
    let mut rounds = 0;
    // The READ lands after the WRITE and SEND slots of A.
    let read_at = 2 * SLOTS * SLOT;
    while rounds < min_rounds || !forger.is_finished() {
        let fresh: Vec<u8> = (0..2 * SLOTS * SLOT)
            .map(|_| rng.next_u64() as u8)
            .collect();
        ma.write(0, &fresh).unwrap();
        let fresh: Vec<u8> = (2 * SLOTS * SLOT..blen)
            .map(|_| rng.next_u64() as u8)
            .collect();
        mb.write(2 * SLOTS * SLOT, &fresh).unwrap();
        let lens: Vec<u32> = (0..2 * SLOTS)
            .map(|_| 1 + rng.below(SLOT as u64) as u32)
            .collect();
        for i in 0..SLOTS {
            let at = (SLOTS + i) * SLOT;
            qb.post_recv(i as u64, &[mb.sge(at, SLOT).unwrap()])
                .unwrap();
        }
        let mut posted = 0;
        for (i, &len) in lens.iter().enumerate() {
            let sge = [ma.sge(i * SLOT, len as usize).unwrap()];
            let op = if i % 2 == 0 {
                SendOp::Write {
                    remote_addr: b0 + (i / 2 * SLOT) as u64,
                    rkey: mb.rkey(),
                }
            } else {
                SendOp::Send
            };
            qa.post_send(&SendRequest::new(i as u64, op, &sge)).unwrap();
            posted += 1;
        }
        let rsge = [ma.sge(read_at, READ_LEN as usize).unwrap()];
        let read = SendOp::Read {
            remote_addr: b0 + (2 * SLOTS * SLOT) as u64,
            rkey: mb.rkey(),
        };
        qa.post_send(&SendRequest::new(99, read, &rsge)).unwrap();
        posted += 1;

        let wa = cqa.wait(posted, wait).unwrap();
        let got: Vec<(u64, WcStatus)> = wa.iter().map(|w| (w.wr_id, w.status)).collect();
        let mut want: Vec<(u64, WcStatus)> = (0..2 * SLOTS as u64)
            .map(|i| (i, WcStatus::Success))
            .collect();
        want.push((99, WcStatus::Success));
        assert_eq!(got, want, "round {rounds}: A's completions");
        let wb = cqb.wait(SLOTS, wait).unwrap();
        assert_eq!(wb.len(), SLOTS, "round {rounds}: B's receives");
        let (abuf, bbuf) = (ma.to_vec(), mb.to_vec());
        for (k, w) in wb.iter().enumerate() {
            let i = 2 * k + 1;
            assert_eq!(
                (w.wr_id, w.status, w.byte_len),
                (k as u64, WcStatus::Success, lens[i]),
                "round {rounds}: receive {k}"
            );
            let (src, dst) = (i * SLOT, (SLOTS + k) * SLOT);
            let n = lens[i] as usize;
            assert!(
                abuf[src..src + n] == bbuf[dst..dst + n],
                "round {rounds}: SEND {i} intact"
            );
        }
        for k in 0..SLOTS {
            let i = 2 * k;
            let (src, dst, n) = (i * SLOT, k * SLOT, lens[i] as usize);
            assert!(
                abuf[src..src + n] == bbuf[dst..dst + n],
                "round {rounds}: WRITE {i} intact"
            );
        }
        let n = READ_LEN as usize;
        let src = 2 * SLOTS * SLOT;
        assert!(
            abuf[read_at..read_at + n] == bbuf[src..src + n],
            "round {rounds}: READ intact"
        );
        rounds += 1;
    }
    drop(over);
    let report = forger.join().expect("the forger");
    // Both daemons still serve: a new context on each gets a PD, and the connection, with
    // every forgery processed by now, still carries a SEND.
    for d in [&da, &db] {
        let c = Context::open_at(&d.socket, 0).unwrap();
        c.alloc_pd().unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    qb.post_recv(7, &[mb.sge(0, 64).unwrap()]).unwrap();
    let mut last = SendRequest::new(8, SendOp::Send, &[]);
    let sge = [ma.sge(0, 64).unwrap()];
    last.sges = &sge;
    qa.post_send(&last).unwrap();
    let w = cqa.wait(1, wait).unwrap();
    assert_eq!(
        w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(8, WcStatus::Success)],
        "the connection works after the forgeries"
    );
    let w = cqb.wait(1, wait).unwrap();
    assert_eq!((w[0].wr_id, w[0].status), (7, WcStatus::Success));
    (rounds, report)
}

/// A UDP socket on `ip` (another port than the daemon's 4791 on the same IP) that sends
/// RoCE v2 packets with a correct ICRC, as the receiving daemon will recompute it over the
/// IP and UDP headers the kernel puts on the wire.
struct Forger {
    sock: UdpSocket,
    src: SocketAddr,
    sent: u64,
}

impl Forger {
    fn bind(ip: Ipv4Addr) -> Forger {
        let sock = UdpSocket::bind(SocketAddr::new(IpAddr::V4(ip), 0)).unwrap();
        // DF on an unconnected socket: Linux sends identification 0, the one a good ICRC is
        // computed with; a daemon reading the real header (its raw receive path) drops
        // anything else before counting it (docs/design/roce-wire.md §6).
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
        Forger { sock, src, sent: 0 }
    }

    /// Sends `ib` (BTH through an ICRC slot) to `to`:4791; with `good_icrc` the ICRC is
    /// right, otherwise it is left as it is.
    fn send(&mut self, to: Ipv4Addr, ib: &mut [u8], good_icrc: bool) {
        if good_icrc {
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
            if icrc::write(&hdr[..hl], ib).is_err() {
                return;
            }
        }
        // A full socket buffer or an ICMP error is loss, like on a wire.
        let _ = self
            .sock
            .send_to(ib, SocketAddr::new(IpAddr::V4(to), ROCE_V2_UDP_PORT));
        self.sent += 1;
        if self.sent % 64 == 0 {
            // Leave the daemons the CPU to move the transfer (this machine is shared).
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

/// Every opcode the wire format knows (RC, UC, UD, XRC; requests and responses).
fn opcodes() -> Vec<Opcode> {
    (0..=255u8)
        .map(Opcode)
        .filter(|o| o.info().is_ok())
        .collect()
}

/// A well-formed packet of opcode `op` to `dest_qp` at `psn`, with random contents in every
/// header it carries; for requests that would do harm if executed, RETHs point into B's
/// buffer with B's R_Key.
fn packet(rng: &mut Rng, op: Opcode, dest_qp: u32, psn: u32, t: &Target) -> Vec<u8> {
    let info = op.info().unwrap();
    let mut h = Headers::new(BthRepr {
        ack_req: rng.chance(0.5),
        solicited: rng.chance(0.1),
        ..BthRepr::new(op, dest_qp, psn)
    });
    let pick = |rng: &mut Rng, good: u64| {
        if rng.chance(0.5) {
            good
        } else {
            rng.next_u64()
        }
    };
    for kind in info.headers.iter() {
        match kind {
            HeaderKind::Xrceth => {
                h.xrceth = Some(XrcethRepr {
                    xrc_srq: rng.below(64) as u32,
                })
            }
            HeaderKind::Deth => {
                h.deth = Some(DethRepr {
                    qkey: rng.next_u64() as u32,
                    src_qp: rng.below(1 << 24) as u32,
                })
            }
            HeaderKind::Reth => {
                let near = t.b_addr + rng.below(1 << 16);
                h.reth = Some(RethRepr {
                    va: pick(rng, near),
                    rkey: pick(rng, u64::from(t.b_rkey)) as u32,
                    dma_len: rng.below(8192) as u32,
                })
            }
            HeaderKind::AtomicEth => {
                let near = t.b_addr + 8 * rng.below(64);
                h.atomic_eth = Some(AtomicEthRepr {
                    va: pick(rng, near),
                    rkey: pick(rng, u64::from(t.b_rkey)) as u32,
                    swap_add: rng.next_u64(),
                    compare: rng.next_u64(),
                })
            }
            HeaderKind::Aeth => {
                let syndrome = match rng.below(4) {
                    0 => Syndrome::Ack {
                        credits: rng.below(32) as u8,
                    },
                    1 => Syndrome::RnrNak {
                        timer: rng.below(32) as u8,
                    },
                    _ => Syndrome::Nak {
                        code: [
                            NakCode::PsnSeqErr,
                            NakCode::InvalidRequest,
                            NakCode::RemoteAccessError,
                            NakCode::RemoteOperationalError,
                            NakCode::InvalidRdRequest,
                        ][rng.below(5) as usize],
                    },
                };
                h.aeth = Some(AethRepr {
                    syndrome,
                    msn: rng.below(1 << 24) as u32,
                })
            }
            HeaderKind::AtomicAckEth => {
                h.atomic_ack_eth = Some(AtomicAckEthRepr {
                    orig: rng.next_u64(),
                })
            }
            HeaderKind::ImmDt => {
                h.imm_dt = Some(ImmDtRepr {
                    imm: rng.next_u64() as u32,
                })
            }
            HeaderKind::Ieth => {
                h.ieth = Some(IethRepr {
                    rkey: rng.next_u64() as u32,
                })
            }
            _ => {}
        }
    }
    let plen = if info.payload {
        rng.below(1100) as usize
    } else {
        0
    };
    let payload: Vec<u8> = (0..plen).map(|_| rng.next_u64() as u8).collect();
    let mut buf = vec![0u8; softverbs_wire::packet_len(&h, plen)];
    match emit_packet(&h, &payload, &mut buf) {
        Ok(n) => buf.truncate(n),
        Err(_) => buf.clear(),
    }
    buf
}

/// A PSN outside every window of the transfer: at least [`FAR`] from [`START`], ahead of it
/// (a ghost) or behind it (a duplicate).
/// A PSN at least [`FAR`] behind [`START`]: in the duplicate region of every window of the run.
/// What is forged from a peer's own IP must be this: a request PSN *ahead* of a responder's
/// window is a sequence error the responder must NAK to the real peer (IBA 9.7.5.1.2), and a
/// flood of those NAKs uses up that peer's retry budget exactly as a lossy link would — what
/// the IBA lets a peer do, which no responder can tell from a forgery. A duplicate is answered
/// (re-ACK, READ re-executed) and the answer falls outside the requester's window.
fn behind_psn(rng: &mut Rng) -> u32 {
    let off = FAR + rng.below(u64::from(FAR)) as u32;
    psn_add(START, (1 << 24) - off)
}

fn far_psn(rng: &mut Rng) -> u32 {
    let off = FAR + rng.below(u64::from(FAR)) as u32;
    if rng.chance(0.5) {
        psn_add(START, off)
    } else {
        psn_add(START, (1 << 24) - off)
    }
}

/// A PSN the transfer may be using now.
fn near_psn(rng: &mut Rng) -> u32 {
    psn_add(START, rng.below(40_000) as u32)
}

/// Every kind of response a completer acts on, and the requests a responder executes.
fn response_ops() -> Vec<Opcode> {
    opcodes()
        .into_iter()
        .filter(|o| {
            let i = o.info().unwrap();
            i.direction == Direction::Response && i.transport == softverbs_wire::Transport::Rc
        })
        .collect()
}

fn request_ops() -> Vec<Opcode> {
    opcodes()
        .into_iter()
        .filter(|o| {
            let i = o.info().unwrap();
            i.direction == Direction::Request && i.transport == softverbs_wire::Transport::Rc
        })
        .collect()
}

/// Forged ACKs, NAKs (every code), RNR NAKs, atomic ACKs and READ responses to A's QP, and
/// forged SENDs, WRITEs (into B's buffer, with B's R_Key), READs and atomics to B's QP:
/// from a stranger at PSNs the transfer is using (some inside the window when they arrive),
/// and from each peer's own IP at PSNs outside every window. Before the fix, a stranger's
/// NAK inside the window failed the connection at once, and so did any NAK from the peer's
/// IP naming no outstanding PSN.
#[test]
fn forged_acks_naks_and_requests_do_not_break_a_transfer_between_two_daemons() {
    let ip_a = Ipv4Addr::new(127, 102, 1, 1);
    let ip_b = Ipv4Addr::new(127, 102, 1, 2);
    let stranger = Ipv4Addr::new(127, 102, 1, 99);
    let (rounds, report) = transfer_under("forged", ip_a, ip_b, 20, move |t, over| {
        let mut rng = Rng::new(7);
        let mut from_stranger = Forger::bind(stranger);
        let mut as_b = Forger::bind(t.ip_b);
        let mut as_a = Forger::bind(t.ip_a);
        let (resp, req) = (response_ops(), request_ops());
        for _ in 0..5000 {
            if over.load(Ordering::Relaxed) {
                break;
            }
            let op = resp[rng.below(resp.len() as u64) as usize];
            let psn = near_psn(&mut rng);
            let mut p = packet(&mut rng, op, t.qa, psn, &t);
            from_stranger.send(t.ip_a, &mut p, true);
            // The NAK that ends a connection, at PSNs the transfer is using.
            let psn = psn_add(START, rng.below(12_000) as u32);
            let nak = Headers {
                aeth: Some(AethRepr {
                    syndrome: Syndrome::Nak {
                        code: NakCode::RemoteAccessError,
                    },
                    msn: 0,
                }),
                ..Headers::new(BthRepr::new(Opcode(0x11), t.qa, psn))
            };
            let mut p = vec![0u8; softverbs_wire::packet_len(&nak, 0)];
            emit_packet(&nak, &[], &mut p).unwrap();
            from_stranger.send(t.ip_a, &mut p, true);
            let op = req[rng.below(req.len() as u64) as usize];
            let psn = near_psn(&mut rng);
            let mut p = packet(&mut rng, op, t.qb, psn, &t);
            from_stranger.send(t.ip_b, &mut p, true);
            let op = resp[rng.below(resp.len() as u64) as usize];
            let psn = far_psn(&mut rng);
            let mut p = packet(&mut rng, op, t.qa, psn, &t);
            as_b.send(t.ip_a, &mut p, true);
            let op = req[rng.below(req.len() as u64) as usize];
            let psn = behind_psn(&mut rng);
            let mut p = packet(&mut rng, op, t.qb, psn, &t);
            as_a.send(t.ip_b, &mut p, true);
        }
        format!(
            "{} from a stranger (a third of them NAKs near the transfer's PSNs), {} as B, {} as A",
            from_stranger.sent, as_b.sent, as_a.sent
        )
    });
    eprintln!("forged during {rounds} rounds: {report}");
}

/// Random and mutated RoCE v2 packets of every opcode, at both daemons, from a stranger
/// (anything) and from each peer's IP (PSNs outside every window, so that what the IBA lets
/// a peer do cannot decide the outcome), with good and bad ICRCs, during a transfer.
#[test]
fn udp_fuzz_during_a_transfer() {
    let count: u64 = std::env::var("SOFTVERBS_UDP_FUZZ_PACKETS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let ip_a = Ipv4Addr::new(127, 102, 2, 1);
    let ip_b = Ipv4Addr::new(127, 102, 2, 2);
    let stranger = Ipv4Addr::new(127, 102, 2, 99);
    let started = Instant::now();
    let (rounds, report) = transfer_under("fuzz", ip_a, ip_b, 5, move |t, over| {
        let mut rng = Rng::new(0xF022);
        let ops = opcodes();
        let mut from_stranger = Forger::bind(stranger);
        let mut as_b = Forger::bind(t.ip_b);
        let mut as_a = Forger::bind(t.ip_a);
        let mut kinds = [0u64; 4];
        let mut n = 0u64;
        while n < count && !over.load(Ordering::Relaxed) {
            let (to, peer) = if rng.chance(0.5) {
                (t.ip_a, t.ip_b)
            } else {
                (t.ip_b, t.ip_a)
            };
            let qpn = match rng.below(4) {
                0 => t.qa,
                1 => t.qb,
                2 => rng.below(64) as u32,
                _ => rng.below(1 << 24) as u32,
            };
            let from_peer = rng.chance(0.5);
            let psn = if from_peer {
                behind_psn(&mut rng)
            } else if rng.chance(0.5) {
                far_psn(&mut rng)
            } else {
                near_psn(&mut rng)
            };
            let op = ops[rng.below(ops.len() as u64) as usize];
            let mut p = packet(&mut rng, op, qpn, psn, &t);
            let kind = rng.below(4) as usize;
            match kind {
                // Well-formed.
                0 => {}
                // Mutated: bytes flipped, cut short or extended.
                1 => match rng.below(3) {
                    0 => {
                        for _ in 0..1 + rng.below(4) {
                            if !p.is_empty() {
                                let at = rng.below(p.len() as u64) as usize;
                                p[at] ^= 1 << rng.below(8);
                            }
                        }
                    }
                    1 => p.truncate(rng.below(p.len() as u64 + 1) as usize),
                    _ => p.extend((0..rng.below(64)).map(|_| rng.next_u64() as u8)),
                },
                // Noise.
                2 => p = (0..rng.below(1500)).map(|_| rng.next_u64() as u8).collect(),
                // A bad ICRC (well-formed otherwise).
                _ => {}
            }
            if from_peer {
                // What reaches the transport from the peer's IP must stay outside every
                // window, whatever the mutation did.
                if let Ok(pk) = Packet::parse(&p) {
                    let d = pk.headers.bth.psn.wrapping_sub(START) & 0xFF_FFFF;
                    if !((1 << 23)..=(1 << 24) - FAR).contains(&d) {
                        continue;
                    }
                }
            }
            let f = if from_peer {
                if peer == t.ip_a {
                    &mut as_a
                } else {
                    &mut as_b
                }
            } else {
                &mut from_stranger
            };
            f.send(to, &mut p, kind != 3);
            kinds[kind] += 1;
            n += 1;
        }
        format!(
            "{n} packets ({} well-formed, {} mutated, {} noise, {} bad ICRC; {} from a \
             stranger, {} as A, {} as B)",
            kinds[0], kinds[1], kinds[2], kinds[3], from_stranger.sent, as_a.sent, as_b.sent
        )
    });
    eprintln!(
        "udp fuzz: {report} during {rounds} transfer rounds ({} messages) in {:.1} s",
        rounds * (2 * SLOTS + 1),
        started.elapsed().as_secs_f64()
    );
}

/// `softverbs status` shows what the transport dropped: an ACK for a connected QP from a
/// stranger counts as a foreign source, one from the peer's address with no request
/// outstanding counts as outside the PSN window — counted by the daemon's engine.
#[test]
fn status_counts_packets_dropped_for_their_source_and_their_psn() {
    status_counts_drops(3, false);
}

/// The same for a QP on the net path (docs/design/net-path.md), whose packets only its library's
/// engine sees: the library reports its counters to the daemon (`NetDrops`).
#[test]
fn status_counts_what_a_net_path_qp_dropped() {
    status_counts_drops(4, true);
}

fn status_counts_drops(net: u8, on_net_path: bool) {
    let ip = Ipv4Addr::new(127, 102, net, 1);
    let peer = Ipv4Addr::new(127, 102, net, 2);
    let stranger = Ipv4Addr::new(127, 102, net, 99);
    let (d, _x) = daemon(&format!("drops{net}"), ip);
    let status = || {
        softverbs::Introspect::connect_at(&d.socket)
            .unwrap()
            .status()
            .unwrap()
    };
    counted_drops(&d, ip, peer, stranger, on_net_path);
    // Still counted once the context is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while status().contexts != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = status();
    assert_eq!(
        (s.contexts, s.net_foreign_source, s.net_outside_window),
        (0, 1, 1)
    );
}

/// Spoofs the two ACKs at a QP of a new context of `d` and waits for the status to count
/// them.
fn counted_drops(
    d: &TestDaemon,
    ip: Ipv4Addr,
    peer: Ipv4Addr,
    stranger: Ipv4Addr,
    on_net_path: bool,
) {
    let c = Context::open_at_direct(&d.socket, 0, on_net_path).unwrap();
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16).unwrap();
    let qp = c
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq))
        .unwrap();
    connect(&qp, softverbs::Gid::from_ip(IpAddr::V4(peer)), 1);
    assert_eq!(qp.is_net(), on_net_path);
    let status = || {
        softverbs::Introspect::connect_at(&d.socket)
            .unwrap()
            .status()
            .unwrap()
    };
    let before = status();
    assert_eq!(
        (before.net_foreign_source, before.net_outside_window),
        (0, 0)
    );
    let ack = |psn| {
        let h = Headers {
            aeth: Some(AethRepr {
                syndrome: Syndrome::Ack {
                    credits: Syndrome::UNLIMITED_CREDITS,
                },
                msn: 0,
            }),
            ..Headers::new(BthRepr::new(Opcode(0x11), qp.qpn(), psn))
        };
        let mut p = vec![0u8; softverbs_wire::packet_len(&h, 0)];
        emit_packet(&h, &[], &mut p).unwrap();
        p
    };
    Forger::bind(stranger).send(ip, &mut ack(START), true);
    Forger::bind(peer).send(ip, &mut ack(START), true);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = status();
    while (s.net_foreign_source, s.net_outside_window) != (1, 1) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        s = status();
    }
    assert_eq!((s.net_foreign_source, s.net_outside_window), (1, 1));
}

/// RESET->INIT->RTR->RTS towards `remote_qpn` on `gid` (this file's path: common::RcPath).
fn connect(qp: &softverbs::Qp<'_>, gid: softverbs::Gid, remote_qpn: u32) {
    connect_with(
        qp,
        gid,
        remote_qpn,
        RcPath {
            // 0.5 s per try: the floods of the fuzz tests cost the legitimate packets socket
            // buffer space and daemon time; the retry budget must outlast a loaded machine.
            timeout: 17,
            psn: START,
            ..RcPath::default()
        },
    );
}
