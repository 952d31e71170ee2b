//! Shared XRC receive (target) QPs: one real QP owned by the core, any number of holders,
//! and the three API faces that all end up here.
//!
//! - Upstream (`ibv_create_qp_ex(XRC_RECV)`, `ibv_open_qp`, `ibv_destroy_qp`): every
//!   create or open gives the caller a new QP handle; destroying a handle closes just that
//!   handle and succeeds (kernel `ib_open_qp`, `__ib_destroy_shared_qp`).
//! - Legacy OFED (`ibv_create/modify/query/reg/unreg/destroy_xrc_rcv_qp`): QPs are named by
//!   (domain, QP number); each context holds at most one registration per QP, created by
//!   `create` or `reg`; a second `reg` succeeds without a second reference; `destroy` means
//!   "unregister me" and never pulls the QP from under other holders.
//! - Minimal (Roland Dreier's proposal in the seed thread): `register(xrcd, None)` creates
//!   and registers, `register(xrcd, Some(qpn))` joins, `unregister` leaves.
//!
//! The real QP is destroyed exactly when its last holder of any kind goes, by explicit
//! call or by context teardown. Holders are kept in one ordered map keyed by
//! (QP number, context, how), so fan-out is a range scan over one QP's holders and every
//! join/leave is O(log n).

use serde::{Deserialize, Serialize};

use crate::attr::{QpAttr, QpCap, QpInitInfo};
use crate::change::CoreChange;
use crate::core::{Core, Holder, HolderKey, HolderKind, HolderRef, QpEntry, QpRoute, TgtQp};
use crate::error::{Error, Result};
use crate::event::{AsyncEvent, EventElement};
use crate::ids::{CtxId, Handle, XrcdId};
use crate::limits::Resource;
use crate::qp::{modify_attr, QpQuery};
use crate::types::{AttrMask, EventType, QpState, QpType};

/// One holder of a receive QP, for introspection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderInfo {
    /// The holding context.
    pub ctx: CtxId,
    /// Its client's pid.
    pub pid: u32,
    /// How it came to hold the QP.
    pub kind: HolderKind,
    /// Its handle, or the registration.
    pub via: HolderRef,
    /// Events read by this holder so far.
    pub events_reported: u32,
}

fn holder_range(qpn: u32) -> std::ops::RangeInclusive<HolderKey> {
    HolderKey {
        qpn,
        ctx: CtxId(0),
        via: HolderRef::Registration,
    }..=HolderKey {
        qpn,
        ctx: CtxId(u64::MAX),
        via: HolderRef::Handle(Handle(u32::MAX)),
    }
}

fn ctx_holder_range(qpn: u32, ctx: CtxId) -> std::ops::RangeInclusive<HolderKey> {
    HolderKey {
        qpn,
        ctx,
        via: HolderRef::Registration,
    }..=HolderKey {
        qpn,
        ctx,
        via: HolderRef::Handle(Handle(u32::MAX)),
    }
}

impl Core {
    /// Resolves `qpn` as a receive QP of the domain behind the caller's `xrcd_handle`: the
    /// only way a context reaches a QP it does not yet hold.
    fn tgt_in_domain(&self, ctx: CtxId, xrcd_handle: Handle, qpn: u32) -> Result<XrcdId> {
        let xrcd = self.xrcd_of_handle(ctx, xrcd_handle)?;
        match self.tgt_qps.get(&qpn) {
            Some(t) if t.xrcd == xrcd => Ok(xrcd),
            _ => Err(Error::QpNotInXrcd(qpn)),
        }
    }

    /// Makes the real QP in the domain behind `xrcd_handle`, with no holder yet.
    fn create_tgt(&mut self, ctx: CtxId, xrcd_handle: Handle) -> Result<u32> {
        let xrcd = self.xrcd_of_handle(ctx, xrcd_handle)?;
        let dev = self.ctx(ctx)?.device;
        if self.usage[dev].qps >= self.devices[dev].attr.max_qp {
            return Err(Error::NoResources("max_qp"));
        }
        // The creator's first holder is charged as one of its QPs.
        self.admit(ctx, Resource::Qps, 1)?;
        let qpn = self.qpns.alloc().ok_or(Error::NoResources("QP numbers"))?;
        self.tgt_qps.insert(
            qpn,
            TgtQp {
                xrcd,
                attr: QpAttr::default(),
                holders: 0,
            },
        );
        self.qp_routes.insert(qpn, QpRoute::XrcRecv);
        self.xrcds
            .get_mut(&xrcd)
            .expect("handle implies domain")
            .tgt_qps += 1;
        self.usage[dev].qps += 1;
        self.push_change(CoreChange::XrcRecvQpCreated { device: dev, qpn });
        Ok(qpn)
    }

