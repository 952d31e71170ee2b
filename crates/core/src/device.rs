//! Devices and ports: the attributes `ibv_query_device`/`ibv_query_port` report and the
//! RoCE v2 GID table.

use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::types::Mtu;

/// `IBV_DEVICE_XRC` in `device_cap_flags` (verbs.h): the device supports XRC.
pub const DEVICE_XRC: u64 = 1 << 20;
/// rxe's multicast table (`rxe_param.h`): groups per device, and QP attachments over all of
/// them; `crate::mcast` enforces both, and a uid's default share is a quarter (`limits.rs`).
pub const MAX_MCAST_GRP: u64 = 8192;
/// See [`MAX_MCAST_GRP`].
pub const MAX_TOTAL_MCAST_QP_ATTACH: u32 = 0x70000;
/// `IBV_DEVICE_RC_RNR_NAK_GEN` (verbs.h).
pub const DEVICE_RC_RNR_NAK_GEN: u64 = 1 << 12;
/// `IBV_DEVICE_SRQ_RESIZE`.
pub const DEVICE_SRQ_RESIZE: u64 = 1 << 13;
/// `IBV_DEVICE_N_NOTIFY_CQ`.
pub const DEVICE_N_NOTIFY_CQ: u64 = 1 << 14;
/// `IBV_DEVICE_PORT_ACTIVE_EVENT`.
pub const DEVICE_PORT_ACTIVE_EVENT: u64 = 1 << 10;
/// `IBV_DEVICE_SYS_IMAGE_GUID`.
pub const DEVICE_SYS_IMAGE_GUID: u64 = 1 << 11;
/// `IBV_DEVICE_MEM_WINDOW`: type 1 memory windows (crate::mw).
pub const DEVICE_MEM_WINDOW: u64 = 1 << 17;
/// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`: type 2 windows checked by QP number only. Not offered:
/// softverbs checks QP and PD, as type 2B (and rxe) do.
pub const DEVICE_MEM_WINDOW_TYPE_2A: u64 = 1 << 23;
/// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`: type 2 windows tied to their QP and PD.
pub const DEVICE_MEM_WINDOW_TYPE_2B: u64 = 1 << 24;

/// A 128-bit GID (IBA 4.1.1). For RoCE v2 it is an IPv6 address, or an IPv4 address mapped
/// into IPv6 (`::ffff:a.b.c.d`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The RoCE v2 GID of an IP address.
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for on a RoCE v2 port.
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// True for the all-zero GID (an empty table slot).
    pub fn is_zero(self) -> bool {
        self.0 == [0; 16]
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(ip))
    }
}

/// `enum ibv_port_state` (verbs.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum PortState {
    Down = 1,
    Init = 2,
    Armed = 3,
    Active = 4,
}

/// `IBV_LINK_LAYER_ETHERNET`: every softverbs port is a RoCE port.
pub const LINK_LAYER_ETHERNET: u8 = 2;

/// What `ibv_query_port` reports, minus fields that are constant for RoCE.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest path MTU the port supports.
    pub max_mtu: Mtu,
    /// Path MTU of the link.
    pub active_mtu: Mtu,
    /// GID table; unused slots are zero. Its length is `gid_tbl_len`.
    pub gids: Vec<Gid>,
    /// `pkey_tbl_len`; slot 0 holds the default P_Key 0xFFFF.
    pub pkey_tbl_len: u16,
    /// `max_msg_sz`.
    pub max_msg_sz: u32,
    /// `link_layer`.
    pub link_layer: u8,
}

impl PortAttr {
    /// An active RoCE port with `gids` at the head of a 16-slot table.
    pub fn roce(gids: &[Gid], active_mtu: Mtu) -> PortAttr {
        let mut table = vec![Gid::default(); GID_TABLE_LEN.max(gids.len())];
        table[..gids.len()].copy_from_slice(gids);
        PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::M4096,
            active_mtu,
            gids: table,
            pkey_tbl_len: 1,
            max_msg_sz: 1 << 31,
            link_layer: LINK_LAYER_ETHERNET,
        }
    }
}

/// Slots in a port's GID table (rxe offers 1024; 16 is plenty for one IP per device).
pub const GID_TABLE_LEN: usize = 16;

