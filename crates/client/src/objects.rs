//! PDs, MRs, CQs, SRQs, address handles and QPs.

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU32, Ordering};

use softverbs_abi::msg::{cmd, Command};
use softverbs_abi::msg::{
    CreateAhReq, CreateCqReq, CreateCqResp, CreateQpReq, CreateQpResp, CreateSrqReq, EventsResp,
    HandleReq, HandleResp, ModifyQpReq, ModifySrqReq, QpAttrWire, QueryQpResp, RegMrReq, RegMrResp,
    SrqNumResp, SrqResp, CREATE_QP_CREATE_FLAGS, PRESENT_PD, PRESENT_RECV_CQ, PRESENT_SEND_CQ,
    PRESENT_SRQ, PRESENT_XRCD,
};
use softverbs_core::attr::{AhAttr, QpAttr, QpCap, QpInitInfo, SrqAttr};
use softverbs_core::types::{Access, AttrMask, QpState, QpType};
use zerocopy::little_endian::{U32, U64};

use crate::context::Context;
use crate::convert;
use crate::error::{errno, Error, Result};

pub(crate) fn handle_req(handle: u32) -> HandleReq {
    HandleReq {
        handle: U32::new(handle),
    }
}

/// Sends a destroy-style command that answers nothing.
pub(crate) fn destroy_plain<C>(ctx: &Context, op: &'static str, handle: u32) -> Result<()>
where
    C: Command<Req = HandleReq, Resp = ()>,
{
    ctx.conn.call::<C>(op, 0, &handle_req(handle))
}

/// Sends a destroy-style command that answers `events_reported`.
pub(crate) fn destroy_events<C>(ctx: &Context, op: &'static str, handle: u32) -> Result<u32>
where
    C: Command<Req = HandleReq, Resp = EventsResp>,
{
    let r = ctx.conn.call::<C>(op, 0, &handle_req(handle))?;
    Ok(r.events_reported.get())
}

fn same_context(op: &'static str, a: &Context, b: &Context) -> Result<()> {
    if std::ptr::eq(a, b) {
        Ok(())
    } else {
        Err(Error::new(op, errno::EINVAL))
    }
}

impl Context {
    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd<'_>> {
        let r: HandleResp = self.conn.call::<cmd::AllocPd>("alloc_pd", 0, &())?;
        Ok(Pd {
            ctx: self,
            handle: r.handle.get(),
        })
    }

    /// `ibv_create_cq` with completion vector 0.
    pub fn create_cq(&self, cqe: u32) -> Result<Cq<'_>> {
        self.create_cq_on_vector(cqe, 0)
    }

    /// `ibv_create_cq` on `comp_vector`.
    pub fn create_cq_on_vector(&self, cqe: u32, comp_vector: u32) -> Result<Cq<'_>> {
        self.create_cq_inner(cqe, comp_vector, None)
    }

    pub(crate) fn create_cq_inner(
        &self,
        cqe: u32,
        comp_vector: u32,
        channel: Option<u32>,
    ) -> Result<Cq<'_>> {
        let req = CreateCqReq {
            cqe: U32::new(cqe),
            comp_vector: U32::new(comp_vector),
            channel: U32::new(channel.unwrap_or(0)),
            reserved: U32::new(0),
        };
        let mask = if channel.is_some() {
            softverbs_abi::msg::CREATE_CQ_CHANNEL
        } else {
            0
        };
        let r: CreateCqResp = self.conn.call::<cmd::CreateCq>("create_cq", mask, &req)?;
        let ring = crate::rings::map_cq(self, r.handle.get()).map_err(|e| {
            let _ = destroy_events::<cmd::DestroyCq>(self, "destroy_cq", r.handle.get());
            Error::new("create_cq", e.errno())
        })?;
        let ring_peek = ring
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()).peek());
        Ok(Cq {
            ctx: self,
            handle: r.handle.get(),
            cqe: AtomicU32::new(r.cqe.get()),
            ring,
            ring_peek,
            outgrown: std::sync::atomic::AtomicBool::new(false),
            channel,
            flushed: std::sync::Mutex::new(None),
            daemon_fed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// `ibv_create_qp` for RC, UC, UD and XRC send QPs (XRC receive QPs come from
    /// [`Xrcd::create_recv_qp`](crate::Xrcd::create_recv_qp)). The QP borrows the objects
    /// `init` names, which must belong to this context (`EINVAL` otherwise).
    pub fn create_qp<'a>(&'a self, init: &QpInit<'a>) -> Result<Qp<'a>> {
        const OP: &str = "create_qp";
        for ctx in [
            init.pd.map(|p| p.ctx),
            init.send_cq.map(|c| c.ctx),
            init.recv_cq.map(|c| c.ctx),
            init.srq.map(|s| s.ctx),
        ]
        .into_iter()
        .flatten()
        {
            same_context(OP, self, ctx)?;
        }
        let create = QpCreate {
            qp_type: init.qp_type as u32,
            pd: init.pd.map(|p| p.handle),
            send_cq: init.send_cq.map(|c| c.handle),
            recv_cq: init.recv_cq.map(|c| c.handle),
            srq: init.srq.map(|s| s.handle),
            xrcd: None,
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
            create_flags: init.create_flags,
        };
        let r = create.send(self, OP)?;
        let rings = crate::rings::map_qp(self, r.handle.get()).map_err(|e| {
            let _ = destroy_events::<cmd::DestroyQp>(self, "destroy_qp", r.handle.get());
            Error::new(OP, e.errno())
        })?;
        let rq_count = rings
            .as_ref()
            .is_some_and(|m| m.lock().unwrap_or_else(|e| e.into_inner()).rq.is_some())
            .then(|| {
                let c = crate::context::RqCount::default();
                self.rq_outstanding
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(r.qpn.get(), c.clone());
                c
            });
        if let Some(rings) = &rings {
            self.ring_qps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    r.handle.get(),
                    crate::flush::RingQp {
                        qpn: r.qpn.get(),
                        send_cq: create.send_cq,
                        recv_cq: create.recv_cq,
                        rings: rings.clone(),
                        rq_count: rq_count.clone(),
                    },
                );
        }
        if let (Some(d), Some(rings)) = (&self.direct, &rings) {
            let has_rq = rings.lock().unwrap_or_else(|e| e.into_inner()).rq.is_some();
            if has_rq || init.srq.is_some() {
                let channels =
                    [init.send_cq, init.recv_cq].map(|c| c.is_some_and(|c| c.channel.is_some()));
                let able = !channels.contains(&true);
                let cqes = [init.send_cq, init.recv_cq].map(|c| c.map_or(0, |c| c.cqe()));
                d.add_qp(crate::direct::NewQp {
                    handle: r.handle.get(),
                    qpn: r.qpn.get(),
                    qp_type: init.qp_type,
                    send_cq: create.send_cq,
                    recv_cq: create.recv_cq,
                    sq_sig_all: init.sq_sig_all,
                    srq: init.srq.map(|s| s.handle),
                    able,
                    cqes,
                    rq_count: rq_count.clone(),
                });
            }
        }
        Ok(Qp {
            ctx: self,
            handle: r.handle.get(),
            qpn: r.qpn.get(),
            qp_type: init.qp_type,
            cap: QpCap::from(&r.cap),
            rings,
            rq_count,
            state: std::sync::atomic::AtomicU32::new(QpState::Reset as u32),
            pd: init.pd.map(|p| p.handle),
            _deps: PhantomData,
        })
    }
}

