//! Work requests in and work completions out, shaped like `ibv_send_wr`, `ibv_recv_wr` and
//! `ibv_wc` (verbs.h), with the completion status and opcode values of rdma-core.

use crate::device::Gid;

/// One scatter/gather entry (`struct ibv_sge`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Address in the owner's address space.
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// Local key of the MR that covers it.
    pub lkey: u32,
}

/// The operation of a send work request (`enum ibv_wr_opcode`) with its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`: the number whose big-endian bytes are the ImmDt.
    SendWithImm(u32),
    /// `IBV_WR_SEND_WITH_INV`: the responder invalidates this R_Key.
    SendWithInv(u32),
    /// `IBV_WR_RDMA_WRITE`.
    Write {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    WriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data: the number whose big-endian bytes are the ImmDt (the drop-in
        /// converts verbs' `__be32` at the C boundary, docs/design/roce-wire.md §2.1).
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ`.
    Read {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CompareSwap {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value compared.
        compare: u64,
        /// Value swapped in.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value added.
        add: u64,
    },
    /// `IBV_WR_BIND_MW` (and `ibv_bind_mw`, which posts one): binds a memory window, in
    /// order with the send queue (IBA 10.6.7.2). Sends nothing.
    BindMw(BindMw),
    /// `IBV_WR_LOCAL_INV`: invalidates the type 2 window (or MR) with this R_Key, in order
    /// with the send queue (IBA 10.6.7.2.5). Sends nothing.
    LocalInv(u32),
}

/// The operands of a bind (`struct ibv_mw_bind_info` with the window's keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindMw {
    /// The window's R_Key as the consumer knows it (`mw->rkey`): names the window.
    pub mw_rkey: u32,
    /// The R_Key the window has after the bind: the same index, a new consumer key (the low
    /// 8 bits, `ibv_inc_rkey`).
    pub new_rkey: u32,
    /// L_Key of the MR the window is bound to (ignored for a zero-length bind).
    pub mr_lkey: u32,
    /// First address of the window.
    pub addr: u64,
    /// Length; 0 unbinds a type 1 window.
    pub length: u64,
    /// The window's access (`mw_access_flags`: remote read, write, atomic; zero-based).
    pub access: crate::types::Access,
}

impl SendOp {
    /// True for RDMA READ and the atomics: they wait for response data.
    pub fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    /// True for the work requests the send queue executes locally (bind, local invalidate).
    pub fn is_local(self) -> bool {
        matches!(self, SendOp::BindMw(_) | SendOp::LocalInv(_))
    }

    /// True for the atomics.
    pub fn is_atomic(self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// The completion opcode of this operation at the requester.
    pub fn wc_opcode(self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::BindMw(_) => WcOpcode::BindMw,
            SendOp::LocalInv(_) => WcOpcode::LocalInv,
        }
    }
}

/// Where a UD send goes (from its address handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// Destination GID.
    pub dgid: Gid,
    /// Destination QP number.
    pub dest_qpn: u32,
    /// Q_Key; one with the high bit set means "use the QP's own Q_Key" (IBA 10.2.5).
    pub qkey: u32,
}

/// Send data: scatter/gather entries, or bytes copied at post time (`IBV_SEND_INLINE`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Gathered from registered memory when sent.
    Sges(Vec<Sge>),
    /// Already copied.
    Inline(Vec<u8>),
}

impl Payload {
    /// Total bytes.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Sges(s) => s.iter().map(|s| u64::from(s.length)).sum(),
            Payload::Inline(b) => b.len() as u64,
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `struct ibv_send_wr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Local data (for READ and atomics: where the result lands).
    pub payload: Payload,
    /// `IBV_SEND_SIGNALED`.
    pub signaled: bool,
    /// `IBV_SEND_SOLICITED`.
    pub solicited: bool,
    /// UD destination.
    pub ud: Option<UdDest>,
    /// XRC: the SRQ number at the target (`qp_type.xrc.remote_srqn`).
    pub remote_srqn: u32,
}

impl SendWr {
    /// A signaled work request with no UD or XRC addressing.
    pub fn new(wr_id: u64, op: SendOp, payload: Payload) -> SendWr {
        SendWr {
            wr_id,
            op,
            payload,
            signaled: true,
            solicited: false,
            ud: None,
            remote_srqn: 0,
        }
    }
}

/// `struct ibv_recv_wr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where received data lands.
    pub sges: Vec<Sge>,
}

