//! Time as the engine sees it: a number passed in by the caller, never read from a clock.

use std::time::Duration;

/// A point in time, in nanoseconds since an epoch the caller chooses (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(pub u64);

impl Instant {
    /// `self + d`, saturating.
    pub fn after(self, d: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    /// Time from `earlier` to `self` (zero if `earlier` is later).
    pub fn since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// The local ACK timeout of IBA 9.7.6.1.3: 4.096 µs × 2^`timeout`; `timeout` 0 means the
/// timer is disabled (infinite).
pub fn ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    let ns = 4096u64 << u32::from(timeout.min(31));
    Some(Duration::from_nanos(ns))
}

/// The RNR NAK timer of IBA table 45 (the code a responder puts in an RNR NAK).
pub fn rnr_delay(code: u8) -> Duration {
    let us = softverbs_wire::aeth::rnr_timer_micros(code & 0x1f).unwrap_or(655_360);
    Duration::from_micros(u64::from(us))
}

/// The software NIC's floor under IBA 9.7.6.1.3's retry rule (docs/design/net-path.md, "Stalls";
/// docs/design/security.md, item 7): a requester declares `RETRY_EXC_ERR` only when its
/// `retry_cnt` retries are spent (IBA C9-140's count, unchanged) *and* its QP has seen no
/// progress for at least this long. Between the two it keeps retransmitting, its timer
/// doubling from the QP's ACK timeout. A hardware responder answers within a fixed time;
/// a software one (a daemon thread, or a library's progress thread and the forwarder) runs
/// only when a general-purpose scheduler gives it a CPU, and the peer cannot tell a
/// starved host from a dead one. 1 s covers what Linux lets a runnable thread wait: a
/// fair-class thread among tens of runnable ones per CPU waits tens of milliseconds (65 ms
/// measured at load 6 per CPU), and real-time hogs may take up to `sched_rt_runtime_us`
/// (950 ms) of every `sched_rt_period_us` (1 s) from it (sched(7), "Limiting the CPU usage
/// of real-time and deadline processes"). A dead peer still fails, after at most
/// `max((retry_cnt + 1) · timeout, floor + timeout)` of silence (see `retries_spent`). Shells set
/// it per device ([`Engine::set_retry_floor`](crate::Engine::set_retry_floor); the
/// daemon's `--retry-floor-ms`); zero gives IBA's plain rule.
pub const RETRY_FLOOR: Duration = Duration::from_secs(1);

/// The requester's verdict on a timeout or sequence NAK with `retry_left` retries left:
/// `true` when the request fails with `RETRY_EXC_ERR` — no retry left and no progress since
/// `quiet_since` for at least `floor` ([`RETRY_FLOOR`]). The one place of that rule, for the
/// timer and the NAK alike.
pub fn retries_spent(retry_left: u8, quiet_since: Instant, floor: Duration, now: Instant) -> bool {
    retry_left == 0 && now >= quiet_since.after(floor)
}

/// The next ACK timer once the retries are spent but the floor is not reached: the QP's
/// ACK timeout `t` doubled for each retransmission past the budget (`past`), so a dead
/// peer costs a few packets and not one window per timeout, and never later than the
/// floor's end (`floor_end`), nor sooner than `t`.
pub fn past_budget_timer(t: Duration, past: u8, now: Instant, floor_end: Instant) -> Instant {
    let d = t.saturating_mul(1u32 << past.min(16));
    let at = now.after(d).min(floor_end);
    at.max(now.after(t))
}

/// How late a shell may run after it meant to (its planned wake-up, or its last run)
/// before the time counts as a stall of its own: a scheduler's ordinary latency is below
/// it. Counting too much only delays a retransmission by as much; the smallest ACK timeout
/// programs set in practice (IBA 9.7.6.1.3 code 10, 4 ms) is four times longer.
pub const STALL: Duration = Duration::from_millis(1);

/// The time a shell could not run, by its own clock: it last ran at `last` and meant to
/// run again by `due` (its planned wake-up); running at `now`, later than the later of the
/// two by more than [`STALL`], it was stopped or waited for a CPU meanwhile, and all the
/// time since that plan is lost (passed to [`Engine::stalled`](crate::Engine::stalled)).
/// `last` 0 means it never ran: nothing is lost yet. The one rule of every shell (the
/// library's progress thread, the daemon's loop: docs/design/net-path.md, "Stalls").
pub fn stall(last: Instant, due: Instant, now: Instant) -> Duration {
    let plan = last.max(due);
    if last.0 != 0 && now > plan.after(STALL) {
        now.since(plan)
    } else {
        Duration::ZERO
    }
}

/// [`stall`] for a shell of one thread: it says when it sleeps and when it runs, and
/// takes what was lost before each round of its engines.
#[derive(Clone, Copy, Debug, Default)]
pub struct StallMeter {
    /// When it last ran (0: never).
    last: Instant,
    /// When it means to run again; `u64::MAX` while it sleeps without a deadline (nothing
    /// is planned, so no lateness can be measured).
    due: Instant,
}

impl StallMeter {
    /// The shell goes to sleep at `now` for at most `d` (`None`: until something happens).
    pub fn sleeping(&mut self, now: Instant, d: Option<Duration>) {
        self.due = d.map_or(Instant(u64::MAX), |d| now.after(d));
    }

