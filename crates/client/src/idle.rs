//! What a busy poller does when it finds nothing: the drop-in's `ibv_poll_cq`
//! (docs/guide/dropin.md, "Empty polls") and the bench's waits (`crates/cli/src/bench/peer.rs`).
//!
//! Busy-polling programs — every pingpong, perftest, UCX, MPI — call `ibv_poll_cq` in a
//! loop. When the completion they wait for must be produced by a daemon that may share their
//! CPU, each empty poll yields it (docs/design/measurements.md §1: pollers must yield). When every
//! QP of the CQ is on the same-host direct path, the completion is produced by the peer's
//! library in the peer's own process: a yield then only costs the poller a system call (and
//! on a VM, often a context switch) per empty poll, which made `ib_send_lat`'s one-way about
//! twice the bench's. So such a poller spins (`spin_loop`) for the first [`SPIN`] of a run of
//! empty polls, then yields as before: a peer that shares the CPU waits at most that long.
//!
//! A run that spins for all of [`SPIN`] times its first yield: one that took longer than
//! [`SWITCHED`] gave the CPU to another task, maybe the peer waiting for this very CPU (both
//! processes on one CPU: a container with one, or a loaded machine), whose reply the spin
//! only delayed. Two such runs in a row — with no run between them that got its completion
//! while spinning — turn spinning off for [`BACK_OFF`], as the daemon's loop backs off after
//! a starved yield (crates/daemon/src/spin.rs). One alone is usually another task that took
//! the CPU for a while (a kernel worker, the hypervisor), which says nothing about the peer:
//! backing off on every one of those cost the 2-CPU case its gain on the machine of
//! docs/performance.md. A quick yield means the CPU is this poller's: no strike.
//!
//! State per CQ, in relaxed atomics: several threads may poll one CQ, and a lost update only
//! moves one spin-or-yield decision. The clock is read once every [`CHECK_EVERY`] empty
//! polls, and whether the CQ is fed directly (two locks) at most every [`RECHECK`].

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a run of empty polls spins before it yields: about what a same-host reply
/// takes, so a partner sharing this CPU is kept off it no longer than that.
pub const SPIN: Duration = Duration::from_micros(20);

/// Empty polls between two looks at the clock.
pub const CHECK_EVERY: u32 = 64;

/// How long a CQ's "fed directly" answer is trusted (its QPs may move to or off the path).
pub const RECHECK: Duration = Duration::from_millis(1);

/// How long polls only yield after a run whose spin delayed its own reply.
pub const BACK_OFF: Duration = Duration::from_millis(100);

/// A yield that returns later than this let another task run on this CPU (a `sched_yield`
/// that finds nobody else takes 0.5 µs on the machine of docs/performance.md, a switch to
/// another process and back 2.5 µs).
pub const SWITCHED: Duration = Duration::from_nanos(1500);

/// A poller's run of empty polls (one per CQ in the drop-in, per peer in the bench).
#[derive(Debug, Default)]
pub struct IdlePoll {
    /// Empty polls since the last completion (wrapping).
    empties: AtomicU32,
    /// When the current run reached its first clock look, in ns since the process's epoch.
    run_since: AtomicU64,
    /// When `fed` was last decided, in ns since the epoch; 0: never.
    fed_at: AtomicU64,
    /// The CQ was fed directly at the last look.
    fed: AtomicBool,
    /// This run spins (set at each clock look).
    spinning: AtomicBool,
    /// This run spun for all of SPIN; its next yield is timed.
    spun_out: AtomicBool,
    /// Runs in a row whose timed yield switched to another task.
    strikes: AtomicU32,
    /// Runs do not spin before this time (ns since the epoch).
    no_spin_until: AtomicU64,
}

/// What an empty poll should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// A spin-loop hint: the peer answers on a CPU of its own.
    Spin,
    /// `sched_yield`: whoever produces the completion may need this CPU.
    Yield,
}

impl IdlePoll {
    /// A poll handed out completions: the next empty one starts a new run.
    #[inline]
    pub fn got(&self) {
        if self.empties.load(Ordering::Relaxed) != 0 {
            self.empties.store(0, Ordering::Relaxed);
            if self.spinning.load(Ordering::Relaxed) && self.strikes.load(Ordering::Relaxed) != 0 {
                // This run's reply came while it spun: the peer has a CPU of its own.
                self.strikes.store(0, Ordering::Relaxed);
            }
        }
        if self.spun_out.load(Ordering::Relaxed) {
            self.spun_out.store(false, Ordering::Relaxed);
        }
    }