    fn add_holder(
        &mut self,
        ctx: CtxId,
        qpn: u32,
        via: HolderRef,
        kind: HolderKind,
        xrcd_handle: Handle,
    ) {
        let c = self
            .contexts
            .get_mut(&ctx)
            .expect("caller resolved the context");
        c.xrcds
            .get_mut(&xrcd_handle)
            .expect("caller resolved the handle")
            .refcnt += 1;
        match via {
            HolderRef::Registration => {
                c.xrc_regs.insert(qpn, xrcd_handle);
            }
            HolderRef::Handle(h) => {
                c.qps.insert(h, QpEntry::XrcRecv { qpn, xrcd_handle });
            }
        }
        self.add_usage(ctx, Resource::Qps, 1);
        self.holders.insert(
            HolderKey { qpn, ctx, via },
            Holder {
                kind,
                events_reported: 0,
            },
        );
        self.tgt_qps
            .get_mut(&qpn)
            .expect("caller resolved the QP")
            .holders += 1;
    }

    /// Removes one holder: its context-side entries and unread events, then the shared part
    /// ([`Core::release_holder`]). Returns the holder's `events_reported`.
    pub(crate) fn drop_holder(
        &mut self,
        ctx: CtxId,
        qpn: u32,
        via: HolderRef,
        xrcd_handle: Handle,
    ) -> u32 {
        if let Some(c) = self.contexts.get_mut(&ctx) {
            if let Some(x) = c.xrcds.get_mut(&xrcd_handle) {
                x.refcnt -= 1;
            }
            match via {
                HolderRef::Registration => {
                    c.xrc_regs.remove(&qpn);
                    c.events.purge(EventElement::XrcRecvQpNum(qpn));
                }
                HolderRef::Handle(h) => {
                    c.qps.remove(&h);
                    c.events.purge(EventElement::Qp(h));
                }
            }
        }
        self.uncharge(ctx, Resource::Qps, 1);
        self.release_holder(qpn, ctx, via)
    }

    /// The shared part of a holder leaving: out of the holder map, and the real QP destroyed
    /// (giving back its domain count) if it was the last. Returns `events_reported`.
    pub(crate) fn release_holder(&mut self, qpn: u32, ctx: CtxId, via: HolderRef) -> u32 {
        let Some(holder) = self.holders.remove(&HolderKey { qpn, ctx, via }) else {
            return 0;
        };
        let t = self.tgt_qps.get_mut(&qpn).expect("a holder implies its QP");
        t.holders -= 1;
        if t.holders == 0 {
            let t = self.tgt_qps.remove(&qpn).expect("present above");
            self.qp_routes.remove(&qpn);
            self.qpns.free(qpn);
            let dev = self
                .xrcds
                .get(&t.xrcd)
                .expect("a QP implies its domain")
                .device;
            self.usage[dev].qps -= 1;
            self.release_xrcd_count(t.xrcd, |x| x.tgt_qps -= 1);
            self.push_change(CoreChange::QpDestroyed { qpn });
        }
        holder.events_reported
    }

    // ---- upstream face ------------------------------------------------------------------

    /// `ibv_create_qp_ex(XRC_RECV)`: the real QP plus the caller's first handle on it.
    pub(crate) fn create_xrc_recv_with_handle(
        &mut self,
        ctx: CtxId,
        xrcd_handle: Handle,
    ) -> Result<(Handle, u32)> {
        let qpn = self.create_tgt(ctx, xrcd_handle)?;
        let h = self.new_handle(ctx)?;
        self.add_holder(
            ctx,
            qpn,
            HolderRef::Handle(h),
            HolderKind::Creator,
            xrcd_handle,
        );
        Ok((h, qpn))
    }

