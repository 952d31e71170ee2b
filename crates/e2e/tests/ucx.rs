//! Debian's UCX 1.13 (ucx-utils), unmodified, finds softverbs by itself under `softverbs run`:
//! `ucx_info -d` lists `rc_verbs` and `ud_verbs` on `softverbs0:1`, as root and as a user
//! without privileges, and `ucx_perftest -t tag_lat` runs over `ud_verbs` and over `rc_verbs`
//! between two daemons that talk RoCE v2 over loopback UDP. The only UCX settings are the
//! choice of the transport under test and of the device, and UCX's UD destination-GID
//! check pinned to its default (on); `softverbs run` provides the
//! `/dev/infiniband/uverbs0` node UCX checks for (crates/cli/src/devnode.rs) and the drop-in
//! reports `wc.sl` as UCX's UD receive check expects (docs/guide/mpi.md).
//!
//! Skipped, saying so, only when ucx-utils is missing. The `softverbs` binary and the drop-in
//! must be built in the same profile (`cargo build -p softverbs-cli`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use softverbs_testkit::bins::{profile_dir, softverbs_bin};
use softverbs_testkit::process::{finish, text};
use softverbs_testkit::Daemon;

fn have(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(prog).is_file()))
}

macro_rules! skip_unless {
    ($($p:expr),*) => {
        for p in [$($p),*] {
            if !have(p) {
                eprintln!("SKIPPED: {p} is not installed (ucx-utils)");
                return;
            }
        }
    };
}

/// Loopback addresses of this test process, 127.95.P.x (P from the pid): away from the
/// ranges of the other test files (127.93.*, 127.128-227.*) and from 127.0.*.
fn addr(host: u8) -> String {
    format!("127.95.{}.{host}", std::process::id() & 0xff)
}

/// The `Memory domain: softverbs0` section of `ucx_info -d`, with its transports.
fn softverbs_domain(out: &str) -> String {
    out.split("# Memory domain:")
        .find(|s| s.trim_start().starts_with("softverbs0"))
        .unwrap_or("")
        .to_string()
}

fn assert_lists_verbs_transports(out: &Output) {
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ucx_info -d: {}", text(out));
    let md = softverbs_domain(&t);
    for tl in ["rc_verbs", "ud_verbs"] {
        assert!(
            md.contains(&format!("Transport: {tl}")),
            "{tl} on softverbs0 in ucx_info -d:\n{t}"
        );
    }
    assert!(md.contains("Device: softverbs0:1"), "{md}");
}

#[test]
fn ucx_info_lists_rc_and_ud_verbs_on_softverbs0_under_run_as_root() {
    skip_unless!("ucx_info");
    let d = Daemon::options("ucx-info")
        .device("softverbs0", &addr(1))
        .start();
    let out = Command::new(softverbs_bin())
        .arg("--socket")
        .arg(&d.socket)
        .args(["run", "--", "ucx_info", "-d"])
        .stdin(Stdio::null())
        .output()
        .expect("softverbs run ucx_info");
    assert_lists_verbs_transports(&out);
}

/// The drop-in this profile built (what `softverbs run` would pick: the newer of the two).
fn dropin_library() -> PathBuf {
    let p = profile_dir();
    [p.join("libibverbs.so"), p.join("deps/libibverbs.so")]
        .into_iter()
        .filter_map(|f| Some((std::fs::metadata(&f).ok()?.modified().ok()?, f)))
        .max()
        .map(|(_, f)| f)
        .expect("the drop-in libibverbs.so (cargo build -p softverbs-cli)")
}