/// `enum ibv_wc_status` (verbs.h values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    GeneralErr = 21,
}

impl WcStatus {
    /// Decodes an `enum ibv_wc_status` value this engine produces.
    #[inline]
    pub fn from_raw(v: u32) -> Option<WcStatus> {
        use WcStatus::*;
        [
            Success,
            LocLenErr,
            LocQpOpErr,
            LocProtErr,
            WrFlushErr,
            MwBindErr,
            BadRespErr,
            LocAccessErr,
            RemInvReqErr,
            RemAccessErr,
            RemOpErr,
            RetryExcErr,
            RnrRetryExcErr,
            GeneralErr,
        ]
        .into_iter()
        .find(|s| *s as u32 == v)
    }
}

/// `enum ibv_wc_opcode` (verbs.h values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    BindMw = 5,
    LocalInv = 6,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// Decodes an `enum ibv_wc_opcode` value.
    #[inline]
    pub fn from_raw(v: u32) -> Option<WcOpcode> {
        use WcOpcode::*;
        [
            Send,
            RdmaWrite,
            RdmaRead,
            CompSwap,
            FetchAdd,
            BindMw,
            LocalInv,
            Recv,
            RecvRdmaWithImm,
        ]
        .into_iter()
        .find(|o| *o as u32 == v)
    }
}

/// `IBV_WC_GRH`: a GRH is in the first 40 bytes of the receive buffer (UD).
pub const WC_GRH: u32 = 1 << 0;
/// `IBV_WC_WITH_IMM`.
pub const WC_WITH_IMM: u32 = 1 << 1;
/// `IBV_WC_WITH_INV`.
pub const WC_WITH_INV: u32 = 1 << 3;

/// `struct ibv_wc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (meaningful on success; rdma-core leaves it undefined otherwise).
    pub opcode: WcOpcode,
    /// Bytes received (receive side) or read (RDMA READ).
    pub byte_len: u32,
    /// Immediate data (with [`WC_WITH_IMM`]: the number whose big-endian bytes the ImmDt
    /// carried; verbs' `__be32` is its `to_be()`) or invalidated R_Key (with
    /// [`WC_WITH_INV`], host order as verbs' `invalidated_rkey`).
    pub imm_data: u32,
    /// Local QP number (for XRC receive completions: the receive QP's number).
    pub qp_num: u32,
    /// Source QP (UD).
    pub src_qp: u32,
    /// `WC_*` flags.
    pub wc_flags: u32,
    /// `ibv_wc.sl`. RoCE has no service level on the wire; for UD receives this carries the
    /// network header type as mlx5 reports it (2 = IPv4, 1 = IPv6; `docs/design/roce-wire.md`), and 0
    /// otherwise.
    pub sl: u8,
    /// The message was solicited (its last packet had the SE bit): what solicited-only CQ
    /// notification looks for (IBA 10.7.3.4, C10-104). Not part of `ibv_wc`.
    pub solicited: bool,
}

impl WorkCompletion {
    /// A completion of a request that could not even be started (`LOC_QP_OP_ERR`), for
    /// requests refused after the poster already returned.
    pub fn new_error(wr_id: u64, qp_num: u32) -> WorkCompletion {
        WorkCompletion::new(wr_id, WcStatus::LocQpOpErr, WcOpcode::Send, qp_num)
    }

    /// A completion of `wr_id` on `qp_num` with no data, flags or immediate.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_data: 0,
            qp_num,
            src_qp: 0,
            wc_flags: 0,
            sl: 0,
            solicited: false,
        }
    }
}