/// A `CreateQp` request in handle form.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QpCreate {
    pub(crate) qp_type: u32,
    pub(crate) pd: Option<u32>,
    pub(crate) send_cq: Option<u32>,
    pub(crate) recv_cq: Option<u32>,
    pub(crate) srq: Option<u32>,
    pub(crate) xrcd: Option<u32>,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    pub(crate) create_flags: u32,
}

impl QpCreate {
    /// The request and its `comp_mask` for a daemon speaking `abi`. `create_flags` is
    /// announced when the daemon knows the field (ABI 2), and always when it is non-zero, so
    /// an ABI 1 daemon refuses it with `EOPNOTSUPP` instead of ignoring it.
    pub(crate) fn encode(&self, abi: u32) -> (u64, CreateQpReq) {
        let mut present = 0;
        let mut slot = |h: Option<u32>, bit: u32| {
            h.map_or(0, |h| {
                present |= bit;
                h
            })
        };
        let pd = slot(self.pd, PRESENT_PD);
        let send_cq = slot(self.send_cq, PRESENT_SEND_CQ);
        let recv_cq = slot(self.recv_cq, PRESENT_RECV_CQ);
        let srq = slot(self.srq, PRESENT_SRQ);
        let xrcd = slot(self.xrcd, PRESENT_XRCD);
        let req = CreateQpReq {
            qp_type: U32::new(self.qp_type),
            present: U32::new(present),
            pd: U32::new(pd),
            send_cq: U32::new(send_cq),
            recv_cq: U32::new(recv_cq),
            srq: U32::new(srq),
            xrcd: U32::new(xrcd),
            sq_sig_all: U32::new(u32::from(self.sq_sig_all)),
            cap: (&self.cap).into(),
            create_flags: U32::new(self.create_flags),
            reserved: U32::new(0),
        };
        let comp_mask = if abi >= 2 || self.create_flags != 0 {
            CREATE_QP_CREATE_FLAGS
        } else {
            0
        };
        (comp_mask, req)
    }

    pub(crate) fn send(&self, ctx: &Context, op: &'static str) -> Result<CreateQpResp> {
        let (comp_mask, req) = self.encode(ctx.conn.abi);
        ctx.conn.call::<cmd::CreateQp>(op, comp_mask, &req)
    }
}

