//! rsockets (rsocket(7)): stream sockets over RDMA-CM RC connections, the `r*` calls of
//! `rdma/rsocket.h`. Each rsocket is a real file descriptor number (an eventfd the
//! library owns, so numbers never collide with the program's own fds) naming a [`Sock`];
//! the protocol between two rsockets is docs/rsockets.md.
//!
//! Blocking calls and `rpoll` wait by driving the socket (CQ polls, CM events) between
//! short sleeps: softverbs' CQs complete in the daemon, not on an interrupt.

mod ib;
mod stream;

use core::ffi::{c_int, c_void};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use stream::{Conn, Info, Opts, Sock, State};

use crate::api::{self, set_errno};
use crate::cm::ev;
use crate::ffi::*;

type Shared = Arc<Mutex<Sock>>;

static SOCKS: Mutex<Option<HashMap<c_int, Shared>>> = Mutex::new(None);

fn table() -> MutexGuard<'static, Option<HashMap<c_int, Shared>>> {
    SOCKS.lock().unwrap_or_else(|e| e.into_inner())
}

fn get(fd: c_int) -> Result<Shared, i32> {
    table()
        .as_ref()
        .and_then(|t| t.get(&fd).cloned())
        .ok_or(libc::EBADF)
}

fn lock(s: &Shared) -> MutexGuard<'_, Sock> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn ret(r: Result<c_int, i32>) -> c_int {
    match r {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn retz(r: Result<isize, i32>) -> isize {
    match r {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// One wait step: yields at first, then sleeps up to 200 us.
pub(crate) fn backoff(round: u32) {
    if round < 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Drives the shared socket `sh` until `step` gives a result, unlocking it between rounds
/// (another thread may send while one waits to receive); ETIMEDOUT after `limit`.
fn drive<T>(
    sh: &Shared,
    limit: Option<Duration>,
    mut step: impl FnMut(&mut Sock) -> Option<Result<T, i32>>,
) -> Result<T, i32> {
    let start = Instant::now();
    let mut round = 0;
    loop {
        {
            let mut s = lock(sh);
            s.progress();
            if let Some(r) = step(&mut s) {
                return r;
            }
        }
        if limit.is_some_and(|l| start.elapsed() > l) {
            return Err(libc::ETIMEDOUT);
        }
        backoff(round);
        round += 1;
    }
}

/// Drives `s` until `done` says yes, or fails with ETIMEDOUT after `limit`.
fn wait(
    s: &mut Sock,
    limit: Option<Duration>,
    mut done: impl FnMut(&Sock) -> bool,
) -> Result<(), i32> {
    let start = Instant::now();
    let mut round = 0;
    loop {
        s.progress();
        if done(s) {
            return Ok(());
        }
        if limit.is_some_and(|l| start.elapsed() > l) {
            return Err(libc::ETIMEDOUT);
        }
        backoff(round);
        round += 1;
    }
}

fn new_chan() -> Result<*mut rdma_event_channel, i32> {
    // SAFETY: our own entry point.
    let ch = unsafe { api::create_event_channel() };
    if ch.is_null() {
        return Err(stream::errno());
    }
    // SAFETY: the channel's fd; events are pumped without blocking.
    unsafe {
        let fd = (*ch).fd;
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        );
    }
    Ok(ch)
}

fn install(s: Sock) -> Result<c_int, i32> {
    // SAFETY: a plain eventfd, the socket's number.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(stream::errno());
    }
    table()
        .get_or_insert_with(HashMap::new)
        .insert(fd, Arc::new(Mutex::new(s)));
    Ok(fd)
}

/// RDMA_PS_TCP.
const PS_TCP: c_int = 0x0106;

unsafe extern "C" fn rsocket(domain: c_int, ty: c_int, _proto: c_int) -> c_int {
    ret((|| {
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return Err(libc::EAFNOSUPPORT);
        }
        if ty & 0xf != libc::SOCK_STREAM {
            return Err(libc::ESOCKTNOSUPPORT);
        }
        let ch = new_chan()?;
        let mut id = std::ptr::null_mut();
        // SAFETY: our entry point, our channel.
        if unsafe { api::create_id(ch, &mut id, std::ptr::null_mut(), PS_TCP) } != 0 {
            let e = stream::errno();
            // SAFETY: ours, unused.
            unsafe { api::destroy_event_channel(ch) };
            return Err(e);
        }
        install(Sock {
            domain,
            nonblock: ty & libc::SOCK_NONBLOCK != 0,
            state: State::Fresh,
            own_chan: ch,
            id,
            backlog: Default::default(),
            conn: None,
            err: 0,
            opts: Opts::default(),
            rd_shut: false,
            established: false,
        })
    })())
}
export!("rsocket", "RDMACM_1.0", rsocket);

unsafe extern "C" fn rbind(fd: c_int, addr: *const libc::sockaddr, _len: libc::socklen_t) -> c_int {
    ret((|| {
        let s = get(fd)?;
        let s = lock(&s);
        if s.state != State::Fresh || addr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: our id; the program's sockaddr.
        if unsafe { api::bind_addr(s.id, addr as *mut _) } != 0 {
            return Err(stream::errno());
        }
        Ok(0)
    })())
}
export!("rbind", "RDMACM_1.0", rbind);

unsafe extern "C" fn rlisten(fd: c_int, backlog: c_int) -> c_int {
    ret((|| {
        let s = get(fd)?;
        let mut s = lock(&s);
        if s.state == State::Listening {
            return Ok(0);
        }
        if s.state != State::Fresh {
            return Err(libc::EINVAL);
        }
        // SAFETY: our id.
        if unsafe { api::listen(s.id, backlog) } != 0 {
            return Err(stream::errno());
        }
        s.state = State::Listening;
        Ok(0)
    })())
}
export!("rlisten", "RDMACM_1.0", rlisten);

/// Copies `src` into a program's (addr, len) pair as accept(2)/getsockname(2) do.
///
/// # Safety
/// `addr`/`len` are NULL or the program's buffer and its size.
unsafe fn put_addr(
    src: &libc::sockaddr_storage,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let full = if src.ss_family as c_int == libc::AF_INET6 {
        std::mem::size_of::<libc::sockaddr_in6>()
    } else {
        std::mem::size_of::<libc::sockaddr_in>()
    };
    // SAFETY: the caller's promise; at most the program's length is written.
    unsafe {
        let n = full.min(*len as usize);
        std::ptr::copy_nonoverlapping(
            (src as *const libc::sockaddr_storage).cast::<u8>(),
            addr.cast::<u8>(),
            n,
        );
        *len = full as libc::socklen_t;
    }
}

unsafe extern "C" fn raccept(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    ret((|| {
        let sh = get(fd)?;
        loop {
            let (child, pd, domain, opts, nonblock) = drive(&sh, None, |l| {
                if l.state != State::Listening {
                    return Some(Err(libc::EINVAL));
                }
                match l.backlog.pop_front() {
                    Some((c, pd)) => Some(Ok((c, pd, l.domain, l.opts, l.nonblock))),
                    None if l.nonblock => Some(Err(libc::EAGAIN)),
                    None => None,
                }
            })?;
            match accept_one(domain, opts, child, &pd) {
                Ok(s) => {
                    // SAFETY: the new id's peer address; the program's buffer.
                    unsafe { put_addr(&(*s.id).route.addr.dst, addr, len) };
                    return install(s);
                }
                Err(_) if nonblock => return Err(libc::EAGAIN),
                Err(_) => continue,
            }
        }
    })())
}
export!("raccept", "RDMACM_1.0", raccept);

/// Answers one connect request: QP and buffers, the REP with our buffer info, the wait
/// for the RTU.
fn accept_one(domain: c_int, opts: Opts, child: *mut rdma_cm_id, pd: &[u8]) -> Result<Sock, i32> {
    let mut s = Sock {
        domain,
        nonblock: false,
        state: State::Connecting,
        own_chan: std::ptr::null_mut(),
        id: child,
        backlog: Default::default(),
        conn: None,
        err: 0,
        opts,
        rd_shut: false,
        established: false,
    };
    let r = (|| {
        let peer = Info::parse(pd).ok_or(libc::EPROTO)?;
        let mut c = Conn::new(child, &s.opts)?;
        c.set_peer(peer);
        let info = c.info().emit();
        s.conn = Some(c);
        let mut p = conn_param(&info);
        // SAFETY: our child id and parameters.
        if unsafe { api::accept(child, &mut p) } != 0 {
            return Err(stream::errno());
        }
        wait(&mut s, Some(Duration::from_secs(10)), |s| {
            s.established || s.conn.as_ref().is_some_and(|c| c.disconnected)
        })?;
        if !s.established {
            return Err(libc::ECONNABORTED);
        }
        s.state = State::Connected;
        Ok(())
    })();
    match r {
        Ok(()) => Ok(s),
        Err(e) => {
            if s.conn.is_none() {
                // SAFETY: our child id.
                unsafe { api::reject(child, std::ptr::null(), 0) };
            }
            s.close();
            Err(e)
        }
    }
}

fn conn_param(info: &[u8; 28]) -> rdma_conn_param {
    rdma_conn_param {
        private_data: info.as_ptr().cast(),
        private_data_len: info.len() as u8,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

unsafe extern "C" fn rconnect(
    fd: c_int,
    addr: *const libc::sockaddr,
    _len: libc::socklen_t,
) -> c_int {
    ret((|| {
        let sh = get(fd)?;
        let mut s = lock(&sh);
        match s.state {
            State::Fresh => {}
            State::Connecting => return Err(libc::EALREADY),
            State::Connected => return Err(libc::EISCONN),
            _ => return Err(libc::EINVAL),
        }
        if addr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: our id; the program's address. Resolution is local: its events are
        // queued at once.
        if unsafe { api::resolve_addr(s.id, std::ptr::null_mut(), addr as *mut _, 2000) } != 0 {
            return Err(stream::errno());
        }
        expect_local(&mut s, ev::ADDR_RESOLVED)?;
        // SAFETY: as above.
        if unsafe { api::resolve_route(s.id, 2000) } != 0 {
            return Err(stream::errno());
        }
        expect_local(&mut s, ev::ROUTE_RESOLVED)?;
        let c = Conn::new(s.id, &s.opts)?;
        let info = c.info().emit();
        s.conn = Some(c);
        let mut p = conn_param(&info);
        // SAFETY: our id and parameters.
        if unsafe { api::connect(s.id, &mut p) } != 0 {
            return Err(stream::errno());
        }
        s.state = State::Connecting;
        if s.nonblock {
            return Err(libc::EINPROGRESS);
        }
        drop(s);
        drive(&sh, None, |s| match s.state {
            State::Connecting => None,
            State::Failed => Some(Err(std::mem::take(&mut s.err))),
            _ => Some(Ok(0)),
        })
    })())
}
export!("rconnect", "RDMACM_1.0", rconnect);

/// Takes the address or route resolution event our own id queued.
fn expect_local(s: &mut Sock, want: i32) -> Result<(), i32> {
    let ch = s.chan();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut e: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: our channel (non-blocking).
        if unsafe { api::get_cm_event(ch, &mut e) } == 0 {
            // SAFETY: the event just returned.
            let (kind, status) = unsafe { ((*e).event, (*e).status) };
            // SAFETY: ours.
            unsafe { api::ack_cm_event(e) };
            if kind == want {
                return Ok(());
            }
            return Err(if status < 0 {
                -status
            } else {
                libc::EHOSTUNREACH
            });
        }
        if Instant::now() > deadline {
            return Err(libc::ETIMEDOUT);
        }
        backoff(0);
    }
}

unsafe extern "C" fn rshutdown(fd: c_int, how: c_int) -> c_int {
    ret((|| {
        let sh = get(fd)?;
        let mut s = lock(&sh);
        if s.state != State::Connected {
            return Err(libc::ENOTCONN);
        }
        if how == libc::SHUT_RD || how == libc::SHUT_RDWR {
            s.rd_shut = true;
        }
        if how == libc::SHUT_WR || how == libc::SHUT_RDWR {
            drop(s);
            drive(&sh, Some(Duration::from_secs(5)), |s| {
                let c = s.conn.as_mut()?;
                (c.try_fin() || c.reset).then_some(Ok(()))
            })?;
        }
        Ok(0)
    })())
}
export!("rshutdown", "RDMACM_1.0", rshutdown);

unsafe extern "C" fn rclose(fd: c_int) -> c_int {
    let Some(s) = table().as_mut().and_then(|t| t.remove(&fd)) else {
        set_errno(libc::EBADF);
        return -1;
    };
    lock(&s).close();
    // SAFETY: the eventfd install made.
    unsafe { libc::close(fd) };
    0
}
export!("rclose", "RDMACM_1.0", rclose);

// ---- data ---------------------------------------------------------------------------

fn do_recv(fd: c_int, buf: &mut [u8], flags: c_int) -> Result<isize, i32> {
    let sh = get(fd)?;
    let peek = flags & libc::MSG_PEEK != 0;
    let all = flags & libc::MSG_WAITALL != 0 && !peek;
    let mut got = 0;
    drive(&sh, None, |s| {
        if s.state != State::Connected {
            return Some(Err(libc::ENOTCONN));
        }
        let nonblock = s.nonblock || flags & libc::MSG_DONTWAIT != 0;
        let rd_shut = s.rd_shut;
        let Some(c) = s.conn.as_mut() else {
            return Some(Err(libc::EBADF));
        };
        got += c.recv(&mut buf[got..], peek);
        let some = if got > 0 { Ok(got as isize) } else { Err(0) };
        if got == buf.len() || (got > 0 && !all) || rd_shut || c.fin_recv {
            return Some(Ok(got as isize));
        }
        if c.reset {
            return Some(some.map_err(|_| libc::ECONNRESET));
        }
        if nonblock {
            return Some(some.map_err(|_| libc::EAGAIN));
        }
        None
    })
}

fn do_send(fd: c_int, buf: &[u8], flags: c_int) -> Result<isize, i32> {
    let sh = get(fd)?;
    let mut sent = 0;
    drive(&sh, None, |s| {
        if s.state != State::Connected {
            return Some(Err(libc::ENOTCONN));
        }
        let nonblock = s.nonblock || flags & libc::MSG_DONTWAIT != 0;
        let Some(c) = s.conn.as_mut() else {
            return Some(Err(libc::EBADF));
        };
        let some = if sent > 0 { Ok(sent as isize) } else { Err(0) };
        if c.reset {
            return Some(some.map_err(|_| libc::ECONNRESET));
        }
        if c.fin_sent {
            return Some(Err(libc::EPIPE));
        }
        match c.send(&buf[sent..]) {
            Ok(n) => sent += n,
            Err(e) => return Some(Err(e)),
        }
        if sent == buf.len() {
            return Some(Ok(sent as isize));
        }
        if nonblock {
            return Some(if sent > 0 {
                Ok(sent as isize)
            } else {
                Err(libc::EAGAIN)
            });
        }
        None
    })
}

/// # Safety
/// `buf` is NULL with `len` 0 or the program's buffer of `len` bytes.
unsafe fn slice_mut<'a>(buf: *mut c_void, len: usize) -> &'a mut [u8] {
    if buf.is_null() || len == 0 {
        &mut []
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }
    }
}

/// # Safety
/// As [`slice_mut`].
unsafe fn slice<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
    if buf.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(buf.cast(), len) }
    }
}

