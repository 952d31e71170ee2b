//! The devices' part of the resource snapshot: each port's addresses and active MTU (what
//! `ibv_query_port(3)` reports as `active_mtu`), and the multicast groups the device has
//! joined with the QPs attached to each (`ibv_attach_mcast(3)`, `crate::mcast`).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::core::Core;
use crate::device::Gid;

/// One device.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceRow {
    /// Its name (`ibv_get_device_name`).
    pub name: String,
    /// Its ports, from port 1.
    pub ports: Vec<PortRow>,
    /// The groups it has joined: those with at least one QP attached, in address order.
    pub mcast_groups: Vec<McastGroupRow>,
}

/// One port of a device.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PortRow {
    /// Port number (IBA numbers a device's ports from 1).
    pub port: u8,
    /// Active MTU in bytes: the largest IB MTU the link of the port's address carries.
    pub active_mtu: u32,
    /// Largest MTU the port supports, in bytes.
    pub max_mtu: u32,
    /// The addresses of the port's RoCE v2 GIDs, in table order.
    pub addrs: Vec<IpAddr>,
}

/// One multicast group of a device.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct McastGroupRow {
    /// The group's address (its multicast GID as an IP address).
    pub group: IpAddr,
    /// The QP numbers attached to it, ascending.
    pub qpns: Vec<u32>,
    /// Whether the device's network side is a member of the IP group on its interface
    /// (the daemon fills it in); absent for a device without network, whose group reaches
    /// only the daemon's own QPs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_joined: Option<bool>,
}

impl Core {
    /// Every device's row, in device order.
    pub(crate) fn device_rows(&self) -> Vec<DeviceRow> {
        self.devices()
            .iter()
            .enumerate()
            .map(|(i, d)| DeviceRow {
                name: d.name.clone(),
                ports: d
                    .ports
                    .iter()
                    .enumerate()
                    .map(|(p, a)| PortRow {
                        port: p as u8 + 1,
                        active_mtu: a.active_mtu.bytes(),
                        max_mtu: a.max_mtu.bytes(),
                        addrs: a
                            .gids
                            .iter()
                            .filter(|g| **g != Gid::default())
                            .map(|g| g.to_ip())
                            .collect(),
                    })
                    .collect(),
                mcast_groups: self
                    .mcast_groups(i)
                    .into_iter()
                    .map(|(g, qpns)| McastGroupRow {
                        group: g.to_ip(),
                        qpns,
                        net_joined: None,
                    })
                    .collect(),
            })
            .collect()
    }
}
