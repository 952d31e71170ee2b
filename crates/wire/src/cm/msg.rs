//! The nine CM messages this CM speaks (IBA 12.6.5–12.6.11, 12.11.1–12.11.2; byte and bit
//! positions as in tables 106–120, docs/design/cm.md §2.1).
//!
//! Each message has a `#[repr(C)]` zerocopy layout of exactly [`CM_DATA_LEN`] bytes (the
//! `*Wire` structs: whole bytes as big-endian integers, sub-byte fields in the byte that
//! holds them) and an owned value with one field per IBA field. Sub-byte and 24-bit fields
//! are `u8`/`u32` whose width is checked on emit; reserved bits are ignored on parse and
//! zero on emit. Private data always has its full IBA size: the wire carries no length.

use zerocopy::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::mad::AttrId;
use super::{CmWireError, CM_DATA_LEN};

/// Private data of a REQ (IBA 12.6.5).
pub const REQ_PRIVATE_DATA: usize = 92;
/// Private data of an MRA.
pub const MRA_PRIVATE_DATA: usize = 222;
/// Private data of a REJ.
pub const REJ_PRIVATE_DATA: usize = 148;
/// Additional rejection information of a REJ.
pub const REJ_ARI: usize = 72;
/// Private data of a REP.
pub const REP_PRIVATE_DATA: usize = 196;
/// Private data of an RTU.
pub const RTU_PRIVATE_DATA: usize = 224;
/// Private data of a DREQ.
pub const DREQ_PRIVATE_DATA: usize = 220;
/// Private data of a DREP.
pub const DREP_PRIVATE_DATA: usize = 224;
/// Private data of a SIDR_REQ (IBA 12.11.1).
pub const SIDR_REQ_PRIVATE_DATA: usize = 216;
/// Private data of a SIDR_REP (IBA 12.11.2).
pub const SIDR_REP_PRIVATE_DATA: usize = 136;
/// Additional information of a SIDR_REP.
pub const SIDR_REP_INFO: usize = 72;

/// Emit-side width check.
fn fits(field: &'static str, value: u64, bits: u32) -> Result<(), CmWireError> {
    if value >> bits == 0 {
        Ok(())
    } else {
        Err(CmWireError::Field { field, value })
    }
}

/// The upper 24 bits of a big-endian word (QPNs, EECNs, PSNs) and the byte after them.
fn u24_hi(w: [u8; 4]) -> (u32, u8) {
    (u32::from_be_bytes([0, w[0], w[1], w[2]]), w[3])
}

fn pack_u24(field: &'static str, v: u32, low: u8) -> Result<[u8; 4], CmWireError> {
    fits(field, v.into(), 24)?;
    let b = v.to_be_bytes();
    Ok([b[1], b[2], b[3], low])
}

fn bit(b: u8, shift: u32) -> bool {
    (b >> shift) & 1 == 1
}

/// Copies `bytes` into a zero-padded private-data array, failing if it does not fit.
pub fn private_data<const N: usize>(bytes: &[u8]) -> Result<[u8; N], CmWireError> {
    if bytes.len() > N {
        return Err(CmWireError::Field {
            field: "PrivateData length",
            value: bytes.len() as u64,
        });
    }
    let mut out = [0u8; N];
    out[..bytes.len()].copy_from_slice(bytes);
    Ok(out)
}

/// Path fields of a REQ (primary and alternate: 44 bytes each, IBA 12.6.5 table 106).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct PathWire {
    local_lid: U16,
    remote_lid: U16,
    local_gid: [u8; 16],
    remote_gid: [u8; 16],
    /// Flow Label (20 bits), reserved (6), Packet Rate (6).
    flow_rate: U32,
    traffic_class: u8,
    hop_limit: u8,
    /// SL (4), Subnet Local (1), reserved (3).
    sl_local: u8,
    /// Local ACK Timeout (5), then (alternate path only) SAP Supported (1), reserved.
    ack_timeout: u8,
}

