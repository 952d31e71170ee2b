//! The connection manager's commands (ids 100–129, ABI 12; docs/design/cm.md §4): a context's CM
//! ids live in the daemon, whose CM speaks IB CM MADs on the context's device's QP1.
//!
//! Addresses are 16-byte IPv6 or IPv4-mapped (`::ffff:a.b.c.d`) addresses; private data
//! travels with its length and is zero past it.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// [`CmConnectReq::qp_kind`]: reliable connected.
pub const CM_QP_RC: u32 = 0;
/// [`CmConnectReq::qp_kind`]: unreliable connected.
pub const CM_QP_UC: u32 = 1;
/// [`CmConnectReq::qp_kind`]: XRC initiator.
pub const CM_QP_XRC: u32 = 2;

/// [`CmEventResp::event`] values: `enum rdma_cm_event_type` (rdma_cma.h), which the
/// drop-in hands to programs unchanged.
pub mod cm_event {
    /// RDMA_CM_EVENT_CONNECT_REQUEST (a REQ, or a SIDR_REQ when `sidr` is set).
    pub const CONNECT_REQUEST: u32 = 4;
    /// RDMA_CM_EVENT_CONNECT_RESPONSE (a REP: establish once the QP is ready).
    pub const CONNECT_RESPONSE: u32 = 5;
    /// RDMA_CM_EVENT_UNREACHABLE (no answer within the retries; a SIDR without answer).
    pub const UNREACHABLE: u32 = 7;
    /// RDMA_CM_EVENT_REJECTED (`status` is the REJ reason or the SIDR status).
    pub const REJECTED: u32 = 8;
    /// RDMA_CM_EVENT_ESTABLISHED (RTU received or sent; a successful SIDR_REP).
    pub const ESTABLISHED: u32 = 9;
    /// RDMA_CM_EVENT_DISCONNECTED.
    pub const DISCONNECTED: u32 = 10;
}