    /// `ibv_open_qp`: a new handle on the receive QP `qpn` of the domain behind
    /// `xrcd_handle`. Only `XRC_RECV` can be opened, and only inside that domain (both
    /// `EINVAL`, kernel `ib_open_qp`). The same context may open a QP several times; each
    /// open is a distinct handle and holder.
    pub fn open_qp(
        &mut self,
        ctx: CtxId,
        xrcd_handle: Handle,
        qpn: u32,
        qp_type: QpType,
    ) -> Result<Handle> {
        if qp_type != QpType::XrcRecv {
            return Err(Error::InvalidArgument("only XRC receive QPs can be opened"));
        }
        self.tgt_in_domain(ctx, xrcd_handle, qpn)?;
        self.admit(ctx, Resource::Qps, 1)?;
        let h = self.new_handle(ctx)?;
        self.add_holder(
            ctx,
            qpn,
            HolderRef::Handle(h),
            HolderKind::Opened,
            xrcd_handle,
        );
        Ok(h)
    }

    // ---- legacy OFED face ---------------------------------------------------------------

    /// Legacy `ibv_create_xrc_rcv_qp`: creates a receive QP in the domain and registers the
    /// caller with it. Only the domain matters; legacy init attributes are ignored.
    pub fn create_xrc_rcv_qp(&mut self, ctx: CtxId, xrcd_handle: Handle) -> Result<u32> {
        let qpn = self.create_tgt(ctx, xrcd_handle)?;
        self.add_holder(
            ctx,
            qpn,
            HolderRef::Registration,
            HolderKind::Creator,
            xrcd_handle,
        );
        Ok(qpn)
    }

    /// Legacy `ibv_reg_xrc_rcv_qp`: registers the caller with an existing receive QP of the
    /// domain. A context that is already registered stays registered once (no second
    /// reference), as the seed patch's per-context list check did.
    pub fn reg_xrc_rcv_qp(&mut self, ctx: CtxId, xrcd_handle: Handle, qpn: u32) -> Result<()> {
        self.tgt_in_domain(ctx, xrcd_handle, qpn)?;
        if self.ctx(ctx)?.xrc_regs.contains_key(&qpn) {
            return Ok(());
        }
        self.admit(ctx, Resource::Qps, 1)?;
        self.add_holder(
            ctx,
            qpn,
            HolderRef::Registration,
            HolderKind::Registration,
            xrcd_handle,
        );
        Ok(())
    }

    /// Legacy `ibv_unreg_xrc_rcv_qp`: drops the caller's registration; the QP is destroyed if
    /// that was its last holder. `EINVAL` if the QP is not in that domain or the caller is
    /// not registered. Returns the registration's `events_reported`.
    pub fn unreg_xrc_rcv_qp(&mut self, ctx: CtxId, xrcd_handle: Handle, qpn: u32) -> Result<u32> {
        self.tgt_in_domain(ctx, xrcd_handle, qpn)?;
        self.unregister_xrc_rcv_qp_inner(ctx, qpn)
    }

    /// Legacy `ibv_destroy_xrc_rcv_qp`: the same as unregister. The thread's question "what
    /// if one process destroys while another is registered?" is answered here: only the
    /// caller's registration goes; the others keep the QP.
    pub fn destroy_xrc_rcv_qp(&mut self, ctx: CtxId, xrcd_handle: Handle, qpn: u32) -> Result<u32> {
        self.unreg_xrc_rcv_qp(ctx, xrcd_handle, qpn)
    }

    pub(crate) fn unregister_xrc_rcv_qp_inner(&mut self, ctx: CtxId, qpn: u32) -> Result<u32> {
        let xrcd_handle = *self
            .ctx(ctx)?
            .xrc_regs
            .get(&qpn)
            .ok_or(Error::NotRegistered(qpn))?;
        Ok(self.drop_holder(ctx, qpn, HolderRef::Registration, xrcd_handle))
    }

    /// Legacy `ibv_modify_xrc_rcv_qp`: any context holding the QP (by registration or
    /// handle) may modify it.
    pub fn modify_xrc_rcv_qp(
        &mut self,
        ctx: CtxId,
        xrcd_handle: Handle,
        qpn: u32,
        req: &QpAttr,
        mask: AttrMask,
    ) -> Result<()> {
        if !AttrMask::KNOWN.contains(mask) {
            return Err(Error::UnknownAttributes(mask.without(AttrMask::KNOWN).0));
        }
        self.tgt_in_domain(ctx, xrcd_handle, qpn)?;
        self.modify_tgt(ctx, qpn, req, mask)
    }

    /// Legacy `ibv_query_xrc_rcv_qp`: any context holding the QP may query it.
    pub fn query_xrc_rcv_qp(&self, ctx: CtxId, xrcd_handle: Handle, qpn: u32) -> Result<QpQuery> {
        self.tgt_in_domain(ctx, xrcd_handle, qpn)?;
        self.require_holder(ctx, qpn)?;
        self.query_tgt(qpn)
    }