/// One path of a REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathInfo {
    /// Local Port LID (0xFFFF, permissive, on RoCE).
    pub local_lid: u16,
    /// Remote Port LID.
    pub remote_lid: u16,
    /// Local Port GID (on RoCE v2 the sender's IP address as a GID).
    pub local_gid: [u8; 16],
    /// Remote Port GID.
    pub remote_gid: [u8; 16],
    /// Flow Label (20 bits).
    pub flow_label: u32,
    /// Packet Rate (6 bits).
    pub packet_rate: u8,
    /// Traffic Class.
    pub traffic_class: u8,
    /// Hop Limit.
    pub hop_limit: u8,
    /// SL (4 bits).
    pub sl: u8,
    /// Subnet Local.
    pub subnet_local: bool,
    /// Local ACK Timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl PathInfo {
    fn parse(w: &PathWire) -> (Self, bool) {
        let fr = w.flow_rate.get();
        (
            Self {
                local_lid: w.local_lid.get(),
                remote_lid: w.remote_lid.get(),
                local_gid: w.local_gid,
                remote_gid: w.remote_gid,
                flow_label: fr >> 12,
                packet_rate: (fr & 0x3F) as u8,
                traffic_class: w.traffic_class,
                hop_limit: w.hop_limit,
                sl: w.sl_local >> 4,
                subnet_local: bit(w.sl_local, 3),
                local_ack_timeout: w.ack_timeout >> 3,
            },
            bit(w.ack_timeout, 2),
        )
    }

    fn emit(&self, sap: bool) -> Result<PathWire, CmWireError> {
        fits("FlowLabel", self.flow_label.into(), 20)?;
        fits("PacketRate", self.packet_rate.into(), 6)?;
        fits("SL", self.sl.into(), 4)?;
        fits("LocalACKTimeout", self.local_ack_timeout.into(), 5)?;
        Ok(PathWire {
            local_lid: U16::new(self.local_lid),
            remote_lid: U16::new(self.remote_lid),
            local_gid: self.local_gid,
            remote_gid: self.remote_gid,
            flow_rate: U32::new(self.flow_label << 12 | u32::from(self.packet_rate)),
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            sl_local: self.sl << 4 | u8::from(self.subnet_local) << 3,
            ack_timeout: self.local_ack_timeout << 3 | u8::from(sap) << 2,
        })
    }
}

/// REQ layout (IBA 12.6.5, table 106).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ReqWire {
    local_comm_id: U32,
    reserved4: [u8; 4],
    service_id: U64,
    local_ca_guid: U64,
    reserved24: [u8; 4],
    local_qkey: U32,
    qpn_rr: [u8; 4],
    eecn_id: [u8; 4],
    reecn_misc: [u8; 4],
    psn_misc: [u8; 4],
    pkey: U16,
    mtu_rdc_rnr: u8,
    retries_srq_ext: u8,
    primary: PathWire,
    alternate: PathWire,
    private_data: [u8; REQ_PRIVATE_DATA],
}

/// ConnectRequest (IBA 12.6.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    /// Local Communication ID: the sender's handle for this connection.
    pub local_comm_id: u32,
    /// ServiceID the passive side listens on.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder Resources: RDMA READs/atomics the sender accepts at once.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator Depth: RDMA READs/atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM Response Timeout (5 bits): how long the passive side may take to answer,
    /// 4.096 µs × 2^value (IBA 12.7.27).
    pub remote_cm_response_timeout: u8,
    /// Transport Service Type (2 bits: 0 RC, 1 UC, 3 extended).
    pub transport_service_type: u8,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits): the PSN the sender's receive queue expects first, so the one
    /// the receiver of the REQ sends from (the kernel's ib_cm: `rq_psn` of the sender,
    /// `sq_psn` of the receiver; docs/design/cm.md, "Starting PSN").
    pub starting_psn: u32,
    /// Local CM Response Timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry Count (3 bits).
    pub retry_count: u8,
    /// Partition Key.
    pub pkey: u16,
    /// Path Packet Payload MTU (4 bits, IBA enum: 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// RDC Exists.
    pub rdc_exists: bool,
    /// RNR Retry Count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM Retries (4 bits) of this REQ.
    pub max_cm_retries: u8,
    /// SRQ: the sender's QP takes receives from an SRQ.
    pub srq: bool,
    /// Extended Transport Type (3 bits: 1 XRC when the service type is 3).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary: PathInfo,
    /// Alternate path (all zero when there is none).
    pub alternate: PathInfo,
    /// SAP Supported.
    pub sap_supported: bool,
    /// Private data; rdma_cm's begins with a [`super::CmaHdr`].
    pub private_data: [u8; REQ_PRIVATE_DATA],
}

