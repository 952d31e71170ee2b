//! The values that cross the [`crate::Cm`] boundary: identities, parameters, events, errors.

use std::net::IpAddr;
use std::time::Duration;

use softverbs_wire::cm::msg::{Rep, Req, SidrRep, SidrReq};
use softverbs_wire::cm::{CmWireError, RejReason, SidrStatus, MAD_LEN};

/// Who a connection belongs to (the daemon's client connection); events go to it, and
/// [`crate::Cm::destroy_owner`] ends everything it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner(pub u64);

/// A connection, listener or SIDR request of this CM: its Local Communication ID (or SIDR
/// RequestID), never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmId(pub u32);

/// The remote port's address: where its GSI's MADs come from and ours go to.
pub type Peer = IpAddr;

/// A MAD to send as a UD SEND to the peer's QP1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Destination port.
    pub peer: Peer,
    /// The whole MAD.
    pub mad: [u8; MAD_LEN],
}

/// Tunables of one CM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Local CA GUID put in REQ and REP.
    pub local_ca_guid: u64,
    /// Packet lifetime: added twice to every response wait, for the round trip.
    pub packet_lifetime: Duration,
    /// How long an ended connection is remembered to answer late duplicates.
    pub time_wait: Duration,
    /// Service Timeout field of the MRA sent for a duplicate REQ the consumer has not
    /// answered yet (IBA 12.6.6).
    pub mra_service_timeout: u8,
    /// Target ACK Delay of the REP (5 bits, 4.096 µs × 2^value): the device's
    /// `local_ca_ack_delay`, as the kernel's `cm_format_rep` puts its `cm_dev->ack_delay`
    /// there; the active side adds it to its ACK timeout (`cm_rep_handler`,
    /// `cm_ack_timeout`). softverbs' devices report 15, as rxe does.
    pub ack_delay: u8,
    /// Seed of the CSPRNG (ChaCha20) the Local Communication IDs, SIDR RequestIDs and
    /// TransactionIDs come from. A peer that could predict an ID could forge the MADs of a
    /// connection it is not part of (docs/design/security.md, "CM"), so the daemon seeds it from the
    /// operating system's generator; tests pass a fixed seed to be reproducible.
    pub id_seed: [u8; 32],
    /// Most connect requests (REQ Rcvd) and SIDR requests (SIDR_REQ Rcvd) a listener holds
    /// unanswered when its owner gave no backlog (rdma_listen(3) with backlog 0): the
    /// kernel's `ucma` `max_backlog` default, 1024.
    pub default_backlog: u32,
    /// Most unanswered connect and SIDR requests of all listeners together; past it a new
    /// one is refused (REJ No Resources, SIDR_REP Rejected) and leaves no state.
    pub max_pending_requests: u32,
    /// How long a SIDR_REQ waits for its consumer's answer. A SIDR_REQ carries no timeout
    /// of its own (IBA 12.11.1); this is rdma_cm's requester's whole patience, 16 tries of
    /// 4.3 s (CM response timeout 20, 15 retries).
    pub sidr_req_wait: Duration,
    /// How long a REQ or SIDR_REQ for a service nobody listens on is held for a listener
    /// before it is refused (REJ Invalid Service ID, SIDR_REP status 1). Zero refuses at
    /// once. The IBA lets the passive side answer within the REQ's remote CM response
    /// timeout (IBA 12.7.27, seconds); holding the first few hundred milliseconds of it
    /// lets a peer that connects right after an out-of-band "ready" reach a listener that
    /// is still being made (perftest `-R` does exactly that), where a kernel CM's
    /// listen is a system call and seldom loses the race.
    pub listen_grace: Duration,
    /// Unsolicited requests (REQ, SIDR_REQ) a second one source address may send once its
    /// burst is spent; the excess is dropped before parsing, unanswered and counted
    /// ([`Counts::rate_dropped`](crate::Counts)), and its sender retries after its CM
    /// response timeout as after a loss (IBA 12.9). 0: no limit. Default 1024 a second,
    /// after the burst: a source may fill the largest listen backlog once a second, more
    /// than a host's connection setup sends past its burst, and a flood's hundreds of
    /// thousands cost a table lookup each (docs/design/security.md, item 4; docs/design/fuzzing.md).
    pub req_rate: u32,
    /// Requests one source may send at once before [`Self::req_rate`] applies (0: no
    /// limit). Default 1024, the kernel's largest listen backlog: one host's ranks
    /// connecting all at once to a listener get through.
    pub req_burst: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            local_ca_guid: 0,
            packet_lifetime: Duration::from_millis(1),
            time_wait: Duration::from_secs(1),
            // About 4.3 s, rdma_cm's CMA_CM_MRA_SETTING-like margin for a slow consumer.
            mra_service_timeout: 20,
            ack_delay: 15,
            id_seed: [0; 32],
            default_backlog: 1024,
            max_pending_requests: 4096,
            sidr_req_wait: crate::timeout::cm_timeout(20) * 16,
            listen_grace: Duration::ZERO,
            req_rate: 1024,
            req_burst: 1024,
        }
    }
}

