//! XRC domains, XRC SRQs and shared XRC receive QPs in their three faces.
//!
//! - Upstream: [`Xrcd::create_recv_qp`] / [`Xrcd::open_recv_qp`] give [`XrcRecvQp`] handles;
//!   each is one holder in the daemon, and dropping it closes just that handle (the QP goes
//!   with its last holder).
//! - Legacy OFED: QPs are named by number on every call; [`Xrcd::create_xrc_rcv_qp`] and
//!   [`Xrcd::reg_xrc_rcv_qp`] give [`XrcRegistration`]s.
//! - Minimal: [`Xrcd::register_xrc_rcv_qp`] (`None` creates) gives [`XrcRegistration`]s.
//!
//! The daemon keeps one registration per (context, QP) however often the context registers,
//! so the context counts its [`XrcRegistration`] objects per QP number and sends the
//! unregister only when the last one for a QP goes.

use std::collections::HashMap;
use std::fs::File;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::os::fd::AsFd;
use std::sync::MutexGuard;

use softverbs_abi::msg::cmd;
use softverbs_abi::msg::{
    CreateXrcSrqReq, EventsResp, ModifyXrcRcvQpReq, OpenQpReq, OpenXrcdReq, OpenXrcdResp,
    QpAttrWire, QpNumResp, QueryQpResp, SrqResp, XrcRcvQpReq, XrcdReq, CREATE_NEW_QP, PRESENT_CQ,
    PRESENT_PD, PRESENT_XRCD,
};
use softverbs_core::attr::{QpAttr, SrqAttr};
use softverbs_core::types::{AttrMask, QpType};
use zerocopy::little_endian::U32;

use crate::context::Context;
use crate::convert;
use crate::error::{errno, Error, Result};
use crate::objects::{
    destroy_events, destroy_plain, modify_qp, query_qp, Cq, Pd, QpCreate, QpQuery, Srq,
};

/// Per-context count of live [`XrcRegistration`]s per QP number. Each entry has a
/// generation, so a registration that outlived its entry (the raw legacy destroy dropped
/// the daemon's registration under it) cannot decrement a newer one.
#[derive(Debug, Default)]
pub(crate) struct RegTable {
    next_gen: u64,
    map: HashMap<u32, (u64, u32)>,
}

/// What releasing one registration object means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// It was the last for its QP: unregister in the daemon.
    Last,
    /// Others remain: nothing to send.
    Held,
    /// Its entry is gone already: nothing to send.
    Stale,
}

impl RegTable {
    /// Counts one more registration object for `qpn`; returns its generation.
    pub(crate) fn acquire(&mut self, qpn: u32) -> u64 {
        let next = &mut self.next_gen;
        let e = self.map.entry(qpn).or_insert_with(|| {
            *next += 1;
            (*next, 0)
        });
        e.1 += 1;
        e.0
    }

    /// Counts one registration object of generation `gen` for `qpn` gone.
    pub(crate) fn release(&mut self, qpn: u32, gen: u64) -> Release {
        match self.map.get_mut(&qpn) {
            Some((g, n)) if *g == gen => {
                *n -= 1;
                if *n == 0 {
                    self.map.remove(&qpn);
                    Release::Last
                } else {
                    Release::Held
                }
            }
            _ => Release::Stale,
        }
    }

    /// Drops the entry of `qpn` (the daemon no longer holds a registration).
    pub(crate) fn forget(&mut self, qpn: u32) {
        self.map.remove(&qpn);
    }

    /// Live registration objects for `qpn`.
    pub(crate) fn count(&self, qpn: u32) -> u32 {
        self.map.get(&qpn).map_or(0, |e| e.1)
    }
}

fn lock_regs(ctx: &Context) -> MutexGuard<'_, RegTable> {
    ctx.regs.lock().unwrap_or_else(|e| e.into_inner())
}

fn rcv_req(xrcd: u32, qpn: u32) -> XrcRcvQpReq {
    XrcRcvQpReq {
        xrcd: U32::new(xrcd),
        qp_num: U32::new(qpn),
    }
}

/// The minimal face's register request: `None` asks for a new QP.
pub(crate) fn register_req(xrcd: u32, qpn: Option<u32>) -> XrcRcvQpReq {
    rcv_req(xrcd, qpn.unwrap_or(CREATE_NEW_QP))
}