unsafe extern "C" fn rrecv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    // SAFETY: the program's buffer.
    retz(do_recv(fd, unsafe { slice_mut(buf, len) }, flags))
}
export!("rrecv", "RDMACM_1.0", rrecv);

unsafe extern "C" fn rrecvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    _src: *mut libc::sockaddr,
    _slen: *mut libc::socklen_t,
) -> isize {
    // SAFETY: the program's buffer; a stream socket leaves the address alone (recv(2)).
    retz(do_recv(fd, unsafe { slice_mut(buf, len) }, flags))
}
export!("rrecvfrom", "RDMACM_1.0", rrecvfrom);

unsafe extern "C" fn rread(fd: c_int, buf: *mut c_void, len: usize) -> isize {
    // SAFETY: the program's buffer.
    retz(do_recv(fd, unsafe { slice_mut(buf, len) }, 0))
}
export!("rread", "RDMACM_1.0", rread);

/// # Safety
/// `iov` is NULL or `n` iovecs of the program.
unsafe fn iovecs<'a>(iov: *const libc::iovec, n: c_int) -> Result<&'a [libc::iovec], i32> {
    if n < 0 || (iov.is_null() && n > 0) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(iov, n as usize) })
}

/// Receives into a vector of buffers: one receive into a bounce buffer, scattered.
///
/// # Safety
/// As [`iovecs`], each iovec the program's buffer.
unsafe fn recv_iov(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    flags: c_int,
) -> Result<isize, i32> {
    // SAFETY: the caller's promise.
    let v = unsafe { iovecs(iov, n) }?;
    let total: usize = v.iter().map(|i| i.iov_len).sum();
    let mut tmp = vec![0u8; total];
    let got = do_recv(fd, &mut tmp, flags)? as usize;
    let mut off = 0;
    for i in v {
        if off >= got {
            break;
        }
        let k = i.iov_len.min(got - off);
        // SAFETY: the program's buffer of iov_len >= k bytes.
        unsafe { slice_mut(i.iov_base, k) }.copy_from_slice(&tmp[off..off + k]);
        off += k;
    }
    Ok(got as isize)
}

