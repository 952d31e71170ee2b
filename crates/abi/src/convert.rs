//! Conversions between the wire structs and the core's attribute and work-request types, each
//! wire form's parse and emit side by side (smoltcp's `Repr::parse`/`emit` pairing), used by
//! the daemon and the client alike. Decoding checks enum values (a QP state above ERR, an
//! unknown MTU, QP type or work-request opcode is `EINVAL`), so the core and the engine only
//! ever see well-formed values.

use softverbs_core::attr::{AhAttr, QpAttr, QpCap};
use softverbs_core::device::Gid;
use softverbs_core::event::{AsyncEvent, EventElement};
use softverbs_core::types::{Access, Mtu, QpState};
use softverbs_core::wr::{
    Payload, RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion,
};
use softverbs_core::Error;
use zerocopy::little_endian::{U16, U32, U64};

use crate::msg::{
    send_flags, wr_opcode, AhAttrWire, AsyncEventResp, ElementKind, PostRecvReq, QpAttrWire,
    QpCapWire, SendWrWire, SgeWire, WcWire, MAX_WIRE_SGE,
};

impl From<&AhAttr> for AhAttrWire {
    fn from(a: &AhAttr) -> Self {
        AhAttrWire {
            dgid: a.dgid.0,
            flow_label: U32::new(a.flow_label),
            dlid: U16::new(a.dlid),
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
            sl: a.sl,
            src_path_bits: a.src_path_bits,
            static_rate: a.static_rate,
            is_global: u8::from(a.is_global),
            port_num: a.port_num,
            reserved: [0; 2],
        }
    }
}

impl From<&AhAttrWire> for AhAttr {
    fn from(w: &AhAttrWire) -> Self {
        AhAttr {
            dgid: Gid(w.dgid),
            flow_label: w.flow_label.get(),
            sgid_index: w.sgid_index,
            hop_limit: w.hop_limit,
            traffic_class: w.traffic_class,
            dlid: w.dlid.get(),
            sl: w.sl,
            src_path_bits: w.src_path_bits,
            static_rate: w.static_rate,
            is_global: w.is_global != 0,
            port_num: w.port_num,
        }
    }
}

impl From<&QpCap> for QpCapWire {
    fn from(c: &QpCap) -> Self {
        QpCapWire {
            max_send_wr: U32::new(c.max_send_wr),
            max_recv_wr: U32::new(c.max_recv_wr),
            max_send_sge: U32::new(c.max_send_sge),
            max_recv_sge: U32::new(c.max_recv_sge),
            max_inline_data: U32::new(c.max_inline_data),
        }
    }
}

impl From<&QpCapWire> for QpCap {
    fn from(c: &QpCapWire) -> Self {
        QpCap {
            max_send_wr: c.max_send_wr.get(),
            max_recv_wr: c.max_recv_wr.get(),
            max_send_sge: c.max_send_sge.get(),
            max_recv_sge: c.max_recv_sge.get(),
            max_inline_data: c.max_inline_data.get(),
        }
    }
}

impl From<&QpAttr> for QpAttrWire {
    fn from(a: &QpAttr) -> Self {
        QpAttrWire {
            qp_state: U32::new(a.qp_state as u32),
            cur_qp_state: U32::new(a.cur_qp_state as u32),
            path_mtu: U32::new(a.path_mtu as u32),
            path_mig_state: U32::new(a.path_mig_state),
            qkey: U32::new(a.qkey),
            rq_psn: U32::new(a.rq_psn),
            sq_psn: U32::new(a.sq_psn),
            dest_qp_num: U32::new(a.dest_qp_num),
            qp_access_flags: U32::new(a.qp_access_flags.0),
            rate_limit: U32::new(a.rate_limit),
            cap: (&a.cap).into(),
            ah_attr: (&a.ah_attr).into(),
            alt_ah_attr: (&a.alt_ah_attr).into(),
            pkey_index: U16::new(a.pkey_index),
            alt_pkey_index: U16::new(a.alt_pkey_index),
            en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
            sq_draining: u8::from(a.sq_draining),
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            alt_port_num: a.alt_port_num,
            alt_timeout: a.alt_timeout,
            reserved: 0,
        }
    }
}

