//! Memory windows (IBA 10.6.7; `ibv_alloc_mw(3)`, `ibv_bind_mw(3)`; docs/design/memory-windows.md).
//!
//! A window gives a peer access to part of an MR with rights of its own. Binding one is
//! work on a QP's send queue ([`Qp::bind_mw`] for type 1, a [`SendOp::BindMw`] request
//! for type 2) that completes with `IBV_WC_BIND_MW`; the daemon checks every rule and a
//! broken one completes with `IBV_WC_MW_BIND_ERR`. Soundness is the MR's: every kind of MR
//! already tolerates the daemon writing it at any moment (docs/guide/safe-api.md), and a window
//! only narrows what a peer reaches. An MR with a bound window cannot be deregistered
//! (`EINVAL`, IBA 10.6.7.2.6): unbind (type 1), invalidate (type 2) or drop the window
//! first — a [`BorrowedMr`](crate::BorrowedMr) whose deregistration fails aborts the process.

use std::marker::PhantomData;
use std::mem::ManuallyDrop;

use softverbs_abi::msg::{cmd, AllocMwReq, AllocMwResp};
use softverbs_core::types::Access;
use softverbs_core::wr::{BindMw, SendOp};
use zerocopy::little_endian::U32;

pub use softverbs_core::mw::MwType;

use crate::buffer::{BorrowedMr, OwnedMr, Remote};
use crate::context::Context;
use crate::datapath::SendRequest;
use crate::error::{errno, Error, Result};
use crate::objects::{destroy_plain, Pd, Qp};

/// A memory window (`struct ibv_mw`). Dropping it deallocates it, which invalidates it.
#[derive(Debug)]
pub struct Mw<'a> {
    ctx: &'a Context,
    handle: u32,
    mw_type: MwType,
    rkey: u32,
    _pd: PhantomData<&'a Pd<'a>>,
}

/// An MR a window can be bound over with the range checked before posting: the owned and
/// borrowed MRs of the safe API know their range (the raw [`Mr`](crate::Mr) goes through
/// [`Qp::bind_mw`] with its L_Key and an address).
pub trait WindowTarget {
    /// The MR's L_Key.
    fn target_lkey(&self) -> u32;
    /// The whole MR as peers address it (its own R_Key).
    fn target_range(&self) -> Remote;
}

impl WindowTarget for OwnedMr<'_> {
    fn target_lkey(&self) -> u32 {
        self.lkey()
    }
    fn target_range(&self) -> Remote {
        self.remote()
    }
}

impl WindowTarget for BorrowedMr<'_> {
    fn target_lkey(&self) -> u32 {
        self.lkey()
    }
    fn target_range(&self) -> Remote {
        self.remote()
    }
}

/// `[offset, offset+len)` of `mr`, or `EINVAL` for a range outside it (C10-75, known before
/// posting).
fn window_range(op: &'static str, mr: &impl WindowTarget, offset: u64, len: u64) -> Result<Remote> {
    mr.target_range()
        .slice(offset, len)
        .ok_or(Error::new(op, errno::EINVAL))
}

/// `ibv_inc_rkey(3)`: the next consumer key (the low 8 bits) of an R_Key.
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl<'c> Pd<'c> {
    /// `ibv_alloc_mw`: an unbound window of `mw_type` on this PD.
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<Mw<'_>> {
        let req = AllocMwReq {
            pd: U32::new(self.handle()),
            mw_type: U32::new(mw_type as u32),
        };
        let r: AllocMwResp = self
            .context()
            .conn
            .call::<cmd::AllocMw>("alloc_mw", 0, &req)?;
        Ok(Mw {
            ctx: self.context(),
            handle: r.handle.get(),
            mw_type,
            rkey: r.rkey.get(),
            _pd: PhantomData,
        })
    }
}