macro_rules! wire {
    ($( $(#[$m:meta])* pub struct $name:ident { $( $(#[$fm:meta])* pub $f:ident : $t:ty, )* } )*) => {
        $(
            $(#[$m])*
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
    /// `CmListen`: REQs and SIDR_REQs for this service ID become the context's events.
    pub struct CmListenReq {
        /// The IB service ID (rdma_cm: port space << 16 | port).
        pub service_id: U64,
        /// Most connect requests the listener holds unanswered (rdma_listen(3)'s backlog);
        /// 0 (and a client that predates the field, whose shorter request reads as 0) means
        /// the daemon's default, 1024.
        pub backlog: U32,
        /// Zero.
        pub reserved: U32,
    }

    /// A CM id.
    pub struct CmIdResp {
        /// The id (the CM's Local Communication ID or SIDR RequestID).
        pub id: U32,
    }

    /// `CmDestroyId` / `CmEstablish`: one CM id.
    pub struct CmIdReq {
        /// The id.
        pub id: U32,
    }

    /// `CmConnect`: send a REQ.
    pub struct CmConnectReq {
        /// Destination address.
        pub dst: [u8; 16],
        /// Service ID.
        pub service_id: U64,
        /// `CM_QP_*`.
        pub qp_kind: U32,
        /// Local QPN.
        pub qpn: U32,
        /// Starting PSN: the PSN the QP's receive queue expects first (the peer sends from it).
        pub starting_psn: U32,
        /// Responder resources.
        pub responder_resources: u8,
        /// Initiator depth.
        pub initiator_depth: u8,
        /// Retry count (3 bits).
        pub retry_count: u8,
        /// RNR retry count (3 bits).
        pub rnr_retry_count: u8,
        /// 1 if the QP takes receives from an SRQ.
        pub srq: u8,
        /// Path MTU (IBA enum).
        pub path_mtu: u8,
        /// CM response timeout (5 bits).
        pub response_timeout: u8,
        /// Max CM retries (4 bits).
        pub max_cm_retries: u8,
        /// Bytes of `private_data` used.
        pub private_data_len: U16,
        /// Reserved, zero.
        pub reserved: U16,
        /// REQ private data (rdma_cm's begins with its address header).
        pub private_data: [u8; 92],
    }

    /// `CmAccept`: answer a connect request with a REP.
    pub struct CmAcceptReq {
        /// The id of the connect request.
        pub id: U32,
        /// Local QPN.
        pub qpn: U32,
        /// Starting PSN: the PSN the QP's receive queue expects first (the peer sends from it).
        pub starting_psn: U32,
        /// Responder resources.
        pub responder_resources: u8,
        /// Initiator depth.
        pub initiator_depth: u8,
        /// RNR retry count.
        pub rnr_retry_count: u8,
        /// 1 with an SRQ.
        pub srq: u8,
        /// Bytes of `private_data` used.
        pub private_data_len: U16,
        /// Reserved, zero.
        pub reserved: U16,
        /// REP private data.
        pub private_data: [u8; 196],
    }

    /// `CmReject`: reject a connect request (or a REP).
    pub struct CmRejectReq {
        /// The id.
        pub id: U32,
        /// Bytes of `private_data` used.
        pub private_data_len: U16,
        /// Reserved, zero.
        pub reserved: U16,
        /// REJ private data.
        pub private_data: [u8; 148],
    }

    /// `CmDisconnect`: send a DREQ.
    pub struct CmDisconnectReq {
        /// The id.
        pub id: U32,
        /// Bytes of `private_data` used.
        pub private_data_len: U16,
        /// Reserved, zero.
        pub reserved: U16,
        /// DREQ private data.
        pub private_data: [u8; 220],
    }

    /// `CmSidrRequest`: resolve a UD service.
    pub struct CmSidrReq {
        /// Destination address.
        pub dst: [u8; 16],
        /// Service ID.
        pub service_id: U64,
        /// Response timeout (5 bits).
        pub response_timeout: u8,
        /// Retries.
        pub max_retries: u8,
        /// Bytes of `private_data` used.
        pub private_data_len: U16,
        /// Reserved, zero.
        pub reserved: U32,
        /// SIDR_REQ private data.
        pub private_data: [u8; 216],
    }

    /// `CmSidrReply`: answer a SIDR request.
    pub struct CmSidrReplyReq {
        /// The id of the request.
        pub id: U32,
        /// SIDR status (0 success).
        pub status: U32,
        /// The UD QP.
        pub qpn: U32,
        /// Its Q_Key.
        pub qkey: U32,
        /// Bytes of `private_data` used.
        pub private_data_len: U16,
        /// Reserved, zero.
        pub reserved: U16,
        /// SIDR_REP private data.
        pub private_data: [u8; 136],
    }

    /// `CmGetEvent`: the context's next CM event (`EAGAIN` when none).
    pub struct CmEventResp {
        /// A [`cm_event`] value.
        pub event: U32,
        /// The CM id it concerns (for a connect request: the new id).
        pub id: U32,
        /// The listener a connect request matched.
        pub listener: U32,
        /// REJ reason or SIDR status.
        pub status: U32,
        /// 1 for SIDR requests and replies.
        pub sidr: U32,
        /// The peer's address.
        pub peer: [u8; 16],
        /// Service ID.
        pub service_id: U64,
        /// The peer's QPN (REQ, REP, SIDR_REP).
        pub remote_qpn: U32,
        /// The peer's Starting PSN (REQ, REP): the PSN its receive queue expects first.
        pub starting_psn: U32,
        /// The SIDR_REP's Q_Key.
        pub qkey: U32,
        /// Responder resources the peer offered.
        pub responder_resources: u8,
        /// Initiator depth of the peer.
        pub initiator_depth: u8,
        /// The peer's RNR retry count.
        pub rnr_retry_count: u8,
        /// 1 if the peer uses an SRQ.
        pub srq: u8,
        /// The REQ's transport retry count.
        pub retry_count: u8,
        /// The REQ's path MTU.
        pub path_mtu: u8,
        /// Bytes of `private_data` used (the message's whole private-data field).
        pub private_data_len: U16,
        /// The message's private data.
        pub private_data: [u8; 224],
    }

    /// `CmStatus`: what this context holds in the CM.
    pub struct CmCountsResp {
        /// Listeners.
        pub listeners: U32,
        /// Connections and SIDR requests (time-wait included).
        pub ids: U32,
        /// Events not yet fetched.
        pub events: U32,
    }
}

/// Copies `data` into a private-data field, or `None` if it does not fit.
pub fn pack_private<const N: usize>(data: &[u8]) -> Option<([u8; N], U16)> {
    if data.len() > N {
        return None;
    }
    let mut out = [0u8; N];
    out[..data.len()].copy_from_slice(data);
    Some((out, U16::new(data.len() as u16)))
}

/// The used part of a private-data field (never past its end).
pub fn private<const N: usize>(data: &[u8; N], len: U16) -> &[u8] {
    &data[..usize::from(len.get()).min(N)]
}