    /// Whether the caller should time its next yield and report it with
    /// [`yielded`](IdlePoll::yielded).
    #[inline]
    pub fn time_yield(&self) -> bool {
        self.spun_out.load(Ordering::Relaxed)
    }

    /// The first yield after a spin that ran out took `took` ns, ending at `end` (ns since
    /// the epoch): a long one backs spinning off.
    pub fn yielded(&self, took: u64, end: u64) {
        self.spun_out.store(false, Ordering::Relaxed);
        if took <= SWITCHED.as_nanos() as u64 {
            self.strikes.store(0, Ordering::Relaxed);
            return;
        }
        let strikes = self.strikes.load(Ordering::Relaxed) + 1;
        if strikes >= 2 {
            self.strikes.store(0, Ordering::Relaxed);
            self.no_spin_until
                .store(end + BACK_OFF.as_nanos() as u64, Ordering::Relaxed);
        } else {
            self.strikes.store(strikes, Ordering::Relaxed);
        }
    }

    /// An empty poll at `now()` (ns since an epoch of the caller's, never 0): whether to
    /// spin or yield. `fed_directly` is asked at most every [`RECHECK`].
    pub fn empty(&self, now: impl FnOnce() -> u64, fed_directly: impl FnOnce() -> bool) -> Idle {
        let e = self.empties.load(Ordering::Relaxed);
        self.empties.store(e.wrapping_add(1), Ordering::Relaxed);
        if e == 0 {
            // A new run: spin only if the CQ was fed directly when last looked at and no
            // back-off is on. The clock is read here only during a back-off or while the
            // CQ is not known to be fed directly — runs that yield at every empty poll,
            // so a clock read costs little next to them, and they are rarely long enough
            // to reach a clock look: a CQ first looked at before its QPs took the direct
            // path would otherwise yield at every empty poll for as long as each reply
            // came within CHECK_EVERY polls of it. Otherwise not before CHECK_EVERY empty
            // polls (most replies come sooner).
            let until = self.no_spin_until.load(Ordering::Relaxed);
            let mut fed = self.fed.load(Ordering::Relaxed);
            if until != 0 || !fed {
                let t = now();
                let fed_at = self.fed_at.load(Ordering::Relaxed);
                if !fed && (fed_at == 0 || t.saturating_sub(fed_at) > RECHECK.as_nanos() as u64) {
                    fed = fed_directly();
                    self.fed.store(fed, Ordering::Relaxed);
                    self.fed_at.store(t, Ordering::Relaxed);
                }
                if until != 0 && t >= until {
                    self.no_spin_until.store(0, Ordering::Relaxed);
                }
                self.spinning
                    .store(fed && (until == 0 || t >= until), Ordering::Relaxed);
            } else {
                self.spinning.store(true, Ordering::Relaxed);
            }
        } else if e % CHECK_EVERY == 0 {
            let t = now();
            if e == CHECK_EVERY {
                self.run_since.store(t, Ordering::Relaxed);
            }
            let fed_at = self.fed_at.load(Ordering::Relaxed);
            if fed_at == 0 || t.saturating_sub(fed_at) > RECHECK.as_nanos() as u64 {
                self.fed.store(fed_directly(), Ordering::Relaxed);
                self.fed_at.store(t, Ordering::Relaxed);
            }
            let young =
                t.saturating_sub(self.run_since.load(Ordering::Relaxed)) < SPIN.as_nanos() as u64;
            let until = self.no_spin_until.load(Ordering::Relaxed);
            if until != 0 && t >= until {
                self.no_spin_until.store(0, Ordering::Relaxed);
            }
            let allowed = until == 0 || t >= until;
            let fed = self.fed.load(Ordering::Relaxed);
            if fed && allowed && !young && self.spinning.load(Ordering::Relaxed) {
                self.spun_out.store(true, Ordering::Relaxed);
            }
            self.spinning
                .store(young && fed && allowed, Ordering::Relaxed);
        }
        if self.spinning.load(Ordering::Relaxed) {
            Idle::Spin
        } else {
            Idle::Yield
        }
    }
}

