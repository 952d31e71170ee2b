//! What `ibv_poll_cq` does when it finds nothing (docs/dropin.md, "Empty polls").
//!
//! Busy-polling programs — every pingpong, perftest, UCX, MPI — call `ibv_poll_cq` in a
//! loop. When the completion they wait for must be produced by a daemon that may share their
//! CPU, each empty poll yields it (docs/measurements.md §1: pollers must yield). When every
//! QP of the CQ is on the same-host direct path, the completion is produced by the peer's
//! library in the peer's own process: a yield then only costs the poller a system call (and
//! on a VM, often a context switch) per empty poll, which made `ib_send_lat`'s one-way about
//! twice the bench's. So such a poller spins (`spin_loop`) for the first [`SPIN`] of a run of
//! empty polls, then yields as before: a peer that shares the CPU waits at most that long,
//! as with the bench's pollers (`crates/cli/src/bench/peer.rs`).
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

/// A CQ's run of empty polls.
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
}

/// What an empty poll should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    Spin,
    Yield,
}

impl IdlePoll {
    /// A poll handed out completions: the next empty one starts a new run.
    #[inline]
    pub fn got(&self) {
        if self.empties.load(Ordering::Relaxed) != 0 {
            self.empties.store(0, Ordering::Relaxed);
        }
    }

    /// An empty poll at `now()` (ns since an epoch of the caller's, never 0): whether to
    /// spin or yield. `fed_directly` is asked at most every [`RECHECK`].
    pub fn empty(&self, now: impl FnOnce() -> u64, fed_directly: impl FnOnce() -> bool) -> Idle {
        let e = self.empties.load(Ordering::Relaxed);
        self.empties.store(e.wrapping_add(1), Ordering::Relaxed);
        if e == 0 {
            // A new run: spin only if the CQ was fed directly when last looked at; the
            // clock is not read for runs shorter than CHECK_EVERY (most replies).
            self.spinning
                .store(self.fed.load(Ordering::Relaxed), Ordering::Relaxed);
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
            self.spinning
                .store(young && self.fed.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        if self.spinning.load(Ordering::Relaxed) {
            Idle::Spin
        } else {
            Idle::Yield
        }
    }
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
        // Unknown at first: yields until the first clock look finds it fed directly.
        assert_eq!(p.empty(|| 1_000, || true), Idle::Yield);
        assert_eq!(run(&p, CHECK_EVERY, 1_000, true), Idle::Spin);
        // Still young 10 µs into the run; past SPIN it yields.
        assert_eq!(run(&p, CHECK_EVERY, 11_000, true), Idle::Spin);
        assert_eq!(run(&p, CHECK_EVERY, 30_000, true), Idle::Yield);
        // A completion ends the run; the next one spins from its first empty poll.
        p.got();
        assert_eq!(p.empty(|| 40_000, || true), Idle::Spin);
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
