//! Readiness: `rpoll` and `rselect` over rsockets and plain fds together (poll(2), select(2)).

use super::*;

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
