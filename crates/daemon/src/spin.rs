//! When the daemon's loop polls instead of sleeping (adaptive polling, docs/performance.md
//! "Latency tails").
//!
//! Right after work the loop polls without sleeping for [`SPIN`], yielding the CPU on every
//! round, so the next request finds it awake: a wake-up from epoll costs tens of microseconds
//! on a small VM. But a yield is only cheap while the other runnable tasks yield too. Under
//! Linux's EEVDF scheduler (6.6 on) `sched_yield` pushes the caller's virtual deadline back by
//! a whole slice each time, so a loop that yields thousands of times has the latest deadline
//! of its run queue and loses every pick to a task that never yields — perftest's
//! `ib_write_lat` spinning on its buffer, a compiler — until that task's slice runs out, a
//! scheduler tick or more later (milliseconds). A task woken from sleep is placed afresh and
//! may preempt at once. So when one yield took longer than [`STARVED`] (someone else held the
//! CPU for a slice), the loop stops spinning for [`BACK_OFF`] and sleeps whenever idle, to be
//! woken by doorbells and sockets instead.

use std::time::{Duration, Instant};

/// How long the loop keeps polling (yielding) without sleeping after it last had work. With
/// two daemons over UDP, 100 µs let both fall asleep between the bursts of a stream (a third
/// of the CPU time idle under `perf`), 1 ms keeps them awake: 4 KiB WRITE bandwidth between
/// two daemons went from 380–600 to 540–750 MB/s (three runs each).
pub const SPIN: Duration = Duration::from_micros(1000);

/// A yield that returns later than this waited for another task's whole time slice (EEVDF's
/// base slice is 0.75 ms × (1 + log2 CPUs), 1.5 ms on 2 CPUs; a yield among yielders takes
/// microseconds). 250 µs also caught ordinary load, and sleeping then cost the bench's 8 B
/// one-way latency 2–3× (the wake-up); 1.5 ms kept it and still removed ib_write_lat's tail.
pub const STARVED: Duration = Duration::from_micros(1500);

/// How long the loop sleeps whenever idle after a starved yield, before trying to spin again:
/// one more starved yield per 100 ms is one late message in thousands at 10–20 µs each.
pub const BACK_OFF: Duration = Duration::from_millis(100);

/// The spin-or-sleep decision of the daemon's loop; time is passed in.
#[derive(Debug, Clone, Copy)]
pub struct SpinPolicy {
    busy_until: Instant,
    no_spin_until: Instant,
    /// Times a starved yield switched spinning off.
    pub starved: u64,
}

impl SpinPolicy {
    /// A policy that sleeps until the first work.
    pub fn new(now: Instant) -> SpinPolicy {
        SpinPolicy {
            busy_until: now,
            no_spin_until: now,
            starved: 0,
        }
    }

    /// The loop had work at `now`: poll on for [`SPIN`], unless spinning is backed off.
    pub fn worked(&mut self, now: Instant) {
        self.busy_until = now + SPIN;
    }

    /// Whether the loop should poll without sleeping at `now`.
    pub fn spinning(&self, now: Instant) -> bool {
        now < self.busy_until && now >= self.no_spin_until
    }

    /// A yield of the spinning loop began at `start` and returned at `end`.
    pub fn yielded(&mut self, start: Instant, end: Instant) {
        if end.saturating_duration_since(start) > STARVED {
            self.starved += 1;
            self.no_spin_until = end + BACK_OFF;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_after_work_then_sleeps() {
        let t0 = Instant::now();
        let mut p = SpinPolicy::new(t0);
        assert!(!p.spinning(t0), "no work yet: sleep");
        p.worked(t0);
        assert!(p.spinning(t0 + Duration::from_micros(10)));
        assert!(!p.spinning(t0 + SPIN), "idle for SPIN: sleep");
    }

    #[test]
    fn short_yields_keep_spinning() {
        let t0 = Instant::now();
        let mut p = SpinPolicy::new(t0);
        p.worked(t0);
        p.yielded(t0, t0 + Duration::from_micros(5));
        assert!(p.spinning(t0 + Duration::from_micros(6)));
        assert_eq!(p.starved, 0);
    }

    #[test]
    fn a_starved_yield_turns_spinning_off_for_the_back_off() {
        let t0 = Instant::now();
        let mut p = SpinPolicy::new(t0);
        p.worked(t0);
        let back = t0 + Duration::from_millis(4);
        p.yielded(t0, back);
        assert_eq!(p.starved, 1);
        // Work keeps coming, but the loop now sleeps whenever idle.
        p.worked(back);
        assert!(!p.spinning(back + Duration::from_micros(1)));
        p.worked(back + BACK_OFF);
        assert!(
            p.spinning(back + BACK_OFF + Duration::from_micros(1)),
            "spins again after the back-off"
        );
    }
}