/// # Safety
/// As [`recv_iov`].
unsafe fn send_iov(
    fd: c_int,
    iov: *const libc::iovec,
    n: c_int,
    flags: c_int,
) -> Result<isize, i32> {
    // SAFETY: the caller's promise.
    let v = unsafe { iovecs(iov, n) }?;
    let mut tmp = Vec::new();
    for i in v {
        // SAFETY: the program's buffer.
        tmp.extend_from_slice(unsafe { slice(i.iov_base, i.iov_len) });
    }
    do_send(fd, &tmp, flags)
}

unsafe extern "C" fn rreadv(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    // SAFETY: the program's iovecs.
    retz(unsafe { recv_iov(fd, iov, n, 0) })
}
export!("rreadv", "RDMACM_1.0", rreadv);

unsafe extern "C" fn rrecvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    if msg.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the program's msghdr.
    let m = unsafe { &mut *msg };
    m.msg_controllen = 0;
    m.msg_flags = 0;
    // SAFETY: its iovecs.
    retz(unsafe { recv_iov(fd, m.msg_iov, m.msg_iovlen as c_int, flags) })
}
export!("rrecvmsg", "RDMACM_1.0", rrecvmsg);

unsafe extern "C" fn rsend(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    // SAFETY: the program's buffer.
    retz(do_send(fd, unsafe { slice(buf, len) }, flags))
}
export!("rsend", "RDMACM_1.0", rsend);

