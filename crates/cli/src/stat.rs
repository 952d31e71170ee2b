//! `softverbs stat` and the daemon's `--metrics` endpoint (docs/guide/counters.md): the
//! port and QP counters the daemon reports in its `resources` snapshot (`counters`), shown
//! as `rdma statistic` shows a NIC's, as one JSON object, or as Prometheus text.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

/// The keys of a counters row that name it rather than count something.
const LABELS: &[&str] = &["device", "port", "qpn", "path"];

/// The `stat --json` object: `schema`, `ports` and `qps`, cut to `qp` and `device` when given.
pub fn select(resources: &Value, qp: Option<u32>, device: Option<&str>) -> Value {
    let rows = |k: &str| -> Vec<Value> {
        resources["counters"][k]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| device.is_none_or(|d| r["device"].as_str() == Some(d)))
            .filter(|r| qp.is_none_or(|q| k != "qps" || r["qpn"].as_u64() == Some(q.into())))
            .collect()
    };
    // A QP asked for by number shows that QP alone, not the ports.
    let ports = if qp.is_some() {
        Vec::new()
    } else {
        rows("ports")
    };
    json!({ "schema": 1, "ports": ports, "qps": rows("qps") })
}

/// The counters of a row: the engine's in their table's order
/// (`softverbs_transport::Counters::NAMES`), then any other (the port's `rx_icrc_errors`, or
/// what a newer daemon adds) by name; labels left out.
fn counts(row: &Value) -> Vec<(String, u64)> {
    let Some(m) = row.as_object() else {
        return Vec::new();
    };
    let names = softverbs_transport::Counters::NAMES;
    let known = names
        .iter()
        .filter_map(|n| Some((n.to_string(), m.get(*n)?.as_u64()?)));
    let rest = m
        .iter()
        .filter(|(k, _)| !LABELS.contains(&k.as_str()) && !names.contains(&k.as_str()))
        .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)));
    known.chain(rest).collect()
}

/// `rdma statistic`'s shape: one line per port (`link DEV/PORT name value ...`), then one per
/// QP (`link DEV/PORT qpn N path P name value ...`).
pub fn render(stat: &Value) -> String {
    let mut out = String::new();
    let link = |r: &Value| {
        format!(
            "link {}/{}",
            r["device"].as_str().unwrap_or("?"),
            r["port"].as_u64().unwrap_or(1)
        )
    };
    for (k, r) in ["ports", "qps"].iter().flat_map(|k| {
        stat[*k]
            .as_array()
            .into_iter()
            .flatten()
            .map(move |r| (*k, r))
    }) {
        out.push_str(&link(r));
        if k == "qps" {
            out.push_str(&format!(
                " qpn {} path {}",
                r["qpn"],
                r["path"].as_str().unwrap_or("?")
            ));
        }
        for (name, v) in counts(r) {
            out.push_str(&format!(" {name} {v}"));
        }
        out.push('\n');
    }
    out
}

/// The Prometheus text exposition (format 0.0.4) of the same rows: one counter family per
/// port counter (`softverbs_port_<name>{device,port}`) and per QP counter
/// (`softverbs_qp_<name>{device,port,qpn,path}`), named as `stat` names them.
pub fn prometheus(stat: &Value) -> String {
    let mut out = String::new();
    for (kind, labels) in [("port", &["device", "port"][..]), ("qp", LABELS)] {
        let rows: Vec<&Value> = stat[format!("{kind}s")]
            .as_array()
            .into_iter()
            .flatten()
            .collect();
        let Some(first) = rows.first() else { continue };
        for (name, _) in counts(first) {
            out.push_str(&format!("# TYPE softverbs_{kind}_{name} counter\n"));
            for r in &rows {
                let l: Vec<String> = labels
                    .iter()
                    .map(|k| {
                        let v = match &r[*k] {
                            Value::String(s) => s.clone(),
                            v => v.to_string(),
                        };
                        // Label values are escaped as the exposition format asks.
                        let v = v
                            .replace('\\', "\\\\")
                            .replace('"', "\\\"")
                            .replace('\n', "\\n");
                        format!("{k}=\"{v}\"")
                    })
                    .collect();
                let v = r[name.as_str()].as_u64().unwrap_or(0);
                out.push_str(&format!("softverbs_{kind}_{name}{{{}}} {v}\n", l.join(",")));
            }
        }
    }
    out
}

/// The daemon's counters, read as `softverbs stat` reads them.
fn snapshot(socket: &Path) -> Result<Value, String> {
    let i = softverbs::Introspect::connect_running(socket).map_err(|e| e.to_string())?;
    let text = i.resources_json().map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Ok(select(&v, None, None))
}

/// Largest request head read; a scraper's GET is a few hundred bytes.
const MAX_HEAD: usize = 8192;

/// Binds `addr` (only it: an address the operator chose, `--metrics`) and serves the
/// counters of the daemon at `socket` there from a thread of its own, one connection at a
/// time. A bind error is returned at start.
///
/// A hand-written responder rather than an HTTP crate: it answers one kind of request (a
/// GET with no body) with one small text and closes, which is a few dozen lines, where
/// hyper, axum or tiny_http would bring an HTTP stack (and for the first two an async
/// runtime) into the daemon for it. Its reads are bounded in size and time, so a client
/// that sends nothing or too much holds it for at most the timeout.
pub fn serve_metrics(addr: std::net::SocketAddr, socket: PathBuf) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if let Err(e) = answer(conn, &socket) {
                    tracing::debug!("metrics request: {e}");
                }
            }
        })?;
    Ok(())
}

fn answer(mut conn: TcpStream, socket: &Path) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return respond(&mut conn, "400 Bad Request", "bad request\n");
        }
        head.extend_from_slice(&buf[..n]);
    }
    // RFC 9112 §3: request-line = method SP request-target SP HTTP-version.
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next(), parts.next());
    if method != Some(b"GET") {
        return respond(&mut conn, "405 Method Not Allowed", "GET only\n");
    }
    if !matches!(target, Some(b"/metrics") | Some(b"/")) {
        return respond(&mut conn, "404 Not Found", "see /metrics\n");
    }
    match snapshot(socket) {
        Ok(v) => respond(&mut conn, "200 OK", &prometheus(&v)),
        Err(e) => respond(&mut conn, "503 Service Unavailable", &format!("{e}\n")),
    }
}

fn respond(conn: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}