    // ---- minimal face --------------------------------------------------------------------

    /// The minimal API proposed in the seed thread: `None` creates a receive QP and registers
    /// the caller; `Some(qpn)` registers with an existing one. Returns the QP number.
    pub fn register_xrc_rcv_qp(
        &mut self,
        ctx: CtxId,
        xrcd_handle: Handle,
        qpn: Option<u32>,
    ) -> Result<u32> {
        match qpn {
            None => self.create_xrc_rcv_qp(ctx, xrcd_handle),
            Some(n) => self.reg_xrc_rcv_qp(ctx, xrcd_handle, n).map(|()| n),
        }
    }

    /// The minimal API's `unregister`: leaves; the last one out destroys the QP.
    pub fn unregister_xrc_rcv_qp(
        &mut self,
        ctx: CtxId,
        xrcd_handle: Handle,
        qpn: u32,
    ) -> Result<u32> {
        self.unreg_xrc_rcv_qp(ctx, xrcd_handle, qpn)
    }

    // ---- shared by the faces -------------------------------------------------------------

    fn require_holder(&self, ctx: CtxId, qpn: u32) -> Result<()> {
        if self
            .holders
            .range(ctx_holder_range(qpn, ctx))
            .next()
            .is_none()
        {
            return Err(Error::NotRegistered(qpn));
        }
        Ok(())
    }

    pub(crate) fn modify_tgt(
        &mut self,
        ctx: CtxId,
        qpn: u32,
        req: &QpAttr,
        mask: AttrMask,
    ) -> Result<()> {
        self.require_holder(ctx, qpn)?;
        let t = self.tgt_qps.get(&qpn).ok_or(Error::QpNotInXrcd(qpn))?;
        let dev = &self.devices[self.xrcds[&t.xrcd].device];
        let next = modify_attr(dev, QpType::XrcRecv, &t.attr, req, mask)?;
        self.tgt_qps.get_mut(&qpn).expect("present above").attr = next;
        self.push_change(CoreChange::QpModified { qpn, attr: next });
        Ok(())
    }

    pub(crate) fn query_tgt(&self, qpn: u32) -> Result<QpQuery> {
        let t = self.tgt_qps.get(&qpn).ok_or(Error::QpNotInXrcd(qpn))?;
        Ok(QpQuery {
            attr: t.attr,
            // A receive QP has neither send nor receive queue, and never create flags.
            init: QpInitInfo {
                qp_type: QpType::XrcRecv,
                cap: QpCap::default(),
                sq_sig_all: false,
                create_flags: 0,
            },
        })
    }

    /// The holders of receive QP `qpn`, in (context, how) order.
    pub fn xrc_rcv_qp_holders(&self, qpn: u32) -> Vec<HolderInfo> {
        self.holders
            .range(holder_range(qpn))
            .map(|(k, h)| HolderInfo {
                ctx: k.ctx,
                pid: self.contexts.get(&k.ctx).map_or(0, |c| c.info.pid),
                kind: h.kind,
                via: k.via,
                events_reported: h.events_reported,
            })
            .collect()
    }

    /// True if `qpn` is a live XRC receive QP.
    pub fn xrc_rcv_qp_exists(&self, qpn: u32) -> bool {
        self.tgt_qps.contains_key(&qpn)
    }

    // ---- events --------------------------------------------------------------------------

    /// The contexts an event on QP `qpn` would reach ([`raise_qp_event`](Self::raise_qp_event)):
    /// its owner's, or every holder's of a receive QP. Empty for no such QP.
    pub fn qp_event_contexts(&self, qpn: u32) -> Vec<CtxId> {
        match self.qp_routes.get(&qpn).copied() {
            None => Vec::new(),
            Some(QpRoute::Owned { ctx, .. }) => vec![ctx],
            Some(QpRoute::XrcRecv) => {
                let mut v: Vec<CtxId> = self
                    .holders
                    .range(holder_range(qpn))
                    .map(|(k, _)| k.ctx)
                    .collect();
                v.dedup();
                v
            }
        }
    }

