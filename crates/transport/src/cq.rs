//! Completion queue semantics, as the kernel's soft RoCE keeps them in `rxe_cq.c`: where a
//! completion is stored, when a CQ overruns, when an armed CQ notifies its completion
//! channel, and what a QP entering RESET takes back. The shell keeps the I/O: a ring the CQ
//! may be mapped into (handed to [`CompletionQueue::complete`] as a push function) and the
//! channel's eventfd (signalled when [`Delivery::Stored`] names a channel).
//!
//! It lives here, next to the engine whose outputs it takes, so the simulator
//! ([`crate::sim`]) runs the same rules the daemon does.

use std::collections::VecDeque;

use crate::wr::{WcStatus, WorkCompletion};

/// What became of a completion handed to [`CompletionQueue::complete`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Stored (in the shell's ring or the CQ's own queue). `notify`: the completion channel
    /// to raise a completion event on (the CQ was armed and this completion fires it).
    Stored {
        /// The channel to notify, if any.
        notify: Option<u32>,
    },
    /// The CQ was full: the completion is lost and the CQ's owner gets
    /// `IBV_EVENT_CQ_ERR` (IBA 11.4.2.1, ibv_create_cq(3)).
    Overrun,
}

/// One CQ's state: its own queue (completions the shell does not keep in a ring, polled by
/// command), its depth, its completion channel and its arm.
#[derive(Clone, Debug)]
pub struct CompletionQueue {
    queue: VecDeque<WorkCompletion>,
    cqe: u32,
    channel: Option<u32>,
    /// Armed by `ibv_req_notify_cq`: `Some(solicited_only)` until the next event.
    armed: Option<bool>,
}

impl CompletionQueue {
    /// A CQ of `cqe` entries reporting to completion channel `channel`, if given
    /// (ibv_create_cq(3)); not armed.
    pub fn new(cqe: u32, channel: Option<u32>) -> CompletionQueue {
        CompletionQueue {
            queue: VecDeque::new(),
            cqe,
            channel,
            armed: None,
        }
    }

    /// The CQ's depth.
    pub fn cqe(&self) -> u32 {
        self.cqe
    }

    /// The completion channel the CQ reports to.
    pub fn channel(&self) -> Option<u32> {
        self.channel
    }

    /// Makes the CQ report to `channel` (the shell checked the channel exists).
    pub fn set_channel(&mut self, channel: Option<u32>) {
        self.channel = channel;
    }

    /// `ibv_resize_cq`: the new depth (the core checked it holds what is outstanding).
    pub fn resize(&mut self, cqe: u32) {
        self.cqe = cqe;
    }

    /// `ibv_req_notify_cq` (IBA 11.4.2.2, ibv_req_notify_cq(3)): the next completion —
    /// with `solicited_only`, the next solicited or unsuccessful one — raises one event on
    /// the channel. Arming for any completion wins over an earlier solicited-only arm until
    /// the event.
    pub fn arm(&mut self, solicited_only: bool) {
        self.armed = Some(self.armed.map_or(solicited_only, |s| s && solicited_only));
    }

    /// Whether the CQ is armed (`Some(solicited_only)`).
    pub fn armed(&self) -> Option<bool> {
        self.armed
    }

    /// Stores `wc`: through `ring` (the shell's push into the CQ's mapped ring, false when
    /// full) if the CQ has one, otherwise in its own queue, which holds `cqe` entries. A
    /// stored completion that fires the arm disarms the CQ (one event per arm) and names the
    /// channel to notify.
    pub fn complete(
        &mut self,
        wc: WorkCompletion,
        ring: Option<&mut dyn FnMut(&WorkCompletion) -> bool>,
    ) -> Delivery {
        let stored = match ring {
            Some(push) => push(&wc),
            None if self.queue.len() < self.cqe as usize => {
                self.queue.push_back(wc);
                true
            }
            None => false,
        };
        if !stored {
            return Delivery::Overrun;
        }
        let fires = self.armed.is_some_and(|solicited_only| {
            !solicited_only || wc.solicited || wc.status != WcStatus::Success
        });
        if !fires {
            return Delivery::Stored { notify: None };
        }
        self.armed = None;
        Delivery::Stored {
            notify: self.channel,
        }
    }