impl Req {
    fn parse(w: &ReqWire) -> Self {
        let (local_qpn, responder_resources) = u24_hi(w.qpn_rr);
        let (local_eecn, initiator_depth) = u24_hi(w.eecn_id);
        let (remote_eecn, b43) = u24_hi(w.reecn_misc);
        let (starting_psn, b47) = u24_hi(w.psn_misc);
        let (primary, _) = PathInfo::parse(&w.primary);
        let (alternate, sap_supported) = PathInfo::parse(&w.alternate);
        Self {
            local_comm_id: w.local_comm_id.get(),
            service_id: w.service_id.get(),
            local_ca_guid: w.local_ca_guid.get(),
            local_qkey: w.local_qkey.get(),
            local_qpn,
            responder_resources,
            local_eecn,
            initiator_depth,
            remote_eecn,
            remote_cm_response_timeout: b43 >> 3,
            transport_service_type: (b43 >> 1) & 3,
            end_to_end_flow_control: bit(b43, 0),
            starting_psn,
            local_cm_response_timeout: b47 >> 3,
            retry_count: b47 & 7,
            pkey: w.pkey.get(),
            path_mtu: w.mtu_rdc_rnr >> 4,
            rdc_exists: bit(w.mtu_rdc_rnr, 3),
            rnr_retry_count: w.mtu_rdc_rnr & 7,
            max_cm_retries: w.retries_srq_ext >> 4,
            srq: bit(w.retries_srq_ext, 3),
            extended_transport_type: w.retries_srq_ext & 7,
            primary,
            alternate,
            sap_supported,
            private_data: w.private_data,
        }
    }

    fn emit(&self) -> Result<ReqWire, CmWireError> {
        fits(
            "RemoteCMResponseTimeout",
            self.remote_cm_response_timeout.into(),
            5,
        )?;
        fits(
            "TransportServiceType",
            self.transport_service_type.into(),
            2,
        )?;
        fits(
            "LocalCMResponseTimeout",
            self.local_cm_response_timeout.into(),
            5,
        )?;
        fits("RetryCount", self.retry_count.into(), 3)?;
        fits("PathPacketPayloadMTU", self.path_mtu.into(), 4)?;
        fits("RNRRetryCount", self.rnr_retry_count.into(), 3)?;
        fits("MaxCMRetries", self.max_cm_retries.into(), 4)?;
        fits(
            "ExtendedTransportType",
            self.extended_transport_type.into(),
            3,
        )?;
        let b43 = self.remote_cm_response_timeout << 3
            | self.transport_service_type << 1
            | u8::from(self.end_to_end_flow_control);
        Ok(ReqWire {
            local_comm_id: U32::new(self.local_comm_id),
            reserved4: [0; 4],
            service_id: U64::new(self.service_id),
            local_ca_guid: U64::new(self.local_ca_guid),
            reserved24: [0; 4],
            local_qkey: U32::new(self.local_qkey),
            qpn_rr: pack_u24("LocalQPN", self.local_qpn, self.responder_resources)?,
            eecn_id: pack_u24("LocalEECN", self.local_eecn, self.initiator_depth)?,
            reecn_misc: pack_u24("RemoteEECN", self.remote_eecn, b43)?,
            psn_misc: pack_u24(
                "StartingPSN",
                self.starting_psn,
                self.local_cm_response_timeout << 3 | self.retry_count,
            )?,
            pkey: U16::new(self.pkey),
            mtu_rdc_rnr: self.path_mtu << 4 | u8::from(self.rdc_exists) << 3 | self.rnr_retry_count,
            retries_srq_ext: self.max_cm_retries << 4
                | u8::from(self.srq) << 3
                | self.extended_transport_type,
            primary: self.primary.emit(false)?,
            alternate: self.alternate.emit(self.sap_supported)?,
            private_data: self.private_data,
        })
    }
}

/// MRA layout (IBA 12.6.6, table 107).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct MraWire {
    local_comm_id: U32,
    remote_comm_id: U32,
    message_mraed: u8,
    service_timeout: u8,
    private_data: [u8; MRA_PRIVATE_DATA],
}

/// Which message an MRA or REJ refers to (IBA 12.6.6 / 12.6.7: 0 REQ, 1 REP, 2 LAP/other).
pub mod target {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// LAP (MRA) or "no message" (REJ).
    pub const OTHER: u8 = 2;
}