impl IdlePoll {
    /// Spends one empty poll as [`empty`](IdlePoll::empty) says, on the clock of
    /// [`now_ns`]: a spin-loop hint, or a yield (the first after a spin that ran out timed
    /// and reported with [`yielded`](IdlePoll::yielded)).
    pub fn idle(&self, fed_directly: impl FnOnce() -> bool) {
        match self.empty(now_ns, fed_directly) {
            Idle::Spin => {
                // A flag, not the time: a clock read per spin delayed noticing the reply by
                // a clock read (9 % of a same-host ping-pong's samples, docs/performance.md).
                if !SPUN.load(Ordering::Relaxed) {
                    SPUN.store(true, Ordering::Relaxed);
                }
                std::hint::spin_loop()
            }
            Idle::Yield if !self.spun_out.load(Ordering::Relaxed) && shares_a_spin(now_ns()) => {
                std::hint::spin_loop()
            }
            Idle::Yield if self.time_yield() => {
                let start = now_ns();
                std::thread::yield_now();
                let end = now_ns();
                self.yielded(end - start, end);
            }
            Idle::Yield => std::thread::yield_now(),
        }
    }
}

/// A poller of this process spun since a daemon-fed poll last looked ([`shares_a_spin`]).
static SPUN: AtomicBool = AtomicBool::new(false);
/// When a daemon-fed poll last saw that a poller had spun, and when one last yielded (ns
/// since the epoch).
static SPUN_AT: AtomicU64 = AtomicU64::new(0);
static YIELDED_AT: AtomicU64 = AtomicU64::new(0);

/// Whether an empty poll that would yield (its CQ is fed by the daemon) may skip it at `now`
/// because another CQ of this process is in a spinning run, e.g. UCX polling its RC CQs (on
/// the direct path) and its UD CQs (the daemon's) in one loop, where a yield per UD poll was
/// a fifth of every round trip (docs/performance.md, "UCX and Open MPI on one host"). The
/// process still yields once per [`SPIN`], so a daemon sharing this CPU waits no longer
/// than a spinning poller lets it wait anyway; once the spin ends, every empty poll yields.
///
/// A spin is dated when such a poll first sees it, not when it happened (spinners read no
/// clock): a spin that stopped long before the look buys at most one more SPIN of skips.
fn shares_a_spin(now: u64) -> bool {
    if SPUN.load(Ordering::Relaxed) {
        SPUN.store(false, Ordering::Relaxed);
        SPUN_AT.store(now, Ordering::Relaxed);
    }
    skips_yield(now, &SPUN_AT, &YIELDED_AT)
}

/// [`shares_a_spin`] on the given clocks (tested without the process's statics).
fn skips_yield(now: u64, spun_at: &AtomicU64, yielded_at: &AtomicU64) -> bool {
    let spin = SPIN.as_nanos() as u64;
    if now.saturating_sub(spun_at.load(Ordering::Relaxed)) >= spin {
        return false;
    }
    if now.saturating_sub(yielded_at.load(Ordering::Relaxed)) >= spin {
        yielded_at.store(now, Ordering::Relaxed);
        return false;
    }
    true
}

