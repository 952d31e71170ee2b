//! `ibv_*_str`: static texts, never NULL, with rdma-core's wording (ibv_wc_status_str(3),
//! ibv_event_type_str(3)) because programs print them and users grep for them.

use std::ffi::{c_char, c_int, CStr};

const WC_STATUS: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

const EVENT_TYPE: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

const NODE_TYPE: [&CStr; 8] = [
    c"unknown",
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

const PORT_STATE: [&CStr; 6] = [
    c"no state change (NOP)",
    c"down",
    c"init",
    c"armed",
    c"active",
    c"active defer",
];

fn pick(table: &[&'static CStr], i: c_int) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .unwrap_or(&c"unknown")
        .as_ptr()
}

extern "C" fn wc_status_str(status: c_int) -> *const c_char {
    pick(&WC_STATUS, status)
}
export!(default "ibv_wc_status_str", "IBVERBS_1.1", wc_status_str);

extern "C" fn event_type_str(event: c_int) -> *const c_char {
    pick(&EVENT_TYPE, event)
}
export!(default "ibv_event_type_str", "IBVERBS_1.1", event_type_str);

extern "C" fn node_type_str(node: c_int) -> *const c_char {
    pick(&NODE_TYPE, node)
}
export!(default "ibv_node_type_str", "IBVERBS_1.1", node_type_str);

extern "C" fn port_state_str(state: c_int) -> *const c_char {
    pick(&PORT_STATE, state)
}
export!(default "ibv_port_state_str", "IBVERBS_1.1", port_state_str);

// ---- rates (verbs.h enum ibv_rate; ibv_rate_to_mult(3)) -------------------------------------

/// (enum value, multiple of 2.5 Gb/s, Mb/s)
const RATES: [(c_int, c_int, c_int); 23] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    // FDR/EDR rates are not whole multiples of 2.5 Gb/s.
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, 11, 28125),
    (20, 20, 53125),
    (21, 160, 425000),
    (22, 240, 637500),
    (23, 320, 850000),
    (24, 480, 1275000),
];

extern "C" fn rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}
export!(default "ibv_rate_to_mult", "IBVERBS_1.0", rate_to_mult);

extern "C" fn mult_to_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(0, |r| r.0)
}
export!(default "mult_to_ibv_rate", "IBVERBS_1.0", mult_to_rate);

extern "C" fn rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}
export!(default "ibv_rate_to_mbps", "IBVERBS_1.1", rate_to_mbps);

extern "C" fn mbps_to_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}
export!(default "mbps_to_ibv_rate", "IBVERBS_1.1", mbps_to_rate);
