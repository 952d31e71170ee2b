//! Reading `softverbs resources --json` (the daemon's view of every object and its holders),
//! as a user checks what the daemon holds.

use serde_json::Value;

/// Every section of `softverbs resources --json` that lists objects.
pub const SECTIONS: [&str; 6] = ["contexts", "xrcds", "srqs", "cqs", "qps", "xrc_recv_qps"];

/// Whether the view lists a context of process `pid`.
pub fn has_pid(r: &Value, pid: u64) -> bool {
    r["contexts"]
        .as_array()
        .expect("contexts")
        .iter()
        .any(|c| c["pid"] == pid)
}

/// The holders of XRC receive QP `qpn` as (pid, kind), in the daemon's order, or None if
/// there is no such QP.
pub fn holders(r: &Value, qpn: u32) -> Option<Vec<(u64, String)>> {
    r["xrc_recv_qps"]
        .as_array()
        .expect("xrc_recv_qps")
        .iter()
        .find(|t| t["qpn"] == qpn)
        .map(|t| {
            t["holders"]
                .as_array()
                .expect("holders")
                .iter()
                .map(|h| {
                    (
                        h["pid"].as_u64().expect("pid"),
                        h["kind"].as_str().expect("kind").to_string(),
                    )
                })
                .collect()
        })
}
