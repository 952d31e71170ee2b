//! The devices' lines of `softverbs status`: each port's addresses and active MTU, and the
//! multicast groups each device has joined with how many QPs are attached to each.

use softverbs_core::resources::{DeviceRow, McastGroupRow};

/// What a group's membership on the network is, in words.
fn membership(g: &McastGroupRow) -> &'static str {
    match g.net_joined {
        Some(true) => "joined on the network",
        Some(false) => "not joined on the network: the join failed, see the daemon's log",
        None => "this daemon's QPs only: the device has no network",
    }
}

/// The lines for `softverbs status`.
pub fn render(devices: &[DeviceRow]) -> String {
    let mut out = String::new();
    for d in devices {
        for p in &d.ports {
            let addrs: Vec<String> = p.addrs.iter().map(ToString::to_string).collect();
            out.push_str(&format!(
                "device {} port {}: active MTU {} (max {}), {}\n",
                d.name,
                p.port,
                p.active_mtu,
                p.max_mtu,
                addrs.join(" ")
            ));
        }
        if d.mcast_groups.is_empty() {
            out.push_str(&format!("device {} multicast groups: none\n", d.name));
        }
        for g in &d.mcast_groups {
            let n = g.qpns.len();
            out.push_str(&format!(
                "device {} multicast group {}: {n} QP{} attached ({})\n",
                d.name,
                g.group,
                if n == 1 { "" } else { "s" },
                membership(g)
            ));
        }
    }
    out
}

/// The devices for `softverbs status --json`: the snapshot's rows, each group with its QP
/// count beside its QP numbers.
pub fn json(devices: &[DeviceRow]) -> serde_json::Value {
    devices
        .iter()
        .map(|d| {
            let mut v = serde_json::to_value(d).unwrap_or_default();
            if let Some(groups) = v["mcast_groups"].as_array_mut() {
                for (g, row) in groups.iter_mut().zip(&d.mcast_groups) {
                    g["qps"] = row.qpns.len().into();
                }
            }
            v
        })
        .collect()
}
