//! The objects C sees: each verbs.h struct at offset 0 of a Rust object that owns the client
//! object behind it.
//!
//! Lifetimes: a [`CtxObj`] leaks its [`softverbs::Context`] into a `'static` reference, and
//! children keep `'static` references into their parents' boxes. The C-side reference counts
//! (`users`) refuse to destroy a parent that still has children with `EBUSY`, as the kernel does
//! (uverbs usecnt), so those references never dangle. A destroyed object keeps its (small)
//! shell with `magic = DEAD`, so a call on a destroyed object returns `EINVAL` instead of
//! touching freed memory; the client object inside it is dropped at destroy.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use softverbs::{
    Ah, CompChannel, Context, Cq, Mr, Pd, Qp, Srq, WorkCompletion, XrcRecvQp, XrcRegistration, Xrcd,
};

use crate::ffi::*;

/// Marks a live object; any other value means destroyed (or not ours).
pub const LIVE: u32 = 0x5356_4c56; // "SVLV"
/// Marks a destroyed object's shell.
pub const DEAD: u32 = 0x5356_4444;

/// One device as `ibv_get_device_list` returns it. Devices live as long as the process
/// (rdma-core keeps them until the last reference too, and programs compare pointers).
#[repr(C)]
pub struct DevObj {
    pub base: ibv_device,
    pub index: u32,
    pub guid: u64,
    pub socket: PathBuf,
}

/// Which C pointer a daemon handle stands for, to name event elements.
#[derive(Default)]
pub struct Elements {
    pub qps: HashMap<u32, usize>,
    pub cqs: HashMap<u32, usize>,
    pub srqs: HashMap<u32, usize>,
}

/// An open device (`struct verbs_context`, whose last field is the `ibv_context`).
#[repr(C)]
pub struct CtxObj {
    pub vctx: verbs_context,
    pub magic: u32,
    pub inner: &'static Context,
    pub dev: *mut DevObj,
    pub elements: Mutex<Elements>,
    /// Objects still open on this context (close frees the context only at 0).
    pub users: AtomicU32,
}

// SAFETY: the raw pointers are to process-lifetime devices; the rest is Sync already.
unsafe impl Sync for CtxObj {}
// SAFETY: as above.
unsafe impl Send for CtxObj {}

impl CtxObj {
    /// Names `ptr` as the C object behind daemon handle `handle` in one of the element maps.
    pub fn remember(
        &self,
        map: fn(&mut Elements) -> &mut HashMap<u32, usize>,
        handle: u32,
        ptr: usize,
    ) {
        map(&mut self.elements.lock().unwrap_or_else(|e| e.into_inner())).insert(handle, ptr);
    }

    /// Forgets a destroyed object: later events about its handle are not shown to anyone.
    pub fn forget(&self, map: fn(&mut Elements) -> &mut HashMap<u32, usize>, handle: u32) {
        map(&mut self.elements.lock().unwrap_or_else(|e| e.into_inner())).remove(&handle);
    }

    /// The public context pointer C uses.
    pub fn ibv(&self) -> *mut ibv_context {
        std::ptr::addr_of!(self.vctx.context) as *mut ibv_context
    }
}

/// The `CtxObj` behind a context pointer from C (`verbs_get_ctx`: `ctx - 320`).
pub fn ctx_obj<'a>(c: *mut ibv_context) -> Option<&'a CtxObj> {
    if c.is_null() {
        return None;
    }
    let off = std::mem::offset_of!(verbs_context, context);
    // SAFETY: every ibv_context we hand out is the `context` field of a CtxObj's
    // verbs_context at offset 0 of that CtxObj; a caller's pointer to it is valid while
    // the context is open (the rdma-core contract).
    let o = unsafe { &*((c as *mut u8).sub(off) as *const CtxObj) };
    (o.magic == LIVE).then_some(o)
}

/// Reads a child object of ours back from its verbs.h pointer, if it is live.
///
/// # Safety
/// `p` is NULL or points to a `T` this library created (possibly destroyed since).
pub unsafe fn obj<'a, T: Magic>(p: *mut T::Base) -> Option<&'a mut T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per the contract, the base is at offset 0 of a T we allocated and never free.
    let o = unsafe { &mut *(p as *mut T) };
    (o.magic() == LIVE).then_some(o)
}

