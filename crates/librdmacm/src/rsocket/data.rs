//! The data calls: `rrecv`/`rrecvfrom`/`rrecvmsg`/`rread`/`rreadv` and
//! `rsend`/`rsendto`/`rsendmsg`/`rwrite`/`rwritev` (recv(2), send(2) semantics on a stream).

use super::*;

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
pub(super) unsafe fn slice<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
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
