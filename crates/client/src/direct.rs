//! The same-host direct path (docs/design/direct-path.md), on unless `SOFTVERBS_DIRECT=0`: an RC
//! or UC QP whose peer is a QP of another direct-capable context of the same daemon and uid
//! exchanges work with it through a channel memfd, the daemon on the control path only.
//!
//! The sender's library executes every request itself, in posting order, on the peer's
//! behalf: it checks the peer's keys, ranges, access and PD against the peer's MR table (as
//! the responder's engine would, `crates/transport/src/responder.rs`), copies once through
//! the peer's `/proc/<pid>/mem`, takes the peer's posted receives from the channel, and
//! writes the peer's receive completions into the channel; its own completions go to a
//! queue of its own CQ that `poll_cq` merges. A SEND that finds no receive posted waits in
//! the sender's queue (RC; a UC one is dropped) and is retried at the sender's next post or
//! poll.

use std::collections::{BTreeMap, VecDeque};

use foldhash::HashMap;
use smallvec::SmallVec;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use softverbs_abi::direct::inline::{
    INLINE_FREES_FIRST, INLINE_MAX, INLINE_NEAR, INLINE_PIECES, SLOT_RECEIVER, SLOT_SENDER,
};
use softverbs_abi::direct::*;
use softverbs_abi::msg::{cmd, DirectAttachReq, DirectAttachResp, PostRecvReq, WcWire};
use softverbs_core::attr::QpAttr;
use softverbs_core::types::{Access, AttrMask, EventType, QpState, QpType};
use softverbs_core::wr::{SendOp, Sge, WcOpcode, WcStatus, WorkCompletion, WC_WITH_IMM};
use softverbs_memaccess::{PeerFault, PeerMemory};
use softverbs_shm::{Consumer, Producer, Region, RingLayout, SharedConsumer};
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::error::{errno, Error, Result};
use crate::Context;

pub(crate) mod at_exit;
mod inline;
mod mapped;
mod net;
mod ops;
mod progress;
mod udp;

/// Whether this process asks for the direct path: unless `SOFTVERBS_DIRECT=0`.
pub(crate) fn wanted() -> bool {
    std::env::var_os("SOFTVERBS_DIRECT").is_none_or(|v| v != "0")
}

/// A context's direct-path state.
#[derive(Debug)]
pub(crate) struct DirectCtx {
    own_table: Arc<Region>,
    inner: Arc<Mutex<Inner>>,
    /// The net path's progress thread, once a QP took the path (`progress`).
    progress: Mutex<Option<progress::Progress>>,
    /// Polls and posts of the program's threads on the net path: the progress thread keeps
    /// off while they go on.
    activity: Arc<progress::Activity>,
    /// Some QP of the context receives through an SRQ (so an SRQ post looks for peers
    /// waiting on it, [`DirectCtx::posted_srq_recv`]).
    srq_qps: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default)]
struct Inner {
    qps: BTreeMap<u32, DQp>,
    /// Completions of direct QPs per CQ handle, in the order produced.
    cqs: CqQueues,
    /// CQs with a completion channel this library armed (`DirectCtx::armed`), each with the
    /// arms the daemon may still hold (`ops::Arms`): only an armed CQ's own completions are
    /// worth a notification (`ops::notify_own`).
    armed_cqs: HashMap<u32, ops::Arms>,
    /// How many of `armed_cqs` may be armed: none, and no own completion is looked at.
    arms: usize,
    /// Entries of the CQs of direct QPs (`ibv_create_cq`/`ibv_resize_cq`), which the
    /// queues above may not exceed (`ops::notify_own`).
    cq_cap: HashMap<u32, u32>,
    /// Receives outstanding per QP number, lowered as [`DirectCtx::poll`] hands out their
    /// completions (each receive completes exactly once: success, error or flush). Kept
    /// after a QP leaves the path, for its completions still queued here.
    rq_counts: HashMap<u32, crate::context::RqCount>,
    /// The engine of this context's QPs connected to another host (docs/design/net-path.md).
    net: Option<Box<net::Net>>,
}

/// The direct path's completions per CQ handle, in the order produced, remembering whether
/// a queue may have grown past one entry since the last overrun check (`ops::overrun`):
/// that check runs at every post and poll, and a busy poller's queues hold one completion at
/// most, so it looks at the queues only after one grew.
///
/// It also keeps, per CQ, whether this library queued completions of its own since the
/// last look (`own`, with whether one failed): its send completions and flushes, not the
/// receive completions its peer produced (the peer told the daemon of those). Those are
/// what may fire an arm the daemon holds (`ops::notify_own`).
#[derive(Debug, Default)]
pub(crate) struct CqQueues {
    map: HashMap<u32, VecDeque<WorkCompletion>>,
    grown: bool,
    own: SmallVec<[(u32, bool); 2]>,
}

impl CqQueues {
    /// Queues `wc` for CQ `cq`.
    #[inline]
    pub(crate) fn push(&mut self, cq: u32, wc: WorkCompletion) {
        let q = self.map.entry(cq).or_default();
        q.push_back(wc);
        if q.len() > 1 {
            self.grown = true;
        }
        let peers = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
            && wc.status != WcStatus::WrFlushErr;
        if !peers {
            self.note_own(cq, wc.status != WcStatus::Success);
        }
    }

    fn note_own(&mut self, cq: u32, failed: bool) {
        match self.own.iter_mut().find(|(c, _)| *c == cq) {
            Some(e) => e.1 |= failed,
            None => self.own.push((cq, failed)),
        }
    }

    /// [`push`](Self::push) for a completion this library produced whatever its kind: the
    /// net path's receive completions are its own too (no peer library told the daemon).
    pub(crate) fn push_own(&mut self, cq: u32, wc: WorkCompletion) {
        self.push(cq, wc);
        self.note_own(cq, wc.status != WcStatus::Success);
    }

    /// CQ `cq`'s queue.
    #[inline]
    pub(crate) fn get(&self, cq: &u32) -> Option<&VecDeque<WorkCompletion>> {
        self.map.get(cq)
    }

    /// CQ `cq`'s queue, to take completions from (taking never grows it).
    #[inline]
    pub(crate) fn get_mut(&mut self, cq: &u32) -> Option<&mut VecDeque<WorkCompletion>> {
        self.map.get_mut(cq)
    }
}

/// A QP the direct path may take, as created.
#[derive(Debug, Clone)]
pub(crate) struct NewQp {
    pub(crate) handle: u32,
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) send_cq: Option<u32>,
    pub(crate) recv_cq: Option<u32>,
    pub(crate) sq_sig_all: bool,
    /// The SRQ it receives through (ABI 16), by handle.
    pub(crate) srq: Option<u32>,
    /// Its CQs have no completion channel.
    pub(crate) able: bool,
    /// Its send and receive CQs' entries.
    pub(crate) cqes: [u32; 2],
    /// Its receives outstanding (`ibv_post_recv(3)`'s `ENOMEM` past `max_recv_wr`), which
    /// this library lowers as it hands out their completions.
    pub(crate) rq_count: Option<crate::context::RqCount>,
}

/// A send request waiting (posted while undecided, or a SEND with no receive at the peer).
/// Kept small and without allocation for the common shapes (one 8-byte SEND is posted,
/// queued and executed in well under a microsecond): the daemon's wire form is built only
/// if the QP leaves the direct path ([`Pending::wire`]).
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    wr_id: u64,
    op: SendOp,
    sges: SmallVec<[Sge; 2]>,
    inline: Option<SmallVec<[u8; 64]>>,
    signaled: bool,
    solicited: bool,
}

/// What [`DirectCtx::post_send`] did with a request.
pub(crate) enum Posted {
    /// The QP is not on the direct path: post it through the daemon.
    NotDirect,
    /// Executed or queued.
    Done,
    /// The QP left the direct path: post this (which includes the request) through the
    /// daemon.
    Left(Fallback),
}

impl Pending {
    /// The request as posted.
    pub(crate) fn new(wr: &crate::datapath::SendRequest<'_>) -> Pending {
        Pending {
            wr_id: wr.wr_id,
            op: wr.op,
            sges: SmallVec::from_slice(wr.sges),
            inline: wr.inline.map(SmallVec::from_slice),
            signaled: wr.signaled,
            solicited: wr.solicited,
        }
    }

    /// Its wire form for the daemon's ring (the QP left the direct path). Built from what
    /// was accepted at post time, so the ABI's limits hold.
    pub(crate) fn wire(&self) -> softverbs_abi::msg::SendWrWire {
        let wr = crate::datapath::SendRequest {
            wr_id: self.wr_id,
            op: self.op,
            sges: &self.sges,
            inline: self.inline.as_deref(),
            signaled: self.signaled,
            solicited: self.solicited,
            ud: None,
            remote_srqn: 0,
        };
        crate::datapath::send_wire(&wr).unwrap_or_default()
    }
}