/// [`obj`] for the data path, where several threads may use one object at once (verbs are
/// thread-safe): a shared reference, so no two threads ever hold `&mut` to the same object.
///
/// # Safety
/// As for [`obj`].
pub unsafe fn obj_ref<'a, T: Magic>(p: *mut T::Base) -> Option<&'a T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per the contract, the base is at offset 0 of a T we allocated and never free.
    let o = unsafe { &*(p as *const T) };
    (o.magic() == LIVE).then_some(o)
}

/// Objects with a verbs.h base at offset 0 and a liveness mark.
pub trait Magic {
    type Base;
    fn magic(&self) -> u32;
}

/// `magic!(Type, verbs.h base, |o| its context)`: an object is live while it and its context
/// are (after `ibv_close_device` the daemon has torn everything down, and the client objects
/// inside still point at the dropped connection, so nothing may reach them).
macro_rules! magic {
    ($t:ty, $base:ty, |$o:ident| $ctx:expr) => {
        impl Magic for $t {
            type Base = $base;
            fn magic(&self) -> u32 {
                let $o = self;
                if $ctx.magic == LIVE {
                    self.magic
                } else {
                    DEAD
                }
            }
        }
    };
}

#[repr(C)]
pub struct PdObj {
    pub base: ibv_pd,
    pub magic: u32,
    pub ctx: &'static CtxObj,
    pub pd: Option<Pd<'static>>,
    pub users: AtomicU32,
    /// This PD's MRs by lkey, for the small sends the library copies itself
    /// (`qp::auto_inline`). An MR missing here only takes the daemon's path.
    pub mrs: std::sync::RwLock<HashMap<u32, MrRange>>,
}
magic!(PdObj, ibv_pd, |o| o.ctx);

/// Where an MR's IOVA range starts in this process.
#[derive(Clone, Copy, Debug)]
pub struct MrRange {
    pub iova: u64,
    pub len: u64,
    pub addr: usize,
}

