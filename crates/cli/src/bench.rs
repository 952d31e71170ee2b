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
        outln!("{}", serde_json::Value::Array(v));
    } else {
        outln!(
            "{:>7}  {:<32} {:>10} {:>10} {:>14}",
            "clients",
            "operation",
            "median µs",
            "p99 µs",
            "commands/s"
        );
        for (n, op, s) in rows {
            outln!(
                "{n:>7}  {op:<32} {:>10.2} {:>10.2} {:>14.0}",
                s.median_us,
                s.p99_us,
                s.ops_per_sec
            );
        }
    }
    Ok(())
}

// ---- perftest-like benchmarks: `softverbs bench lat|bw` -------------------------------------

pub mod peer;
mod plot;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};

use serde_json::{json, Value};

/// Latency (ping-pong) or bandwidth (pipelined).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Lat,
    Bw,
}

/// The operation measured.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// SEND to a posted receive.
    Send,
    /// RDMA WRITE into the peer's memory.
    Write,
    /// RDMA READ from the peer's memory.
    Read,
}

/// The QP type.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Reliable connected.
    Rc,
    /// Unreliable datagram (SEND only, messages up to the path MTU).
    Ud,
    /// XRC: an XRC send QP into an XRC SRQ behind the peer's XRC receive QP.
    Xrc,
}

fn name<T: clap::ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_string())
}

/// How a bench peer registers its buffer.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Memory the library allocates as a memfd from birth (`Pd::alloc_mr`).
    Shared,
    /// The peer's own words turned into shared memory at registration (`Pd::reg_mr_shared`,
    /// the raw path `shared` replaces), for comparison.
    InPlace,
    /// The peer's own words, reached with `process_vm_readv/writev` (`Pd::reg_words`).
    Private,
}

/// Options of `bench lat` and `bench bw`.
#[derive(clap::Args, Clone, Debug)]
pub struct PerfArgs {
    /// The operation.
    #[arg(long, value_enum, default_value = "send")]
    pub op: Op,
    /// The QP type.
    #[arg(long, value_enum, default_value = "rc")]
    pub transport: Transport,
    /// Message sizes in bytes, comma-separated (default 8,64,512,4096,65536).
    #[arg(long, value_delimiter = ',', conflicts_with = "all_sizes")]
    pub sizes: Vec<usize>,
    /// Every power of two from 8 B to 1 MiB.
    #[arg(long)]
    pub all_sizes: bool,
    /// Timed iterations per size (after a warm-up of a tenth of them, 5 to 200); sizes above
    /// 64 KiB use N·64 KiB/size, at least 20. Default: 1000 (lat), 2000 (bw).
    #[arg(long)]
    pub iters: Option<usize>,
    /// Bandwidth: requests kept outstanding.
    #[arg(long, default_value_t = 32)]
    pub window: usize,
    /// Bandwidth: one signaled request in N (perftest's --cq-mod; the last is always signaled).
    #[arg(long, default_value_t = 1)]
    pub cq_mod: usize,
    /// Run server and client on two daemons (fresh sockets, UDP 4791 on two loopback
    /// addresses) instead of two contexts on one daemon.
    #[arg(long)]
    pub two_daemons: bool,
    /// How the peers register their buffers: `shared` has the library allocate them as
    /// shared memory (`alloc_mr`), so the daemon copies without a system call; `in-place`
    /// turns the peer's own pages into shared memory (`reg_mr_shared`, the raw path);
    /// `private` keeps ordinary pages, reached with `process_vm_readv/writev`
    /// (docs/design/registered-memory.md).
    #[arg(long, value_enum, default_value = "shared")]
    pub memory: Memory,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write an SVG plot of the results to FILE.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

/// One measured size.
#[derive(Clone, Debug)]
pub struct Row {
    pub mode: Mode,
    pub op: Op,
    pub transport: Transport,
    pub daemons: u32,
    pub size: usize,
    pub iters: usize,
    pub median_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub mb_s: f64,
    pub msg_s: f64,
    /// UD bandwidth: messages the receiver got of those sent (warm-up included).
    pub delivered: Option<(usize, usize)>,
    /// Two daemons: UDP datagrams the kernel dropped (receive buffer full) during the run.
    pub udp_drops: Option<u64>,
}

/// Which data path the peers use, as far as the environment decides it.
fn data_path() -> &'static str {
    if std::env::var_os("SOFTVERBS_RINGS").is_some_and(|v| v == "0") {
        "command (SOFTVERBS_RINGS=0: one daemon round trip per post and per poll)"
    } else {
        "default (shared-memory rings when client and daemon have them, else commands)"
    }
}

