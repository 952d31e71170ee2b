//! Plain verbs enums and bit sets shared by every layer, with rdma-core's numeric values
//! (`libibverbs/verbs.h`), so the ABI and the C drop-in can pass them through unchanged.

use serde::{Deserialize, Serialize};

/// `enum ibv_qp_type` (verbs.h). RD is not offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(u32)]
pub enum QpType {
    /// Reliable connected.
    Rc = 2,
    /// Unreliable connected.
    Uc = 3,
    /// Unreliable datagram.
    Ud = 4,
    /// XRC initiator ("send") QP, `IBV_QPT_XRC_SEND` / `IB_QPT_XRC_INI`.
    XrcSend = 9,
    /// XRC target ("receive") QP, `IBV_QPT_XRC_RECV` / `IB_QPT_XRC_TGT`.
    XrcRecv = 10,
}

impl QpType {
    /// Every QP type the core implements.
    pub const ALL: [QpType; 5] = [
        QpType::Rc,
        QpType::Uc,
        QpType::Ud,
        QpType::XrcSend,
        QpType::XrcRecv,
    ];

    /// Decodes the rdma-core value.
    pub fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            2 => QpType::Rc,
            3 => QpType::Uc,
            4 => QpType::Ud,
            9 => QpType::XrcSend,
            10 => QpType::XrcRecv,
            _ => return None,
        })
    }
}

/// `enum ibv_qp_state` (verbs.h; IBA 10.3.1 "QP and EE states").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(u32)]
pub enum QpState {
    /// Reset.
    Reset = 0,
    /// Initialized.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drain.
    Sqd = 4,
    /// Send queue error.
    Sqe = 5,
    /// Error.
    Err = 6,
}

impl QpState {
    /// Every state, in numeric order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// Decodes the rdma-core value; anything above `IBV_QPS_ERR` is not a state.
    pub fn from_raw(v: u32) -> Option<Self> {
        QpState::ALL.get(v as usize).copied()
    }
}

/// `enum ibv_qp_attr_mask` (verbs.h): which fields of a modify/query request are meaningful.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttrMask(pub u32);

#[allow(missing_docs)]
impl AttrMask {
    pub const STATE: AttrMask = AttrMask(1 << 0);
    pub const CUR_STATE: AttrMask = AttrMask(1 << 1);
    pub const EN_SQD_ASYNC_NOTIFY: AttrMask = AttrMask(1 << 2);
    pub const ACCESS_FLAGS: AttrMask = AttrMask(1 << 3);
    pub const PKEY_INDEX: AttrMask = AttrMask(1 << 4);
    pub const PORT: AttrMask = AttrMask(1 << 5);
    pub const QKEY: AttrMask = AttrMask(1 << 6);
    pub const AV: AttrMask = AttrMask(1 << 7);
    pub const PATH_MTU: AttrMask = AttrMask(1 << 8);
    pub const TIMEOUT: AttrMask = AttrMask(1 << 9);
    pub const RETRY_CNT: AttrMask = AttrMask(1 << 10);
    pub const RNR_RETRY: AttrMask = AttrMask(1 << 11);
    pub const RQ_PSN: AttrMask = AttrMask(1 << 12);
    pub const MAX_QP_RD_ATOMIC: AttrMask = AttrMask(1 << 13);
    pub const ALT_PATH: AttrMask = AttrMask(1 << 14);
    pub const MIN_RNR_TIMER: AttrMask = AttrMask(1 << 15);
    pub const SQ_PSN: AttrMask = AttrMask(1 << 16);
    pub const MAX_DEST_RD_ATOMIC: AttrMask = AttrMask(1 << 17);
    pub const PATH_MIG_STATE: AttrMask = AttrMask(1 << 18);
    pub const CAP: AttrMask = AttrMask(1 << 19);
    pub const DEST_QPN: AttrMask = AttrMask(1 << 20);
    pub const RATE_LIMIT: AttrMask = AttrMask(1 << 25);
    /// The bits uverbs' modify_qp understands; anything else is `EOPNOTSUPP`
    /// (uverbs_cmd.c `modify_qp`: `IB_QP_ATTR_STANDARD_BITS` plus `IB_QP_RATE_LIMIT`).
    pub const KNOWN: AttrMask = AttrMask(0x001f_ffff | (1 << 25));

    pub const EMPTY: AttrMask = AttrMask(0);

    /// True if every bit of `other` is set in `self`.
    pub fn contains(self, other: AttrMask) -> bool {
        self.0 & other.0 == other.0
    }
    /// True if any bit of `other` is set in `self`.
    pub fn intersects(self, other: AttrMask) -> bool {
        self.0 & other.0 != 0
    }
    /// `self` without the bits of `other`.
    pub fn without(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 & !other.0)
    }
    /// True if no bit is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for AttrMask {
    type Output = AttrMask;
    fn bitor(self, rhs: AttrMask) -> AttrMask {
        AttrMask(self.0 | rhs.0)
    }
}