impl Context {
    /// `ibv_open_xrcd`: the domain of `file` (shared by every opener of the same file on
    /// this device), or a new private domain for `None`. `oflags` takes
    /// [`O_CREAT`](crate::O_CREAT) and [`O_EXCL`](crate::O_EXCL): no domain yet and no
    /// `O_CREAT` is `EAGAIN`; a domain and `O_EXCL` is `EINVAL`.
    pub fn open_xrcd(&self, file: Option<&File>, oflags: u32) -> Result<Xrcd<'_>> {
        const OP: &str = "open_xrcd";
        let req = OpenXrcdReq {
            oflags: U32::new(oflags),
            has_fd: U32::new(u32::from(file.is_some())),
        };
        let fds: Vec<_> = file.iter().map(|f| f.as_fd()).collect();
        let (r, _): (OpenXrcdResp, _) = self.conn.call_fds::<cmd::OpenXrcd>(OP, 0, &req, &fds)?;
        Ok(Xrcd {
            ctx: self,
            handle: r.handle.get(),
            xrcd_id: r.xrcd_id.get(),
            created: r.created.get() != 0,
        })
    }
}

/// An open XRC domain (`struct ibv_xrcd`): this context's handle on it. Dropping it closes
/// the handle (errors ignored).
#[derive(Debug)]
pub struct Xrcd<'c> {
    ctx: &'c Context,
    handle: u32,
    xrcd_id: u64,
    created: bool,
}

/// Which unregister a registration sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Face {
    Legacy,
    Minimal,
}

impl<'c> Xrcd<'c> {
    /// The daemon's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The daemon's id of the domain (the same for every opener of one file).
    pub fn xrcd_id(&self) -> u64 {
        self.xrcd_id
    }

    /// Whether this open created the domain.
    pub fn created(&self) -> bool {
        self.created
    }

