//! The legacy OFED XRC API from C, across real processes, on the drop-in `libibverbs.so.1`:
//! `examples/xrc_legacy.c` compiled with gcc against `<infiniband/verbs.h>` and
//! `<softverbs/xrc_legacy.h>`, linked against this crate's library, every role started with
//! `softverbs run` on a daemon of the test's own.
//!
//! A creator makes the shared receive QP, two workers register with it and each own an XRC SRQ,
//! a sender's XRC send QP reaches both SRQs through that one QP. The creator is SIGKILLed between
//! (and while) the sender's two batches. What a user would check: every message arrives once,
//! intact, at the SRQ it named (the workers check each one; their digests equal the sender's);
//! `softverbs resources --json` shows the QP outliving its creator with the two workers as
//! holders, then one, then no QP at all.
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing. The `softverbs`
//! binary must be built in the same profile (`cargo build -p softverbs-cli`): this crate cannot
//! depend on it.

mod support;

use serde_json::Value;
use support::{c_program, has_pid, Proc, SECTIONS};

/// Messages per worker, sent in two batches of half.
const COUNT: u32 = 48;

/// The holders of receive QP `qpn` as (pid, kind), sorted, or None if there is no such QP.
fn holders(r: &Value, qpn: u32) -> Option<Vec<(u64, String)>> {
    let mut h = support::holders(r, qpn)?;
    h.sort();
    Some(h)
}

fn registrations(pids: &[u64]) -> Vec<(u64, String)> {
    let mut v: Vec<(u64, String)> = pids.iter().map(|&p| (p, "Registration".into())).collect();
    v.sort();
    v
}

/// The whole story with the creator on `creator_face` and the workers on `worker_faces`.
fn scenario(name: &str, creator_face: &str, worker_faces: [&str; 2]) {
    let Some((d, prog)) = c_program(name, "examples/xrc_legacy.c") else {
        return;
    };
    let file = d.dir.join("domain");
    let f = file.to_str().expect("utf-8 path");

    let mut creator = d.run("creator", &prog, &["creator", f, creator_face]);
    let qpn: u32 = creator.expect("QPN").parse().expect("QPN number");
    let count = COUNT.to_string();
    let mut workers: Vec<Proc> = worker_faces
        .iter()
        .enumerate()
        .map(|(i, face)| {
            d.run(
                &format!("worker{i}"),
                &prog,
                &["worker", f, &qpn.to_string(), &count, face],
            )
        })
        .collect();
    let srqns: Vec<String> = workers.iter().map(|w| w.expect("SRQN")).collect();
    let worker_pids: Vec<u64> = workers.iter().map(Proc::pid).collect();
    let r = d.resources();
    let mut all = registrations(&worker_pids);
    all.push((creator.pid(), "Creator".into()));
    all.sort();
    assert_eq!(
        holders(&r, qpn),
        Some(all),
        "the creator and both workers hold the QP: {r:#}"
    );

    let mut sender_args = vec!["sender".to_string(), qpn.to_string()];
    sender_args.extend(srqns.iter().cloned());
    let sender_args: Vec<&str> = sender_args.iter().map(String::as_str).collect();
    let mut sender = d.run("sender", &prog, &sender_args);
    let conn = sender.expect("QPN");
    let (sqpn, psn) = conn.split_once(" PSN ").expect("QPN <n> PSN <psn>");
    creator.tell(&format!("{sqpn} {psn}"));
    creator.expect("RTR");

    // The first half with the creator alive; then SIGKILL it while the second half is sent.
    let half = COUNT / 2;
    sender.tell(&format!("SEND {half}"));
    assert_eq!(sender.expect("SENT"), (2 * half).to_string());
    sender.tell(&format!("SEND {}", COUNT - half));
    let creator_pid = creator.pid();
    creator.kill9();
    let r = d.wait_until("the creator's context is gone", |r| {
        !has_pid(r, creator_pid)
    });
    assert_eq!(
        holders(&r, qpn),
        Some(registrations(&worker_pids)),
        "the receive QP survives its creator's SIGKILL with the workers as holders: {r:#}"
    );
    assert_eq!(sender.expect("SENT"), (2 * COUNT).to_string());
    sender.close_stdin();
    let mut sent_to = std::collections::BTreeMap::new();
    for _ in 0..2 {
        let l = sender.expect("SENT_TO");
        let v: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(v[1], count, "{l}");
        sent_to.insert(v[0].to_string(), v[2].to_string());
    }
    sender.expect("DONE");
    sender.exits_zero();

    // Every message once, intact, at the SRQ it named: each worker checked every byte and
    // header of what it got and found nothing wrong, and got what was sent to its SRQ.
    for (w, srqn) in workers.iter().zip(&srqns) {
        let got = w.expect("RECEIVED");
        assert_eq!(
            got,
            format!("{COUNT} bad=0 digest={}", sent_to[srqn]),
            "{} (SRQ {srqn})",
            w.name
        );
    }

    // The workers leave one by one; the last one out takes the QP (and the domain) with it.
    for (i, w) in workers.iter_mut().enumerate() {
        w.tell("LEAVE");
        assert_eq!(w.expect("UNREGISTERED"), "extra=0", "{}", w.name);
        w.exits_zero();
        let pid = w.pid();
        let r = d.wait_until("the worker's context is gone", |r| !has_pid(r, pid));
        if i == 0 {
            assert_eq!(
                holders(&r, qpn),
                Some(registrations(&worker_pids[1..])),
                "one worker left, the other still holds the QP: {r:#}"
            );
        } else {
            assert_eq!(
                holders(&r, qpn),
                None,
                "the last unregister destroyed the QP: {r:#}"
            );
            assert_eq!(r["xrcds"].as_array().map(Vec::len), Some(0), "{r:#}");
        }
    }
    let r = d.resources();
    for section in SECTIONS {
        assert_eq!(
            r[section].as_array().map(Vec::len),
            Some(0),
            "{section} left over: {r:#}"
        );
    }
}

#[test]
fn legacy_receive_qp_outlives_its_creators_sigkill_and_serves_every_workers_srq() {
    scenario("legacy", "legacy", ["legacy", "legacy"]);
}

#[test]
fn minimal_register_pair_creates_and_joins_the_same_kind_of_shared_qp() {
    scenario("minimal", "minimal", ["minimal", "legacy"]);
}