    /// The shell runs at `now` (a round starts): the time lost since it last ran, by
    /// [`stall`], counted once.
    pub fn running(&mut self, now: Instant) -> Duration {
        let lost = stall(self.last, self.due, now);
        self.last = self.last.max(now);
        self.due = self.last;
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_round_late_past_its_plan_counts_the_lateness_once() {
        let mut m = StallMeter::default();
        assert_eq!(m.running(Instant(5 * MS)), Duration::ZERO, "the first run");
        m.sleeping(Instant(6 * MS), Some(Duration::from_millis(4)));
        // Woke on time, or early (an event), or a little late: no stall.
        assert_eq!(m.running(Instant(10 * MS)), Duration::ZERO);
        m.sleeping(Instant(10 * MS), Some(Duration::from_millis(4)));
        assert_eq!(m.running(Instant(3 * MS / 2 + 13 * MS)), Duration::ZERO);
        m.sleeping(Instant(15 * MS), Some(Duration::from_millis(4)));
        // Planned for 19 ms, ran at 49 ms: 30 ms lost.
        assert_eq!(m.running(Instant(49 * MS)), Duration::from_millis(30));
        // Counted once: the next round, on time, loses nothing.
        assert_eq!(m.running(Instant(49 * MS + MS / 2)), Duration::ZERO);
    }

    #[test]
    fn a_busy_shell_is_late_against_its_last_run() {
        let mut m = StallMeter::default();
        m.running(Instant(MS));
        // Spinning: it meant to go round at once.
        m.sleeping(Instant(2 * MS), Some(Duration::ZERO));
        assert_eq!(m.running(Instant(12 * MS)), Duration::from_millis(10));
    }

    #[test]
    fn a_sleep_without_deadline_is_never_late() {
        let mut m = StallMeter::default();
        m.running(Instant(MS));
        m.sleeping(Instant(2 * MS), None);
        assert_eq!(m.running(Instant(5_000 * MS)), Duration::ZERO);
        // ...and the next plan is measured from that run.
        m.sleeping(Instant(5_000 * MS), Some(Duration::from_millis(1)));
        assert_eq!(m.running(Instant(5_011 * MS)), Duration::from_millis(10));
    }

    #[test]
    fn the_rule_needs_a_first_run() {
        assert_eq!(
            stall(Instant(0), Instant(0), Instant(100 * MS)),
            Duration::ZERO
        );
        assert_eq!(
            stall(Instant(MS), Instant(0), Instant(100 * MS)),
            Duration::from_millis(99)
        );
        assert_eq!(
            stall(Instant(MS), Instant(3 * MS), Instant(4 * MS)),
            Duration::ZERO,
            "within STALL"
        );
    }

    #[test]
    fn timers_follow_the_iba_tables() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(4096 << 14)));
        assert_eq!(rnr_delay(1), Duration::from_micros(10));
        assert_eq!(rnr_delay(0), Duration::from_micros(655_360));
        assert_eq!(rnr_delay(31), Duration::from_micros(491_520));
    }
}
