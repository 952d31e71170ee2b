//! The net path's progress thread (docs/design/net-path.md, "Progress"): a responder must ACK and
//! a requester retransmit while the program computes, watches its memory for a peer's
//! WRITE, or sleeps in `ibv_get_cq_event`, and a completion must wake a program that waits
//! on its channel. One thread per context with a QP on the path does it, in one of three
//! ways, by how long ago the program last polled a CQ (a post receives nothing, so only
//! polls count):
//!
//! - less than [`POLLING`]: the program is in a poll loop and receives its own packets;
//!   the thread naps [`NAP`] by the clock and touches nothing, so nobody spins on a CPU
//!   another party needs and no packet wakes it;
//! - less than [`QUIET`]: the program is between polls — `ib_write_lat` polls for its own
//!   WRITE's completion, then spins on its memory for the peer's, which only this thread
//!   can receive. The thread sleeps on the socket, takes each packet as it comes and holds
//!   its ACKs for the program's next post ([`net::Round::Between`]), at most [`SHORT`];
//! - longer, or never: nobody else will; the thread takes packets as they come and sends
//!   at once, and after each packet keeps looking, yielding the CPU between looks, for
//!   [`SPIN`] while a stream lasts.
//!
//! What a round left for a later one (ACKs, requests) is sent by the thread if the program
//! makes no round within [`SHORT`].
//!
//! It holds the context only weakly: when the context goes, the thread ends at its next
//! wake-up (at most [`IDLE`] later) and keeps nothing of it open.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use softverbs_shm::Region;

use super::{net, ops, Inner};
use crate::conn::Conn;

/// The nap while the program polls: a program in a poll loop takes its packets itself. A
/// program that leaves its loop for longer than [`POLLING`] waits at most this for the
/// thread to notice (once: from then on the ACKs the thread holds keep both sides' WRITEs
/// arriving while their programs poll, docs/design/net-path.md, "Order").
pub(super) const NAP: Duration = Duration::from_millis(1);
/// A program whose last poll is more recent than this is in a poll loop and takes its
/// packets itself; one whose last poll is older, but not [`QUIET`] old, is between polls
/// (spinning on its memory for a peer's WRITE, `ib_write_lat`) and the thread takes them
/// for it.
pub(super) const POLLING: Duration = Duration::from_micros(100);
/// A program that has not polled for this long is not watching the net path at all
/// (asleep on a channel, a WRITE target doing something else): only then may the thread
/// keep looking between packets instead of sleeping on the socket, since a program that
/// spins on its memory may share the CPU the looks would take turns on.
pub(super) const QUIET: Duration = Duration::from_millis(1);
/// The longest sleep on the socket while it does not.
pub(super) const IDLE: Duration = Duration::from_millis(20);
/// How long the thread keeps looking for packets after the last one before it sleeps on
/// the socket again (as a busy poller spins before it yields, `crate::idle::SPIN`): a
/// stream's next datagram is usually there by then.
pub(super) const SPIN: Duration = Duration::from_micros(50);

/// What the program's threads do on the net path, as the progress thread sees it without a
/// lock.
#[derive(Debug)]
pub(super) struct Activity {
    /// When the program last polled (`Net::drive` from `ibv_poll_cq`), in ns since `epoch`;
    /// 0: never.
    polled: AtomicU64,
    /// When the program last posted a send request on the path (ns since `epoch`; 0:
    /// never).
    posted: AtomicU64,
    /// The engine holds something only a later round sends: ACKs a poll kept back, requests
    /// a post left for the next round (`Net::drive`, `Net::post_send`).
    pub(super) pending: AtomicBool,
    /// The clock of `polled`, also the engine's (`Net`).
    pub(super) epoch: Instant,
    /// `CLOCK_MONOTONIC` at `epoch`, in ns: what the net status region's stamp is measured
    /// in (the daemon reads the same clock), without a second clock read per round.
    mono_epoch: u64,
    /// When the progress thread means to run next (ns since `epoch`): set before each of
    /// its sleeps ([`Activity::sleeping`]).
    due: AtomicU64,
    /// When something of this process last ran (ns since `epoch`; 0: not yet):
    /// [`Activity::running`].
    last: AtomicU64,
    /// Time in which this process could not run (it was stopped, or starved of a CPU),
    /// measured as lateness against `due` and not yet passed to the engine
    /// ([`Activity::take_lost`], `Engine::stalled`).
    lost: AtomicU64,
    /// The daemon's lost time (`NS_DAEMON_LOST`) as the last round saw it.
    daemon_seen: AtomicU64,
    /// The net status region the daemon reads (`softverbs_abi::direct::NS_LEN`), once the
    /// daemon handed one over: the stamp of the last round, and each QP's responder state.
    pub(super) status: std::sync::OnceLock<Region>,
}

