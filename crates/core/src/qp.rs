//! Queue pairs of every type: creation rules per type, modify (state machine + attribute
//! values), query and destroy. XRC receive QPs are reached here through handles and
//! delegated to [`crate::xrc_recv`].

use serde::{Deserialize, Serialize};

use crate::attr::{QpAttr, QpCap, QpInitAttr, QpInitInfo};
use crate::change::CoreChange;
use crate::core::{Core, HolderRef, OwnedQp, QpEntry, QpRoute, SrqKind};
use crate::device::Device;
use crate::error::{Error, ObjectKind, Result};
use crate::event::EventElement;
use crate::ids::{CtxId, Handle};
use crate::limits::{Resource, Ring};
use crate::objects::check_ah;
use crate::qp_state::{check_transition, strip_for_uverbs};
use crate::types::{Access, AttrMask as M, QpState, QpType, MAX_24BIT};

/// What `create_qp` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpCreated {
    /// The caller's QP handle.
    pub handle: Handle,
    /// The 24-bit QP number.
    pub qpn: u32,
    /// Granted capabilities.
    pub cap: QpCap,
}

/// What `query_qp` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpQuery {
    /// Current attributes.
    pub attr: QpAttr,
    /// Creation-time attributes.
    pub init: QpInitInfo,
}