/// What `ibv_query_device` reports. Limits are enforced by the core.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub device_cap_flags: u64,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    /// Memory windows (IBA 10.6.7; crate::mw).
    pub max_mw: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_ee_rd_atom: u32,
    pub max_res_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_ee_init_rd_atom: u32,
    /// `enum ibv_atomic_cap`: 1 = `IBV_ATOMIC_HCA`.
    pub atomic_cap: u32,
    pub max_ah: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
    pub max_inline_data: u32,
    pub num_comp_vectors: u32,
    /// Multicast groups with at least one QP attached (`crate::mcast`).
    pub max_mcast_grp: u32,
    /// QPs attached to one group.
    pub max_mcast_qp_attach: u32,
    /// Attachments over all groups of the device.
    pub max_total_mcast_qp_attach: u32,
}

impl DeviceAttr {
    /// The attributes every softverbs device offers. Limits are sized for the scale target
    /// (100,000 shared receive QPs) rather than copied from a NIC.
    pub fn softverbs(node_guid: u64, ports: u8) -> DeviceAttr {
        DeviceAttr {
            fw_ver: concat!("softverbs ", env!("CARGO_PKG_VERSION")).to_string(),
            node_guid,
            sys_image_guid: node_guid,
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            vendor_id: 0xff_ffff,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 1 << 18,
            max_qp_wr: 16384,
            device_cap_flags: DEVICE_XRC
                | DEVICE_RC_RNR_NAK_GEN
                | DEVICE_SRQ_RESIZE
                | DEVICE_N_NOTIFY_CQ
                | DEVICE_PORT_ACTIVE_EVENT
                | DEVICE_SYS_IMAGE_GUID
                | DEVICE_MEM_WINDOW
                | DEVICE_MEM_WINDOW_TYPE_2B,
            max_sge: 32,
            max_sge_rd: 32,
            max_cq: 1 << 18,
            // mlx5's figure (ConnectX, 2^22 - 1): libfabric's ofi_rxm sizes its MSG CQ as
            // (tx + rx depth) x universe size (65536 by default), past rxe's 32767. Rings are
            // memfd pages, committed only as completions reach them.
            max_cqe: (1 << 22) - 1,
            max_mr: 1 << 18,
            max_mw: 1 << 18,
            max_pd: 1 << 17,
            max_qp_rd_atom: 128,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 128 << 10,
            max_qp_init_rd_atom: 128,
            max_ee_init_rd_atom: 0,
            atomic_cap: 1,
            max_ah: 1 << 16,
            max_srq: 1 << 18,
            max_srq_wr: 16384,
            max_srq_sge: 27,
            max_pkeys: 1,
            local_ca_ack_delay: 15,
            phys_port_cnt: ports,
            max_inline_data: 256,
            num_comp_vectors: 1,
            // rxe's values (rxe_param.h), enforced by `crate::mcast`.
            max_mcast_grp: MAX_MCAST_GRP as u32,
            max_mcast_qp_attach: 56,
            max_total_mcast_qp_attach: MAX_TOTAL_MCAST_QP_ATTACH,
        }
    }
}

/// One device: its name, attributes and ports (port `n` is `ports[n - 1]`, IBA numbering).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Device {
    /// Name as `ibv_get_device_name` reports it (e.g. `softverbs0`).
    pub name: String,
    /// Device attributes.
    pub attr: DeviceAttr,
    /// Ports, numbered from 1.
    pub ports: Vec<PortAttr>,
}

impl Device {
    /// A one-port RoCE device whose GID table holds the GIDs of `ips`.
    pub fn roce(name: &str, node_guid: u64, ips: &[IpAddr], mtu: Mtu) -> Device {
        let gids: Vec<Gid> = ips.iter().map(|ip| Gid::from_ip(*ip)).collect();
        Device {
            name: name.to_string(),
            attr: DeviceAttr::softverbs(node_guid, 1),
            ports: vec![PortAttr::roce(&gids, mtu)],
        }
    }

    /// The port with IBA number `port_num`, if it exists.
    pub fn port(&self, port_num: u8) -> Option<&PortAttr> {
        (port_num as usize)
            .checked_sub(1)
            .and_then(|i| self.ports.get(i))
    }
}