#[derive(Debug)]
struct Chan {
    region: Arc<Region>,
    side: usize,
    peer_qpn: u32,
    peer_pd: u32,
    own_pd: u32,
    peer: PeerMemory,
    peer_table: Region,
    rq_out: Producer,
    rq_in: Consumer,
    cqe_out: Producer,
    cqe_in: Consumer,
    /// Receive completions taken from `cqe_in`: the receives `[rq_completed, produced)` of
    /// `rq_out` are still outstanding.
    rq_completed: u32,
    /// This QP's handle (for `DirectMrFd`).
    handle: u32,
    /// Inline slots of the peer's receive completions (filled here) and of this side's
    /// (placed here), when the daemon made them (ABI 14).
    slots_out: Option<inline::Slots>,
    slots_in: Option<inline::Slots>,
    /// Entries of `cqe_out` below this index have free slots (settled).
    settled_to: u32,
    /// The entry of `cqe_out` whose slot [`warm`] last took for writing.
    warmed_slot: Option<u32>,
    /// Where the receiver takes inline slots into: kept, so a received small SEND neither
    /// zeroes nor moves 340 bytes on the stack (`drain_cqes`).
    taken: Box<inline::Taken>,
    /// The peer's shared-memory MRs mapped here.
    maps: mapped::Maps,
    /// The PDs receive buffers are checked in, the peer's and this side's: their SRQs' PDs
    /// for QPs with an SRQ (IBA 10.2.9), else the QPs' own.
    peer_recv_pd: u32,
    own_recv_pd: u32,
    /// The peer receives through this SRQ (ABI 16): its receives are taken from there.
    peer_srq: Option<PeerSrq>,
    /// A receive taken from `peer_srq` left it below its armed limit: the daemon raises the
    /// event once the request is done (`DirectSrqLimit`).
    srq_limit_due: bool,
    /// Whether the request being executed may reach its own local pieces through plain
    /// pointers (inline payloads, mapped peer MRs): not when one lies in an ODP MR, whose
    /// pages the program may have unmapped (ibv_reg_mr(3), `IBV_ACCESS_ON_DEMAND`) — the
    /// kernel's copy reports that as a fault (`LOC_PROT_ERR`), a pointer would raise SIGSEGV.
    raw_local: std::cell::Cell<bool>,
    /// When a request's retries to a peer that stopped answering run out (`ops`): unset
    /// until a request first finds it so, `Some(None)` never (timeout 0).
    retry_deadline: Option<Option<Instant>>,
    /// When the RNR retries of the oldest request run out (`ops`): unset while it is not
    /// waiting for a receive, `Some(None)` never (`rnr_retry` 7).
    rnr_deadline: Option<Option<Instant>>,
    /// The QP's `rnr_retry`, once asked (`ops`).
    rnr_retry: Option<u8>,
}

/// The peer's SRQ, as this library takes from it (docs/design/direct-path.md, "SRQs").
#[derive(Debug)]
struct PeerSrq {
    taker: SharedConsumer,
    region: Arc<Region>,
    limit_at: usize,
}

impl PeerSrq {
    /// The SRQ share `DirectAttach` described in `r` (its ring's memfd `fd`).
    fn from_resp(r: &DirectAttachResp, fd: std::os::fd::OwnedFd) -> Option<PeerSrq> {
        let region = Arc::new(Region::map_populated(fd, r.srq_len.get() as usize).ok()?);
        let layout = RingLayout::new(r.srq_capacity.get(), r.srq_entry.get()).ok()?;
        let limit_at = r.srq_limit.get() as usize;
        if limit_at % 4 != 0 || limit_at.checked_add(4)? > region.len() {
            return None;
        }
        Some(PeerSrq {
            taker: SharedConsumer::attach(region.clone(), 0, layout).ok()?,
            region,
            limit_at,
        })
    }

    /// After a take: fewer posted than the armed limit disarms it, once; `true` for the
    /// taker that disarmed it (crates/abi/src/direct.rs, `srq_limit_offset`).
    fn crossed_limit(&self) -> bool {
        let word = self.region.atomic_u32(self.limit_at);
        let limit = word.load(Ordering::Acquire);
        limit > 0
            && self.taker.available().is_ok_and(|n| n < limit)
            && word
                .compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }
}

#[derive(Debug)]
enum Path {
    /// Before RTR: receives are held here.
    Held,
    /// RTR, the peer has not asked yet.
    Undecided(Box<Chan>),
    Direct(Box<Chan>),
    /// Connected to another host: this library's engine runs it (`net`).
    Net,
}

#[derive(Debug)]
struct DQp {
    qpn: u32,
    qp_type: QpType,
    send_cq: Option<u32>,
    recv_cq: Option<u32>,
    sq_sig_all: bool,
    srq: Option<u32>,
    /// Its CQs have no completion channel (the direct path does not signal them).
    able: bool,
    path: Path,
    held: Vec<PostRecvReq>,
    pending: VecDeque<Pending>,
    error: bool,
}

/// What a QP that left the direct path must post through the daemon's rings.
#[derive(Debug, Default)]
pub(crate) struct Fallback {
    pub(crate) recvs: Vec<PostRecvReq>,
    pub(crate) sends: Vec<Pending>,
}

/// How one request ended.
enum Exec {
    Done(WcStatus, u32),
    /// RC SEND (or WRITE with immediate) with no receive posted: try again later.
    Rnr,
    /// The request broke a rule at the peer: `status` here, `event` raised on the peer.
    PeerFault(WcStatus, Option<EventType>),
}

pub(crate) fn lookup(table: &Region, key: u32) -> Option<MrEntry> {
    /// Words of one entry (`MRT_ENTRY` bytes): read as atomics in place, not copied out
    /// and decoded (four lookups per small SEND; the copy was a twentieth of its time).
    const WORDS: usize = MRT_ENTRY / 8;
    const _: () = assert!(MRT_ENTRY % 8 == 0 && MRT_ENTRIES % 8 == 0 && WORDS >= 5);
    let seq = &table.atomic_u64s(MRT_SEQ, 1)[0];
    let all = table.atomic_u64s(MRT_ENTRIES, MRT_CAPACITY * WORDS);
    // The daemon rewrites the table in one thread, which the scheduler may stop halfway
    // (odd sequence): spin briefly, then yield to it, for up to a second — giving up early
    // would fail a valid key with an access error.
    let mut deadline = None;
    let mut tries = 0u32;
    loop {
        tries += 1;
        if tries > 1000 {
            let end = *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(1));
            if Instant::now() > end {
                return None;
            }
            std::thread::yield_now();
        }
        let s = seq.load(Ordering::Acquire);
        if s % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let n = (table.atomic_u32(MRT_COUNT).load(Ordering::Relaxed) as usize).min(MRT_CAPACITY);
        let mut found = None;
        for w in all[..n * WORDS].chunks_exact(WORDS) {
            // The key is the entry's first word (little-endian): only a match is read whole.
            let w0 = u64::from_le(w[0].load(Ordering::Relaxed));
            if w0 as u32 != key {
                continue;
            }
            let w1 = u64::from_le(w[1].load(Ordering::Relaxed));
            found = Some(MrEntry {
                key,
                pd: (w0 >> 32) as u32,
                access: w1 as u32,
                flags: (w1 >> 32) as u32,
                iova: u64::from_le(w[2].load(Ordering::Relaxed)),
                len: u64::from_le(w[3].load(Ordering::Relaxed)),
                addr: u64::from_le(w[4].load(Ordering::Relaxed)),
            });
            break;
        }
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) == s {
            return found;
        }
    }
}

/// Checks `(key, iova, len)` for a QP in `pd` needing `need` (crates/core/src/datapath.rs
/// `check_mem`'s rules); the address in the owner's space.
fn check(table: &Region, pd: u32, key: u32, iova: u64, len: u64, need: Access) -> Option<u64> {
    check_entry(table, pd, key, iova, len, need).map(|(_, a)| a)
}

/// [`check`], with the entry that allowed it.
pub(super) fn check_entry(
    table: &Region,
    pd: u32,
    key: u32,
    iova: u64,
    len: u64,
    need: Access,
) -> Option<(MrEntry, u64)> {
    let e = lookup(table, key)?;
    if e.pd != pd || !Access(e.access).contains(need) {
        return None;
    }
    e.translate(iova, len).map(|a| (e, a))
}

/// `SOFTVERBS_PLAIN_RINGS=1`: this process asks for the channel rings of ABI 18 (no stamps),
/// so that one build measures both layouts (docs/performance.md) and talks to itself as to
/// a library that predates stamps. Read at each context's open.
fn plain_rings() -> bool {
    std::env::var_os("SOFTVERBS_PLAIN_RINGS").is_some_and(|v| v == "1")
}