/// MsgRcptAck (IBA 12.6.6): "I got your message, give me longer to answer".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    /// Local Communication ID of the sender.
    pub local_comm_id: u32,
    /// Remote Communication ID (the receiver's), 0 when MRAing a REQ without one yet.
    pub remote_comm_id: u32,
    /// Message MRAed (2 bits, [`target`]).
    pub message_mraed: u8,
    /// Service Timeout (5 bits): extra time asked for, 4.096 µs × 2^value.
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; MRA_PRIVATE_DATA],
}

impl Mra {
    fn parse(w: &MraWire) -> Self {
        Self {
            local_comm_id: w.local_comm_id.get(),
            remote_comm_id: w.remote_comm_id.get(),
            message_mraed: w.message_mraed >> 6,
            service_timeout: w.service_timeout >> 3,
            private_data: w.private_data,
        }
    }

    fn emit(&self) -> Result<MraWire, CmWireError> {
        fits("MessageMRAed", self.message_mraed.into(), 2)?;
        fits("ServiceTimeout", self.service_timeout.into(), 5)?;
        Ok(MraWire {
            local_comm_id: U32::new(self.local_comm_id),
            remote_comm_id: U32::new(self.remote_comm_id),
            message_mraed: self.message_mraed << 6,
            service_timeout: self.service_timeout << 3,
            private_data: self.private_data,
        })
    }
}

/// REJ layout (IBA 12.6.7, table 108).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RejWire {
    local_comm_id: U32,
    remote_comm_id: U32,
    message_rejected: u8,
    info_length: u8,
    reason: U16,
    ari: [u8; REJ_ARI],
    private_data: [u8; REJ_PRIVATE_DATA],
}

/// A REJ's reason (IBA 12.6.7.2, table 109); the consts are the ones this CM sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejReason(pub u16);

impl RejReason {
    /// No QP available.
    pub const NO_QP: Self = Self(1);
    /// No resources.
    pub const NO_RESOURCES: Self = Self(3);
    /// The sender timed out waiting for the receiver's answer.
    pub const TIMEOUT: Self = Self(4);
    /// Invalid Communication ID: the message names a connection the sender does not know.
    pub const INVALID_COMM_ID: Self = Self(6);
    /// Invalid Service ID: nobody listens on it.
    pub const INVALID_SERVICE_ID: Self = Self(8);
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: Self = Self(9);
    /// Stale connection: the QP is still in use by an earlier connection.
    pub const STALE_CONN: Self = Self(10);
    /// Consumer-defined: the application rejected (rdma_reject).
    pub const CONSUMER: Self = Self(28);
    /// Duplicate Local Communication ID.
    pub const DUPLICATE_LOCAL_COMM_ID: Self = Self(30);
}

/// ConnectReject (IBA 12.6.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// Local Communication ID of the sender (0 if it never assigned one).
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's, from the rejected message.
    pub remote_comm_id: u32,
    /// Message Rejected (2 bits, [`target`]).
    pub message_rejected: u8,
    /// Rejection Information Length (7 bits): bytes of `ari` that mean something.
    pub info_length: u8,
    /// Reason.
    pub reason: RejReason,
    /// Additional Rejection Information.
    pub ari: [u8; REJ_ARI],
    /// Private data.
    pub private_data: [u8; REJ_PRIVATE_DATA],
}

impl Rej {
    fn parse(w: &RejWire) -> Self {
        Self {
            local_comm_id: w.local_comm_id.get(),
            remote_comm_id: w.remote_comm_id.get(),
            message_rejected: w.message_rejected >> 6,
            info_length: w.info_length >> 1,
            reason: RejReason(w.reason.get()),
            ari: w.ari,
            private_data: w.private_data,
        }
    }

    fn emit(&self) -> Result<RejWire, CmWireError> {
        fits("MessageRejected", self.message_rejected.into(), 2)?;
        fits("RejectedInfoLength", self.info_length.into(), 7)?;
        Ok(RejWire {
            local_comm_id: U32::new(self.local_comm_id),
            remote_comm_id: U32::new(self.remote_comm_id),
            message_rejected: self.message_rejected << 6,
            info_length: self.info_length << 1,
            reason: U16::new(self.reason.0),
            ari: self.ari,
            private_data: self.private_data,
        })
    }
}

