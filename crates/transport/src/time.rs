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

#[cfg(test)]
mod tests {
    use super::*;

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
