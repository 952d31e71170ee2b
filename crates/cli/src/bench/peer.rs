//! One side of `softverbs bench lat|bw`: the hidden `bench-peer` subcommand.
//!
//! The parent starts a server and a client peer and relays between them over their
//! stdin/stdout, one line per step:
//!
//! ```text
//! peer   -> parent  INFO {json}            what the other side needs (QPNs, GID, address, rkey…)
//! parent -> peer    PEER {json}            the other side's INFO
//! peer   -> parent  READY                  QPs connected
//! parent -> server  RUN <id> <size> <iters>
//! server -> parent  GO                     receives posted, ready
//! parent -> client  RUN <id> <size> <iters>
//! client -> parent  RESULT {json}
//! parent -> server  STOP
//! server -> parent  DONE {json}            what it received
//! parent -> peer    QUIT
//! ```
//!
//! Every post and every poll is one command to the daemon (the data path is still the command
//! path), so everything here is honest about what an application would have to do: receives
//! are reposted inside the timed loop, completions are polled through the daemon.

use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use softverbs::idle::IdlePoll;
use softverbs::{
    Access, AhAttr, AttrMask as M, Context, Cq, Gid, Mtu, Qp, QpAttr, QpCap, QpInit, QpState,
    QpType, SendOp, SendRequest, Sge, Srq, SrqAttr, UdAddress, WcOpcode, WcStatus, WorkCompletion,
    O_CREAT,
};

use super::{Mode, Op, Transport};

/// Alignment and granule of the buffer: a multiple of every common base page size (4, 16 and
/// 64 KiB), so the buffer owns whole pages whatever the machine.
const PAGE: usize = 64 << 10;

/// Everything the peer is told on its command line.
#[derive(clap::Args, Clone, Debug)]
pub struct PeerArgs {
    #[arg(long, value_enum)]
    pub role: Role,
    #[arg(long, value_enum)]
    pub mode: Mode,
    #[arg(long, value_enum)]
    pub op: Op,
    #[arg(long, value_enum)]
    pub transport: Transport,
    #[arg(long)]
    pub max_size: usize,
    #[arg(long)]
    pub window: usize,
    #[arg(long, default_value_t = 1)]
    pub cq_mod: usize,
    #[arg(long, value_enum)]
    pub memory: super::Memory,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// Local write, remote write and remote read: the bench does no atomics, and a QP that allows
/// none may take the same-host direct path (docs/design/direct-path.md).
const ALL: Access = Access(0x07);
const QKEY: u32 = 0x1111_1111;
const SEND_WR: u32 = 128;
const RECV_WR: u32 = 512;
/// Receives kept posted in latency runs.
const LAT_RECVS: usize = 16;
/// Inline bytes a latency run sends at most from its stack (the drop-in's limit).
const INLINE_BUF: usize = 256;
/// How long one wait may take before the run is declared stuck.
const STUCK: Duration = Duration::from_secs(20);

/// Empty polls between two reads of the clock for [`STUCK`]: read on each, it was a third
/// of a spinning peer's time.
const CLOCK_EVERY: u32 = 64;

/// One wait for a completion or a landed WRITE. Its empty polls are spent as the drop-in's
/// `ibv_poll_cq` spends them (`softverbs::idle`): a latency run whose QP is on the direct
/// path spins for the first 20 µs of a wait — a reply comes within a few microseconds, and
/// a `sched_yield` costs about as much as the whole hand-over (docs/performance.md, "Issue
/// 16: spinning before yielding") — then yields, and stops spinning for a while when its
/// spins keep the other peer off this CPU. A bandwidth run, and any run through a daemon,
/// yields at once: what it waits for is work a daemon must do, on a CPU the spin would take.
struct Backoff {
    start: Instant,
    polls: u32,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            start: Instant::now(),
            polls: 0,
        }
    }

    /// Spends one empty poll of `idle` (`spin`: this run may spin); `true` once the wait has
    /// lasted [`STUCK`].
    fn empty(&mut self, idle: &IdlePoll, spin: bool) -> bool {
        self.polls = self.polls.wrapping_add(1);
        if self.polls % CLOCK_EVERY == 0 && self.start.elapsed() > STUCK {
            return true;
        }
        idle.idle(|| spin);
        false
    }
}
/// Bytes in front of a UD receive (the GRH).
const GRH: usize = 40;

