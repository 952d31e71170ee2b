//! Command ids and the fixed-layout structs of every command.
//!
//! All integers are little-endian ([`U16`], [`U32`], [`U64`] keep them so on any host) and
//! every struct has alignment 1 and no padding, so its bytes are its layout. Handles are the
//! `u32` values the daemon hands out per context. Fields marked "ABI n" were appended in that
//! ABI version and are valid only with their `comp_mask` bit.

pub use crate::cm::*;
use zerocopy::little_endian::{I32, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Header of every request.
#[derive(
    Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout, PartialEq, Eq,
)]
#[repr(C)]
pub struct CmdHeader {
    /// A [`Cmd`] value.
    pub cmd: U32,
    /// Bytes of request struct after the header.
    pub req_len: U16,
    /// Bytes of response struct the client can take.
    pub resp_len: U16,
    /// Which optional request fields are valid (per command).
    pub comp_mask: U64,
}

/// Header of every response.
#[derive(
    Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout, PartialEq, Eq,
)]
#[repr(C)]
pub struct RespHeader {
    /// The command answered (0 if the request was too short to name one).
    pub cmd: U32,
    /// 0, or a positive errno.
    pub status: I32,
    /// Bytes of response struct after the header.
    pub len: U16,
    /// Reserved, zero.
    pub reserved: U16,
    /// Reserved, zero.
    pub reserved2: U32,
}

/// What a command sends and what it gets back: the request and response structs of one row
/// of the `commands!` table. Both ends encode and decode through it, so a command's id, its
/// request and its response cannot drift apart.
pub trait Command {
    /// The command id.
    const CMD: Cmd;
    /// The request struct (`()`: no body).
    type Req: FromBytes + IntoBytes + Immutable + KnownLayout + Default + Copy + core::fmt::Debug;
    /// The response struct (`()`: no body).
    type Resp: FromBytes + IntoBytes + Immutable + KnownLayout + Default + Copy + core::fmt::Debug;
}

