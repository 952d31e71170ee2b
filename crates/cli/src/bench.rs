//! `softverbs bench commands`: what a verbs command costs through the daemon — one request
//! and one reply over the Unix socket — from one client and from several at once.

use std::path::Path;
use std::time::{Duration, Instant};

use softverbs::Context;

/// Latency summary of one operation, in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub median_us: f64,
    pub p99_us: f64,
    pub ops_per_sec: f64,
}

fn summarize(mut samples: Vec<Duration>, wall: Duration, ops_per_sample: usize) -> Summary {
    samples.sort_unstable();
    let at =
        |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1e6;
    Summary {
        median_us: at(0.5),
        p99_us: at(0.99),
        ops_per_sec: (samples.len() * ops_per_sample) as f64 / wall.as_secs_f64(),
    }
}

/// One client's loop: `iters` round trips of the cheapest command (`GetAsyncEvent` with none
/// pending, answered `EAGAIN`), and `iters` create+destroy pairs of an XRC receive QP.
fn client(socket: &Path, iters: usize) -> Result<(Vec<Duration>, Vec<Duration>), String> {
    let ctx = Context::open_at(socket, 0).map_err(|e| e.to_string())?;
    let xrcd = ctx
        .open_xrcd(None, softverbs_core::errno::O_CREAT)
        .map_err(|e| e.to_string())?;
    let mut null = Vec::with_capacity(iters);
    let mut pair = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        ctx.try_get_async_event().map_err(|e| e.to_string())?;
        null.push(t.elapsed());
    }
    for _ in 0..iters {
        let t = Instant::now();
        let qp = xrcd.create_recv_qp().map_err(|e| e.to_string())?;
        qp.destroy().map_err(|e| e.to_string())?;
        pair.push(t.elapsed());
    }
    Ok((null, pair))
}

/// Runs the benchmark with `clients` concurrent clients (threads, each its own connection and
/// context, as separate processes would be) and prints a table.
pub fn commands(socket: &Path, clients: usize, iters: usize, json: bool) -> Result<(), String> {
    // Warm up the daemon (and start it if needed).
    client(socket, 100)?;
    let mut rows = Vec::new();
    let mut counts = vec![1usize];
    if clients > 1 {
        counts.push(clients);
    }
    for n in counts {
        let start = Instant::now();
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let s = socket.to_path_buf();
                std::thread::spawn(move || client(&s, iters))
            })
            .collect();
        let mut null = Vec::new();
        let mut pair = Vec::new();
        for h in handles {
            let (a, b) = h.join().map_err(|_| "client thread panicked")??;
            null.extend(a);
            pair.extend(b);
        }
        let wall = start.elapsed();
        // Each client spends about half its time on each phase; rates are per phase.
        rows.push((
            n,
            "null command (get_async_event)",
            summarize(null, wall / 2, 1),
        ));
        rows.push((
            n,
            "create+destroy XRC recv QP",
            summarize(pair, wall / 2, 2),
        ));
    }
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(n, op, s)| {
                serde_json::json!({"clients": n, "op": op, "median_us": s.median_us, "p99_us": s.p99_us, "commands_per_sec": s.ops_per_sec})
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
    } else {
        println!(
            "{:>7}  {:<32} {:>10} {:>10} {:>14}",
            "clients", "operation", "median µs", "p99 µs", "commands/s"
        );
        for (n, op, s) in rows {
            println!(
                "{n:>7}  {op:<32} {:>10.2} {:>10.2} {:>14.0}",
                s.median_us, s.p99_us, s.ops_per_sec
            );
        }
    }
    Ok(())
}
