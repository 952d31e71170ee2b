//! rsockets through the drop-in librdmacm.so.1 and libibverbs.so.1 under `softverbs run`
//! (docs/design/rsockets.md): unmodified `rstream` and `riostream` (rdmacm-utils, riostream
//! moving its data with riomap/riowrite) with their data check (`-T v`) in
//! blocking, nonblocking and poll-driven modes on one daemon and between two daemons in
//! two network namespaces joined by veth (`sv9a`/`sv9b`, made and removed by the test);
//! and tests/c/rsockets.c, which checks the calls one by one (blocking and nonblocking
//! streams, flow control, rpoll over several rsockets, end of stream, a refused connect,
//! a peer killed while connected). After each, the daemon's CM holds no connection.
//!
//! Skipped (with a message) without rdmacm-utils, gcc or librdmacm-dev; the namespace test
//! also needs root and `ip` (CI has all). Build `softverbs-cli` first.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use softverbs_testkit::bins::softverbs_bin;
use softverbs_testkit::process::finish;
use softverbs_testkit::Daemon;
use support::{cm_of, have, ok, run, wait_cm, Netns};

/// No listener and no live connection (connections in TIME_WAIT may remain a while).
fn cm_idle(cm: &serde_json::Value) -> bool {
    ["listeners", "connections", "owned"]
        .iter()
        .all(|k| cm[k] == 0)
}

fn rstream() -> PathBuf {
    PathBuf::from("rstream")
}

/// One rstream server and client with the same test options; both print their result line
/// ("custom <size> <count> ...") only when every transfer (and, with `-T v`, every byte)
/// was right.
fn rstream_pair(
    srv: (Option<&str>, &Path),
    cli: (Option<&str>, &Path),
    server_ip: &str,
    port: &str,
    opts: &[&str],
) {
    stream_pair(&rstream(), srv, cli, server_ip, port, opts)
}