unsafe extern "C" fn rsendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    _dst: *const libc::sockaddr,
    _dlen: libc::socklen_t,
) -> isize {
    // SAFETY: the program's buffer; a connected stream ignores the address (send(2)).
    retz(do_send(fd, unsafe { slice(buf, len) }, flags))
}
export!("rsendto", "RDMACM_1.0", rsendto);

unsafe extern "C" fn rwrite(fd: c_int, buf: *const c_void, len: usize) -> isize {
    // SAFETY: the program's buffer.
    retz(do_send(fd, unsafe { slice(buf, len) }, 0))
}
export!("rwrite", "RDMACM_1.0", rwrite);

unsafe extern "C" fn rwritev(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    // SAFETY: the program's iovecs.
    retz(unsafe { send_iov(fd, iov, n, 0) })
}
export!("rwritev", "RDMACM_1.0", rwritev);

unsafe extern "C" fn rsendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    if msg.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the program's msghdr and its iovecs.
    retz(unsafe { send_iov(fd, (*msg).msg_iov, (*msg).msg_iovlen as c_int, flags) })
}
export!("rsendmsg", "RDMACM_1.0", rsendmsg);

// ---- readiness ------------------------------------------------------------------------

unsafe extern "C" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    if fds.is_null() && nfds > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    let fds = if nfds == 0 {
        &mut [][..]
    } else {
        // SAFETY: the program's array of `nfds` entries.
        unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
    };
    ret(poll_slice(fds, timeout))
}
export!("rpoll", "RDMACM_1.0", rpoll);