    /// Raises a QP-affiliated async event on QP `qpn` (IBA 11.6.3). An owned QP's event goes
    /// to its context. A receive QP's event goes once to every live holder — a handle holder
    /// sees its handle, a registration sees the QP number (legacy: with the XRC flag). This
    /// fan-out is done once, here in the core, as the thread's reviewers asked.
    ///
    /// Returns the contexts that got a new event (the daemon wakes their async fds).
    pub fn raise_qp_event(&mut self, qpn: u32, event_type: EventType) -> Vec<CtxId> {
        match self.qp_routes.get(&qpn).copied() {
            None => Vec::new(),
            Some(QpRoute::Owned { ctx, handle }) => {
                let ev = AsyncEvent {
                    event_type,
                    element: EventElement::Qp(handle),
                };
                if self.post_event(ctx, ev) {
                    vec![ctx]
                } else {
                    Vec::new()
                }
            }
            Some(QpRoute::XrcRecv) => {
                let targets: Vec<(CtxId, EventElement)> = self
                    .holders
                    .range(holder_range(qpn))
                    .map(|(k, _)| match k.via {
                        HolderRef::Registration => (k.ctx, EventElement::XrcRecvQpNum(qpn)),
                        HolderRef::Handle(h) => (k.ctx, EventElement::Qp(h)),
                    })
                    .collect();
                let mut woken = Vec::with_capacity(targets.len());
                for (ctx, element) in targets {
                    if self.post_event(
                        ctx,
                        AsyncEvent {
                            event_type,
                            element,
                        },
                    ) && woken.last() != Some(&ctx)
                    {
                        woken.push(ctx);
                    }
                }
                woken
            }
        }
    }

    /// Moves QP `qpn` to the error state and raises `event_type` on it (a transport-detected
    /// fatal condition, e.g. an XRC packet naming an SRQ outside the QP's domain raises
    /// `QP_ACCESS_ERR`; docs/design/xrc-semantics.md §5). Returns the contexts that got the event.
    pub fn fail_qp(&mut self, qpn: u32, event_type: EventType) -> Vec<CtxId> {
        if !self.qp_routes.contains_key(&qpn) {
            return Vec::new();
        }
        self.mark_qp_error(qpn);
        self.raise_qp_event(qpn, event_type)
    }

    /// Moves QP `qpn` to the error state without an async event (a requester error the
    /// transport reports through the failed work completion instead, IBA 10.7.3.1).
    pub fn mark_qp_error(&mut self, qpn: u32) {
        match self.qp_routes.get(&qpn).copied() {
            Some(QpRoute::Owned { ctx, handle }) => {
                if let Some(QpEntry::Owned(q)) = self
                    .contexts
                    .get_mut(&ctx)
                    .and_then(|c| c.qps.get_mut(&handle))
                {
                    q.attr.qp_state = QpState::Err;
                    q.attr.cur_qp_state = QpState::Err;
                }
            }
            Some(QpRoute::XrcRecv) => {
                if let Some(t) = self.tgt_qps.get_mut(&qpn) {
                    t.attr.qp_state = QpState::Err;
                    t.attr.cur_qp_state = QpState::Err;
                }
            }
            None => {}
        }
    }

    /// Raises an event on a CQ (`CQ_ERR`) or SRQ (`SRQ_ERR`, `SRQ_LIMIT_REACHED`) of one
    /// context; only the owner hears about its objects.
    pub fn raise_object_event(
        &mut self,
        ctx: CtxId,
        element: EventElement,
        event_type: EventType,
    ) -> bool {
        let exists = match (element, self.contexts.get(&ctx)) {
            (EventElement::Cq(h), Some(c)) => c.cqs.contains_key(&h),
            (EventElement::Srq(h), Some(c)) => c.srqs.contains_key(&h),
            _ => false,
        };
        exists
            && self.post_event(
                ctx,
                AsyncEvent {
                    event_type,
                    element,
                },
            )
    }

    /// Raises a port or device event on every context of `device` (`PORT_ACTIVE`,
    /// `PORT_ERR`, `GID_CHANGE`, `DEVICE_FATAL`). This is the one event that is inherently
    /// linear in the number of contexts: each of them must hear it.
    pub fn raise_device_event(
        &mut self,
        device: usize,
        element: EventElement,
        event_type: EventType,
    ) -> Vec<CtxId> {
        let targets: Vec<CtxId> = self
            .contexts
            .iter()
            .filter(|(_, c)| c.device == device)
            .map(|(id, _)| *id)
            .collect();
        targets
            .into_iter()
            .filter(|ctx| {
                self.post_event(
                    *ctx,
                    AsyncEvent {
                        event_type,
                        element,
                    },
                )
            })
            .collect()
    }
}
