//! Debian's perftest (`ib_send_lat`, `ib_send_bw`, `ib_write_lat`, `ib_write_bw`,
//! `ib_read_bw`) unmodified on the drop-in `libibverbs.so.1`, started with `softverbs run`:
//! server and client as two processes on one daemon, and the bandwidth tests across two daemons
//! talking RoCE v2 over loopback UDP, plus `ib_send_bw -a` (every size to 8 MiB). Each run must
//! exit 0 on both sides and print result lines with a positive bandwidth or latency; the
//! numbers themselves are never checked (docs/performance.md has them).
//!
//! Skipped (with a message) only when perftest is not installed. The `softverbs` binary must be
//! built in the same profile (`cargo build -p softverbs-cli`): this crate cannot depend on it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long any one step may take (debug builds on a loaded 2-vCPU machine).
const WAIT: Duration = Duration::from_secs(60);

fn have_perftest() -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("ib_send_lat").is_file()));
    if !found {
        eprintln!("SKIP: perftest is not installed (apt-get install perftest)");
    }
    found
}

/// `target/<profile>/softverbs`, next to the `deps/` directory this test runs from.
fn softverbs_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test executable has a directory");
    let profile = if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps has a parent")
    } else {
        deps
    };
    let bin = profile.join("softverbs");
    assert!(
        bin.is_file(),
        "{} is missing: build the CLI in the same profile first (`cargo build{} -p softverbs-cli`)",
        bin.display(),
        if profile.ends_with("release") {
            " --release"
        } else {
            ""
        }
    );
    bin
}

/// Loopback addresses of this test process: 127.A.B.x from the pid, away from the ranges the
/// CLI tests use (127.93.*) and from hand-started daemons (127.0.*).
fn addr(test: u8, host: u8) -> String {
    let pid = std::process::id();
    format!(
        "127.{}.{}.{}",
        128 + (pid >> 8) % 100,
        pid & 0xff,
        test * 4 + host
    )
}

struct Daemon {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    bin: PathBuf,
}