pub(crate) fn modify_qp(
    ctx: &Context,
    op: &'static str,
    handle: u32,
    attr: &QpAttr,
    mask: AttrMask,
) -> Result<()> {
    let req = ModifyQpReq {
        handle: U32::new(handle),
        attr_mask: U32::new(mask.0),
        attr: QpAttrWire::from(attr),
    };
    ctx.conn.call::<cmd::ModifyQp>(op, 0, &req)
}

pub(crate) fn query_qp(ctx: &Context, op: &'static str, handle: u32) -> Result<QpQuery> {
    let r: QueryQpResp = ctx.conn.call::<cmd::QueryQp>(op, 0, &handle_req(handle))?;
    convert::qp_query(op, &r)
}

/// A protection domain (`struct ibv_pd`). Dropping it deallocates it.
#[derive(Debug)]
pub struct Pd<'c> {
    pub(crate) ctx: &'c Context,
    pub(crate) handle: u32,
}

impl<'c> Pd<'c> {
    /// The daemon's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The context.
    pub fn context(&self) -> &'c Context {
        self.ctx
    }

    /// `ibv_reg_mr` of raw memory (the iova is its address), for FFI callers: safe code
    /// uses [`Pd::alloc_mr`] or [`Pd::reg_slice`]. The `unsafe` promise is made when the
    /// [`RawMemory`](crate::RawMemory) is named ([`RawMemory::new`](crate::RawMemory::new)
    /// states the contract), which keeps this crate free of `unsafe`.
    pub fn reg_mr(&self, mem: crate::RawMemory, access: Access) -> Result<Mr<'_>> {
        self.reg_mr_iova(mem, mem.addr() as u64, access)
    }

    /// `ibv_reg_mr_iova2`: raw memory addressed by peers as `iova` (see [`Pd::reg_mr`]).
    pub fn reg_mr_iova(&self, mem: crate::RawMemory, iova: u64, access: Access) -> Result<Mr<'_>> {
        self.reg_mr_with(mem.addr() as u64, mem.len() as u64, iova, access, None)
    }

    /// `ibv_reg_mr` of raw memory, first turning its pages into shared memory in place, so
    /// the daemon reaches them with plain copies instead of a system call per access
    /// (docs/design/registered-memory.md: ~20 ns instead of ~1.6 µs for a small access). The
    /// memory must have been named with
    /// [`RawMemory::new_shareable`](crate::RawMemory::new_shareable), whose contract covers
    /// the conversion (`EINVAL` otherwise). Memory that cannot be converted (file-backed,
    /// stack, already shared) is registered the ordinary way. Safe code gets the same fast
    /// path with no conversion from [`Pd::alloc_mr`].
    pub fn reg_mr_shared(&self, mem: crate::RawMemory, access: Access) -> Result<Mr<'_>> {
        let fd = mem
            .share_in_place()
            .ok_or(Error::new("reg_mr", errno::EINVAL))?
            .ok();
        let converted = fd
            .as_ref()
            .and_then(|fd| softverbs_memaccess::Converted::of(mem.addr(), mem.len(), fd).ok());
        let addr = mem.addr() as u64;
        let made = self.reg_mr_with(addr, mem.len() as u64, addr, access, fd);
        match made {
            Ok(mut mr) => {
                mr.converted = converted;
                Ok(mr)
            }
            Err(e) => {
                // The daemon refused the MR: the pages go back to what they were.
                let Some(c) = converted else {
                    return Err(e);
                };
                let _ = softverbs_memaccess::unshare_in_place(&c);
                if e.errno != errno::ENOMEM {
                    return Err(e);
                }
                // Over the uid's `mappings` budget (docs/guide/limits.md): the MR itself may still
                // fit, reached without sharing.
                self.reg_mr_with(addr, mem.len() as u64, addr, access, None)
            }
        }
    }

    pub(crate) fn reg_mr_with(
        &self,
        addr: u64,
        len: u64,
        iova: u64,
        access: Access,
        fd: Option<std::os::fd::OwnedFd>,
    ) -> Result<Mr<'_>> {
        let req = RegMrReq {
            pd: U32::new(self.handle),
            access: U32::new(access.0),
            addr: U64::new(addr),
            length: U64::new(len),
            iova: U64::new(iova),
        };
        let fds: Vec<std::os::fd::BorrowedFd<'_>> =
            fd.iter().map(std::os::fd::AsFd::as_fd).collect();
        let (r, _): (RegMrResp, _) = self
            .ctx
            .conn
            .call_fds::<cmd::RegMr>("reg_mr", 0, &req, &fds)?;
        Ok(Mr {
            ctx: self.ctx,
            handle: r.handle.get(),
            lkey: r.lkey.get(),
            rkey: r.rkey.get(),
            converted: None,
            _pd: PhantomData,
        })
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, attr: SrqAttr) -> Result<Srq<'_>> {
        let req = CreateSrqReq {
            pd: U32::new(self.handle),
            max_wr: U32::new(attr.max_wr),
            max_sge: U32::new(attr.max_sge),
            srq_limit: U32::new(attr.srq_limit),
        };
        let r: SrqResp = self
            .ctx
            .conn
            .call::<cmd::CreateSrq>("create_srq", 0, &req)?;
        let ring = crate::rings::map_srq(self.ctx, r.handle.get()).map_err(|e| {
            let _ = destroy_events::<cmd::DestroySrq>(self.ctx, "destroy_srq", r.handle.get());
            Error::new("create_srq", e.errno())
        })?;
        Ok(Srq {
            ctx: self.ctx,
            handle: r.handle.get(),
            ring,
            max_sge: r.max_sge.get(),
            pd: self.handle,
            _deps: PhantomData,
        })
    }

    /// `ibv_create_ah`.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah<'_>> {
        let req = CreateAhReq {
            pd: U32::new(self.handle),
            attr: attr.into(),
        };
        let r: HandleResp = self.ctx.conn.call::<cmd::CreateAh>("create_ah", 0, &req)?;
        Ok(Ah {
            ctx: self.ctx,
            handle: r.handle.get(),
            _pd: PhantomData,
        })
    }

    /// `ibv_dealloc_pd` (`EBUSY` while objects use it).
    pub fn dealloc(self) -> Result<()> {
        let this = ManuallyDrop::new(self);
        destroy_plain::<cmd::DeallocPd>(this.ctx, "dealloc_pd", this.handle)
    }
}

