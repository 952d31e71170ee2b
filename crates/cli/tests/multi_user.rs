//! Every user of a host served (issue 36, item 4; docs/guide/multi-user.md): two uids (root
//! and `nobody`, 65534) and two CI-style jobs of each (own `HOME` and `XDG_RUNTIME_DIR`) on
//! one host, first with no system daemon (every job autostarts a daemon of its own: they must
//! not collide on the RoCE port, and each exits when idle), then with a system daemon at
//! `/run/softverbs/softverbs.sock`, which every job must use whatever its `XDG_RUNTIME_DIR`
//! says. In both, unmodified `ibv_rc_pingpong` pairs run through `softverbs run` between the
//! jobs (a server in one job, its client in another: across daemons, over UDP), and two demos
//! run at once (their second daemons must not collide either).
//!
//! The test needs root (a second uid, a mount namespace) and re-runs itself in a network and
//! mount namespace of its own (`unshare`), with a fresh tmpfs on `/run`: the system daemon it
//! starts is seen by nothing else on the machine, and its RoCE ports collide with no other
//! test's.

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
const NOBODY: u32 = 65534;
/// Set in the re-run inside the namespaces.
const INNER: &str = "SOFTVERBS_MULTI_USER_INNER";
/// The autostarted daemons' idle time in this test (seconds).
const IDLE: &str = "2";
/// A bound against a hang, never a measurement.
const WAIT: Duration = Duration::from_secs(180);

/// One CI-style job: a uid with its own HOME and XDG_RUNTIME_DIR.
struct Job {
    name: &'static str,
    uid: u32,
    home: PathBuf,
    xdg: PathBuf,
}

impl Job {
    fn new(base: &Path, name: &'static str, uid: u32) -> Job {
        let home = base.join(name).join("home");
        let xdg = base.join(name).join("xdg");
        for d in [&home, &xdg] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(d, Some(uid), Some(uid)).unwrap();
        }
        std::os::unix::fs::chown(base.join(name), Some(uid), Some(uid)).unwrap();
        Job {
            name,
            uid,
            home,
            xdg,
        }
    }

    /// `softverbs ARGS` as this job: its uid, HOME and XDG_RUNTIME_DIR, no socket named.
    fn softverbs(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .current_dir(&self.home)
            .env("HOME", &self.home)
            .env("XDG_RUNTIME_DIR", &self.xdg)
            .env("SOFTVERBS_IDLE_EXIT", IDLE)
            .env("SOFTVERBS_DAEMON_BIN", BIN)
            .env_remove("SOFTVERBS_SOCKET")
            .env_remove("SOFTVERBS_AUTOSTART")
            .env_remove("SOFTVERBS_LIBIBVERBS")
            .env_remove("SOFTVERBS_LIBRDMACM")
            .env_remove("LD_LIBRARY_PATH")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if self.uid != 0 {
            c.uid(self.uid).gid(self.uid);
        }
        c
    }

    /// This job's own daemon's socket and log.
    fn own_socket(&self) -> PathBuf {
        self.xdg.join("softverbs").join("softverbs.sock")
    }

    fn own_log(&self) -> String {
        std::fs::read_to_string(self.xdg.join("softverbs").join("daemon.log")).unwrap_or_default()
    }
}

/// Waits for `child` with [`WAIT`] as the bound; its status, stdout and stderr.
fn finish(what: &str, mut child: Child) -> (bool, String, String) {
    let deadline = Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = child.wait().unwrap();
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    eprintln!("--- {what}: {st}\n{out}{err}");
    (st.success(), out, err)
}

/// Whether a TCP socket listens on `port` (in this network namespace).
fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3
                    && cols[3] == "0A"
                    && cols[1].rsplit(':').next() == Some(&format!("{port:04X}"))
            })
    })
}

/// `softverbs run -- ibv_rc_pingpong` on TCP port `port` for `iters` round trips (the
/// server's arguments; the client adds the server's host).
fn pingpong_args<'a>(port: &'a str, iters: &'a str) -> [&'a str; 9] {
    [
        "run",
        "--",
        "ibv_rc_pingpong",
        "-g",
        "0",
        "-n",
        iters,
        "-p",
        port,
    ]
}