/// Warm-up iterations for `iters` timed ones (both sides compute the same).
pub fn warmup(iters: usize) -> usize {
    (iters / 10).clamp(5, 200)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

type R<T> = Result<T, String>;

fn e<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |err| format!("{what}: {err}")
}

fn gid_hex(g: &Gid) -> String {
    g.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn gid_parse(s: &str) -> R<Gid> {
    if s.len() != 32 {
        return Err(format!("bad GID {s:?}"));
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|x| format!("GID {s}: {x}"))?;
    }
    Ok(Gid(g))
}

/// What the other side told us.
#[derive(Clone, Debug)]
struct Remote {
    gid: Gid,
    /// The QP our requests go to (RC/UD: its QP; XRC: its receive QP).
    qpn: u32,
    /// XRC: its send QP, which our receive QP answers.
    send_qpn: u32,
    srqn: u32,
    /// Where our WRITEs land and our READs read.
    addr: u64,
    rkey: u32,
    mtu: Mtu,
}

impl Remote {
    fn from_json(v: &Value) -> R<Remote> {
        let n = |k: &str| v[k].as_u64().ok_or(format!("PEER: no {k}"));
        Ok(Remote {
            gid: gid_parse(v["gid"].as_str().ok_or("PEER: no gid")?)?,
            qpn: n("qpn")? as u32,
            send_qpn: n("send_qpn")? as u32,
            srqn: n("srqn")? as u32,
            addr: n("addr")?,
            rkey: n("rkey")? as u32,
            mtu: Mtu::from_raw(n("mtu")? as u32).ok_or("PEER: bad mtu")?,
        })
    }
}

/// Lines from the parent, read on their own thread so a run can look for `STOP` without
/// blocking.
struct Inbox(Receiver<String>);

impl Inbox {
    fn start() -> Inbox {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Inbox(rx)
    }

    fn next(&self) -> R<String> {
        self.0.recv().map_err(|_| "parent went away".to_string())
    }

    fn stop_seen(&self) -> R<bool> {
        match self.0.try_recv() {
            Ok(l) if l == "STOP" => Ok(true),
            Ok(l) => Err(format!("expected STOP, got {l:?}")),
            Err(TryRecvError::Empty) => Ok(false),
            Err(TryRecvError::Disconnected) => Err("parent went away".into()),
        }
    }

    fn wait_stop(&self) -> R<()> {
        match self.next()?.as_str() {
            "STOP" => Ok(()),
            l => Err(format!("expected STOP, got {l:?}")),
        }
    }
}

/// The bench's words, named for the raw in-place registration (`--memory in-place`).
#[allow(unsafe_code)]
fn in_place(words: &[AtomicU64]) -> softverbs::RawMemory {
    // SAFETY: the words are whole 64 KiB-aligned pages of their own (no other object shares
    // them), are only ever reached through atomics, outlive the MR (both live in `peer`, the
    // MR declared after them), and no other thread touches them during the registration.
    unsafe { softverbs::RawMemory::new_shareable(words.as_ptr() as usize, words.len() * 8) }
}

/// The peer's entry point: runs until QUIT; any failure is one `ERROR` line and exit 1.
pub fn run(socket: &Path, a: &PeerArgs) -> ! {
    match peer(socket, a) {
        Ok(()) => std::process::exit(0),
        Err(err) => {
            say(&format!("ERROR {err}"));
            std::process::exit(1);
        }
    }
}