/// As [`rstream_pair`] for `prog` (rstream or riostream, which share options and output).
fn stream_pair(
    prog: &Path,
    srv: (Option<&str>, &Path),
    cli: (Option<&str>, &Path),
    server_ip: &str,
    port: &str,
    opts: &[&str],
) {
    let mut sargs = vec!["-p", port];
    sargs.extend_from_slice(opts);
    let mut cargs = vec!["-s", server_ip, "-p", port];
    cargs.extend_from_slice(opts);
    let server = run(srv.0, srv.1, prog, &sargs);
    wait_cm(srv.1, "server listening", |cm| cm["listeners"] != 0);
    let client = finish(run(cli.0, cli.1, prog, &cargs), "client");
    let server = finish(server, "server");
    let (s, c) = (ok(server, "server"), ok(client, "client"));
    let size = opts[opts.iter().position(|o| *o == "-S").unwrap() + 1];
    let count = opts[opts.iter().position(|o| *o == "-C").unwrap() + 1];
    for (who, out) in [("server", &s), ("client", &c)] {
        let line = out
            .lines()
            .find(|l| l.starts_with("custom"))
            .unwrap_or_else(|| panic!("{who} {opts:?}: no result line in {out}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[2], count, "{who} {opts:?}: {line}");
        let bytes = match cols[1].strip_suffix('k') {
            Some(k) => k.parse::<usize>().unwrap() * 1024,
            None => match cols[1].strip_suffix('m') {
                Some(m) => m.parse::<usize>().unwrap() << 20,
                None => cols[1].parse().unwrap(),
            },
        };
        let want: usize = size.parse().unwrap();
        assert!(
            bytes == want || bytes == want / 1024 * 1024,
            "{who} {opts:?}: {line}"
        );
    }
}

const VARIANTS: &[&[&str]] = &[
    &["-S", "4096", "-C", "100", "-T", "v"],
    &["-S", "1048576", "-C", "4", "-T", "b", "-T", "v"],
    &["-S", "100000", "-C", "20", "-T", "n", "-T", "v"],
    &["-S", "64", "-C", "200", "-T", "a", "-T", "v"],
];

/// riostream (rdmacm-utils): each side riomaps its buffer (offset 0, RDMA_IOMAPSIZE 1),
/// exchanges a 16-byte sync message, then the two riowrite each transfer into the other's
/// mapping; the reader spins on the mapping's last byte (no rsocket call, so the write must
/// land by itself) and, with `-T v`, checks every byte; riounmap at the end. `-I` keeps the
/// iteration counts small (its default latency test runs 100000 round trips).
const RIO_VARIANTS: &[&[&str]] = &[
    &["-S", "4096", "-C", "10", "-I", "20", "-T", "v"],
    &["-S", "1048576", "-C", "2", "-I", "3", "-T", "b", "-T", "v"],
    &["-S", "100000", "-C", "3", "-I", "10", "-T", "n", "-T", "v"],
    &["-S", "64", "-C", "2", "-I", "50", "-T", "a", "-T", "v"],
];

#[test]
fn riostream_checks_its_data_on_one_daemon() {
    if !have("riostream") {
        return;
    }
    let d = Daemon::start("riostream");
    let at = (None, d.socket.as_path());
    for (i, v) in RIO_VARIANTS.iter().enumerate() {
        let port = (7600 + i).to_string();
        stream_pair(Path::new("riostream"), at, at, "127.0.0.1", &port, v);
        wait_cm(&d.socket, "nothing left", cm_idle);
    }
}

#[test]
fn rstream_checks_its_data_on_one_daemon() {
    if !have("rstream") {
        return;
    }
    let d = Daemon::start("rstream");
    let at = (None, d.socket.as_path());
    for (i, v) in VARIANTS.iter().enumerate() {
        let port = (7590 + i).to_string();
        rstream_pair(at, at, "127.0.0.1", &port, v);
        wait_cm(&d.socket, "nothing left", cm_idle);
    }
}

unsafe extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

/// A `softverbs daemon` in `ns` with one device on `ip`, killed on drop.
struct NsDaemon(Child, PathBuf);
impl Drop for NsDaemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn rstream_between_two_daemons_in_two_namespaces() {
    if !have("rstream") {
        return;
    }
    // SAFETY: getuid has no preconditions.
    if unsafe { libc_getuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("SKIP: network namespaces need root");
        return;
    }
    let Some(_ns) = Netns::up("sv9", 49) else {
        panic!("could not create the sv9a/sv9b namespaces and their veth pair");
    };
    let dir = std::env::temp_dir().join(format!("sv9-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let daemon = |ns: &str, ip: &str| {
        let sock = dir.join(format!("{ns}.sock"));
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(softverbs_bin())
            .arg("daemon")
            .arg("--socket")
            .arg(&sock)
            .arg("--device")
            .arg(format!("softverbs0={ip}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{ns}.log"))).unwrap())
            .spawn()
            .unwrap();
        let d = NsDaemon(child, sock);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cm_of(&d.1).is_object() {
            assert!(Instant::now() < deadline, "daemon in {ns} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    };
    let a = daemon("sv9a", "10.49.0.1");
    let b = daemon("sv9b", "10.49.0.2");
    for (i, v) in [VARIANTS[0], VARIANTS[2], VARIANTS[3]].iter().enumerate() {
        let port = (7690 + i).to_string();
        rstream_pair(
            (Some("sv9a"), &a.1),
            (Some("sv9b"), &b.1),
            "10.49.0.1",
            &port,
            v,
        );
        wait_cm(&a.1, "nothing left on the server's daemon", cm_idle);
        wait_cm(&b.1, "nothing left on the client's daemon", cm_idle);
    }
    if have("riostream") {
        for (i, v) in [RIO_VARIANTS[0], RIO_VARIANTS[2]].iter().enumerate() {
            let port = (7695 + i).to_string();
            stream_pair(
                Path::new("riostream"),
                (Some("sv9a"), &a.1),
                (Some("sv9b"), &b.1),
                "10.49.0.1",
                &port,
                v,
            );
            wait_cm(&a.1, "nothing left on the server's daemon", cm_idle);
            wait_cm(&b.1, "nothing left on the client's daemon", cm_idle);
        }
    }
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rsocket_calls_one_by_one() {
    let header = Path::new("/usr/include/rdma/rsocket.h");
    if !header.is_file() || Command::new("gcc").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "gcc and librdmacm-dev are required under CI"
        );
        eprintln!("SKIP: gcc or /usr/include/rdma/rsocket.h (librdmacm-dev) missing");
        return;
    }
    let exe =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rsockets-{}", std::process::id()));
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/rsockets.c");
    let o = Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(src)
        .args(["-lrdmacm", "-lpthread"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = Daemon::start("rsockets");
    let out = ok(
        finish(run(None, &d.socket, &exe, &["7580"]), "rsockets.c"),
        "rsockets.c",
    );
    let _ = std::fs::remove_file(&exe);
    for step in [
        "ok options",
        "ok blocking stream and end of stream",
        "ok nonblocking",
        "ok rpoll",
        "ok refused",
        "ok riomap and riowrite",
        "ok peer killed",
    ] {
        assert!(out.contains(step), "{step} missing: {out}");
    }
    wait_cm(&d.socket, "nothing left", cm_idle);
}
