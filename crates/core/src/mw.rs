//! Memory windows (IBA 10.6.7; `ibv_alloc_mw(3)`, `ibv_bind_mw(3)`): the objects the core
//! owns — a window's PD, type and R_Key index — and the one rule the core enforces for the
//! bindings the transport makes: an MR with windows bound to it cannot be deregistered or
//! re-registered (IBA 10.6.7.2.6; rxe answers `EINVAL`, and so does the core).
//!
//! A window's binding (MR, range, access, QP) lives in the transport engine of its device, as
//! a NIC holds a window's context: binds, local and remote invalidations are work the send
//! and receive queues do in order, and the engine reports to the core how many windows each
//! MR carries ([`Core::note_window_binding`]).
//!
//! R_Keys: a window's key is `index << 8 | consumer key` (the low 8 bits the consumer rotates
//! with `ibv_inc_rkey` on every bind), with the index taken from
//! [`MW_INDEX_FIRST`]`..=`[`MW_INDEX_LAST`], so every window key has its top bit set and MR
//! keys ([`crate::core::MR_KEY_LAST`] and below) never collide with one, whatever consumer
//! key a bind chooses.

use serde::{Deserialize, Serialize};

use crate::change::CoreChange;
use crate::core::Core;
use crate::datapath::PdRef;
use crate::error::{Error, ObjectKind, Result};
use crate::ids::{CtxId, Handle};
use crate::limits::Resource;
use crate::types::Access;

/// First window index: window R_Keys are `0x8000_0000` and up.
pub const MW_INDEX_FIRST: u32 = 0x80_0000;
/// Last window index.
pub const MW_INDEX_LAST: u32 = 0xFF_FFFF;

/// `enum ibv_mw_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound with `ibv_bind_mw`, associated with its PD only.
    One = 1,
    /// `IBV_MW_TYPE_2`: bound with an `IBV_WR_BIND_MW` work request, associated with the
    /// QP that bound it (type 2B: QP and PD are both checked, IBA 10.6.7.2.2).
    Two = 2,
}

impl MwType {
    /// The type of an `ibv_alloc_mw` request: only 1 and 2 exist (uverbs refuses any other
    /// with `EINVAL`).
    pub fn from_raw(v: u32) -> Result<MwType> {
        match v {
            1 => Ok(MwType::One),
            2 => Ok(MwType::Two),
            _ => Err(Error::InvalidArgument("memory window type")),
        }
    }
}

/// True if `rkey` names a memory window rather than an MR.
pub fn is_window_key(rkey: u32) -> bool {
    rkey >> 8 >= MW_INDEX_FIRST
}

/// What `alloc_mw` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MwAllocated {
    /// The window's handle.
    pub handle: Handle,
    /// Its first R_Key (consumer key 0); the window is not bound yet.
    pub rkey: u32,
}

/// What the transport mirrors of a window ([`CoreChange::MwAllocated`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwInfo {
    /// The window's PD.
    pub pd: PdRef,
    /// Its type.
    pub mw_type: MwType,
    /// Its R_Key at allocation.
    pub rkey: u32,
}

#[derive(Debug)]
pub(crate) struct Mw {
    pub(crate) pd: Handle,
    pub(crate) mw_type: MwType,
    pub(crate) rkey: u32,
}

/// An MR as a bind sees it (looked up by its L_Key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrForBind {
    /// Owner.
    pub ctx: CtxId,
    /// The MR handle.
    pub mr: Handle,
    /// The MR's PD.
    pub pd: PdRef,
    /// First address peers use.
    pub iova: u64,
    /// Length.
    pub length: u64,
    /// Its access flags.
    pub access: Access,
}