impl PdObj {
    /// Records a registered MR (`ibv_reg_mr`).
    pub fn remember_mr(&self, lkey: u32, r: MrRange) {
        self.mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lkey, r);
    }

    /// Forgets an MR (`ibv_dereg_mr`; `ibv_rereg_mr`, after which its posts take the
    /// daemon's path).
    pub fn forget_mr(&self, lkey: u32) {
        self.mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&lkey);
    }

    /// The process address of `[iova, iova + len)` if one MR of this PD covers all of it.
    pub fn local_range(&self, lkey: u32, iova: u64, len: u64) -> Option<usize> {
        let m = self.mrs.read().unwrap_or_else(|e| e.into_inner());
        let r = m.get(&lkey)?;
        let off = iova.checked_sub(r.iova)?;
        (off.checked_add(len)? <= r.len).then(|| r.addr + off as usize)
    }

    /// The client PD with the `'static` lifetime children borrow it for.
    pub fn pd(&self) -> Option<&'static Pd<'static>> {
        // SAFETY: PdObj shells are never freed and the Pd is only taken (destroyed) once
        // `users` is 0, i.e. when no child borrows it any more.
        self.pd
            .as_ref()
            .map(|p| unsafe { &*(p as *const Pd<'static>) })
    }
}

#[repr(C)]
pub struct MrObj {
    pub base: ibv_mr,
    pub magic: u32,
    pub pd: &'static PdObj,
    pub mr: Option<Mr<'static>>,
}
magic!(MrObj, ibv_mr, |o| o.pd.ctx);

#[repr(C)]
pub struct AhObj {
    pub base: ibv_ah,
    pub magic: u32,
    pub pd: &'static PdObj,
    pub ah: Option<Ah<'static>>,
}
magic!(AhObj, ibv_ah, |o| o.pd.ctx);

#[repr(C)]
pub struct ChannelObj {
    pub base: ibv_comp_channel,
    pub magic: u32,
    pub ctx: &'static CtxObj,
    pub ch: Option<CompChannel<'static>>,
}
magic!(ChannelObj, ibv_comp_channel, |o| o.ctx);

impl ChannelObj {
    pub fn ch(&self) -> Option<&'static CompChannel<'static>> {
        // SAFETY: as PdObj::pd: destroyed only when no CQ uses it (refcnt 0).
        self.ch
            .as_ref()
            .map(|p| unsafe { &*(p as *const CompChannel<'static>) })
    }
}

/// Extended-poll state of a CQ (`ibv_start_poll` … `ibv_end_poll`).
#[derive(Default)]
pub struct PollState {
    pub batch: std::collections::VecDeque<WorkCompletion>,
    pub current: Option<WorkCompletion>,
    pub ts_ns: u64,
    pub wall_ns: u64,
}

/// A CQ; plain CQs use the same `ibv_cq_ex` image (its first 128 bytes are `ibv_cq`).
#[repr(C)]
pub struct CqObj {
    pub base: ibv_cq_ex,
    pub magic: u32,
    pub ctx: &'static CtxObj,
    pub cq: Option<Cq<'static>>,
    pub channel: *mut ChannelObj,
    pub users: AtomicU32,
    /// Completion events handed out by `ibv_get_cq_event` (destroy waits for their acks).
    pub comp_reported: AtomicU32,
    pub wc_flags: u64,
    pub poll: Mutex<PollState>,
    /// `poll.batch` holds completions `ibv_poll_cq` hands out before the ring's (set when a
    /// QP's reset took the CQ's completions out of the ring to drop that QP's).
    pub stashed: std::sync::atomic::AtomicBool,
    /// The current run of empty polls (spin or yield, `softverbs::idle`).
    pub idle: softverbs::idle::IdlePoll,
}
magic!(CqObj, ibv_cq, |o| o.ctx);

impl CqObj {
    pub fn cq(&self) -> Option<&'static Cq<'static>> {
        // SAFETY: as PdObj::pd: destroyed only when no QP or SRQ uses it.
        self.cq
            .as_ref()
            .map(|p| unsafe { &*(p as *const Cq<'static>) })
    }
}

#[repr(C)]
pub struct XrcdObj {
    pub base: ibv_xrcd,
    pub magic: u32,
    pub ctx: &'static CtxObj,
    pub xrcd: Option<Xrcd<'static>>,
    pub users: AtomicU32,
    /// Legacy and minimal-face registrations of this process, by QP number.
    pub regs: Mutex<HashMap<u32, Vec<XrcRegistration<'static>>>>,
}
magic!(XrcdObj, ibv_xrcd, |o| o.ctx);

impl XrcdObj {
    pub fn xrcd(&self) -> Option<&'static Xrcd<'static>> {
        // SAFETY: as PdObj::pd: closed only when no SRQ, QP or registration uses it.
        self.xrcd
            .as_ref()
            .map(|p| unsafe { &*(p as *const Xrcd<'static>) })
    }
}

#[repr(C)]
pub struct SrqObj {
    pub base: ibv_srq,
    pub magic: u32,
    pub ctx: &'static CtxObj,
    pub srq: Option<Srq<'static>>,
    pub pd: &'static PdObj,
    pub cq: *mut CqObj,
    pub xrcd: *mut XrcdObj,
    pub users: AtomicU32,
    pub srq_num: u32,
}
magic!(SrqObj, ibv_srq, |o| o.ctx);

impl SrqObj {
    pub fn srq(&self) -> Option<&'static Srq<'static>> {
        // SAFETY: as PdObj::pd: destroyed only when no QP uses it.
        self.srq
            .as_ref()
            .map(|p| unsafe { &*(p as *const Srq<'static>) })
    }
}

/// The client object behind a QP.
pub enum QpKind {
    Qp(Qp<'static>),
    XrcRecv(XrcRecvQp<'static>),
}

/// A work request being built with the `ibv_wr_*` API.
#[derive(Default)]
pub struct WrBuild {
    pub pending: Vec<crate::qp_ex::Staged>,
    pub error: Option<i32>,
}

#[repr(C)]
pub struct QpObj {
    pub base: ibv_qp_ex,
    pub magic: u32,
    pub ctx: &'static CtxObj,
    pub kind: Option<QpKind>,
    pub pd: *mut PdObj,
    pub send_cq: *mut CqObj,
    pub recv_cq: *mut CqObj,
    pub srq: *mut SrqObj,
    pub xrcd: *mut XrcdObj,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (only then is it an `ibv_qp_ex`).
    pub send_ops_flags: u64,
    pub max_inline: u32,
    pub wr: Mutex<WrBuild>,
}
magic!(QpObj, ibv_qp, |o| o.ctx);

impl QpObj {
    pub fn qp(&self) -> Option<&Qp<'static>> {
        match &self.kind {
            Some(QpKind::Qp(q)) => Some(q),
            _ => None,
        }
    }
}

/// Adds one user to a parent's count.
pub fn hold(c: &AtomicU32) {
    c.fetch_add(1, Ordering::AcqRel);
}

/// Drops one user from a parent's count.
pub fn release(c: &AtomicU32) {
    c.fetch_sub(1, Ordering::AcqRel);
}

/// Whether a parent still has users.
pub fn busy(c: &AtomicU32) -> bool {
    c.load(Ordering::Acquire) != 0
}