    /// A completion was stored elsewhere (the same-host direct path keeps its completions in
    /// the library, docs/design/direct-path.md): the arm fires as [`complete`](Self::complete)'s
    /// would for a completion that is `solicited` (or unsuccessful), and names the channel
    /// to notify.
    pub fn completed_elsewhere(&mut self, solicited: bool) -> Option<u32> {
        let fires = self
            .armed
            .is_some_and(|solicited_only| !solicited_only || solicited);
        if !fires {
            return None;
        }
        self.armed = None;
        self.channel
    }

    /// `ibv_poll_cq` on the CQ's own queue: up to `max` completions, oldest first.
    pub fn poll(&mut self, max: usize) -> Vec<WorkCompletion> {
        let n = max.min(self.queue.len());
        self.queue.drain(..n).collect()
    }

    /// Completions in the CQ's own queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// QP `qpn` entered RESET: its completions not yet polled are dropped, as mlx4 and mlx5
    /// clean them, so a QP brought back from ERR does not meet its old flushes. Completions
    /// already in a shell's ring are the client's to drop.
    pub fn purge_qp(&mut self, qpn: u32) {
        self.queue.retain(|w| w.qp_num != qpn);
    }
}

/// A completion channel (`ibv_comp_channel`, ibv_get_cq_event(3)): the CQs that fired, in
/// order, one event per firing.
#[derive(Clone, Debug, Default)]
pub struct CompChannel<C> {
    fired: VecDeque<C>,
}

impl<C> CompChannel<C> {
    /// An empty channel.
    pub fn new() -> CompChannel<C> {
        CompChannel {
            fired: VecDeque::new(),
        }
    }

    /// CQ `cq` fired (a [`Delivery::Stored`] named this channel).
    pub fn fire(&mut self, cq: C) {
        self.fired.push_back(cq);
    }

