//! Unmodified rdma-core programs (Debian's ibverbs-utils) on the drop-in libibverbs.so.1,
//! started with `softverbs run`: the device tools, `ibv_asyncwatch`, and every pingpong between
//! two processes on one daemon and on two daemons talking RoCE v2 over loopback UDP. Each
//! pingpong checks its own data (`--chk`; a failed check exits non-zero).
//!
//! Skipped (with a message) only when ibverbs-utils is not installed; `scripts/test.sh`
//! installs it. The `softverbs` binary must be built in the same profile
//! (`cargo build -p softverbs-cli`): this crate cannot depend on it.

mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use support::{finish, free_port, softverbs_bin, text, Daemon, WAIT};

/// ibverbs-utils, or a note that the test checked nothing without it.
fn have(tool: &str) -> bool {
    support::have(tool, "ibverbs-utils")
}

/// Runs a pingpong server on `srv` and `clients` clients on `cli` (the same daemon or
/// another one), and checks that every process exits 0 after its own data checks.
fn pingpong(srv: &Daemon, cli: &Daemon, prog: &str, args: &[&str], clients: usize) {
    let port = free_port();
    let p = port.to_string();
    let mut sargs = vec!["-p", &p, "-g", "0"];
    sargs.extend_from_slice(args);
    let server = srv.spawn_server(prog, &sargs, port);
    let mut cargs: Vec<&str> = sargs.iter().copied().filter(|a| *a != "-c").collect();
    // `-c N` (xsrq: number of clients) is a server option; drop it and its value.
    if let Some(i) = sargs.iter().position(|a| *a == "-c") {
        cargs = sargs[..i].iter().chain(&sargs[i + 2..]).copied().collect();
    }
    cargs.push("localhost");
    let kids: Vec<Child> = (0..clients).map(|_| cli.spawn(prog, &cargs)).collect();
    for (i, k) in kids.into_iter().enumerate() {
        let o = finish(k, &format!("{prog} client {i}"));
        assert!(
            o.status.success(),
            "{prog} {args:?} client {i}: {}\ndaemon log:\n{}",
            text(&o),
            cli.log()
        );
    }
    let o = finish(server, &format!("{prog} server"));
    assert!(
        o.status.success(),
        "{prog} {args:?} server: {}\ndaemon log:\n{}",
        text(&o),
        srv.log()
    );
}