impl Drop for Pd<'_> {
    fn drop(&mut self) {
        let _ = destroy_plain::<cmd::DeallocPd>(self.ctx, "dealloc_pd", self.handle);
    }
}

/// A memory region (`struct ibv_mr`). Dropping it deregisters it.
#[derive(Debug)]
pub struct Mr<'a> {
    ctx: &'a Context,
    handle: u32,
    lkey: u32,
    rkey: u32,
    /// Pages [`Pd::reg_mr_shared`] turned into shared memory, turned back into private
    /// memory once the daemon has let go of them (deregistration, or a new translation).
    converted: Option<softverbs_memaccess::Converted>,
    _pd: PhantomData<&'a Pd<'a>>,
}

impl<'a> Mr<'a> {
    /// The daemon's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// `ibv_rereg_mr`: a new PD, access and/or range (raw memory and its iova, under the
    /// contract of [`RawMemory::new`](crate::RawMemory::new); `None` keeps the current
    /// one). The MR keeps its handle and keys; on error it is unchanged.
    pub fn rereg(
        &mut self,
        pd: Option<&'a Pd<'a>>,
        access: Option<Access>,
        range: Option<(crate::RawMemory, u64)>,
    ) -> Result<()> {
        use softverbs_abi::msg::{
            ReregMrReq, REREG_MR_CHANGE_ACCESS, REREG_MR_CHANGE_PD, REREG_MR_CHANGE_TRANSLATION,
        };
        if let Some(p) = pd {
            same_context("rereg_mr", self.ctx, p.ctx)?;
        }
        let (addr, length, iova) = range.map_or((0, 0, 0), |(m, iova)| {
            (m.addr() as u64, m.len() as u64, iova)
        });
        let flags = pd.map_or(0, |_| REREG_MR_CHANGE_PD)
            | access.map_or(0, |_| REREG_MR_CHANGE_ACCESS)
            | range.map_or(0, |_| REREG_MR_CHANGE_TRANSLATION);
        let req = ReregMrReq {
            handle: U32::new(self.handle),
            flags: U32::new(flags),
            pd: U32::new(pd.map_or(0, |p| p.handle)),
            access: U32::new(access.map_or(0, |a| a.0)),
            addr: U64::new(addr),
            length: U64::new(length),
            iova: U64::new(iova),
        };
        revoking(self.ctx);
        let r = self.ctx.conn.call::<cmd::ReregMr>("rereg_mr", 0, &req);
        revoked(self.ctx);
        let r: RegMrResp = r?;
        self.lkey = r.lkey.get();
        self.rkey = r.rkey.get();
        if range.is_some() {
            // The daemon let go of the old pages (the new range is reached without sharing).
            self.unshare();
        }
        Ok(())
    }

    /// `ibv_dereg_mr`.
    pub fn dereg(self) -> Result<()> {
        let mut this = ManuallyDrop::new(self);
        revoking(this.ctx);
        let r = destroy_plain::<cmd::DeregMr>(this.ctx, "dereg_mr", this.handle);
        revoked(this.ctx);
        if r.is_ok() {
            this.unshare();
        }
        r
    }

    /// After the daemon let go of converted pages: back to private memory. Where that
    /// cannot be done (no write protection, or the program since unmapped or replaced the
    /// pages) they stay as they are, correct to use and shared with nobody.
    fn unshare(&mut self) {
        if let Some(c) = self.converted.take() {
            let _ = softverbs_memaccess::unshare_in_place(&c);
        }
    }