fn poll_slice(fds: &mut [libc::pollfd], timeout: c_int) -> Result<c_int, i32> {
    let socks: Vec<Option<Shared>> = fds.iter().map(|p| get(p.fd).ok()).collect();
    let mut others: Vec<libc::pollfd> = fds
        .iter()
        .zip(&socks)
        .filter(|(_, s)| s.is_none())
        .map(|(p, _)| libc::pollfd { revents: 0, ..*p })
        .collect();
    let start = Instant::now();
    let mut round = 0;
    loop {
        let mut n = 0;
        for (p, s) in fds.iter_mut().zip(&socks) {
            p.revents = 0;
            if let Some(s) = s {
                let mut s = lock(s);
                s.progress();
                p.revents = s.revents() & (p.events | libc::POLLERR | libc::POLLHUP);
                if p.revents != 0 {
                    n += 1;
                }
            }
        }
        if !others.is_empty() {
            // SAFETY: our copy of the program's plain fds.
            let r = unsafe { libc::poll(others.as_mut_ptr(), others.len() as libc::nfds_t, 0) };
            if r < 0 {
                return Err(stream::errno());
            }
            let mut it = others.iter();
            for (p, s) in fds.iter_mut().zip(&socks) {
                if s.is_none() {
                    p.revents = it.next().expect("one per plain fd").revents;
                    if p.revents != 0 {
                        n += 1;
                    }
                }
            }
        }
        if n > 0 || timeout == 0 {
            return Ok(n);
        }
        if timeout > 0 && start.elapsed() >= Duration::from_millis(timeout as u64) {
            return Ok(0);
        }
        backoff(round);
        round += 1;
    }
}