/// REP layout (IBA 12.6.8, table 110).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RepWire {
    local_comm_id: U32,
    remote_comm_id: U32,
    local_qkey: U32,
    local_qpn: [u8; 4],
    local_eecn: [u8; 4],
    starting_psn: [u8; 4],
    responder_resources: u8,
    initiator_depth: u8,
    ack_failover_eefc: u8,
    rnr_srq: u8,
    local_ca_guid: U64,
    private_data: [u8; REP_PRIVATE_DATA],
}

/// ConnectReply (IBA 12.6.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    /// Local Communication ID of the passive side.
    pub local_comm_id: u32,
    /// Remote Communication ID: the REQ's Local Communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EE Context Number (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits): the PSN the sender's receive queue expects first, so the one
    /// the active side sends from (docs/design/cm.md, "Starting PSN").
    pub starting_psn: u32,
    /// Responder Resources.
    pub responder_resources: u8,
    /// Initiator Depth.
    pub initiator_depth: u8,
    /// Target ACK Delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover Accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// RNR Retry Count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PRIVATE_DATA],
}

impl Rep {
    fn parse(w: &RepWire) -> Self {
        Self {
            local_comm_id: w.local_comm_id.get(),
            remote_comm_id: w.remote_comm_id.get(),
            local_qkey: w.local_qkey.get(),
            local_qpn: u24_hi(w.local_qpn).0,
            local_eecn: u24_hi(w.local_eecn).0,
            starting_psn: u24_hi(w.starting_psn).0,
            responder_resources: w.responder_resources,
            initiator_depth: w.initiator_depth,
            target_ack_delay: w.ack_failover_eefc >> 3,
            failover_accepted: (w.ack_failover_eefc >> 1) & 3,
            end_to_end_flow_control: bit(w.ack_failover_eefc, 0),
            rnr_retry_count: w.rnr_srq >> 5,
            srq: bit(w.rnr_srq, 4),
            local_ca_guid: w.local_ca_guid.get(),
            private_data: w.private_data,
        }
    }

    fn emit(&self) -> Result<RepWire, CmWireError> {
        fits("TargetACKDelay", self.target_ack_delay.into(), 5)?;
        fits("FailoverAccepted", self.failover_accepted.into(), 2)?;
        fits("RNRRetryCount", self.rnr_retry_count.into(), 3)?;
        Ok(RepWire {
            local_comm_id: U32::new(self.local_comm_id),
            remote_comm_id: U32::new(self.remote_comm_id),
            local_qkey: U32::new(self.local_qkey),
            local_qpn: pack_u24("LocalQPN", self.local_qpn, 0)?,
            local_eecn: pack_u24("LocalEECN", self.local_eecn, 0)?,
            starting_psn: pack_u24("StartingPSN", self.starting_psn, 0)?,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            ack_failover_eefc: self.target_ack_delay << 3
                | self.failover_accepted << 1
                | u8::from(self.end_to_end_flow_control),
            rnr_srq: self.rnr_retry_count << 5 | u8::from(self.srq) << 4,
            local_ca_guid: U64::new(self.local_ca_guid),
            private_data: self.private_data,
        })
    }
}

/// Layout of RTU and DREP (IBA 12.6.9 table 111, 12.6.11 table 113): two IDs and private data.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IdsWire {
    local_comm_id: U32,
    remote_comm_id: U32,
    private_data: [u8; RTU_PRIVATE_DATA],
}

/// ReadyToUse (IBA 12.6.9): the active side's last handshake message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rtu {
    /// Local Communication ID (the active side's).
    pub local_comm_id: u32,
    /// Remote Communication ID (the passive side's).
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; RTU_PRIVATE_DATA],
}

/// DisconnectReply (IBA 12.6.11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drep {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; DREP_PRIVATE_DATA],
}

/// DREQ layout (IBA 12.6.10, table 112).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DreqWire {
    local_comm_id: U32,
    remote_comm_id: U32,
    remote_qpn: [u8; 4],
    private_data: [u8; DREQ_PRIVATE_DATA],
}

/// DisconnectRequest (IBA 12.6.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dreq {
    /// Local Communication ID.
    pub local_comm_id: u32,
    /// Remote Communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits): the receiver's QP, which it checks.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; DREQ_PRIVATE_DATA],
}

/// SIDR_REQ layout (IBA 12.11.1, table 119).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SidrReqWire {
    request_id: U32,
    pkey: U16,
    reserved: [u8; 2],
    service_id: U64,
    private_data: [u8; SIDR_REQ_PRIVATE_DATA],
}