#[test]
fn device_tools_list_and_describe_the_softverbs_device() {
    if !have("ibv_devinfo") {
        return;
    }
    let d = Daemon::start("tools");
    let o = d.command("ibv_devices", &[]).output().unwrap();
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && t.contains("softverbs0"),
        "{}",
        text(&o)
    );
    let o = d.command("ibv_devinfo", &["-v"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    for want in [
        "hca_id:\tsoftverbs0",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "XRC",
        "RoCE v2",
        "phys_port_cnt:\t\t\t1",
    ] {
        assert!(t.contains(want), "ibv_devinfo -v lacks {want:?}:\n{t}");
    }
}

#[test]
fn asyncwatch_prints_a_port_event() {
    if !have("ibv_asyncwatch") {
        return;
    }
    let d = Daemon::start("async");
    let mut w = d.spawn("ibv_asyncwatch", &[]);
    // Inject until the watcher's context exists and hears it (it opens the device first).
    let deadline = Instant::now() + WAIT;
    loop {
        let o = d.cli(&["inject-event", "--port", "1", "--event", "port-err"]);
        assert!(o.status.success(), "{}", text(&o));
        // The injector's own context is one receiver; the watcher makes two.
        if String::from_utf8_lossy(&o.stdout).contains("delivered to 2") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ibv_asyncwatch never opened the device"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = w.stdout.take().unwrap();
    let mut got = String::new();
    let mut buf = [0u8; 256];
    while !got.contains("IBV_EVENT_PORT_ERR") {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "ibv_asyncwatch ended without the event: {got}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let _ = w.kill();
    let _ = w.wait();
    assert!(got.contains("softverbs0: async event FD"), "{got}");
    assert!(got.contains("IBV_EVENT_PORT_ERR (10), port 1"), "{got}");
}

/// The pingpongs of ibverbs-utils, as rdma-core's README runs them (`-g 0`: RoCE needs a GID).
/// `--chk` makes each side validate every buffer it receives (the xsrq pingpong has no such
/// option; it checks that every client's messages arrived).
const PINGPONGS: &[(&str, &[&str], usize)] = &[
    ("ibv_rc_pingpong", &["-n", "200", "--chk"], 1),
    ("ibv_rc_pingpong", &["-n", "200", "-e", "--chk"], 1),
    ("ibv_srq_pingpong", &["-n", "200", "--chk"], 1),
    ("ibv_xsrq_pingpong", &["-n", "20", "-c", "3"], 3),
    ("ibv_ud_pingpong", &["-n", "200", "--chk"], 1),
    ("ibv_uc_pingpong", &["-n", "200", "--chk"], 1),
];

/// Registration shares buffers in place by default (every other test here runs so);
/// `SOFTVERBS_SHARED_MR=0` leaves them private, reached through `/proc/<pid>/mem`: the data
/// must arrive the same, checked by the pingpong itself.
#[test]
fn rc_pingpong_checks_its_data_on_memory_registered_without_sharing() {
    if !have("ibv_rc_pingpong") {
        return;
    }
    let d = Daemon::start("private-mr");
    let port = free_port();
    let p = port.to_string();
    let args = ["-p", &p, "-g", "0", "-n", "300", "-s", "8192", "--chk"];
    let spawn = |extra: &[&str]| {
        let all: Vec<&str> = args.iter().chain(extra).copied().collect();
        d.command("ibv_rc_pingpong", &all)
            .env("SOFTVERBS_SHARED_MR", "0")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let server = spawn(&[]);
    let deadline = Instant::now() + WAIT;
    while !support::listening(port) {
        assert!(Instant::now() < deadline, "the server never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    let client = finish(spawn(&["localhost"]), "client");
    let server = finish(server, "server");
    for (who, o) in [("client", &client), ("server", &server)] {
        assert!(o.status.success(), "{who}: {}\n{}", text(o), d.log());
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("300 iters"),
            "{who}: {}",
            text(o)
        );
    }
}

#[test]
fn pingpongs_between_two_processes_on_one_daemon() {
    if !have("ibv_rc_pingpong") {
        return;
    }
    let d = Daemon::start("one");
    for (prog, args, clients) in PINGPONGS {
        pingpong(&d, &d, prog, args, *clients);
    }
}

#[test]
fn pingpongs_between_two_daemons_over_udp() {
    if !have("ibv_rc_pingpong") {
        return;
    }
    let a = Daemon::start_with_ip("a", "127.93.9.1");
    let b = Daemon::start_with_ip("b", "127.93.9.2");
    for (prog, args, clients) in PINGPONGS {
        pingpong(&a, &b, prog, args, *clients);
    }
}

#[test]
fn run_without_a_program_or_library_says_so() {
    let o = Command::new(softverbs_bin())
        .args(["run", "--"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let o = Command::new(softverbs_bin())
        .args(["run", "--", "true"])
        .env("SOFTVERBS_LIBIBVERBS", "/nonexistent/libibverbs.so.1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("SOFTVERBS_LIBIBVERBS"),
        "{}",
        text(&o)
    );
}

#[test]
fn install_puts_binary_library_and_header_under_the_prefix() {
    let prefix = std::env::temp_dir().join(format!("sv-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let o = Command::new(softverbs_bin())
        .args(["install", "--prefix"])
        .arg(&prefix)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let lib = prefix.join("lib/softverbs/libibverbs.so.1");
    for p in [prefix.join("bin/softverbs"), lib.clone()] {
        assert!(p.is_file(), "{} missing", p.display());
    }
    let h = std::fs::read_to_string(prefix.join("include/softverbs/xrc_legacy.h")).unwrap();
    assert!(h.contains("ibv_reg_xrc_rcv_qp"));
    // The installed binary finds the installed library (prefix layout).
    let o = Command::new(prefix.join("bin/softverbs"))
        .args(["run", "--", "true"])
        .env("SOFTVERBS_SOCKET", Path::new("/nonexistent/sv.sock"))
        .env("SOFTVERBS_AUTOSTART", "0")
        .output()
        .unwrap();
    // No daemon there: the run refuses before exec, naming the socket, not the library.
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no daemon"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&prefix);
}
