//! Wire answers → the public types.

use softverbs_abi::convert::qp_attr_from_wire;
use softverbs_abi::msg::{
    name_str, AsyncEventResp, ElementKind, QueryDeviceResp, QueryPortResp, QueryQpResp,
};
use softverbs_core::attr::{QpCap, QpInitInfo};
use softverbs_core::device::{DeviceAttr, PortState};
use softverbs_core::types::{EventType, Mtu, QpType};

use crate::context::PortInfo;
use crate::error::{Error, Result};
use crate::event::{AsyncEvent, Element};
use crate::objects::QpQuery;

pub(crate) fn device_attr(w: &QueryDeviceResp) -> DeviceAttr {
    DeviceAttr {
        fw_ver: name_str(&w.fw_ver),
        node_guid: w.node_guid.get(),
        sys_image_guid: w.sys_image_guid.get(),
        max_mr_size: w.max_mr_size.get(),
        page_size_cap: w.page_size_cap.get(),
        vendor_id: w.vendor_id.get(),
        vendor_part_id: w.vendor_part_id.get(),
        hw_ver: w.hw_ver.get(),
        max_qp: w.max_qp.get(),
        max_qp_wr: w.max_qp_wr.get(),
        device_cap_flags: w.device_cap_flags.get(),
        max_sge: w.max_sge.get(),
        max_sge_rd: w.max_sge_rd.get(),
        max_cq: w.max_cq.get(),
        max_cqe: w.max_cqe.get(),
        max_mr: w.max_mr.get(),
        max_mw: w.max_mw.get(),
        max_pd: w.max_pd.get(),
        max_qp_rd_atom: w.max_qp_rd_atom.get(),
        max_ee_rd_atom: w.max_ee_rd_atom.get(),
        max_res_rd_atom: w.max_res_rd_atom.get(),
        max_qp_init_rd_atom: w.max_qp_init_rd_atom.get(),
        max_ee_init_rd_atom: w.max_ee_init_rd_atom.get(),
        atomic_cap: w.atomic_cap.get(),
        max_ah: w.max_ah.get(),
        max_srq: w.max_srq.get(),
        max_srq_wr: w.max_srq_wr.get(),
        max_srq_sge: w.max_srq_sge.get(),
        max_pkeys: w.max_pkeys.get(),
        local_ca_ack_delay: w.local_ca_ack_delay,
        phys_port_cnt: w.phys_port_cnt,
        max_inline_data: w.max_inline_data.get(),
        num_comp_vectors: w.num_comp_vectors.get(),
        max_mcast_grp: w.max_mcast_grp.get(),
        max_mcast_qp_attach: w.max_mcast_qp_attach.get(),
        max_total_mcast_qp_attach: w.max_total_mcast_qp_attach.get(),
    }
}

fn port_state(v: u32) -> Option<PortState> {
    Some(match v {
        1 => PortState::Down,
        2 => PortState::Init,
        3 => PortState::Armed,
        4 => PortState::Active,
        _ => return None,
    })
}

pub(crate) fn port_info(op: &'static str, w: &QueryPortResp) -> Result<PortInfo> {
    let mtu = |v: u32| Mtu::from_raw(v).ok_or(Error::proto(op));
    Ok(PortInfo {
        state: port_state(w.state.get()).ok_or(Error::proto(op))?,
        max_mtu: mtu(w.max_mtu.get())?,
        active_mtu: mtu(w.active_mtu.get())?,
        gid_tbl_len: w.gid_tbl_len.get(),
        max_msg_sz: w.max_msg_sz.get(),
        pkey_tbl_len: w.pkey_tbl_len.get(),
        link_layer: w.link_layer,
    })
}

/// A query answer. Every enum in it must be valid (the daemon only reports real states), so
/// the attributes are decoded with the full mask.
pub(crate) fn qp_query(op: &'static str, w: &QueryQpResp) -> Result<QpQuery> {
    let attr = qp_attr_from_wire(&w.attr, u32::MAX).map_err(|_| Error::proto(op))?;
    let qp_type = QpType::from_raw(w.qp_type.get()).ok_or(Error::proto(op))?;
    Ok(QpQuery {
        attr,
        init: QpInitInfo {
            qp_type,
            cap: QpCap::from(&w.init_cap),
            sq_sig_all: w.sq_sig_all.get() != 0,
            create_flags: w.create_flags.get(),
        },
        qpn: w.qpn.get(),
    })
}