fn peer(socket: &Path, a: &PeerArgs) -> R<()> {
    let inbox = Inbox::start();
    let ctx = Context::open_at(socket, 0).map_err(e("open device"))?;
    let port = ctx.query_port(1).map_err(e("query_port"))?;
    let gid = ctx.query_gid(1, 0).map_err(e("query_gid"))?;
    let pd = ctx.alloc_pd().map_err(e("alloc_pd"))?;
    let cq = ctx.create_cq(4096).map_err(e("create_cq"))?;

    // One region: [send area | target area], each max_size + 64 bytes, 64-byte aligned.
    let area = (a.max_size + GRH + 64).next_multiple_of(64);
    // Whole pages of their own, so that turning them into shared memory cannot touch a
    // neighbouring allocation another thread may be writing.
    let len = (2 * area).next_multiple_of(PAGE);
    let storage: Vec<AtomicU64> = (0..(len + PAGE) / 8).map(|_| AtomicU64::new(0)).collect();
    let skip = storage.as_ptr().align_offset(PAGE);
    // Shared: memory the library allocates as a memfd and hands to the daemon (no system
    // call per access); private: our own words, reached with process_vm_*.
    let (owned, borrowed, owned_buf, _raw_mr);
    let (mem, lkey, rkey) = match a.memory {
        super::Memory::Shared => {
            let mut mr = pd.alloc_mr(len, ALL).map_err(e("alloc_mr"))?;
            owned_buf = mr.take_rest();
            owned = mr;
            let words = owned_buf.atomic_words().map_err(e("alloc_mr"))?;
            (words, owned.lkey(), owned.rkey())
        }
        super::Memory::InPlace => {
            let words = &storage[skip..skip + len / 8];
            let mr = pd
                .reg_mr_shared(in_place(words), ALL)
                .map_err(e("reg_mr"))?;
            let (lkey, rkey) = (mr.lkey(), mr.rkey());
            _raw_mr = mr;
            (words, lkey, rkey)
        }
        super::Memory::Private => {
            borrowed = pd
                .reg_words(&storage[skip..skip + len / 8], ALL)
                .map_err(e("reg_mr"))?;
            let words = borrowed.words().expect("registered as words");
            (words, borrowed.lkey(), borrowed.rkey())
        }
    };
    let base = mem.as_ptr() as u64;

    let cap = QpCap {
        max_send_wr: SEND_WR,
        max_recv_wr: if a.transport == Transport::Xrc {
            0
        } else {
            RECV_WR
        },
        max_send_sge: 1,
        max_recv_sge: 1,
        // The most a request entry holds: 16 bytes less for XRC send QPs, as on mlx5
        // (`softverbs_core::qp::max_inline_data`).
        max_inline_data: if a.transport == Transport::Xrc {
            256 - softverbs_core::qp::XRC_SEND_INLINE_OVERHEAD
        } else {
            256
        },
    };
    let xrcd = match a.transport {
        Transport::Xrc => Some(ctx.open_xrcd(None, O_CREAT).map_err(e("open_xrcd"))?),
        _ => None,
    };
    let srq = match &xrcd {
        Some(x) => {
            let attr = SrqAttr {
                max_wr: RECV_WR,
                max_sge: 1,
                srq_limit: 0,
            };
            Some(
                x.create_xrc_srq(&pd, &cq, attr)
                    .map_err(e("create_xrc_srq"))?,
            )
        }
        None => None,
    };
    let recv_qp = match &xrcd {
        Some(x) => Some(x.create_recv_qp().map_err(e("create_qp(XRC_RECV)"))?),
        None => None,
    };
    let qp_type = match a.transport {
        Transport::Rc => QpType::Rc,
        Transport::Ud => QpType::Ud,
        Transport::Xrc => QpType::XrcSend,
    };
    let qp = ctx
        .create_qp(&QpInit::new(qp_type, &pd).cqs(&cq, &cq).cap(cap))
        .map_err(e("create_qp"))?;
    let srqn = match &srq {
        Some(s) => s.srq_num().map_err(e("get_srq_num"))?,
        None => 0,
    };
    let info = json!({
        "gid": gid_hex(&gid),
        "qpn": recv_qp.as_ref().map_or(qp.qpn(), |r| r.qpn()),
        "send_qpn": qp.qpn(),
        "srqn": srqn,
        "addr": base + area as u64,
        "rkey": rkey,
        "mtu": port.active_mtu as u32,
    });
    say(&format!("INFO {info}"));
    let line = inbox.next()?;
    let remote = Remote::from_json(
        &serde_json::from_str(
            line.strip_prefix("PEER ")
                .ok_or(format!("expected PEER, got {line:?}"))?,
        )
        .map_err(e("PEER json"))?,
    )?;
    let mtu = port.active_mtu.min(remote.mtu);

    // Connect.
    let av = AhAttr {
        dgid: remote.gid,
        is_global: true,
        port_num: 1,
        hop_limit: 64,
        ..AhAttr::default()
    };
    match a.transport {
        Transport::Ud => {
            let init = QpAttr {
                qp_state: QpState::Init,
                port_num: 1,
                qkey: QKEY,
                ..QpAttr::default()
            };
            qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
                .map_err(e("UD INIT"))?;
            let rtr = QpAttr {
                qp_state: QpState::Rtr,
                ..init
            };
            qp.modify(&rtr, M::STATE).map_err(e("UD RTR"))?;
            let rts = QpAttr {
                qp_state: QpState::Rts,
                ..rtr
            };
            qp.modify(&rts, M::STATE | M::SQ_PSN).map_err(e("UD RTS"))?;
        }
        Transport::Rc | Transport::Xrc => {
            let init = QpAttr {
                qp_state: QpState::Init,
                port_num: 1,
                qp_access_flags: ALL,
                ..QpAttr::default()
            };
            let init_mask = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
            let rtr = QpAttr {
                qp_state: QpState::Rtr,
                ah_attr: av,
                path_mtu: mtu,
                dest_qp_num: remote.qpn,
                max_dest_rd_atomic: 16,
                min_rnr_timer: 1,
                ..init
            };
            let rc_rtr_mask = M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER;
            let send_rtr_mask = if a.transport == Transport::Xrc {
                M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN
            } else {
                rc_rtr_mask
            };
            let rts = QpAttr {
                qp_state: QpState::Rts,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 16,
                ..rtr
            };
            let rts_mask = M::STATE
                | M::SQ_PSN
                | M::TIMEOUT
                | M::RETRY_CNT
                | M::RNR_RETRY
                | M::MAX_QP_RD_ATOMIC;
            qp.modify(&init, init_mask).map_err(e("INIT"))?;
            qp.modify(&rtr, send_rtr_mask).map_err(e("RTR"))?;
            qp.modify(&rts, rts_mask).map_err(e("RTS"))?;
            if let Some(r) = &recv_qp {
                r.modify(&init, init_mask).map_err(e("XRC_RECV INIT"))?;
                let rtr = QpAttr {
                    dest_qp_num: remote.send_qpn,
                    ..rtr
                };
                r.modify(&rtr, rc_rtr_mask).map_err(e("XRC_RECV RTR"))?;
            }
        }
    }
    let ah = match a.transport {
        Transport::Ud => Some(pd.create_ah(&av).map_err(e("create_ah"))?),
        _ => None,
    };
    say("READY");

    let mut ep = Endpoint {
        a: a.clone(),
        qp: &qp,
        srq: srq.as_ref(),
        cq: &cq,
        mem,
        base,
        area,
        lkey,
        inline_max: qp.cap().max_inline_data as usize,
        ud: ah.as_ref().map(|ah| UdAddress {
            ah,
            remote_qpn: remote.qpn,
            remote_qkey: QKEY,
        }),
        remote,
        posted_recvs: 0,
        pending: Default::default(),
        idle: IdlePoll::default(),
    };
    loop {
        let line = inbox.next()?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["QUIT"] => return Ok(()),
            ["RUN", id, size, iters] => {
                let p = |s: &str| s.parse::<usize>().map_err(|x| format!("{line}: {x}"));
                let (id, size, iters) = (p(id)? as u64, p(size)?, p(iters)?);
                match a.role {
                    Role::Client => {
                        let r = ep.client(id, size, iters)?;
                        say(&format!("RESULT {r}"));
                    }
                    Role::Server => {
                        let r = ep.server(&inbox, id, size, iters)?;
                        say(&format!("DONE {r}"));
                    }
                }
            }
            _ => return Err(format!("unexpected line {line:?}")),
        }
    }
}