impl DirectCtx {
    /// Opens the direct path for `ctx` (`DirectOpen`); `None` if the daemon does not offer it.
    pub(crate) fn open(ctx: &Context) -> Option<DirectCtx> {
        if ctx.conn.abi < 13 || ctx.doorbell.is_none() {
            return None;
        }
        let mem = softverbs_memaccess::open_own_memory().ok()?;
        let fds = [std::os::fd::AsFd::as_fd(&mem)];
        // An older daemon reads the request as empty only if it is all zeros.
        let req = softverbs_abi::msg::DirectOpenReq {
            caps: U32::new(match ctx.conn.abi {
                19.. if !plain_rings() => CAP_SRQ | CAP_STAMPED,
                19.. => CAP_SRQ,
                16.. => CAP_SRQ,
                _ => 0,
            }),
            ..Default::default()
        };
        let (_, mut got): ((), _) = ctx
            .conn
            .call_fds::<cmd::DirectOpen>("direct_open", 0, &req, &fds)
            .ok()?;
        let table = Region::map(got.pop()?, MRT_LEN).ok()?;
        Some(DirectCtx {
            own_table: Arc::new(table),
            inner: Arc::new(Mutex::new(Inner::default())),
            progress: Mutex::new(None),
            activity: Arc::new(progress::Activity::default()),
            srq_qps: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the net path's progress thread, once.
    fn start_progress(&self, ctx: &Context, inner: &Inner) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if p.is_some() {
            return;
        }
        let Some(sock) = inner.net.as_ref().and_then(|n| n.socket().ok()) else {
            return;
        };
        *p = progress::start(
            &self.inner,
            &self.own_table,
            &ctx.conn,
            &self.activity,
            sock,
        )
        .ok();
    }

    /// A new RC/UC QP with its own receive queue or an SRQ may go direct once connected.
    pub(crate) fn add_qp(&self, n: NewQp) {
        if !matches!(n.qp_type, QpType::Rc | QpType::Uc) {
            return;
        }
        if n.srq.is_some() {
            self.srq_qps.store(true, Ordering::Relaxed);
        }
        let mut g = self.lock();
        for (cq, cqe) in [n.send_cq, n.recv_cq].into_iter().zip(n.cqes) {
            if let Some(cq) = cq {
                g.cq_cap.insert(cq, cqe);
            }
        }
        if let Some(c) = &n.rq_count {
            g.rq_counts.insert(n.qpn, c.clone());
        }
        g.qps.insert(
            n.handle,
            DQp {
                qpn: n.qpn,
                qp_type: n.qp_type,
                send_cq: n.send_cq,
                recv_cq: n.recv_cq,
                sq_sig_all: n.sq_sig_all,
                srq: n.srq,
                able: n.able,
                path: Path::Held,
                held: Vec::new(),
                pending: VecDeque::new(),
                error: false,
            },
        );
    }

    /// Whether the QP exchanges work with its peer directly now.
    pub(crate) fn is_direct(&self, handle: u32) -> bool {
        self.lock().qps.get(&handle).is_some_and(|q| match &q.path {
            Path::Direct(_) => true,
            // Decided, to be taken up at the next post or poll.
            Path::Undecided(c) => {
                c.region.atomic_u32(CH_PATH).load(Ordering::Acquire) == PATH_DIRECT
            }
            Path::Held | Path::Net => false,
        })
    }

    /// Whether the QP's completions are produced in this process: it is direct, or on the
    /// net path (whose packets this process's own polls receive).
    pub(crate) fn is_fed_here(&self, handle: u32) -> bool {
        self.is_direct(handle) || self.is_net(handle)
    }

    /// Whether this library's engine runs the QP (docs/design/net-path.md).
    pub(crate) fn is_net(&self, handle: u32) -> bool {
        self.lock()
            .qps
            .get(&handle)
            .is_some_and(|q| matches!(q.path, Path::Net))
    }

    /// An MR of this context is about to be deregistered or changed: the SENDs peers already
    /// delivered to it inline are placed now, while it is still registered (their completions
    /// wait in the library's CQ queues for the next poll), as a NIC would have placed them on
    /// arrival.
    pub(crate) fn revoking(&self) {
        let mut g = self.lock();
        let inner = &mut *g;
        for q in inner.qps.values_mut() {
            if let Path::Direct(c) = &mut q.path {
                drain_cqes(Some(&self.own_table), c, q.recv_cq, &mut inner.cqs);
            }
        }
    }

    /// An MR of this context was deregistered or changed (the daemon has rewritten the MR
    /// table): waits until no peer library is between checking a key in that table and its
    /// copy (its busy word, raised before it reads the table), so nothing reaches memory the
    /// program no longer registers once `dereg_mr` returns. Store-buffering pattern, as for
    /// flushing receives: the daemon's table write comes before its answer, our read of the
    /// busy word after it; the peer raises busy, fences, then reads the table. Bounded; a
    /// gone peer is not waited for.
    pub(crate) fn revoked(&self) {
        fence(Ordering::SeqCst);
        let g = self.lock();
        for q in g.qps.values() {
            let Path::Direct(c) = &q.path else {
                continue;
            };
            let peer = 1 - c.side;
            let end = Instant::now() + Duration::from_secs(1);
            while c.region.atomic_u32(CH_BUSY[peer]).load(Ordering::SeqCst) != 0
                && c.region.atomic_u32(CH_STATE[peer]).load(Ordering::Acquire) != SIDE_GONE
                && Instant::now() < end
            {
                std::thread::yield_now();
            }
        }
    }

    /// Whether the QP's work is the direct path's (held, undecided or direct).
    pub(crate) fn owns(&self, handle: u32) -> bool {
        self.lock().qps.contains_key(&handle)
    }

    /// The QP went away (destroyed): its side of the channel says so.
    pub(crate) fn remove(&self, handle: u32, qpn: u32) {
        let mut g = self.lock();
        g.rq_counts.remove(&qpn);
        if let Some(n) = g.net.as_mut() {
            n.remove(qpn);
        }
        if let Some(q) = g.qps.remove(&handle) {
            if let Path::Direct(c) | Path::Undecided(c) = &q.path {
                c.region
                    .atomic_u32(CH_STATE[c.side])
                    .store(SIDE_GONE, Ordering::Release);
            }
        }
    }

    /// After a successful modify of the QP to `state`. At RTR: asks the daemon for the path;
    /// what must go through the daemon instead comes back.
    pub(crate) fn modified(&self, ctx: &Context, handle: u32, state: QpState) -> Option<Fallback> {
        let mut g = self.lock();
        let inner = &mut *g;
        let q = inner.qps.get_mut(&handle)?;
        if matches!(q.path, Path::Net) {
            self.net_modified(ctx, inner, handle, state);
            return None;
        }
        match state {
            QpState::Rtr if matches!(q.path, Path::Held) => {
                // With ABI 15 the library serves completion channels (`ops`).
                let mut able = u32::from(q.able || ops::offered(ctx)) * ABLE_DIRECT;
                // ABI 20: the net path over a private socket the daemon forwards to; an older
                // daemon would hand a member of the device's reuseport group (issue 35, item
                // 1), so against one the QP stays on the daemon's engine.
                if ctx.conn.abi >= 20 && net::wanted() && q.qp_type == QpType::Rc {
                    able |= ABLE_NET | ABLE_NET_FORWARDED | ABLE_NET_STATUS | ABLE_NET_COUNTERS;
                }
                let req = DirectAttachReq {
                    qp: U32::new(handle),
                    able: U32::new(able),
                };
                let got = ctx
                    .conn
                    .call_fds::<cmd::DirectAttach>("direct_attach", 0, &req, &[]);
                let got = match got {
                    Ok((r, fds)) if r.path.get() == PATH_NET => {
                        return self.take_net(ctx, inner, handle, &r, fds);
                    }
                    got => got,
                };
                let chan = match got {
                    Ok((r, fds)) if r.path.get() != PATH_DAEMON => {
                        chan_from(&r, fds, ctx.conn.abi).map(|c| Chan { handle, ..c })
                    }
                    _ => None,
                };
                match chan {
                    None => {
                        let q = inner.qps.remove(&handle)?;
                        Some(Fallback {
                            recvs: q.held,
                            sends: q.pending.into(),
                        })
                    }
                    Some(mut c) => {
                        // Receives go to the channel from now on, whatever is decided: the
                        // peer takes them if the pair goes direct, the daemon's ring gets
                        // them back if not.
                        // The ring holds max_recv_wr entries (rounded up) and no more than
                        // that many receives are outstanding (`ENOMEM` at post), so these fit.
                        for r in q.held.drain(..) {
                            let _ = push_entry(&mut c.rq_out, r.as_bytes());
                        }
                        q.path = Path::Undecided(Box::new(c));
                        decide(q).then(|| take_fallback(inner, handle))
                    }
                }
            }
            QpState::Err => {
                let q = inner.qps.get_mut(&handle)?;
                let cqs = &mut inner.cqs;
                fail(ctx, handle, q, cqs, None, false);
                ops::notify_own(ctx, inner);
                None
            }
            QpState::Reset => {
                if let Path::Direct(c) | Path::Undecided(c) = &q.path {
                    c.region
                        .atomic_u32(CH_STATE[c.side])
                        .store(SIDE_GONE, Ordering::Release);
                }
                q.path = Path::Held;
                q.held.clear();
                q.pending.clear();
                q.error = false;
                None
            }
            _ => None,
        }
    }

    /// `ibv_post_recv` on a QP of the direct path; `Ok(false)`: the QP is not on it.
    pub(crate) fn post_recv(&self, ctx: &Context, handle: u32, req: &PostRecvReq) -> Result<bool> {
        let mut g = self.lock();
        let inner = &mut *g;
        if !inner.qps.contains_key(&handle) {
            return Ok(false);
        }
        let Some(q) = inner.qps.get_mut(&handle) else {
            return Ok(false);
        };
        if q.error {
            let wc =
                WorkCompletion::new(req.wr_id.get(), WcStatus::WrFlushErr, WcOpcode::Recv, q.qpn);
            if let Some(cq) = q.recv_cq {
                inner.cqs.push(cq, wc);
            }
            ops::notify_own(ctx, inner);
            return Ok(true);
        }
        match &mut q.path {
            Path::Held => q.held.push(*req),
            Path::Net => {
                let qpn = q.qpn;
                let Some(n) = inner.net.as_mut() else {
                    return Err(Error::new("post_recv", errno::EINVAL));
                };
                n.post_recv(qpn, req)
                    .map_err(|e| Error::new("post_recv", e))?;
            }
            Path::Undecided(c) | Path::Direct(c) => {
                // Only the SGEs it has: the peer reads no more (`pop_recv`).
                let n = (req.num_sge.get() as usize).min(req.sg_list.len());
                let used = std::mem::offset_of!(PostRecvReq, sg_list)
                    + n * std::mem::size_of::<softverbs_abi::msg::SgeWire>();
                push_entry(&mut c.rq_out, &req.as_bytes()[..used])
                    .map_err(|e| Error::new("post_recv", e))?;
                ops::posted_recv(ctx, handle, c);
            }
        }
        Ok(true)
    }

    /// A receive was posted to SRQ `srq` of this context: a direct peer of one of its QPs
    /// whose request waits for a receive may go on (`ops::posted_recv`).
    pub(crate) fn posted_srq_recv(&self, ctx: &Context, srq: u32) {
        if !self.srq_qps.load(Ordering::Relaxed) {
            return;
        }
        let g = self.lock();
        for (&h, q) in g.qps.iter().filter(|(_, q)| q.srq == Some(srq)) {
            if let Path::Direct(c) = &q.path {
                ops::posted_recv(ctx, h, c);
            }
        }
    }

    /// `ibv_post_send` on a QP of the direct path. `Ok(Some(f))`: the QP left the direct
    /// path, post `f` (which includes this request) through the daemon.
    pub(crate) fn post_send(
        &self,
        ctx: &Context,
        handle: u32,
        wr: &crate::datapath::SendRequest<'_>,
        max_send_wr: u32,
    ) -> Result<Posted> {
        let mut g = self.lock();
        let inner = &mut *g;
        if !inner.qps.contains_key(&handle) {
            return Ok(Posted::NotDirect);
        }
        let Some(q) = inner.qps.get_mut(&handle) else {
            return Ok(Posted::NotDirect);
        };
        if matches!(q.path, Path::Net) {
            let qpn = q.qpn;
            let Some(n) = inner.net.as_mut() else {
                return Err(Error::new("post_send", errno::EINVAL));
            };
            // A post does not count as polling (`progress::Activity`): it sends but
            // receives nothing.
            let r = n.post_send(&self.own_table, qpn, wr, &mut inner.cqs);
            net::tell_errors(&ctx.conn, n);
            ops::notify_own(ctx, inner);
            return r
                .map(|()| Posted::Done)
                .map_err(|e| Error::new("post_send", e));
        }
        let p = Pending::new(wr);
        if q.pending.len() as u32 >= max_send_wr {
            return Err(Error::new("post_send", errno::ENOMEM));
        }
        if q.error {
            let wc = WorkCompletion::new(p.wr_id, WcStatus::WrFlushErr, p.op.wc_opcode(), q.qpn);
            if let Some(cq) = q.send_cq {
                inner.cqs.push(cq, wc);
            }
            ops::notify_own(ctx, inner);
            return Ok(Posted::Done);
        }
        q.pending.push_back(p);
        let cqs = &mut inner.cqs;
        let left = progress(ctx, &self.own_table, handle, q, cqs);
        ops::notify_own(ctx, inner);
        if left {
            return Ok(Posted::Left(take_fallback(inner, handle)));
        }
        Ok(Posted::Done)
    }

    /// Runs every direct QP of the context and hands out up to `max` completions of CQ `cq`;
    /// QPs that left the direct path come back with what the daemon must now carry.
    pub(crate) fn poll(
        &self,
        ctx: &Context,
        cq: u32,
        max: usize,
        f: &mut impl FnMut(&WorkCompletion),
    ) -> (usize, Vec<(u32, Fallback)>) {
        let mut g = self.lock();
        let inner = &mut *g;
        if ctx.fatal.is_dead() {
            ops::device_gone(ctx, inner);
        }
        if let Some(n) = inner.net.as_mut() {
            n.drive(&self.own_table, &mut inner.cqs, net::Round::Poll);
            net::tell_errors(&ctx.conn, n);
        }
        let mut left = Vec::new();
        // No allocation on the poll path: QPs that leave the direct path are rare.
        let mut leaving = Vec::new();
        for (&h, q) in inner.qps.iter_mut() {
            if progress(ctx, &self.own_table, h, q, &mut inner.cqs) {
                leaving.push(h);
            }
        }
        for h in leaving {
            left.push((h, take_fallback(inner, h)));
        }
        ops::notify_own(ctx, inner);
        let mut n = 0;
        if let Some(queue) = inner.cqs.get_mut(&cq) {
            while n < max {
                let Some(wc) = queue.pop_front() else { break };
                if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    if let Some(c) = inner.rq_counts.get(&wc.qp_num) {
                        let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                            Some(v.saturating_sub(1))
                        });
                    }
                }
                f(&wc);
                n += 1;
            }
        }
        if n == 0 {
            for q in inner.qps.values_mut() {
                if let (Path::Direct(c), true) = (&mut q.path, q.pending.is_empty()) {
                    warm(c);
                }
            }
        }
        (n, left)
    }
}

