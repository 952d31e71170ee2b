//! A kill -9 storm: many client processes open contexts, register memory (plain and shared),
//! create CQs and QPs, open the survivor's XRC domain, create and register XRC receive QPs
//! (the survivor's among them) and post work, and are killed with SIGKILL at random points,
//! while a surviving client keeps an RDMA WRITE/READ transfer going. Afterwards the daemon
//! still serves, every byte of the survivor's transfer is right, and `resources` shows no
//! object of a killed client.
//!
//! `SOFTVERBS_STORM_CLIENTS` (default 200) and `SOFTVERBS_STORM_PARALLEL` (default 8) size
//! the storm; `SOFTVERBS_STORM_SEED` replays one. `scripts/kill-storm.sh` runs the long
//! version (docs/design/fuzzing.md).
//!
//! The storm's clients register through the raw API on purpose (`raw`, `raw_shareable`):
//! what is killed mid-way includes the drop-in's registrations, plain and converted in
//! place, whose cleanup the daemon must get right. The survivor and the newcomer use the
//! owning API (`alloc_mr`, buffers posted with `SendWork` and handed back by `wait_bufs`).

use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::{
    Access, AttrMask as M, Context, Introspect, QpAttr, QpCap, QpInit, QpState, QpType, O_CREAT,
};
use softverbs::{Buf, Op, SendOp, SendRequest, SendWork, Sge, WcStatus};
use softverbs_daemon::{spawn_daemon_with, Config};

mod common;
use common::connect;

/// Names a test buffer (or a deliberately foreign address) for the raw registration these
/// tests exercise: the drop-in's path, whose promise (`RawMemory::new`) the tests keep by
/// reading their buffers only after the completions of the requests that write them, or
/// bend on purpose where they probe what the daemon does with memory that is not theirs.
#[allow(dead_code)]
fn raw(addr: u64, len: u64) -> softverbs::RawMemory {
    // SAFETY: see above; test buffers outlive their MRs.
    unsafe { softverbs::RawMemory::new(addr as usize, len as usize) }
}

/// [`raw`], for the in-place conversion (no other thread touches the test's buffers while
/// they are registered).
#[allow(dead_code)]
fn raw_shareable(addr: u64, len: u64) -> softverbs::RawMemory {
    // SAFETY: as for `raw`; and nothing else writes the pages during the registration.
    unsafe { softverbs::RawMemory::new_shareable(addr as usize, len as usize) }
}

const ROLE: &str = "SOFTVERBS_STORM_ROLE";
const SOCKET: &str = "SOFTVERBS_STORM_SOCKET";
const DOMAIN: &str = "SOFTVERBS_STORM_DOMAIN";
const SHARED_QPN: &str = "SOFTVERBS_STORM_QPN";
const SEED: &str = "SOFTVERBS_STORM_SEED";
const ALL: Access = Access(0x0f);
const WAIT: Duration = Duration::from_secs(20);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// xorshift64*: reproducible from the printed seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn init_attr() -> QpAttr {
    QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ALL,
        ..QpAttr::default()
    }
}