/// The QP a connection is for (REQ Transport Service Type / Extended Transport Type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpKind {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// XRC initiator to an XRC target (IBA annex A14).
    Xrc,
}

/// What the active side puts in its REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// Peer port.
    pub peer: Peer,
    /// ServiceID to connect to.
    pub service_id: u64,
    /// Local port GID (primary path).
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// QP type.
    pub qp_kind: QpKind,
    /// Local QPN.
    pub qpn: u32,
    /// Starting PSN: the PSN the local QP's receive queue expects first; the peer sends
    /// from it (IBA 12.6.5/12.6.8; docs/design/cm.md, "Starting PSN").
    pub starting_psn: u32,
    /// Responder resources offered.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// Path MTU (IBA enum, 4 bits).
    pub path_mtu: u8,
    /// Hop limit of the path.
    pub hop_limit: u8,
    /// Local ACK timeout of the path (5 bits).
    pub local_ack_timeout: u8,
    /// CM response timeout (5 bits) for both ends of the handshake.
    pub response_timeout: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// REQ private data (at most 92 bytes; rdma_cm's starts with its address header).
    pub private_data: Vec<u8>,
}

/// What the passive side puts in its REP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams {
    /// Local QPN.
    pub qpn: u32,
    /// Starting PSN: the PSN the local QP's receive queue expects first; the peer sends
    /// from it (IBA 12.6.5/12.6.8; docs/design/cm.md, "Starting PSN").
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// REP private data (at most 196 bytes).
    pub private_data: Vec<u8>,
}

/// A SIDR_REQ to send (IBA 12.11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrParams {
    /// Peer port.
    pub peer: Peer,
    /// ServiceID to resolve.
    pub service_id: u64,
    /// Partition key.
    pub pkey: u16,
    /// Time to wait for each answer (5-bit CM timeout).
    pub response_timeout: u8,
    /// Retransmissions before giving up.
    pub max_retries: u8,
    /// Private data (at most 216 bytes).
    pub private_data: Vec<u8>,
}

/// The answer to a SIDR_REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReplyParams {
    /// Status.
    pub status: SidrStatus,
    /// The UD QP serving the service.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// Private data (at most 136 bytes).
    pub private_data: Vec<u8>,
}

/// Where a connection is (IBA 12.9 state diagrams, folded to what a consumer sees).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Active: REQ sent, waiting for REP (MRA received or not).
    ReqSent,
    /// Active: REP received, waiting for the consumer's [`crate::Cm::establish`].
    RepRcvd,
    /// Passive: REQ received, waiting for the consumer's accept or reject.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// Ended; kept to answer late duplicates.
    TimeWait,
    /// SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR_REQ received, waiting for the consumer's answer.
    SidrReqRcvd,
}

/// What happened to a connection, for its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A REQ for a service the owner listens on; the event's id is the new connection.
    ConnectRequest {
        /// The listener it matched.
        listener: CmId,
        /// Where it came from.
        peer: Peer,
        /// The REQ (private data included).
        req: Box<Req>,
    },
    /// The passive side accepted; call [`crate::Cm::establish`] once the QP is ready.
    ConnectReply {
        /// The REP.
        rep: Box<Rep>,
    },
    /// The connection is established (RTU received, or sent by this side).
    Established,
    /// The peer rejected the connection (or its REP timed out).
    Rejected {
        /// The REJ's reason.
        reason: RejReason,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// No answer within the retries: the connection failed.
    Unreachable,
    /// The connection ended (DREQ received or answered, or the peer gave up on it).
    Disconnected,
    /// A SIDR_REQ for a service the owner listens on.
    SidrRequest {
        /// The listener it matched.
        listener: CmId,
        /// Where it came from.
        peer: Peer,
        /// The request.
        req: Box<SidrReq>,
    },
    /// The answer to this owner's SIDR_REQ.
    SidrReply {
        /// The reply.
        rep: Box<SidrRep>,
    },
}

/// A command the CM refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No such id (or not this owner's).
    #[error("no such CM id")]
    UnknownId,
    /// The id is not in a state the command applies to.
    #[error("CM id is in state {0:?}")]
    State(State),
    /// Another listener has this service ID.
    #[error("service ID {0:#018x} already has a listener")]
    ServiceInUse(u64),
    /// A field does not fit the message (private data too long, QPN too wide, …).
    #[error(transparent)]
    Wire(#[from] CmWireError),
}
