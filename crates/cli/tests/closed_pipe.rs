//! No command panics on a closed pipe (issue 36, item 8): `softverbs status | head -n 1` and
//! the other listing commands end as a C tool does, killed by SIGPIPE (141 in a shell), with
//! nothing on stderr; commands that keep SIGPIPE ignored drop their output and exit 0; and the
//! daemon — started by autostart from a client whose SIGPIPE is at its default, a disposition
//! exec(2) keeps — ignores SIGPIPE and is still up afterwards.
//!
//! The pipe's reader is gone before the command starts, so its first write meets the closed
//! pipe on every run. (A reader that takes one line first, like `head -n 1`, meets it only when
//! the command has more to write after that line has been read — a race this avoids.)

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
const SIGPIPE: i32 = 13;

/// The test's directory, and the daemon autostart started there: SIGTERM and removed on drop.
struct Scene {
    dir: PathBuf,
    daemon_pid: Option<i32>,
}

impl Drop for Scene {
    fn drop(&mut self) {
        if let Some(pid) = self.daemon_pid {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn cli(socket: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--socket")
        .arg(socket)
        .env_remove("SOFTVERBS_AUTOSTART")
        .env("SOFTVERBS_DAEMON_BIN", BIN);
    c
}

/// `softverbs ARGS` with stdout a pipe whose reader is closed.
fn into_closed_pipe(socket: &Path, args: &[&str]) -> Output {
    let (reader, writer) = nix::unistd::pipe().expect("pipe");
    drop(reader);
    let child = cli(socket)
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run softverbs");
    child.wait_with_output().expect("wait for softverbs")
}

fn status_json(socket: &Path) -> serde_json::Value {
    let o = cli(socket)
        .args(["status", "--json"])
        .output()
        .expect("run softverbs");
    assert!(o.status.success(), "status: {o:?}");
    serde_json::from_slice(&o.stdout).expect("status --json is JSON")
}

/// SIGPIPE's bit in a `SigIgn:` mask of /proc/PID/status (proc(5)).
fn ignores_sigpipe(pid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .expect("SigIgn line");
    let mask = u64::from_str_radix(mask.trim(), 16).expect("hex mask");
    mask & (1 << (SIGPIPE - 1)) != 0
}

#[test]
fn listing_commands_end_quietly_on_a_closed_pipe_and_the_daemon_lives_on() {
    let dir = std::env::temp_dir().join(format!("sv-closed-pipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut scene = Scene {
        dir: dir.clone(),
        daemon_pid: None,
    };
    let socket = dir.join("sv.sock");

    // A daemon started by autostart from `inject-event`, a client with SIGPIPE at its
    // default action. A wrapper gives it --no-network (its own device, no UDP port).
    let wrapper = dir.join("daemon-no-network");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec '{BIN}' \"$@\" --no-network\n"),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let o = cli(&socket)
        .env("SOFTVERBS_DAEMON_BIN", &wrapper)
        .args(["inject-event", "--port", "1", "--event", "port-active"])
        .output()
        .expect("run softverbs");
    assert!(o.status.success(), "inject-event: {o:?}");
    let pid = status_json(&socket)["daemon_pid"]
        .as_i64()
        .expect("daemon_pid") as i32;
    scene.daemon_pid = Some(pid);
    assert!(
        ignores_sigpipe(pid),
        "the daemon (pid {pid}) must ignore SIGPIPE"
    );

    // Commands that print and exit: killed by SIGPIPE, as a C tool is, without a word.
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["devices"],
        &["resources"],
        &["resources", "--json"],
        &["--help"],
        &["status", "--help"],
        &["--version"],
    ] {
        let o = into_closed_pipe(&socket, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.signal(), Some(SIGPIPE), "{args:?}: {o:?}");
        assert!(err.is_empty(), "{args:?} said: {err}");
    }
    // A command that keeps SIGPIPE ignored (it talks to processes it starts through pipes):
    // its output is dropped, it finishes its work and exits 0.
    let o = into_closed_pipe(
        &socket,
        &["bench", "commands", "--clients", "1", "--iters", "10"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "bench commands: {err}");
    assert_eq!(o.status.code(), Some(0), "bench commands: {o:?}");

    // The same daemon still answers.
    assert_eq!(
        status_json(&socket)["daemon_pid"].as_i64(),
        Some(i64::from(pid))
    );
}