impl Core {
    /// `ibv_alloc_mw`: a window of `mw_type` on PD `pd`, unbound. Windows count against the
    /// device's `max_mw` and the context's MR quota (both are memory keys).
    pub fn alloc_mw(&mut self, ctx: CtxId, pd: Handle, mw_type: MwType) -> Result<MwAllocated> {
        let c = self.ctx(ctx)?;
        let dev = c.device;
        if !c.pds.contains_key(&pd) {
            return Err(Error::InvalidHandle(ObjectKind::Pd));
        }
        if self.usage[dev].mws >= self.devices[dev].attr.max_mw {
            return Err(Error::NoResources("max_mw"));
        }
        self.admit(ctx, Resource::Mrs, 1)?;
        let index = self
            .mw_indices
            .alloc()
            .ok_or(Error::NoResources("memory window keys"))?;
        let h = match self.new_handle(ctx) {
            Ok(h) => h,
            Err(e) => {
                self.mw_indices.free(index);
                return Err(e);
            }
        };
        let rkey = index << 8;
        let c = self.ctx_mut(ctx)?;
        c.mws.insert(h, Mw { pd, mw_type, rkey });
        c.pds.get_mut(&pd).expect("checked above").usecnt += 1;
        self.usage[dev].mws += 1;
        self.add_usage(ctx, Resource::Mrs, 1);
        self.push_change(CoreChange::MwAllocated {
            ctx,
            mw: h,
            device: dev,
            info: MwInfo {
                pd: PdRef { ctx, pd },
                mw_type,
                rkey,
            },
        });
        Ok(MwAllocated { handle: h, rkey })
    }

    /// `ibv_dealloc_mw`: the window's key stops resolving at once (a bound window is
    /// invalidated; IBA 10.6.7.1).
    pub fn dealloc_mw(&mut self, ctx: CtxId, mw: Handle) -> Result<()> {
        let c = self.ctx_mut(ctx)?;
        let m = c
            .mws
            .remove(&mw)
            .ok_or(Error::UnknownHandle(ObjectKind::Mw))?;
        if let Some(p) = c.pds.get_mut(&m.pd) {
            p.usecnt -= 1;
        }
        let dev = c.device;
        self.mw_indices.free(m.rkey >> 8);
        self.usage[dev].mws -= 1;
        self.uncharge(ctx, Resource::Mrs, 1);
        self.push_change(CoreChange::MwDeallocated {
            ctx,
            mw,
            device: dev,
            rkey: m.rkey,
        });
        Ok(())
    }

    /// The type and first R_Key of window `mw` of `ctx`.
    pub fn mw_info(&self, ctx: CtxId, mw: Handle) -> Result<(MwType, u32)> {
        let m = self
            .ctx(ctx)?
            .mws
            .get(&mw)
            .ok_or(Error::InvalidHandle(ObjectKind::Mw))?;
        Ok((m.mw_type, m.rkey))
    }

    /// The MR that L_Key `lkey` names, for a bind (the transport checks the bind's rules
    /// against it: C10-72..C10-75).
    pub fn mr_for_bind(&self, lkey: u32) -> Option<MrForBind> {
        let &(ctx, mr) = self.key_routes.get(&lkey)?;
        let m = self.contexts.get(&ctx)?.mrs.get(&mr)?;
        Some(MrForBind {
            ctx,
            mr,
            pd: PdRef { ctx, pd: m.pd },
            iova: m.iova,
            length: m.length,
            access: m.access,
        })
    }

    /// Whether PD `pd` has memory windows, or MRs a window may be bound to
    /// (`IBV_ACCESS_MW_BIND`): binds and window keys are checked by the daemon's engine only,
    /// so its QPs stay there (docs/design/net-path.md).
    pub fn pd_uses_windows(&self, pd: PdRef) -> bool {
        let Some(c) = self.contexts.get(&pd.ctx) else {
            return false;
        };
        c.mws.values().any(|w| w.pd == pd.pd)
            || c.mrs
                .values()
                .any(|m| m.pd == pd.pd && m.access.contains(Access::MW_BIND))
    }

    /// The transport bound (`bound`) or unbound a window on MR `mr`: while any is bound the
    /// MR cannot be deregistered or re-registered.
    pub fn note_window_binding(&mut self, ctx: CtxId, mr: Handle, bound: bool) {
        if let Some(m) = self.contexts.get_mut(&ctx).and_then(|c| c.mrs.get_mut(&mr)) {
            if bound {
                m.bound_mws += 1;
            } else {
                m.bound_mws = m.bound_mws.saturating_sub(1);
            }
        }
    }

    /// How many windows are bound to MR `mr`.
    pub fn bound_windows(&self, ctx: CtxId, mr: Handle) -> u32 {
        self.contexts
            .get(&ctx)
            .and_then(|c| c.mrs.get(&mr))
            .map_or(0, |m| m.bound_mws)
    }
}