/// Decodes a wire QP attribute struct for a modify with `mask`. Enum fields are checked only
/// when their mask bit is set (an unset field may hold anything, as in `ibv_qp_attr`).
pub fn qp_attr_from_wire(w: &QpAttrWire, mask: u32) -> Result<QpAttr, Error> {
    use softverbs_core::types::AttrMask as M;
    let mask = M(mask);
    let state = |v: u32, bit: M| -> Result<QpState, Error> {
        if mask.contains(bit) {
            QpState::from_raw(v).ok_or(Error::InvalidArgument("QP state value above IBV_QPS_ERR"))
        } else {
            Ok(QpState::from_raw(v).unwrap_or(QpState::Reset))
        }
    };
    let path_mtu = if mask.contains(M::PATH_MTU) {
        Mtu::from_raw(w.path_mtu.get()).ok_or(Error::InvalidArgument("path_mtu"))?
    } else {
        Mtu::from_raw(w.path_mtu.get()).unwrap_or(Mtu::M1024)
    };
    Ok(QpAttr {
        qp_state: state(w.qp_state.get(), M::STATE)?,
        cur_qp_state: state(w.cur_qp_state.get(), M::CUR_STATE)?,
        path_mtu,
        path_mig_state: w.path_mig_state.get(),
        qkey: w.qkey.get(),
        rq_psn: w.rq_psn.get(),
        sq_psn: w.sq_psn.get(),
        dest_qp_num: w.dest_qp_num.get(),
        qp_access_flags: Access(w.qp_access_flags.get()),
        cap: (&w.cap).into(),
        ah_attr: (&w.ah_attr).into(),
        alt_ah_attr: (&w.alt_ah_attr).into(),
        pkey_index: w.pkey_index.get(),
        alt_pkey_index: w.alt_pkey_index.get(),
        en_sqd_async_notify: w.en_sqd_async_notify != 0,
        sq_draining: w.sq_draining != 0,
        max_rd_atomic: w.max_rd_atomic,
        max_dest_rd_atomic: w.max_dest_rd_atomic,
        min_rnr_timer: w.min_rnr_timer,
        port_num: w.port_num,
        timeout: w.timeout,
        retry_cnt: w.retry_cnt,
        rnr_retry: w.rnr_retry,
        alt_port_num: w.alt_port_num,
        alt_timeout: w.alt_timeout,
        rate_limit: w.rate_limit.get(),
    })
}

impl From<&AsyncEvent> for AsyncEventResp {
    fn from(e: &AsyncEvent) -> Self {
        let (kind, element) = match e.element {
            EventElement::Qp(h) => (ElementKind::Qp, h.0),
            EventElement::XrcRecvQpNum(n) => (ElementKind::XrcRecvQpNum, n),
            EventElement::Cq(h) => (ElementKind::Cq, h.0),
            EventElement::Srq(h) => (ElementKind::Srq, h.0),
            EventElement::Port(p) => (ElementKind::Port, u32::from(p)),
            EventElement::Device => (ElementKind::Device, 0),
        };
        AsyncEventResp {
            event_type: U32::new(e.event_type as u32),
            element_kind: U32::new(kind as u32),
            element: U32::new(element),
            legacy_event_type: U32::new(e.legacy_event_type()),
        }
    }
}

impl From<&Sge> for SgeWire {
    fn from(s: &Sge) -> Self {
        SgeWire {
            addr: U64::new(s.addr),
            length: U32::new(s.length),
            lkey: U32::new(s.lkey),
        }
    }
}

impl From<&SgeWire> for Sge {
    fn from(s: &SgeWire) -> Self {
        Sge {
            addr: s.addr.get(),
            length: s.length.get(),
            lkey: s.lkey.get(),
        }
    }
}

