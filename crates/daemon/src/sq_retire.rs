//! Which positions of a QP's send ring the daemon may count as retired, and when.
//!
//! The count (the send ring's note, docs/design/shm-rings.md) serves two readers. A live client takes
//! `posted − note` as the send queue's occupancy, so the count must cover a request by the
//! time the client can see its completion (ibv_post_send(3): `ENOMEM` only past
//! `max_send_wr` outstanding). A client whose daemon died flushes the requests from the count
//! on (crates/client/src/flush.rs), so the count must not cover a request whose completion is
//! not yet in its CQ. Both hold if the count moves one completion at a time, to just past the
//! request being completed, right before that completion is pushed; and moves over requests
//! that retire without a completion (unsignaled, dropped at RESET) only once every completion
//! of the turn is written. The one write that cannot be ordered against the push (the count
//! and the CQ entry are two stores) is covered by the pending pair the daemon publishes
//! first (the count and the CQ index the entry will take), from which the client tells
//! whether that one completion landed.
//!
//! This type holds no ring: it maps completions to ring positions (send requests complete in
//! the order posted, IBA 10.8.3 / 11.4.1.1) and says what count to publish.

use std::collections::VecDeque;

/// A request taken from the send ring into the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Taken {
    pos: u32,
    wr_id: u64,
    /// Signaled (or the QP signals all): a successful completion is expected for it.
    signaled: bool,
}

/// The retirement bookkeeping of one send ring.
#[derive(Debug, Default)]
pub(crate) struct SqRetire {
    /// Requests in the engine or retired with no completion seen yet, oldest first.
    taken: VecDeque<Taken>,
    /// The count last published.
    note: u32,
}

impl SqRetire {
    /// The engine accepted the request at ring position `pos`.
    pub(crate) fn taken(&mut self, pos: u32, wr_id: u64, signaled: bool) {
        self.taken.push_back(Taken {
            pos,
            wr_id,
            signaled,
        });
    }

    /// A completion of one of the requests taken (`success`: a successful one, which only a
    /// signaled request gets; errors and flushes come for any request). Returns the count to
    /// publish before the completion is pushed: just past its request. Requests before it
    /// retired without a completion (in order); `None` if it matches no request taken.
    pub(crate) fn completed(&mut self, wr_id: u64, success: bool) -> Option<u32> {
        let i = self
            .taken
            .iter()
            .position(|t| t.wr_id == wr_id && (t.signaled || !success))?;
        let t = self.taken.drain(..=i).next_back()?;
        self.advance(t.pos.wrapping_add(1))
    }

    /// The request at ring position `pos` was refused (it never entered the engine) and
    /// completes with an error. Returns the count to publish before that completion: just
    /// past it, if nothing older is still outstanding (otherwise the count waits for them).
    pub(crate) fn refused(&mut self, pos: u32) -> Option<u32> {
        if self
            .taken
            .front()
            .is_some_and(|t| before(t.pos, pos.wrapping_add(1)))
        {
            return None;
        }
        self.advance(pos.wrapping_add(1))
    }

    /// Every completion of the turn is written and the engine holds the newest `left`
    /// requests taken: the rest retired (completed, or with no completion). Returns the count
    /// to publish, up to the oldest request outstanding (`consumed`, the ring's consumer
    /// index, if none is), or `None` if it did not move.
    pub(crate) fn settle(&mut self, left: usize, consumed: u32) -> Option<u32> {
        while self.taken.len() > left {
            self.taken.pop_front();
        }
        let oldest = self.taken.front().map_or(consumed, |t| t.pos);
        self.advance(oldest)
    }

    fn advance(&mut self, to: u32) -> Option<u32> {
        before(self.note, to).then(|| {
            self.note = to;
            to
        })
    }
}

/// `a` comes before `b` in a free-running (wrapping) count.
fn before(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_counts_its_request_and_the_unsignaled_ones_before_it_not_after() {
        let mut r = SqRetire::default();
        // U0 S1 U2 S3: one ACK retires all four, the engine reports S1 and S3.
        for (pos, signaled) in [(0, false), (1, true), (2, false), (3, true)] {
            r.taken(pos, u64::from(pos), signaled);
        }
        // Before S1 is pushed: U0 and S1, not U2 or S3 (S3's completion is not written yet).
        assert_eq!(r.completed(1, true), Some(2));
        assert_eq!(r.completed(3, true), Some(4));
        assert_eq!(r.settle(0, 4), None, "nothing left to count");
    }

    #[test]
    fn unsignaled_requests_are_counted_only_once_the_turn_is_written() {
        let mut r = SqRetire::default();
        for pos in 0..3 {
            r.taken(pos, 7, false);
        }
        r.taken(3, 7, true);
        // The engine retired the first two (no completions) and holds two.
        assert_eq!(r.settle(2, 4), Some(2));
        // A flush of the rest comes for every request, signaled or not (IBA 10.3.1.9).
        assert_eq!(r.completed(7, false), Some(3));
        assert_eq!(r.completed(7, false), Some(4));
        assert_eq!(r.settle(0, 4), None);
        // Dropped at RESET: no completions, the engine holds none.
        r.taken(4, 1, true);
        r.taken(5, 2, true);
        assert_eq!(r.settle(0, 6), Some(6));
    }

    #[test]
    fn a_refused_request_is_counted_only_when_nothing_older_is_outstanding() {
        let mut r = SqRetire::default();
        assert_eq!(r.refused(0), Some(1));
        r.taken(1, 10, true);
        assert_eq!(r.refused(2), None, "request 1 is still in the engine");
        assert_eq!(r.completed(10, true), Some(2));
        assert_eq!(
            r.settle(0, 3),
            Some(3),
            "the refused one, after its completion"
        );
    }

    #[test]
    fn a_completion_of_no_request_taken_moves_nothing_and_counts_wrap() {
        let mut r = SqRetire::default();
        assert_eq!(r.completed(5, true), None);
        r.taken(0, 5, false);
        assert_eq!(
            r.completed(5, true),
            None,
            "unsignaled: no successful completion"
        );
        let mut r = SqRetire {
            note: u32::MAX,
            ..Default::default()
        };
        r.taken(u32::MAX, 1, true);
        assert_eq!(r.completed(1, true), Some(0));
    }
}