/// Validates the values of a modify request (uverbs `modify_qp` and rxe `rxe_qp_chk_attr`)
/// and applies the masked fields to `cur`. The state-machine check has already passed.
pub(crate) fn apply_modify(
    dev: &Device,
    cur: &mut QpAttr,
    req: &QpAttr,
    mask: M,
    to: QpState,
) -> Result<()> {
    let from = cur.qp_state;
    if mask.contains(M::PORT) && dev.port(req.port_num).is_none() {
        return Err(Error::InvalidArgument("port_num"));
    }
    let port_num = if mask.contains(M::PORT) {
        req.port_num
    } else {
        cur.port_num
    };
    let port = dev.port(port_num).unwrap_or(&dev.ports[0]);
    if mask.contains(M::PKEY_INDEX) && req.pkey_index >= port.pkey_tbl_len {
        return Err(Error::InvalidArgument("pkey_index"));
    }
    if mask.contains(M::AV) {
        check_ah(dev, &req.ah_attr)?;
        // uverbs: on INIT->RTR the address vector must use the QP's own port.
        if from == QpState::Init && to == QpState::Rtr && req.ah_attr.port_num != port_num {
            return Err(Error::InvalidArgument(
                "address vector port differs from the QP port",
            ));
        }
    }
    if mask.contains(M::ALT_PATH) {
        check_ah(dev, &req.alt_ah_attr)?;
        let alt = dev
            .port(req.alt_port_num)
            .ok_or(Error::InvalidArgument("alt_port_num"))?;
        if req.alt_pkey_index >= alt.pkey_tbl_len {
            return Err(Error::InvalidArgument("alt_pkey_index"));
        }
        if req.alt_timeout > 31 {
            return Err(Error::InvalidArgument("alt_timeout above 31"));
        }
    }
    if mask.contains(M::PATH_MTU) && req.path_mtu > port.active_mtu {
        return Err(Error::InvalidArgument(
            "path_mtu above the port's active MTU",
        ));
    }
    // IBA 9.7.6.1.3 / 9.7.5.2.8: the timer fields are 5 bits, the retry counts 3 bits.
    if mask.contains(M::TIMEOUT) && req.timeout > 31 {
        return Err(Error::InvalidArgument("timeout above 31"));
    }
    if mask.contains(M::MIN_RNR_TIMER) && req.min_rnr_timer > 31 {
        return Err(Error::InvalidArgument("min_rnr_timer above 31"));
    }
    if mask.contains(M::RETRY_CNT) && req.retry_cnt > 7 {
        return Err(Error::InvalidArgument("retry_cnt above 7"));
    }
    if mask.contains(M::RNR_RETRY) && req.rnr_retry > 7 {
        return Err(Error::InvalidArgument("rnr_retry above 7"));
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC)
        && u32::from(req.max_rd_atomic) > dev.attr.max_qp_init_rd_atom
    {
        return Err(Error::InvalidArgument(
            "max_rd_atomic above max_qp_init_rd_atom",
        ));
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC)
        && u32::from(req.max_dest_rd_atomic) > dev.attr.max_qp_rd_atom
    {
        return Err(Error::InvalidArgument(
            "max_dest_rd_atomic above max_qp_rd_atom",
        ));
    }
    // `IBV_ACCESS_ON_DEMAND` is an MR flag, but callers pass an MR's flags to the QP too
    // (rdma-core's tests.test_odp does), and mlx5 and rxe ignore it there: accepted, not kept.
    let qp_access = Access(req.qp_access_flags.0 & !Access::ON_DEMAND.0);
    if mask.contains(M::ACCESS_FLAGS) && !Access::QP_ALLOWED.contains(qp_access) {
        return Err(Error::InvalidArgument("qp_access_flags"));
    }
    if mask.contains(M::PATH_MIG_STATE) && req.path_mig_state > 2 {
        return Err(Error::InvalidArgument("path_mig_state"));
    }
    if mask.contains(M::DEST_QPN) && req.dest_qp_num > MAX_24BIT {
        return Err(Error::InvalidArgument("dest_qp_num wider than 24 bits"));
    }

    // All checks passed: apply (IBA 11.2.5.2: a failed modify leaves the QP unchanged).
    if mask.contains(M::PORT) {
        cur.port_num = req.port_num;
    }
    if mask.contains(M::PKEY_INDEX) {
        cur.pkey_index = req.pkey_index;
    }
    if mask.contains(M::QKEY) {
        cur.qkey = req.qkey;
    }
    if mask.contains(M::AV) {
        cur.ah_attr = req.ah_attr;
    }
    if mask.contains(M::ALT_PATH) {
        cur.alt_ah_attr = req.alt_ah_attr;
        cur.alt_port_num = req.alt_port_num;
        cur.alt_pkey_index = req.alt_pkey_index;
        cur.alt_timeout = req.alt_timeout;
    }
    if mask.contains(M::PATH_MTU) {
        cur.path_mtu = req.path_mtu;
    }
    if mask.contains(M::TIMEOUT) {
        cur.timeout = req.timeout;
    }
    if mask.contains(M::RETRY_CNT) {
        cur.retry_cnt = req.retry_cnt;
    }
    if mask.contains(M::RNR_RETRY) {
        cur.rnr_retry = req.rnr_retry;
    }
    // PSNs are 24-bit (IBA 9.3.1); uverbs masks rather than rejects wider values.
    if mask.contains(M::RQ_PSN) {
        cur.rq_psn = req.rq_psn & MAX_24BIT;
    }
    if mask.contains(M::SQ_PSN) {
        cur.sq_psn = req.sq_psn & MAX_24BIT;
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) {
        cur.max_rd_atomic = req.max_rd_atomic;
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC) {
        cur.max_dest_rd_atomic = req.max_dest_rd_atomic;
    }
    if mask.contains(M::MIN_RNR_TIMER) {
        cur.min_rnr_timer = req.min_rnr_timer;
    }
    if mask.contains(M::ACCESS_FLAGS) {
        cur.qp_access_flags = qp_access;
    }
    if mask.contains(M::PATH_MIG_STATE) {
        cur.path_mig_state = req.path_mig_state;
    }
    if mask.contains(M::DEST_QPN) {
        cur.dest_qp_num = req.dest_qp_num;
    }
    if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
        cur.en_sqd_async_notify = req.en_sqd_async_notify;
    }
    cur.qp_state = to;
    cur.cur_qp_state = to;
    Ok(())
}

/// The full modify check for a user's request on a QP of type `t`: unknown bits, uverbs'
/// stripping, the state table, then the values. Returns the new attributes.
pub(crate) fn modify_attr(
    dev: &Device,
    t: QpType,
    cur: &QpAttr,
    req: &QpAttr,
    mask: M,
) -> Result<QpAttr> {
    if !M::KNOWN.contains(mask) {
        return Err(Error::UnknownAttributes(mask.without(M::KNOWN).0));
    }
    let mask = strip_for_uverbs(t, mask);
    let to = check_transition(t, cur.qp_state, mask, req.qp_state, req.cur_qp_state)?;
    let mut next = *cur;
    apply_modify(dev, &mut next, req, mask, to)?;
    Ok(next)
}

