//! The daemon's part of the same-host direct path (docs/design/direct-path.md): the control path
//! only. It keeps each direct-capable context's MR table, decides per connected RC/UC pair
//! whether the two libraries exchange work directly, makes the pair's channel memfd, and
//! tells a survivor that its peer is gone (the channel's side word).

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use softverbs_abi::direct::*;
use softverbs_abi::msg::{DirectAttachReq, DirectAttachResp, PostRecvReq, WcWire};
use softverbs_core::attr::QpAttr;
use softverbs_core::datapath::QpTarget;
use softverbs_core::errno::{EINVAL, ENOMEM};
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::types::{AttrMask, EventType, QpState, QpType};
use softverbs_core::Core;
use softverbs_shm::{Region, RingLayout};

use crate::datapath::DataPath;
use zerocopy::little_endian::{U32, U64};

mod mr_fd;
mod ops;

/// A context that opened the direct path.
#[derive(Debug)]
struct Opened {
    uid: u32,
    /// The pid `mem` was validated for.
    pid: u32,
    /// Its `/proc/<pid>/mem`, validated, handed to its peers while the process may be
    /// opened by them ([`softverbs_memaccess::reachable_as`]).
    mem: OwnedFd,
    table: Region,
    table_fd: OwnedFd,
    /// More MRs than the table holds: its QPs stay on the daemon path.
    overflow: bool,
    /// `DirectOpenReq::caps` (ABI 16).
    caps: u32,
}

/// One pair of QPs that asked, by (lower QPN, higher QPN); side 0 is the lower.
#[derive(Debug)]
struct Pair {
    region: Region,
    /// The channel's memfd, which the daemon keeps for the side that has not asked yet:
    /// one descriptor charged to `charged` (docs/guide/limits.md, "Descriptors").
    fd: OwnedFd,
    charged: CtxId,
    ctx: [CtxId; 2],
    asked: [bool; 2],
    resp: DirectAttachResp,
    /// Each side's device, for its port's counters.
    dev: [usize; 2],
}

impl Pair {
    /// Side `side`'s counters as the two libraries keep them in the channel header
    /// (`CH_SENT`, `CH_RCVD`): messages only, the direct path sends no packets.
    fn counters(&self, side: usize) -> softverbs_transport::Counters {
        use std::sync::atomic::Ordering::Acquire;
        let sent = self.region.atomic_u64s(CH_SENT[side], 1)[0].load(Acquire);
        let r = self.region.atomic_u64s(CH_RCVD[side], CH_RCVD_WORDS);
        softverbs_transport::Counters {
            rdma_sends: sent,
            rdma_recvs: r[0].load(Acquire),
            rx_write_requests: r[1].load(Acquire),
            rx_read_requests: r[2].load(Acquire),
            rx_atomic_requests: r[3].load(Acquire),
            ..Default::default()
        }
    }
}

/// Direct-path state of the daemon.
#[derive(Debug, Default)]
pub struct Direct {
    ctxs: HashMap<CtxId, Opened>,
    pairs: HashMap<(u32, u32), Pair>,
    /// QPs whose library asked and was told to stay on the daemon path (until destroyed).
    declined: std::collections::HashSet<u32>,
    /// The counters of removed pairs' sides, by device: a port keeps them.
    retired: HashMap<usize, softverbs_transport::Counters>,
    /// Contexts whose pair memfd went with its pair, to be uncharged by the caller
    /// ([`Direct::take_released`]).
    released: Vec<CtxId>,
}

fn entry_size<T>() -> u32 {
    (std::mem::size_of::<T>() as u32).div_ceil(8) * 8
}

fn ring_capacity(max_recv_wr: u32) -> u32 {
    max_recv_wr.max(1).next_power_of_two()
}