impl Default for Activity {
    fn default() -> Activity {
        let epoch = Instant::now();
        let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
            (t.tv_sec() as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(t.tv_nsec() as u64)
        });
        Activity {
            polled: AtomicU64::new(0),
            posted: AtomicU64::new(0),
            pending: AtomicBool::new(false),
            epoch,
            mono_epoch: mono,
            due: AtomicU64::new(0),
            last: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            daemon_seen: AtomicU64::new(0),
            status: std::sync::OnceLock::new(),
        }
    }
}

impl Activity {
    /// Now, in ns since `epoch`.
    pub(super) fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The progress thread sleeps from `now` for at most `d`.
    fn sleeping(&self, now: u64, d: Duration) {
        let due = now.saturating_add(d.as_nanos() as u64);
        self.due.store(due, Ordering::Relaxed);
    }

    /// Something of this process runs at `now` (the progress thread woke or goes round,
    /// or a round of the engine starts). Until then the process meant to run again by the
    /// later of the thread's planned wake-up and the last time it ran; if `now` is more
    /// than `softverbs_transport::time::STALL` past that, the process could not run meanwhile (it was stopped, or
    /// waited for a CPU) and the time since counts as lost, once (`fetch_max` lets only the
    /// first to see it count it). The net status region's stamp says the process ran.
    pub(super) fn running(&self, now: u64) {
        use softverbs_transport::{time::stall, Instant};
        let prev = self.last.fetch_max(now, Ordering::Relaxed);
        let due = self.due.load(Ordering::Relaxed);
        let lost = stall(Instant(prev), Instant(due), Instant(now));
        if !lost.is_zero() {
            self.lost
                .fetch_add(lost.as_nanos() as u64, Ordering::Relaxed);
        }
        if let Some(r) = self.status.get() {
            r.atomic_u64s(softverbs_abi::direct::NS_RAN, 1)[0]
                .store(self.mono_epoch.saturating_add(now), Ordering::Release);
        }
    }

    /// The time lost to stalls since the last call (see [`Activity::running`]): this
    /// process's own, or its daemon's (`NS_DAEMON_LOST`: the forwarder every packet of
    /// the path passes could not run), whichever is longer — both stalls may be one, a
    /// machine short of CPUs, and counting it twice would only delay a retransmission more.
    pub(super) fn take_lost(&self, now: u64) -> Duration {
        self.running(now);
        let own = self.lost.swap(0, Ordering::Relaxed);
        let daemon = self.status.get().map_or(0, |r| {
            let total =
                r.atomic_u64s(softverbs_abi::direct::NS_DAEMON_LOST, 1)[0].load(Ordering::Acquire);
            total.saturating_sub(self.daemon_seen.swap(total, Ordering::Relaxed))
        });
        Duration::from_nanos(own.max(daemon))
    }

