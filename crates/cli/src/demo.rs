//! The main job: the seed thread's story, told with real processes.
//!
//! A creator process makes an XRC receive QP in a domain shared through a file; N workers join
//! it (through the legacy, minimal and upstream faces in turn); the creator is killed with
//! SIGKILL; the QP lives on with N holders; an event raised on it reaches all N and nobody
//! else; the workers leave one by one and the QP disappears with the last; the domain
//! disappears with its last user. Every step is checked against the daemon's own view
//! (`resources`), and any surprise makes the demo exit non-zero.
//!
//! And data flows through it: each worker has its own XRC SRQ in the domain, and a sender on
//! a second daemon (its own device on another loopback address, 127.0.0.2 unless told
//! otherwise: any 127/8 address is this host's loopback, so no root is needed) streams
//! messages over RoCE v2 through the shared receive QP into the workers' SRQs. When another
//! daemon holds 127.0.0.2 (a second demo running at the same time), the second daemon takes
//! another loopback address of its own ([`remote_addresses`]). The creator is killed in the middle of the stream; the stream goes on, and every
//! worker must have received exactly its messages, once each, intact (`crate::stream`).

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use softverbs::{Context, Introspect};
use softverbs_core::resources::Resources;
use softverbs_core::types::EventType;
use softverbs_core::HolderKind;

use crate::actor::Face;
use crate::stream;
use crate::table;

const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages sent before the creator is killed, and again after its death is complete (the
/// stream also runs, paced, while it dies).
const HALF: u64 = 150;

/// The second daemon's address when none is given.
const REMOTE_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// The addresses the second daemon tries, in order: `given` alone, else [`REMOTE_IP`] and
/// then loopback addresses derived from this run's fresh directory (so two demos at once,
/// of one user or of two, try different ones; bind(2) settles which is free).
fn remote_addresses(given: Option<IpAddr>, dir: &Path) -> Vec<IpAddr> {
    match given {
        Some(ip) => vec![ip],
        None => std::iter::once(REMOTE_IP)
            .chain(
                softverbs_daemon::config::own_addresses(rustix::process::geteuid().as_raw(), dir)
                    .into_iter()
                    .skip(1),
            )
            .collect(),
    }
}

/// The second daemon, the sender's, run for the demo and killed with it.
struct RemoteDaemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    /// Its device's address.
    ip: IpAddr,
}

