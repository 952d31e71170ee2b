//! The softverbs command ABI: what clients and the daemon say to each other over the Unix
//! socket.
//!
//! Every message is one `SOCK_SEQPACKET` datagram: a fixed 16-byte header ([`CmdHeader`] or
//! [`RespHeader`]) followed by one fixed-layout, little-endian struct (see [`msg`]). This is
//! the answer this project gives to the ABI question of the seed thread ("If we need to use
//! the create_flags field in userspace, we WILL need to break the ABI"):
//!
//! - **Structs only grow at the end.** A daemon reads `min(req_len, size_of::<Req>())` bytes
//!   into a zeroed struct, so an older client's shorter struct reads as zeros in the new
//!   fields. A longer struct from a newer client is accepted only if the bytes this daemon does
//!   not understand are all zero (uverbs' `ib_is_udata_cleared` rule).
//! - **New fields are announced in `comp_mask`.** A client that sets a field also sets the
//!   field's bit; a daemon refuses bits it does not know with `EOPNOTSUPP`, so a new feature
//!   never silently degrades into "ignored" on an older daemon.
//! - Responses follow the same rule the other way: the daemon writes at most `resp_len` bytes
//!   (what the client can hold) and the client zero-fills what an older daemon did not send.
//!
//! [`CreateQpReq`](msg::CreateQpReq)'s `create_flags` (ABI 2) is the worked example; the
//! daemon can be started at an older ABI level to prove both directions.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cm;
pub mod codec;
pub mod convert;
pub mod direct;
pub mod msg;

pub use codec::{
    decode_reply, decode_request, decode_response, encode_command, encode_request, encode_response,
    DecodeError, Request,
};

/// The newest ABI this crate speaks. 2: `CreateQpReq.create_flags`. 3: work queues and CQs in
/// shared memory (`MapQueues`, `MapDoorbell`). 4: a send ring's consumer note counts the
/// requests the daemon retired, which the client uses to refuse a post past `max_send_wr`.
/// 5: `Hello` carries the client's `/proc/self/mem` ([`msg::HELLO_MEM_FD`]), the only way
/// the daemon reaches memory that is not shared.
/// 6: the context's ready ring (`MapQueues` kind `QUEUES_READY`) and a QP's work flag
/// (`QueuesResp::flag_offset`), so the daemon visits only the QPs a client posted to.
/// 7: `Hello` carries the client's `/proc/self/maps` too ([`msg::HELLO_MAPS_FD`]), so that
/// registrations over unmapped or read-only pages fail.
/// 8: a send ring's pending pair (the count the daemon is about to publish and the CQ index
/// of the completion that goes with it), so a client whose daemon died between the two flushes
/// that request (docs/design/shm-rings.md).
/// 9: memory windows (`AllocMw`, `DeallocMw`, `QueryDeviceResp::max_mw`, bind and local
/// invalidate work requests; docs/design/memory-windows.md).
/// 10: UD multicast (`AttachMcast`, `DetachMcast`; the multicast limits at the end of
/// `QueryDeviceResp`).
/// 11: on-demand paging: `QueryOdpCaps` and `AdviseMr`.
/// 12: the connection manager's commands (ids 100–129, [`cm`], docs/design/cm.md §4).
/// 13: the same-host direct path (`DirectOpen`, `DirectAttach`, `DirectPeerError`, [`direct`],
/// docs/design/direct-path.md), and `CmAdopt` (`rdma_migrate_id` of an id with CM state).
/// 14: the direct path's speed: inline-payload slots in the channel
/// (`DirectAttachResp::inline_offset`), [`direct::MR_SHARED`] in the MR table and
/// `DirectMrFd` (id 143).
/// 15: the direct path's atomics, memory windows and completion channels (`DirectAtomic`,
/// `DirectLocalOp`, `DirectWindowTarget`, `DirectRemoteInv`, `DirectNotify`, `DirectCqOverrun`,
/// ids 150–155).
/// 16: SRQs on the direct path: `DirectOpenReq::caps`, the peer's SRQ in
/// `DirectAttachResp`, [`direct::srq_limit_offset`], [`direct::CH_SRQ_HELD`] and `DirectSrqLimit`
/// (id 156).
/// 17: the engine in the library for QPs connected to another host (docs/design/net-path.md):
/// [`direct::ABLE_NET`] in `DirectAttachReq::able`, [`direct::PATH_NET`] with the context's
/// steered UDP socket, and `NetQpError` (id 160).
/// 18: `NetDrops` (id 161): the library's engine reports its transport drops.
/// 19: stamped channel rings ([`direct::CAP_STAMPED`], `DirectAttachResp::rings`): a reader
/// sees a new entry by its stamp and never reads the writer's producer index.
/// 20: `CmListenReq::backlog` (rdma_listen(3)'s backlog; a client sends it only to a daemon
/// of ABI 20 or later), and the net path over a private socket per context ([`direct::ABLE_NET_FORWARDED`],
/// `DirectAttachResp::net_port`): the daemon forwards a net-path QP's packets to it; no
/// client holds a member of the device's port any more (issue 35, item 1).
pub const ABI_VERSION: u32 = 20;
/// The oldest ABI a daemon built from this crate accepts.
pub const MIN_ABI_VERSION: u32 = 1;

/// The largest message either side sends or accepts. A datagram that does not fit is a framing
/// error: the daemon closes that connection.
pub const MAX_MSG: usize = 4096;

/// Errno values used by the codec: those of the one table, `softverbs_core::errno`.
pub mod errno {
    pub use softverbs_core::errno::{EINVAL, EMSGSIZE, EOPNOTSUPP};
}