/// Not a test: a storm client's entry point (does nothing in a normal run). It builds
/// objects round after round, keeping some and dropping others, until it is killed. Errors
/// are ignored: only the daemon's behaviour is under test.
#[test]
fn storm_client_role() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let socket = std::env::var(SOCKET).unwrap();
    let domain = std::env::var(DOMAIN).unwrap();
    let shared_qpn: u32 = std::env::var(SHARED_QPN).unwrap().parse().unwrap();
    let mut rng = Rng(env_or(SEED, 1) | 1);
    let Ok(ctx) = Context::open_at(socket.as_ref(), 0) else {
        return;
    };
    let gid = ctx.query_gid(1, 0).unwrap();
    let file = File::options()
        .read(true)
        .write(true)
        .open(&domain)
        .unwrap();
    // Buffers stay mapped for the life of the process: registrations point into them.
    let bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0x33u8; 3 << 20]).collect();
    // "Keeping" an object is forgetting it: it lives in the daemon until the kill.
    let keep = |rng: &mut Rng, x: Box<dyn Object + '_>| {
        if rng.below(2) == 0 {
            std::mem::forget(x);
        }
    };
    for round in 0.. {
        let Ok(pd) = ctx.alloc_pd() else { continue };
        let pd = Box::leak(Box::new(pd));
        let buf = &bufs[round % bufs.len()];
        let mr = if rng.below(2) == 0 {
            pd.reg_mr(raw(buf.as_ptr() as u64, buf.len() as u64), ALL)
        } else {
            pd.reg_mr_shared(raw_shareable(buf.as_ptr() as u64, buf.len() as u64), ALL)
        };
        let Ok(cq) = ctx.create_cq(64) else { continue };
        let cq = Box::leak(Box::new(cq));
        if let Ok(qp) = ctx.create_qp(&QpInit::new(QpType::Rc, pd).cqs(cq, cq).cap(cap())) {
            // A loop-back connection to itself, with work in flight when the kill comes.
            connect(&qp, gid, qp.qpn());
            if let Ok(mr) = &mr {
                let sge = [Sge {
                    addr: buf.as_ptr() as u64,
                    length: 1 << 20,
                    lkey: mr.lkey(),
                }];
                for i in 0..4 {
                    let _ = qp.post_send(&SendRequest::new(
                        i,
                        SendOp::Write {
                            remote_addr: buf.as_ptr() as u64 + (1 << 20),
                            rkey: mr.rkey(),
                        },
                        &sge,
                    ));
                }
            }
            let _ = cq.poll(8);
            keep(&mut rng, Box::new(qp));
        }
        if let Ok(x) = ctx.open_xrcd(Some(&file), O_CREAT) {
            let x = Box::leak(Box::new(x));
            if let Ok(r) = x.create_xrc_rcv_qp() {
                keep(&mut rng, Box::new(r));
            }
            if let Ok(r) = x.reg_xrc_rcv_qp(shared_qpn) {
                keep(&mut rng, Box::new(r));
            }
            if let Ok(r) = x.register_xrc_rcv_qp(Some(shared_qpn)) {
                keep(&mut rng, Box::new(r));
            }
        }
        if let Ok(mr) = mr {
            keep(&mut rng, Box::new(mr));
        }
    }
}

/// Any client object (dropping it releases the object in the daemon).
trait Object {}
impl<T> Object for T {}

/// The survivor's transfer: RDMA WRITE of a fresh pattern from A to B, then READ back into
/// A, each checked byte for byte, until `stop`. Returns how many rounds passed.
fn transfer(socket: std::path::PathBuf, stop: Arc<AtomicBool>, rounds: Arc<AtomicU64>) {
    let a = Context::open_at(&socket, 0).unwrap();
    let b = Context::open_at(&socket, 0).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let gid = a.query_gid(1, 0).unwrap();
    connect(&qa, gid, qb.qpn());
    connect(&qb, gid, qa.qpn());
    const N: usize = 64 << 10;
    // Three MRs, as the resources check counts; each lives as long as its buffer.
    let (mut ms, mut mback) = (pa.alloc_mr(N, ALL).unwrap(), pa.alloc_mr(N, ALL).unwrap());
    let mut md = pb.alloc_mr(N, ALL).unwrap();
    let (mut src, mut back, dst) = (ms.take_rest(), mback.take_rest(), md.take_rest());
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let fill = |i: usize| (i as u64).wrapping_mul(round | 1).wrapping_add(round) as u8;
        src.write(0, &(0..N).map(fill).collect::<Vec<u8>>())
            .unwrap();
        let op = |work: SendWork<'_>| -> Buf {
            qa.post(work).unwrap();
            let mut wc = cqa.wait_bufs(1, WAIT).unwrap();
            assert_eq!(wc.len(), 1, "survivor completion within {WAIT:?}");
            let c = wc.pop().unwrap();
            assert_eq!(c.wc.status, WcStatus::Success, "survivor round {round}");
            c.buf.expect("the buffer came back")
        };
        src = op(SendWork::new(Op::Write(dst.remote()), src));
        back = op(SendWork::new(Op::Read(dst.remote()), back));
        let (d, r) = (dst.to_vec(), back.to_vec());
        for i in 0..N {
            assert_eq!(d[i], fill(i), "WRITE byte {i} of round {round}");
            assert_eq!(r[i], fill(i), "READ byte {i} of round {round}");
        }
        rounds.store(round, Ordering::Relaxed);
    }
}

