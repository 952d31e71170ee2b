//! The net path's progress thread (docs/net-path.md, "Progress"): a responder must ACK and
//! a requester retransmit while the program computes, or sleeps in `ibv_get_cq_event`,
//! and a completion must wake a program that waits on its channel. One thread per context
//! with a QP on the path does it, and keeps out of the way of a program that polls: while
//! the program polled or posted during its last nap ([`NAP`], or [`SHORT`] while ACKs or
//! requests wait for a later round) the thread naps again and touches nothing, so a busy
//! poller receives its own packets (and runs the timers) and nobody spins on a CPU another
//! party needs; when the program went quiet with something waiting, the thread sends it;
//! otherwise it sleeps on the socket (until the engine's next timer at most) and takes each
//! packet as it comes — and keeps looking, yielding the CPU between looks, for [`SPIN`]
//! after each packet while a stream lasts.
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

/// The nap while the program polls: a program that polled or posted during the last one is
/// active, and takes its packets itself.
pub(super) const NAP: Duration = Duration::from_millis(1);
/// The longest sleep on the socket while it does not.
pub(super) const IDLE: Duration = Duration::from_millis(20);
/// How long the thread keeps looking for packets after the last one before it sleeps on
/// the socket again (as a busy poller spins before it yields, `crate::idle::SPIN`): a
/// stream's next datagram is usually there by then, and a partner sharing the CPU waits
/// at most this long.
pub(super) const SPIN: Duration = Duration::from_micros(50);

/// What the program's threads do on the net path, as the progress thread sees it without a
/// lock.
#[derive(Debug, Default)]
pub(super) struct Activity {
    /// Polls and posts so far.
    pub(super) calls: AtomicU64,
    /// The engine holds something only a later round sends: ACKs a poll kept back, requests
    /// a post left for the next round (`Net::drive`, `Net::post_send`).
    pub(super) pending: AtomicBool,
}

/// How long the thread naps while the program is active but something waits for a later
/// round: if the program makes none meanwhile, the thread makes it.
pub(super) const SHORT: Duration = Duration::from_micros(50);

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

struct Shared {
    inner: Weak<Mutex<Inner>>,
    table: Weak<Region>,
    conn: Weak<Conn>,
    act: Arc<Activity>,
    stop: Arc<AtomicBool>,
}

/// Starts the thread over `sock` (the net path's socket).
pub(super) fn start(
    inner: &Arc<Mutex<Inner>>,
    table: &Arc<Region>,
    conn: &Arc<Conn>,
    act: &Arc<Activity>,
    sock: OwnedFd,
) -> std::io::Result<Progress> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = Shared {
        inner: Arc::downgrade(inner),
        table: Arc::downgrade(table),
        conn: Arc::downgrade(conn),
        act: act.clone(),
        stop: stop.clone(),
    };
    std::thread::Builder::new()
        .name("softverbs-net".into())
        .spawn(move || run(s, sock))?;
    Ok(Progress { stop })
}

fn run(s: Shared, sock: OwnedFd) {
    // When the last packet came in: while a stream lasts the thread keeps looking instead of
    // sleeping on the socket, whose every wake-up is a context switch.
    let mut last_packet: Option<std::time::Instant> = None;
    let mut seen = s.act.calls.load(Ordering::Relaxed);
    loop {
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        // The program polled or posted since the last look: its polls receive, run the
        // timers and send (`Net::drive`), so the thread only naps and takes no lock — for
        // less long if something waits for a round the program may not make.
        let calls = s.act.calls.load(Ordering::Relaxed);
        if calls != seen {
            seen = calls;
            last_packet = None;
            let pending = s.act.pending.load(Ordering::Relaxed);
            std::thread::sleep(if pending { SHORT } else { NAP });
            continue;
        }
        let streaming = last_packet.is_some_and(|t| t.elapsed() < SPIN);
        if s.act.pending.load(Ordering::Relaxed) {
            // The program went quiet with ACKs held or requests left: send them now.
        } else if streaming {
            // Yield rather than spin: the sender may share this CPU (two CPUs, four parties).
            std::thread::yield_now();
        } else {
            let Some(inner) = s.inner.upgrade() else {
                return;
            };
            let timer = {
                let g = inner.lock().unwrap_or_else(|e| e.into_inner());
                g.net.as_ref().and_then(|n| n.next_timeout())
            };
            drop(inner);
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
        if n.drive(&table, &mut inner.cqs, false) {
            last_packet = Some(std::time::Instant::now());
        }
        net::tell_errors(&conn, n);
        ops::notify_own_on(&conn, inner);
    }
}