    /// The device's retry floor as the daemon published it in the net status region
    /// (`NS_RETRY_FLOOR`); `None`: no region yet, or an older daemon (the engine keeps
    /// `softverbs_transport::time::RETRY_FLOOR`).
    pub(super) fn retry_floor(&self) -> Option<Duration> {
        let r = self.status.get()?;
        let w = r.atomic_u64s(softverbs_abi::direct::NS_RETRY_FLOOR, 1)[0].load(Ordering::Acquire);
        (w & softverbs_abi::direct::NS_FLOOR_SET != 0)
            .then(|| Duration::from_nanos(w & !softverbs_abi::direct::NS_FLOOR_SET))
    }

    /// The program polled at `now` (ns since `epoch`).
    pub(super) fn polled(&self, now: u64) {
        self.polled.store(now.max(1), Ordering::Relaxed);
    }

    /// The program posted a send request at `now` (ns since `epoch`).
    pub(super) fn posted(&self, now: u64) {
        self.posted.store(now.max(1), Ordering::Relaxed);
    }

    /// Whether the program posted a send request less than [`QUIET`] ago: it answers
    /// what it receives, and an ACK held for its next post leaves behind it.
    fn answers(&self) -> bool {
        let at = self.posted.load(Ordering::Relaxed);
        at != 0 && {
            let now = self.epoch.elapsed().as_nanos() as u64;
            now.saturating_sub(at) < QUIET.as_nanos() as u64
        }
    }

    /// Whether the program is in a poll loop (its last poll under [`POLLING`] ago).
    pub(super) fn polling(&self) -> bool {
        self.since_poll().is_some_and(|d| d < POLLING)
    }

    /// How long ago the program last polled (`None`: never).
    fn since_poll(&self) -> Option<Duration> {
        let at = self.polled.load(Ordering::Relaxed);
        (at != 0).then(|| {
            let now = self.epoch.elapsed().as_nanos() as u64;
            Duration::from_nanos(now.saturating_sub(at))
        })
    }
}

/// How long something left for a later round (ACKs held back, requests left by a post) may
/// wait for the program to make that round before the thread makes it.
pub(super) const SHORT: Duration = Duration::from_micros(50);