/// After a poll that handed out nothing, for an idle direct QP: brings into this CPU's cache
/// the lines its next small SEND will touch that the peer wrote last — the peer's next
/// posted receive, and the inline slot it will fill (taken for writing) — so that SEND
/// does not wait for two cache lines to cross from the peer's CPU while the peer waits for
/// it (docs/design/direct-path.md, "Warm lines"). Reads and a compare-and-swap that changes
/// nothing: no state moves.
fn warm(c: &mut Chan) {
    if c.peer_srq.is_none() {
        let _ = c.rq_in.warm();
    }
    let next = c.cqe_out.produced();
    if c.warmed_slot == Some(next) {
        return;
    }
    let Some(slots) = c.slots_out.as_ref() else {
        return;
    };
    // Known free only as `deliver` knows it: a receiver that frees before it pops, and
    // room by the consumer index last read (re-read only when the ring looks full).
    if c.region
        .atomic_u32(CH_INLINE[1 - c.side])
        .load(Ordering::Acquire)
        == INLINE_FREES_FIRST
        && matches!(c.cqe_out.has_room(), Ok(true))
    {
        slots.warm(next);
        c.warmed_slot = Some(next);
    }
}

fn take_fallback(inner: &mut Inner, handle: u32) -> Fallback {
    inner
        .qps
        .remove(&handle)
        .map_or_else(Fallback::default, |q| Fallback {
            recvs: q.held,
            sends: q.pending.into(),
        })
}

/// Ring entries up to this size are popped into the stack: every SEND on the direct path
/// pops one, and a heap buffer for each was a tenth of the round trip (pushes pad in the
/// slot itself, `Producer::push_padded`).
const STACK_ENTRY: usize = 1024;

/// Hands `f` a zeroed buffer of `size` bytes, on the stack when it is small enough.
fn with_entry_buf<T>(size: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    if size <= STACK_ENTRY {
        let mut stack = [0u8; STACK_ENTRY];
        f(&mut stack[..size])
    } else {
        f(&mut vec![0u8; size])
    }
}

/// Takes the oldest receive posted to SRQ `s` into `r` (zeroed by the caller): `Ok(false)`
/// when none is, `Err` when its ring or entry is corrupt.
fn pop_srq(s: &PeerSrq, r: &mut PostRecvReq) -> std::result::Result<bool, ()> {
    const HEAD: usize = std::mem::offset_of!(PostRecvReq, sg_list);
    let entry = s.taker.layout().entry_size();
    let got = s.taker.pop_with(|region, at| {
        let n = HEAD.min(entry);
        region.read(at, &mut r.as_mut_bytes()[..n]);
        let sges = (r.num_sge.get() as usize).min(r.sg_list.len());
        let bytes = (sges * std::mem::size_of::<softverbs_abi::msg::SgeWire>())
            .min(entry.saturating_sub(HEAD));
        region.read(at + HEAD, &mut r.sg_list.as_mut_bytes()[..bytes]);
    });
    match got {
        Ok(Some(())) => Ok(true),
        Ok(None) => Ok(false),
        Err(_) => Err(()),
    }
}

/// Takes the peer's oldest posted receive into `r` (zeroed by the caller): `Ok(false)` when
/// none is posted, `Err`: its ring or entry is corrupt (the peer wrote nonsense into shared
/// memory). Filled in place: a receive request is 272 bytes, and moving it through the
/// `Option`s and `Result`s was a twentieth of an 8-byte SEND.
fn pop_recv(c: &mut Chan, r: &mut PostRecvReq) -> std::result::Result<bool, ()> {
    const HEAD: usize = std::mem::offset_of!(PostRecvReq, sg_list);
    if let Some(s) = &c.peer_srq {
        if !pop_srq(s, r)? {
            return Ok(false);
        }
        // Held until the request is done (`progress`): a peer that finds this process
        // gone completes it instead of losing it (`flush_held_by_gone_peer`).
        let held = CH_SRQ_HELD[c.side];
        c.region.atomic_u64s(held + 8, 1)[0].store(r.wr_id.get(), Ordering::Relaxed);
        c.region
            .atomic_u32(held + 4)
            .store(c.cqe_out.produced(), Ordering::Relaxed);
        c.region.atomic_u32(held).store(1, Ordering::Release);
        if s.crossed_limit() {
            c.srq_limit_due = true;
        }
        return Ok(true);
    }
    if c.rq_in.layout().entry_size() == std::mem::size_of::<PostRecvReq>() {
        // The daemon sizes the entries to the request: read its head, then only the SGEs
        // it has (`push_entry` writes no more).
        return c
            .rq_in
            .pop_with(|region, at| {
                region.read(at, &mut r.as_mut_bytes()[..HEAD]);
                let n = (r.num_sge.get() as usize).min(r.sg_list.len());
                region.read(at + HEAD, r.sg_list[..n].as_mut_bytes());
            })
            .map(|got| got.is_some())
            .map_err(|_| ());
    }
    with_entry_buf(c.rq_in.layout().entry_size(), |buf| {
        match c.rq_in.pop(buf) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(_) => return Err(()),
        }
        *r = PostRecvReq::read_from_prefix(buf).map_err(|_| ())?.0;
        Ok(true)
    })
}

/// Pushes onto a channel ring: their consumers (the libraries) poll and never sleep on them.
fn push_entry(p: &mut Producer, bytes: &[u8]) -> std::result::Result<(), i32> {
    match p.push_polled(bytes) {
        Ok(()) => Ok(()),
        Err(softverbs_shm::PushError::Full) => Err(errno::ENOMEM),
        Err(softverbs_shm::PushError::Corrupt(_)) => Err(errno::EIO),
    }
}