    /// `ibv_dereg_mr` that hands the MR back when the daemon refuses it with `EINVAL`
    /// (memory windows are bound to it, IBA 10.6.7.2.6), so the caller may retry once they
    /// are unbound. Any other failure (a dead connection) leaves nothing to hand back.
    pub fn dereg_or_keep(self) -> std::result::Result<(), (Option<Mr<'a>>, Error)> {
        let mut this = ManuallyDrop::new(self);
        revoking(this.ctx);
        let r = destroy_plain::<cmd::DeregMr>(this.ctx, "dereg_mr", this.handle);
        revoked(this.ctx);
        match r {
            Ok(()) => {
                this.unshare();
                Ok(())
            }
            Err(e) if e.errno == errno::EINVAL => Err((Some(ManuallyDrop::into_inner(this)), e)),
            Err(e) => Err((None, e)),
        }
    }
}

impl Drop for Mr<'_> {
    fn drop(&mut self) {
        revoking(self.ctx);
        let r = destroy_plain::<cmd::DeregMr>(self.ctx, "dereg_mr", self.handle);
        // After the direct peers are done with the pages (`revoked`), as in `dereg`: a copy
        // of theirs still running would land in the memfd after ours was taken.
        revoked(self.ctx);
        if r.is_ok() {
            self.unshare();
        }
    }
}

/// Before `dereg_mr`/`rereg_mr`: what peers delivered inline is placed while the MR is still
/// registered (`DirectCtx::revoking`).
fn revoking(ctx: &Context) {
    if let Some(d) = &ctx.direct {
        d.revoking();
    }
}

/// After `dereg_mr`/`rereg_mr`: the direct path's peers are done with the old registration
/// (`DirectCtx::revoked`).
fn revoked(ctx: &Context) {
    if let Some(d) = &ctx.direct {
        d.revoked();
    }
}

/// A completion queue (`struct ibv_cq`). Dropping it destroys it.
#[derive(Debug)]
pub struct Cq<'c> {
    pub(crate) ctx: &'c Context,
    pub(crate) handle: u32,
    cqe: AtomicU32,
    /// The completion ring in shared memory, when the daemon mapped it.
    pub(crate) ring: Option<std::sync::Mutex<softverbs_shm::Consumer>>,
    /// A look at the ring without its lock: most polls of a CQ whose QPs are direct find it
    /// empty, and taking the lock to see so was a tenth of a small SEND's poll.
    pub(crate) ring_peek: Option<softverbs_shm::Peek>,
    /// Resized beyond the ring's capacity: after the ring, completions come by command.
    pub(crate) outgrown: std::sync::atomic::AtomicBool,
    /// The completion channel's handle.
    pub(crate) channel: Option<u32>,
    /// After the device went: the flush completions not yet polled (`None` until the first
    /// poll that found the ring drained collected them).
    pub(crate) flushed:
        std::sync::Mutex<Option<std::collections::VecDeque<softverbs_core::wr::WorkCompletion>>>,
    /// The daemon has delivered a completion to this CQ (through its ring or by command):
    /// from then on its pollers may be waiting for the daemon ([`Cq::fed_directly`]).
    pub(crate) daemon_fed: std::sync::atomic::AtomicBool,
}

impl Cq<'_> {
    /// The daemon's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Entries granted (at creation or by the last resize).
    pub fn cqe(&self) -> u32 {
        self.cqe.load(Ordering::Relaxed)
    }

    /// `ibv_resize_cq`; returns the entries granted.
    pub fn resize(&self, cqe: u32) -> Result<u32> {
        if let Some(d) = &self.ctx.direct {
            // The completions the direct path holds count too (ibv_resize_cq(3): EINVAL
            // below the completions in the CQ).
            if d.queued(self.handle) > cqe as usize {
                return Err(Error::new("resize_cq", errno::EINVAL));
            }
        }
        let req = softverbs_abi::msg::ResizeCqReq {
            handle: U32::new(self.handle),
            cqe: U32::new(cqe),
        };
        let r: CreateCqResp = self.ctx.conn.call::<cmd::ResizeCq>("resize_cq", 0, &req)?;
        self.cqe.store(r.cqe.get(), Ordering::Relaxed);
        if let Some(d) = &self.ctx.direct {
            d.cq_resized(self.handle, r.cqe.get());
        }
        // The daemon's rule (DataPath::cq_resized): rings are not remapped, so a CQ grown past
        // its ring gets its newer completions by PollCq.
        if let Some(ring) = &self.ring {
            let cap = ring
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .layout()
                .capacity();
            if r.cqe.get() > cap {
                self.outgrown.store(true, Ordering::Release);
            }
        }
        Ok(r.cqe.get())
    }

    /// `ibv_destroy_cq`; returns the events reported for it.
    pub fn destroy(self) -> Result<u32> {
        let this = ManuallyDrop::new(self);
        this.disarm();
        destroy_events::<cmd::DestroyCq>(this.ctx, "destroy_cq", this.handle)
    }

    fn disarm(&self) {
        if self.channel.is_some() {
            self.ctx
                .armed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.handle);
        }
    }
}