impl Mw<'_> {
    /// The daemon's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The window's R_Key as of its last bind this process posted (`mw->rkey`).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Its type.
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }

    /// Records the R_Key a type 2 bind posted with [`Mw::bind_request`] gave the window.
    pub fn set_rkey(&mut self, rkey: u32) {
        self.rkey = rkey;
    }

    /// A type 2 bind of this window (`IBV_WR_BIND_MW`) over `[addr, addr+length)` of the
    /// MR with L_Key `mr_lkey`, granting `access`, with the next consumer key: post it with
    /// [`Qp::post_send`] and record its `new_rkey` with [`Mw::set_rkey`] once it completed.
    pub fn bind_request(&self, mr_lkey: u32, addr: u64, length: u64, access: Access) -> BindMw {
        BindMw {
            mw_rkey: self.rkey,
            new_rkey: inc_rkey(self.rkey),
            mr_lkey,
            addr,
            length,
            access,
        }
    }

    /// [`bind_request`](Mw::bind_request) over `[offset, offset+len)` of `mr`, with what a
    /// peer will use once the bind completed (the window's new R_Key); `EINVAL` for a range
    /// outside the MR.
    pub fn bind_request_over(
        &self,
        mr: &impl WindowTarget,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<(BindMw, Remote)> {
        let r = window_range("bind_mw", mr, offset, len)?;
        let b = self.bind_request(mr.target_lkey(), r.addr, len, access);
        Ok((
            b,
            Remote {
                rkey: b.new_rkey,
                ..r
            },
        ))
    }

    /// `ibv_dealloc_mw`.
    pub fn dealloc(self) -> Result<()> {
        let this = ManuallyDrop::new(self);
        destroy_plain::<cmd::DeallocMw>(this.ctx, "dealloc_mw", this.handle)
    }
}

impl Drop for Mw<'_> {
    fn drop(&mut self) {
        let _ = destroy_plain::<cmd::DeallocMw>(self.ctx, "dealloc_mw", self.handle);
    }
}

impl Qp<'_> {
    /// [`bind_mw`](Qp::bind_mw) of type 1 window `mw` over `[offset, offset+len)` of `mr`,
    /// checked against the MR before posting (`EINVAL` outside it); returns what a peer uses
    /// once the bind completed: the window's range with its new R_Key.
    pub fn bind_mw_over(
        &self,
        wr_id: u64,
        mw: &mut Mw<'_>,
        mr: &impl WindowTarget,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<Remote> {
        let r = window_range("bind_mw", mr, offset, len)?;
        let rkey = self.bind_mw(wr_id, mw, mr.target_lkey(), r.addr, len, access)?;
        Ok(Remote { rkey, ..r })
    }

    /// `ibv_bind_mw`: binds type 1 window `mw` over `[addr, addr+length)` of the MR with
    /// L_Key `mr_lkey` (length 0 unbinds it), granting `access`, as a signaled request
    /// `wr_id` on this QP's send queue; on success `mw.rkey()` is the window's new R_Key
    /// (the next consumer key), valid once the bind completes successfully. A type 2 window,
    /// a window of another context or a zero-based bind is `EINVAL`, as `ibv_bind_mw` and
    /// rxe answer; every other rule is the daemon's, answered in the completion.
    pub fn bind_mw(
        &self,
        wr_id: u64,
        mw: &mut Mw<'_>,
        mr_lkey: u32,
        addr: u64,
        length: u64,
        access: Access,
    ) -> Result<u32> {
        if mw.mw_type != MwType::One || !std::ptr::eq(mw.ctx, self.ctx) {
            return Err(Error::new("bind_mw", errno::EINVAL));
        }
        if access.contains(Access::ZERO_BASED) {
            return Err(Error::new("bind_mw", errno::EINVAL));
        }
        let b = mw.bind_request(mr_lkey, addr, length, access);
        self.post_send(&SendRequest::new(wr_id, SendOp::BindMw(b), &[]))?;
        mw.rkey = b.new_rkey;
        Ok(b.new_rkey)
    }
}