impl Daemon {
    /// A daemon whose device `softverbs0` has address `ip` (UDP 4791 on it).
    fn start(name: &str, ip: &str) -> Daemon {
        let bin = softverbs_bin();
        let dir = std::env::temp_dir().join(format!("sv-perftest-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("sv.sock");
        let log = std::fs::File::create(dir.join("daemon.log")).unwrap();
        let child = Command::new(&bin)
            .args(["daemon", "--socket"])
            .arg(&socket)
            .arg("--device")
            .arg(format!("softverbs0={ip}"))
            .stderr(log)
            .spawn()
            .unwrap();
        let d = Daemon {
            child,
            dir,
            socket,
            bin,
        };
        let deadline = Instant::now() + WAIT;
        loop {
            let up = d.socket.exists()
                && Command::new(&d.bin)
                    .arg("--socket")
                    .arg(&d.socket)
                    .arg("status")
                    .env("SOFTVERBS_AUTOSTART", "0")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            if up {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "daemon {name} did not come up:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `softverbs run -- PROGRAM ARGS` against this daemon.
    fn run(&self, prog: &str, args: &[&str]) -> Child {
        Command::new(&self.bin)
            .arg("--socket")
            .arg(&self.socket)
            .arg("run")
            .arg("--")
            .arg(prog)
            .args(args)
            .env("SOFTVERBS_AUTOSTART", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits for a child with a deadline, killing it on timeout.
fn finish(mut c: Child, what: &str) -> Output {
    let deadline = Instant::now() + WAIT;
    loop {
        if c.try_wait().unwrap().is_some() {
            return c.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            let o = c.wait_with_output().unwrap();
            panic!("{what} did not finish: {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP port nobody listens on now (perftest exchanges QP numbers and keys over TCP).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether something listens on TCP `port`, read from /proc so that no connection is spent
/// (a perftest server accepts exactly one).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// The values perftest's result table gives in `column` (0-based), one per message size (the
/// lines after the `#bytes` header): bandwidth average for `_bw`, typical latency for `_lat`.
fn results(out: &str, column: usize) -> Vec<f64> {
    out.lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"))
        .skip(1)
        .map_while(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first()?.parse::<u64>().ok()?;
            cols.get(column)?.parse::<f64>().ok()
        })
        .collect()
}

/// Runs `prog` as a server on `srv` and as its client on `cli` (the same daemon or another),
/// both on GID index 0 (RoCE v2), and checks both exits and result lines.
fn perftest(srv: &Daemon, cli: &Daemon, prog: &str, extra: &[&str]) {
    let port = free_port();
    let p = port.to_string();
    let mut args = vec!["-d", "softverbs0", "-x", "0", "-p", &p];
    args.extend_from_slice(extra);
    let mut server = srv.run(prog, &args);
    let deadline = Instant::now() + WAIT;
    while !listening(port) {
        if server.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let _ = server.kill();
            let o = server.wait_with_output().unwrap();
            panic!(
                "{prog} server never listened on {port}: {}\ndaemon log:\n{}",
                text(&o),
                srv.log()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    args.push("localhost");
    let client = cli.run(prog, &args);
    let co = finish(client, &format!("{prog} client"));
    let so = finish(server, &format!("{prog} server"));
    // `_bw`: "#bytes #iterations BW-peak BW-average MsgRate"; `_lat`: "#bytes #iterations
    // t_min t_max t_typical …".
    let column = if prog.ends_with("_bw") { 3 } else { 4 };
    for (side, o, d) in [("client", &co, cli), ("server", &so, srv)] {
        assert!(
            o.status.success(),
            "{prog} {extra:?} {side}: {}\ndaemon log:\n{}",
            text(o),
            d.log()
        );
        let out = String::from_utf8_lossy(&o.stdout);
        let v = results(&out, column);
        assert!(
            !v.is_empty() && v.iter().all(|v| *v > 0.0),
            "{prog} {side}: a result line without a positive value in column {column}: {}",
            text(o)
        );
        eprintln!("{prog} {extra:?} {side}: {v:?}");
    }
}

#[test]
fn perftest_between_two_processes_on_one_daemon() {
    if !have_perftest() {
        return;
    }
    let d = Daemon::start("one", &addr(0, 1));
    perftest(&d, &d, "ib_send_lat", &["-n", "200", "-s", "8"]);
    perftest(&d, &d, "ib_write_lat", &["-n", "200", "-s", "8"]);
    perftest(&d, &d, "ib_send_bw", &["-n", "200", "-s", "4096"]);
    perftest(&d, &d, "ib_write_bw", &["-n", "200", "-s", "65536"]);
    perftest(&d, &d, "ib_read_bw", &["-n", "200", "-s", "65536"]);
    // Every size from 2 B to 8 MiB on one pair of QPs, with perftest's CQ moderation of 100
    // at every size (-a keeps it): requests as long as the send window and longer.
    perftest(&d, &d, "ib_send_bw", &["-a", "-n", "20"]);
}

#[test]
fn perftest_bandwidth_between_two_daemons_over_udp() {
    if !have_perftest() {
        return;
    }
    let a = Daemon::start("a", &addr(1, 1));
    let b = Daemon::start("b", &addr(1, 2));
    perftest(&a, &b, "ib_send_bw", &["-n", "200", "-s", "4096"]);
    perftest(&a, &b, "ib_write_bw", &["-n", "200", "-s", "65536"]);
}

#[test]
fn result_lines_are_parsed() {
    let bw = "---\n #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      1000             477.22             449.90 \t\t   0.007198\n---";
    assert_eq!(results(bw, 3), vec![449.90]);
    let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]\n 2       1000          10.42          59.57        18.49    \t       19.39\n";
    assert_eq!(results(lat, 4), vec![18.49]);
    let all = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 2          20               0.09               0.09   \t\t   0.047\n 8388608    20               654.11             654.11 \t\t   0.000082\n Failed status 12: wr_id 0 syndrom 0x0\n";
    assert_eq!(results(all, 3), vec![0.09, 654.11]);
    assert!(results("nothing", 3).is_empty());
}