/// Nanoseconds since the first call in this process, at least 1.
pub fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let e = *EPOCH.get_or_init(Instant::now);
    e.elapsed().as_nanos() as u64 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_fed_poll_skips_its_yield_only_beside_a_spin_and_once_per_spin_at_most() {
        let us = |n: u64| n * 1000;
        let (spun, yielded) = (AtomicU64::new(0), AtomicU64::new(0));
        // Nobody spun lately: every empty poll yields.
        assert!(!skips_yield(us(100), &spun, &yielded));
        assert!(!skips_yield(us(101), &spun, &yielded));
        // Another CQ spins: the first poll yields (none for a while), the next skip...
        spun.store(us(200), Ordering::Relaxed);
        yielded.store(0, Ordering::Relaxed);
        assert!(!skips_yield(us(201), &spun, &yielded));
        assert!(skips_yield(us(202), &spun, &yielded));
        spun.store(us(215), Ordering::Relaxed);
        assert!(skips_yield(us(220), &spun, &yielded));
        // ...until a SPIN has passed since that yield: then one yields again.
        spun.store(us(230), Ordering::Relaxed);
        assert!(!skips_yield(us(222), &spun, &yielded));
        assert!(skips_yield(us(223), &spun, &yielded));
        // The spin stopped SPIN ago: back to yielding every time.
        assert!(!skips_yield(us(250), &spun, &yielded));
        assert!(!skips_yield(us(251), &spun, &yielded));
    }

    /// Runs `n` empty polls at `t` ns each and returns what the last one said.
    fn run(p: &IdlePoll, n: u32, t: u64, fed: bool) -> Idle {
        let mut last = Idle::Yield;
        for _ in 0..n {
            last = p.empty(|| t, || fed);
        }
        last
    }

    #[test]
    fn a_cq_fed_directly_spins_for_the_first_part_of_a_run_then_yields() {
        let p = IdlePoll::default();
        // Unknown at first: looked at by the first empty poll.
        assert_eq!(p.empty(|| 1_000, || true), Idle::Spin);
        assert_eq!(run(&p, CHECK_EVERY, 1_000, true), Idle::Spin);
        // Still young 10 µs into the run; past SPIN it yields.
        assert_eq!(run(&p, CHECK_EVERY, 11_000, true), Idle::Spin);
        assert_eq!(run(&p, CHECK_EVERY, 30_000, true), Idle::Yield);
        // The spin ran out; a quick first yield (the CPU is ours, the peer is slow) leaves
        // spinning on for the next run.
        assert!(p.time_yield());
        p.yielded(500, 30_500);
        assert!(!p.time_yield(), "timed once");
        p.got();
        assert_eq!(p.empty(|| 40_000, || true), Idle::Spin);
        // A first yield that switched to another task is a strike; a run between that gets
        // its reply while spinning clears it.
        assert_eq!(run(&p, CHECK_EVERY, 40_000, true), Idle::Spin);
        assert_eq!(run(&p, CHECK_EVERY, 70_000, true), Idle::Yield);
        assert!(p.time_yield());
        p.yielded(2_500, 70_500);
        p.got();
        assert_eq!(p.empty(|| 71_000, || true), Idle::Spin, "one strike");
        p.got();
        // Two runs in a row whose yield switched: runs yield for BACK_OFF.
        for start in [100_000, 200_000] {
            assert_eq!(p.empty(|| start, || true), Idle::Spin);
            assert_eq!(run(&p, CHECK_EVERY, start, true), Idle::Spin);
            assert_eq!(run(&p, CHECK_EVERY, start + 30_000, true), Idle::Yield);
            p.yielded(2_500, start + 30_500);
            p.got();
        }
        assert_eq!(p.empty(|| 231_000, || true), Idle::Yield, "backed off");
        p.got();
        let after = 230_500 + BACK_OFF.as_nanos() as u64;
        assert_eq!(p.empty(|| after, || true), Idle::Spin, "back-off over");
        // A run that gets its completion while spinning leaves spinning on.
        assert_eq!(run(&p, CHECK_EVERY, after + 1_000, true), Idle::Spin);
        assert!(!p.time_yield());
        p.got();
        assert_eq!(p.empty(|| after + 3_000, || true), Idle::Spin);
    }

    #[test]
    fn a_poller_whose_replies_come_within_a_few_polls_learns_its_cq_is_fed_directly() {
        let p = IdlePoll::default();
        // Its QP is still being connected (not on the direct path): short runs yield.
        assert_eq!(run(&p, 2, 1_000, false), Idle::Yield);
        p.got();
        // Now on the path; every reply comes within three polls, so no run reaches a
        // clock look. Once RECHECK has passed the next run's first poll asks again.
        let t = 1_000 + RECHECK.as_nanos() as u64 + 1;
        assert_eq!(p.empty(|| t, || true), Idle::Spin);
        for i in 1..100u64 {
            p.got();
            assert_eq!(run(&p, 3, t + i * 1_000, true), Idle::Spin);
        }
    }

    #[test]
    fn a_cq_the_daemon_feeds_always_yields_and_the_answer_is_looked_at_again() {
        let p = IdlePoll::default();
        assert_eq!(run(&p, 3 * CHECK_EVERY, 1_000, false), Idle::Yield);
        p.got();
        assert_eq!(
            p.empty(|| 2_000, || true),
            Idle::Yield,
            "last answer: not fed"
        );
        // Within RECHECK the old answer stands; after it, the new one is taken.
        assert_eq!(run(&p, CHECK_EVERY, 3_000, true), Idle::Yield);
        let later = 3_000 + RECHECK.as_nanos() as u64 + 1;
        p.got();
        let _ = p.empty(|| later, || true);
        assert_eq!(run(&p, CHECK_EVERY, later, true), Idle::Spin);
    }
}