impl RemoteDaemon {
    /// The second daemon on the first of `ips` that no other daemon holds.
    fn start_any(dir: &Path, ips: &[IpAddr]) -> Result<RemoteDaemon, String> {
        let mut last = String::from("no address to try");
        for (k, ip) in ips.iter().enumerate() {
            match RemoteDaemon::start(dir, *ip, k) {
                Ok(d) => return Ok(d),
                // Another daemon's address (bind(2): EADDRINUSE): try the next one.
                Err(e) if e.contains("EADDRINUSE") => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    fn start(dir: &Path, ip: IpAddr, attempt: usize) -> Result<RemoteDaemon, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let socket = dir.join(format!("remote-{attempt}.sock"));
        let log = dir.join(format!("remote-daemon-{attempt}.log"));
        let err = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(exe)
            .arg("--socket")
            .arg(&socket)
            .args(["daemon", "--device", &format!("softverbs-remote={ip}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn the second daemon: {e}"))?;
        let mut d = RemoteDaemon {
            child,
            socket,
            log,
            ip,
        };
        let deadline = Instant::now() + STEP_TIMEOUT;
        while !d.socket.exists() {
            if let Ok(Some(st)) = d.child.try_wait() {
                return Err(format!("the second daemon exited ({st}): {}", d.log_tail()));
            }
            if Instant::now() > deadline {
                return Err(format!("the second daemon did not start: {}", d.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for RemoteDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn field<'a>(line: &'a str, key: &str) -> Result<&'a str, String> {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(key))
        .ok_or_else(|| format!("no {key} in {line:?}"))
}

fn number<T: std::str::FromStr>(line: &str, key: &str) -> Result<T, String> {
    field(line, key)?
        .parse()
        .map_err(|_| format!("bad {key} in {line:?}"))
}

struct Actor {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Actor {
    fn spawn(name: &str, socket: &Path, args: &[String]) -> Result<Actor, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut child = Command::new(exe)
            .arg("--socket")
            .arg(socket)
            .arg("demo-actor")
            .args(args)
            .env("SOFTVERBS_AUTOSTART", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn {name}: {e}"))?;
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
        Ok(Actor {
            name: name.to_string(),
            child,
            stdin,
            lines: rx,
        })
    }

    fn expect(&self, prefix: &str) -> Result<String, String> {
        let line = self.lines.recv_timeout(STEP_TIMEOUT).map_err(|_| {
            format!(
                "{} (pid {}) said nothing within {STEP_TIMEOUT:?}",
                self.name,
                self.child.id()
            )
        })?;
        if line.starts_with("ERROR") || !line.starts_with(prefix) {
            return Err(format!(
                "{} (pid {}) said {line:?}, expected {prefix}…",
                self.name,
                self.child.id()
            ));
        }
        Ok(line)
    }

    fn tell(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("tell {}: {e}", self.name))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Actor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Story {
    socket: PathBuf,
    /// The second daemon's device address, if given.
    remote_ip: Option<IpAddr>,
    start: Instant,
    introspect: Introspect,
}

impl Story {
    fn say(&self, what: &str) {
        outln!(
            "[{:>7.1} ms] {what}",
            self.start.elapsed().as_secs_f64() * 1e3
        );
    }

    fn resources(&self) -> Result<Resources, String> {
        let json = self
            .introspect
            .resources_json()
            .map_err(|e| format!("resources: {e}"))?;
        serde_json::from_str(&json).map_err(|e| format!("resources JSON: {e}"))
    }

    fn show(&self) -> Result<Resources, String> {
        let r = self.resources()?;
        for line in table::render(&r).lines() {
            outln!("             | {line}");
        }
        Ok(r)
    }

    /// Polls the daemon's view until `cond` holds (the daemon learns of a death
    /// asynchronously), or fails with `what`.
    fn wait_for(&self, what: &str, cond: impl Fn(&Resources) -> bool) -> Result<Resources, String> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let r = self.resources()?;
            if cond(&r) {
                return Ok(r);
            }
            if Instant::now() > deadline {
                return Err(format!("timed out waiting until {what}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn holders_of(r: &Resources, qpn: u32) -> Option<Vec<(u32, HolderKind)>> {
    r.xrc_recv_qps
        .iter()
        .find(|t| t.qpn == qpn)
        .map(|t| t.holders.iter().map(|h| (h.pid, h.kind)).collect())
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("check failed: {what}"))
    }
}

/// Runs the demo with `workers` workers against the daemon at `socket` (started if needed).
pub fn run(socket: &Path, workers: usize, remote_ip: Option<IpAddr>) -> Result<(), String> {
    if workers == 0 {
        return Err("need at least one worker".into());
    }
    let start = Instant::now();
    // Connecting starts the daemon if none answers.
    let introspect = crate::autostart::connect(socket)?;
    let story = Story {
        socket: socket.to_path_buf(),
        start,
        introspect,
        remote_ip,
    };
    let status = story
        .introspect
        .status()
        .map_err(|e| format!("status: {e}"))?;
    story.say(&format!(
        "daemon pid {} on {} (ABI {})",
        status.daemon_pid,
        socket.display(),
        status.abi_version
    ));

    // A fresh directory of this user's own, never a guessable name in a shared /tmp
    // (docs/design/security.md, "Paths").
    let dir = softverbs_ipc::private_dir::user_dir()
        .and_then(|d| softverbs_ipc::private_dir::fresh(&d, "demo"))
        .map_err(|e| format!("the demo's directory: {e}"))?;
    let file = dir.join("xrc-domain");
    std::fs::write(&file, b"").map_err(|e| format!("{}: {e}", file.display()))?;
    let result = story_steps(&story, &file, &dir, workers);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn story_steps(story: &Story, file: &Path, dir: &Path, workers: usize) -> Result<(), String> {
    let inode = std::fs::metadata(file)
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .map_err(|e| e.to_string())?;
    let fs = file.display().to_string();

    // 1. The creator.
    let mut creator = Actor::spawn(
        "creator",
        &story.socket,
        &["creator".into(), "--file".into(), fs.clone()],
    )?;
    let line = creator.expect("QPN ")?;
    let qpn: u32 = line[4..]
        .trim()
        .parse()
        .map_err(|_| format!("bad QPN line {line:?}"))?;
    story.say(&format!(
        "creator pid {} opened the domain of {} (inode {inode}) and created XRC receive QP {qpn:#08x} (legacy ibv_create_xrc_rcv_qp)",
        creator.pid(),
        fs
    ));
    let r = story.show()?;
    check(
        holders_of(&r, qpn) == Some(vec![(creator.pid(), HolderKind::Creator)]),
        "the creator is the only holder",
    )?;

    // 2. Workers join, through the three faces in turn.
    let faces = [Face::Legacy, Face::Minimal, Face::Upstream];
    let mut crew = Vec::new();
    for i in 0..workers {
        let face = faces[i % faces.len()];
        let face_arg = format!("{face:?}").to_lowercase();
        let args = vec![
            "worker".into(),
            "--file".into(),
            fs.clone(),
            "--qpn".into(),
            qpn.to_string(),
            "--face".into(),
            face_arg,
        ];
        let w = Actor::spawn(&format!("worker {}", i + 1), &story.socket, &args)?;
        let joined = w.expect("JOINED ")?;
        let srqn: u32 = number(&joined, "srqn=")?;
        let how = match face {
            Face::Legacy => "ibv_reg_xrc_rcv_qp (legacy)",
            Face::Minimal => "register(xrcd, qpn) (minimal)",
            Face::Upstream => "ibv_open_qp (upstream)",
        };
        story.say(&format!(
            "worker {} pid {} joined with {how}: {}",
            i + 1,
            w.pid(),
            &joined[7..]
        ));
        crew.push((w, face, srqn));
    }
    let r = story.show()?;
    check(
        holders_of(&r, qpn).map(|h| h.len()) == Some(workers + 1),
        "every worker holds the QP",
    )?;

    // 3. A sender on a second daemon, connected to the receive QP.
    let remote = RemoteDaemon::start_any(dir, &remote_addresses(story.remote_ip, dir))?;
    let mut sender = Actor::spawn("sender", &remote.socket, &["sender".into()])?;
    let ready = sender.expect("READY ")?;
    let (send_qpn, send_gid): (u32, String) =
        (number(&ready, "qpn=")?, field(&ready, "gid=")?.to_string());
    let local_gid = Context::open_at(&story.socket, 0)
        .and_then(|c| c.query_gid(1, 0))
        .map_err(|e| format!("query_gid: {e}"))?;
    creator.tell(&format!("CONNECT {send_gid} {send_qpn}"))?;
    creator.expect("CONNECTED")?;
    sender.tell(&format!("CONNECT {} {qpn}", stream::gid_hex(local_gid)))?;
    sender.expect("CONNECTED")?;
    story.say(&format!(
        "sender pid {} on a second daemon (pid {}, device softverbs-remote at {}) connected its XRC send QP {send_qpn:#08x} to receive QP {qpn:#08x}; the creator moved the receive QP to RTR",
        sender.pid(),
        remote.child.id(),
        remote.ip
    ));

    // 4. Stream; SIGKILL the creator in the middle of it.
    let srqns: Vec<String> = crew.iter().map(|(_, _, n)| n.to_string()).collect();
    sender.tell(&format!("STREAM {HALF} {}", srqns.join(",")))?;
    sender.expect("MID ").map_err(|e| {
        format!(
            "{e}: no message got through (the daemon at {} must reach {} over UDP: not --no-network; the second daemon said: {})",
            story.socket.display(),
            remote.ip,
            remote.log_tail()
        )
    })?;
    story.say(&format!(
        "the sender streams {}-byte messages over RoCE v2 through receive QP {qpn:#08x} into the {workers} workers' XRC SRQs ({}); {HALF} acknowledged, still streaming",
        stream::MSG,
        srqns.join(", ")
    ));
    let creator_pid = creator.pid();
    drop(creator); // Drop sends SIGKILL and reaps it.
    story.say(&format!(
        "creator pid {creator_pid} killed with SIGKILL mid-stream"
    ));
    let r = story.wait_for("the daemon has torn the creator's context down", |r| {
        r.contexts.iter().all(|c| c.pid != creator_pid)
    })?;
    let holders = holders_of(&r, qpn).ok_or("the receive QP died with its creator")?;
    story.say(&format!(
        "the QP outlives its creator with {} holders",
        holders.len()
    ));
    story.show()?;
    check(holders.len() == workers, "N holders remain")?;
    check(
        holders.iter().all(|(pid, _)| *pid != creator_pid),
        "the creator holds nothing",
    )?;
    sender.tell("FINISH")?;
    let done = sender.expect("DONE ")?;
    let total: u64 = number(&done, "sent=")?;
    story.say(&format!(
        "the stream went on: {total} messages acknowledged, the last {HALF} sent after the creator's context was gone"
    ));
    let mut lost = Vec::new();
    for (i, (w, _, srqn)) in crew.iter_mut().enumerate() {
        let expected = (0..total)
            .filter(|s| (s % workers as u64) as usize == i)
            .count();
        w.tell(&format!("REPORT {expected}"))?;
        let got = w.expect("GOT ")?;
        let (seqs, bad) = stream::parse_got(&got)?;
        match stream::verdict(&seqs, &bad, i, workers, total) {
            Ok(n) => story.say(&format!(
                "worker {} pid {} received {n} messages in its SRQ {srqn}: none lost, duplicated or corrupt",
                i + 1,
                w.pid()
            )),
            Err(why) => {
                story.say(&format!(
                    "worker {} pid {} received {} messages in its SRQ {srqn}: {why}",
                    i + 1,
                    w.pid(),
                    seqs.len()
                ));
                lost.push(format!("worker {}: {why}", i + 1));
            }
        }
    }
    check(
        lost.is_empty(),
        &format!("every message arrived once, intact ({})", lost.join("; ")),
    )?;
    sender.tell("QUIT")?;
    drop(sender);
    drop(remote);

    // 4. An async event on the QP reaches every holder and nobody else.
    let bystander =
        Context::open_at(&story.socket, 0).map_err(|e| format!("open bystander: {e}"))?;
    let delivered = bystander
        .inject_event(qpn, EventType::PathMig)
        .map_err(|e| format!("inject: {e}"))?;
    story.say(&format!(
        "PATH_MIG raised on QP {qpn:#08x}: the daemon delivered it to {delivered} context(s)"
    ));
    check(
        delivered as usize == workers,
        "the event went to exactly the N holders",
    )?;
    for (i, (w, face, _)) in crew.iter().enumerate() {
        let ev = w.expect("EVENT ")?;
        story.say(&format!(
            "worker {} pid {} got: {}",
            i + 1,
            w.pid(),
            &ev[6..]
        ));
        let by_number = matches!(face, Face::Legacy | Face::Minimal);
        check(ev.contains("PathMig"), "the event type is PATH_MIG")?;
        check(
            if by_number {
                ev.contains(&format!("xrc-qpn={qpn}")) && ev.contains("legacy_type=0x80000006")
            } else {
                ev.contains("qp-handle=")
            },
            "registrations see the QP number with the XRC flag, handles see their handle",
        )?;
    }
    check(
        bystander
            .try_get_async_event()
            .map_err(|e| e.to_string())?
            .is_none(),
        "a non-holder got nothing",
    )?;
    drop(bystander);

    // 5. The workers leave one by one; the QP goes with the last.
    let n = crew.len();
    for (i, (mut w, _, _)) in crew.into_iter().enumerate() {
        w.tell("LEAVE")?;
        let left = w.expect("LEFT ")?;
        let pid = w.pid();
        let _ = w.child.wait();
        let remaining = n - i - 1;
        let r = story.wait_for("the worker's context is gone", |r| {
            r.contexts.iter().all(|c| c.pid != pid)
        })?;
        let holders = holders_of(&r, qpn);
        if remaining > 0 {
            story.say(&format!(
                "worker {} pid {pid} left ({}); {remaining} holder(s) remain",
                i + 1,
                &left[5..]
            ));
            check(
                holders.map(|h| h.len()) == Some(remaining),
                "one holder fewer",
            )?;
        } else {
            story.say(&format!(
                "worker {} pid {pid} left ({}): the last holder is gone, and so is the QP",
                i + 1,
                &left[5..]
            ));
            check(
                holders.is_none(),
                "the QP is destroyed with its last holder",
            )?;
            let domain_gone = r
                .xrcds
                .iter()
                .all(|x| x.file.is_none_or(|f| f.ino != inode));
            story.say("the domain's last user is gone, and so is the domain");
            check(domain_gone, "the domain is destroyed with its last user")?;
        }
    }
    story.show()?;
    story.say(
        "every step behaved: the receive QP followed the lives of the processes that held it, and carried every message",
    );
    Ok(())
}