fn chan_from(r: &DirectAttachResp, mut fds: Vec<std::os::fd::OwnedFd>, abi: u32) -> Option<Chan> {
    let with_srq = r.srq_len.get() > 0;
    if fds.len() != 3 + usize::from(with_srq) {
        return None;
    }
    let peer_srq = if with_srq {
        Some(PeerSrq::from_resp(r, fds.pop()?)?)
    } else {
        None
    };
    let table_fd = fds.pop()?;
    let mem_fd = fds.pop()?;
    let region = Arc::new(Region::map_populated(fds.pop()?, r.region_len.get() as usize).ok()?);
    let side = r.side.get() as usize;
    if side > 1 {
        return None;
    }
    let peer = 1 - side;
    // An older daemon leaves `rings` 0: plain rings.
    let layout = |cap: U32, entry: U32| {
        if r.rings.get() & RINGS_STAMPED != 0 {
            RingLayout::stamped(cap.get(), entry.get()).ok()
        } else {
            RingLayout::new(cap.get(), entry.get()).ok()
        }
    };
    let rq = |s: usize| layout(r.capacity[s], r.rq_entry);
    let cq = |s: usize| layout(r.capacity[s], r.cqe_entry);
    let at = |v: U32| v.get() as usize;
    let slots = |s: usize| {
        inline::Slots::new(
            region.clone(),
            r.inline_offset[s].get(),
            r.capacity[s].get(),
            r.inline_slot.get(),
        )
    };
    let (slots_out, slots_in) = (slots(peer), slots(side));
    if slots_in.is_some() {
        // From here on this library places what the peer leaves in its slots.
        region
            .atomic_u32(CH_INLINE[side])
            .store(inline::PLACES, Ordering::Release);
    }
    Some(Chan {
        handle: 0,
        slots_out,
        slots_in,
        settled_to: 0,
        warmed_slot: None,
        taken: Box::default(),
        maps: mapped::Maps::default(),
        raw_local: std::cell::Cell::new(true),
        side,
        peer_qpn: r.peer_qpn.get(),
        peer_pd: r.peer_pd.get(),
        own_pd: r.own_pd.get(),
        // Before ABI 16 no QP of a direct pair had an SRQ.
        peer_recv_pd: if abi >= 16 {
            r.recv_pd[peer].get()
        } else {
            r.peer_pd.get()
        },
        own_recv_pd: if abi >= 16 {
            r.recv_pd[side].get()
        } else {
            r.own_pd.get()
        },
        peer_srq,
        srq_limit_due: false,
        peer: PeerMemory::new(mem_fd),
        peer_table: Region::map(table_fd, MRT_LEN).ok()?,
        rq_out: Producer::attach(region.clone(), at(r.rq_offset[side]), rq(side)?).ok()?,
        rq_in: Consumer::attach(region.clone(), at(r.rq_offset[peer]), rq(peer)?).ok()?,
        cqe_out: Producer::attach(region.clone(), at(r.cqe_offset[peer]), cq(peer)?).ok()?,
        cqe_in: Consumer::attach(region.clone(), at(r.cqe_offset[side]), cq(side)?).ok()?,
        region,
        rq_completed: 0,
        retry_deadline: None,
        rnr_deadline: None,
        rnr_retry: None,
    })
}

/// An undecided QP looks at the daemon's decision; `true`: it left the direct path.
fn decide(q: &mut DQp) -> bool {
    let Path::Undecided(c) = &q.path else {
        return false;
    };
    match c.region.atomic_u32(CH_PATH).load(Ordering::Acquire) {
        PATH_DIRECT => {
            let Path::Undecided(c) = std::mem::replace(&mut q.path, Path::Held) else {
                unreachable!("matched above")
            };
            q.path = Path::Direct(c);
            false
        }
        PATH_DAEMON => {
            // Nobody took the receives posted to the channel: they go to the daemon.
            let mut buf = vec![0u8; c.rq_out.layout().entry_size()];
            let produced = c.rq_out.produced();
            let mut i = 0u32;
            let mut back = Vec::new();
            while i != produced {
                if c.rq_out.read_back(i, &mut buf) {
                    if let Ok((r, _)) = PostRecvReq::read_from_prefix(&buf) {
                        back.push(r);
                    }
                }
                i = i.wrapping_add(1);
            }
            back.append(&mut q.held);
            q.held = back;
            true
        }
        _ => false,
    }
}

/// Moves the QP on: decision, peer state, receive completions, waiting requests. `true`: the
/// QP left the direct path (its held work goes to the daemon).
fn progress(
    ctx: &Context,
    own_table: &Region,
    handle: u32,
    q: &mut DQp,
    cqs: &mut CqQueues,
) -> bool {
    if decide(q) {
        return true;
    }
    if q.error {
        return false;
    }
    let Path::Direct(c) = &mut q.path else {
        return false;
    };
    drain_cqes(Some(own_table), c, q.recv_cq, cqs);
    if q.srq.is_some() {
        flush_held_by_gone_peer(c, q.qpn, q.recv_cq, cqs);
    }
    if c.region
        .atomic_u32(CH_STATE[c.side])
        .load(Ordering::Acquire)
        == SIDE_ERROR
    {
        // A request of the peer broke a rule here: the daemon moved this QP to ERR (and
        // raised its event), this library flushes it.
        fail(ctx, handle, q, cqs, None, false);
        return false;
    }
    let peer_state = c
        .region
        .atomic_u32(CH_STATE[1 - c.side])
        .load(Ordering::Acquire);
    if peer_state == SIDE_GONE
        && q.qp_type == QpType::Rc
        && !q.pending.is_empty()
        && ops::retries_run_out(ctx, handle, c)
    {
        // The peer's context closed or its QP was destroyed: what an RC requester learns
        // from its retries running out (crates/transport/src/completer.rs), once they
        // would have (`ops::retries_run_out`). An idle QP learns nothing, as on the
        // engine: its receives stay posted until it sends.
        fail(ctx, handle, q, cqs, Some(WcStatus::RetryExcErr), true);
        return false;
    }
    while let Some(p) = q.pending.front() {
        let Path::Direct(c) = &mut q.path else {
            return false;
        };
        let signaled = p.signaled || q.sq_sig_all;
        let before = c.cqe_out.produced();
        // Busy from before its checks until after its copies: the peer's `dereg_mr` waits
        // for 0 (`DirectCtx::revoked`), and a peer flushing its receives likewise.
        // Store ; full fence ; load of the table, paired with the owner's table write ;
        // full fence ; load of this word (`DirectCtx::revoked`): one of the two sees the
        // other's store.
        c.region
            .atomic_u32(CH_BUSY[c.side])
            .store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        // Until its local pieces are looked up (`local_pieces`).
        c.raw_local.set(p.inline.is_some());
        let done = ops::execute(ctx, own_table, handle, c, q.qp_type, p)
            .unwrap_or_else(|| execute(ctx, own_table, c, q.qp_type, p));
        // Release: the copies above happen before an owner that sees 0 goes on.
        c.region
            .atomic_u32(CH_BUSY[c.side])
            .store(0, Ordering::Release);
        if c.peer_srq.is_some() {
            srq_request_done(ctx, handle, c);
        }
        let done = ops::adjusted(ctx, handle, c, p, done);
        ops::delivered(ctx, handle, c, q.send_cq, (before, p, &done));
        match done {
            Exec::Rnr => break,
            Exec::Done(WcStatus::Success, len) => {
                count(c, p.op);
                let p = q.pending.pop_front().expect("front");
                if signaled {
                    let mut wc =
                        WorkCompletion::new(p.wr_id, WcStatus::Success, p.op.wc_opcode(), q.qpn);
                    wc.byte_len = len;
                    if let Some(cq) = q.send_cq {
                        cqs.push(cq, wc);
                    }
                }
            }
            Exec::Done(status, _) => {
                fail(ctx, handle, q, cqs, Some(status), true);
                break;
            }
            Exec::PeerFault(status, event) => {
                // Some faults fail the responder without an event (a receive too short or
                // out of its keys, crates/transport/src/responder.rs `execute_send`).
                let req = softverbs_abi::msg::DirectPeerErrorReq {
                    qp: U32::new(handle),
                    event: U32::new(event.map_or(softverbs_abi::direct::NO_EVENT, |e| e as u32)),
                };
                let _ = ctx
                    .conn
                    .call::<cmd::DirectPeerError>("direct_peer_error", 0, &req);
                fail(ctx, handle, q, cqs, Some(status), true);
                break;
            }
        }
    }
    false
}

/// Counts request `op`, completed, in the channel header (`CH_SENT`, `CH_RCVD`) for
/// `softverbs stat` (docs/guide/counters.md): the engine's message counters, which the
/// direct path, having no engine, keeps here. Binds and local invalidates are no requests.
fn count(c: &Chan, op: SendOp) {
    use std::sync::atomic::Ordering::Relaxed;
    let kind = match op {
        SendOp::Write { .. } | SendOp::WriteWithImm { .. } => Some(1),
        SendOp::Read { .. } => Some(2),
        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => Some(3),
        SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => None,
        _ => return,
    };
    c.region.atomic_u64s(CH_SENT[c.side], 1)[0].fetch_add(1, Relaxed);
    let rcvd = c.region.atomic_u64s(CH_RCVD[1 - c.side], CH_RCVD_WORDS);
    rcvd[0].fetch_add(1, Relaxed);
    if let Some(k) = kind {
        rcvd[k].fetch_add(1, Relaxed);
    }
}

/// After a request of a QP whose peer receives through an SRQ: the receive it took (if
/// any) is no longer held, and a limit it crossed is the daemon's to raise.
fn srq_request_done(ctx: &Context, handle: u32, c: &mut Chan) {
    c.region
        .atomic_u32(CH_SRQ_HELD[c.side])
        .store(0, Ordering::Release);
    if std::mem::take(&mut c.srq_limit_due) {
        let req = softverbs_abi::msg::HandleReq {
            handle: U32::new(handle),
        };
        let _ = ctx
            .conn
            .call::<cmd::DirectSrqLimit>("direct_srq_limit", 0, &req);
    }
}

