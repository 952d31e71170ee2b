//! `riomap`, `riounmap`, `riowrite` (rsocket(7)): direct writes into a peer's mapped buffer.

use super::*;

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
        let data = unsafe { super::data::slice(buf, count) };
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