#[test]
fn kill_storm_leaves_the_daemon_healthy_and_nothing_of_the_killed() {
    let clients = env_or("SOFTVERBS_STORM_CLIENTS", 200);
    let parallel = env_or("SOFTVERBS_STORM_PARALLEL", 8).max(1) as usize;
    let seed = env_or(
        SEED,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    println!("kill storm: {clients} clients, {parallel} at a time, seed {seed}");
    let mut rng = Rng(seed | 1);
    let dir = std::env::temp_dir().join(format!("svstorm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("sv.sock");
    let daemon = spawn_daemon_with(Config::new(socket.clone())).unwrap();

    // The survivor's XRC domain and receive QP, which killed clients register with too.
    let domain = dir.join("domain");
    let file = File::create(&domain).unwrap();
    let keeper = Context::open_at(&socket, 0).unwrap();
    let xrcd = keeper.open_xrcd(Some(&file), O_CREAT).unwrap();
    let recv_qp = xrcd.create_xrc_rcv_qp().unwrap();
    xrcd.modify_xrc_rcv_qp(
        recv_qp.qpn(),
        &init_attr(),
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let survivor = {
        let (socket, stop, rounds) = (socket.clone(), stop.clone(), rounds.clone());
        std::thread::spawn(move || transfer(socket, stop, rounds))
    };

    let started = Instant::now();
    let mut running: Vec<(Child, Instant)> = Vec::new();
    let mut spawned = 0;
    while spawned < clients || !running.is_empty() {
        while spawned < clients && running.len() < parallel {
            let child = Command::new(std::env::current_exe().unwrap())
                .args(["storm_client_role", "--exact", "--test-threads=1"])
                .env(ROLE, "client")
                .env(SOCKET, &socket)
                .env(DOMAIN, &domain)
                .env(SHARED_QPN, recv_qp.qpn().to_string())
                .env(SEED, rng.next().to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            // Somewhere between before its first command and deep into its rounds.
            let at = Instant::now() + Duration::from_millis(rng.below(120));
            running.push((child, at));
            spawned += 1;
        }
        let now = Instant::now();
        running.retain_mut(|(child, at)| {
            if *at > now {
                return true;
            }
            let _ = child.kill(); // SIGKILL
            child.wait().unwrap();
            false
        });
        std::thread::sleep(Duration::from_millis(1));
        assert!(!survivor.is_finished(), "the survivor's transfer stopped");
    }
    let storm = started.elapsed();

    // Every killed client's connection is closed and its objects gone, within a bound.
    let info = Introspect::connect_at(&socket).unwrap();
    let survivors = 3; // keeper, A, B
    let deadline = Instant::now() + Duration::from_secs(10);
    let resources = loop {
        let r = info.resources().unwrap();
        if r["contexts"].as_array().unwrap().len() == survivors || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = info.status().unwrap();
    stop.store(true, Ordering::Relaxed);
    survivor
        .join()
        .expect("the survivor's transfer ran without error");
    let done = rounds.load(Ordering::Relaxed);
    println!("storm of {clients} took {storm:?}; survivor rounds: {done}");
    assert!(done > 0, "the survivor completed transfers");

    let me = std::process::id() as u64;
    let contexts = resources["contexts"].as_array().unwrap();
    assert_eq!(contexts.len(), survivors, "contexts left: {contexts:#?}");
    for kind in ["cqs", "qps", "srqs"] {
        for row in resources[kind].as_array().unwrap() {
            assert_eq!(
                row["pid"].as_u64(),
                Some(me),
                "{kind} of a killed client: {row}"
            );
        }
    }
    // The survivor's receive QP is the only one, held by the survivor alone.
    let xrc = resources["xrc_recv_qps"].as_array().unwrap();
    assert_eq!(xrc.len(), 1, "XRC receive QPs left: {xrc:#?}");
    assert_eq!(xrc[0]["qpn"].as_u64(), Some(recv_qp.qpn() as u64));
    assert_eq!(
        xrc[0]["holders"].as_array().unwrap().len(),
        1,
        "holders: {}",
        xrc[0]["holders"]
    );
    let xrcds = resources["xrcds"].as_array().unwrap();
    assert_eq!(xrcds.len(), 1, "XRC domains left: {xrcds:#?}");
    assert_eq!(xrcds[0]["opens"].as_u64(), Some(1));
    assert_eq!(
        (status.contexts, status.mrs, status.xrc_recv_qps),
        (survivors as u32, 3, 1),
        "{status:?}"
    );

    // The daemon still serves a newcomer.
    {
        let late = Context::open_at(&socket, 0).unwrap();
        let pd = late.alloc_pd().unwrap();
        pd.alloc_mr(4096, ALL).unwrap();
    }
    drop(recv_qp);
    drop(xrcd);
    drop(keeper);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