impl std::ops::BitAnd for AttrMask {
    type Output = AttrMask;
    fn bitand(self, rhs: AttrMask) -> AttrMask {
        AttrMask(self.0 & rhs.0)
    }
}

/// `enum ibv_access_flags` (verbs.h), the subset the core enforces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Access(pub u32);

#[allow(missing_docs)]
impl Access {
    pub const LOCAL_WRITE: Access = Access(1 << 0);
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    pub const REMOTE_READ: Access = Access(1 << 2);
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    pub const MW_BIND: Access = Access(1 << 4);
    pub const ZERO_BASED: Access = Access(1 << 5);
    pub const ON_DEMAND: Access = Access(1 << 6);
    pub const HUGETLB: Access = Access(1 << 7);
    pub const RELAXED_ORDERING: Access = Access(1 << 20);
    /// Flags rdma-core callers may pass to reg_mr that the core accepts (others are
    /// `EINVAL`, as for a device that lacks them). `HUGETLB`/`RELAXED_ORDERING` are hints
    /// that do not change semantics here; `ON_DEMAND` makes an on-demand-paging MR
    /// ([`crate::odp`]).
    pub const MR_ALLOWED: Access = Access(0x1f | (1 << 6) | (1 << 7) | (1 << 20));
    /// Flags meaningful on a QP (`qp_access_flags`).
    pub const QP_ALLOWED: Access = Access(0x0f);

    pub const EMPTY: Access = Access(0);

    /// True if every bit of `other` is set in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    /// True if any bit of `other` is set in `self`.
    pub fn intersects(self, other: Access) -> bool {
        self.0 & other.0 != 0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// `enum ibv_mtu` (verbs.h): 1 = 256 bytes … 5 = 4096 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[repr(u32)]
pub enum Mtu {
    /// 256 bytes.
    M256 = 1,
    /// 512 bytes.
    M512 = 2,
    /// 1024 bytes.
    M1024 = 3,
    /// 2048 bytes.
    M2048 = 4,
    /// 4096 bytes.
    M4096 = 5,
}

impl Mtu {
    /// Decodes the rdma-core value.
    pub fn from_raw(v: u32) -> Option<Self> {
        Some(match v {
            1 => Mtu::M256,
            2 => Mtu::M512,
            3 => Mtu::M1024,
            4 => Mtu::M2048,
            5 => Mtu::M4096,
            _ => return None,
        })
    }
    /// Payload bytes per packet.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// `enum ibv_event_type` (verbs.h; IBA 11.6.3 "Asynchronous events").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum EventType {
    CqErr = 0,
    QpFatal = 1,
    QpReqErr = 2,
    QpAccessErr = 3,
    CommEst = 4,
    SqDrained = 5,
    PathMig = 6,
    PathMigErr = 7,
    DeviceFatal = 8,
    PortActive = 9,
    PortErr = 10,
    LidChange = 11,
    PkeyChange = 12,
    SmChange = 13,
    SrqErr = 14,
    SrqLimitReached = 15,
    QpLastWqeReached = 16,
    ClientReregister = 17,
    GidChange = 18,
}

impl EventType {
    /// Decodes the rdma-core value.
    pub fn from_raw(v: u32) -> Option<Self> {
        use EventType::*;
        Some(match v {
            0 => CqErr,
            1 => QpFatal,
            2 => QpReqErr,
            3 => QpAccessErr,
            4 => CommEst,
            5 => SqDrained,
            6 => PathMig,
            7 => PathMigErr,
            8 => DeviceFatal,
            9 => PortActive,
            10 => PortErr,
            11 => LidChange,
            12 => PkeyChange,
            13 => SmChange,
            14 => SrqErr,
            15 => SrqLimitReached,
            16 => QpLastWqeReached,
            17 => ClientReregister,
            18 => GidChange,
            _ => return None,
        })
    }

    /// True for the port events of IBA 11.6.3 (unaffiliated; the element names the port).
    pub fn is_port_affiliated(self) -> bool {
        matches!(
            self,
            EventType::PortActive
                | EventType::PortErr
                | EventType::LidChange
                | EventType::PkeyChange
                | EventType::SmChange
                | EventType::ClientReregister
                | EventType::GidChange
        )
    }

    /// True for the events IBA 11.6.3 affiliates with a QP.
    pub fn is_qp_affiliated(self) -> bool {
        matches!(
            self,
            EventType::QpFatal
                | EventType::QpReqErr
                | EventType::QpAccessErr
                | EventType::CommEst
                | EventType::SqDrained
                | EventType::PathMig
                | EventType::PathMigErr
                | EventType::QpLastWqeReached
        )
    }
}

/// The flag legacy OFED ORs into `event_type` of an event about an XRC receive QP, whose
/// element is then the QP number (`IBV_XRC_QP_EVENT_FLAG`, OFED 1.5 verbs.h).
pub const XRC_QP_EVENT_FLAG: u32 = 0x8000_0000;

/// Largest 24-bit QP or SRQ number (IBA 9.2: DestQP and XRCSRQ are 24-bit fields).
pub const MAX_24BIT: u32 = 0x00ff_ffff;
