//! Names and options: `rgetpeername`, `rgetsockname`, `rsetsockopt`, `rgetsockopt`, `rfcntl`
//! (rsocket(7); what each option does is in docs/design/rsockets.md).

use super::*;

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