/// A wire scatter/gather list and its length; more than [`MAX_WIRE_SGE`] entries is `EINVAL`.
pub fn sg_list_to_wire(sges: &[Sge]) -> Result<([SgeWire; MAX_WIRE_SGE], u32), Error> {
    if sges.len() > MAX_WIRE_SGE {
        return Err(Error::InvalidArgument(
            "more scatter/gather entries than the ABI carries",
        ));
    }
    let mut list = [SgeWire::default(); MAX_WIRE_SGE];
    for (w, s) in list.iter_mut().zip(sges) {
        *w = s.into();
    }
    Ok((list, sges.len() as u32))
}

/// The first `num_sge` entries of a wire list; a count above the list is `EINVAL`.
pub fn sg_list_from_wire(list: &[SgeWire], num_sge: u32) -> Result<Vec<Sge>, Error> {
    let n = num_sge as usize;
    let list = list
        .get(..n)
        .ok_or(Error::InvalidArgument("num_sge above the ABI's list"))?;
    Ok(list.iter().map(Sge::from).collect())
}

impl SendWrWire {
    /// Writes the opcode of `op` and its operands (`remote_addr`, `rkey`, `imm_data`,
    /// `compare_add`, `swap`; the ones `op` has none of become 0).
    pub fn set_op(&mut self, op: SendOp) {
        let (opcode, addr, rkey, imm, compare_add, swap) = match op {
            SendOp::Send => (wr_opcode::SEND, 0, 0, 0, 0, 0),
            SendOp::SendWithImm(imm) => (wr_opcode::SEND_WITH_IMM, 0, 0, imm, 0, 0),
            SendOp::SendWithInv(rkey) => (wr_opcode::SEND_WITH_INV, 0, 0, rkey, 0, 0),
            SendOp::Write { remote_addr, rkey } => {
                (wr_opcode::RDMA_WRITE, remote_addr, rkey, 0, 0, 0)
            }
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (wr_opcode::RDMA_WRITE_WITH_IMM, remote_addr, rkey, imm, 0, 0),
            SendOp::Read { remote_addr, rkey } => {
                (wr_opcode::RDMA_READ, remote_addr, rkey, 0, 0, 0)
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => (
                wr_opcode::ATOMIC_CMP_AND_SWP,
                remote_addr,
                rkey,
                0,
                compare,
                swap,
            ),
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => (
                wr_opcode::ATOMIC_FETCH_AND_ADD,
                remote_addr,
                rkey,
                0,
                add,
                0,
            ),
            // A bind: the window's R_Key in `rkey`, the new one in `imm_data`, the range in
            // `remote_addr`/`compare_add`, the access in the low and the MR's L_Key in the
            // high half of `swap`.
            SendOp::BindMw(b) => (
                wr_opcode::BIND_MW,
                b.addr,
                b.mw_rkey,
                b.new_rkey,
                b.length,
                u64::from(b.access.0) | u64::from(b.mr_lkey) << 32,
            ),
            SendOp::LocalInv(rkey) => (wr_opcode::LOCAL_INV, 0, 0, rkey, 0, 0),
        };
        self.opcode = U32::new(opcode);
        self.remote_addr = U64::new(addr);
        self.rkey = U32::new(rkey);
        self.imm_data = U32::new(imm);
        self.compare_add = U64::new(compare_add);
        self.swap = U64::new(swap);
    }

    /// The operation and its operands; an opcode softverbs does not implement is `EINVAL`.
    pub fn op(&self) -> Result<SendOp, Error> {
        let (addr, rkey, imm) = (self.remote_addr.get(), self.rkey.get(), self.imm_data.get());
        Ok(match self.opcode.get() {
            wr_opcode::SEND => SendOp::Send,
            wr_opcode::SEND_WITH_IMM => SendOp::SendWithImm(imm),
            wr_opcode::SEND_WITH_INV => SendOp::SendWithInv(imm),
            wr_opcode::RDMA_WRITE => SendOp::Write {
                remote_addr: addr,
                rkey,
            },
            wr_opcode::RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm {
                remote_addr: addr,
                rkey,
                imm,
            },
            wr_opcode::RDMA_READ => SendOp::Read {
                remote_addr: addr,
                rkey,
            },
            wr_opcode::ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
                remote_addr: addr,
                rkey,
                compare: self.compare_add.get(),
                swap: self.swap.get(),
            },
            wr_opcode::ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
                remote_addr: addr,
                rkey,
                add: self.compare_add.get(),
            },
            wr_opcode::LOCAL_INV => SendOp::LocalInv(imm),
            wr_opcode::BIND_MW => SendOp::BindMw(softverbs_core::wr::BindMw {
                mw_rkey: rkey,
                new_rkey: imm,
                mr_lkey: (self.swap.get() >> 32) as u32,
                addr,
                length: self.compare_add.get(),
                access: softverbs_core::types::Access(self.swap.get() as u32),
            }),
            _ => return Err(Error::InvalidArgument("unknown ibv_wr_opcode")),
        })
    }

    /// Writes inline data (`IBV_SEND_INLINE`: `inline_len`, `inline_data` and the flag); more
    /// than [`MAX_WIRE_INLINE`](crate::msg::MAX_WIRE_INLINE) bytes is `EINVAL`.
    pub fn set_inline(&mut self, data: &[u8]) -> Result<(), Error> {
        let slot = self
            .inline_data
            .get_mut(..data.len())
            .ok_or(Error::InvalidArgument(
                "more inline data than the ABI carries",
            ))?;
        slot.copy_from_slice(data);
        self.inline_len = U32::new(data.len() as u32);
        self.send_flags = U32::new(self.send_flags.get() | send_flags::INLINE);
        Ok(())
    }

    /// The send data: the inline bytes with `IBV_SEND_INLINE`, else the scatter/gather list.
    pub fn payload(&self) -> Result<Payload, Error> {
        if self.send_flags.get() & send_flags::INLINE != 0 {
            let n = self.inline_len.get() as usize;
            let data = self
                .inline_data
                .get(..n)
                .ok_or(Error::InvalidArgument("inline_len above the ABI's buffer"))?;
            Ok(Payload::Inline(data.to_vec()))
        } else {
            sg_list_from_wire(&self.sg_list, self.num_sge.get()).map(Payload::Sges)
        }
    }
}

