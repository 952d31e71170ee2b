//! `rdma_getaddrinfo(3)` / `rdma_freeaddrinfo`: names and services resolved with the
//! system's `getaddrinfo`, one result (the first address), marked with the port space and
//! QP type rdma_cm would give it.

use core::ffi::{c_char, c_int};

use crate::api::set_errno;
use crate::ffi::rdma_addrinfo;

const RAI_PASSIVE: c_int = 1;
const RAI_NUMERICHOST: c_int = 2;

/// A heap copy of a sockaddr (freed with the result).
unsafe fn copy_sa(sa: *const libc::sockaddr, len: libc::socklen_t) -> *mut libc::sockaddr {
    // SAFETY: `len` bytes are readable at `sa` (getaddrinfo's result or the hints').
    unsafe {
        let p = libc::malloc(len as usize).cast::<libc::sockaddr>();
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(sa.cast::<u8>(), p.cast::<u8>(), len as usize);
        }
        p
    }
}

unsafe extern "C" fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    if node.is_null() && service.is_null() {
        // SAFETY: NULL or the caller's hints.
        return unsafe { from_hints(hints.as_ref(), res) };
    }
    // SAFETY: NULL or the program's hints.
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags);
    // SAFETY: an all-zero addrinfo is valid hints.
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    ai.ai_family = h.map_or(0, |h| h.ai_family);
    ai.ai_socktype = libc::SOCK_STREAM;
    if flags & RAI_PASSIVE != 0 {
        ai.ai_flags |= libc::AI_PASSIVE;
    }
    if flags & RAI_NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    let mut found: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: C strings or NULL from the program; `found` receives the list.
    let r = unsafe { libc::getaddrinfo(node, service, &ai, &mut found) };
    if r != 0 || found.is_null() {
        set_errno(libc::EADDRNOTAVAIL);
        return r.min(-1);
    }
    // SAFETY: a zeroed result struct from calloc, filled below, freed by rdma_freeaddrinfo.
    unsafe {
        let out = libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()).cast::<rdma_addrinfo>();
        if out.is_null() {
            libc::freeaddrinfo(found);
            set_errno(libc::ENOMEM);
            return -1;
        }
        let f = &*found;
        let o = &mut *out;
        o.ai_flags = flags;
        o.ai_family = f.ai_family;
        o.ai_qp_type = h.map_or(0, |h| h.ai_qp_type);
        o.ai_port_space = h.map_or(0, |h| h.ai_port_space);
        if o.ai_port_space == 0 {
            o.ai_port_space = 0x0106; // RDMA_PS_TCP
        }
        if o.ai_qp_type == 0 {
            o.ai_qp_type = if o.ai_port_space == 0x0111 { 4 } else { 2 };
        }
        if flags & RAI_PASSIVE != 0 {
            o.ai_src_addr = copy_sa(f.ai_addr, f.ai_addrlen);
            o.ai_src_len = f.ai_addrlen;
        } else {
            o.ai_dst_addr = copy_sa(f.ai_addr, f.ai_addrlen);
            o.ai_dst_len = f.ai_addrlen;
            if let Some(h) = h.filter(|h| !h.ai_src_addr.is_null()) {
                o.ai_src_addr = copy_sa(h.ai_src_addr, h.ai_src_len);
                o.ai_src_len = h.ai_src_len;
            }
        }
        libc::freeaddrinfo(found);
        *res = out;
    }
    0
}
export!("rdma_getaddrinfo", "RDMACM_1.0", getaddrinfo);

/// Neither node nor service: rdma_getaddrinfo(3) then describes the addresses the hints
/// already hold (pyverbs' `AddrInfo(src=...)` asks this way); with none it is `EINVAL`.
unsafe fn from_hints(h: Option<&rdma_addrinfo>, res: *mut *mut rdma_addrinfo) -> c_int {
    let Some(h) = h.filter(|h| !h.ai_src_addr.is_null() || !h.ai_dst_addr.is_null()) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: a zeroed rdma_addrinfo is valid; the hints' sockaddrs are theirs to read for
    // their lengths.
    unsafe {
        let out = libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()).cast::<rdma_addrinfo>();
        if out.is_null() {
            set_errno(libc::ENOMEM);
            return -1;
        }
        let o = &mut *out;
        o.ai_flags = h.ai_flags;
        let first = if h.ai_src_addr.is_null() {
            h.ai_dst_addr
        } else {
            h.ai_src_addr
        };
        o.ai_family = i32::from((*first).sa_family);
        o.ai_port_space = if h.ai_port_space == 0 {
            0x0106
        } else {
            h.ai_port_space
        };
        o.ai_qp_type = match h.ai_qp_type {
            0 if o.ai_port_space == 0x0111 => 4,
            0 => 2,
            t => t,
        };
        if !h.ai_src_addr.is_null() {
            o.ai_src_addr = copy_sa(h.ai_src_addr, h.ai_src_len);
            o.ai_src_len = h.ai_src_len;
        }
        if !h.ai_dst_addr.is_null() {
            o.ai_dst_addr = copy_sa(h.ai_dst_addr, h.ai_dst_len);
            o.ai_dst_len = h.ai_dst_len;
        }
        *res = out;
    }
    0
}

unsafe extern "C" fn freeaddrinfo(mut res: *mut rdma_addrinfo) {
    while !res.is_null() {
        // SAFETY: a list from rdma_getaddrinfo: every pointer is ours (malloc/calloc).
        unsafe {
            let next = (*res).ai_next;
            libc::free((*res).ai_src_addr.cast());
            libc::free((*res).ai_dst_addr.cast());
            libc::free((*res).ai_src_canonname.cast());
            libc::free((*res).ai_dst_canonname.cast());
            libc::free(res.cast());
            res = next;
        }
    }
}
export!("rdma_freeaddrinfo", "RDMACM_1.0", freeaddrinfo);