/// ServiceIDResReq (IBA 12.11.1): which UD QP serves this service ID?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReq {
    /// RequestID, echoed by the SIDR_REP.
    pub request_id: u32,
    /// Partition Key.
    pub pkey: u16,
    /// ServiceID asked about.
    pub service_id: u64,
    /// Private data; rdma_cm's begins with a [`super::CmaHdr`].
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA],
}

/// SIDR_REP layout (IBA 12.11.2, table 120).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SidrRepWire {
    request_id: U32,
    status: u8,
    info_length: u8,
    reserved: [u8; 2],
    qpn: [u8; 4],
    service_id: U64,
    qkey: U32,
    info: [u8; SIDR_REP_INFO],
    private_data: [u8; SIDR_REP_PRIVATE_DATA],
}

/// A SIDR_REP's status (IBA 12.11.2, table 121).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// The QPN and Q_Key are valid.
    pub const SUCCESS: Self = Self(0);
    /// Nobody serves this service ID.
    pub const UNSUPPORTED: Self = Self(1);
    /// The service rejected the request.
    pub const REJECT: Self = Self(2);
    /// No QP available.
    pub const NO_QP: Self = Self(3);
}

/// ServiceIDResReqResp (IBA 12.11.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRep {
    /// The SIDR_REQ's RequestID.
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// Additional Information Length.
    pub info_length: u8,
    /// QPN (24 bits) serving the service.
    pub qpn: u32,
    /// ServiceID.
    pub service_id: u64,
    /// Q_Key of that QP.
    pub qkey: u32,
    /// Additional information.
    pub info: [u8; SIDR_REP_INFO],
    /// Private data.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA],
}

/// Any CM message this CM speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(Box<Req>),
    /// MsgRcptAck.
    Mra(Box<Mra>),
    /// ConnectReject.
    Rej(Box<Rej>),
    /// ConnectReply.
    Rep(Box<Rep>),
    /// ReadyToUse.
    Rtu(Box<Rtu>),
    /// DisconnectRequest.
    Dreq(Box<Dreq>),
    /// DisconnectReply.
    Drep(Box<Drep>),
    /// ServiceIDResReq.
    SidrReq(Box<SidrReq>),
    /// ServiceIDResReqResp.
    SidrRep(Box<SidrRep>),
}

const _: () = {
    assert!(core::mem::size_of::<ReqWire>() == CM_DATA_LEN);
    assert!(core::mem::size_of::<MraWire>() == CM_DATA_LEN);
    assert!(core::mem::size_of::<RejWire>() == CM_DATA_LEN);
    assert!(core::mem::size_of::<RepWire>() == CM_DATA_LEN);
    assert!(core::mem::size_of::<IdsWire>() == CM_DATA_LEN);
    assert!(core::mem::size_of::<DreqWire>() == CM_DATA_LEN);
    assert!(core::mem::size_of::<SidrReqWire>() == CM_DATA_LEN);
    assert!(core::mem::size_of::<SidrRepWire>() == CM_DATA_LEN);
};

fn read<W: FromBytes + KnownLayout + Immutable>(data: &[u8]) -> Result<W, CmWireError> {
    W::read_from_prefix(data)
        .map(|(w, _)| w)
        .map_err(|_| CmWireError::Truncated {
            available: data.len() + super::mad::MAD_HDR_LEN,
        })
}

impl CmMessage {
    /// The AttributeID that carries this message.
    pub fn attr_id(&self) -> AttrId {
        match self {
            Self::Req(_) => AttrId::Req,
            Self::Mra(_) => AttrId::Mra,
            Self::Rej(_) => AttrId::Rej,
            Self::Rep(_) => AttrId::Rep,
            Self::Rtu(_) => AttrId::Rtu,
            Self::Dreq(_) => AttrId::Dreq,
            Self::Drep(_) => AttrId::Drep,
            Self::SidrReq(_) => AttrId::SidrReq,
            Self::SidrRep(_) => AttrId::SidrRep,
        }
    }