/// Parses a posted send work request (command or ring entry). A UD destination needs the
/// GID of address handle `ah`, which only the core knows: `ud_dgid(ah)` returns it for a UD
/// QP and `None` for any other, and is asked only once opcode and data are valid.
pub fn send_wr_from_wire(
    w: &SendWrWire,
    ud_dgid: impl FnOnce(u32) -> Result<Option<Gid>, Error>,
) -> Result<SendWr, Error> {
    let op = w.op()?;
    let payload = w.payload()?;
    let ud = ud_dgid(w.ah.get())?.map(|dgid| UdDest {
        dgid,
        dest_qpn: w.remote_qpn.get(),
        qkey: w.remote_qkey.get(),
    });
    let flags = w.send_flags.get();
    Ok(SendWr {
        wr_id: w.wr_id.get(),
        op,
        payload,
        signaled: flags & send_flags::SIGNALED != 0,
        solicited: flags & send_flags::SOLICITED != 0,
        ud,
        remote_srqn: w.remote_srqn.get(),
    })
}

/// A receive work request for queue `handle` (QP or SRQ) over `sges`.
pub fn recv_wr_to_wire(handle: u32, wr_id: u64, sges: &[Sge]) -> Result<PostRecvReq, Error> {
    let (sg_list, num_sge) = sg_list_to_wire(sges)?;
    Ok(PostRecvReq {
        handle: U32::new(handle),
        num_sge: U32::new(num_sge),
        wr_id: U64::new(wr_id),
        sg_list,
    })
}