/// The command table: `Name = id : Request => Response`, optionally `since N` (the ABI level
/// that introduced it; 1 otherwise). It generates the [`Cmd`] ids, one [`Command`] type per
/// command in [`cmd`], and the size and ABI queries of [`Cmd`]. Adding a command is one row.
macro_rules! commands {
    (@since) => { 1 };
    (@since $s:literal) => { $s };
    ($( $(#[$m:meta])* $name:ident = $val:literal $(since $since:literal)? : $req:ty => $resp:ty, )*) => {
        /// Command ids.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum Cmd { $( $(#[$m])* $name = $val, )* }

        impl Cmd {
            /// Every command.
            pub const ALL: &'static [Cmd] = &[$(Cmd::$name,)*];

            /// Decodes a command id.
            pub fn from_u32(v: u32) -> Option<Cmd> {
                match v { $( $val => Some(Cmd::$name), )* _ => None }
            }

            /// Size of the command's request struct in the newest ABI.
            pub fn request_size(self) -> usize {
                match self { $( Cmd::$name => core::mem::size_of::<$req>(), )* }
            }

            /// Size of the command's response struct in the newest ABI.
            pub fn response_size(self) -> usize {
                match self { $( Cmd::$name => core::mem::size_of::<$resp>(), )* }
            }

            /// The ABI level that introduced the command; a daemon speaking an older level
            /// answers it with `EOPNOTSUPP`.
            pub fn since_abi(self) -> u32 {
                match self { $( Cmd::$name => commands!(@since $($since)?), )* }
            }
        }

        /// One type per command, naming its id, request and response ([`Command`]).
        pub mod cmd {
            #[allow(unused_imports)]
            use super::*;
            $(
                $(#[$m])*
                #[derive(Clone, Copy, Debug)]
                pub struct $name;

                impl Command for $name {
                    const CMD: Cmd = Cmd::$name;
                    type Req = $req;
                    type Resp = $resp;
                }
            )*
        }
    };
}

commands! {
    /// Handshake; must be the first message. The async eventfd comes with the answer.
    Hello = 1 : HelloReq => HelloResp,
    /// One device by index.
    QueryDeviceList = 2 : QueryDeviceListReq => QueryDeviceListResp,
    /// `ibv_query_device` of the context's device.
    QueryDevice = 3 : () => QueryDeviceResp,
    /// `ibv_query_port`.
    QueryPort = 4 : QueryPortReq => QueryPortResp,
    /// `ibv_query_gid`.
    QueryGid = 5 : QueryGidReq => QueryGidResp,
    /// `ibv_alloc_pd`.
    AllocPd = 10 : () => HandleResp,
    /// `ibv_dealloc_pd`.
    DeallocPd = 11 : HandleReq => (),
    /// `ibv_reg_mr` (+ optionally a sealed memfd of the range as SCM_RIGHTS).
    RegMr = 12 : RegMrReq => RegMrResp,
    /// `ibv_dereg_mr`.
    DeregMr = 13 : HandleReq => (),
    /// `ibv_create_cq`.
    CreateCq = 14 : CreateCqReq => CreateCqResp,
    /// `ibv_resize_cq`.
    ResizeCq = 15 : ResizeCqReq => CreateCqResp,
    /// `ibv_destroy_cq`.
    DestroyCq = 16 : HandleReq => EventsResp,
    /// `ibv_create_srq`.
    CreateSrq = 17 : CreateSrqReq => SrqResp,
    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`.
    CreateXrcSrq = 18 : CreateXrcSrqReq => SrqResp,
    /// `ibv_modify_srq`.
    ModifySrq = 19 : ModifySrqReq => SrqResp,
    /// `ibv_query_srq`.
    QuerySrq = 20 : HandleReq => SrqResp,
    /// `ibv_destroy_srq`.
    DestroySrq = 21 : HandleReq => EventsResp,
    /// `ibv_get_srq_num`.
    GetSrqNum = 22 : HandleReq => SrqNumResp,
    /// `ibv_create_ah`.
    CreateAh = 23 : CreateAhReq => HandleResp,
    /// `ibv_destroy_ah`.
    DestroyAh = 24 : HandleReq => (),
    /// `ibv_rereg_mr`: the MR keeps its handle and keys. A daemon that predates it answers
    /// `EINVAL` (unknown command).
    ReregMr = 25 : ReregMrReq => RegMrResp,
    /// `ibv_open_xrcd` (+ the file's fd as SCM_RIGHTS, unless private).
    OpenXrcd = 30 : OpenXrcdReq => OpenXrcdResp,
    /// `ibv_close_xrcd`.
    CloseXrcd = 31 : HandleReq => (),
    /// `ibv_create_qp`. Also creates XRC receive QPs (upstream face).
    CreateQp = 32 : CreateQpReq => CreateQpResp,
    /// `ibv_modify_qp`.
    ModifyQp = 33 : ModifyQpReq => (),
    /// `ibv_query_qp`.
    QueryQp = 34 : HandleReq => QueryQpResp,
    /// `ibv_destroy_qp`.
    DestroyQp = 35 : HandleReq => EventsResp,
    /// Upstream `ibv_open_qp`.
    OpenQp = 36 : OpenQpReq => CreateQpResp,
    /// Legacy `ibv_create_xrc_rcv_qp`.
    CreateXrcRcvQp = 40 : XrcdReq => QpNumResp,
    /// Legacy `ibv_modify_xrc_rcv_qp`.
    ModifyXrcRcvQp = 41 : ModifyXrcRcvQpReq => (),
    /// Legacy `ibv_query_xrc_rcv_qp`.
    QueryXrcRcvQp = 42 : XrcRcvQpReq => QueryQpResp,
    /// Legacy `ibv_reg_xrc_rcv_qp`.
    RegXrcRcvQp = 43 : XrcRcvQpReq => (),
    /// Legacy `ibv_unreg_xrc_rcv_qp`.
    UnregXrcRcvQp = 44 : XrcRcvQpReq => EventsResp,
    /// Legacy `ibv_destroy_xrc_rcv_qp` (means "unregister me").
    DestroyXrcRcvQp = 45 : XrcRcvQpReq => EventsResp,
    /// Minimal: `qp_num` = [`CREATE_NEW_QP`] to create, else join.
    RegisterXrcRcvQp = 46 : XrcRcvQpReq => QpNumResp,
    /// Minimal: leave.
    UnregisterXrcRcvQp = 47 : XrcRcvQpReq => EventsResp,
    /// `ibv_get_async_event` without blocking: `EAGAIN` when no event is pending.
    GetAsyncEvent = 50 : () => AsyncEventResp,
    /// Daemon status.
    Status = 60 : () => StatusResp,
    /// A memfd holding the JSON of the daemon's resources comes with the answer.
    Resources = 61 : () => BlobResp,
    /// Administrative: raises an async event on a QP or port as the NIC would (fault
    /// injection); only the daemon's own uid or root may.
    InjectEvent = 62 : InjectEventReq => InjectEventResp,
    /// `ibv_post_send` of one work request.
    PostSend = 70 since 3 : PostSendReq => (),
    /// `ibv_post_recv` on a QP.
    PostRecv = 71 since 3 : PostRecvReq => (),
    /// `ibv_post_srq_recv`.
    PostSrqRecv = 72 since 3 : PostRecvReq => (),
    /// `ibv_poll_cq`.
    PollCq = 73 since 3 : PollCqReq => PollCqResp,
    /// `ibv_create_comp_channel`: the channel's eventfd comes with the answer.
    CreateCompChannel = 74 since 3 : () => HandleResp,
    /// `ibv_destroy_comp_channel`: `EBUSY` while CQs use it.
    DestroyCompChannel = 75 since 3 : HandleReq => (),
    /// `ibv_req_notify_cq`.
    ReqNotifyCq = 76 since 3 : ReqNotifyCqReq => (),
    /// `ibv_get_cq_event` on a channel: `EAGAIN` when none fired.
    GetCqEvent = 77 since 3 : HandleReq => CqEventResp,
    /// A memfd holding the object's rings comes with the answer.
    MapQueues = 78 since 3 : MapQueuesReq => QueuesResp,
    /// The context's doorbell eventfd comes with the (empty) answer.
    MapDoorbell = 79 since 3 : () => (),
    /// `ibv_attach_mcast`: a UD QP joins a multicast group (`softverbs_core::mcast`).
    AttachMcast = 90 since 10 : McastReq => (),
    /// `ibv_detach_mcast`.
    DetachMcast = 91 since 10 : McastReq => (),
    /// ABI 11: the device's on-demand-paging capabilities (`ibv_query_device_ex`'s
    /// `odp_caps` and `xrc_odp_caps`). A daemon that predates it answers `EINVAL`: no ODP.
    QueryOdpCaps = 95 since 11 : () => OdpCapsResp,
    /// ABI 11: `ibv_advise_mr(3)` of up to [`MAX_WIRE_SGE`] ranges.
    AdviseMr = 96 since 11 : AdviseMrReq => (),
    /// `ibv_alloc_mw` (docs/design/memory-windows.md).
    AllocMw = 80 since 9 : AllocMwReq => AllocMwResp,
    /// `ibv_dealloc_mw`.
    DeallocMw = 81 since 9 : HandleReq => (),
    /// The context's CM event eventfd comes with the (empty) answer (docs/design/cm.md §4).
    CmOpen = 100 since 12 : () => (),
    /// Listen on a service ID.
    CmListen = 101 since 12 : CmListenReq => CmIdResp,
    /// Send a REQ.
    CmConnect = 102 since 12 : CmConnectReq => CmIdResp,
    /// Answer a connect request with a REP.
    CmAccept = 103 since 12 : CmAcceptReq => (),
    /// Reject a connect request.
    CmReject = 104 since 12 : CmRejectReq => (),
    /// Send the RTU after a REP.
    CmEstablish = 105 since 12 : CmIdReq => (),
    /// Send a DREQ.
    CmDisconnect = 106 since 12 : CmDisconnectReq => (),
    /// Let go of a CM id or listener (the peer sees a REJ or DREQ as appropriate).
    CmDestroyId = 107 since 12 : CmIdReq => (),
    /// The next CM event: `EAGAIN` when none is pending.
    CmGetEvent = 108 since 12 : () => CmEventResp,
    /// Send a SIDR_REQ.
    CmSidrRequest = 109 since 12 : CmSidrReq => CmIdResp,
    /// Answer a SIDR_REQ.
    CmSidrReply = 110 since 12 : CmSidrReplyReq => (),
    /// What the context holds in the CM.
    CmCounts = 111 since 12 : () => CmCountsResp,
    /// ABI 13: `rdma_migrate_id(3)` of an id with CM state: the CM id (a listener or a
    /// connection) held by another context of the caller's own process becomes this
    /// context's, with its queued events (docs/design/cm.md §7).
    CmAdopt = 112 since 13 : CmIdReq => (),
    /// ABI 13: this context may take the same-host direct path (docs/design/direct-path.md); its
    /// `/proc/self/mem` comes with the request. The answer's descriptor is the context's MR
    /// table, which the daemon keeps ([`direct`](crate::direct)).
    DirectOpen = 140 since 13 : DirectOpenReq => (),
    /// ABI 13: after a modify to RTR, whether the RC/UC QP exchanges work with its peer
    /// directly. With a channel: the channel memfd, the peer's memory and its MR table.
    DirectAttach = 141 since 13 : DirectAttachReq => DirectAttachResp,
    /// ABI 13: a request on a direct QP broke a rule at the peer (its R_Key, range, access, a
    /// receive too short): the daemon moves the peer QP to ERR and raises `event` on it, as
    /// the responder's engine would (the requester has moved its own QP to ERR).
    DirectPeerError = 142 since 13 : DirectPeerErrorReq => (),
    /// ABI 14: the memfd behind the peer's MR `key`, when the daemon holds one (the MR table
    /// marks it [`direct::MR_SHARED`](crate::direct::MR_SHARED)), for the library to map and
    /// reach with `memcpy` instead of the peer's `/proc/<pid>/mem` (docs/design/direct-path.md).
    DirectMrFd = 143 since 14 : DirectMrFdReq => DirectMrFdResp,
    /// ABI 15: an atomic posted on a direct QP, executed in the daemon's thread (so atomic
    /// with respect to the engine's atomics, `IBV_ATOMIC_HCA`) against the peer QP's memory
    /// with the responder's checks; a refusal fails the peer as its engine would
    /// (docs/design/direct-path.md, "Atomics and memory windows").
    DirectAtomic = 150 since 15 : DirectAtomicReq => DirectOpResp,
    /// ABI 15: a bind (`IBV_WR_BIND_MW`, `ibv_bind_mw`) or `IBV_WR_LOCAL_INV` posted on a
    /// direct QP, executed on the engine's windows in posting order.
    DirectLocalOp = 151 since 15 : DirectLocalOpReq => DirectOpResp,
    /// ABI 15: an RDMA WRITE or READ of a direct QP names a memory window's R_Key: the
    /// engine's check for the peer QP (window bound, its QP for type 2, PD, access, range);
    /// `value` is the address in the peer's memory.
    DirectWindowTarget = 152 since 15 : DirectWindowReq => DirectOpResp,
    /// ABI 15: a Send with Invalidate of a direct QP reached the peer's receive: the peer QP
    /// invalidates the key as its engine would (IBA 10.6.7.2.5).
    DirectRemoteInv = 153 since 15 : DirectRemoteInvReq => DirectOpResp,
    /// ABI 15: a direct completion landed on a CQ that has a completion channel: an armed
    /// CQ raises its event (ibv_req_notify_cq(3)).
    DirectNotify = 154 since 15 : DirectNotifyReq => (),
    /// ABI 15: the completions the library keeps for a direct QP overran the CQ `handle`
    /// (its `cqe`): the owner gets `IBV_EVENT_CQ_ERR` (IBA 11.4.2.1).
    DirectCqOverrun = 155 since 15 : HandleReq => (),
    /// ABI 16: the caller's direct QP `handle` took a receive from its peer QP's SRQ and
    /// found fewer posted than the SRQ's armed limit, which it disarmed
    /// ([`direct::srq_limit_offset`](crate::direct::srq_limit_offset)): the daemon raises
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` on that SRQ (ibv_modify_srq(3)).
    DirectSrqLimit = 156 since 16 : HandleReq => (),
    /// ABI 17: the library's engine moved its QP (on [`direct::PATH_NET`](crate::direct))
    /// to ERR: the daemon moves it there too and raises `event` on it, as it does for its
    /// own engine's errors (docs/design/net-path.md).
    NetQpError = 160 since 17 : DirectPeerErrorReq => (),
    /// ABI 18: what the library's engine of the context dropped so far (its totals, not
    /// increments), counted into `softverbs status`'s transport drops with the daemon's
    /// engines' (docs/design/net-path.md).
    NetDrops = 161 since 18 : NetDropsReq => (),
}

/// [`MapQueuesReq::kind`]: a QP's send and receive queues.
pub const QUEUES_QP: u32 = 0;
/// [`MapQueuesReq::kind`]: a CQ.
pub const QUEUES_CQ: u32 = 1;
/// [`MapQueuesReq::kind`]: an SRQ's receive queue (ring `a`, entries [`PostRecvReq`]). A
/// daemon that predates it answers `EINVAL` and the client keeps `PostSrqRecv` commands.
pub const QUEUES_SRQ: u32 = 2;
/// [`MapQueuesReq::kind`] (ABI 6; `handle` 0): the context's ready ring (ring `a`, 8-byte
/// entries, a QP handle in the low 32 bits, little-endian). After posting to a QP whose
/// work flag ([`QueuesResp::flag_offset`]) it found clear, the client sets the flag and
/// pushes the QP's handle here (docs/design/shm-rings.md, "Ready ring"). Mapped at most once per
/// context (`EEXIST`); a daemon that predates it answers `EINVAL`.
pub const QUEUES_READY: u32 = 3;

/// `qp_num` meaning "create a new receive QP" in the minimal register call (Roland Dreier's
/// proposal: "pass in an invalid qp_num (say, -1 aka ffffffff)").
pub const CREATE_NEW_QP: u32 = 0xffff_ffff;

/// `device` value of [`HelloReq`] for a connection that opens no device (introspection).
pub const NO_DEVICE: u32 = 0xffff_ffff;

macro_rules! wire {
    ($( $(#[$m:meta])* pub struct $name:ident { $( $(#[$fm:meta])* pub $f:ident : $t:ty, )* } )*) => {
        $(
            $(#[$m])*
            #[allow(missing_docs)] // fields are named after their verbs.h namesakes
            #[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, PartialEq, Eq)]
            #[repr(C)]
            pub struct $name { $( $(#[$fm])* pub $f: $t, )* }

            impl Default for $name {
                fn default() -> Self {
                    <Self as zerocopy::FromZeros>::new_zeroed()
                }
            }
        )*
    };
}

wire! {
    /// [`cmd::DirectOpen`] (ABI 16; an older library sends nothing, read as zeros).
    pub struct DirectOpenReq {
        /// What the library's direct path can do beyond ABI 15:
        /// [`direct::CAP_SRQ`](crate::direct::CAP_SRQ),
        /// [`direct::CAP_STAMPED`](crate::direct::CAP_STAMPED) (ABI 19).
        pub caps: U32,
        pub reserved: U32,
    }

    /// [`cmd::DirectAttach`].
    pub struct DirectAttachReq {
        pub qp: U32,
        /// 1 if this library can run the QP directly (its CQs have no completion channel).
        pub able: U32,
    }

    /// [`cmd::DirectAttach`]: `path` is one of [`direct::PATH_UNDECIDED`](crate::direct),
    /// `PATH_DIRECT` (both asked; descriptors come) or `PATH_DAEMON` (no descriptors).
    pub struct DirectAttachResp {
        pub path: U32,
        /// Which half of the channel is this QP's (0 or 1).
        pub side: U32,
        pub region_len: U64,
        /// The peer QP's number, its PD handle (in the peer's context) and type.
        pub peer_qpn: U32,
        pub peer_pd: U32,
        /// This QP's PD handle, as the daemon knows it.
        pub own_pd: U32,
        /// ABI 19: [`direct::RINGS_STAMPED`](crate::direct::RINGS_STAMPED) when the rings
        /// below carry a stamp per entry; 0: plain rings (an older daemon leaves it 0).
        pub rings: U32,
        /// Receive ring and receive-completion ring of each side: offsets and capacities.
        pub rq_offset: [U32; 2],
        pub cqe_offset: [U32; 2],
        pub capacity: [U32; 2],
        pub rq_entry: U32,
        pub cqe_entry: U32,
        /// ABI 14: each side's inline-payload slots (one per entry of its receive-completion
        /// ring, [`direct::inline`](crate::direct::inline)), and the bytes per slot; 0: none.
        pub inline_offset: [U32; 2],
        pub inline_slot: U32,
        /// [`direct::PATH_NET`](crate::direct::PATH_NET) answering a library that set
        /// [`direct::ABLE_NET_STATUS`](crate::direct::ABLE_NET_STATUS), with the context's
        /// socket (`side` 1): the bytes of the net status region, whose memfd is the last
        /// descriptor; 0: none.
        pub status_len: U32,
        /// ABI 16: the peer QP receives through an SRQ: the SRQ's region (one more
        /// descriptor; 0: no SRQ), its ring's capacity and entry size (at offset 0), and
        /// where its limit word is ([`direct::srq_limit_offset`](crate::direct::srq_limit_offset)).
        pub srq_len: U64,
        pub srq_capacity: U32,
        pub srq_entry: U32,
        pub srq_limit: U32,
        /// ABI 16: the PD each side's receive buffers are checked in (its SRQ's, or its QP's).
        pub recv_pd: [U32; 2],
        /// ABI 20, [`direct::PATH_NET`](crate::direct::PATH_NET): the device's UDP port
        /// (4791 outside tests). The library sends to its peers' devices on it and accepts a
        /// forwarded packet only from the device's address and this port, which only the
        /// daemon holds.
        pub net_port: U32,
    }

    /// [`cmd::DirectMrFd`]: `qp` is a direct QP of the caller, `key` an MR of its peer.
    pub struct DirectMrFdReq {
        pub qp: U32,
        pub key: U32,
    }

    /// [`cmd::DirectMrFd`]: with the memfd. Byte 0 of the file is the first byte of the page
    /// holding `addr` (the MR's first byte in the peer's address space); `map_len` bytes
    /// (whole pages) cover the MR.
    pub struct DirectMrFdResp {
        pub addr: U64,
        pub len: U64,
        pub map_len: U64,
    }

    /// [`cmd::DirectPeerError`].
    pub struct DirectPeerErrorReq {
        pub qp: U32,
        /// `enum ibv_event_type` to raise on the peer QP, or
        /// [`direct::NO_EVENT`](crate::direct::NO_EVENT).
        pub event: U32,
    }

    /// [`cmd::NetDrops`]: the counters of `StatusResp::net_foreign_source` and
    /// `net_outside_window`, for the context's engine since it started.
    pub struct NetDropsReq {
        pub foreign_source: U64,
        pub outside_window: U64,
    }

    /// [`cmd::DirectAtomic`]: `op` is [`direct::ATOMIC_CMP_SWP`](crate::direct) or
    /// `ATOMIC_FETCH_ADD`; `swap_add` the swap or add operand.
    pub struct DirectAtomicReq {
        pub qp: U32,
        pub op: U32,
        pub remote_addr: U64,
        pub rkey: U32,
        pub reserved: U32,
        pub compare: U64,
        pub swap_add: U64,
    }

    /// Answer of the direct path's operations: `status` an `enum ibv_wc_status` (0: done),
    /// `value` the atomic's original value or the window's address.
    pub struct DirectOpResp {
        pub status: U32,
        pub reserved: U32,
        pub value: U64,
    }

    /// [`cmd::DirectLocalOp`]: `op` is [`direct::LOCAL_BIND`](crate::direct) (`mw_rkey`,
    /// `new_rkey`, `mr_lkey`, `access`, `addr`, `length` as in `ibv_mw_bind_info`) or
    /// `LOCAL_INV` (`mw_rkey` the key invalidated).
    pub struct DirectLocalOpReq {
        pub qp: U32,
        pub op: U32,
        pub mw_rkey: U32,
        pub new_rkey: U32,
        pub mr_lkey: U32,
        pub access: U32,
        pub addr: U64,
        pub length: U64,
    }

    /// [`cmd::DirectWindowTarget`]: `need` is the `ibv_access_flags` bit asked for.
    pub struct DirectWindowReq {
        pub qp: U32,
        pub rkey: U32,
        pub va: U64,
        pub len: U64,
        pub need: U32,
        pub reserved: U32,
    }

    /// [`cmd::DirectRemoteInv`].
    pub struct DirectRemoteInvReq {
        pub qp: U32,
        pub rkey: U32,
    }

    /// [`cmd::DirectNotify`]: `target` [`direct::NOTIFY_OWN`](crate::direct) names this
    /// context's CQ `cq`; `NOTIFY_PEER_RECV` the receive CQ of `qp`'s direct peer.
    /// `solicited`: the completion was solicited or unsuccessful (IBA 11.4.2.2).
    pub struct DirectNotifyReq {
        pub qp: U32,
        pub target: U32,
        pub cq: U32,
        pub solicited: U32,
    }

    /// First message of a connection.
    pub struct HelloReq {
        /// ABI version the client speaks.
        pub abi_version: U32,
        /// Device index to open a context on, or [`NO_DEVICE`].
        pub device: U32,
    }

    /// Answer to [`HelloReq`]. When a device was opened, the async-event eventfd comes with it.
    pub struct HelloResp {
        /// ABI version the daemon speaks (the client must not use newer features).
        pub abi_version: U32,
        /// Number of devices.
        pub num_devices: U32,
        /// The context id (for introspection).
        pub ctx_id: U64,
        /// ABI 3: the daemon's pid (a client authorizes it to reach its memory with
        /// `PR_SET_PTRACER`).
        pub daemon_pid: U32,
        /// ABI 3: reserved, zero.
        pub reserved: U32,
    }

    /// A request naming one object of the caller's context.
    pub struct HandleReq {
        /// The handle.
        pub handle: U32,
    }

    /// A response carrying one new handle.
    pub struct HandleResp {
        /// The handle.
        pub handle: U32,
    }

    /// `events_reported` of a destroyed object (rdma-core's destroy waits for that many acks).
    pub struct EventsResp {
        /// Async events read for the object.
        pub events_reported: U32,
    }

    /// One device by index.
    pub struct QueryDeviceListReq {
        /// Index, from 0.
        pub index: U32,
    }

    /// Name and GUID of one device.
    pub struct QueryDeviceListResp {
        /// NUL-padded name.
        pub name: [u8; 64],
        /// Node GUID.
        pub node_guid: U64,
    }

    /// `ibv_query_device` of the context's device.
    pub struct QueryDeviceResp {
        pub fw_ver: [u8; 64],
        pub node_guid: U64,
        pub sys_image_guid: U64,
        pub max_mr_size: U64,
        pub page_size_cap: U64,
        pub device_cap_flags: U64,
        pub vendor_id: U32,
        pub vendor_part_id: U32,
        pub hw_ver: U32,
        pub max_qp: U32,
        pub max_qp_wr: U32,
        pub max_sge: U32,
        pub max_sge_rd: U32,
        pub max_cq: U32,
        pub max_cqe: U32,
        pub max_mr: U32,
        pub max_pd: U32,
        pub max_qp_rd_atom: U32,
        pub max_ee_rd_atom: U32,
        pub max_res_rd_atom: U32,
        pub max_qp_init_rd_atom: U32,
        pub max_ee_init_rd_atom: U32,
        pub atomic_cap: U32,
        pub max_ah: U32,
        pub max_srq: U32,
        pub max_srq_wr: U32,
        pub max_srq_sge: U32,
        pub max_inline_data: U32,
        pub num_comp_vectors: U32,
        pub max_pkeys: U16,
        pub local_ca_ack_delay: u8,
        pub phys_port_cnt: u8,
        /// ABI 9: memory windows (0 from an older daemon, which has none).
        pub max_mw: U32,
        /// ABI 10 (a daemon before it sends none: read as 0, no multicast).
        pub max_mcast_grp: U32,
        /// ABI 10.
        pub max_mcast_qp_attach: U32,
        /// ABI 10.
        pub max_total_mcast_qp_attach: U32,
    }

    /// `ibv_attach_mcast` / `ibv_detach_mcast` (ABI 10).
    pub struct McastReq {
        /// The QP handle.
        pub qp: U32,
        /// The MLID (ignored on a RoCE port, as the kernel ignores it).
        pub lid: U16,
        /// Reserved, zero.
        pub reserved: U16,
        /// The multicast GID.
        pub gid: [u8; 16],
    }

    /// ABI 9: `ibv_alloc_mw`.
    pub struct AllocMwReq {
        pub pd: U32,
        /// `enum ibv_mw_type`: 1 or 2 (anything else is `EINVAL`).
        pub mw_type: U32,
    }

    /// ABI 9: `ibv_alloc_mw` answer: the window's handle and first R_Key.
    pub struct AllocMwResp {
        pub handle: U32,
        pub rkey: U32,
    }

    /// `ibv_query_port`.
    pub struct QueryPortReq {
        /// Port number, from 1.
        pub port: U32,
    }

    /// `ibv_query_port` answer.
    pub struct QueryPortResp {
        pub state: U32,
        pub max_mtu: U32,
        pub active_mtu: U32,
        pub gid_tbl_len: U32,
        pub max_msg_sz: U32,
        pub pkey_tbl_len: U16,
        pub link_layer: u8,
        pub reserved: u8,
    }

    /// `ibv_query_gid`.
    pub struct QueryGidReq {
        pub port: U32,
        pub index: U32,
    }

    /// A GID.
    pub struct QueryGidResp {
        pub gid: [u8; 16],
    }

    /// `ibv_reg_mr_iova2`.
    pub struct RegMrReq {
        pub pd: U32,
        pub access: U32,
        pub addr: U64,
        pub length: U64,
        pub iova: U64,
    }

    /// `ibv_rereg_mr`: `flags` are [`REREG_MR_CHANGE_TRANSLATION`], [`REREG_MR_CHANGE_PD`]
    /// and [`REREG_MR_CHANGE_ACCESS`]; the fields of a change not asked for are ignored.
    pub struct ReregMrReq {
        pub handle: U32,
        pub flags: U32,
        pub pd: U32,
        pub access: U32,
        pub addr: U64,
        pub length: U64,
        pub iova: U64,
    }

    /// Keys of a new MR.
    pub struct RegMrResp {
        pub handle: U32,
        pub lkey: U32,
        pub rkey: U32,
    }

    /// `ibv_create_cq`.
    pub struct CreateCqReq {
        pub cqe: U32,
        pub comp_vector: U32,
        /// ABI 3, with [`CREATE_CQ_CHANNEL`]: the completion channel handle.
        pub channel: U32,
        /// ABI 3: reserved, zero.
        pub reserved: U32,
    }

    /// ABI 3: `ibv_req_notify_cq`.
    pub struct ReqNotifyCqReq {
        pub cq: U32,
        pub solicited_only: U32,
    }

    /// ABI 3: a CQ that has a completion event.
    pub struct CqEventResp {
        pub cq: U32,
    }

    /// ABI 3: map the rings of a QP ([`QUEUES_QP`]), CQ ([`QUEUES_CQ`]) or SRQ
    /// ([`QUEUES_SRQ`]).
    pub struct MapQueuesReq {
        pub kind: U32,
        pub handle: U32,
    }

    /// ABI 3: where the rings are in the memfd: ring `a` (the QP's send queue, or the CQ)
    /// and ring `b` (the QP's receive queue; capacity 0 if none). Entries of the send queue
    /// are [`SendWrWire`], of the receive queue [`PostRecvReq`], of a CQ [`WcWire`], each
    /// padded to a multiple of 8 bytes.
    pub struct QueuesResp {
        pub region_len: U64,
        pub a_offset: U32,
        pub a_capacity: U32,
        pub a_entry: U32,
        pub b_offset: U32,
        pub b_capacity: U32,
        pub b_entry: U32,
        /// ABI 6, QP rings of a context with a ready ring: offset in the memfd of the QP's
        /// work flag (one `u32`), or 0 when the daemon visits the QP every turn anyway.
        pub flag_offset: U32,
    }

    /// `ibv_resize_cq`.
    pub struct ResizeCqReq {
        pub handle: U32,
        pub cqe: U32,
    }

    /// A CQ handle and its granted size.
    pub struct CreateCqResp {
        pub handle: U32,
        pub cqe: U32,
    }

    /// `ibv_create_srq`.
    pub struct CreateSrqReq {
        pub pd: U32,
        pub max_wr: U32,
        pub max_sge: U32,
        pub srq_limit: U32,
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`. `present` says which of pd/xrcd/cq were given
    /// (bits [`PRESENT_PD`], [`PRESENT_XRCD`], [`PRESENT_CQ`]).
    pub struct CreateXrcSrqReq {
        pub pd: U32,
        pub xrcd: U32,
        pub cq: U32,
        pub max_wr: U32,
        pub max_sge: U32,
        pub srq_limit: U32,
        pub present: U32,
    }

    /// `ibv_modify_srq`.
    pub struct ModifySrqReq {
        pub handle: U32,
        pub attr_mask: U32,
        pub max_wr: U32,
        pub srq_limit: U32,
    }

    /// SRQ handle and attributes.
    pub struct SrqResp {
        pub handle: U32,
        pub max_wr: U32,
        pub max_sge: U32,
        pub srq_limit: U32,
        /// SRQ number (XRC SRQs), else 0.
        pub srqn: U32,
    }

    /// `ibv_get_srq_num`.
    pub struct SrqNumResp {
        pub srqn: U32,
    }

    /// `struct ibv_ah_attr` with its GRH.
    pub struct AhAttrWire {
        pub dgid: [u8; 16],
        pub flow_label: U32,
        pub dlid: U16,
        pub sgid_index: u8,
        pub hop_limit: u8,
        pub traffic_class: u8,
        pub sl: u8,
        pub src_path_bits: u8,
        pub static_rate: u8,
        pub is_global: u8,
        pub port_num: u8,
        pub reserved: [u8; 2],
    }

    /// `ibv_create_ah`.
    pub struct CreateAhReq {
        pub pd: U32,
        pub attr: AhAttrWire,
    }

    /// `ibv_open_xrcd`. `has_fd` = 1 when the file's fd rides along as SCM_RIGHTS; 0 for a
    /// private domain (`fd == -1`).
    pub struct OpenXrcdReq {
        pub oflags: U32,
        pub has_fd: U32,
    }

    /// A new XRCD handle.
    pub struct OpenXrcdResp {
        pub handle: U32,
        pub created: U32,
        pub xrcd_id: U64,
    }

    /// `struct ibv_qp_cap`.
    pub struct QpCapWire {
        pub max_send_wr: U32,
        pub max_recv_wr: U32,
        pub max_send_sge: U32,
        pub max_recv_sge: U32,
        pub max_inline_data: U32,
    }

    /// `ibv_create_qp` / `ibv_create_qp_ex`. `present` says which handles were given
    /// ([`PRESENT_PD`] … [`PRESENT_XRCD`]).
    pub struct CreateQpReq {
        pub qp_type: U32,
        pub present: U32,
        pub pd: U32,
        pub send_cq: U32,
        pub recv_cq: U32,
        pub srq: U32,
        pub xrcd: U32,
        pub sq_sig_all: U32,
        pub cap: QpCapWire,
        /// ABI 2, with [`CREATE_QP_CREATE_FLAGS`]: `enum ibv_qp_create_flags`.
        pub create_flags: U32,
        /// ABI 2: reserved, zero.
        pub reserved: U32,
    }

    /// A QP handle and number.
    pub struct CreateQpResp {
        pub handle: U32,
        pub qpn: U32,
        pub cap: QpCapWire,
    }

    /// `struct ibv_qp_attr`.
    pub struct QpAttrWire {
        pub qp_state: U32,
        pub cur_qp_state: U32,
        pub path_mtu: U32,
        pub path_mig_state: U32,
        pub qkey: U32,
        pub rq_psn: U32,
        pub sq_psn: U32,
        pub dest_qp_num: U32,
        pub qp_access_flags: U32,
        pub rate_limit: U32,
        pub cap: QpCapWire,
        pub ah_attr: AhAttrWire,
        pub alt_ah_attr: AhAttrWire,
        pub pkey_index: U16,
        pub alt_pkey_index: U16,
        pub en_sqd_async_notify: u8,
        pub sq_draining: u8,
        pub max_rd_atomic: u8,
        pub max_dest_rd_atomic: u8,
        pub min_rnr_timer: u8,
        pub port_num: u8,
        pub timeout: u8,
        pub retry_cnt: u8,
        pub rnr_retry: u8,
        pub alt_port_num: u8,
        pub alt_timeout: u8,
        pub reserved: u8,
    }

    /// `ibv_modify_qp`.
    pub struct ModifyQpReq {
        pub handle: U32,
        pub attr_mask: U32,
        pub attr: QpAttrWire,
    }

    /// `ibv_query_qp` answer.
    pub struct QueryQpResp {
        pub attr: QpAttrWire,
        pub qp_type: U32,
        pub sq_sig_all: U32,
        pub create_flags: U32,
        pub qpn: U32,
        pub init_cap: QpCapWire,
    }

    /// `ibv_open_qp`.
    pub struct OpenQpReq {
        pub xrcd: U32,
        pub qp_num: U32,
        pub qp_type: U32,
    }

    /// A request naming an XRC domain handle.
    pub struct XrcdReq {
        pub xrcd: U32,
    }

    /// A receive QP named the legacy way: by domain and number.
    pub struct XrcRcvQpReq {
        pub xrcd: U32,
        pub qp_num: U32,
    }

    /// Legacy `ibv_modify_xrc_rcv_qp`.
    pub struct ModifyXrcRcvQpReq {
        pub xrcd: U32,
        pub qp_num: U32,
        pub attr_mask: U32,
        pub attr: QpAttrWire,
    }

    /// A QP number.
    pub struct QpNumResp {
        pub qpn: U32,
    }

    /// One async event. `element_kind` is an [`ElementKind`] value; `element` is the handle,
    /// QP number or port it names.
    pub struct AsyncEventResp {
        pub event_type: U32,
        pub element_kind: U32,
        pub element: U32,
        /// `event_type` with the legacy XRC flag (0x80000000) when the element is a QP number.
        pub legacy_event_type: U32,
    }

    /// Daemon status.
    pub struct StatusResp {
        pub daemon_pid: U32,
        pub abi_version: U32,
        pub uptime_ms: U64,
        pub devices: U32,
        pub contexts: U32,
        pub xrcds: U32,
        pub xrc_recv_qps: U32,
        pub qps: U32,
        pub srqs: U32,
        pub cqs: U32,
        pub mrs: U32,
        /// ABI 6: rounds the data path has run (each a pass over the QP rings to visit).
        pub dp_rounds: U64,
        /// ABI 6: QP ring visits over all rounds (a QP's send and receive ring count once).
        pub dp_qp_visits: U64,
        /// ABI 6: the most QPs visited in one round.
        pub dp_max_qp_visits: U32,
        /// ABI 6: QPs queued for the next round (those with work).
        pub dp_queued_qps: U32,
        /// Packets the transport dropped because they came for a connected QP from an
        /// address other than its peer's (all devices; an older daemon's reply reads 0).
        pub net_foreign_source: U64,
        /// Responses the transport dropped for a PSN outside the window of outstanding PSNs
        /// (duplicates and ghosts; all devices; an older daemon's reply reads 0).
        pub net_outside_window: U64,
    }

    /// The size of a blob passed as a memfd.
    pub struct BlobResp {
        pub len: U64,
    }

    /// Fault injection: raise `event_type` on QP `qpn`.
    pub struct InjectEventReq {
        pub qpn: U32,
        pub event_type: U32,
        /// Port events (`PORT_ACTIVE`, `PORT_ERR`, ...): the port, numbered from 1 (ABI 3+;
        /// an older client's shorter request reads 0, which no port has).
        pub port: U32,
        /// Port events: the device index.
        pub device: U32,
    }

    /// How many contexts received the injected event.
    pub struct InjectEventResp {
        pub contexts: U32,
    }

    /// `struct ibv_sge`.
    pub struct SgeWire {
        pub addr: U64,
        pub length: U32,
        pub lkey: U32,
    }

    /// `struct ibv_send_wr` (one, not a list). `opcode` is `enum ibv_wr_opcode`, `send_flags`
    /// `enum ibv_send_flags`; inline data (`IBV_SEND_INLINE`) travels in `inline_data`.
    pub struct SendWrWire {
        pub wr_id: U64,
        pub remote_addr: U64,
        pub compare_add: U64,
        pub swap: U64,
        pub opcode: U32,
        pub send_flags: U32,
        /// Immediate data, or the R_Key to invalidate for SEND_WITH_INV.
        pub imm_data: U32,
        pub rkey: U32,
        /// XRC: the SRQ number at the target.
        pub remote_srqn: U32,
        /// UD: address handle, remote QPN and Q_Key.
        pub ah: U32,
        pub remote_qpn: U32,
        pub remote_qkey: U32,
        pub num_sge: U32,
        pub inline_len: U32,
        pub sg_list: [SgeWire; MAX_WIRE_SGE],
        pub inline_data: [u8; MAX_WIRE_INLINE],
    }

    /// ABI 11: `struct ibv_odp_caps` and `xrc_odp_caps` (verbs.h bit values).
    pub struct OdpCapsResp {
        pub general_caps: U64,
        pub rc_odp_caps: U32,
        pub uc_odp_caps: U32,
        pub ud_odp_caps: U32,
        pub xrc_odp_caps: U32,
    }

    /// ABI 11: `ibv_advise_mr(3)`: `advice` is `enum ibv_advise_mr_advice`, `flags`
    /// `IBV_ADVISE_MR_FLAG_FLUSH`; the first `num_sge` entries of `sg_list` are used.
    pub struct AdviseMrReq {
        pub pd: U32,
        pub advice: U32,
        pub flags: U32,
        pub num_sge: U32,
        pub sg_list: [SgeWire; MAX_WIRE_SGE],
    }

    /// ABI 3: `ibv_post_send`.
    pub struct PostSendReq {
        pub qp: U32,
        pub reserved: U32,
        pub wr: SendWrWire,
    }

    /// ABI 3: `ibv_post_recv` / `ibv_post_srq_recv`: `handle` is the QP or SRQ.
    pub struct PostRecvReq {
        pub handle: U32,
        pub num_sge: U32,
        pub wr_id: U64,
        pub sg_list: [SgeWire; MAX_WIRE_SGE],
    }

    /// ABI 3: `ibv_poll_cq`.
    pub struct PollCqReq {
        pub cq: U32,
        pub max: U32,
    }

    /// `struct ibv_wc`.
    pub struct WcWire {
        pub wr_id: U64,
        pub status: U32,
        pub opcode: U32,
        pub vendor_err: U32,
        pub byte_len: U32,
        /// Immediate data, or the invalidated R_Key (with `IBV_WC_WITH_INV`).
        pub imm_data: U32,
        pub qp_num: U32,
        pub src_qp: U32,
        pub wc_flags: U32,
        pub pkey_index: U16,
        pub slid: U16,
        pub sl: u8,
        pub dlid_path_bits: u8,
        pub reserved: [u8; 2],
    }

    /// ABI 3: completions polled.
    pub struct PollCqResp {
        pub count: U32,
        pub reserved: U32,
        pub wc: [WcWire; MAX_WIRE_WC],
    }
}

/// Scatter/gather entries a posted work request may carry on the command path.
pub const MAX_WIRE_SGE: usize = 16;
/// Inline bytes a posted send may carry on the command path.
pub const MAX_WIRE_INLINE: usize = 256;
/// Completions one `PollCq` returns at most.
pub const MAX_WIRE_WC: usize = 32;

/// `enum ibv_wr_opcode` values.
#[allow(missing_docs)]
pub mod wr_opcode {
    pub const RDMA_WRITE: u32 = 0;
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    pub const SEND: u32 = 2;
    pub const SEND_WITH_IMM: u32 = 3;
    pub const RDMA_READ: u32 = 4;
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    pub const LOCAL_INV: u32 = 7;
    pub const BIND_MW: u32 = 8;
    pub const SEND_WITH_INV: u32 = 9;
}

/// `enum ibv_send_flags` values.
#[allow(missing_docs)]
pub mod send_flags {
    pub const FENCE: u32 = 1 << 0;
    pub const SIGNALED: u32 = 1 << 1;
    pub const SOLICITED: u32 = 1 << 2;
    pub const INLINE: u32 = 1 << 3;
}

/// `present` bit: a PD handle was given.
pub const PRESENT_PD: u32 = 1 << 0;
/// `present` bit: a send CQ handle was given.
pub const PRESENT_SEND_CQ: u32 = 1 << 1;
/// `present` bit: a receive CQ handle was given.
pub const PRESENT_RECV_CQ: u32 = 1 << 2;
/// `present` bit: an SRQ handle was given.
pub const PRESENT_SRQ: u32 = 1 << 3;
/// `present` bit: an XRC domain handle was given.
pub const PRESENT_XRCD: u32 = 1 << 4;
/// `present` bit (XRC SRQ): a CQ handle was given.
pub const PRESENT_CQ: u32 = 1 << 5;

/// `comp_mask` bit of [`Cmd::CreateQp`] (ABI 2): `create_flags` is valid.
pub const CREATE_QP_CREATE_FLAGS: u64 = 1 << 0;
/// `comp_mask` bit of [`Cmd::CreateCq`] (ABI 3): `channel` is valid.
pub const CREATE_CQ_CHANNEL: u64 = 1 << 0;
/// `comp_mask` bit of [`Cmd::Hello`] (ABI 5): one descriptor comes with the request, the
/// client's own `/proc/self/mem` opened read-write, through which the daemon reaches the
/// client's memory that is not shared (docs/design/registered-memory.md). A descriptor that is
/// not the sender's `mem` is `EINVAL`, one not open read-write `EBADF`. Without it the
/// context has no process memory: only shared MRs can be accessed.
pub const HELLO_MEM_FD: u64 = 1 << 0;
/// `comp_mask` bit of [`Cmd::Hello`] (ABI 7, only with [`HELLO_MEM_FD`]): a second
/// descriptor follows the `mem` one, the client's own `/proc/self/maps`, through which the
/// daemon refuses `reg_mr`/`rereg_mr` over unmapped pages, and write access over pages that
/// are not writable, with `EFAULT` as `ibv_reg_mr` does (docs/design/registered-memory.md).
pub const HELLO_MAPS_FD: u64 = 1 << 1;

/// [`ReregMrReq::flags`]: new `addr`, `length` and `iova` (`IBV_REREG_MR_CHANGE_TRANSLATION`).
pub const REREG_MR_CHANGE_TRANSLATION: u32 = 1 << 0;
/// [`ReregMrReq::flags`]: new `pd` (`IBV_REREG_MR_CHANGE_PD`).
pub const REREG_MR_CHANGE_PD: u32 = 1 << 1;
/// [`ReregMrReq::flags`]: new `access` (`IBV_REREG_MR_CHANGE_ACCESS`).
pub const REREG_MR_CHANGE_ACCESS: u32 = 1 << 2;

/// What an async event's `element` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ElementKind {
    /// A QP handle.
    Qp = 1,
    /// An XRC receive QP number (legacy/minimal registration).
    XrcRecvQpNum = 2,
    /// A CQ handle.
    Cq = 3,
    /// An SRQ handle.
    Srq = 4,
    /// A port number.
    Port = 5,
    /// The device.
    Device = 6,
}

impl ElementKind {
    /// Decodes the wire value.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => ElementKind::Qp,
            2 => ElementKind::XrcRecvQpNum,
            3 => ElementKind::Cq,
            4 => ElementKind::Srq,
            5 => ElementKind::Port,
            6 => ElementKind::Device,
            _ => return None,
        })
    }
}

/// Size of a request struct and the `comp_mask` bits a daemon speaking `abi` understands for
/// `cmd`. This is the table that makes an older daemon refuse newer features.
pub fn request_layout(cmd: Cmd, abi: u32) -> (usize, u64) {
    use core::mem::size_of;
    match cmd {
        Cmd::CreateQp if abi >= 2 => (size_of::<CreateQpReq>(), CREATE_QP_CREATE_FLAGS),
        // ABI 1 ended before `create_flags`.
        Cmd::CreateQp => (size_of::<CreateQpReq>() - 8, 0),
        Cmd::CreateCq if abi >= 3 => (size_of::<CreateCqReq>(), CREATE_CQ_CHANNEL),
        Cmd::Hello if abi >= 7 => (size_of::<HelloReq>(), HELLO_MEM_FD | HELLO_MAPS_FD),
        Cmd::Hello if abi >= 5 => (size_of::<HelloReq>(), HELLO_MEM_FD),
        // Before ABI 3 a CQ had no completion channel.
        Cmd::CreateCq => (size_of::<CreateCqReq>() - 8, 0),
        Cmd::DirectOpen if abi >= 16 => (size_of::<DirectOpenReq>(), 0),
        // Before ABI 16 the request was empty.
        Cmd::DirectOpen => (0, 0),
        Cmd::CmListen if abi >= 20 => (request_size(cmd), 0),
        // Before ABI 20 the request was the service ID alone.
        Cmd::CmListen => (8, 0),
        _ => (request_size(cmd), 0),
    }
}

/// Size of the request struct of `cmd` in the newest ABI (from the `commands!` table).
pub fn request_size(cmd: Cmd) -> usize {
    cmd.request_size()
}

/// Copies a name into a fixed NUL-padded array (truncating).
pub fn name_bytes<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let n = s.len().min(N - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

/// Reads a NUL-padded name.
pub fn name_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}