/// How often the thread reports the engine's transport drops to the daemon, if they
/// changed (`softverbs status` is that much behind at most).
pub(super) const REPORT: Duration = Duration::from_millis(100);

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
    let mut last_packet: Option<Instant> = None;
    // Since when ACKs have been held for a program between polls.
    let mut held_at: Option<Instant> = None;
    let mut reported = Instant::now();
    loop {
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        // Woke (or goes round again): late against the plan means this process could not
        // run, which the engine's timers must not count (docs/design/net-path.md, "Stalls").
        s.act.running(s.act.now());
        if reported.elapsed() >= REPORT {
            reported = Instant::now();
            let (Some(inner), Some(conn)) = (s.inner.upgrade(), s.conn.upgrade()) else {
                return;
            };
            let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = g.net.as_mut() {
                net::tell_drops(&conn, n);
            }
        }
        let pending = s.act.pending.load(Ordering::Relaxed);
        let since = s.act.since_poll();
        let polling = since.is_some_and(|d| d < POLLING);
        if !pending {
            held_at = None;
        }
        if polling && !pending {
            // The program polls: its polls receive, run the timers and send (`Net::drive`),
            // so the thread only naps and takes no lock.
            last_packet = None;
            s.act.sleeping(s.act.now(), NAP);
            std::thread::sleep(NAP);
            continue;
        }
        let quiet = since.is_none_or(|d| d >= QUIET);
        // Held only for a program that posts: one that only receives (a stream's target)
        // would leave its peer waiting SHORT, and a second wake-up of this thread, for
        // every ACK.
        let mut round = if !quiet && s.act.answers() {
            net::Round::Between
        } else {
            net::Round::Alone
        };
        if pending && polling {
            // ACKs held or requests left for a later round: the program's next round makes
            // it (a post sends them behind its request); if it makes none within SHORT,
            // the thread does.
            last_packet = None;
            s.act.sleeping(s.act.now(), SHORT);
            std::thread::sleep(SHORT);
            if !s.act.pending.load(Ordering::Relaxed) {
                continue;
            }
            round = net::Round::Alone;
        } else if pending && quiet {
            // Left by a program that is not polling at all: nobody else will send it.
        } else if pending {
            // Held for a program between polls: the rest of a message may still come
            // (taken and held too) until its post sends them, or SHORT has passed.
            let at = *held_at.get_or_insert_with(Instant::now);
            let left = SHORT.saturating_sub(at.elapsed());
            s.act.sleeping(s.act.now(), left);
            let came = !left.is_zero()
                && softverbs_ipc::wait_readable_within(sock.as_fd(), Some(left)).unwrap_or(false);
            if !s.act.pending.load(Ordering::Relaxed) {
                continue;
            }
            if !came {
                round = net::Round::Alone;
            }
        } else if quiet && last_packet.is_some_and(|t| t.elapsed() < SPIN) {
            // A stream: yield rather than spin, the sender may share this CPU (two CPUs,
            // four parties).
            s.act.sleeping(s.act.now(), Duration::ZERO);
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
            s.act
                .sleeping(s.act.now(), Duration::from_millis(ms as u64));
            let _ = softverbs_ipc::wait_readable(sock.as_fd(), Some(ms));
            if !quiet && s.act.polling() {
                // The program polls again: the packet that woke the thread is its own.
                continue;
            }
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
        if n.drive(&table, &mut inner.cqs, round) {
            last_packet = Some(Instant::now());
        }
        net::tell_errors(&conn, n);
        ops::notify_own_on(&conn, inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_abi::direct::{NS_DAEMON_LOST, NS_LEN};

    const MS: u64 = 1_000_000;

    fn daemon_lost(a: &Activity, ns: u64) {
        a.status.get().unwrap().atomic_u64s(NS_DAEMON_LOST, 1)[0].fetch_add(ns, Ordering::Release);
    }

    /// The daemon's retry floor (`--retry-floor-ms`) reaches the library's engine through
    /// the net status region; an unset word (an older daemon) leaves the default.
    #[test]
    fn the_retry_floor_is_the_daemons() {
        use softverbs_abi::direct::{NS_FLOOR_SET, NS_RETRY_FLOOR};
        let a = Activity::default();
        assert_eq!(a.retry_floor(), None, "no region");
        a.status
            .set(Region::create("test-net-status", NS_LEN).unwrap().0)
            .unwrap();
        assert_eq!(a.retry_floor(), None, "an older daemon");
        let word = |v: u64| {
            a.status.get().unwrap().atomic_u64s(NS_RETRY_FLOOR, 1)[0].store(v, Ordering::Release)
        };
        word(NS_FLOOR_SET | (250 * MS));
        assert_eq!(a.retry_floor(), Some(Duration::from_millis(250)));
        word(NS_FLOOR_SET);
        assert_eq!(a.retry_floor(), Some(Duration::ZERO), "IBA's plain count");
    }

    /// The daemon's stalls reach the library's timers through the net status region,
    /// once each, and a stall both saw counts once.
    #[test]
    fn the_daemons_stall_counts_as_the_librarys_own() {
        let a = Activity::default();
        a.status
            .set(Region::create("test-net-status", NS_LEN).unwrap().0)
            .unwrap();
        a.running(MS);
        assert_eq!(a.take_lost(MS), Duration::ZERO);
        daemon_lost(&a, 30 * MS);
        assert_eq!(a.take_lost(2 * MS), Duration::from_millis(30));
        assert_eq!(a.take_lost(2 * MS), Duration::ZERO, "counted once");
        // Both stopped together (a machine short of CPUs): the longer stall counts.
        a.sleeping(2 * MS, Duration::ZERO);
        daemon_lost(&a, 10 * MS);
        assert_eq!(a.take_lost(22 * MS), Duration::from_millis(20));
        a.sleeping(22 * MS, Duration::ZERO);
        daemon_lost(&a, 40 * MS);
        assert_eq!(a.take_lost(32 * MS), Duration::from_millis(40));
    }
}