unsafe extern "C" fn rselect(
    nfds: c_int,
    rd: *mut libc::fd_set,
    wr: *mut libc::fd_set,
    ex: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    let mut pfds = Vec::new();
    let sets = [(rd, libc::POLLIN), (wr, libc::POLLOUT), (ex, libc::POLLPRI)];
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut events = 0;
        for &(set, ev) in &sets {
            // SAFETY: NULL or the program's fd_set.
            if !set.is_null() && unsafe { libc::FD_ISSET(fd, set) } {
                events |= ev;
            }
        }
        if events != 0 {
            pfds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    let timeout = if tv.is_null() {
        -1
    } else {
        // SAFETY: the program's timeval.
        let t = unsafe { *tv };
        (t.tv_sec * 1000 + t.tv_usec / 1000) as c_int
    };
    if let Err(e) = poll_slice(&mut pfds, timeout) {
        set_errno(e);
        return -1;
    }
    let mut n = 0;
    for &(set, _) in &sets {
        if !set.is_null() {
            // SAFETY: the program's fd_set.
            unsafe { libc::FD_ZERO(set) };
        }
    }
    for p in &pfds {
        for &(set, ev) in &sets {
            let hit = p.revents
                & (ev
                    | if ev == libc::POLLIN {
                        libc::POLLHUP | libc::POLLERR
                    } else {
                        0
                    });
            if !set.is_null() && p.events & ev != 0 && hit != 0 {
                // SAFETY: the program's fd_set; fd < FD_SETSIZE.
                unsafe { libc::FD_SET(p.fd, set) };
                n += 1;
            }
        }
    }
    n
}
export!("rselect", "RDMACM_1.0", rselect);

// ---- names and options -----------------------------------------------------------------

unsafe extern "C" fn rgetpeername(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    ret((|| {
        let s = get(fd)?;
        let s = lock(&s);
        if s.state != State::Connected {
            return Err(libc::ENOTCONN);
        }
        // SAFETY: our id; the program's buffer.
        unsafe { put_addr(&(*s.id).route.addr.dst, addr, len) };
        Ok(0)
    })())
}
export!("rgetpeername", "RDMACM_1.0", rgetpeername);

unsafe extern "C" fn rgetsockname(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    ret((|| {
        let s = get(fd)?;
        let s = lock(&s);
        // SAFETY: our id.
        let mut src = unsafe { (*s.id).route.addr.src };
        if src.ss_family == 0 {
            src.ss_family = s.domain as libc::sa_family_t;
        }
        // SAFETY: the program's buffer.
        unsafe { put_addr(&src, addr, len) };
        Ok(0)
    })())
}
export!("rgetsockname", "RDMACM_1.0", rgetsockname);

/// `SOL_RDMA` and its options (rdma/rsocket.h).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;

unsafe extern "C" fn rsetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    ret((|| {
        let s = get(fd)?;
        let mut s = lock(&s);
        if val.is_null() {
            return Err(libc::EFAULT);
        }
        let int = || -> Result<i32, i32> {
            if (len as usize) < 4 {
                return Err(libc::EINVAL);
            }
            // SAFETY: at least 4 bytes of the program's value.
            Ok(unsafe { std::ptr::read_unaligned(val.cast::<i32>()) })
        };
        let o = &mut s.opts;
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => o.reuseaddr = int()?,
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => o.keepalive = int()?,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => o.sndbuf = int()?.max(0) as u32,
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => o.rcvbuf = int()?.max(0) as u32,
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if (len as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: a linger of the program's.
                o.linger = unsafe { std::ptr::read_unaligned(val.cast()) };
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => o.nodelay = int()?,
            (SOL_RDMA, RDMA_SQSIZE) => o.sqsize = int()?.max(0) as u32,
            (SOL_RDMA, RDMA_RQSIZE) => o.rqsize = int()?.max(0) as u32,
            (SOL_RDMA, RDMA_INLINE) => o.inline = int()?.max(0) as u32,
            (SOL_RDMA, RDMA_IOMAPSIZE) => o.iomapsize = int()?.max(0) as u32,
            // One path per device: a route given here has nothing to choose from.
            (SOL_RDMA, RDMA_ROUTE) => {}
            (libc::SOL_SOCKET | libc::IPPROTO_TCP | SOL_RDMA, _) => return Err(libc::ENOPROTOOPT),
            _ => return Err(libc::ENOPROTOOPT),
        }
        Ok(0)
    })())
}
export!("rsetsockopt", "RDMACM_1.0", rsetsockopt);

