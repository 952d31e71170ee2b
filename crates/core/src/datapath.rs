//! Lookups the transport makes per packet or work request: memory keys with their access,
//! bounds and PD checks, QP numbers, and the XRC rule that a receive QP may only deliver into
//! SRQs of its own domain.

use serde::{Deserialize, Serialize};

use crate::core::{Core, QpEntry, QpRoute, SrqKind};
use crate::ids::{CtxId, Handle};
use crate::types::{Access, QpType};

/// A protection domain, globally named (PDs are per context).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PdRef {
    /// Owning context.
    pub ctx: CtxId,
    /// PD handle in that context.
    pub pd: Handle,
}

/// Why a memory access was refused. The transport turns these into a local protection
/// error completion (lkey) or a NAK remote access error (rkey) (IBA 9.7.5.2.4, 10.6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// No MR has this key (never registered, or deregistered).
    #[error("unknown memory key")]
    UnknownKey,
    /// The MR belongs to another protection domain.
    #[error("memory key of another protection domain")]
    WrongPd,
    /// The range is not inside the MR.
    #[error("access outside the memory region")]
    OutOfBounds,
    /// The MR does not grant the access.
    #[error("memory region does not grant this access")]
    AccessDenied,
}

/// A checked memory access: where in the owner's address space to read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemTarget {
    /// Context that registered the memory.
    pub ctx: CtxId,
    /// The MR handle.
    pub mr: Handle,
    /// Address in the owner's address space.
    pub addr: u64,
    /// Length of the access.
    pub len: u64,
    /// The MR was registered with `IBV_ACCESS_ON_DEMAND`: the access must reach the memory
    /// as the owner maps it now (never a mapping kept from registration), and finding none
    /// is the access error a NIC reports for a failed ODP page fault (a remote access error
    /// NAK on the responder, `IBV_WC_LOC_PROT_ERR` locally; docs/design/registered-memory.md).
    pub on_demand: bool,
}

/// What a QP number leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QpTarget {
    /// A QP owned by one context.
    Owned {
        /// Owner.
        ctx: CtxId,
        /// Handle in the owner.
        handle: Handle,
        /// Type.
        qp_type: QpType,
    },
    /// A shared XRC receive QP.
    XrcRecv,
}

/// Why an XRC request cannot be delivered to the SRQ its XRCETH names (docs/design/xrc-semantics.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum XrcDeliveryError {
    /// The QP number is not a live XRC receive QP.
    #[error("not an XRC receive QP")]
    NotXrcRecv,
    /// No XRC SRQ has this number.
    #[error("no XRC SRQ with this number")]
    UnknownSrq,
    /// The SRQ belongs to another XRC domain than the receive QP.
    #[error("SRQ of another XRC domain")]
    OtherDomain,
}

/// Where an XRC request lands: the SRQ named in XRCETH, its owner, PD and CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XrcSrqTarget {
    /// Owner of the SRQ.
    pub ctx: CtxId,
    /// SRQ handle in the owner.
    pub srq: Handle,
    /// The SRQ's CQ, where receive completions go.
    pub cq: Handle,
    /// The SRQ's PD, which RDMA and atomic requests are checked against.
    pub pd: PdRef,
}

/// What the transport needs to mirror an owned QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnedQpInfo {
    /// QP number.
    pub qpn: u32,
    /// Type.
    pub qp_type: QpType,
    /// PD.
    pub pd: PdRef,
    /// Send CQ handle.
    pub send_cq: Handle,
    /// Receive CQ handle.
    pub recv_cq: Option<Handle>,
    /// SRQ handle.
    pub srq: Option<Handle>,
    /// Granted capabilities.
    pub cap: crate::attr::QpCap,
    /// Every send WR signaled.
    pub sq_sig_all: bool,
}

/// What the transport needs to mirror an SRQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqInfo {
    /// PD of its buffers.
    pub pd: PdRef,
    /// The XRC SRQ's CQ.
    pub cq: Option<Handle>,
    /// Attributes.
    pub attr: crate::attr::SrqAttr,
}

impl Core {
    /// The facts of an owned QP the transport mirrors.
    pub fn owned_qp_info(&self, ctx: CtxId, qp: Handle) -> Option<OwnedQpInfo> {
        match self.contexts.get(&ctx)?.qps.get(&qp)? {
            QpEntry::Owned(q) => Some(OwnedQpInfo {
                qpn: q.qpn,
                qp_type: q.init.qp_type,
                pd: PdRef { ctx, pd: q.pd },
                send_cq: q.send_cq,
                recv_cq: q.recv_cq,
                srq: q.srq,
                cap: q.init.cap,
                sq_sig_all: q.init.sq_sig_all,
            }),
            QpEntry::XrcRecv { .. } => None,
        }
    }

    /// The facts of an SRQ the transport mirrors.
    pub fn srq_info(&self, ctx: CtxId, srq: Handle) -> Option<SrqInfo> {
        let s = self.contexts.get(&ctx)?.srqs.get(&srq)?;
        let cq = match s.kind {
            SrqKind::Xrc { cq, .. } => Some(cq),
            SrqKind::Basic => None,
        };
        Some(SrqInfo {
            pd: PdRef { ctx, pd: s.pd },
            cq,
            attr: s.attr,
        })
    }

