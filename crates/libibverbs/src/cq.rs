//! CQs and completion channels: `ibv_create_cq(3)`, `ibv_poll_cq(3)`, `ibv_req_notify_cq(3)`,
//! `ibv_get_cq_event(3)`, `ibv_create_cq_ex(3)` with the `ibv_start_poll` family.

use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

use softverbs::WorkCompletion;

use crate::ffi::*;
use crate::objects::*;
use crate::util::*;

// ---- completion channels ---------------------------------------------------------------------

unsafe extern "C" fn create_comp_channel(c: *mut ibv_context) -> *mut ibv_comp_channel {
    let Some(o) = ctx_obj(c) else {
        return null_with(EINVAL);
    };
    let ch = match o.inner.create_comp_channel() {
        Ok(ch) => ch,
        Err(e) => return null_with(errno_of(&e)),
    };
    let fd = ch.fd().as_raw_fd();
    make_blocking(fd);
    hold(&o.users);
    into_c(ChannelObj {
        base: ibv_comp_channel {
            context: c,
            fd,
            refcnt: 0,
        },
        magic: LIVE,
        ctx: o,
        ch: Some(ch),
    }) as *mut ibv_comp_channel
}
export!(default "ibv_create_comp_channel", "IBVERBS_1.0", create_comp_channel);

unsafe extern "C" fn destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    // SAFETY: NULL or a channel of ours.
    let Some(o) = (unsafe { obj::<ChannelObj>(ch) }) else {
        return EINVAL;
    };
    // ibv_create_comp_channel(3): EBUSY while CQs still use it.
    if o.base.refcnt > 0 {
        return EBUSY;
    }
    o.magic = DEAD;
    o.ch = None;
    release(&o.ctx.users);
    0
}
export!(default "ibv_destroy_comp_channel", "IBVERBS_1.0", destroy_comp_channel);

unsafe extern "C" fn get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    cq_ctx_out: *mut *mut c_void,
) -> c_int {
    // SAFETY: NULL or a channel of ours.
    let Some(o) = (unsafe { obj::<ChannelObj>(ch) }) else {
        return minus_one(EINVAL);
    };
    let Some(chan) = o.ch() else {
        return minus_one(EINVAL);
    };
    let got = if nonblocking(o.base.fd) {
        // Drain the eventfd's count first, then look: an event queued after the drain signals
        // the fd again, so a poll() loop never misses one.
        chan.get_event(Some(std::time::Duration::ZERO))
    } else {
        chan.get_event(None)
    };
    let handle = match got {
        Ok(Some(h)) => h,
        Ok(None) => return minus_one(EAGAIN),
        Err(e) => return minus_one(errno_of(&e)),
    };
    let ptr = {
        let el = o.ctx.elements.lock().unwrap_or_else(|p| p.into_inner());
        el.cqs.get(&handle).copied()
    };
    let Some(ptr) = ptr else {
        // The CQ was destroyed between the event and now.
        return minus_one(EAGAIN);
    };
    let cq = ptr as *mut CqObj;
    // SAFETY: element maps hold only live CqObjs of this context; the out pointers are
    // writable per ibv_get_cq_event(3).
    unsafe {
        (*cq).comp_reported.fetch_add(1, Ordering::AcqRel);
        if !cq_out.is_null() {
            *cq_out = cq as *mut ibv_cq;
        }
        if !cq_ctx_out.is_null() {
            *cq_ctx_out = (*cq).base.cq.cq_context;
        }
    }
    0
}
export!(default "ibv_get_cq_event", "IBVERBS_1.1", get_cq_event);

unsafe extern "C" fn ack_cq_events(cq: *mut ibv_cq, n: u32) {
    // SAFETY: NULL or a CQ of ours.
    let Some(o) = (unsafe { obj::<CqObj>(cq) }) else {
        return;
    };
    let b = &mut o.base.cq;
    // SAFETY: the CQ's own mutex/cond, initialised at creation.
    unsafe { add_and_signal(&mut b.mutex, &mut b.cond, &mut b.comp_events_completed, n) };
}
export!(default "ibv_ack_cq_events", "IBVERBS_1.1", ack_cq_events);