    /// `ibv_get_cq_event` without blocking: the next CQ that fired.
    pub fn next_event(&mut self) -> Option<C> {
        self.fired.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::WcOpcode;

    fn wc(qpn: u32, solicited: bool, status: WcStatus) -> WorkCompletion {
        let mut w = WorkCompletion::new(1, status, WcOpcode::Recv, qpn);
        w.solicited = solicited;
        w
    }

    fn ok(qpn: u32) -> WorkCompletion {
        wc(qpn, false, WcStatus::Success)
    }

    /// IBA 11.4.2.1, ibv_create_cq(3): a CQ holds `cqe` completions; one more is an overrun.
    #[test]
    fn a_full_cq_overruns_and_keeps_what_it_held() {
        let mut cq = CompletionQueue::new(2, None);
        assert_eq!(cq.complete(ok(1), None), Delivery::Stored { notify: None });
        assert_eq!(cq.complete(ok(2), None), Delivery::Stored { notify: None });
        assert_eq!(cq.complete(ok(3), None), Delivery::Overrun);
        let got: Vec<u32> = cq.poll(8).iter().map(|w| w.qp_num).collect();
        assert_eq!(got, [1, 2]);
        // Polled: room again.
        assert_eq!(cq.complete(ok(4), None), Delivery::Stored { notify: None });
    }

    /// A mapped CQ stores through the shell's ring, and overruns when the ring is full.
    #[test]
    fn a_ring_full_is_an_overrun_and_the_own_queue_stays_empty() {
        let mut cq = CompletionQueue::new(8, Some(3));
        let mut ring = Vec::new();
        let mut push = |w: &WorkCompletion| {
            ring.push(*w);
            ring.len() <= 1
        };
        assert_eq!(
            cq.complete(ok(1), Some(&mut push)),
            Delivery::Stored { notify: None }
        );
        assert_eq!(cq.complete(ok(2), Some(&mut push)), Delivery::Overrun);
        assert_eq!(cq.queued(), 0);
    }

    /// ibv_req_notify_cq(3): an armed CQ notifies its channel once, for the next completion.
    #[test]
    fn an_armed_cq_notifies_once_per_arm() {
        let mut cq = CompletionQueue::new(8, Some(7));
        assert_eq!(cq.complete(ok(1), None), Delivery::Stored { notify: None });
        cq.arm(false);
        assert_eq!(
            cq.complete(ok(1), None),
            Delivery::Stored { notify: Some(7) }
        );
        assert_eq!(cq.armed(), None);
        assert_eq!(cq.complete(ok(1), None), Delivery::Stored { notify: None });
    }

    /// A completion stored elsewhere (the same-host direct path's) fires the arm by the same
    /// rules, once, and stores nothing here.
    #[test]
    fn a_completion_stored_elsewhere_fires_the_arm_by_the_same_rules() {
        let mut cq = CompletionQueue::new(8, Some(5));
        assert_eq!(cq.completed_elsewhere(true), None, "not armed");
        cq.arm(true);
        assert_eq!(cq.completed_elsewhere(false), None, "unsolicited");
        assert_eq!(cq.completed_elsewhere(true), Some(5));
        assert_eq!(cq.completed_elsewhere(true), None, "one event per arm");
        cq.arm(false);
        assert_eq!(cq.completed_elsewhere(false), Some(5));
        assert_eq!(cq.queued(), 0);
        let mut none = CompletionQueue::new(8, None);
        none.arm(false);
        assert_eq!(none.completed_elsewhere(true), None, "no channel");
    }

    /// IBA 11.4.2.2: solicited-only fires on a solicited or an unsuccessful completion; an
    /// arm for any completion wins over a solicited-only one.
    #[test]
    fn solicited_only_waits_for_a_solicited_or_failed_completion() {
        let mut cq = CompletionQueue::new(8, Some(1));
        cq.arm(true);
        assert_eq!(cq.complete(ok(1), None), Delivery::Stored { notify: None });
        assert_eq!(
            cq.complete(wc(1, true, WcStatus::Success), None),
            Delivery::Stored { notify: Some(1) }
        );
        cq.arm(true);
        assert_eq!(
            cq.complete(wc(1, false, WcStatus::WrFlushErr), None),
            Delivery::Stored { notify: Some(1) }
        );
        cq.arm(true);
        cq.arm(false);
        assert_eq!(cq.armed(), Some(false));
        cq.arm(true);
        assert_eq!(cq.armed(), Some(false), "still armed for any completion");
        assert_eq!(
            cq.complete(ok(1), None),
            Delivery::Stored { notify: Some(1) }
        );
    }

    /// An overrun completion does not fire the arm (it was not stored); a CQ without a
    /// channel is disarmed by the completion that fires it all the same.
    #[test]
    fn an_overrun_keeps_the_arm_and_no_channel_still_disarms() {
        let mut cq = CompletionQueue::new(0, Some(2));
        cq.arm(false);
        assert_eq!(cq.complete(ok(1), None), Delivery::Overrun);
        assert_eq!(cq.armed(), Some(false));
        let mut cq = CompletionQueue::new(4, None);
        cq.arm(false);
        assert_eq!(cq.complete(ok(1), None), Delivery::Stored { notify: None });
        assert_eq!(cq.armed(), None);
    }

    /// A QP entering RESET takes back its completions not yet polled, and only its own.
    #[test]
    fn reset_purges_only_that_qps_completions() {
        let mut cq = CompletionQueue::new(8, None);
        for q in [1, 2, 1, 3] {
            cq.complete(ok(q), None);
        }
        cq.purge_qp(1);
        let got: Vec<u32> = cq.poll(8).iter().map(|w| w.qp_num).collect();
        assert_eq!(got, [2, 3]);
    }

    /// ibv_get_cq_event(3): one event per firing, in order.
    #[test]
    fn a_channel_hands_out_each_event_once_in_order() {
        let mut ch = CompChannel::new();
        ch.fire(5u32);
        ch.fire(6);
        assert_eq!(ch.next_event(), Some(5));
        assert_eq!(ch.next_event(), Some(6));
        assert_eq!(ch.next_event(), None);
    }
}
