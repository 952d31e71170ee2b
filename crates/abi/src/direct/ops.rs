//! The direct path's operations that run in the daemon (ABI 15, docs/design/direct-path.md,
//! "Atomics and memory windows", "Completion channels"): operands of the commands and the
//! channel header's notification words.

/// [`DirectAtomicReq::op`](crate::msg::DirectAtomicReq): `IBV_WR_ATOMIC_CMP_AND_SWP`.
pub const ATOMIC_CMP_SWP: u32 = 0;
/// [`DirectAtomicReq::op`](crate::msg::DirectAtomicReq): `IBV_WR_ATOMIC_FETCH_AND_ADD`.
pub const ATOMIC_FETCH_ADD: u32 = 1;

/// [`DirectLocalOpReq::op`](crate::msg::DirectLocalOpReq): a memory window bind.
pub const LOCAL_BIND: u32 = 0;
/// [`DirectLocalOpReq::op`](crate::msg::DirectLocalOpReq): a local invalidate.
pub const LOCAL_INV: u32 = 1;

/// [`DirectNotifyReq::target`](crate::msg::DirectNotifyReq): a CQ of the caller's context.
pub const NOTIFY_OWN: u32 = 0;
/// [`DirectNotifyReq::target`](crate::msg::DirectNotifyReq): the receive CQ of the peer QP.
pub const NOTIFY_PEER_RECV: u32 = 1;

/// [`DirectNotifyReq::target`](crate::msg::DirectNotifyReq): the send CQ of the peer QP,
/// whose request waits for a receive that was just posted ([`CH_WAITING`]).
pub const NOTIFY_PEER_SEND: u32 = 2;

/// [`DirectNotifyReq::target`](crate::msg::DirectNotifyReq): the caller's QP `qp` found
/// its peer not answering; the daemon wakes its armed CQs when the QP's retries would have
/// run out (local ACK timeout × (`retry_cnt` + 1)), when the library fails the request.
pub const NOTIFY_RETRY: u32 = 3;

/// [`DirectNotifyReq::target`](crate::msg::DirectNotifyReq): the caller's QP `qp` met no
/// receive at its peer (RNR) with a finite `rnr_retry`; the daemon wakes its armed CQs when
/// its RNR retries would have run out (`rnr_retry` × the peer's RNR timer).
pub const NOTIFY_RNR: u32 = 4;

/// Header word (`u32`) per side: that side's `min_rnr_timer` (the code of IBA table 45),
/// written by the daemon at attach and after every modify: how long the peer's requester
/// waits between RNR retries.
pub const CH_MIN_RNR: [usize; 2] = [1408, 1536];

/// Header word (`u32`) per side: 1 while that side's oldest request waits for a receive of
/// the peer (RNR), so the peer's `post_recv` has the daemon wake that side's armed send CQ
/// (a program blocked in `ibv_get_cq_event` then polls, which runs the request).
pub const CH_WAITING: [usize; 2] = [1152, 1280];

/// Header word (`u32`) per side, kept by the daemon: 1 while that side's receive CQ may be
/// armed (ibv_req_notify_cq(3) on a CQ with a completion channel, set before the arm is
/// answered; cleared when a direct completion fires it), so the library that produces its
/// receive completions tells the daemon ([`crate::msg::cmd::DirectNotify`]) only then, not
/// for every completion of a program that polls without arming. A producer pushes the
/// completion, fences (`SeqCst`) and then reads this word; the owner polls after arming
/// (the verbs rule), so one of them sees the other. Until ABI 16 it was set once, when the
/// pair was made, to whether the CQ had a channel.
pub const CH_RECV_CHANNEL: [usize; 2] = [1664, 1792];