    /// Every QP number a context touches: its owned QPs and the receive QPs it holds.
    pub fn context_qpns(&self, ctx: CtxId) -> Vec<u32> {
        let Some(c) = self.contexts.get(&ctx) else {
            return Vec::new();
        };
        let mut v: Vec<u32> = c
            .qps
            .values()
            .map(|e| match e {
                QpEntry::Owned(q) => q.qpn,
                QpEntry::XrcRecv { qpn, .. } => *qpn,
            })
            .chain(c.xrc_regs.keys().copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Checks an access with memory key `key` to `[va, va+len)` on behalf of a QP in `pd`,
    /// needing `need` (empty for a local read, `LOCAL_WRITE` for a local write, a remote flag
    /// for a peer's request).
    pub fn check_mem(
        &self,
        pd: PdRef,
        key: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<MemTarget, MemError> {
        let &(ctx, mr) = self.key_routes.get(&key).ok_or(MemError::UnknownKey)?;
        let m = self
            .contexts
            .get(&ctx)
            .and_then(|c| c.mrs.get(&mr))
            .ok_or(MemError::UnknownKey)?;
        if ctx != pd.ctx || m.pd != pd.pd {
            return Err(MemError::WrongPd);
        }
        let end = va.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if va < m.iova || end > m.iova + m.length {
            return Err(MemError::OutOfBounds);
        }
        if !m.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        Ok(MemTarget {
            ctx,
            mr,
            addr: m.addr + (va - m.iova),
            len,
            on_demand: m.access.contains(Access::ON_DEMAND),
        })
    }

    /// What QP number `qpn` leads to.
    pub fn qp_target(&self, qpn: u32) -> Option<QpTarget> {
        match *self.qp_routes.get(&qpn)? {
            QpRoute::XrcRecv => Some(QpTarget::XrcRecv),
            QpRoute::Owned { ctx, handle } => match self.contexts.get(&ctx)?.qps.get(&handle)? {
                QpEntry::Owned(q) => Some(QpTarget::Owned {
                    ctx,
                    handle,
                    qp_type: q.init.qp_type,
                }),
                QpEntry::XrcRecv { .. } => None,
            },
        }
    }

    /// A context's MRs as `(key, pd, access, iova, length, addr)`, for the MR table the
    /// same-host direct path checks peers' keys against (docs/design/direct-path.md).
    pub fn context_mrs(&self, ctx: CtxId) -> Vec<(u32, Handle, Access, u64, u64, u64)> {
        let Some(c) = self.contexts.get(&ctx) else {
            return Vec::new();
        };
        let mut v: Vec<_> = c
            .mrs
            .values()
            .map(|m| (m.key, m.pd, m.access, m.iova, m.length, m.addr))
            .collect();
        v.sort_by_key(|e| e.0);
        v
    }

    /// The PD of an owned QP.
    pub fn qp_pd(&self, ctx: CtxId, qp: Handle) -> Option<PdRef> {
        match self.contexts.get(&ctx)?.qps.get(&qp)? {
            QpEntry::Owned(q) => Some(PdRef { ctx, pd: q.pd }),
            QpEntry::XrcRecv { .. } => None,
        }
    }

    /// Resolves the SRQ number an XRC request names for receive QP `qpn`: the SRQ must exist,
    /// be an XRC SRQ and belong to the receive QP's domain (docs/design/xrc-semantics.md §5; the
    /// domain is the whole point of XRC: it limits which SRQs a message may target).
    pub fn resolve_xrc_srq(&self, qpn: u32, srqn: u32) -> Result<XrcSrqTarget, XrcDeliveryError> {
        let tgt = self.tgt_qps.get(&qpn).ok_or(XrcDeliveryError::NotXrcRecv)?;
        let &(ctx, srq) = self
            .srq_routes
            .get(&srqn)
            .ok_or(XrcDeliveryError::UnknownSrq)?;
        let s = self
            .contexts
            .get(&ctx)
            .and_then(|c| c.srqs.get(&srq))
            .ok_or(XrcDeliveryError::UnknownSrq)?;
        match s.kind {
            SrqKind::Xrc { xrcd, cq, .. } if xrcd == tgt.xrcd => Ok(XrcSrqTarget {
                ctx,
                srq,
                cq,
                pd: PdRef { ctx, pd: s.pd },
            }),
            SrqKind::Xrc { .. } => Err(XrcDeliveryError::OtherDomain),
            SrqKind::Basic => Err(XrcDeliveryError::UnknownSrq),
        }
    }
}

/// The two questions the transport engine asks about keys while it moves data: whether a
/// key names memory a request may touch (every SGE, R_Key and window target,
/// `crates/transport/src/sge.rs`, `crates/transport/src/mw.rs`), and what an MR to bind a
/// window to is. The daemon answers from its [`Core`](crate::Core); a client library that
/// runs the engine for its own QPs answers from its own MR table
/// (`crates/client/src/direct/net.rs`).
pub trait MemKeys {
    /// As [`Core::check_mem`](crate::Core::check_mem).
    fn check_mem(
        &self,
        pd: PdRef,
        key: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<MemTarget, MemError>;
    /// As [`Core::mr_for_bind`](crate::Core::mr_for_bind).
    fn mr_for_bind(&self, lkey: u32) -> Option<crate::mw::MrForBind>;
    /// As [`Core::resolve_xrc_srq`](crate::Core::resolve_xrc_srq): only the daemon holds
    /// XRC receive QPs, so a library's table knows no XRC SRQ.
    fn resolve_xrc_srq(&self, qpn: u32, srqn: u32) -> Result<XrcSrqTarget, XrcDeliveryError>;
}

impl MemKeys for crate::Core {
    fn check_mem(
        &self,
        pd: PdRef,
        key: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<MemTarget, MemError> {
        crate::Core::check_mem(self, pd, key, va, len, need)
    }

    fn mr_for_bind(&self, lkey: u32) -> Option<crate::mw::MrForBind> {
        crate::Core::mr_for_bind(self, lkey)
    }

    fn resolve_xrc_srq(&self, qpn: u32, srqn: u32) -> Result<XrcSrqTarget, XrcDeliveryError> {
        crate::Core::resolve_xrc_srq(self, qpn, srqn)
    }
}
