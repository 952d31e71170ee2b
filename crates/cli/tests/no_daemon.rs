//! `softverbs status`, `devices` and `resources` look inside a running daemon and never start
//! one: with none they say "no daemon" and exit 3 (LSB "program is not running"). `status`
//! shows the daemon's limits (docs/guide/limits.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use softverbs_testkit::Daemon;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("svnod-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

/// Runs the CLI with autostart as a client would have it by default (on, and pointed at
/// this very binary, so a start would succeed).
fn cli(socket: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("SOFTVERBS_AUTOSTART")
        .env("SOFTVERBS_DAEMON_BIN", BIN)
        .output()
        .unwrap()
}

/// Processes whose command line names `socket`.
fn processes_serving(socket: &Path) -> Vec<String> {
    let want = socket.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(&want) {
                found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

fn assert_no_daemon(socket: &Path, args: &[&str]) {
    let o = cli(socket, args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{args:?}: {err}");
    assert!(
        err.contains(&format!("no daemon at {}", socket.display())),
        "{args:?}: {err}"
    );
    assert!(o.stdout.is_empty(), "{args:?} printed {:?}", o.stdout);
    let parent = socket.parent().unwrap();
    assert!(
        !parent.join("daemon.log").exists(),
        "{args:?} tried to start a daemon"
    );
    assert_eq!(
        processes_serving(socket),
        Vec::<String>::new(),
        "{args:?} started a daemon"
    );
}

#[test]
fn status_devices_and_resources_without_a_daemon_say_so_and_start_none() {
    let d = dir("none");
    // No socket at all, in a directory that does not exist yet.
    let missing = d.0.join("run").join("sv.sock");
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["devices"],
        &["resources"],
        &["resources", "--json"],
    ] {
        assert_no_daemon(&missing, args);
        assert!(!missing.exists() && !missing.parent().unwrap().exists());
    }
    // A socket file nobody serves (a daemon that died).
    let stale = d.0.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    for args in [&["status"][..], &["devices"], &["resources", "--json"]] {
        assert_no_daemon(&stale, args);
    }
}

#[test]
fn status_shows_the_limits_in_text_and_json() {
    let daemon = Daemon::options("limits")
        .bin(BIN)
        .args(&["--limit", "uid.cqs=7", "--limit", "context.ring-bytes=64K"])
        .args(&["--limit", "daemon.mappings=unlimited"])
        .start();
    let socket = daemon.socket.clone();
    let o = cli(&socket, &["status"]);
    let text = String::from_utf8_lossy(&o.stdout);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in:\n{text}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        line("limit"),
        ["limit", "per", "context", "per", "uid", "daemon", "used"]
    );
    assert_eq!(line("cqs")[2], "7", "{text}");
    assert_eq!(line("ring-bytes")[1], "65536", "{text}");
    assert_eq!(line("mappings")[3], "unlimited", "{text}");

    let o = cli(&socket, &["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = |name: &str| {
        v["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == name)
            .unwrap_or_else(|| panic!("no {name} in {v}"))
            .clone()
    };
    assert_eq!(row("cqs")["uid"], 7);
    assert_eq!(row("ring-bytes")["context"], 65536);
    assert!(row("mappings")["daemon"].is_null(), "unlimited is null");
    assert!(row("mappings")["uid"].as_u64().unwrap() > 0);
    assert_eq!(row("contexts")["used"], 0);
}
