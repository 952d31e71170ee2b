//! The JSON of `softverbs status --json` and `devices --json`: one object per command, a
//! top-level `"schema"` number that changes only when a key is removed or changes meaning
//! (keys are added freely), and snake_case keys throughout (docs/guide/json.md). `resources
//! --json` and `stat --json` follow the same convention.

use serde_json::{json, Value};
use softverbs::{DeviceInfo, Status};
use softverbs_core::limits::LimitRow;
use softverbs_core::resources::DeviceRow;

/// The schema version every `--json` output carries.
pub const SCHEMA: u32 = 1;

/// `softverbs status --json`.
pub fn status(
    s: &Status,
    limits: &[LimitRow],
    devs: &[DeviceRow],
    network: &Option<String>,
    receive: &Option<Value>,
    version: &Option<String>,
) -> Value {
    json!({
        "schema": SCHEMA,
        "daemon_pid": s.daemon_pid, "version": version, "abi_version": s.abi_version, "uptime_ms": s.uptime_ms,
        "devices": s.devices, "contexts": s.contexts, "xrcds": s.xrcds, "xrc_recv_qps": s.xrc_recv_qps,
        "qps": s.qps, "srqs": s.srqs, "cqs": s.cqs, "mrs": s.mrs,
        "limits": limits, "device_status": crate::device_status::json(devs),
        "dp_rounds": s.dp_rounds, "dp_qp_visits": s.dp_qp_visits,
        "dp_max_qp_visits": s.dp_max_qp_visits, "dp_queued_qps": s.dp_queued_qps,
        "net_foreign_source": s.net_foreign_source, "net_outside_window": s.net_outside_window,
        "network": network,
        // [{"device", "addr", "mode": "raw" | "udp"}]: where each device socket receives.
        "receive": receive,
    })
}

/// `softverbs devices --json`: what `ibv_devices` lists (name, node GUID) and each device's
/// ports (addresses, active and largest MTU) from the daemon's snapshot. The node GUID is a
/// string of 16 hex digits, as `ibv_devices` prints it: a 64-bit number is not exact in
/// every JSON reader (JavaScript's numbers hold 53 bits).
pub fn devices(list: &[DeviceInfo], rows: &[DeviceRow]) -> Value {
    let devices: Vec<Value> = list
        .iter()
        .map(|d| {
            let ports = rows
                .iter()
                .find(|r| r.name == d.name)
                .map(|r| serde_json::to_value(&r.ports).unwrap_or_default())
                .unwrap_or_else(|| json!([]));
            json!({
                "index": d.index,
                "name": d.name,
                "node_guid": format!("{:016x}", d.node_guid),
                "ports": ports,
            })
        })
        .collect();
    json!({ "schema": SCHEMA, "devices": devices })
}