/// This QP receives through an SRQ and its peer is gone: a receive the peer's library took
/// from the SRQ and never completed (its process died in between, `CH_SRQ_HELD`) completes
/// here with `WR_FLUSH_ERR`, as a NIC flushes the receive a message was arriving into when
/// the QP fails (IBA 10.3.1.9), instead of vanishing. Called after the completions the
/// peer pushed are drained: one pushed for the held receive has then been seen.
fn flush_held_by_gone_peer(c: &mut Chan, qpn: u32, recv_cq: Option<u32>, cqs: &mut CqQueues) {
    let peer = 1 - c.side;
    let region = &c.region;
    if region.atomic_u32(CH_STATE[peer]).load(Ordering::Acquire) != SIDE_GONE {
        return;
    }
    let held = CH_SRQ_HELD[peer];
    if region.atomic_u32(held).load(Ordering::Acquire) != 1 {
        return;
    }
    let at = region.atomic_u32(held + 4).load(Ordering::Relaxed);
    let wr_id = region.atomic_u64s(held + 8, 1)[0].load(Ordering::Relaxed);
    region.atomic_u32(held).store(0, Ordering::Relaxed);
    // Its completion would have been the entry at `at`: one drained already went through.
    if c.cqe_in.consumed().wrapping_sub(at) as i32 > 0 {
        return;
    }
    if let Some(cq) = recv_cq {
        let wc = WorkCompletion::new(wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn);
        cqs.push(cq, wc);
    }
}

/// Takes the receive completions the peer pushed, placing the bytes of inline SENDs into
/// this process's receive buffers first (`inline.rs`), so a completion is visible only once
/// its data is in place.
fn drain_cqes(own_table: Option<&Region>, c: &mut Chan, recv_cq: Option<u32>, cqs: &mut CqQueues) {
    let peer_side = 1 - c.side;
    loop {
        if !matches!(c.cqe_in.available(), Ok(n) if n > 0) {
            break;
        }
        let idx = c.cqe_in.consumed();
        let region = &c.region;
        let gone = || {
            region
                .atomic_u32(CH_STATE[peer_side])
                .load(Ordering::Acquire)
                == SIDE_GONE
        };
        // The entry first, then the slot: the two lines the sender just wrote are then
        // fetched together, before the slot's compare-and-swap holds up what follows it.
        let Ok(Some(w)) = c.cqe_in.peek_with(|region, at| {
            let mut w = WcWire::new_zeroed();
            region.read(at, w.as_mut_bytes());
            w
        }) else {
            break;
        };
        let t = &mut *c.taken;
        let taken = match &c.slots_in {
            Some(sl) => sl.take(idx, SLOT_RECEIVER, gone, t),
            None => Ok(false),
        };
        let mut wc = WorkCompletion::from(&w);
        match taken {
            Ok(false) => {}
            Ok(true) => {
                if !place_own(own_table, c.own_recv_pd, t) {
                    // The receive's MR went away (or the peer wrote nonsense) before the
                    // bytes could be placed: what a NIC reports for a receive whose L_Key
                    // fails (IBA 10.7.2.2), and nothing is written.
                    wc.status = WcStatus::LocProtErr;
                    wc.opcode = WcOpcode::Recv;
                    wc.byte_len = 0;
                }
                if let Some(sl) = &c.slots_in {
                    sl.release(idx);
                }
            }
            // The sender died while placing these bytes itself: the receive is lost with it
            // (its QP fails at once, peer gone).
            Err(inline::Failed::Stuck) => wc.status = WcStatus::WrFlushErr,
            // The sender found the receive's MR gone before it could place the bytes.
            Err(inline::Failed::Unplaced) => {
                wc.status = WcStatus::LocProtErr;
                wc.opcode = WcOpcode::Recv;
                wc.byte_len = 0;
                if let Some(sl) = &c.slots_in {
                    sl.release(idx);
                }
            }
        }
        // Popped only once its slot is free (`INLINE_FREES_FIRST`): a sender that sees the
        // entry gone reuses the slot without reading its state.
        if !matches!(c.cqe_in.pop_with(|_, _| ()), Ok(Some(()))) {
            break;
        }
        c.rq_completed = c.rq_completed.wrapping_add(1);
        if let Some(cq) = recv_cq {
            cqs.push(cq, wc);
        }
    }
}

/// Copies an inline slot's payload into this process's receive buffers, each checked again
/// in its own MR table (`LOCAL_WRITE`, bounds: the program may have deregistered it since the
/// sender checked); `false` (nothing written) if any piece fails.
fn place_own(own_table: Option<&Region>, pd: u32, t: &inline::Taken) -> bool {
    let Some(table) = own_table else {
        return false;
    };
    let total: u64 = t.pieces().iter().map(|p| p.len).sum();
    if total != t.payload().len() as u64 {
        return false;
    }
    let mut targets = [(0u64, 0usize); INLINE_PIECES];
    for (p, slot) in t.pieces().iter().zip(targets.iter_mut()) {
        match check(table, pd, p.lkey, p.addr, p.len, Access::LOCAL_WRITE) {
            Some(a) => *slot = (a, p.len as usize),
            None => return false,
        }
    }
    let mut off = 0;
    for &(a, l) in &targets[..t.pieces().len()] {
        softverbs_memaccess::write_own(a, &t.payload()[off..off + l]);
        off += l;
    }
    true
}