#[test]
fn ucx_info_lists_rc_and_ud_verbs_under_run_without_privileges() {
    skip_unless!("ucx_info", "setpriv");
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to start the test's program as another user");
        return;
    }
    let d = Daemon::options("ucx-user")
        .device("softverbs0", &addr(2))
        .open_to_all()
        .start();
    // Copies the unprivileged user can read, wherever the workspace is.
    let bin = d.dir.join("softverbs");
    softverbs_testkit::bins::copy_executable(&softverbs_bin(), &bin);
    let lib = d.dir.join("libibverbs.so.1");
    std::fs::copy(dropin_library(), &lib).unwrap();
    let home = d.dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    // The user's own private directory, as a login gives one: `softverbs run` keeps its
    // mount points only in such a directory (docs/design/security.md, "Paths").
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(&bin)
            .arg("--socket")
            .arg(&d.socket)
            .args(args)
            .env("SOFTVERBS_LIBIBVERBS", &lib)
            .env("HOME", &home)
            .env("XDG_RUNTIME_DIR", &home)
            .stdin(Stdio::null())
            .output()
            .expect("setpriv")
    };
    // Whether this machine lets an unprivileged user mount in a user namespace of its own
    // decides the test: where it does not, the node cannot be made (docs/guide/mpi.md says what to
    // do then), and `run` must say so and still run the program.
    let platform = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["unshare", "--user", "--map-root-user", "--mount"])
        .args(["sh", "-c", "mount -t tmpfs none /dev"])
        .current_dir("/")
        .output()
        .expect("setpriv unshare");
    let probe = as_nobody(&[
        "run",
        "--",
        "sh",
        "-c",
        "test -c /dev/infiniband/uverbs0 && id -u",
    ]);
    if !platform.status.success() {
        let why = String::from_utf8_lossy(&probe.stderr);
        assert!(
            why.contains("no /dev/infiniband/uverbs0 for UCX"),
            "{}",
            text(&probe)
        );
        eprintln!(
            "SKIPPED: unprivileged users cannot mount in a user namespace here: {}",
            text(&platform)
        );
        return;
    }
    assert!(probe.status.success(), "{}", text(&probe));
    assert!(probe.stderr.is_empty(), "{}", text(&probe));
    // The program runs as the user, not as root of its namespace.
    assert_eq!(
        String::from_utf8_lossy(&probe.stdout).trim(),
        "65534",
        "{}",
        text(&probe)
    );
    assert_lists_verbs_transports(&as_nobody(&["run", "--", "ucx_info", "-d"]));
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free TCP port")
        .port()
}

/// Whether something listens on TCP `port` (from /proc: ucx_perftest's server accepts one
/// connection only, so probing by connecting would spend it).
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

fn perftest(socket: &Path, tls: &str, args: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    c.args(["--kill-after=5", "90"])
        .arg(softverbs_bin())
        .arg("--socket")
        .arg(socket)
        .args(["run", "--", "ucx_perftest"])
        .args(args)
        .env("UCX_TLS", tls)
        .env("UCX_NET_DEVICES", "softverbs0:1")
        // UCX's UD receive check of each datagram's destination GID, on (its default) even
        // if the caller's environment turned it off: a datagram it drops is resent only
        // after UCX's timer, which is the slow path this must not take (docs/guide/mpi.md,
        // "UCX's UD destination check"). The GRH area it reads is checked byte by byte in
        // crates/libibverbs/tests/ud_completion.rs.
        .env("UCX_UD_VERBS_ETH_DGID_CHECK", "y")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `ucx_perftest -t tag_lat` with the server on daemon A and the client on daemon B.
/// `hosts` are the last octets of the two daemons' addresses (each test its own: tests run
/// at the same time, and two daemons must never share an address).
fn tag_lat(tls: &str, hosts: [u8; 2]) {
    let a = Daemon::options(&format!("perf-a-{tls}"))
        .device("softverbs0", &addr(hosts[0]))
        .start();
    let b = Daemon::options(&format!("perf-b-{tls}"))
        .device("softverbs0", &addr(hosts[1]))
        .start();
    let port = free_port().to_string();
    let server = perftest(&a.socket, tls, &["-p", &port])
        .spawn()
        .expect("ucx_perftest server");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listening(port.parse().unwrap()) {
        assert!(
            Instant::now() < deadline,
            "the ucx_perftest server never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let iters = 1000;
    let client = perftest(
        &b.socket,
        tls,
        &[
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "tag_lat",
            "-n",
            &iters.to_string(),
        ],
    )
    .spawn()
    .expect("ucx_perftest client");
    let c = finish(client, "ucx_perftest client");
    let s = finish(server, "ucx_perftest server");
    assert!(c.status.success(), "client over {tls}: {}", text(&c));
    assert!(s.status.success(), "server over {tls}: {}", text(&s));
    // perftest's summary: "Final: <iterations> <latency columns...>".
    let out = String::from_utf8_lossy(&c.stdout);
    let done = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Final:"))
        .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok());
    assert_eq!(done, Some(iters), "the Final line over {tls}: {out}");
    drop((a, b));
}

#[test]
fn ucx_perftest_tag_lat_over_ud_verbs_across_two_daemons() {
    skip_unless!("ucx_perftest");
    tag_lat("ud_verbs", [3, 4]);
}

/// `rc_v` is UCX's name for rc_verbs with ud_verbs as its auxiliary (wire-up) transport:
/// `UCX_TLS=rc_verbs` alone has no transport to exchange RC addresses over and UCX 1.13
/// refuses it ("no auxiliary transport"), on any RDMA device.
#[test]
fn ucx_perftest_tag_lat_over_rc_verbs_across_two_daemons() {
    skip_unless!("ucx_perftest");
    tag_lat("rc_v", [5, 6]);
}
