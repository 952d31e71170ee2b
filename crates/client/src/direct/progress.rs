//! The net path's progress thread (docs/net-path.md, "Progress"): a responder must ACK and
//! a requester retransmit while the program computes, or sleeps in `ibv_get_cq_event`,
//! and a completion must wake a program that waits on its channel. One thread per context
//! with a QP on the path does it, and keeps out of the way of a program that polls: while
//! the program polled in the last [`BUSY`], the thread only naps until the engine's next
//! timer (at most [`NAP`]), so a busy poller receives its own packets and nobody spins on
//! a CPU another party needs; otherwise it sleeps on the socket and takes each packet as it
//! comes.
//!
//! It holds the context only weakly: when the context goes, the thread ends at its next
//! wake-up (at most [`IDLE`] later) and keeps nothing of it open.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use softverbs_shm::Region;

use super::{net, ops, Inner};
use crate::conn::Conn;

/// A program that polled this recently is polling: it takes its packets itself.
pub(super) const BUSY: Duration = Duration::from_millis(2);
/// The longest nap while the program polls.
pub(super) const NAP: Duration = Duration::from_millis(1);
/// The longest sleep on the socket while it does not.
pub(super) const IDLE: Duration = Duration::from_millis(20);

/// The running thread; dropping this asks it to end.
#[derive(Debug)]
pub(super) struct Progress {
    stop: Arc<AtomicBool>,
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Nanoseconds since the first call in this process: the clock of [`super::DirectCtx`]'s
/// last-poll stamp.
pub(super) fn stamp() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

struct Shared {
    inner: Weak<Mutex<Inner>>,
    table: Weak<Region>,
    conn: Weak<Conn>,
    polled: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

/// Starts the thread over `sock` (the net path's socket).
pub(super) fn start(
    inner: &Arc<Mutex<Inner>>,
    table: &Arc<Region>,
    conn: &Arc<Conn>,
    polled: &Arc<AtomicU64>,
    sock: OwnedFd,
) -> std::io::Result<Progress> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = Shared {
        inner: Arc::downgrade(inner),
        table: Arc::downgrade(table),
        conn: Arc::downgrade(conn),
        polled: polled.clone(),
        stop: stop.clone(),
    };
    std::thread::Builder::new()
        .name("softverbs-net".into())
        .spawn(move || run(s, sock))?;
    Ok(Progress { stop })
}

fn run(s: Shared, sock: OwnedFd) {
    loop {
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let Some(inner) = s.inner.upgrade() else {
            return;
        };
        let timer = {
            let g = inner.lock().unwrap_or_else(|e| e.into_inner());
            g.net.as_ref().and_then(|n| n.next_timeout())
        };
        drop(inner);
        let since = stamp().saturating_sub(s.polled.load(Ordering::Relaxed));
        if since < BUSY.as_nanos() as u64 {
            std::thread::sleep(timer.unwrap_or(NAP).min(NAP));
        } else {
            let wait = timer.unwrap_or(IDLE).min(IDLE);
            // Round up: a timer due in under a millisecond must not become a busy loop.
            let ms = wait.as_millis().max(1) as i32;
            let _ = softverbs_ipc::wait_readable(sock.as_fd(), Some(ms));
        }
        let (Some(inner), Some(table), Some(conn)) =
            (s.inner.upgrade(), s.table.upgrade(), s.conn.upgrade())
        else {
            return;
        };
        let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *g;
        let Some(n) = inner.net.as_mut() else {
            continue;
        };
        n.drive(&table, &mut inner.cqs, false);
        net::tell_errors(&conn, n);
        ops::notify_own_on(&conn, inner);
    }
}
