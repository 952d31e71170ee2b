//! Issue 36, item 8: `softverbs status --json` and `devices --json` print one JSON object
//! each, with a top-level `"schema": 1` and snake_case keys (docs/guide/json.md), parsed here
//! as a user's script would.

use serde_json::Value;
use softverbs::{Context, QpCap, QpInit, QpType};
use softverbs_testkit::Daemon;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");

/// Every object key under `v` (map keys that are uids, all digits, included) is snake_case.
fn assert_snake_case(v: &Value, at: &str) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let ok = !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                    && !k.starts_with('_');
                assert!(ok, "key {at}.{k} is not snake_case");
                assert_snake_case(v, &format!("{at}.{k}"));
            }
        }
        Value::Array(a) => a
            .iter()
            .for_each(|v| assert_snake_case(v, &format!("{at}[]"))),
        _ => {}
    }
}

fn parse(text: &str) -> Value {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    assert!(v.is_object(), "not one object: {text}");
    assert_eq!(v["schema"], 1, "{text}");
    assert_snake_case(&v, "");
    v
}

#[test]
fn status_and_devices_json_carry_the_schema_and_what_the_daemon_holds() {
    let d = Daemon::options("json")
        .bin(BIN)
        .device("sv-json", "127.36.8.1")
        .start();
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let _qps: Vec<_> = (0..2)
        .map(|_| {
            ctx.create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap))
                .unwrap()
        })
        .collect();

    let s = parse(&d.cli(&["status", "--json"]));
    assert_eq!(s["daemon_pid"], d.child.id(), "{s}");
    assert_eq!(
        (&s["devices"], &s["contexts"], &s["qps"], &s["cqs"]),
        (&1.into(), &1.into(), &2.into(), &1.into()),
        "{s}"
    );
    assert_eq!(s["device_status"][0]["name"], "sv-json", "{s}");
    assert!(s["limits"].as_array().is_some_and(|l| !l.is_empty()), "{s}");

    let v = parse(&d.cli(&["devices", "--json"]));
    let devs = v["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 1, "{v}");
    let dev = &devs[0];
    assert_eq!(
        (&dev["index"], &dev["name"]),
        (&0.into(), &"sv-json".into()),
        "{v}"
    );
    // The GUID as `ibv_devices` prints it, and the same one the plain listing shows.
    let guid = dev["node_guid"].as_str().unwrap();
    assert!(
        guid.len() == 16 && u64::from_str_radix(guid, 16).is_ok(),
        "{v}"
    );
    assert!(d.cli(&["devices"]).contains(guid), "{v}");
    let port = &dev["ports"][0];
    assert_eq!(port["port"], 1, "{v}");
    assert_eq!(port["addrs"][0], "127.36.8.1", "{v}");
    // Loopback (MTU 65536) carries IB's largest MTU.
    assert_eq!(port["active_mtu"], 4096, "{v}");
}