impl Drop for Cq<'_> {
    fn drop(&mut self) {
        self.disarm();
        let _ = destroy_events::<cmd::DestroyCq>(self.ctx, "destroy_cq", self.handle);
    }
}

/// A shared receive queue, basic or XRC (`struct ibv_srq`). Dropping it destroys it.
#[derive(Debug)]
pub struct Srq<'a> {
    pub(crate) ctx: &'a Context,
    pub(crate) handle: u32,
    /// The receive ring shared with the daemon, if mapped.
    pub(crate) ring: Option<std::sync::Mutex<softverbs_shm::Producer>>,
    /// `max_sge` granted, checked at post (a ring entry has no way to return `EINVAL`).
    pub(crate) max_sge: u32,
    /// The PD's handle, so posting a buffer of another PD's MR is refused locally.
    pub(crate) pd: u32,
    pub(crate) _deps: PhantomData<&'a ()>,
}

fn srq_attr(r: &SrqResp) -> SrqAttr {
    SrqAttr {
        max_wr: r.max_wr.get(),
        max_sge: r.max_sge.get(),
        srq_limit: r.srq_limit.get(),
    }
}

impl Srq<'_> {
    /// The daemon's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// `ibv_modify_srq` with `mask` of [`SRQ_MAX_WR`](crate::SRQ_MAX_WR) |
    /// [`SRQ_LIMIT`](crate::SRQ_LIMIT); returns the attributes now in force.
    pub fn modify(&self, attr: &SrqAttr, mask: u32) -> Result<SrqAttr> {
        let req = ModifySrqReq {
            handle: U32::new(self.handle),
            attr_mask: U32::new(mask),
            max_wr: U32::new(attr.max_wr),
            srq_limit: U32::new(attr.srq_limit),
        };
        let r: SrqResp = self
            .ctx
            .conn
            .call::<cmd::ModifySrq>("modify_srq", 0, &req)?;
        Ok(srq_attr(&r))
    }

    /// `ibv_query_srq`.
    pub fn query(&self) -> Result<SrqAttr> {
        let r: SrqResp =
            self.ctx
                .conn
                .call::<cmd::QuerySrq>("query_srq", 0, &handle_req(self.handle))?;
        Ok(srq_attr(&r))
    }

    /// `ibv_get_srq_num`: the number peers put in the XRCETH (XRC SRQs only).
    pub fn srq_num(&self) -> Result<u32> {
        let r: SrqNumResp =
            self.ctx
                .conn
                .call::<cmd::GetSrqNum>("get_srq_num", 0, &handle_req(self.handle))?;
        Ok(r.srqn.get())
    }

    /// `ibv_destroy_srq`; returns the events reported for it.
    pub fn destroy(self) -> Result<u32> {
        let this = ManuallyDrop::new(self);
        destroy_events::<cmd::DestroySrq>(this.ctx, "destroy_srq", this.handle)
    }
}

impl Drop for Srq<'_> {
    fn drop(&mut self) {
        let _ = destroy_events::<cmd::DestroySrq>(self.ctx, "destroy_srq", self.handle);
    }
}

/// An address handle (`struct ibv_ah`). Dropping it destroys it.
#[derive(Debug)]
pub struct Ah<'a> {
    ctx: &'a Context,
    handle: u32,
    _pd: PhantomData<&'a Pd<'a>>,
}

impl Ah<'_> {
    /// The daemon's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// `ibv_destroy_ah`.
    pub fn destroy(self) -> Result<()> {
        let this = ManuallyDrop::new(self);
        destroy_plain::<cmd::DestroyAh>(this.ctx, "destroy_ah", this.handle)
    }
}

impl Drop for Ah<'_> {
    fn drop(&mut self) {
        let _ = destroy_plain::<cmd::DestroyAh>(self.ctx, "destroy_ah", self.handle);
    }
}

/// What [`Context::create_qp`] makes (`struct ibv_qp_init_attr_ex`), with the objects it
/// uses by reference.
#[derive(Clone, Copy, Debug)]
pub struct QpInit<'a> {
    /// QP type (RC, UC, UD or XRC send).
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: Option<&'a Pd<'a>>,
    /// Send CQ.
    pub send_cq: Option<&'a Cq<'a>>,
    /// Receive CQ.
    pub recv_cq: Option<&'a Cq<'a>>,
    /// Shared receive queue.
    pub srq: Option<&'a Srq<'a>>,
    /// Queue capacities asked for.
    pub cap: QpCap,
    /// Every send WR signals a completion.
    pub sq_sig_all: bool,
    /// `enum ibv_qp_create_flags` (softverbs implements none: non-zero is `EOPNOTSUPP`).
    pub create_flags: u32,
}