    /// The context.
    pub fn context(&self) -> &'c Context {
        self.ctx
    }

    /// `ibv_close_xrcd`: `EBUSY` while SRQs, receive-QP handles or registrations made
    /// through this handle remain (the handle then stays open in the daemon until the
    /// context closes).
    pub fn close(self) -> Result<()> {
        let this = ManuallyDrop::new(self);
        destroy_plain::<cmd::CloseXrcd>(this.ctx, "close_xrcd", this.handle)
    }

    /// `ibv_create_srq_ex` of type XRC: an SRQ in this domain, completing to `cq`.
    pub fn create_xrc_srq<'a>(
        &'a self,
        pd: &'a Pd<'a>,
        cq: &'a Cq<'a>,
        attr: SrqAttr,
    ) -> Result<Srq<'a>> {
        const OP: &str = "create_xrc_srq";
        if !std::ptr::eq(pd.ctx, self.ctx) || !std::ptr::eq(cq.ctx, self.ctx) {
            return Err(Error::new(OP, errno::EINVAL));
        }
        let req = CreateXrcSrqReq {
            pd: U32::new(pd.handle),
            xrcd: U32::new(self.handle),
            cq: U32::new(cq.handle),
            max_wr: U32::new(attr.max_wr),
            max_sge: U32::new(attr.max_sge),
            srq_limit: U32::new(attr.srq_limit),
            present: U32::new(PRESENT_PD | PRESENT_XRCD | PRESENT_CQ),
        };
        let r: SrqResp = self.ctx.conn.call::<cmd::CreateXrcSrq>(OP, 0, &req)?;
        let ring = crate::rings::map_srq(self.ctx, r.handle.get()).map_err(|e| {
            let _ = crate::objects::destroy_events::<cmd::DestroySrq>(
                self.ctx,
                "destroy_srq",
                r.handle.get(),
            );
            Error::new(OP, e.errno())
        })?;
        Ok(Srq {
            ctx: self.ctx,
            handle: r.handle.get(),
            ring,
            max_sge: r.max_sge.get(),
            pd: pd.handle,
            _deps: PhantomData,
        })
    }

    // ---- upstream face ------------------------------------------------------------------

    /// `ibv_create_qp_ex(IBV_QPT_XRC_RECV)`: a new receive QP in this domain and this
    /// context's first handle on it.
    pub fn create_recv_qp(&self) -> Result<XrcRecvQp<'_>> {
        let create = QpCreate {
            qp_type: QpType::XrcRecv as u32,
            xrcd: Some(self.handle),
            ..QpCreate::default()
        };
        let r = create.send(self.ctx, "create_qp")?;
        Ok(XrcRecvQp {
            ctx: self.ctx,
            handle: r.handle.get(),
            qpn: r.qpn.get(),
            _xrcd: PhantomData,
        })
    }

    /// `ibv_open_qp`: a new handle on receive QP `qpn` of this domain (`EINVAL` if it is
    /// not one).
    pub fn open_recv_qp(&self, qpn: u32) -> Result<XrcRecvQp<'_>> {
        let req = OpenQpReq {
            xrcd: U32::new(self.handle),
            qp_num: U32::new(qpn),
            qp_type: U32::new(QpType::XrcRecv as u32),
        };
        let r: softverbs_abi::msg::CreateQpResp =
            self.ctx.conn.call::<cmd::OpenQp>("open_qp", 0, &req)?;
        Ok(XrcRecvQp {
            ctx: self.ctx,
            handle: r.handle.get(),
            qpn: r.qpn.get(),
            _xrcd: PhantomData,
        })
    }

    // ---- legacy and minimal faces -----------------------------------------------------------

    /// Runs a registering call under the registration table's lock and counts its result.
    /// Holding the lock across the call keeps a concurrent last-unregister from overtaking
    /// this registration in the daemon.
    fn registered(
        &self,
        face: Face,
        call: impl FnOnce() -> Result<u32>,
    ) -> Result<XrcRegistration<'_>> {
        let mut regs = lock_regs(self.ctx);
        let qpn = call()?;
        let gen = regs.acquire(qpn);
        Ok(XrcRegistration {
            xrcd: self,
            qpn,
            gen,
            face,
        })
    }

    /// Legacy `ibv_create_xrc_rcv_qp`: creates a receive QP and registers this context.
    pub fn create_xrc_rcv_qp(&self) -> Result<XrcRegistration<'_>> {
        self.registered(Face::Legacy, || {
            let req = XrcdReq {
                xrcd: U32::new(self.handle),
            };
            let r: QpNumResp =
                self.ctx
                    .conn
                    .call::<cmd::CreateXrcRcvQp>("create_xrc_rcv_qp", 0, &req)?;
            Ok(r.qpn.get())
        })
    }

    /// Legacy `ibv_reg_xrc_rcv_qp`: registers this context with receive QP `qpn` of this
    /// domain (`EINVAL` if it is not one). Registering again is allowed and counted here.
    pub fn reg_xrc_rcv_qp(&self, qpn: u32) -> Result<XrcRegistration<'_>> {
        self.registered(Face::Legacy, || {
            let req = rcv_req(self.handle, qpn);
            self.ctx
                .conn
                .call::<cmd::RegXrcRcvQp>("reg_xrc_rcv_qp", 0, &req)?;
            Ok(qpn)
        })
    }

    /// Legacy `ibv_modify_xrc_rcv_qp`: any holder of the QP may modify it.
    pub fn modify_xrc_rcv_qp(&self, qpn: u32, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let req = ModifyXrcRcvQpReq {
            xrcd: U32::new(self.handle),
            qp_num: U32::new(qpn),
            attr_mask: U32::new(mask.0),
            attr: QpAttrWire::from(attr),
        };
        self.ctx
            .conn
            .call::<cmd::ModifyXrcRcvQp>("modify_xrc_rcv_qp", 0, &req)
    }

    /// Legacy `ibv_query_xrc_rcv_qp`: any holder of the QP may query it.
    pub fn query_xrc_rcv_qp(&self, qpn: u32) -> Result<QpQuery> {
        const OP: &str = "query_xrc_rcv_qp";
        let r: QueryQpResp =
            self.ctx
                .conn
                .call::<cmd::QueryXrcRcvQp>(OP, 0, &rcv_req(self.handle, qpn))?;
        convert::qp_query(OP, &r)
    }

    /// Legacy `ibv_destroy_xrc_rcv_qp`, raw: drops this context's registration on `qpn` in
    /// the daemon now ("unregister me"; other holders keep the QP), whatever
    /// [`XrcRegistration`]s for it still exist (they become inert). Returns the events
    /// reported for the registration.
    pub fn destroy_xrc_rcv_qp(&self, qpn: u32) -> Result<u32> {
        let mut regs = lock_regs(self.ctx);
        let req = rcv_req(self.handle, qpn);
        let r: EventsResp =
            self.ctx
                .conn
                .call::<cmd::DestroyXrcRcvQp>("destroy_xrc_rcv_qp", 0, &req)?;
        regs.forget(qpn);
        Ok(r.events_reported.get())
    }

    /// The minimal face: `None` creates a receive QP and registers this context with it;
    /// `Some(qpn)` registers with an existing one.
    pub fn register_xrc_rcv_qp(&self, qpn: Option<u32>) -> Result<XrcRegistration<'_>> {
        self.registered(Face::Minimal, || {
            let req = register_req(self.handle, qpn);
            let r: QpNumResp =
                self.ctx
                    .conn
                    .call::<cmd::RegisterXrcRcvQp>("register_xrc_rcv_qp", 0, &req)?;
            Ok(r.qpn.get())
        })
    }

    /// How many [`XrcRegistration`] objects of this context hold `qpn`.
    pub fn registrations(&self, qpn: u32) -> u32 {
        lock_regs(self.ctx).count(qpn)
    }
}

