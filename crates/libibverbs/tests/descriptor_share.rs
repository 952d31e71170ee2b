//! Issue 35 item 8: one uid opening devices without end must not take the daemon's
//! descriptors from everyone else. Every context costs the daemon eight descriptors through
//! the drop-in (its socket, async eventfd, the opener's `mem` and `maps`, the doorbell's two
//! ends, the direct path's `mem` and MR table); before the `descriptors` share, a uid's
//! limit of `RLIMIT_NOFILE` / 8 contexts let it take every descriptor of the daemon, and the
//! next `ibv_open_device` of any user failed or hung.
//!
//! The daemon runs with `RLIMIT_NOFILE` 256, so a uid's share is 64 descriptors
//! (docs/guide/limits.md). `tests/c/open_contexts.c` of this test's uid opens devices until
//! `ENOMEM` and holds them; a program run as `nobody` still opens devices; once the holder is
//! killed (-9) its uid opens devices again.
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing; the other
//! uid's part needs root.

mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{c_toolchain_missing, compile, Daemon};

const ENOMEM: i32 = 12;
const NOBODY: u32 = 65534;
const MAX_FDS: u64 = 256;
/// Descriptors a context opened by the drop-in costs the daemon.
const FDS_PER_CONTEXT: u64 = 8;

/// `open_contexts ARGS` against `d` through the drop-in, as `uid` if given, with its stdin
/// and stdout piped.
fn spawn(d: &Daemon, prog: &Path, args: &[&str], uid: Option<u32>) -> Child {
    let mut c = Command::new(prog);
    c.args(args)
        .env("LD_LIBRARY_PATH", d.lib.parent().unwrap())
        .env("SOFTVERBS_SOCKET", &d.socket)
        .env("SOFTVERBS_AUTOSTART", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(uid) = uid {
        c.uid(uid).gid(uid);
    }
    c.spawn().expect("run open_contexts")
}

/// The "opened N errno E" line of `child`, within 30 s (a daemon out of descriptors may
/// never answer).
fn report(child: &mut Child) -> (u64, i32) {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) else {
        let _ = child.kill();
        panic!("open_contexts said nothing in 30 s");
    };
    let w: Vec<&str> = line.split_whitespace().collect();
    match w[..] {
        ["opened", n, "errno", e] => (n.parse().unwrap(), e.parse().unwrap()),
        _ => panic!("unexpected output {line:?}"),
    }
}

/// Runs `open_contexts MAX` to its end and returns its report.
fn run(d: &Daemon, prog: &Path, max: u64, uid: Option<u32>) -> (u64, i32) {
    let mut child = spawn(d, prog, &[&max.to_string()], uid);
    let r = report(&mut child);
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    r
}

#[test]
fn a_uid_opening_devices_until_enomem_leaves_room_for_another_uid_and_gets_its_share_back() {
    if let Some(why) = c_toolchain_missing() {
        eprintln!("SKIP: {why}");
        return;
    }
    let d = Daemon::start_with_options(
        softverbs_testkit::Daemon::options("fd-share")
            .max_fds(MAX_FDS)
            .open_to_all(),
    );
    let prog = d.dir.join("open_contexts");
    compile("tests/c/open_contexts.c", &prog);

    // This uid opens devices until the daemon refuses, and holds them.
    let mut hog = spawn(&d, &prog, &["100000", "hold"], None);
    let (n, e) = report(&mut hog);
    assert_eq!(e, ENOMEM, "the uid's last ibv_open_device ({n} opened)");

    // Another uid still opens devices.
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").unwrap().uid() == 0 {
        assert_eq!(run(&d, &prog, 2, Some(NOBODY)), (2, 0), "nobody's contexts");
    } else {
        eprintln!("SKIP the other uid: only root can run a process as another uid");
    }

    assert!(
        n >= 1 && n * FDS_PER_CONTEXT <= MAX_FDS / 4,
        "{n} contexts: a uid's share is a quarter of the daemon's {MAX_FDS} descriptors"
    );

    // The holder dies without closing anything: its uid gets its share back.
    hog.kill().unwrap();
    hog.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = run(&d, &prog, 2, None);
        if r == (2, 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the uid's share did not come back: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = d.wait_until("every context is gone", |r| {
        r["contexts"].as_array().is_some_and(Vec::is_empty)
    });
    let fds = r["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["resource"] == "descriptors")
        .expect("a descriptors row")
        .clone();
    assert_eq!(fds["uid"], MAX_FDS / 4, "{fds}");
    assert!(
        fds["used"].as_u64() <= Some(2),
        "only `resources` itself: {fds}"
    );
}