// ---- CQs -------------------------------------------------------------------------------------

/// `IBV_WC_EX_WITH_*` flags softverbs fills: byte_len, imm, qp_num, src_qp, slid, sl,
/// dlid_path_bits, completion timestamp and wallclock timestamp.
const WC_EX_SUPPORTED: u64 = 0xff | (1 << 11);
const CQ_INIT_ATTR_MASK_FLAGS: u32 = 1;
const CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1;

fn make_cq(
    o: &'static CtxObj,
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: u32,
    wc_flags: u64,
) -> *mut CqObj {
    if cqe < 1 {
        return null_with(EINVAL);
    }
    // The kernel refuses a vector the device does not have (uverbs create_cq: EINVAL).
    if comp_vector >= o.vctx.context.num_comp_vectors as u32 {
        return null_with(EINVAL);
    }
    // SAFETY: NULL or a channel of ours.
    let ch = unsafe { obj::<ChannelObj>(channel) };
    if !channel.is_null() && ch.is_none() {
        return null_with(EINVAL);
    }
    let made = match &ch {
        Some(ch) => match ch.ch() {
            Some(chan) => o.inner.create_cq_with_channel(cqe as u32, chan),
            None => return null_with(EINVAL),
        },
        None => o.inner.create_cq(cqe as u32),
    };
    let cq = match made {
        Ok(cq) => cq,
        Err(e) => return null_with(errno_of(&e)),
    };
    // SAFETY: ibv_cq_ex is plain C data; zero is valid, and the live fields are set below.
    let mut base: ibv_cq_ex = unsafe { std::mem::zeroed() };
    base.cq.context = c;
    base.cq.channel = channel;
    base.cq.cq_context = cq_context;
    base.cq.handle = cq.handle();
    base.cq.cqe = cq.cqe() as c_int;
    base.start_poll = start_poll as *const c_void;
    base.next_poll = next_poll as *const c_void;
    base.end_poll = end_poll as *const c_void;
    base.read_opcode = read_opcode as *const c_void;
    base.read_vendor_err = read_vendor_err as *const c_void;
    base.read_byte_len = read_byte_len as *const c_void;
    base.read_imm_data = read_imm_data as *const c_void;
    base.read_qp_num = read_qp_num as *const c_void;
    base.read_src_qp = read_src_qp as *const c_void;
    base.read_wc_flags = read_wc_flags as *const c_void;
    base.read_slid = read_zero32 as *const c_void;
    base.read_sl = read_sl as *const c_void;
    base.read_dlid_path_bits = read_zero8 as *const c_void;
    base.read_completion_ts = read_completion_ts as *const c_void;
    base.read_cvlan = read_zero16 as *const c_void;
    base.read_flow_tag = read_zero32 as *const c_void;
    base.read_tm_info = read_tm_info as *const c_void;
    base.read_completion_wallclock_ns = read_wallclock as *const c_void;
    let handle = cq.handle();
    let ch_ptr = ch.as_ref().map_or(std::ptr::null_mut(), |c| {
        *c as *const ChannelObj as *mut ChannelObj
    });
    let p = into_c(CqObj {
        base,
        magic: LIVE,
        ctx: o,
        cq: Some(cq),
        channel: ch_ptr,
        users: AtomicU32::new(0),
        comp_reported: AtomicU32::new(0),
        wc_flags,
        poll: Mutex::new(PollState::default()),
        stashed: AtomicBool::new(false),
        idle: softverbs::idle::IdlePoll::default(),
    });
    // SAFETY: `p` is fresh; its mutex and cond are initialised once, here.
    unsafe { init_sync(&mut (*p).base.cq.mutex, &mut (*p).base.cq.cond) };
    if let Some(ch) = ch {
        ch.base.refcnt += 1;
    }
    hold(&o.users);
    o.remember(|e| &mut e.cqs, handle, p as usize);
    p
}