/// Inline bytes an XRC send QP's request entries give up against an RC QP's: mlx5's XRC send
/// WQE carries a 16-byte XRC segment (the destination SRQ number) that RC's lacks, so its
/// `max_inline_data` is 16 bytes smaller (rdma-core `providers/mlx5/verbs.c`, `_sq_overhead`:
/// `sizeof(struct mlx5_wqe_xrc_seg)` for `IBV_QPT_XRC_SEND`). softverbs reports the same
/// difference. Besides matching the hardware programs are tuned on, it is what tells
/// libfabric's XRC fi_infos from its RC ones: the verbs provider takes each domain's
/// `inject_size` from the largest inline its QP type accepts (`vrb_find_max_inline`), and
/// Open MPI 4.1 spreads ranks over every fi_info whose attributes are alike
/// (`opal_mca_common_ofi_select_provider`) — with equal inject sizes its ranks landed on RC
/// and XRC domains at random and could not connect (docs/guide/mpi.md, "Over XRC").
pub const XRC_SEND_INLINE_OVERHEAD: u32 = 16;

/// The largest `max_inline_data` a QP of type `t` may have on a device whose request entries
/// hold `dev_limit` inline bytes.
pub fn max_inline_data(dev_limit: u32, t: QpType) -> u32 {
    match t {
        QpType::XrcSend => dev_limit.saturating_sub(XRC_SEND_INLINE_OVERHEAD),
        _ => dev_limit,
    }
}

impl Core {
    fn check_caps(dev: &Device, t: QpType, cap: &QpCap) -> Result<()> {
        let a = &dev.attr;
        if cap.max_send_wr > a.max_qp_wr || cap.max_recv_wr > a.max_qp_wr {
            return Err(Error::InvalidArgument(
                "max_send_wr/max_recv_wr above max_qp_wr",
            ));
        }
        if cap.max_send_sge > a.max_sge || cap.max_recv_sge > a.max_sge {
            return Err(Error::InvalidArgument(
                "max_send_sge/max_recv_sge above max_sge",
            ));
        }
        if cap.max_inline_data > max_inline_data(a.max_inline_data, t) {
            return Err(Error::InvalidArgument(
                "max_inline_data above the device limit for the QP type",
            ));
        }
        Ok(())
    }