/// Moves the QP to ERR: the front request completes with `front` (if any), the rest and
/// every receive flush (IBA 10.3.1.9), and the daemon hears of it (`tell`: the library
/// decided it, not the owner's own modify).
fn fail(
    ctx: &Context,
    handle: u32,
    q: &mut DQp,
    cqs: &mut CqQueues,
    front: Option<WcStatus>,
    tell: bool,
) {
    if q.error {
        return;
    }
    q.error = true;
    let mut first = front;
    for p in q.pending.drain(..) {
        let st = first.take().unwrap_or(WcStatus::WrFlushErr);
        let wc = WorkCompletion::new(p.wr_id, st, p.op.wc_opcode(), q.qpn);
        if let Some(cq) = q.send_cq {
            cqs.push(cq, wc);
        }
    }
    let mut recvs: Vec<u64> = q.held.drain(..).map(|r| r.wr_id.get()).collect();
    if let Path::Direct(c) = &mut q.path {
        let me = c.side;
        c.region
            .atomic_u32(CH_STATE[me])
            .store(SIDE_ERROR, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        // Wait until the peer is not taking one of our receives (it checks our state after
        // raising its busy word, so it takes none after this).
        let end = Instant::now() + Duration::from_secs(1);
        while c.region.atomic_u32(CH_BUSY[1 - me]).load(Ordering::SeqCst) != 0
            && c.region
                .atomic_u32(CH_STATE[1 - me])
                .load(Ordering::Acquire)
                != SIDE_GONE
            && Instant::now() < end
        {
            std::thread::yield_now();
        }
        drain_cqes(
            ctx.direct.as_ref().map(|d| &*d.own_table),
            c,
            q.recv_cq,
            cqs,
        );
        if q.srq.is_some() {
            // Its receives are the SRQ's and stay posted there (IBA 10.2.9.5); only one the
            // peer's library held when it died is this QP's to flush.
            flush_held_by_gone_peer(c, q.qpn, q.recv_cq, cqs);
        }
        let produced = c.rq_out.produced();
        let mut i = if q.srq.is_some() {
            produced
        } else {
            c.rq_completed
        };
        let mut buf = vec![0u8; c.rq_out.layout().entry_size()];
        while i != produced {
            if c.rq_out.read_back(i, &mut buf) {
                if let Ok((r, _)) = PostRecvReq::read_from_prefix(&buf) {
                    recvs.push(r.wr_id.get());
                }
            }
            i = i.wrapping_add(1);
        }
        c.rq_completed = produced;
    }
    for wr_id in recvs {
        let wc = WorkCompletion::new(wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, q.qpn);
        if let Some(cq) = q.recv_cq {
            cqs.push(cq, wc);
        }
    }
    if tell {
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = crate::objects::modify_qp(ctx, "modify_qp", handle, &attr, AttrMask::STATE);
    }
}

/// The local pieces of the request in this process: `Err(LOC_PROT_ERR)` for a key that is
/// not ours, of another PD, out of range, or without `need`. Also records whether they may
/// be touched with plain pointers (`Chan::raw_local`: none lies in an ODP MR), from the
/// same lookups.
fn local_pieces(
    table: &Region,
    c: &Chan,
    p: &Pending,
    need: Access,
) -> std::result::Result<Pieces, WcStatus> {
    if let Some(b) = &p.inline {
        c.raw_local.set(true);
        return Ok(smallvec::smallvec![(b.as_ptr() as u64, b.len() as u64)]);
    }
    let mut raw = true;
    let mut out = Pieces::new();
    for s in &p.sges {
        let len = u64::from(s.length);
        let (e, a) =
            check_entry(table, c.own_pd, s.lkey, s.addr, len, need).ok_or(WcStatus::LocProtErr)?;
        raw &= !Access(e.access).contains(Access::ON_DEMAND);
        out.push((a, len));
    }
    c.raw_local.set(raw);
    Ok(out)
}

/// Address and length of each local piece of a request, in order.
type Pieces = SmallVec<[(u64, u64); 4]>;

/// An RDMA WRITE's or READ's local pieces and the peer address it reaches, checked in the
/// order the engine checks them: the local keys (`Err(Some(LOC_PROT_ERR))`), then the
/// responder QP's access flags and the R_Key's PD, access and range (`Err(None)`: a Remote
/// Access Error, IBA 10.2.4.3 and 9.7.5.2.4). `need` is (local, remote) access.
fn rdma_target(
    own_table: &Region,
    c: &Chan,
    p: &Pending,
    peer_access: Access,
    need: (Access, Access),
    rkey: u32,
    remote_addr: u64,
) -> std::result::Result<(Pieces, u64), Option<WcStatus>> {
    let local = local_pieces(own_table, c, p, need.0).map_err(Some)?;
    if !peer_access.contains(need.1) {
        return Err(None);
    }
    let total: u64 = local.iter().map(|&(_, l)| l).sum();
    if total == 0 {
        return Ok((local, 0));
    }
    check(&c.peer_table, c.peer_pd, rkey, remote_addr, total, need.1)
        .map(|t| (local, t))
        .ok_or(None)
}

fn peer_state(c: &Chan) -> u32 {
    c.region
        .atomic_u32(CH_STATE[1 - c.side])
        .load(Ordering::Acquire)
}

/// Writes the local pieces to the peer's `[raddr, ..)`, which its MR `e` covers: `memcpy`
/// into the MR's mapping when it is shared memory, else through the peer's `/proc/<pid>/mem`.
fn write_peer(
    ctx: &Context,
    handle: u32,
    maps: &mut mapped::Maps,
    peer: &PeerMemory,
    e: &MrEntry,
    local: &[(u64, u64)],
    raddr: u64,
) -> std::result::Result<(), PeerFault> {
    match maps.get(ctx, handle, e) {
        Some(m) => m.write_from(local, raddr),
        None => peer.write_from(local, raddr),
    }
}

/// Which way [`copy_peer`] moves bytes.
#[derive(Clone, Copy)]
enum Dir {
    ToPeer,
    FromPeer,
}

/// Moves the request's local pieces to or from the peer's `raddr` in MR `e`: through the
/// peer MR's mapping when it is shared memory and the local pieces may be touched with plain
/// pointers (`Chan::raw_local`), else through the peer's `/proc/<pid>/mem`.
fn copy_peer(
    ctx: &Context,
    c: &mut Chan,
    e: Option<&MrEntry>,
    local: &[(u64, u64)],
    raddr: u64,
    dir: Dir,
) -> std::result::Result<(), PeerFault> {
    let handle = c.handle;
    let mapped = e
        .filter(|_| c.raw_local.get())
        .and_then(|e| c.maps.get(ctx, handle, e));
    match (mapped, dir) {
        (Some(m), Dir::ToPeer) => m.write_from(local, raddr),
        (Some(m), Dir::FromPeer) => m.read_into(local, raddr),
        (None, Dir::ToPeer) => c.peer.write_from(local, raddr),
        (None, Dir::FromPeer) => c.peer.read_into(local, raddr),
    }
}

/// Copies the local pieces into the peer's pieces `(entry, address, length)` in order.
fn scatter(
    ctx: &Context,
    c: &mut Chan,
    local: &[(u64, u64)],
    remote: &[(MrEntry, u64, u64)],
) -> std::result::Result<(), PeerFault> {
    let mut li = 0;
    let mut loff = 0u64;
    for (e, raddr, rlen) in remote {
        let mut pieces = Vec::new();
        let mut need = *rlen;
        while need > 0 && li < local.len() {
            let (a, l) = local[li];
            let take = (l - loff).min(need);
            pieces.push((a + loff, take));
            need -= take;
            loff += take;
            if loff == l {
                li += 1;
                loff = 0;
            }
        }
        copy_peer(ctx, c, Some(e), &pieces, *raddr, Dir::ToPeer)?;
    }
    Ok(())
}

/// Places, in ring order, the bytes of every inline SEND this side left in the peer's slots
/// that the peer has not placed yet (`inline.rs`), before this side places anything else
/// into the peer's memory. A slot whose receive MR the peer deregistered meanwhile is
/// written nowhere and marked failed (that receive completes `LOC_PROT_ERR`).
fn settle(ctx: &Context, c: &mut Chan) {
    if c.slots_out.is_none() {
        return;
    }
    let produced = c.cqe_out.produced();
    let cap = c.cqe_out.layout().capacity();
    if produced.wrapping_sub(c.settled_to) > cap {
        c.settled_to = produced.wrapping_sub(cap);
    }
    while c.settled_to != produced {
        let i = c.settled_to;
        settle_one(ctx, c, i);
        c.settled_to = i.wrapping_add(1);
    }
}

fn settle_one(ctx: &Context, c: &mut Chan, i: u32) {
    let Some(slots) = c.slots_out.as_ref() else {
        return;
    };
    let region = &c.region;
    let peer_side = 1 - c.side;
    let gone = || {
        region
            .atomic_u32(CH_STATE[peer_side])
            .load(Ordering::Acquire)
            == SIDE_GONE
    };
    let mut t = inline::Taken::default();
    let Ok(true) = slots.take(i, SLOT_SENDER, gone, &mut t) else {
        return;
    };
    // Every piece is checked again (the peer may have deregistered its MR since) before any
    // is written: all of the SEND lands, or none of it and the receive fails.
    let mut targets = Vec::with_capacity(t.pieces().len());
    let total: u64 = t.pieces().iter().map(|p| p.len).sum();
    let mut ok = total == t.payload().len() as u64;
    for p in t.pieces() {
        match check_entry(
            &c.peer_table,
            c.peer_recv_pd,
            p.lkey,
            p.addr,
            p.len,
            Access::LOCAL_WRITE,
        ) {
            Some(found) if ok => targets.push((found, p.len)),
            _ => ok = false,
        }
    }
    let base = t.payload().as_ptr() as u64;
    let mut off = 0u64;
    if ok {
        for ((e, a), len) in &targets {
            let piece = [(base + off, *len)];
            if write_peer(ctx, c.handle, &mut c.maps, &c.peer, e, &piece, *a).is_err() {
                ok = false;
                break;
            }
            off += len;
        }
    }
    if let Some(slots) = c.slots_out.as_ref() {
        if ok {
            slots.release(i);
        } else {
            slots.failed(i);
        }
    }
}

fn execute(ctx: &Context, own_table: &Region, c: &mut Chan, qp_type: QpType, p: &Pending) -> Exec {
    let reliable = qp_type == QpType::Rc;
    let dropped = || Exec::Done(WcStatus::Success, 0);
    let len_of = |p: &Pending| -> u64 {
        p.inline.as_ref().map_or_else(
            || p.sges.iter().map(|s| u64::from(s.length)).sum(),
            |b| b.len() as u64,
        )
    };
    let total = len_of(p);
    match peer_state(c) {
        SIDE_OPEN => {}
        // Not at RTR yet: requests wait, as they would retry against it.
        SIDE_PENDING => return Exec::Rnr,
        // A responder in ERR or gone answers nothing: RC retries run out, UC loses it.
        _ if reliable => return Exec::Done(WcStatus::RetryExcErr, 0),
        _ => return dropped(),
    }
    let access_err = || {
        if reliable {
            Exec::PeerFault(WcStatus::RemAccessErr, Some(EventType::QpAccessErr))
        } else {
            Exec::Done(WcStatus::Success, 0)
        }
    };
    // The responder QP's own access flags (IBA 10.2.4.3, checked before the R_Key).
    let peer_access = Access(
        c.region
            .atomic_u32(CH_ACCESS[1 - c.side])
            .load(Ordering::Acquire),
    );
    match p.op {
        SendOp::Send | SendOp::SendWithImm(_) => {
            let local = match local_pieces(own_table, c, p, Access::EMPTY) {
                Ok(l) => l,
                Err(s) => return Exec::Done(s, 0),
            };
            let imm = match p.op {
                SendOp::SendWithImm(i) => Some(i),
                _ => None,
            };
            deliver(
                ctx,
                c,
                reliable,
                total,
                total,
                imm,
                WcOpcode::Recv,
                Some(&local),
            )
        }
        SendOp::Write { remote_addr, rkey }
        | SendOp::WriteWithImm {
            remote_addr, rkey, ..
        } => {
            let need = (Access::EMPTY, Access::REMOTE_WRITE);
            let (local, target) =
                match rdma_target(own_table, c, p, peer_access, need, rkey, remote_addr) {
                    Ok(t) => t,
                    Err(None) => {
                        c.maps.forget(rkey);
                        return access_err();
                    }
                    Err(Some(s)) => return Exec::Done(s, 0),
                };
            if total > 0 {
                settle(ctx, c);
                let e = lookup(&c.peer_table, rkey);
                let moved = copy_peer(ctx, c, e.as_ref(), &local, target, Dir::ToPeer);
                match moved {
                    // A mapping outlives its owner: a peer that died meanwhile acknowledges
                    // nothing, as through `/proc` (where the kernel moves nothing).
                    Ok(()) if reliable && peer_state(c) == SIDE_GONE => {
                        return Exec::Done(WcStatus::RetryExcErr, 0)
                    }
                    Ok(()) => {}
                    Err(PeerFault::Local) => return Exec::Done(WcStatus::LocProtErr, 0),
                    Err(PeerFault::Gone) if reliable => {
                        return Exec::Done(WcStatus::RetryExcErr, 0)
                    }
                    Err(PeerFault::Remote) if reliable => {
                        return Exec::PeerFault(WcStatus::RemOpErr, Some(EventType::QpFatal))
                    }
                    Err(PeerFault::Remote | PeerFault::Gone) => return dropped(),
                }
            }
            if let SendOp::WriteWithImm { imm, .. } = p.op {
                // The data is placed; the receive only reports it (IBA 9.4.3).
                return deliver(
                    ctx,
                    c,
                    reliable,
                    total,
                    0,
                    Some(imm),
                    WcOpcode::RecvRdmaWithImm,
                    None,
                )
                .with_len(total);
            }
            Exec::Done(WcStatus::Success, total as u32)
        }
        SendOp::Read { remote_addr, rkey } => {
            let need = (Access::LOCAL_WRITE, Access::REMOTE_READ);
            let (local, target) =
                match rdma_target(own_table, c, p, peer_access, need, rkey, remote_addr) {
                    Ok(t) => t,
                    Err(None) => {
                        c.maps.forget(rkey);
                        return access_err();
                    }
                    Err(Some(s)) => return Exec::Done(s, 0),
                };
            if total > 0 {
                // A READ sees what earlier SENDs placed (IBA 9.5: the responder executes
                // requests in order).
                settle(ctx, c);
                let e = lookup(&c.peer_table, rkey);
                let moved = copy_peer(ctx, c, e.as_ref(), &local, target, Dir::FromPeer);
                match moved {
                    Ok(()) if peer_state(c) == SIDE_GONE => {
                        return Exec::Done(WcStatus::RetryExcErr, 0)
                    }
                    Ok(()) => {}
                    Err(PeerFault::Local) => return Exec::Done(WcStatus::LocProtErr, 0),
                    Err(PeerFault::Gone) => return Exec::Done(WcStatus::RetryExcErr, 0),
                    Err(PeerFault::Remote) => {
                        return Exec::PeerFault(WcStatus::RemOpErr, Some(EventType::QpFatal))
                    }
                }
            }
            Exec::Done(WcStatus::Success, total as u32)
        }
        // The pair goes direct only when neither QP allows remote atomics
        // (crates/daemon/src/direct.rs), so the responder refuses them as its engine does.
        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => access_err(),
        _ => Exec::Done(WcStatus::LocQpOpErr, 0),
    }
}

impl Exec {
    /// A delivered WRITE with immediate completes at the sender with the WRITE's length.
    fn with_len(self, len: u64) -> Exec {
        match self {
            Exec::Done(WcStatus::Success, _) => Exec::Done(WcStatus::Success, len as u32),
            e => e,
        }
    }
}

/// The peer's receive pieces a SEND goes to: its MR entry, address there, and length.
pub(super) type RemotePieces = SmallVec<[(MrEntry, u64, u64); 4]>;

/// The peer's pieces `(entry, address, length)` that `len` bytes fill along receive `r`'s
/// SGEs, each checked in the peer's MR table (the peer QP's PD, `LOCAL_WRITE`, bounds), with
/// the same pieces as the receive named them (for an inline slot), and the receive's status:
/// `LOC_PROT_ERR` at the first SGE that fails, `LOC_LEN_ERR` when the receive is too short
/// (the engine responder's checks of a receive WQE, `crates/transport/src/responder.rs`).
/// Fills `remote` and `pieces` (empty) in place: they are a few hundred bytes, and moving
/// them out through a return value was a fortieth of a small SEND.
fn receive_pieces(
    c: &Chan,
    r: &PostRecvReq,
    len: u64,
    remote: &mut RemotePieces,
    pieces: &mut SmallVec<[inline::Piece; 4]>,
) -> WcStatus {
    let n = (r.num_sge.get() as usize).min(r.sg_list.len());
    let mut need = len;
    let mut status = WcStatus::Success;
    for s in &r.sg_list[..n] {
        if need == 0 {
            break;
        }
        let take = u64::from(s.length.get()).min(need);
        match check_entry(
            &c.peer_table,
            c.peer_recv_pd,
            s.lkey.get(),
            s.addr.get(),
            take,
            Access::LOCAL_WRITE,
        ) {
            Some((e, a)) => {
                remote.push((e, a, take));
                pieces.push(inline::Piece {
                    lkey: s.lkey.get(),
                    addr: s.addr.get(),
                    len: take,
                });
            }
            None => {
                status = WcStatus::LocProtErr;
                break;
            }
        }
        need -= take;
    }
    if status == WcStatus::Success && need > 0 {
        status = WcStatus::LocLenErr;
    }
    status
}

/// Takes the peer's next receive and completes it with `opcode` after placing `send`'s
/// local pieces (a SEND; `None`: the data is placed already) into it (responder
/// `execute_send`'s rules: a too-short receive is `LOC_LEN_ERR` there and `REM_INV_REQ_ERR`
/// here, a bad key `LOC_PROT_ERR` there and `REM_OP_ERR` here, both failing the responder
/// without an event; UC drops instead of failing). A SEND of at most `INLINE_MAX` bytes to
/// at most `INLINE_PIECES` receive SGEs goes into the completion's inline slot for the
/// receiver to place (`inline.rs`); a larger one is placed here, after the slots still
/// unplaced. The caller has raised this side's busy word.
#[allow(clippy::too_many_arguments)]
fn deliver(
    ctx: &Context,
    c: &mut Chan,
    reliable: bool,
    byte_len: u64,
    len: u64,
    imm: Option<u32>,
    opcode: WcOpcode,
    send: Option<&[(u64, u64)]>,
) -> Exec {
    match peer_state(c) {
        SIDE_OPEN => {}
        SIDE_PENDING => return Exec::Rnr,
        _ if reliable => return Exec::Done(WcStatus::RetryExcErr, 0),
        _ => return Exec::Done(WcStatus::Success, 0),
    }
    let mut r = PostRecvReq::new_zeroed();
    match pop_recv(c, &mut r) {
        Ok(true) => {}
        Ok(false) if reliable => return Exec::Rnr,
        Ok(false) => return Exec::Done(WcStatus::Success, 0),
        Err(()) => return Exec::PeerFault(WcStatus::RemOpErr, Some(EventType::QpFatal)),
    }
    let (mut remote, mut pieces) = (RemotePieces::new(), SmallVec::new());
    let mut status = receive_pieces(c, &r, len, &mut remote, &mut pieces);
    let slot = c.cqe_out.produced();
    let mut filled = false;
    if let (WcStatus::Success, Some(local)) = (status, send) {
        // The receiver places inline bytes with plain pointers: never into an ODP MR (its
        // page may be unmapped; the kernel's copy here reports that as LOC_PROT_ERR).
        let small = len as usize <= INLINE_MAX
            && pieces.len() <= INLINE_PIECES
            && c.raw_local.get()
            && remote
                .iter()
                .all(|(e, _, _)| !Access(e.access).contains(Access::ON_DEMAND));
        // What the receiver's library said it places (`CH_INLINE`): 0 nothing, 1 slots with
        // the payload at its usual offset, 2 also payloads near the slot's head.
        let placed_there = c
            .region
            .atomic_u32(CH_INLINE[1 - c.side])
            .load(Ordering::Acquire);
        if small
            && c.slots_out.is_some()
            && placed_there >= 1
            && matches!(c.cqe_out.has_room(), Ok(true))
        {
            // Room in the ring means the receiver popped the entry this slot held last; one
            // that frees a slot before popping it has then freed this one.
            let known_free = placed_there == INLINE_FREES_FIRST;
            if !known_free && !c.slots_out.as_ref().is_some_and(|sl| sl.is_free(slot)) {
                // Its previous entry's bytes may still wait for the receiver.
                settle_one(ctx, c, slot.wrapping_sub(c.cqe_out.layout().capacity()));
            }
            if let Some(sl) = c
                .slots_out
                .as_ref()
                .filter(|sl| known_free || sl.is_free(slot))
            {
                let mut buf = [0u8; INLINE_MAX];
                let payload = &mut buf[..len as usize];
                let mut off = 0;
                for &(a, l) in local {
                    softverbs_memaccess::read_own(a, &mut payload[off..off + l as usize]);
                    off += l as usize;
                }
                sl.fill(slot, &pieces, payload, placed_there >= INLINE_NEAR);
                filled = true;
            }
        }
        if !filled {
            settle(ctx, c);
            match scatter(ctx, c, local, &remote) {
                Ok(()) => {}
                // The peer died holding this receive: nobody will see it.
                Err(PeerFault::Gone) if reliable => return Exec::Done(WcStatus::RetryExcErr, 0),
                Err(PeerFault::Gone) => return Exec::Done(WcStatus::Success, 0),
                Err(PeerFault::Local) => return Exec::Done(WcStatus::LocProtErr, 0),
                Err(PeerFault::Remote) => status = WcStatus::LocProtErr,
            }
        }
    }
    let mut wc = WorkCompletion::new(r.wr_id.get(), status, opcode, c.peer_qpn);
    if status == WcStatus::Success {
        wc.byte_len = byte_len as u32;
        if let Some(i) = imm {
            wc.imm_data = i;
            wc.wc_flags |= WC_WITH_IMM;
        }
    } else {
        wc.opcode = WcOpcode::Recv;
    }
    if push_entry(&mut c.cqe_out, WcWire::from(&wc).as_bytes()).is_err() {
        if filled {
            if let Some(sl) = &c.slots_out {
                sl.release(slot);
            }
        }
        return Exec::PeerFault(WcStatus::RemOpErr, Some(EventType::QpFatal));
    }
    if reliable && peer_state(c) == SIDE_GONE {
        // Died while this was delivered: nobody takes it, nobody acknowledges it.
        return Exec::Done(WcStatus::RetryExcErr, 0);
    }
    match status {
        WcStatus::Success => Exec::Done(WcStatus::Success, len as u32),
        _ if !reliable => Exec::Done(WcStatus::Success, 0),
        WcStatus::LocLenErr => Exec::PeerFault(WcStatus::RemInvReqErr, None),
        _ => Exec::PeerFault(WcStatus::RemOpErr, None),
    }
}