pub(crate) fn async_event(w: &AsyncEventResp) -> AsyncEvent {
    let value = w.element.get();
    let element = match ElementKind::from_u32(w.element_kind.get()) {
        Some(ElementKind::Qp) => Element::Qp(value),
        Some(ElementKind::XrcRecvQpNum) => Element::XrcRecvQpNum(value),
        Some(ElementKind::Cq) => Element::Cq(value),
        Some(ElementKind::Srq) => Element::Srq(value),
        Some(ElementKind::Port) => Element::Port(value as u8),
        Some(ElementKind::Device) => Element::Device,
        None => Element::Unknown {
            kind: w.element_kind.get(),
            value,
        },
    };
    AsyncEvent {
        event_type: EventType::from_raw(w.event_type.get()),
        raw_event_type: w.event_type.get(),
        element,
        legacy_event_type: w.legacy_event_type.get(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_core::attr::QpAttr;
    use softverbs_core::event::{AsyncEvent as CoreEvent, EventElement};
    use softverbs_core::ids::Handle;
    use softverbs_core::types::{QpState, XRC_QP_EVENT_FLAG};
    use zerocopy::little_endian::U32;

    #[test]
    fn every_event_type_round_trips_and_unknown_ones_stay_raw() {
        for v in 0..19 {
            assert_eq!(EventType::from_raw(v).map(|t| t as u32), Some(v));
        }
        assert_eq!(EventType::from_raw(19), None);
        let w = AsyncEventResp {
            event_type: U32::new(77),
            element_kind: U32::new(99),
            element: U32::new(5),
            legacy_event_type: U32::new(77),
        };
        let e = async_event(&w);
        assert_eq!((e.event_type, e.raw_event_type), (None, 77));
        assert_eq!(e.element, Element::Unknown { kind: 99, value: 5 });
    }

    #[test]
    fn async_events_decode_as_the_core_encodes_them() {
        let cases = [
            (EventElement::Qp(Handle(3)), Element::Qp(3)),
            (
                EventElement::XrcRecvQpNum(0x42),
                Element::XrcRecvQpNum(0x42),
            ),
            (EventElement::Cq(Handle(4)), Element::Cq(4)),
            (EventElement::Srq(Handle(5)), Element::Srq(5)),
            (EventElement::Port(1), Element::Port(1)),
            (EventElement::Device, Element::Device),
        ];
        for (core, want) in cases {
            let ev = CoreEvent {
                event_type: EventType::CommEst,
                element: core,
            };
            let got = async_event(&AsyncEventResp::from(&ev));
            assert_eq!(got.element, want);
            assert_eq!(got.event_type, Some(EventType::CommEst));
            let flag = if matches!(want, Element::XrcRecvQpNum(_)) {
                XRC_QP_EVENT_FLAG
            } else {
                0
            };
            assert_eq!(got.legacy_event_type, EventType::CommEst as u32 | flag);
        }
    }

    #[test]
    fn query_answers_must_hold_valid_enums() {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        let mut w = QueryQpResp {
            attr: (&attr).into(),
            qp_type: U32::new(QpType::XrcRecv as u32),
            qpn: U32::new(0x99),
            ..Default::default()
        };
        let q = qp_query("query_qp", &w).unwrap();
        assert_eq!(
            (q.attr, q.init.qp_type, q.qpn),
            (attr, QpType::XrcRecv, 0x99)
        );
        w.qp_type = U32::new(1);
        assert_eq!(
            qp_query("query_qp", &w).unwrap_err().errno,
            crate::errno::EPROTO
        );
        w.qp_type = U32::new(QpType::Rc as u32);
        w.attr.qp_state = U32::new(9);
        assert_eq!(
            qp_query("query_qp", &w).unwrap_err().errno,
            crate::errno::EPROTO
        );
    }

    #[test]
    fn device_and_port_answers_convert() {
        let want = DeviceAttr::softverbs(0x1234, 1);
        let w = QueryDeviceResp {
            fw_ver: softverbs_abi::msg::name_bytes(&want.fw_ver),
            node_guid: want.node_guid.into(),
            max_qp: want.max_qp.into(),
            phys_port_cnt: 1,
            ..Default::default()
        };
        let got = device_attr(&w);
        assert_eq!(
            (got.fw_ver, got.node_guid, got.max_qp, got.phys_port_cnt),
            (want.fw_ver, 0x1234, want.max_qp, 1)
        );
        let p = QueryPortResp {
            state: U32::new(4),
            max_mtu: U32::new(5),
            active_mtu: U32::new(3),
            gid_tbl_len: U32::new(16),
            ..Default::default()
        };
        let info = port_info("query_port", &p).unwrap();
        assert_eq!(
            (info.state, info.active_mtu, info.gid_tbl_len),
            (PortState::Active, Mtu::M1024, 16)
        );
        let bad = QueryPortResp {
            state: U32::new(0),
            ..p
        };
        assert!(port_info("query_port", &bad).is_err());
    }
}