unsafe extern "C" fn create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let Some(o) = ctx_obj(c) else {
        return null_with(EINVAL);
    };
    make_cq(o, c, cqe, cq_context, channel, comp_vector as u32, 0) as *mut ibv_cq
}
export!(default "ibv_create_cq", "IBVERBS_1.1", create_cq);

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex(3)`).
pub unsafe extern "C" fn slot_create_cq_ex(
    c: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    let Some(o) = ctx_obj(c) else {
        return null_with(EINVAL);
    };
    if attr.is_null() {
        return null_with(EINVAL);
    }
    // SAFETY: the caller passed a readable attribute struct.
    let a = unsafe { &*attr };
    if a.comp_mask & !CQ_INIT_ATTR_MASK_FLAGS != 0 || a.wc_flags & !WC_EX_SUPPORTED != 0 {
        return null_with(EOPNOTSUPP);
    }
    if a.comp_mask & CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !CREATE_CQ_ATTR_SINGLE_THREADED != 0
    {
        return null_with(EOPNOTSUPP);
    }
    make_cq(
        o,
        c,
        a.cqe as c_int,
        a.cq_context,
        a.channel,
        a.comp_vector,
        a.wc_flags,
    ) as *mut ibv_cq_ex
}

unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: NULL or a CQ of ours.
    let Some(o) = (unsafe { obj::<CqObj>(cq) }) else {
        return EINVAL;
    };
    if busy(&o.users) {
        return EBUSY;
    }
    let Some(inner) = o.cq.take() else {
        return EINVAL;
    };
    let handle = inner.handle();
    let async_reported = match inner.destroy() {
        Ok(n) => n,
        Err(e) => return errno_of(&e),
    };
    o.ctx.forget(|e| &mut e.cqs, handle);
    let comp = o.comp_reported.load(Ordering::Acquire);
    let b = &mut o.base.cq;
    // SAFETY: the CQ's own sync objects; rdma-core's ibv_destroy_cq waits for the acks of
    // every event it handed out (libibverbs/cmd_cq.c).
    unsafe {
        wait_for(&mut b.mutex, &mut b.cond, &b.comp_events_completed, comp);
        wait_for(
            &mut b.mutex,
            &mut b.cond,
            &b.async_events_completed,
            async_reported,
        );
    }
    if !o.channel.is_null() {
        // SAFETY: the channel outlives its CQs (refcnt).
        unsafe { (*o.channel).base.refcnt -= 1 };
    }
    o.magic = DEAD;
    release(&o.ctx.users);
    0
}
export!(default "ibv_destroy_cq", "IBVERBS_1.1", destroy_cq);

unsafe extern "C" fn resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    // SAFETY: NULL or a CQ of ours.
    let Some(o) = (unsafe { obj::<CqObj>(cq) }) else {
        return EINVAL;
    };
    let Some(inner) = o.cq() else {
        return EINVAL;
    };
    if cqe < 1 {
        return EINVAL;
    }
    match inner.resize(cqe as u32) {
        Ok(n) => {
            o.base.cq.cqe = n as c_int;
            0
        }
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_resize_cq", "IBVERBS_1.1", resize_cq);

/// `ibv_wc.imm_data` of `wc`: with `IBV_WC_WITH_IMM` a `__be32` whose bytes in memory are
/// the ImmDt's on the wire (IBA 9.3), the engine's immediate being the number those bytes
/// spell big-endian; with `IBV_WC_WITH_INV` the same union is `invalidated_rkey`, a
/// host-order `uint32_t` (ibv_poll_cq(3)); issue 37, defect 3.
fn c_imm_data(wc: &WorkCompletion) -> u32 {
    if wc.wc_flags & softverbs_core::wr::WC_WITH_IMM != 0 {
        wc.imm_data.to_be()
    } else {
        wc.imm_data
    }
}

/// Copies one completion into a C `ibv_wc`.
fn write_wc(dst: &mut ibv_wc, wc: &WorkCompletion) {
    dst.wr_id = wc.wr_id;
    dst.status = wc.status as c_int;
    dst.opcode = wc.opcode as c_int;
    dst.vendor_err = 0;
    dst.byte_len = wc.byte_len;
    dst.imm_data = c_imm_data(wc);
    dst.qp_num = wc.qp_num;
    dst.src_qp = wc.src_qp;
    dst.wc_flags = wc.wc_flags;
    dst.pkey_index = 0;
    dst.slid = 0;
    dst.sl = wc.sl;
    dst.dlid_path_bits = 0;
}

/// `ibv_context.ops.poll_cq`, called by the inline `ibv_poll_cq`: the number of completions
/// written, or a negative value on error.
pub unsafe extern "C" fn op_poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: NULL or a CQ of ours.
    let Some(o) = (unsafe { obj_ref::<CqObj>(cq) }) else {
        return -EINVAL;
    };
    let Some(inner) = o.cq() else {
        return -EINVAL;
    };
    if n <= 0 {
        return 0;
    }
    if wc.is_null() {
        return -EINVAL;
    }
    let mut i = 0usize;
    if o.stashed.load(Ordering::Acquire) {
        let mut st = o.poll.lock().unwrap_or_else(|e| e.into_inner());
        while i < n as usize {
            let Some(w) = st.batch.pop_front() else {
                break;
            };
            // SAFETY: the caller's array holds `n` entries and i < n.
            write_wc(unsafe { &mut *wc.add(i) }, &w);
            i += 1;
        }
        if st.batch.is_empty() {
            o.stashed.store(false, Ordering::Release);
        }
        if i == n as usize {
            o.idle.got();
            return i as c_int;
        }
    }
    let stashed = i;
    let r = inner.poll_with(n as usize - stashed, |w| {
        // SAFETY: the caller's array holds `n` entries and poll_with hands at most `n`.
        write_wc(unsafe { &mut *wc.add(i) }, w);
        i += 1;
    });
    match r {
        Ok(0) if stashed > 0 => {
            o.idle.got();
            stashed as c_int
        }
        Ok(0) => {
            // Busy-polling programs (every pingpong, perftest) spin on this call; on a machine
            // with fewer cores than spinning parties the daemon that has to produce the
            // completion would wait for the poller's time slice otherwise
            // (docs/design/measurements.md §1: pollers must yield). A CQ only the direct path feeds
            // spins a little first (`softverbs::idle`).
            o.idle.idle(|| inner.fed_directly());
            0
        }
        Ok(k) => {
            o.idle.got();
            (stashed + k) as c_int
        }
        Err(e) => -errno_of(&e),
    }
}

/// Drops the completions of QP `qpn` that `cq` still holds (the QP entered RESET; mlx4 and
/// mlx5 clean their CQs the same way, and the daemon drops those it has not delivered yet).
/// The CQ's ring is emptied into its stash, which polls hand out first.
pub fn purge_qp(cq: *mut CqObj, qpn: u32) {
    // SAFETY: NULL or a CQ of ours (a QP's CQs outlive it).
    let Some(o) = (unsafe { obj::<CqObj>(cq as *mut ibv_cq) }) else {
        return;
    };
    let Some(inner) = o.cq() else {
        return;
    };
    let mut st = o.poll.lock().unwrap_or_else(|e| e.into_inner());
    let mut got = std::mem::take(&mut st.batch);
    // A failing poll leaves the rest in the ring, where polls find it.
    let _ = inner.poll_with(usize::MAX, |w| got.push_back(*w));
    got.retain(|w| w.qp_num != qpn);
    o.stashed.store(!got.is_empty(), Ordering::Release);
    st.batch = got;
}

/// `ibv_context.ops.req_notify_cq`.
pub unsafe extern "C" fn op_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: NULL or a CQ of ours.
    let Some(o) = (unsafe { obj_ref::<CqObj>(cq) }) else {
        return EINVAL;
    };
    let Some(inner) = o.cq() else {
        return EINVAL;
    };
    match inner.req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

// ---- extended polling (ibv_create_cq_ex(3)) --------------------------------------------------

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a writable timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

unsafe fn ex<'a>(cq: *mut ibv_cq_ex) -> Option<&'a mut CqObj> {
    // SAFETY: the caller's CQ is one of ours (the slots below are only reachable through it).
    unsafe { obj::<CqObj>(cq as *mut ibv_cq) }
}

fn load_next(o: &mut CqObj) -> c_int {
    let Some(inner) = o.cq() else {
        return EINVAL;
    };
    let mut st = o.poll.lock().unwrap_or_else(|e| e.into_inner());
    if st.batch.is_empty() {
        let mut got = std::mem::take(&mut st.batch);
        if let Err(e) = inner.poll_with(32, |w| got.push_back(*w)) {
            return errno_of(&e);
        }
        st.batch = got;
        // Completion time as this library saw it, in the 1 GHz "HCA clock"
        // (hca_core_clock) and in wall-clock nanoseconds.
        st.ts_ns = clock_ns(libc::CLOCK_MONOTONIC);
        st.wall_ns = clock_ns(libc::CLOCK_REALTIME);
    }
    match st.batch.pop_front() {
        Some(w) => {
            o.base.status = w.status as c_int;
            o.base.wr_id = w.wr_id;
            st.current = Some(w);
            0
        }
        None => {
            st.current = None;
            ENOENT
        }
    }
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: see `ex`.
    let Some(o) = (unsafe { ex(cq) }) else {
        return EINVAL;
    };
    // SAFETY: NULL or a readable attr.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return EINVAL;
    }
    load_next(o)
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: see `ex`.
    let Some(o) = (unsafe { ex(cq) }) else {
        return EINVAL;
    };
    load_next(o)
}

unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: see `ex`.
    if let Some(o) = unsafe { ex(cq) } {
        o.poll.lock().unwrap_or_else(|e| e.into_inner()).current = None;
    }
}

fn current<R>(cq: *mut ibv_cq_ex, f: impl FnOnce(&WorkCompletion, &PollState) -> R, d: R) -> R {
    // SAFETY: see `ex`.
    let Some(o) = (unsafe { ex(cq) }) else {
        return d;
    };
    let st = o.poll.lock().unwrap_or_else(|e| e.into_inner());
    match &st.current {
        Some(w) => f(w, &st),
        None => d,
    }
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> c_int {
    current(cq, |w, _| w.opcode as c_int, 0)
}
unsafe extern "C" fn read_vendor_err(_cq: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w, _| w.byte_len, 0)
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w, _| c_imm_data(w), 0)
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w, _| w.qp_num, 0)
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w, _| w.src_qp, 0)
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w, _| w.wc_flags, 0)
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    current(cq, |w, _| w.sl, 0)
}
unsafe extern "C" fn read_zero32(_cq: *mut ibv_cq_ex) -> u32 {
    0
}
unsafe extern "C" fn read_zero16(_cq: *mut ibv_cq_ex) -> u16 {
    0
}
unsafe extern "C" fn read_zero8(_cq: *mut ibv_cq_ex) -> u8 {
    0
}
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    current(cq, |_, st| st.ts_ns, 0)
}
unsafe extern "C" fn read_wallclock(cq: *mut ibv_cq_ex) -> u64 {
    current(cq, |_, st| st.wall_ns, 0)
}
unsafe extern "C" fn read_tm_info(_cq: *mut ibv_cq_ex, info: *mut u64) {
    if !info.is_null() {
        // SAFETY: struct ibv_wc_tm_info is {u64 tag; u32 priv;}: 16 bytes, zeroed.
        unsafe { std::ptr::write_bytes(info as *mut u8, 0, 16) };
    }
}

/// `verbs_context.query_rt_values` (`ibv_query_rt_values_ex(3)`): the HCA clock is
/// CLOCK_MONOTONIC in nanoseconds.
#[repr(C)]
pub struct ibv_values_ex {
    comp_mask: u32,
    raw_clock: libc::timespec,
}

/// `IBV_VALUES_MASK_RAW_CLOCK`.
const VALUES_MASK_RAW_CLOCK: u32 = 1;

pub unsafe extern "C" fn slot_query_rt_values(c: *mut ibv_context, v: *mut ibv_values_ex) -> c_int {
    if ctx_obj(c).is_none() || v.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's struct is writable.
    let v = unsafe { &mut *v };
    if v.comp_mask & !VALUES_MASK_RAW_CLOCK != 0 {
        return EOPNOTSUPP;
    }
    if v.comp_mask & VALUES_MASK_RAW_CLOCK != 0 {
        let ns = clock_ns(libc::CLOCK_MONOTONIC);
        v.raw_clock.tv_sec = (ns / 1_000_000_000) as libc::time_t;
        v.raw_clock.tv_nsec = (ns % 1_000_000_000) as libc::c_long;
    }
    0
}
