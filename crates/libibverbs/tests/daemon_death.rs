//! `kill -9` of the daemon is a device fatal error for every program on it (docs/guide/dropin.md,
//! "When the daemon dies"): unmodified `ibv_asyncwatch` prints `IBV_EVENT_DEVICE_FATAL` and
//! ends, both processes of a busy-polling `ibv_rc_pingpong` end, and `tests/c/daemon_death.c` checks the event, the flush
//! completions with their wr_ids, `EIO` from later verbs, destroy after death, and reopening
//! the device once a new daemon serves the socket. Every wait is bounded ([`support::WAIT`]):
//! before the fix each of these programs waited forever.
//!
//! Skipped (with a message) only when ibverbs-utils, gcc or `verbs.h` is missing.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use support::{c_program, free_port, listening, Daemon, WAIT};

const CHECKS: &[&str] = &[
    "async_event_is_device_fatal",
    "async_fd_stays_readable",
    "async_event_then_eio",
    "channel_fd_readable",
    "armed_cq_gets_an_event",
    "cq_event_then_eio",
    "completed_first_then_sends_flushed_in_order",
    "receives_flushed_in_order",
    "no_duplicates",
    "alloc_pd_eio",
    "create_cq_eio",
    "reg_mr_eio",
    "modify_qp_eio",
    "post_send_eio",
    "post_recv_eio",
    "req_notify_cq_eio",
    "query_port_eio",
    "destroy_after_death",
    "close_after_death",
    "reopen_moves_data",
];

#[test]
fn a_program_sees_the_fatal_event_flushes_and_eio_and_reopens_on_a_new_daemon() {
    let Some((mut d, prog)) = c_program("death", "tests/c/daemon_death.c") else {
        return;
    };
    let mut p = d.run("daemon_death", &prog, &[]);
    let mut said = Vec::new();
    loop {
        let l = p.line();
        said.push(l.clone());
        assert!(!l.starts_with("FATAL"), "{}", said.join("\n"));
        if l == "ready" {
            break;
        }
    }
    d.kill9();
    loop {
        let l = p.line();
        said.push(l.clone());
        assert!(!l.starts_with("FATAL"), "{}", said.join("\n"));
        if l == "closed" {
            break;
        }
    }
    d.respawn();
    p.tell("go");
    let (rest, status) = p.finish();
    said.extend(rest);
    let text = said.join("\n");
    let ok: Vec<&str> = said.iter().filter_map(|l| l.strip_prefix("ok ")).collect();
    assert_eq!(ok, CHECKS, "daemon_death.c:\n{text}");
    assert!(
        said.last()
            .is_some_and(|l| l == &format!("daemon_death: {} checks, 0 failed", CHECKS.len())),
        "{text}"
    );
    assert!(
        status.success(),
        "daemon_death exited with {status}:\n{text}"
    );
}

/// A program that must not outlive a failed test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// ibverbs-utils, or a note that the test checked nothing without it.
fn have(tool: &str) -> bool {
    support::have(tool, "ibverbs-utils")
}

#[test]
fn asyncwatch_prints_device_fatal_and_ends_when_the_daemon_is_killed() {
    if !have("ibv_asyncwatch") {
        return;
    }
    let mut d = Daemon::start("death-async");
    let mut w = KillOnDrop(d.spawn("ibv_asyncwatch", &[]));
    let w = &mut w.0;
    let (tx, rx) = channel();
    let out = w.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    // It prints its async fd once the device is open, then sleeps in ibv_get_async_event.
    let first = rx.recv_timeout(WAIT).expect("ibv_asyncwatch said nothing");
    assert!(first.contains("async event FD"), "{first}");
    d.kill9();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(st) = w.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "ibv_asyncwatch still runs {WAIT:?} after the daemon died"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let said: Vec<String> = rx.try_iter().collect();
    let text = said.join("\n");
    assert!(
        said.iter()
            .any(|l| l.contains("event_type IBV_EVENT_DEVICE_FATAL (8)")),
        "{text}"
    );
    // The next ibv_get_async_event fails (EIO): asyncwatch's error exit.
    assert!(!status.success(), "{status}: {text}");
}

/// Both ends of a busy-polling `ibv_rc_pingpong` exchange on one daemon end (with an error:
/// the flushed receive) once the daemon is killed in the middle of the exchange.
#[test]
fn rc_pingpong_ends_when_the_daemon_is_killed() {
    if !have("ibv_rc_pingpong") {
        return;
    }
    let mut d = Daemon::start("death-pp");
    let port = free_port();
    let p = port.to_string();
    let sargs = ["-p", &p, "-g", "0", "-n", "100000000"];
    let prog = Path::new("ibv_rc_pingpong");
    let server = d.run("server", prog, &sargs);
    let deadline = Instant::now() + WAIT;
    while !listening(port) {
        assert!(Instant::now() < deadline, "the server never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut cargs = sargs.to_vec();
    cargs.push("localhost");
    let client = d.run("client", prog, &cargs);
    // Both QPs reach RTS once the two have exchanged addresses; the exchange follows (their
    // own output is block-buffered into the pipe, so it says nothing before they end).
    d.wait_until("both QPs are in RTS", |r| {
        let qps = r["qps"].as_array().expect("qps");
        qps.len() == 2
            && qps
                .iter()
                .all(|q| q["state"].to_string().to_lowercase().contains("rts"))
    });
    std::thread::sleep(Duration::from_millis(200));
    d.kill9();
    for (who, p) in [("server", server), ("client", client)] {
        // `finish` fails the test if the program is still running after WAIT.
        let (said, status) = p.finish();
        assert!(
            !status.success(),
            "the {who} succeeded on a dead device: {}",
            said.join("\n")
        );
    }
}