    /// `ibv_create_qp` / `ibv_create_qp_ex` for every type.
    ///
    /// Per type (uverbs `create_qp` and the ioctl `UVERBS_METHOD_QP_CREATE`):
    /// - RC, UC, UD: PD, send CQ and receive CQ required; an SRQ, if given, must be a basic
    ///   SRQ; an XRC domain is refused.
    /// - XRC_SEND: PD and send CQ required; SRQ and XRC domain refused; no receive queue
    ///   (receive caps forced to 0, a receive CQ ignored).
    /// - XRC_RECV: only an XRC domain; PD, CQs and SRQ refused. The QP is made by the core,
    ///   owned by nobody, and the caller gets the first handle on it.
    ///
    /// All missing/forbidden arguments are `EINVAL`; non-zero `create_flags` is `EOPNOTSUPP`.
    pub fn create_qp(&mut self, ctx: CtxId, init: &QpInitAttr) -> Result<QpCreated> {
        if init.create_flags != 0 {
            return Err(Error::NotSupported("QP create flags"));
        }
        if init.qp_type == QpType::XrcRecv {
            if init.pd.is_some()
                || init.send_cq.is_some()
                || init.recv_cq.is_some()
                || init.srq.is_some()
            {
                return Err(Error::InvalidArgument(
                    "an XRC receive QP takes only an XRC domain",
                ));
            }
            let xrcd_handle = init
                .xrcd
                .ok_or(Error::InvalidArgument("XRC receive QP needs an XRC domain"))?;
            let (handle, qpn) = self.create_xrc_recv_with_handle(ctx, xrcd_handle)?;
            return Ok(QpCreated {
                handle,
                qpn,
                cap: QpCap::default(),
            });
        }
        let c = self.ctx(ctx)?;
        let dev_idx = c.device;
        let dev = &self.devices[dev_idx];
        if init.xrcd.is_some() {
            return Err(Error::InvalidArgument(
                "only XRC receive QPs take an XRC domain",
            ));
        }
        let pd = init.pd.ok_or(Error::InvalidArgument("QP needs a PD"))?;
        if !c.pds.contains_key(&pd) {
            return Err(Error::InvalidHandle(ObjectKind::Pd));
        }
        let send_cq = init
            .send_cq
            .ok_or(Error::InvalidArgument("QP needs a send CQ"))?;
        if !c.cqs.contains_key(&send_cq) {
            return Err(Error::InvalidHandle(ObjectKind::Cq));
        }
        let mut cap = init.cap;
        let (recv_cq, srq) = if init.qp_type == QpType::XrcSend {
            if init.srq.is_some() {
                return Err(Error::InvalidArgument("an XRC send QP takes no SRQ"));
            }
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
            (None, None)
        } else {
            let recv_cq = init
                .recv_cq
                .ok_or(Error::InvalidArgument("QP needs a receive CQ"))?;
            if !c.cqs.contains_key(&recv_cq) {
                return Err(Error::InvalidHandle(ObjectKind::Cq));
            }
            if let Some(s) = init.srq {
                let srq = c
                    .srqs
                    .get(&s)
                    .ok_or(Error::InvalidHandle(ObjectKind::Srq))?;
                if !matches!(srq.kind, SrqKind::Basic) {
                    return Err(Error::InvalidArgument(
                        "an XRC SRQ cannot back a non-XRC QP",
                    ));
                }
                // With an SRQ the QP has no receive queue of its own.
                cap.max_recv_wr = 0;
                cap.max_recv_sge = 0;
            }
            (Some(recv_cq), init.srq)
        };
        Self::check_caps(dev, init.qp_type, &cap)?;
        if self.usage[dev_idx].qps >= dev.attr.max_qp {
            return Err(Error::NoResources("max_qp"));
        }
        self.admit(ctx, Resource::Qps, 1)?;
        let qpn = self.qpns.alloc().ok_or(Error::NoResources("QP numbers"))?;
        let handle = self.new_handle(ctx)?;
        let c = self.ctx_mut(ctx)?;
        c.pds.get_mut(&pd).expect("checked above").usecnt += 1;
        c.cqs.get_mut(&send_cq).expect("checked above").usecnt += 1;
        if let Some(r) = recv_cq {
            c.cqs.get_mut(&r).expect("checked above").usecnt += 1;
        }
        if let Some(s) = srq {
            c.srqs.get_mut(&s).expect("checked above").usecnt += 1;
        }
        let qp = OwnedQp {
            qpn,
            init: QpInitInfo {
                qp_type: init.qp_type,
                cap,
                sq_sig_all: init.sq_sig_all,
                create_flags: 0,
            },
            pd,
            send_cq,
            recv_cq,
            srq,
            attr: QpAttr {
                cap,
                ..QpAttr::default()
            },
            events_reported: 0,
        };
        c.qps.insert(handle, QpEntry::Owned(Box::new(qp)));
        self.qp_routes.insert(qpn, QpRoute::Owned { ctx, handle });
        self.usage[dev_idx].qps += 1;
        self.add_usage(ctx, Resource::Qps, 1);
        let info = self.owned_qp_info(ctx, handle).expect("inserted above");
        self.push_change(CoreChange::QpCreated {
            ctx,
            qp: handle,
            device: dev_idx,
            info,
        });
        Ok(QpCreated { handle, qpn, cap })
    }