/// Parses a posted receive work request (command or ring entry).
pub fn recv_wr_from_wire(r: &PostRecvReq) -> Result<RecvWr, Error> {
    Ok(RecvWr {
        wr_id: r.wr_id.get(),
        sges: sg_list_from_wire(&r.sg_list, r.num_sge.get())?,
    })
}

/// The `ibv_wc` wire form of a completion (what `PollCq` and the CQ ring carry). softverbs
/// has no vendor errors, P_Keys or LIDs on RoCE: those fields are 0; `sl` carries a UD
/// receive's network header type as mlx5 reports it (docs/design/roce-wire.md).
impl From<&WorkCompletion> for WcWire {
    #[inline]
    fn from(wc: &WorkCompletion) -> Self {
        WcWire {
            wr_id: U64::new(wc.wr_id),
            status: U32::new(wc.status as u32),
            opcode: U32::new(wc.opcode as u32),
            vendor_err: U32::new(0),
            byte_len: U32::new(wc.byte_len),
            imm_data: U32::new(wc.imm_data),
            qp_num: U32::new(wc.qp_num),
            src_qp: U32::new(wc.src_qp),
            wc_flags: U32::new(wc.wc_flags),
            pkey_index: U16::new(0),
            slid: U16::new(0),
            sl: wc.sl,
            dlid_path_bits: 0,
            reserved: [0; 2],
        }
    }
}

/// A polled completion. A status or opcode this crate does not know reads as `GENERAL_ERR`
/// or `SEND` (a newer daemon's value still completes the request); whether the message was
/// solicited is not on the wire (the daemon consumes it for CQ notification).
impl From<&WcWire> for WorkCompletion {
    #[inline]
    fn from(w: &WcWire) -> Self {
        WorkCompletion {
            wr_id: w.wr_id.get(),
            status: WcStatus::from_raw(w.status.get()).unwrap_or(WcStatus::GeneralErr),
            opcode: WcOpcode::from_raw(w.opcode.get()).unwrap_or(WcOpcode::Send),
            byte_len: w.byte_len.get(),
            imm_data: w.imm_data.get(),
            qp_num: w.qp_num.get(),
            src_qp: w.src_qp.get(),
            wc_flags: w.wc_flags.get(),
            sl: w.sl,
            solicited: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_core::types::AttrMask;

    use proptest::prelude::*;

    fn sge() -> impl Strategy<Value = Sge> {
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(addr, length, lkey)| Sge {
            addr,
            length,
            lkey,
        })
    }

    fn send_op() -> impl Strategy<Value = SendOp> {
        let (a, k) = (any::<u64>(), any::<u32>());
        prop_oneof![
            Just(SendOp::Send),
            any::<u32>().prop_map(SendOp::SendWithImm),
            any::<u32>().prop_map(SendOp::SendWithInv),
            (a, k).prop_map(|(remote_addr, rkey)| SendOp::Write { remote_addr, rkey }),
            (a, k, any::<u32>()).prop_map(|(remote_addr, rkey, imm)| {
                SendOp::WriteWithImm {
                    remote_addr,
                    rkey,
                    imm,
                }
            }),
            (a, k).prop_map(|(remote_addr, rkey)| SendOp::Read { remote_addr, rkey }),
            (a, k, any::<u64>(), any::<u64>()).prop_map(|(remote_addr, rkey, compare, swap)| {
                SendOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare,
                    swap,
                }
            }),
            (a, k, any::<u64>()).prop_map(|(remote_addr, rkey, add)| SendOp::FetchAdd {
                remote_addr,
                rkey,
                add
            }),
            any::<u32>().prop_map(SendOp::LocalInv),
            (a, k, k, k, any::<u64>(), any::<u32>()).prop_map(
                |(addr, mw_rkey, new_rkey, mr_lkey, length, access)| {
                    SendOp::BindMw(softverbs_core::wr::BindMw {
                        mw_rkey,
                        new_rkey,
                        mr_lkey,
                        addr,
                        length,
                        access: softverbs_core::types::Access(access),
                    })
                }
            ),
        ]
    }

