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

/// One port's rejected packets: its device, its number, and `(counter name, count)` per
/// reason.
type PortDrops = (String, u64, Vec<(&'static str, u64)>);

/// Each port's received packets dropped, by reason, from the `counters.ports` rows of the
/// daemon's snapshot (`rx_drop_*`, docs/guide/counters.md "Rejected packets"): `(device,
/// port, [(counter name, count)])`. A daemon older than these counters gives none.
fn port_drops(resources: &serde_json::Value) -> Vec<PortDrops> {
    resources["counters"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| {
            let counts: Vec<(&'static str, u64)> = softverbs_transport::Reject::ALL
                .iter()
                .filter_map(|r| Some((r.name(), row[r.name()].as_u64()?)))
                .collect();
            (!counts.is_empty()).then(|| {
                (
                    row["device"].as_str().unwrap_or("?").to_string(),
                    row["port"].as_u64().unwrap_or(1),
                    counts,
                )
            })
        })
        .collect()
}

/// The lines for `softverbs status` of each port's rejected packets: their number, and
/// each reason that has any, in words.
pub fn render_drops(resources: &serde_json::Value) -> String {
    let mut out = String::new();
    for (dev, port, counts) in port_drops(resources) {
        let total: u64 = counts.iter().map(|(_, n)| n).sum();
        let reasons: Vec<String> = softverbs_transport::Reject::ALL
            .iter()
            .filter_map(|r| {
                let n = counts.iter().find(|(k, _)| *k == r.name())?.1;
                (n > 0).then(|| format!("{n} {} ({})", r.words(), r.name()))
            })
            .collect();
        if reasons.is_empty() {
            out.push_str(&format!(
                "device {dev} port {port}: rejected packets: none\n"
            ));
        } else {
            out.push_str(&format!(
                "device {dev} port {port}: rejected packets: {total}: {}\n",
                reasons.join(", ")
            ));
        }
    }
    out
}

/// Adds each port's `rx_drops` (counter name → count) to the `device_status` of
/// `softverbs status --json`.
pub fn add_drops(device_status: &mut serde_json::Value, resources: &serde_json::Value) {
    for (dev, port, counts) in port_drops(resources) {
        let Some(devs) = device_status.as_array_mut() else {
            return;
        };
        let ports = devs
            .iter_mut()
            .filter(|d| d["name"].as_str() == Some(dev.as_str()))
            .filter_map(|d| d["ports"].as_array_mut())
            .flatten()
            .filter(|p| p["port"].as_u64() == Some(port));
        for p in ports {
            let drops: serde_json::Map<String, serde_json::Value> = counts
                .iter()
                .map(|(k, n)| (k.to_string(), (*n).into()))
                .collect();
            p["rx_drops"] = drops.into();
        }
    }
}