    /// `ibv_modify_qp` on any QP handle, including a handle on a shared XRC receive QP (any
    /// holder may modify it; docs/design/xrc-semantics.md §1.4).
    pub fn modify_qp(&mut self, ctx: CtxId, qp: Handle, req: &QpAttr, mask: M) -> Result<()> {
        // uverbs refuses unknown mask bits before it looks the QP up.
        if !M::KNOWN.contains(mask) {
            return Err(Error::UnknownAttributes(mask.without(M::KNOWN).0));
        }
        let c = self.ctx(ctx)?;
        let dev = &self.devices[c.device];
        match c.qps.get(&qp).ok_or(Error::InvalidHandle(ObjectKind::Qp))? {
            QpEntry::Owned(q) => {
                let next = modify_attr(dev, q.init.qp_type, &q.attr, req, mask)?;
                let qpn = match self.ctx_mut(ctx)?.qps.get_mut(&qp) {
                    Some(QpEntry::Owned(q)) => {
                        q.attr = next;
                        q.qpn
                    }
                    _ => unreachable!("looked up above"),
                };
                self.push_change(CoreChange::QpModified { qpn, attr: next });
                Ok(())
            }
            QpEntry::XrcRecv { qpn, .. } => {
                let qpn = *qpn;
                self.modify_tgt(ctx, qpn, req, mask)
            }
        }
    }

    /// `ibv_query_qp` on any QP handle.
    pub fn query_qp(&self, ctx: CtxId, qp: Handle) -> Result<QpQuery> {
        let c = self.ctx(ctx)?;
        match c.qps.get(&qp).ok_or(Error::InvalidHandle(ObjectKind::Qp))? {
            QpEntry::Owned(q) => Ok(QpQuery {
                attr: q.attr,
                init: q.init,
            }),
            QpEntry::XrcRecv { qpn, .. } => self.query_tgt(*qpn),
        }
    }

    /// The QP number behind a handle.
    pub fn qp_num(&self, ctx: CtxId, qp: Handle) -> Result<u32> {
        match self
            .ctx(ctx)?
            .qps
            .get(&qp)
            .ok_or(Error::InvalidHandle(ObjectKind::Qp))?
        {
            QpEntry::Owned(q) => Ok(q.qpn),
            QpEntry::XrcRecv { qpn, .. } => Ok(*qpn),
        }
    }

    /// `ibv_destroy_qp`. For an owned QP this destroys it. For a handle on a shared XRC
    /// receive QP it closes only that handle and always succeeds; the QP itself goes when its
    /// last holder does (kernel `__ib_destroy_shared_qp`). Returns `events_reported` for the
    /// handle, which `ibv_destroy_qp` waits to see acknowledged.
    pub fn destroy_qp(&mut self, ctx: CtxId, qp: Handle) -> Result<u32> {
        let c = self.ctx_mut(ctx)?;
        let entry = c
            .qps
            .remove(&qp)
            .ok_or(Error::UnknownHandle(ObjectKind::Qp))?;
        c.events.purge(EventElement::Qp(qp));
        match entry {
            QpEntry::Owned(q) => {
                if let Some(p) = c.pds.get_mut(&q.pd) {
                    p.usecnt -= 1;
                }
                if let Some(cq) = c.cqs.get_mut(&q.send_cq) {
                    cq.usecnt -= 1;
                }
                if let Some(cq) = q.recv_cq.and_then(|h| c.cqs.get_mut(&h)) {
                    cq.usecnt -= 1;
                }
                if let Some(s) = q.srq.and_then(|h| c.srqs.get_mut(&h)) {
                    s.usecnt -= 1;
                }
                let dev = c.device;
                self.qp_routes.remove(&q.qpn);
                self.qpns.free(q.qpn);
                self.usage[dev].qps -= 1;
                self.uncharge(ctx, Resource::Qps, 1);
                self.detach_ring(ctx, Ring::Qp(qp));
                self.leave_mcast_groups(dev, q.qpn);
                self.push_change(CoreChange::QpDestroyed { qpn: q.qpn });
                Ok(q.events_reported)
            }
            QpEntry::XrcRecv { qpn, xrcd_handle } => {
                Ok(self.drop_holder(ctx, qpn, HolderRef::Handle(qp), xrcd_handle))
            }
        }
    }
}