    fn payload() -> impl Strategy<Value = Payload> {
        prop_oneof![
            prop::collection::vec(sge(), 0..=MAX_WIRE_SGE).prop_map(Payload::Sges),
            prop::collection::vec(any::<u8>(), 0..=crate::msg::MAX_WIRE_INLINE)
                .prop_map(Payload::Inline),
        ]
    }

    /// What the client does to post `wr` (the UD destination goes as address handle `ah`).
    fn emit(wr: &SendWr, ah: u32) -> SendWrWire {
        let mut w = SendWrWire {
            wr_id: U64::new(wr.wr_id),
            remote_srqn: U32::new(wr.remote_srqn),
            ..SendWrWire::default()
        };
        w.set_op(wr.op);
        let mut flags = 0;
        if wr.signaled {
            flags |= send_flags::SIGNALED;
        }
        if wr.solicited {
            flags |= send_flags::SOLICITED;
        }
        w.send_flags = U32::new(flags);
        match &wr.payload {
            Payload::Sges(s) => {
                let (list, n) = sg_list_to_wire(s).unwrap();
                w.sg_list = list;
                w.num_sge = U32::new(n);
            }
            Payload::Inline(b) => w.set_inline(b).unwrap(),
        }
        if let Some(u) = wr.ud {
            w.ah = U32::new(ah);
            w.remote_qpn = U32::new(u.dest_qpn);
            w.remote_qkey = U32::new(u.qkey);
        }
        w
    }

    proptest! {
        #[test]
        fn send_work_requests_round_trip(
            wr_id in any::<u64>(),
            op in send_op(),
            payload in payload(),
            signaled in any::<bool>(),
            solicited in any::<bool>(),
            ud in proptest::option::of((any::<[u8; 16]>(), any::<u32>(), any::<u32>())),
            remote_srqn in any::<u32>(),
            ah in any::<u32>(),
        ) {
            let wr = SendWr {
                wr_id,
                op,
                payload,
                signaled,
                solicited,
                ud: ud.map(|(g, dest_qpn, qkey)| UdDest { dgid: Gid(g), dest_qpn, qkey }),
                remote_srqn,
            };
            let w = emit(&wr, ah);
            let asked = std::cell::Cell::new(None);
            let back = send_wr_from_wire(&w, |h| {
                asked.set(Some(h));
                Ok(wr.ud.map(|u| u.dgid))
            });
            prop_assert_eq!(back.unwrap(), wr.clone());
            prop_assert_eq!(asked.get(), Some(if wr.ud.is_some() { ah } else { 0 }));
        }

        #[test]
        fn receive_work_requests_round_trip(
            handle in any::<u32>(),
            wr_id in any::<u64>(),
            sges in prop::collection::vec(sge(), 0..=MAX_WIRE_SGE),
        ) {
            let r = recv_wr_to_wire(handle, wr_id, &sges).unwrap();
            prop_assert_eq!(r.handle.get(), handle);
            prop_assert_eq!(recv_wr_from_wire(&r).unwrap(), RecvWr { wr_id, sges });
        }

        #[test]
        fn completions_round_trip(
            wr_id in any::<u64>(),
            status in prop::sample::select(vec![
                WcStatus::Success, WcStatus::LocLenErr, WcStatus::LocQpOpErr,
                WcStatus::LocProtErr, WcStatus::WrFlushErr, WcStatus::MwBindErr, WcStatus::BadRespErr,
                WcStatus::LocAccessErr, WcStatus::RemInvReqErr, WcStatus::RemAccessErr,
                WcStatus::RemOpErr, WcStatus::RetryExcErr, WcStatus::RnrRetryExcErr,
                WcStatus::GeneralErr,
            ]),
            opcode in prop::sample::select(vec![
                WcOpcode::Send, WcOpcode::RdmaWrite, WcOpcode::RdmaRead, WcOpcode::CompSwap,
                WcOpcode::FetchAdd, WcOpcode::BindMw, WcOpcode::LocalInv, WcOpcode::Recv,
                WcOpcode::RecvRdmaWithImm,
            ]),
            fields in any::<(u32, u32, u32, u32, u32)>(),
            sl in any::<u8>(),
        ) {
            let (byte_len, imm_data, qp_num, src_qp, wc_flags) = fields;
            let wc = WorkCompletion {
                wr_id, status, opcode, byte_len, imm_data, qp_num, src_qp, wc_flags, sl,
                solicited: false,
            };
            prop_assert_eq!(WorkCompletion::from(&WcWire::from(&wc)), wc);
        }
    }