/// Waits (bounded) until an `ibv_rc_pingpong` server listens on TCP `port`.
fn wait_listening(port: u16) {
    let deadline = Instant::now() + WAIT;
    while !listening(port) {
        assert!(Instant::now() < deadline, "the server never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An `ibv_rc_pingpong` server in `server`'s job and its client in `client`'s, both through
/// `softverbs run`; both must end successfully.
fn pingpong(server: &Job, client: &Job, port: u16) {
    let p = port.to_string();
    let args = pingpong_args(&p, "100");
    let s = server.softverbs(&args).spawn().unwrap();
    wait_listening(port);
    let mut cargs = args.to_vec();
    cargs.push("localhost");
    let c = client.softverbs(&cargs).spawn().unwrap();
    let what = format!("pingpong {} -> {}", client.name, server.name);
    let (cok, cout, cerr) = finish(&format!("{what} (client)"), c);
    let (sok, sout, serr) = finish(&format!("{what} (server)"), s);
    assert!(
        cok && sok,
        "{what}: client {cout}{cerr}\nserver {sout}{serr}"
    );
    for out in [&cout, &sout] {
        assert!(out.contains("100 iters"), "{what}: {out}");
    }
}

/// Each job's server's client is the next job's: every pair crosses jobs, and between them
/// root to root, root to nobody, nobody to nobody and nobody to root.
fn pingpong_ring(jobs: &[Job], base_port: u16) {
    std::thread::scope(|s| {
        for (i, server) in jobs.iter().enumerate() {
            let client = &jobs[(i + 1) % jobs.len()];
            s.spawn(move || pingpong(server, client, base_port + i as u16));
        }
    });
}

/// The demo in each of `jobs`, all at once.
fn demos(jobs: &[&Job]) {
    std::thread::scope(|s| {
        for job in jobs {
            s.spawn(move || {
                let c = job.softverbs(&["demo", "--workers", "1"]).spawn().unwrap();
                let (ok, out, err) = finish(&format!("demo in {}", job.name), c);
                assert!(ok, "demo in {}: {out}{err}", job.name);
            });
        }
    });
}

/// The address a daemon's log says its device took.
fn device_addr(log: &str) -> Option<String> {
    log.lines()
        .filter(|l| l.contains("device on the network"))
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("addr=")))
        .map(String::from)
}

/// How many times `job`'s autostarted daemons have exited for being idle.
fn idle_exits(job: &Job) -> usize {
    job.own_log().matches("no client for the idle time").count()
}

/// Waits (bounded by [`WAIT`]) until `job`'s autostarted daemon has exited for being idle
/// (once more than `before` times).
fn wait_idle_exit(job: &Job, before: usize) {
    let deadline = Instant::now() + WAIT;
    while job.own_socket().exists() || idle_exits(job) <= before {
        assert!(
            Instant::now() < deadline,
            "{}'s daemon never exited: {}",
            job.name,
            job.own_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// On a daemon serving every user, `other` may not raise an event on `owner`'s QP (it would
/// reach `owner`'s program): `EPERM`.
fn injection_is_refused_on_another_users_qp(owner: &Job, other: &Job, socket: &Path) {
    let port = 18800;
    let p = port.to_string();
    let args = pingpong_args(&p, "10");
    let server = owner.softverbs(&args).spawn().unwrap();
    wait_listening(port);
    // ibv_rc_pingpong makes its QP before it listens for its peer.
    let text = softverbs::Introspect::connect_running(socket)
        .and_then(|i| i.resources_json())
        .unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    let qpn = r["qps"][0]["qpn"].as_u64().unwrap_or_else(|| panic!("{r}"));
    let q = qpn.to_string();
    let inject = ["inject-event", "--qpn", &q, "--event", "comm-est"];
    let (ok, out, err) = finish(
        "inject as another user",
        other.softverbs(&inject).spawn().unwrap(),
    );
    assert!(!ok && err.contains("Operation not permitted"), "{out}{err}");
    // The owner's program is unharmed: its peer comes and the exchange completes.
    let mut cargs = args.to_vec();
    cargs.push("localhost");
    let client = owner.softverbs(&cargs).spawn().unwrap();
    let (cok, cout, cerr) = finish("pingpong after the refused injection (client)", client);
    let (sok, sout, serr) = finish("pingpong after the refused injection (server)", server);
    assert!(cok && sok, "{cout}{cerr}{sout}{serr}");
}

/// A daemon this test started, killed if the test fails before it stops it.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scenario() {
    let base = std::env::temp_dir().join(format!("svmulti-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let jobs = [
        Job::new(&base, "root-a", 0),
        Job::new(&base, "root-b", 0),
        Job::new(&base, "nobody-a", NOBODY),
        Job::new(&base, "nobody-b", NOBODY),
    ];

    // 1. No system daemon: every job autostarts its own, and none collides.
    pingpong_ring(&jobs, 18600);
    demos(&[&jobs[0], &jobs[3]]);
    let addrs: Vec<String> = jobs
        .iter()
        .map(|j| device_addr(&j.own_log()).unwrap_or_else(|| panic!("{}: {}", j.name, j.own_log())))
        .collect();
    let mut distinct = addrs.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), jobs.len(), "one address each: {addrs:?}");
    assert!(addrs.iter().any(|a| a == "127.0.0.1"), "{addrs:?}");
    for j in &jobs {
        if device_addr(&j.own_log()).as_deref() != Some("127.0.0.1") {
            assert!(
                j.own_log().contains("took an address of its own"),
                "{}: {}",
                j.name,
                j.own_log()
            );
        }
    }
    // `run --device`: a daemon of the program's own with the device named; when it has
    // exited for being idle, the one the program's library starts again offers it too.
    let c = jobs[2]
        .softverbs(&[
            "run",
            "--device",
            "sv-mine=127.0.0.77",
            "--",
            "sh",
            "-c",
            "ibv_devices && while [ -S \"$SOFTVERBS_SOCKET\" ]; do sleep 0.05; done && \
             echo idle-exited && ibv_devices",
        ])
        .spawn()
        .unwrap();
    let (ok, out, err) = finish("run --device", c);
    let after = out.split("idle-exited").nth(1).unwrap_or_default();
    assert!(
        ok && out.contains("sv-mine") && after.contains("sv-mine"),
        "{out}{err}"
    );
    // Every autostarted daemon exits once idle.
    for j in &jobs {
        wait_idle_exit(j, 0);
    }

    // 2. A system daemon (root, no XDG_RUNTIME_DIR, not autostarted: it never idles out, even
    // with SOFTVERBS_IDLE_EXIT in its environment).
    let log = base.join("system.log");
    let mut system = Reap(
        Command::new(BIN)
            .arg("daemon")
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("SOFTVERBS_SOCKET")
            .env("SOFTVERBS_IDLE_EXIT", IDLE)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let system_socket = Path::new("/run/softverbs/softverbs.sock");
    let deadline = Instant::now() + WAIT;
    while softverbs::Introspect::connect_running(system_socket).is_err() {
        assert!(
            system.0.try_wait().unwrap().is_none(),
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(
            Instant::now() < deadline,
            "the system daemon never answered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = system.0.id();
    // Every job finds it, whatever its XDG_RUNTIME_DIR says.
    for j in &jobs {
        let (ok, out, err) = finish("status", j.softverbs(&["status"]).spawn().unwrap());
        assert!(ok, "{}: {out}{err}", j.name);
        let first = out.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("daemon pid {pid} on {}", system_socket.display())),
            "{}: {out}",
            j.name
        );
    }
    // An explicit socket still wins.
    let mut c = jobs[1].softverbs(&["status"]);
    c.env("SOFTVERBS_SOCKET", jobs[1].own_socket());
    let (ok, _, err) = finish("status with SOFTVERBS_SOCKET", c.spawn().unwrap());
    assert!(
        !ok && err.contains(&jobs[1].own_socket().display().to_string()),
        "{err}"
    );
    injection_is_refused_on_another_users_qp(&jobs[0], &jobs[2], system_socket);
    pingpong_ring(&jobs, 18700);
    // The demos inject an event on their own receive QP: allowed to any user on its own QPs.
    demos(&[&jobs[1], &jobs[2]]);
    // No job started a daemon of its own meanwhile: each job's log is as phase 1 left it.
    for j in &jobs {
        assert_eq!(
            j.own_log().matches("daemon serving").count(),
            j.own_log().matches("daemon stopped").count(),
            "{}: {}",
            j.name,
            j.own_log()
        );
    }
    // An autostarted daemon's idle exit is the clock: once one has idled out, the system
    // daemon, idle as long (nothing else runs), must still answer.
    let exits = idle_exits(&jobs[0]);
    let mut c = jobs[0].softverbs(&["run", "--", "true"]);
    c.env("SOFTVERBS_SOCKET", jobs[0].own_socket());
    let (ok, out, err) = finish("run with its own daemon", c.spawn().unwrap());
    assert!(ok, "{out}{err}");
    wait_idle_exit(&jobs[0], exits);
    assert!(
        system.0.try_wait().unwrap().is_none(),
        "the system daemon is still up"
    );
    assert!(
        softverbs::Introspect::connect_running(system_socket).is_ok(),
        "the system daemon still answers"
    );
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::TERM,
    );
    let _ = system.0.wait();
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn two_uids_and_two_jobs_each_are_served_with_and_without_a_system_daemon() {
    if std::env::var_os(INNER).is_some() {
        scenario();
        return;
    }
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root (a second uid, a mount namespace for /run)");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    // A network namespace (its own loopback and RoCE ports) and a mount namespace with a
    // fresh /run (its own /run/softverbs), in which this test runs again.
    let out = Command::new("unshare")
        .args(["--net", "--mount", "--propagation", "private", "sh", "-c"])
        .arg("ip link set lo up && mount -t tmpfs -o mode=0755 softverbs-test /run && exec \"$0\" \"$@\"")
        .arg(&exe)
        .args([
            "--exact",
            "two_uids_and_two_jobs_each_are_served_with_and_without_a_system_daemon",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INNER, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "the run in the namespaces failed (above)"
    );
    assert!(
        text.contains("test result: ok. 1 passed"),
        "it ran no test (above)"
    );
}