/// The host's `Udp: RcvbufErrors` count (`/proc/net/snmp`).
fn udp_rcvbuf_errors() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let i = names.split_whitespace().position(|n| n == "RcvbufErrors")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

impl Row {
    fn json(&self) -> Value {
        json!({
            "mode": name(self.mode), "op": name(self.op), "transport": name(self.transport),
            "daemons": self.daemons, "size": self.size, "iters": self.iters,
            "median_us": self.median_us, "p99_us": self.p99_us,
            "mb_s": self.mb_s, "msg_s": self.msg_s,
            "received": self.delivered.map(|d| d.0), "sent": self.delivered.map(|d| d.1),
            "udp_rcvbuf_drops": self.udp_drops,
        })
    }

    fn from_json(v: &Value) -> Option<Row> {
        let parse = |k: &str| v[k].as_str().map(str::to_string);
        let mode = <Mode as clap::ValueEnum>::from_str(&parse("mode")?, true).ok()?;
        let op = <Op as clap::ValueEnum>::from_str(&parse("op")?, true).ok()?;
        let transport =
            <Transport as clap::ValueEnum>::from_str(&parse("transport")?, true).ok()?;
        Some(Row {
            mode,
            op,
            transport,
            daemons: v["daemons"].as_u64()? as u32,
            size: v["size"].as_u64()? as usize,
            iters: v["iters"].as_u64()? as usize,
            median_us: v["median_us"].as_f64(),
            p99_us: v["p99_us"].as_f64(),
            mb_s: v["mb_s"].as_f64()?,
            msg_s: v["msg_s"].as_f64()?,
            delivered: None,
            udp_drops: None,
        })
    }
}

const STEP: Duration = Duration::from_secs(30);
const RUN_LIMIT: Duration = Duration::from_secs(600);

/// A child process speaking the line protocol of [`peer`].
struct Proc {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Proc {
    fn spawn(what: &str, mut cmd: Command) -> Result<Proc, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn {what}: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Ok(Proc {
            what: what.to_string(),
            child,
            stdin,
            lines: rx,
        })
    }

    /// The next line, which must start with `prefix`; returns the rest.
    fn expect(&self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let line = self.lines.recv_timeout(timeout).map_err(|_| {
            format!(
                "the {} said nothing within {timeout:?} (expected {prefix})",
                self.what
            )
        })?;
        match line.strip_prefix(prefix) {
            Some(rest) => Ok(rest.trim_start().to_string()),
            None => Err(format!(
                "the {} said {line:?}, expected {prefix}",
                self.what
            )),
        }
    }