impl Direct {
    /// `DirectOpen`: `mem` must be `/proc/<pid>/mem` of the context's opener; answers the MR
    /// table's memfd.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &mut self,
        core: &Core,
        dp: &DataPath,
        ctx: CtxId,
        uid: u32,
        pid: u32,
        caps: u32,
        mem: OwnedFd,
    ) -> Result<OwnedFd, i32> {
        let check = mem.try_clone().map_err(|_| ENOMEM)?;
        softverbs_memaccess::ProcessMemory::validate(check, pid).map_err(|_| EINVAL)?;
        let (table, fd) = Region::create("softverbs-mr-table", MRT_LEN).map_err(|_| ENOMEM)?;
        let give = fd.try_clone().map_err(|_| ENOMEM)?;
        self.ctxs.insert(
            ctx,
            Opened {
                uid,
                pid,
                mem,
                table,
                table_fd: fd,
                overflow: false,
                caps,
            },
        );
        self.mrs_changed(core, dp, ctx);
        Ok(give)
    }

    /// Whether `ctx` opened the direct path and its MR table holds every MR it has (at most
    /// [`MRT_CAPACITY`]): what a library needs to check keys itself (docs/design/net-path.md).
    pub fn table_complete(&self, ctx: CtxId) -> bool {
        self.ctxs.get(&ctx).is_some_and(|o| !o.overflow)
    }

    /// Whether `ctx` opened the direct path.
    pub fn is_open(&self, ctx: CtxId) -> bool {
        self.ctxs.contains_key(&ctx)
    }

    /// Whether `ctx`'s library takes receives from its peers' SRQs and lets its own SRQs be
    /// taken from (ABI 16): its basic SRQs are then fed ones (`datapath::fed_srq`).
    pub fn takes_srqs(&self, ctx: CtxId) -> bool {
        self.ctxs.get(&ctx).is_some_and(|o| o.caps & CAP_SRQ != 0)
    }

    /// Whether QP `qpn` is one side of a pair on the direct path.
    pub fn is_direct(&self, qpn: u32) -> bool {
        self.pairs.keys().any(|&(a, b)| a == qpn || b == qpn)
    }

    /// Direct-path QP `qpn`'s counters (docs/guide/counters.md).
    pub fn qp_counters(&self, qpn: u32) -> Option<softverbs_transport::Counters> {
        self.pairs.iter().find_map(|(&(a, b), p)| {
            let side = [a, b].iter().position(|&q| q == qpn)?;
            Some(p.counters(side))
        })
    }

    /// What device `device`'s direct-path QPs counted, those of removed pairs included.
    pub fn port_counters(&self, device: usize) -> softverbs_transport::Counters {
        let mut sum = self.retired.get(&device).copied().unwrap_or_default();
        for p in self.pairs.values() {
            for side in 0..2 {
                if p.dev[side] == device {
                    sum.add(&p.counters(side));
                }
            }
        }
        sum
    }

    /// A pair is removed: its counts stay in its ports' totals.
    fn retire(&mut self, p: &Pair) {
        for side in 0..2 {
            self.retired
                .entry(p.dev[side])
                .or_default()
                .add(&p.counters(side));
        }
    }

    /// The direct pairs for `resources` (docs/design/direct-path.md): the two QP numbers, whether
    /// each side's library has attached, and the channel's ring layout. Sorted, so that two
    /// snapshots of the same state print the same.
    pub fn pairs_json(&self) -> serde_json::Value {
        let mut pairs: Vec<_> = self.pairs.iter().collect();
        pairs.sort_by_key(|(k, _)| **k);
        let list = pairs
            .into_iter()
            .map(|(&(a, b), p)| {
                let stamped = p.resp.rings.get() & RINGS_STAMPED != 0;
                serde_json::json!({
                    "qpns": [a, b],
                    "attached": p.asked,
                    "rings": if stamped { "stamped" } else { "plain" },
                })
            })
            .collect();
        serde_json::Value::Array(list)
    }

    /// Whether `ctx`'s library reads stamped channel rings (ABI 19).
    fn reads_stamps(&self, ctx: CtxId) -> bool {
        self.ctxs
            .get(&ctx)
            .is_some_and(|o| o.caps & CAP_STAMPED != 0)
    }

    /// The SRQ behind the peer of direct QP `(ctx, qp)`, if it has one.
    pub fn peer_srq(&self, core: &Core, ctx: CtxId, qp: Handle) -> Option<(CtxId, Handle)> {
        let qpn = core.qp_num(ctx, qp).ok()?;
        let (&(a, b), p) = self
            .pairs
            .iter()
            .find(|(&(a, b), p)| (a == qpn && p.ctx[0] == ctx) || (b == qpn && p.ctx[1] == ctx))?;
        let pqpn = if qpn == a { b } else { a };
        let QpTarget::Owned {
            ctx: pctx,
            handle: ph,
            ..
        } = core.qp_target(pqpn)?
        else {
            return None;
        };
        (p.ctx.contains(&pctx)).then_some(())?;
        Some((pctx, core.owned_qp_info(pctx, ph)?.srq?))
    }

    /// Whether `(ctx, qp)`'s receives can be taken on the direct path: from its own queue,
    /// or from its SRQ when that is a fed one and both libraries take SRQ receives.
    fn receives_reachable(
        &self,
        dp: &DataPath,
        ctx: CtxId,
        srq: Option<Handle>,
        taker: CtxId,
    ) -> bool {
        srq.is_none_or(|h| self.takes_srqs(ctx) && self.takes_srqs(taker) && dp.is_fed_srq(ctx, h))
    }

    /// Rewrites `ctx`'s MR table after a registration changed (a seqlock: readers retry
    /// while the sequence is odd or moved).
    pub fn mrs_changed(&mut self, core: &Core, dp: &DataPath, ctx: CtxId) {
        let Some(o) = self.ctxs.get_mut(&ctx) else {
            return;
        };
        let mrs = core.context_mrs(ctx);
        o.overflow = mrs.len() > MRT_CAPACITY;
        let seq = &o.table.atomic_u64s(MRT_SEQ, 1)[0];
        let s = seq.load(std::sync::atomic::Ordering::Relaxed);
        seq.store(s.wrapping_add(1), std::sync::atomic::Ordering::Relaxed);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        for (i, &(key, pd, access, iova, len, addr)) in mrs.iter().take(MRT_CAPACITY).enumerate() {
            let e = MrEntry {
                key,
                pd: pd.0,
                access: access.0,
                flags: if dp.shared_mr_fd(ctx, addr, len).is_some() {
                    MR_SHARED
                } else {
                    0
                },
                iova,
                len,
                addr,
            };
            o.table.write(MRT_ENTRIES + i * MRT_ENTRY, &e.encode());
        }
        o.table.atomic_u32(MRT_COUNT).store(
            mrs.len().min(MRT_CAPACITY) as u32,
            std::sync::atomic::Ordering::Relaxed,
        );
        seq.store(s.wrapping_add(2), std::sync::atomic::Ordering::Release);
    }

    /// Why `(ctx, qp)` cannot go direct with the QP it names, or that peer: `(peer ctx,
    /// peer handle, own attributes, peer attributes)`.
    fn eligible(
        &self,
        core: &Core,
        dp: &DataPath,
        ctx: CtxId,
        qp: Handle,
    ) -> Option<(CtxId, Handle, u32, u32, QpAttr, QpAttr)> {
        let me = self.ctxs.get(&ctx)?;
        let info = core.owned_qp_info(ctx, qp)?;
        let q = core.query_qp(ctx, qp).ok()?;
        let ok_type = matches!(info.qp_type, QpType::Rc | QpType::Uc);
        if !ok_type || me.overflow {
            return None;
        }
        if !matches!(q.attr.qp_state, QpState::Rtr | QpState::Rts) {
            return None;
        }
        let QpTarget::Owned {
            ctx: pctx,
            handle: ph,
            qp_type,
        } = core.qp_target(q.attr.dest_qp_num)?
        else {
            return None;
        };
        let peer = self.ctxs.get(&pctx)?;
        // A QP connected to itself has no second library to ask: the engine loops it back.
        if (pctx, ph) == (ctx, qp) {
            return None;
        }
        if qp_type != info.qp_type || peer.uid != me.uid || peer.overflow {
            return None;
        }
        // Each side gets the other's memory descriptor: only if it could open it itself
        // (ptrace(2), "Ptrace access mode checking"): both processes still of that uid and
        // dumpable now. One that is not (PR_SET_DUMPABLE 0, a uid change since it connected)
        // keeps the pair on the daemon path (docs/design/direct-path.md, "Who goes direct").
        if !softverbs_memaccess::reachable_as(&peer.mem, peer.pid, me.uid)
            || !softverbs_memaccess::reachable_as(&me.mem, me.pid, peer.uid)
        {
            return None;
        }
        // The address must lead to the peer's own device (not another host that happens to
        // use the same QP number).
        let pdev = core.context_device(pctx).ok()?;
        let dgid = q.attr.ah_attr.dgid;
        let zero = softverbs_core::device::Gid::default();
        if dgid == zero || !pdev.ports.iter().any(|p| p.gids.contains(&dgid)) {
            return None;
        }
        let pinfo = core.owned_qp_info(pctx, ph)?;
        let pq = core.query_qp(pctx, ph).ok()?;
        // A device that captures records what its QPs exchange (issue 36 item 6): a pair
        // that bypassed the daemon would be missing from it (docs/guide/capture.md).
        if dp.captures(info.qpn) || dp.captures(pinfo.qpn) {
            return None;
        }
        // An SRQ's receives are reachable when its ring is the one queue (ABI 16).
        if !self.receives_reachable(dp, ctx, info.srq, pctx)
            || !self.receives_reachable(dp, pctx, pinfo.srq, ctx)
        {
            return None;
        }
        // Remote atomics and completion channels do not keep a pair off the direct path
        // (ABI 15, `ops`).
        let peer_connected = matches!(pq.attr.qp_state, QpState::Rtr | QpState::Rts);
        if peer_connected && pq.attr.dest_qp_num != info.qpn {
            return None;
        }
        if !matches!(
            pq.attr.qp_state,
            QpState::Reset | QpState::Init | QpState::Rtr | QpState::Rts
        ) {
            return None;
        }
        Some((pctx, ph, info.qpn, pinfo.qpn, q.attr, pq.attr))
    }

    /// CQ `cq` of `ctx` was armed (`true`) or fired (`false`): every direct pair whose side
    /// of `ctx` receives into it learns whether its peer's library must tell the daemon of
    /// the receive completions it produces (`CH_RECV_CHANNEL`). Stored `SeqCst` before the
    /// arm is answered: a producer that missed it pushed its completion before the owner's
    /// poll after arming.
    pub fn recv_cq_armed(&self, core: &Core, ctx: CtxId, cq: Handle, armed: bool) {
        for (&(lo, hi), pair) in &self.pairs {
            for (s, qpn) in [(0, lo), (1, hi)] {
                if pair.ctx[s] != ctx {
                    continue;
                }
                let Some(QpTarget::Owned { ctx: c, handle, .. }) = core.qp_target(qpn) else {
                    continue;
                };
                let into = core.owned_qp_info(c, handle).and_then(|i| i.recv_cq);
                if c == ctx && into == Some(cq) {
                    pair.region
                        .atomic_u32(CH_RECV_CHANNEL[s])
                        .store(u32::from(armed), std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
    }

    /// `DirectAttach`: the path of `(ctx, r.qp)`, with the channel and the peer's memory and
    /// MR table unless it is the daemon's. The first QP of a pair to ask decides for both,
    /// from what both QPs are (docs/design/direct-path.md, "Deciding"); the second joins, or, if it
    /// no longer fits (it connected elsewhere, or changed), leaves its partner a gone peer.
    pub fn attach(
        &mut self,
        core: &mut Core,
        dp: &DataPath,
        ctx: CtxId,
        r: &DirectAttachReq,
    ) -> Result<(DirectAttachResp, Vec<OwnedFd>), i32> {
        use std::sync::atomic::Ordering::Release;
        let qp = Handle(r.qp.get());
        let own_qpn = core.qp_num(ctx, qp).map_err(|e| e.errno())?;
        let daemon = DirectAttachResp {
            path: U32::new(PATH_DAEMON),
            ..Default::default()
        };
        let found = if r.able.get() & ABLE_DIRECT != 0 {
            self.eligible(core, dp, ctx, qp)
        } else {
            None
        };
        let Some((pctx, ph, qpn, pqpn, own_attr, peer_attr)) = found else {
            // Whatever pair this QP was half of loses it.
            self.decide_others(own_qpn, None);
            self.declined.insert(own_qpn);
            return Ok((daemon, Vec::new()));
        };
        let key = (qpn.min(pqpn), qpn.max(pqpn));
        let side = usize::from(qpn > pqpn);
        if self.pairs.get(&key).is_some_and(|p| p.asked[side]) {
            // Asked before: the QP was reset and connected again. Its partner holds the old
            // channel, whose rings are stale, so this connection is the engine's; the
            // partner finds its peer gone.
            self.decide_others(qpn, None);
            self.declined.insert(qpn);
            return Ok((daemon, Vec::new()));
        }
        self.declined.remove(&qpn);
        self.decide_others(qpn, Some(pqpn));
        if !self.pairs.contains_key(&key) {
            // A peer library asks right after its RTR (a command of its own, so this one may
            // come in between): only a peer that asked and was refused stays away.
            if self.declined.contains(&pqpn) {
                self.declined.insert(qpn);
                return Ok((daemon, Vec::new()));
            }
            // The channel's memfd is a descriptor the daemon keeps for the asker's uid: past
            // its share the pair stays on the daemon path, which needs none.
            if core
                .charge(ctx, softverbs_core::limits::Resource::Descriptors, 1)
                .is_err()
            {
                self.declined.insert(qpn);
                return Ok((daemon, Vec::new()));
            }
            let mut pair = match self.make_pair(core, [ctx, pctx], [qp, ph], side) {
                Ok(p) => p,
                Err(e) => {
                    core.uncharge(ctx, softverbs_core::limits::Resource::Descriptors, 1);
                    return Err(e);
                }
            };
            pair.dev[side] = dp.qp_device(qpn).unwrap_or_default();
            pair.dev[1 - side] = dp.qp_device(pqpn).unwrap_or_default();
            pair.region
                .atomic_u32(CH_STATE[1 - side])
                .store(SIDE_PENDING, Release);
            pair.region
                .atomic_u32(CH_ACCESS[1 - side])
                .store(peer_attr.qp_access_flags.0, Release);
            // Whose receive completions must raise events now (`CH_RECV_CHANNEL`,
            // `ops::notify`); `recv_cq_armed` keeps it up to date.
            for (s, (c, h)) in [(side, (ctx, qp)), (1 - side, (pctx, ph))] {
                let chan = core
                    .owned_qp_info(c, h)
                    .and_then(|i| i.recv_cq)
                    .is_some_and(|cq| dp.cq_armed(c, cq));
                pair.region
                    .atomic_u32(CH_RECV_CHANNEL[s])
                    .store(u32::from(chan), Release);
            }
            pair.region.atomic_u32(CH_PATH).store(PATH_DIRECT, Release);
            self.pairs.insert(key, pair);
        }
        let pair = self.pairs.get_mut(&key).expect("inserted");
        pair.asked[side] = true;
        pair.region
            .atomic_u32(CH_ACCESS[side])
            .store(own_attr.qp_access_flags.0, Release);
        pair.region
            .atomic_u32(CH_STATE[side])
            .store(SIDE_OPEN, Release);
        let mut resp = pair.resp;
        resp.path = U32::new(PATH_DIRECT);
        resp.side = U32::new(side as u32);
        resp.peer_qpn = U32::new(pqpn);
        let (own_pd, peer_pd) = (core.qp_pd(ctx, qp), core.qp_pd(pctx, ph));
        resp.own_pd = U32::new(own_pd.map_or(0, |p| p.pd.0));
        resp.peer_pd = U32::new(peer_pd.map_or(0, |p| p.pd.0));
        // Receive buffers are checked in their SRQ's PD (IBA 10.2.9), else the QP's.
        let srq_of = |c: CtxId, h: Handle| core.owned_qp_info(c, h).and_then(|i| i.srq);
        let recv_pd = |c: CtxId, h: Handle, qp_pd: Option<softverbs_core::datapath::PdRef>| {
            srq_of(c, h)
                .and_then(|s| core.srq_info(c, s))
                .map(|i| i.pd)
                .or(qp_pd)
                .map_or(0, |p| p.pd.0)
        };
        resp.recv_pd[side] = U32::new(recv_pd(ctx, qp, own_pd));
        resp.recv_pd[1 - side] = U32::new(recv_pd(pctx, ph, peer_pd));
        let peer = self.ctxs.get(&pctx).ok_or(EINVAL)?;
        let mut fds = vec![
            pair.fd.try_clone().map_err(|_| ENOMEM)?,
            peer.mem.try_clone().map_err(|_| ENOMEM)?,
            peer.table_fd.try_clone().map_err(|_| ENOMEM)?,
        ];
        if let Some(srq) = srq_of(pctx, ph) {
            // The peer receives through a fed SRQ (`eligible` checked): this library takes
            // from its ring.
            let share = dp.fed_srq_share(pctx, srq).ok_or(EINVAL)?;
            resp.srq_len = U64::new(share.len);
            resp.srq_capacity = U32::new(share.layout.capacity());
            resp.srq_entry = U32::new(share.layout.entry_size() as u32);
            resp.srq_limit = U32::new(share.limit_at);
            fds.push(share.fd);
        }
        Ok((resp, fds))
    }

    /// A pair `qpn` was half of with another partner than `partner` is decided for the
    /// daemon (the QP connected elsewhere or cannot go direct).
    fn decide_others(&mut self, qpn: u32, partner: Option<u32>) {
        let stale: Vec<(u32, u32)> = self
            .pairs
            .keys()
            .filter(|&&(a, b)| (a == qpn && Some(b) != partner) || (b == qpn && Some(a) != partner))
            .copied()
            .collect();
        for k in stale {
            if let Some(p) = self.pairs.remove(&k) {
                self.retire(&p);
                self.released.push(p.charged);
                // For its partner, the QP it went direct with is gone.
                let side = usize::from(k.1 == qpn);
                p.region
                    .atomic_u32(CH_STATE[side])
                    .store(SIDE_GONE, std::sync::atomic::Ordering::Release);
            }
        }
    }

    fn make_pair(
        &self,
        core: &Core,
        ctx: [CtxId; 2],
        qp: [Handle; 2],
        me: usize,
    ) -> Result<Pair, i32> {
        // Sides by QP number: `me` is the asker's side, qp[0]/ctx[0] the asker's.
        let (ctx_by_side, qp_by_side) = if me == 0 {
            (ctx, qp)
        } else {
            ([ctx[1], ctx[0]], [qp[1], qp[0]])
        };
        // A side on an SRQ may have as many receives completing as its SRQ holds (its own
        // receive ring stays empty): at least the SRQ ring's capacity (`datapath::fed_srq`).
        let caps: Vec<u32> = (0..2)
            .map(|s| {
                let (c, h) = (ctx_by_side[s], qp_by_side[s]);
                core.owned_qp_info(c, h).map_or(1, |i| {
                    match i.srq.and_then(|srq| core.srq_info(c, srq)) {
                        Some(srq) => ring_capacity(srq.attr.max_wr.saturating_add(1)).max(8),
                        None => ring_capacity(i.cap.max_recv_wr),
                    }
                })
            })
            .collect();
        let (rq_e, cqe_e) = (entry_size::<PostRecvReq>(), entry_size::<WcWire>());
        let mut off = CH_HEADER;
        let mut resp = DirectAttachResp {
            rq_entry: U32::new(rq_e),
            cqe_entry: U32::new(cqe_e),
            ..Default::default()
        };
        // Stamped rings only when both libraries read them: either side reads both kinds.
        let stamped = ctx.iter().all(|c| self.reads_stamps(*c));
        let layout = |cap, esz| {
            if stamped {
                RingLayout::stamped(cap, esz)
            } else {
                RingLayout::new(cap, esz)
            }
        };
        if stamped {
            resp.rings = U32::new(RINGS_STAMPED);
        }
        let mut rings = Vec::new();
        for (s, &cap) in caps.iter().enumerate() {
            let rq = layout(cap, rq_e).map_err(|_| EINVAL)?;
            let cq = layout(cap, cqe_e).map_err(|_| EINVAL)?;
            resp.rq_offset[s] = U32::new(off as u32);
            rings.push((rq, off));
            off += rq.size();
            resp.cqe_offset[s] = U32::new(off as u32);
            rings.push((cq, off));
            off += cq.size();
            resp.capacity[s] = U32::new(cap);
            // One inline-payload slot per receive completion (zero-filled: all free).
            off = off.next_multiple_of(128);
            resp.inline_offset[s] = U32::new(off as u32);
            off += cap as usize * inline::INLINE_SLOT;
        }
        resp.inline_slot = U32::new(inline::INLINE_SLOT as u32);
        resp.region_len = U64::new(off as u64);
        let (region, fd) = Region::create("softverbs-direct", off).map_err(|_| ENOMEM)?;
        for (l, o) in rings {
            l.init(&region, o).map_err(|_| EINVAL)?;
        }
        Ok(Pair {
            region,
            fd,
            charged: ctx[0],
            ctx: ctx_by_side,
            asked: [false, false],
            resp,
            dev: [0, 0],
        })
    }

    /// `DirectPeerError`: the peer of `(ctx, qp)` goes to ERR with `event`, as its engine
    /// would have put it after refusing the request (IBA 9.9.3: the responder's class of
    /// error). Returns the contexts that got the event.
    pub fn peer_error(
        &mut self,
        core: &mut Core,
        ctx: CtxId,
        qp: Handle,
        event: u32,
    ) -> Result<Vec<CtxId>, i32> {
        let event = match event {
            NO_EVENT => None,
            e => Some(EventType::from_raw(e).ok_or(EINVAL)?),
        };
        if !matches!(
            event,
            None | Some(EventType::QpAccessErr | EventType::QpReqErr | EventType::QpFatal)
        ) {
            return Err(EINVAL);
        }
        let qpn = core.qp_num(ctx, qp).map_err(|e| e.errno())?;
        let Some((&(a, b), pair)) = self
            .pairs
            .iter()
            .find(|(&(a, b), p)| (a == qpn && p.ctx[0] == ctx) || (b == qpn && p.ctx[1] == ctx))
        else {
            return Err(EINVAL);
        };
        let peer_side = usize::from(qpn == a);
        let pqpn = if qpn == a { b } else { a };
        pair.region
            .atomic_u32(CH_STATE[peer_side])
            .store(SIDE_ERROR, std::sync::atomic::Ordering::Release);
        let Some(QpTarget::Owned {
            ctx: pctx,
            handle: ph,
            ..
        }) = core.qp_target(pqpn)
        else {
            return Ok(Vec::new());
        };
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = core.modify_qp(pctx, ph, &attr, AttrMask::STATE);
        Ok(event.map_or_else(Vec::new, |e| core.raise_qp_event(pqpn, e)))
    }

    /// QP `qpn` was destroyed: its half of a pair is gone.
    pub fn qp_gone(&mut self, qpn: u32) {
        self.declined.remove(&qpn);
        let keys: Vec<(u32, u32)> = self
            .pairs
            .keys()
            .filter(|&&(a, b)| a == qpn || b == qpn)
            .copied()
            .collect();
        for k in keys {
            if let Some(p) = self.pairs.remove(&k) {
                self.retire(&p);
                self.released.push(p.charged);
                let side = usize::from(k.1 == qpn);
                p.region
                    .atomic_u32(CH_STATE[side])
                    .store(SIDE_GONE, std::sync::atomic::Ordering::Release);
            }
        }
    }

    /// `ctx` closed (its process may have died): every pair it held a side of says so to the
    /// survivor, whose library then fails its QP (docs/design/direct-path.md, "Peer death").
    pub fn context_closed(&mut self, ctx: CtxId, qpns: &[u32]) {
        self.ctxs.remove(&ctx);
        for q in qpns {
            self.declined.remove(q);
        }
        let keys: Vec<(u32, u32)> = self
            .pairs
            .iter()
            .filter(|(_, p)| p.ctx.contains(&ctx))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(p) = self.pairs.remove(&k) {
                self.retire(&p);
                self.released.push(p.charged);
                for (&c, &word) in p.ctx.iter().zip(CH_STATE.iter()) {
                    if c == ctx {
                        p.region
                            .atomic_u32(word)
                            .store(SIDE_GONE, std::sync::atomic::Ordering::Release);
                    }
                }
            }
        }
    }

    /// The contexts whose pair memfds were closed since the last call, one entry per
    /// descriptor: the caller gives each back to the context's share.
    pub fn take_released(&mut self) -> Vec<CtxId> {
        std::mem::take(&mut self.released)
    }

    /// Pairs and contexts held (introspection and tests).
    pub fn counts(&self) -> (usize, usize) {
        (self.ctxs.len(), self.pairs.len())
    }
}
