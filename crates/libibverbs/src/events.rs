//! Async events: `ibv_get_async_event(3)` / `ibv_ack_async_event(3)` on the context's
//! `async_fd` (an eventfd the daemon signals).

use std::ffi::{c_int, c_void};

use softverbs::Element;

use crate::ffi::*;
use crate::objects::*;
use crate::util::*;
use std::time::Duration;

// enum ibv_event_type values whose element is an object with an events counter.
const EVENT_CQ_ERR: c_int = 0;
const EVENT_SRQ_ERR: c_int = 14;
const EVENT_SRQ_LIMIT_REACHED: c_int = 15;
const EVENT_QP_LAST_WQE_REACHED: c_int = 16;

fn is_qp_event(t: c_int) -> bool {
    (1..=7).contains(&t) || t == EVENT_QP_LAST_WQE_REACHED
}

unsafe extern "C" fn get_async_event(c: *mut ibv_context, ev: *mut ibv_async_event) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return minus_one(EINVAL);
    };
    if ev.is_null() {
        return minus_one(EINVAL);
    }
    // Blocking unless the program made async_fd non-blocking (ibv_get_async_event(3)).
    let wait = (!nonblocking(o.vctx.context.async_fd)).then_some(None);
    loop {
        let got = match o
            .inner
            .get_async_event_within(wait.unwrap_or(Some(Duration::ZERO)))
        {
            Ok(Some(e)) => e,
            Ok(None) => return minus_one(EAGAIN),
            Err(e) => return minus_one(errno_of(&e)),
        };
        let el = o.elements.lock().unwrap_or_else(|p| p.into_inner());
        let (element, ty): (*mut c_void, u32) = match got.element {
            Element::Qp(h) => match el.qps.get(&h) {
                Some(&p) => (p as *mut c_void, got.raw_event_type),
                // Destroyed since: rdma-core never shows an event of a destroyed object.
                None => continue,
            },
            Element::Cq(h) => match el.cqs.get(&h) {
                Some(&p) => (p as *mut c_void, got.raw_event_type),
                None => continue,
            },
            Element::Srq(h) => match el.srqs.get(&h) {
                Some(&p) => (p as *mut c_void, got.raw_event_type),
                None => continue,
            },
            // Legacy registrations: element.xrc_qp_num and IBV_XRC_QP_EVENT_FLAG.
            Element::XrcRecvQpNum(qpn) => (qpn as usize as *mut c_void, got.legacy_event_type),
            Element::Port(p) => (usize::from(p) as *mut c_void, got.raw_event_type),
            Element::Device | Element::Unknown { .. } => (std::ptr::null_mut(), got.raw_event_type),
        };
        // SAFETY: the caller's event struct is writable.
        unsafe {
            ev.write(ibv_async_event {
                element,
                event_type: ty as c_int,
            })
        };
        return 0;
    }
}
export!(default "ibv_get_async_event", "IBVERBS_1.1", get_async_event);

unsafe extern "C" fn ack_async_event(ev: *mut ibv_async_event) {
    if ev.is_null() {
        return;
    }
    // SAFETY: the caller's event is one ibv_get_async_event filled.
    let e = unsafe { &*ev };
    let t = e.event_type;
    if t < 0 {
        // Flagged legacy events name a QP number, not an object.
        return;
    }
    if t == EVENT_CQ_ERR {
        // SAFETY: the element of a CQ event is a CQ of ours.
        if let Some(o) = unsafe { obj::<CqObj>(e.element as *mut ibv_cq) } {
            let b = &mut o.base.cq;
            // SAFETY: the CQ's own sync objects.
            unsafe { add_and_signal(&mut b.mutex, &mut b.cond, &mut b.async_events_completed, 1) };
        }
    } else if is_qp_event(t) {
        // SAFETY: the element of a QP event is a QP of ours.
        if let Some(o) = unsafe { obj::<QpObj>(e.element as *mut ibv_qp) } {
            let b = &mut o.base.qp_base;
            // SAFETY: the QP's own sync objects.
            unsafe { add_and_signal(&mut b.mutex, &mut b.cond, &mut b.events_completed, 1) };
        }
    } else if t == EVENT_SRQ_ERR || t == EVENT_SRQ_LIMIT_REACHED {
        // SAFETY: the element of an SRQ event is an SRQ of ours.
        if let Some(o) = unsafe { obj::<SrqObj>(e.element as *mut ibv_srq) } {
            let b = &mut o.base;
            // SAFETY: the SRQ's own sync objects.
            unsafe { add_and_signal(&mut b.mutex, &mut b.cond, &mut b.events_completed, 1) };
        }
    }
}
export!(default "ibv_ack_async_event", "IBVERBS_1.1", ack_async_event);
