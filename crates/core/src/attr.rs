//! Attribute structs of create/modify/query calls, shaped like their rdma-core namesakes
//! (`ibv_qp_attr`, `ibv_ah_attr`, `ibv_qp_cap`, `ibv_qp_init_attr_ex`, `ibv_srq_attr`).

use serde::{Deserialize, Serialize};

use crate::device::Gid;
use crate::ids::Handle;
use crate::types::{Access, Mtu, QpState, QpType};

/// `struct ibv_global_route` + `struct ibv_ah_attr` (verbs.h).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct AhAttr {
    pub dgid: Gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: bool,
    pub port_num: u8,
}

/// `struct ibv_qp_cap` (verbs.h).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_attr` (verbs.h): what modify reads (per mask bit) and query returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    /// `enum ibv_mig_state`: 0 migrated, 1 rearm, 2 armed.
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: Access,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: bool,
    pub sq_draining: bool,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::M1024,
            path_mig_state: 0,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: Access::EMPTY,
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            alt_ah_attr: AhAttr::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        }
    }
}

/// `struct ibv_qp_init_attr_ex` (verbs.h), with object references as handles of the caller's
/// context. Absent objects are `None` (the `comp_mask` bit was not set, or the pointer was
/// NULL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct QpInitAttr {
    pub qp_type: QpType,
    pub pd: Option<Handle>,
    pub send_cq: Option<Handle>,
    pub recv_cq: Option<Handle>,
    pub srq: Option<Handle>,
    pub xrcd: Option<Handle>,
    pub cap: QpCap,
    pub sq_sig_all: bool,
    /// `enum ibv_qp_create_flags`; softverbs implements none, so anything non-zero is
    /// `EOPNOTSUPP`.
    pub create_flags: u32,
}

impl QpInitAttr {
    /// An init attr of `qp_type` with nothing set.
    pub fn new(qp_type: QpType) -> Self {
        QpInitAttr {
            qp_type,
            pd: None,
            send_cq: None,
            recv_cq: None,
            srq: None,
            xrcd: None,
            cap: QpCap::default(),
            sq_sig_all: false,
            create_flags: 0,
        }
    }
}

/// What `query_qp` returns besides [`QpAttr`]: the creation-time attributes
/// (`ibv_qp_init_attr`), with handles as the caller's context sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpInitInfo {
    /// QP type.
    pub qp_type: QpType,
    /// Capabilities granted at creation.
    pub cap: QpCap,
    /// Whether every send WR is signaled.
    pub sq_sig_all: bool,
    /// Always 0: softverbs accepts no create flags, and a receive QP never has any (the
    /// seed's point: uverbs forced `create_flags = 0` for them).
    pub create_flags: u32,
}

/// `struct ibv_srq_attr` (verbs.h).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrqAttr {
    /// Receive WQEs the SRQ holds.
    pub max_wr: u32,
    /// Scatter entries per WQE.
    pub max_sge: u32,
    /// Limit below which `SRQ_LIMIT_REACHED` fires when armed; 0 = disarmed.
    pub srq_limit: u32,
}

/// `enum ibv_srq_attr_mask` bit `IBV_SRQ_MAX_WR` (resize).
pub const SRQ_MAX_WR: u32 = 1 << 0;
/// `enum ibv_srq_attr_mask` bit `IBV_SRQ_LIMIT` (arm).
pub const SRQ_LIMIT: u32 = 1 << 1;