unsafe extern "C" fn rgetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    ret((|| {
        let s = get(fd)?;
        let mut s = lock(&s);
        if val.is_null() || len.is_null() {
            return Err(libc::EFAULT);
        }
        let o = s.opts;
        let v: i32 = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_ERROR) => {
                s.progress();
                std::mem::take(&mut s.err)
            }
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => o.reuseaddr,
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => o.keepalive,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => o.sndbuf as i32,
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => o.rcvbuf as i32,
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                let n = std::mem::size_of::<libc::linger>();
                // SAFETY: the program's buffer of *len bytes.
                unsafe {
                    if (*len as usize) < n {
                        return Err(libc::EINVAL);
                    }
                    std::ptr::write_unaligned(val.cast(), o.linger);
                    *len = n as libc::socklen_t;
                }
                return Ok(0);
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => o.nodelay,
            (SOL_RDMA, RDMA_SQSIZE) => o.sqsize as i32,
            (SOL_RDMA, RDMA_RQSIZE) => o.rqsize as i32,
            (SOL_RDMA, RDMA_INLINE) => o.inline as i32,
            (SOL_RDMA, RDMA_IOMAPSIZE) => o.iomapsize as i32,
            _ => return Err(libc::ENOPROTOOPT),
        };
        // SAFETY: the program's buffer of *len bytes.
        unsafe {
            if (*len as usize) < 4 {
                return Err(libc::EINVAL);
            }
            std::ptr::write_unaligned(val.cast::<i32>(), v);
            *len = 4;
        }
        Ok(0)
    })())
}
export!("rgetsockopt", "RDMACM_1.0", rgetsockopt);