struct Endpoint<'a> {
    a: PeerArgs,
    qp: &'a Qp<'a>,
    srq: Option<&'a Srq<'a>>,
    cq: &'a Cq<'a>,
    mem: &'a [AtomicU64],
    base: u64,
    area: usize,
    lkey: u32,
    inline_max: usize,
    ud: Option<UdAddress<'a>>,
    remote: Remote,
    posted_recvs: usize,
    pending: std::collections::VecDeque<WorkCompletion>,
    /// This peer's run of empty polls (see [`Backoff`]).
    idle: IdlePoll,
}

impl Endpoint<'_> {
    fn post_recv(&mut self) -> R<()> {
        let sge = [Sge {
            addr: self.base + self.area as u64,
            length: self.area as u32,
            lkey: self.lkey,
        }];
        match self.srq {
            Some(s) => s.post_recv(1, &sge).map_err(e("post_srq_recv"))?,
            None => self.qp.post_recv(1, &sge).map_err(e("post_recv"))?,
        }
        self.posted_recvs += 1;
        Ok(())
    }

    fn fill_recvs(&mut self, n: usize) -> R<()> {
        while self.posted_recvs < n {
            self.post_recv()?;
        }
        Ok(())
    }

    /// Posts one request of `size` bytes (`op` of the run; the peer's target area).
    fn post(&self, wr_id: u64, size: usize, signaled: bool) -> R<()> {
        let sge = [Sge {
            addr: self.base,
            length: size as u32,
            lkey: self.lkey,
        }];
        let op = match self.a.op {
            Op::Send => SendOp::Send,
            Op::Write => SendOp::Write {
                remote_addr: self.remote.addr,
                rkey: self.remote.rkey,
            },
            Op::Read => SendOp::Read {
                remote_addr: self.remote.addr,
                rkey: self.remote.rkey,
            },
        };
        let mut wr = SendRequest::new(wr_id, op, &sge);
        wr.signaled = signaled;
        wr.ud = self.ud;
        wr.remote_srqn = self.remote.srqn;
        // perftest's latency tests send small SENDs and WRITEs inline; its bandwidth tests do not.
        // On the stack, as perftest's buffer is its own: no allocation per request.
        let mut inline = [0u8; INLINE_BUF];
        if self.a.mode == Mode::Lat
            && self.a.op != Op::Read
            && size <= self.inline_max
            && size <= INLINE_BUF
        {
            for (b, w) in inline[..size].chunks_mut(8).zip(self.mem.iter()) {
                b.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes()[..b.len()]);
            }
            wr.inline = Some(&inline[..size]);
        }
        self.qp.post_send(&wr).map_err(e("post_send"))
    }

    /// Whether this run's waits may spin before they yield: a latency run whose QP is on
    /// the direct path or the net path (its peer is a process polling on its own CPU, and
    /// this process's own polls receive the packets), as the drop-in's `ibv_poll_cq` decides
    /// (`Cq::fed_directly`); not where a daemon carries the work (it needs a CPU to do it).
    fn may_spin(&self) -> bool {
        self.a.mode == Mode::Lat && (self.qp.is_direct() || self.qp.is_net())
    }

    /// The next completion, polling until one comes.
    fn next_wc(&mut self) -> R<WorkCompletion> {
        let mut backoff = Backoff::new();
        let spin = self.may_spin();
        loop {
            if let Some(wc) = self.pending.pop_front() {
                self.idle.got();
                if wc.status != WcStatus::Success {
                    return Err(format!("completion {:?} {:?}", wc.opcode, wc.status));
                }
                return Ok(wc);
            }
            // Straight into the queue, as a C program polls into its array: no `Vec` per poll.
            let pending = &mut self.pending;
            let got = self
                .cq
                .poll_with(32, |wc| pending.push_back(*wc))
                .map_err(e("poll_cq"))?;
            if got == 0 && backoff.empty(&self.idle, spin) {
                return Err(format!("no completion for {STUCK:?}"));
            }
        }
    }

    /// Whatever completions are there now (one poll), without waiting.
    fn poll_now(&mut self) -> R<Vec<WorkCompletion>> {
        let mut v: Vec<_> = self.pending.drain(..).collect();
        v.extend(self.cq.poll(32).map_err(e("poll_cq"))?);
        if let Some(bad) = v.iter().find(|w| w.status != WcStatus::Success) {
            return Err(format!("completion {:?} {:?}", bad.opcode, bad.status));
        }
        Ok(v)
    }

    fn wait_recv(&mut self) -> R<()> {
        loop {
            let wc = self.next_wc()?;
            if wc.opcode == WcOpcode::Recv {
                self.posted_recvs -= 1;
                return Ok(());
            }
        }
    }

    /// The word a WRITE of `size` bytes ends with, in the target area.
    fn flag_word(&self, size: usize) -> &AtomicU64 {
        &self.mem[(self.area + size) / 8 - 1]
    }

    /// Sets the last word of the send area's first `size` bytes.
    fn set_send_flag(&self, size: usize, v: u64) {
        self.mem[size / 8 - 1].store(v, Ordering::Relaxed);
    }

    /// Spins (then yields) until the WRITE of `size` bytes carrying `seq` has landed.
    fn wait_flag(&mut self, size: usize, seq: u64) -> R<()> {
        let mut backoff = Backoff::new();
        let spin = self.may_spin();
        while self.flag_word(size).load(Ordering::Acquire) != seq {
            if backoff.empty(&self.idle, spin) {
                self.poll_now()?;
                return Err(format!("WRITE {seq:#x} did not land within {STUCK:?}"));
            }
        }
        self.idle.got();
        Ok(())
    }

    fn client(&mut self, id: u64, size: usize, iters: usize) -> R<Value> {
        let warm = warmup(iters);
        let total = warm + iters;
        match self.a.mode {
            Mode::Lat => {
                if self.a.op == Op::Send {
                    self.fill_recvs(LAT_RECVS)?;
                }
                // Cycle times: from the start of one iteration to the start of the next, so
                // everything the loop does (reposting receives included) is counted.
                let mut marks = Vec::with_capacity(total + 1);
                for i in 0..total {
                    marks.push(Instant::now());
                    match self.a.op {
                        Op::Send => {
                            self.post(i as u64, size, false)?;
                            self.wait_recv()?;
                            self.post_recv()?;
                        }
                        Op::Write => {
                            let seq = (id << 32) | (i as u64 + 1);
                            self.set_send_flag(size, seq);
                            self.post(i as u64, size, false)?;
                            self.wait_flag(size, seq)?;
                        }
                        Op::Read => {
                            self.post(i as u64, size, true)?;
                            self.next_wc()?;
                        }
                    }
                }
                marks.push(Instant::now());
                let wall = marks[total] - marks[warm];
                let div = if self.a.op == Op::Read { 1.0 } else { 2.0 };
                let mut us: Vec<f64> = marks[warm..]
                    .windows(2)
                    .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6 / div)
                    .collect();
                us.sort_by(f64::total_cmp);
                let at = |q: f64| us[((us.len() as f64 - 1.0) * q).round() as usize];
                let msgs = iters as f64 * if self.a.op == Op::Read { 1.0 } else { 2.0 };
                Ok(json!({
                    "median_us": at(0.5),
                    "p99_us": at(0.99),
                    "mb_s": size as f64 / at(0.5),
                    "msg_s": msgs / wall.as_secs_f64(),
                }))
            }
            Mode::Bw => {
                let window = self.a.window;
                // perftest's --cq-mod: one signaled request per `cq_mod` (and the last one);
                // a completion retires every request up to it (IBA 10.8.3: in order).
                let cq_mod = self.a.cq_mod.clamp(1, window);
                let (mut posted, mut done) = (0usize, 0usize);
                let (mut t0, mut from) = (Instant::now(), 0usize);
                while done < total {
                    while posted - done < window && posted < total {
                        let signaled = (posted + 1) % cq_mod == 0 || posted + 1 == total;
                        self.post(posted as u64, size, signaled)?;
                        posted += 1;
                    }
                    let wc = self.next_wc()?;
                    if wc.opcode == WcOpcode::Recv {
                        return Err("unexpected receive on the client".into());
                    }
                    let before = done;
                    done = wc.wr_id as usize + 1;
                    if before < warm && done >= warm {
                        (t0, from) = (Instant::now(), done);
                    }
                }
                let secs = t0.elapsed().as_secs_f64();
                let msg_s = (total - from) as f64 / secs;
                Ok(json!({
                    "mb_s": msg_s * size as f64 / 1e6,
                    "msg_s": msg_s,
                }))
            }
        }
    }

    fn server(&mut self, inbox: &Inbox, id: u64, size: usize, iters: usize) -> R<Value> {
        let total = warmup(iters) + iters;
        // Leftovers of an earlier run (a UD straggler) must not count here.
        for wc in self.poll_now()? {
            if wc.opcode == WcOpcode::Recv {
                self.posted_recvs -= 1;
            }
        }
        let mut received = 0usize;
        match (self.a.mode, self.a.op) {
            (Mode::Lat, Op::Send) => {
                self.fill_recvs(LAT_RECVS)?;
                say("GO");
                for i in 0..total {
                    self.wait_recv()?;
                    self.post(i as u64, size, false)?;
                    self.post_recv()?;
                    received += 1;
                }
                inbox.wait_stop()?;
            }
            (Mode::Lat, Op::Write) => {
                say("GO");
                for i in 0..total {
                    let seq = (id << 32) | (i as u64 + 1);
                    self.wait_flag(size, seq)?;
                    self.set_send_flag(size, seq);
                    self.post(i as u64, size, false)?;
                    received += 1;
                }
                inbox.wait_stop()?;
            }
            (Mode::Bw, Op::Send) => {
                let depth = RECV_WR as usize;
                self.fill_recvs(depth)?;
                say("GO");
                let ud = self.a.transport == Transport::Ud;
                loop {
                    if !ud && received >= total {
                        inbox.wait_stop()?;
                        break;
                    }
                    let stop = inbox.stop_seen()?;
                    let got = self.poll_now()?;
                    let n = got.iter().filter(|w| w.opcode == WcOpcode::Recv).count();
                    received += n;
                    self.posted_recvs -= n;
                    self.fill_recvs(depth)?;
                    if stop {
                        break;
                    }
                    if n == 0 {
                        std::thread::yield_now();
                    }
                }
            }
            // The target of WRITE and READ has nothing to do.
            _ => {
                say("GO");
                inbox.wait_stop()?;
            }
        }
        Ok(json!({ "received": received, "expected": total }))
    }
}