impl Drop for Xrcd<'_> {
    fn drop(&mut self) {
        let _ = destroy_plain::<cmd::CloseXrcd>(self.ctx, "close_xrcd", self.handle);
    }
}

/// An upstream handle on a shared XRC receive QP (from `create_qp` or `open_qp`). Dropping
/// it destroys the handle; the QP itself goes with its last holder.
#[derive(Debug)]
pub struct XrcRecvQp<'a> {
    ctx: &'a Context,
    handle: u32,
    qpn: u32,
    _xrcd: PhantomData<&'a Xrcd<'a>>,
}

impl XrcRecvQp<'_> {
    /// The QP number (what peers' XRC send QPs connect to).
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// This handle (what [`Element::Qp`](crate::Element::Qp) names in events).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// `ibv_modify_qp`: any holder may.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        modify_qp(self.ctx, "modify_qp", self.handle, attr, mask)
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpQuery> {
        query_qp(self.ctx, "query_qp", self.handle)
    }

    /// `ibv_destroy_qp` of this handle; returns its events reported.
    pub fn destroy(self) -> Result<u32> {
        let this = ManuallyDrop::new(self);
        destroy_events::<cmd::DestroyQp>(this.ctx, "destroy_qp", this.handle)
    }
}

impl Drop for XrcRecvQp<'_> {
    fn drop(&mut self) {
        let _ = destroy_events::<cmd::DestroyQp>(self.ctx, "destroy_qp", self.handle);
    }
}

/// This context's registration on a shared XRC receive QP (legacy or minimal face).
/// Dropping it unregisters, once no other registration object of the context holds the
/// same QP.
#[derive(Debug)]
pub struct XrcRegistration<'a> {
    xrcd: &'a Xrcd<'a>,
    qpn: u32,
    gen: u64,
    face: Face,
}

impl XrcRegistration<'_> {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Lets go of this registration. When it was the context's last one for the QP, the
    /// daemon drops the registration (legacy `ibv_unreg_xrc_rcv_qp`, or the minimal
    /// unregister) and its events reported are returned; otherwise nothing is sent and the
    /// result is 0.
    pub fn unregister(self) -> Result<u32> {
        let this = ManuallyDrop::new(self);
        this.release()
    }

    fn release(&self) -> Result<u32> {
        let ctx = self.xrcd.ctx;
        let mut regs = lock_regs(ctx);
        if regs.release(self.qpn, self.gen) != Release::Last {
            return Ok(0);
        }
        let req = rcv_req(self.xrcd.handle, self.qpn);
        let r = match self.face {
            Face::Legacy => ctx
                .conn
                .call::<cmd::UnregXrcRcvQp>("unreg_xrc_rcv_qp", 0, &req)?,
            Face::Minimal => {
                ctx.conn
                    .call::<cmd::UnregisterXrcRcvQp>("unregister_xrc_rcv_qp", 0, &req)?
            }
        };
        drop(regs);
        Ok(r.events_reported.get())
    }
}

impl Drop for XrcRegistration<'_> {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_registration_object_of_a_qp_unregisters() {
        let mut t = RegTable::default();
        let a = t.acquire(0x10);
        let b = t.acquire(0x10);
        let other = t.acquire(0x11);
        assert_eq!((a, t.count(0x10), t.count(0x11)), (b, 2, 1));
        assert_ne!(a, other);
        assert_eq!(t.release(0x10, a), Release::Held);
        assert_eq!(t.release(0x10, b), Release::Last);
        assert_eq!(t.count(0x10), 0);
        assert_eq!(t.release(0x11, other), Release::Last);
    }

    #[test]
    fn registrations_outlived_by_a_raw_destroy_are_inert() {
        let mut t = RegTable::default();
        let old = t.acquire(7);
        t.forget(7);
        // The QP number comes back (re-registered, or reused after the QP died).
        let new = t.acquire(7);
        assert_ne!(old, new);
        assert_eq!(
            t.release(7, old),
            Release::Stale,
            "the stale object must not count down the new entry"
        );
        assert_eq!(t.count(7), 1);
        assert_eq!(t.release(7, new), Release::Last);
    }

    #[test]
    fn minimal_register_with_none_asks_for_a_new_qp() {
        assert_eq!(register_req(3, None).qp_num.get(), CREATE_NEW_QP);
        assert_eq!(register_req(3, Some(0x42)).qp_num.get(), 0x42);
        assert_eq!(register_req(3, None).xrcd.get(), 3);
    }
}