unsafe extern "C" fn rfcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    ret((|| {
        let s = get(fd)?;
        let mut s = lock(&s);
        match cmd {
            libc::F_GETFL => Ok(libc::O_RDWR | if s.nonblock { libc::O_NONBLOCK } else { 0 }),
            libc::F_SETFL => {
                s.nonblock = arg as c_int & libc::O_NONBLOCK != 0;
                Ok(0)
            }
            _ => Err(libc::ENOSYS),
        }
    })())
}
export!("rfcntl", "RDMACM_1.0", rfcntl);

// ---- riomap ---------------------------------------------------------------------------

/// Drives `s` until `step` gives a value (a credit or slot freed), or 5 s pass.
fn with_credit<T>(
    s: &mut Sock,
    mut step: impl FnMut(&mut Conn) -> Result<Option<T>, i32>,
) -> Result<T, i32> {
    let start = Instant::now();
    let mut round = 0;
    loop {
        s.progress();
        let c = s.conn.as_mut().ok_or(libc::ENOTCONN)?;
        if let Some(v) = step(c)? {
            return Ok(v);
        }
        if c.reset {
            return Err(libc::ECONNRESET);
        }
        if start.elapsed() > Duration::from_secs(5) {
            return Err(libc::ETIMEDOUT);
        }
        backoff(round);
        round += 1;
    }
}

unsafe extern "C" fn riomap(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    let r = (|| {
        let s = get(fd)?;
        let mut s = lock(&s);
        if s.state != State::Connected {
            return Err(libc::ENOTCONN);
        }
        if buf.is_null()
            || len == 0
            || prot != libc::PROT_WRITE
            || flags != 0
            || (offset < 0 && offset != -1)
        {
            return Err(libc::EINVAL);
        }
        let want = (offset >= 0).then_some(offset as u64);
        with_credit(&mut s, |c| c.iomap(buf as u64, len as u64, want)).map(|o| o as libc::off_t)
    })();
    match r {
        Ok(o) => o,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}
export!("riomap", "RDMACM_1.0", riomap);

unsafe extern "C" fn riounmap(fd: c_int, buf: *mut c_void, _len: usize) -> c_int {
    ret((|| {
        let s = get(fd)?;
        let mut s = lock(&s);
        with_credit(&mut s, |c| Ok(c.iounmap(buf as u64)?.then_some(0)))
    })())
}
export!("riounmap", "RDMACM_1.0", riounmap);

unsafe extern "C" fn riowrite(
    fd: c_int,
    buf: *const c_void,
    count: usize,
    offset: libc::off_t,
    flags: c_int,
) -> usize {
    let r = (|| {
        let sh = get(fd)?;
        let s = lock(&sh);
        if s.state != State::Connected {
            return Err(libc::ENOTCONN);
        }
        if offset < 0 {
            return Err(libc::EINVAL);
        }
        drop(s);
        // SAFETY: the program's buffer.
        let data = unsafe { slice(buf, count) };
        let mut done = 0;
        drive(&sh, None, |s| {
            let nonblock = s.nonblock || flags & libc::MSG_DONTWAIT != 0;
            let Some(c) = s.conn.as_mut() else {
                return Some(Err(libc::EBADF));
            };
            if c.reset {
                return Some(if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::ECONNRESET)
                });
            }
            match c.iowrite(&data[done..], offset as u64 + done as u64) {
                Ok(n) => done += n,
                Err(e) => return Some(Err(e)),
            }
            if done == data.len() {
                return Some(Ok(done));
            }
            if nonblock {
                return Some(if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::EAGAIN)
                });
            }
            None
        })
    })();
    match r {
        Ok(n) => n,
        Err(e) => {
            set_errno(e);
            usize::MAX
        }
    }
}
export!("riowrite", "RDMACM_1.0", riowrite);
