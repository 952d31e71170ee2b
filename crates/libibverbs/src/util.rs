//! errno, the default slot implementations, and small conversions shared by the entry points.

use std::ffi::{c_int, c_void};

use crate::ffi::Slot;

pub use softverbs_core::errno::{EAGAIN, EBUSY, EINVAL, ENODATA, ENOENT, ENOSYS, EOPNOTSUPP};

// The one errno table (`softverbs_core::errno`) is written out by hand; this library is where
// its numbers reach C, so they must be this platform's.
const _: () = {
    use softverbs_core::errno as e;
    let pairs = [
        (e::EPERM, libc::EPERM),
        (e::ENOENT, libc::ENOENT),
        (e::EIO, libc::EIO),
        (e::EFAULT, libc::EFAULT),
        (e::EBADF, libc::EBADF),
        (e::EAGAIN, libc::EAGAIN),
        (e::ENOMEM, libc::ENOMEM),
        (e::EBUSY, libc::EBUSY),
        (e::EEXIST, libc::EEXIST),
        (e::ENODEV, libc::ENODEV),
        (e::EINVAL, libc::EINVAL),
        (e::EPIPE, libc::EPIPE),
        (e::ENOSYS, libc::ENOSYS),
        (e::ENODATA, libc::ENODATA),
        (e::EPROTO, libc::EPROTO),
        (e::EMSGSIZE, libc::EMSGSIZE),
        (e::EPROTONOSUPPORT, libc::EPROTONOSUPPORT),
        (e::EOPNOTSUPP, libc::EOPNOTSUPP),
        (e::ECONNRESET, libc::ECONNRESET),
        (e::ENOTCONN, libc::ENOTCONN),
        (e::ECONNREFUSED, libc::ECONNREFUSED),
    ];
    let mut i = 0;
    while i < pairs.len() {
        assert!(
            pairs[i].0 == pairs[i].1,
            "softverbs_core::errno differs from libc"
        );
        i += 1;
    }
    assert!(e::O_CREAT as i32 == libc::O_CREAT && e::O_EXCL as i32 == libc::O_EXCL);
};

/// Whether the program made `fd` non-blocking (then `ibv_get_cq_event` and
/// `ibv_get_async_event` answer -1/EAGAIN instead of waiting).
pub fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on any descriptor number is harmless (EBADF at worst).
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Returns NULL with `errno = e` (rdma-core's convention for constructors).
pub fn null_with<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// The errno a client error carries (rdma-core returns the kernel's errno the same way).
pub fn errno_of(e: &softverbs::Error) -> c_int {
    e.errno() as c_int
}

/// `-1` with `errno` set (rdma-core's convention for `ibv_get_*_event`).
pub fn minus_one(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// Default for every `int`-returning slot softverbs does not implement (rdma-core's
/// dummy_ops return `EOPNOTSUPP`). Called with the slot's arguments, which the System V ABI
/// lets a function without parameters ignore.
pub extern "C" fn slot_unsupported_int() -> c_int {
    EOPNOTSUPP
}

/// Default for pointer-returning slots: NULL with `errno = EOPNOTSUPP`.
pub extern "C" fn slot_unsupported_ptr() -> *mut c_void {
    null_with(EOPNOTSUPP)
}

/// Slot value of an `int` dummy.
pub fn int_slot() -> Slot {
    slot_unsupported_int as *const c_void
}

/// Slot value of a pointer dummy.
pub fn ptr_slot() -> Slot {
    slot_unsupported_ptr as *const c_void
}

/// Initialises a pthread mutex and condition variable that C code (`ibv_ack_*`) will use.
///
/// # Safety
/// Both pointers point to writable storage of the right type that nothing else uses yet.
pub unsafe fn init_sync(m: *mut libc::pthread_mutex_t, c: *mut libc::pthread_cond_t) {
    // SAFETY: the caller passes fresh storage; default attributes (NULL) are always valid.
    unsafe {
        libc::pthread_mutex_init(m, std::ptr::null());
        libc::pthread_cond_init(c, std::ptr::null());
    }
}

/// Adds `n` to a counter under `m` and wakes waiters on `c` (`ibv_ack_cq_events`,
/// `ibv_ack_async_event`).
///
/// # Safety
/// The three pointers belong to one live object initialised by [`init_sync`].
pub unsafe fn add_and_signal(
    m: *mut libc::pthread_mutex_t,
    c: *mut libc::pthread_cond_t,
    counter: *mut u32,
    n: u32,
) {
    // SAFETY: per the contract, the mutex guards the counter and both are initialised.
    unsafe {
        libc::pthread_mutex_lock(m);
        *counter = (*counter).wrapping_add(n);
        libc::pthread_cond_broadcast(c);
        libc::pthread_mutex_unlock(m);
    }
}

/// Waits until `*counter >= target` (the `ibv_destroy_*` wait for acknowledged events,
/// rdma-core libibverbs/cmd_cq.c and cmd_qp.c).
///
/// # Safety
/// As for [`add_and_signal`].
pub unsafe fn wait_for(
    m: *mut libc::pthread_mutex_t,
    c: *mut libc::pthread_cond_t,
    counter: *const u32,
    target: u32,
) {
    // SAFETY: per the contract; the counter is only read under its mutex.
    unsafe {
        libc::pthread_mutex_lock(m);
        // Other threads change the counter under the mutex, which cond_wait releases.
        while std::ptr::read_volatile(counter) < target {
            libc::pthread_cond_wait(c, m);
        }
        libc::pthread_mutex_unlock(m);
    }
}

/// Copies a NUL-terminated name into a fixed C array (truncating, always terminated).
pub fn copy_name(dst: &mut [std::ffi::c_char], src: &str) {
    let n = src.len().min(dst.len() - 1);
    for (d, s) in dst.iter_mut().zip(src.as_bytes()[..n].iter()) {
        *d = *s as std::ffi::c_char;
    }
    dst[n] = 0;
}

/// A heap object handed to C. It is never freed: a destroyed object keeps its shell, marked
/// dead, so a late call on it is refused instead of touching freed memory (objects.rs).
pub fn into_c<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Makes `fd` blocking, as rdma-core's channel and async fds are until the program sets
/// `O_NONBLOCK` itself (ibv_get_cq_event(3) and ibv_get_async_event(3) then return EAGAIN).
/// The daemon's eventfds arrive non-blocking; the daemon only ever adds to them, which blocks
/// only at a counter of 2^64 - 2.
pub fn make_blocking(fd: c_int) {
    // SAFETY: fcntl on a descriptor we own; failure leaves it as it was.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}