    fn tell(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("tell the {}: {e}", self.what))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // QUIT has been said when things went well; give the child a moment, then kill it.
        drop(self.stdin.take());
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A daemon this bench started (killed and its directory removed on drop).
struct OwnDaemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for OwnDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory removed on drop unless [`keep`](TempDir::keep) was called.
struct TempDir(PathBuf, std::cell::Cell<bool>);

impl TempDir {
    fn keep(&self) {
        self.1.set(true);
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.1.get() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn start_daemon(exe: &Path, dir: &Path, tag: &str, ip: &str) -> Result<OwnDaemon, String> {
    let socket = dir.join(format!("{tag}.sock"));
    let log = std::fs::File::create(dir.join(format!("{tag}.log"))).map_err(|e| e.to_string())?;
    let child = Command::new(exe)
        .arg("daemon")
        .arg("--socket")
        .arg(&socket)
        .arg("--device")
        .arg(format!("bench-{tag}={ip}"))
        .env("SOFTVERBS_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("spawn daemon: {e}"))?;
    let mut d = OwnDaemon { child, socket };
    let end = Instant::now() + Duration::from_secs(10);
    while softverbs::connect_socket_with(&d.socket, false).is_err() {
        if let Ok(Some(st)) = d.child.try_wait() {
            let log = std::fs::read_to_string(dir.join(format!("{tag}.log"))).unwrap_or_default();
            return Err(format!("daemon on {ip} exited ({st}): {}", log.trim()));
        }
        if Instant::now() > end {
            return Err(format!("daemon on {ip} did not come up"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(d)
}

fn default_sizes(a: &PerfArgs) -> Vec<usize> {
    if a.all_sizes {
        (3..=20).map(|s| 1usize << s).collect()
    } else if a.sizes.is_empty() {
        vec![8, 64, 512, 4096, 65536]
    } else {
        a.sizes.clone()
    }
}

/// Iterations at `size`: the base count up to 64 KiB, then proportionally fewer.
fn iters_at(base: usize, size: usize) -> usize {
    if size <= 1 << 16 {
        base
    } else {
        (base * (1 << 16) / size).max(20).min(base)
    }
}

/// `softverbs bench lat|bw`: starts a server and a client peer (and with `--two-daemons` two
/// daemons), runs every size, and prints the table (or JSON) and the plot.
pub fn perf(socket: &Path, mode: Mode, a: &PerfArgs) -> Result<(), String> {
    let sizes = default_sizes(a);
    if let Some(bad) = sizes.iter().find(|&&s| s < 8 || s % 8 != 0 || s > 1 << 30) {
        return Err(format!(
            "size {bad}: sizes are multiples of 8 from 8 B to 1 GiB"
        ));
    }
    if a.transport == Transport::Ud && a.op != Op::Send {
        return Err("UD carries only SEND".into());
    }
    if a.window == 0 || a.window > 128 {
        return Err("--window is 1 to 128".into());
    }
    let base_iters = a.iters.unwrap_or(match mode {
        Mode::Lat => 1000,
        Mode::Bw => 2000,
    });
    if base_iters == 0 {
        return Err("--iters must be positive".into());
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;

    // Daemons: two of our own, or the one at --socket (started if none answers).
    let mut _dir = None;
    let mut own = Vec::new();
    let (server_sock, client_sock) = if a.two_daemons {
        // A fresh directory of this user's own (docs/design/security.md, "Paths").
        let dir = softverbs_ipc::private_dir::user_dir()
            .and_then(|d| softverbs_ipc::private_dir::fresh(&d, "bench"))
            .map_err(|e| format!("the daemons' directory: {e}"))?;
        let dir = TempDir(dir, std::cell::Cell::new(false));
        // Two loopback addresses of our own (the whole 127/8 is loopback on Linux).
        let pid = std::process::id();
        let net = format!("127.{}.{}", 100 + pid % 100, 1 + (pid / 100) % 250);
        own.push(start_daemon(&exe, &dir.0, "a", &format!("{net}.1"))?);
        own.push(start_daemon(&exe, &dir.0, "b", &format!("{net}.2"))?);
        _dir = Some(dir);
        (own[0].socket.clone(), own[1].socket.clone())
    } else {
        softverbs::Introspect::connect_at(socket)
            .map_err(|e| format!("daemon at {}: {e}", socket.display()))?;
        (socket.to_path_buf(), socket.to_path_buf())
    };

    let max_size = *sizes.iter().max().expect("sizes");
    let peer = |role: &str, sock: &Path| -> Result<Proc, String> {
        let mut cmd = Command::new(&exe);
        cmd.arg("--socket")
            .arg(sock)
            .arg("bench-peer")
            .args(["--role", role, "--mode", &name(mode), "--op", &name(a.op)])
            .args(["--transport", &name(a.transport)])
            .args([
                "--max-size",
                &max_size.to_string(),
                "--window",
                &a.window.to_string(),
                "--cq-mod",
                &a.cq_mod.to_string(),
                "--memory",
                &name(a.memory),
            ])
            .env("SOFTVERBS_AUTOSTART", "0");
        Proc::spawn(role, cmd)
    };
    let mut server = peer("server", &server_sock)?;
    let mut client = peer("client", &client_sock)?;
    let si = server.expect("INFO", STEP)?;
    let ci = client.expect("INFO", STEP)?;
    server.tell(&format!("PEER {ci}"))?;
    client.tell(&format!("PEER {si}"))?;
    server.expect("READY", STEP)?;
    client.expect("READY", STEP)?;

    let mut notes = Vec::new();
    let mut run_sizes = sizes.clone();
    if a.transport == Transport::Ud {
        let mtu = |s: &str| -> usize {
            serde_json::from_str::<Value>(s)
                .ok()
                .and_then(|v| v["mtu"].as_u64())
                .and_then(|m| softverbs::Mtu::from_raw(m as u32))
                .map_or(1024, |m| m.bytes() as usize)
        };
        let limit = mtu(&si).min(mtu(&ci));
        let skipped: Vec<_> = run_sizes
            .iter()
            .filter(|&&s| s > limit)
            .map(|s| s.to_string())
            .collect();
        if !skipped.is_empty() {
            notes.push(format!(
                "UD messages are at most the path MTU ({limit} B): skipped {} B",
                skipped.join(", ")
            ));
        }
        run_sizes.retain(|&s| s <= limit);
    }

    let daemons = if a.two_daemons { 2 } else { 1 };
    let mut rows = Vec::new();
    for (id, &size) in run_sizes.iter().enumerate() {
        let iters = iters_at(base_iters, size);
        let drops_before = udp_rcvbuf_errors();
        let cmd = format!("RUN {} {size} {iters}", id + 1);
        server.tell(&cmd)?;
        server.expect("GO", STEP)?;
        client.tell(&cmd)?;
        let at = |e: String| {
            let logs = _dir.as_ref().map_or(String::new(), |d: &TempDir| {
                d.keep();
                format!(" (daemon logs in {})", d.0.display())
            });
            format!(
                "{} {} at {size} B: {e}{logs}",
                name(a.op),
                name(a.transport)
            )
        };
        let r: Value = serde_json::from_str(&client.expect("RESULT", RUN_LIMIT).map_err(at)?)
            .map_err(|e| format!("client RESULT: {e}"))?;
        server.tell("STOP")?;
        let d: Value = serde_json::from_str(&server.expect("DONE", STEP).map_err(at)?)
            .map_err(|e| format!("server DONE: {e}"))?;
        let mut row = Row {
            mode,
            op: a.op,
            transport: a.transport,
            daemons,
            size,
            iters,
            median_us: r["median_us"].as_f64(),
            p99_us: r["p99_us"].as_f64(),
            mb_s: r["mb_s"].as_f64().unwrap_or(0.0),
            msg_s: r["msg_s"].as_f64().unwrap_or(0.0),
            delivered: None,
            udp_drops: None,
        };
        if a.two_daemons {
            row.udp_drops = drops_before
                .zip(udp_rcvbuf_errors())
                .map(|(b, a)| a.saturating_sub(b));
            if let Some(n) = row.udp_drops.filter(|&n| n > 0) {
                notes.push(format!(
                    "{size} B: the kernel dropped {n} UDP datagrams for want of receive buffer (host-wide count)"
                ));
            }
        }
        if mode == Mode::Bw && a.transport == Transport::Ud && a.op == Op::Send {
            // Unreliable: count only what arrived.
            let got = d["received"].as_u64().unwrap_or(0) as usize;
            let sent = d["expected"].as_u64().unwrap_or(0) as usize;
            let frac = if sent == 0 {
                0.0
            } else {
                got.min(sent) as f64 / sent as f64
            };
            row.mb_s *= frac;
            row.msg_s *= frac;
            row.delivered = Some((got, sent));
            if got < sent {
                notes.push(format!(
                    "UD {size} B: {got} of {sent} messages arrived; rates count those"
                ));
            }
        }
        rows.push(row);
    }
    server.tell("QUIT")?;
    client.tell("QUIT")?;
    drop((server, client));
    drop(own);

    if a.json {
        let v = json!({
            "bench": name(mode),
            "data_path": data_path(),
            "memory": name(a.memory),
            "daemons": daemons,
            "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
            "notes": notes,
        });
        outln!("{v}");
    } else {
        print_table(&rows);
        for n in &notes {
            outln!("note: {n}");
        }
        if mode == Mode::Lat {
            outln!(
                "latency is one-way (half the ping-pong round trip){}",
                if a.op == Op::Read {
                    "; READ is the whole read round trip, as ib_read_lat"
                } else {
                    ""
                }
            );
        }
    }
    if let Some(path) = &a.plot {
        std::fs::write(path, plot::svg(&rows)).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn print_table(rows: &[Row]) {
    outln!(
        "{:<5} {:<9} {:>9} {:>10} {:>10} {:>10} {:>11}",
        "op",
        "transport",
        "size",
        "median µs",
        "p99 µs",
        "MB/s",
        "msg/s"
    );
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for r in rows {
        let tr = format!(
            "{}{}",
            name(r.transport),
            if r.daemons == 2 { "/2d" } else { "" }
        );
        outln!(
            "{:<5} {:<9} {:>9} {:>10} {:>10} {:>10.1} {:>11.0}",
            name(r.op),
            tr,
            human_size(r.size),
            opt(r.median_us),
            opt(r.p99_us),
            r.mb_s,
            r.msg_s
        );
    }
}

pub(crate) fn human_size(s: usize) -> String {
    if s >= 1 << 20 && s % (1 << 20) == 0 {
        format!("{} MiB", s >> 20)
    } else if s >= 1024 && s % 1024 == 0 {
        format!("{} KiB", s >> 10)
    } else {
        format!("{s} B")
    }
}

/// `softverbs bench plot`: one SVG from the `--json` outputs of several runs.
pub fn plot_files(inputs: &[PathBuf], out: &Path) -> Result<(), String> {
    let mut rows = Vec::new();
    for p in inputs {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
        let list = v["rows"]
            .as_array()
            .ok_or(format!("{}: no rows", p.display()))?;
        rows.extend(list.iter().filter_map(Row::from_json));
    }
    std::fs::write(out, plot::svg(&rows)).map_err(|e| format!("{}: {e}", out.display()))
}