impl<'a> QpInit<'a> {
    /// A QP of `qp_type` on `pd`, with nothing else set.
    pub fn new(qp_type: QpType, pd: &'a Pd<'a>) -> Self {
        QpInit {
            qp_type,
            pd: Some(pd),
            send_cq: None,
            recv_cq: None,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
            create_flags: 0,
        }
    }

    /// Sets both CQs.
    pub fn cqs(self, send: &'a Cq<'a>, recv: &'a Cq<'a>) -> Self {
        QpInit {
            send_cq: Some(send),
            recv_cq: Some(recv),
            ..self
        }
    }

    /// Sets the send CQ.
    pub fn send_cq(self, cq: &'a Cq<'a>) -> Self {
        QpInit {
            send_cq: Some(cq),
            ..self
        }
    }

    /// Sets the receive CQ.
    pub fn recv_cq(self, cq: &'a Cq<'a>) -> Self {
        QpInit {
            recv_cq: Some(cq),
            ..self
        }
    }

    /// Sets the SRQ.
    pub fn srq(self, srq: &'a Srq<'a>) -> Self {
        QpInit {
            srq: Some(srq),
            ..self
        }
    }

    /// Sets the capacities.
    pub fn cap(self, cap: QpCap) -> Self {
        QpInit { cap, ..self }
    }

    /// Sets `sq_sig_all`.
    pub fn sq_sig_all(self, on: bool) -> Self {
        QpInit {
            sq_sig_all: on,
            ..self
        }
    }

    /// Sets `create_flags`.
    pub fn create_flags(self, flags: u32) -> Self {
        QpInit {
            create_flags: flags,
            ..self
        }
    }
}

/// What `ibv_query_qp` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpQuery {
    /// Current attributes.
    pub attr: QpAttr,
    /// Creation-time attributes.
    pub init: QpInitInfo,
    /// The QP number.
    pub qpn: u32,
}

/// A QP the context owns (`struct ibv_qp`). Dropping it destroys it.
#[derive(Debug)]
pub struct Qp<'a> {
    pub(crate) ctx: &'a Context,
    handle: u32,
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    /// The work queues in shared memory, when the daemon mapped them.
    pub(crate) rings: Option<std::sync::Arc<std::sync::Mutex<crate::rings::QpRings>>>,
    /// Receive requests outstanding, when the receive queue is a ring.
    pub(crate) rq_count: Option<crate::context::RqCount>,
    /// Last state set through [`modify`](Qp::modify), for checking posts locally.
    state: std::sync::atomic::AtomicU32,
    /// The PD's handle, so posting a buffer of another PD's MR is refused locally.
    pub(crate) pd: Option<u32>,
    _deps: PhantomData<&'a ()>,
}

impl Qp<'_> {
    /// The daemon's handle (what [`Element::Qp`](crate::Element::Qp) names).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The QP type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Capacities granted at creation.
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// `ibv_attach_mcast(3)`: datagrams sent to multicast group `gid` (an IPv4-mapped
    /// `224.0.0.0/4` or an IPv6 `ff00::/8` GID) reach this UD QP, from this daemon and from
    /// hosts on the device's network, one copy each; the QP needs a Q_Key matching the
    /// senders'. Attaching again changes nothing. `EINVAL` for a QP that is not UD or a GID
    /// that is not multicast, `ENOMEM` past the device's `max_mcast_*` limits.
    pub fn attach_mcast(&self, gid: softverbs_core::device::Gid) -> Result<()> {
        self.mcast::<cmd::AttachMcast>("attach_mcast", gid)
    }

    /// `ibv_detach_mcast(3)`: `EINVAL` if the QP is not attached to `gid`. Destroying the
    /// QP detaches it from every group.
    pub fn detach_mcast(&self, gid: softverbs_core::device::Gid) -> Result<()> {
        self.mcast::<cmd::DetachMcast>("detach_mcast", gid)
    }

    fn mcast<C: Command<Req = softverbs_abi::msg::McastReq, Resp = ()>>(
        &self,
        op: &'static str,
        gid: softverbs_core::device::Gid,
    ) -> Result<()> {
        let req = softverbs_abi::msg::McastReq {
            qp: U32::new(self.handle),
            gid: gid.0,
            ..Default::default()
        };
        self.ctx.conn.call::<C>(op, 0, &req)
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        modify_qp(self.ctx, "modify_qp", self.handle, attr, mask)?;
        if mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Reset {
            // RESET empties the queues (IBA 10.3.1.1).
            if let Some(c) = &self.rq_count {
                c.store(0, std::sync::atomic::Ordering::Release);
            }
        }
        if mask.contains(AttrMask::STATE) {
            self.state
                .store(attr.qp_state as u32, std::sync::atomic::Ordering::Relaxed);
            if let Some(d) = &self.ctx.direct {
                if let Some(f) = d.modified(self.ctx, self.handle, attr.qp_state) {
                    crate::datapath::post_fallback(self.ctx, self.handle, f);
                }
            }
        }
        Ok(())
    }

    /// Whether the QP exchanges work with its peer over the same-host direct path
    /// (docs/design/direct-path.md) rather than through the daemon's engine.
    pub fn is_direct(&self) -> bool {
        self.ctx
            .direct
            .as_ref()
            .is_some_and(|d| d.is_direct(self.handle))
    }

    /// Whether this process runs the transport engine for the QP itself, connected to a QP
    /// of another host (docs/design/net-path.md), rather than the daemon.
    pub fn is_net(&self) -> bool {
        self.ctx
            .direct
            .as_ref()
            .is_some_and(|d| d.is_net(self.handle))
    }

    /// The state this process last moved the QP to (the daemon may since have moved it to
    /// ERR after a transport error; posting there is allowed and flushes).
    pub(crate) fn local_state(&self) -> QpState {
        QpState::from_raw(self.state.load(std::sync::atomic::Ordering::Relaxed))
            .unwrap_or(QpState::Reset)
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpQuery> {
        query_qp(self.ctx, "query_qp", self.handle)
    }

    /// `ibv_destroy_qp`; returns the events reported for it.
    pub fn destroy(self) -> Result<u32> {
        let this = ManuallyDrop::new(self);
        this.forget_rq_count();
        destroy_events::<cmd::DestroyQp>(this.ctx, "destroy_qp", this.handle)
    }

    fn forget_rq_count(&self) {
        if let Some(d) = &self.ctx.direct {
            d.remove(self.handle, self.qpn);
        }
        if self.rings.is_some() {
            self.ctx
                .ring_qps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.handle);
        }
        if self.rq_count.is_some() {
            self.ctx
                .rq_outstanding
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.qpn);
        }
    }
}

