//! What the same-host direct path (docs/design/direct-path.md) asks of the data path: atomics and
//! memory-window operations run here, in the daemon's one thread, on the engines' windows
//! and the memory the engines use, so they are ordered with the engines' own atomics and
//! binds (`IBV_ATOMIC_HCA`: atomic among the device's atomics); and completion events for
//! completions the libraries keep themselves.

use std::os::fd::AsFd;

use softverbs_core::datapath::PdRef;
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::types::Access;
use softverbs_core::Core;
use softverbs_transport::wr::SendOp;
use softverbs_transport::{AtomicOp, Memory};

use super::{cq_id, DataPath};

/// Why a remote operation was refused: the responder's class of error (IBA 9.7.5.2.4,
/// 9.9.3), as `crates/transport/src/responder.rs` refuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteRefusal {
    /// R_Key, range, PD, access or window check failed: Remote Access Error.
    Access,
    /// The memory behind a checked key could not be reached: Remote Operational Error.
    Operational,
}

impl DataPath {
    fn engine_of(&self, qpn: u32) -> Option<&softverbs_transport::Engine> {
        self.qp_dev.get(&qpn).map(|&d| &self.devs[d].engine)
    }

    /// Checks an access of `range` needing `need` with `rkey` arriving on QP `qpn` of PD
    /// `pd`, as the responder does; the address in the owner's memory.
    pub fn direct_target(
        &self,
        core: &Core,
        qpn: u32,
        pd: PdRef,
        rkey: u32,
        range: (u64, u64),
        need: Access,
    ) -> Result<(CtxId, u64, bool), RemoteRefusal> {
        let e = self.engine_of(qpn).ok_or(RemoteRefusal::Access)?;
        let m = e
            .check_remote_key(core, qpn, pd, rkey, range, need)
            .map_err(|_| RemoteRefusal::Access)?;
        Ok((m.ctx, m.addr, m.on_demand))
    }

    /// An atomic on `[va, va+8)` through `rkey` arriving on QP `qpn` of PD `pd` (the
    /// responder's `execute_atomic` after its QP-level checks): the original value.
    pub fn direct_atomic(
        &mut self,
        core: &Core,
        qpn: u32,
        pd: PdRef,
        rkey: u32,
        va: u64,
        op: AtomicOp,
    ) -> Result<u64, RemoteRefusal> {
        let (ctx, addr, on_demand) =
            self.direct_target(core, qpn, pd, rkey, (va, 8), Access::REMOTE_ATOMIC)?;
        let orig = self.mem.atomic_for(on_demand, ctx, addr, op).map_err(|_| {
            // As the engine: an ODP access that finds no mapping is an access error.
            if on_demand {
                RemoteRefusal::Access
            } else {
                RemoteRefusal::Operational
            }
        })?;
        // The requester's library reads the word next through the owner's memory itself:
        // nothing of the atomic may stay held back here.
        self.mem.flush().map_err(|_| RemoteRefusal::Operational)?;
        Ok(orig)
    }

    /// A bind or local invalidate of direct QP `qpn` of PD `pd` on its device's windows.
    pub fn direct_local_op(&mut self, core: &Core, qpn: u32, pd: PdRef, op: SendOp) -> bool {
        let Some(&d) = self.qp_dev.get(&qpn) else {
            return false;
        };
        self.devs[d].engine.direct_local_op(core, qpn, pd, op)
    }

    /// A Send with Invalidate of `rkey` arriving on direct QP `qpn` of PD `pd`.
    pub fn direct_remote_invalidate(&mut self, qpn: u32, pd: PdRef, rkey: u32) -> bool {
        let Some(&d) = self.qp_dev.get(&qpn) else {
            return false;
        };
        self.devs[d].engine.direct_remote_invalidate(qpn, pd, rkey)
    }

    /// A completion the library keeps landed on CQ `cq` of `ctx`: an armed CQ fires its
    /// channel as for a completion of its own (ibv_req_notify_cq(3), IBA 11.4.2.2).
    pub fn direct_completed(&mut self, ctx: CtxId, cq: Handle, solicited: bool) {
        let Some(c) = self.cqs.get_mut(&cq_id(ctx, cq)) else {
            return;
        };
        let Some(h) = c.completed_elsewhere(solicited) else {
            return;
        };
        if let Some(ch) = self.channels.get_mut(&(ctx, h)) {
            ch.fired.fire(cq);
            softverbs_ipc::signal_eventfd(ch.efd.as_fd());
        }
    }
}

impl DataPath {
    /// Wakes CQ `cq` of `ctx` (if armed) at `at`: a direct QP's requests to a peer that
    /// stopped answering fail only when their retries would have run out, at the QP's own
    /// next poll, and a program blocked in `ibv_get_cq_event` must poll then.
    /// One wake per CQ is kept (the latest asked for), so a client cannot grow the list
    /// beyond its CQs.
    pub fn direct_wake_at(&mut self, at: std::time::Instant, ctx: CtxId, cq: Handle) {
        match self
            .direct_wakes
            .iter_mut()
            .find(|w| (w.1, w.2) == (ctx, cq))
        {
            Some(w) => w.0 = w.0.max(at),
            None => self.direct_wakes.push((at, ctx, cq)),
        }
    }

    /// Time until the next wake.
    pub(super) fn direct_next_wake(&self) -> Option<std::time::Duration> {
        let now = std::time::Instant::now();
        self.direct_wakes
            .iter()
            .map(|w| w.0.saturating_duration_since(now))
            .min()
    }

    /// Fires the wakes that are due.
    pub(super) fn direct_fire_due(&mut self) {
        if self.direct_wakes.is_empty() {
            return;
        }
        let now = std::time::Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = self.direct_wakes.drain(..).partition(|w| w.0 <= now);
        self.direct_wakes = later;
        for (_, ctx, cq) in due {
            self.direct_completed(ctx, cq, true);
        }
    }
}