    #[test]
    fn work_requests_beyond_the_abi_are_einval() {
        let many = vec![Sge::default(); MAX_WIRE_SGE + 1];
        assert_eq!(sg_list_to_wire(&many).unwrap_err().errno(), 22);
        assert_eq!(recv_wr_to_wire(1, 2, &many).unwrap_err().errno(), 22);
        let mut w = SendWrWire::default();
        assert_eq!(
            w.set_inline(&[0; crate::msg::MAX_WIRE_INLINE + 1])
                .unwrap_err()
                .errno(),
            22
        );
        assert_eq!(
            w.send_flags.get(),
            0,
            "a refused inline write leaves the request alone"
        );

        let mut w = SendWrWire::default();
        w.set_op(SendOp::Send);
        w.num_sge = U32::new(MAX_WIRE_SGE as u32 + 1);
        assert_eq!(send_wr_from_wire(&w, |_| Ok(None)).unwrap_err().errno(), 22);
        w.num_sge = U32::new(0);
        w.send_flags = U32::new(send_flags::INLINE);
        w.inline_len = U32::new(crate::msg::MAX_WIRE_INLINE as u32 + 1);
        assert_eq!(send_wr_from_wire(&w, |_| Ok(None)).unwrap_err().errno(), 22);
        w.inline_len = U32::new(0);
        // IBV_WR_TSO: no raw packet QPs, so no TSO.
        w.opcode = U32::new(10);
        let asked = std::cell::Cell::new(false);
        let e = send_wr_from_wire(&w, |_| {
            asked.set(true);
            Ok(None)
        });
        assert_eq!(e.unwrap_err().errno(), 22);
        assert!(
            !asked.get(),
            "a bad opcode is refused before the address handle is looked up"
        );

        let mut r = recv_wr_to_wire(1, 2, &[]).unwrap();
        r.num_sge = U32::new(MAX_WIRE_SGE as u32 + 1);
        assert_eq!(recv_wr_from_wire(&r).unwrap_err().errno(), 22);
    }

    #[test]
    fn unknown_completion_values_read_as_general_error_and_send() {
        let w = WcWire {
            status: U32::new(99),
            opcode: U32::new(77),
            ..WcWire::default()
        };
        let wc = WorkCompletion::from(&w);
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::GeneralErr, WcOpcode::Send)
        );
    }

    #[test]
    fn qp_attr_round_trips_and_checks_enums_under_the_mask() {
        let a = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::M4096,
            dest_qp_num: 77,
            rq_psn: 5,
            ..QpAttr::default()
        };
        let w = QpAttrWire::from(&a);
        assert_eq!(
            qp_attr_from_wire(&w, AttrMask::STATE.0 | AttrMask::PATH_MTU.0).unwrap(),
            a
        );
        let mut bad = w;
        bad.qp_state = U32::new(7);
        assert_eq!(
            qp_attr_from_wire(&bad, AttrMask::STATE.0)
                .unwrap_err()
                .errno(),
            22
        );
        assert!(
            qp_attr_from_wire(&bad, 0).is_ok(),
            "unmasked fields are not read"
        );
    }
}