impl Drop for Qp<'_> {
    fn drop(&mut self) {
        self.forget_rq_count();
        let _ = destroy_events::<cmd::DestroyQp>(self.ctx, "destroy_qp", self.handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_abi::codec::{decode_request, encode_request, DecodeError};
    use softverbs_abi::msg::Cmd;
    use zerocopy::IntoBytes;

    fn rc() -> QpCreate {
        QpCreate {
            qp_type: QpType::Rc as u32,
            pd: Some(1),
            send_cq: Some(2),
            recv_cq: Some(3),
            cap: QpCap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..QpCreate::default()
        }
    }

    /// What a daemon speaking `daemon_abi` makes of the request a client sends it.
    fn daemon_reads(c: &QpCreate, daemon_abi: u32) -> Result<CreateQpReq, DecodeError> {
        let (mask, req) = c.encode(daemon_abi);
        let msg = encode_request(Cmd::CreateQp, mask, req.as_bytes(), 64);
        decode_request(&msg)
            .unwrap()
            .body::<CreateQpReq>(daemon_abi)
    }

    #[test]
    fn create_flags_are_announced_only_to_a_daemon_that_knows_them() {
        let plain = rc();
        assert_eq!(plain.encode(1).0, 0, "ABI 1: no comp_mask bit");
        assert_eq!(plain.encode(2).0, CREATE_QP_CREATE_FLAGS);
        let got = daemon_reads(&plain, 1).unwrap();
        assert_eq!(
            got.present.get(),
            PRESENT_PD | PRESENT_SEND_CQ | PRESENT_RECV_CQ
        );
        assert_eq!(
            (
                got.pd.get(),
                got.send_cq.get(),
                got.recv_cq.get(),
                got.cap.max_send_wr.get()
            ),
            (1, 2, 3, 8)
        );
        assert_eq!(daemon_reads(&plain, 2).unwrap().create_flags.get(), 0);
        // Non-zero flags ride with their bit whatever the daemon speaks; an ABI 1 daemon
        // refuses them (EOPNOTSUPP) rather than ignoring them.
        let flagged = QpCreate {
            create_flags: 2,
            ..plain
        };
        assert_eq!(flagged.encode(1).0, CREATE_QP_CREATE_FLAGS);
        let e = daemon_reads(&flagged, 1).unwrap_err();
        assert_eq!(e.errno(), errno::EOPNOTSUPP);
        assert_eq!(daemon_reads(&flagged, 2).unwrap().create_flags.get(), 2);
    }

    #[test]
    fn an_xrc_recv_create_names_only_the_domain() {
        let c = QpCreate {
            qp_type: QpType::XrcRecv as u32,
            xrcd: Some(9),
            ..QpCreate::default()
        };
        let got = daemon_reads(&c, 2).unwrap();
        assert_eq!(
            (got.present.get(), got.xrcd.get(), got.qp_type.get()),
            (PRESENT_XRCD, 9, 10)
        );
        assert_eq!((got.pd.get(), got.send_cq.get(), got.srq.get()), (0, 0, 0));
    }

    #[test]
    fn objects_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Context>();
        check::<Pd<'static>>();
        check::<Cq<'static>>();
        check::<Qp<'static>>();
        check::<crate::Xrcd<'static>>();
        check::<crate::XrcRegistration<'static>>();
    }
}