    /// Parses the data area of a CM MAD whose AttributeID is `attr`.
    pub fn parse(attr: u16, data: &[u8]) -> Result<Self, CmWireError> {
        let attr = AttrId::from_u16(attr).ok_or(CmWireError::Attribute(attr))?;
        Ok(match attr {
            AttrId::Req => Self::Req(Box::new(Req::parse(&read(data)?))),
            AttrId::Mra => Self::Mra(Box::new(Mra::parse(&read(data)?))),
            AttrId::Rej => Self::Rej(Box::new(Rej::parse(&read(data)?))),
            AttrId::Rep => Self::Rep(Box::new(Rep::parse(&read(data)?))),
            AttrId::Rtu => {
                let w: IdsWire = read(data)?;
                Self::Rtu(Box::new(Rtu {
                    local_comm_id: w.local_comm_id.get(),
                    remote_comm_id: w.remote_comm_id.get(),
                    private_data: w.private_data,
                }))
            }
            AttrId::Drep => {
                let w: IdsWire = read(data)?;
                Self::Drep(Box::new(Drep {
                    local_comm_id: w.local_comm_id.get(),
                    remote_comm_id: w.remote_comm_id.get(),
                    private_data: w.private_data,
                }))
            }
            AttrId::Dreq => {
                let w: DreqWire = read(data)?;
                Self::Dreq(Box::new(Dreq {
                    local_comm_id: w.local_comm_id.get(),
                    remote_comm_id: w.remote_comm_id.get(),
                    remote_qpn: u24_hi(w.remote_qpn).0,
                    private_data: w.private_data,
                }))
            }
            AttrId::SidrReq => {
                let w: SidrReqWire = read(data)?;
                Self::SidrReq(Box::new(SidrReq {
                    request_id: w.request_id.get(),
                    pkey: w.pkey.get(),
                    service_id: w.service_id.get(),
                    private_data: w.private_data,
                }))
            }
            AttrId::SidrRep => {
                let w: SidrRepWire = read(data)?;
                Self::SidrRep(Box::new(SidrRep {
                    request_id: w.request_id.get(),
                    status: SidrStatus(w.status),
                    info_length: w.info_length,
                    qpn: u24_hi(w.qpn).0,
                    service_id: w.service_id.get(),
                    qkey: w.qkey.get(),
                    info: w.info,
                    private_data: w.private_data,
                }))
            }
        })
    }

    /// Writes the message into a CM MAD's data area (at least [`CM_DATA_LEN`] bytes).
    pub fn emit(&self, out: &mut [u8]) -> Result<(), CmWireError> {
        let available = out.len();
        let out = out
            .get_mut(..CM_DATA_LEN)
            .ok_or(CmWireError::Truncated { available })?;
        let res = match self {
            Self::Req(m) => m.emit()?.write_to(out).is_ok(),
            Self::Mra(m) => m.emit()?.write_to(out).is_ok(),
            Self::Rej(m) => m.emit()?.write_to(out).is_ok(),
            Self::Rep(m) => m.emit()?.write_to(out).is_ok(),
            Self::Rtu(m) => IdsWire {
                local_comm_id: U32::new(m.local_comm_id),
                remote_comm_id: U32::new(m.remote_comm_id),
                private_data: m.private_data,
            }
            .write_to(out)
            .is_ok(),
            Self::Drep(m) => IdsWire {
                local_comm_id: U32::new(m.local_comm_id),
                remote_comm_id: U32::new(m.remote_comm_id),
                private_data: m.private_data,
            }
            .write_to(out)
            .is_ok(),
            Self::Dreq(m) => DreqWire {
                local_comm_id: U32::new(m.local_comm_id),
                remote_comm_id: U32::new(m.remote_comm_id),
                remote_qpn: pack_u24("RemoteQPN", m.remote_qpn, 0)?,
                private_data: m.private_data,
            }
            .write_to(out)
            .is_ok(),
            Self::SidrReq(m) => SidrReqWire {
                request_id: U32::new(m.request_id),
                pkey: U16::new(m.pkey),
                reserved: [0; 2],
                service_id: U64::new(m.service_id),
                private_data: m.private_data,
            }
            .write_to(out)
            .is_ok(),
            Self::SidrRep(m) => SidrRepWire {
                request_id: U32::new(m.request_id),
                status: m.status.0,
                info_length: m.info_length,
                reserved: [0; 2],
                qpn: pack_u24("QPN", m.qpn, 0)?,
                service_id: U64::new(m.service_id),
                qkey: U32::new(m.qkey),
                info: m.info,
                private_data: m.private_data,
            }
            .write_to(out)
            .is_ok(),
        };
        if res {
            Ok(())
        } else {
            Err(CmWireError::Truncated { available })
        }
    }
}
