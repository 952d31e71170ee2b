//! Conversions between the wire structs and the core's attribute types. Decoding checks
//! enum values (a QP state above ERR, an unknown MTU or QP type is `EINVAL`), so the core
//! only ever sees well-formed values.

use softverbs_core::attr::{AhAttr, QpAttr, QpCap};
use softverbs_core::device::Gid;
use softverbs_core::event::{AsyncEvent, EventElement};
use softverbs_core::types::{Access, Mtu, QpState};
use softverbs_core::Error;
use zerocopy::little_endian::{U16, U32};

use crate::msg::{AhAttrWire, AsyncEventResp, ElementKind, QpAttrWire, QpCapWire};

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

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_core::types::AttrMask;

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
