//! rsockets (rsocket(7)): stream sockets over RDMA-CM RC connections, the `r*` calls of
//! `rdma/rsocket.h`. Each rsocket is a real file descriptor number (an eventfd the
//! library owns, so numbers never collide with the program's own fds) naming a [`Sock`];
//! the protocol between two rsockets is docs/design/rsockets.md.
//!
//! Blocking calls and `rpoll` wait by driving the socket (CQ polls, CM events) between
//! short sleeps: softverbs' CQs complete in the daemon, not on an interrupt.

mod data;
mod ib;
mod iomap;
mod options;
mod poll;
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
