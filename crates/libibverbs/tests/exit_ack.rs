//! A program that exits (`exit(3)`) right after its last receive, without destroying its QP
//! or closing its device, still acknowledges that receive (`tests/c/exit_ack.c`): on the net
//! path between two daemons its library holds a poll's ACKs for the program's next round
//! (docs/design/net-path.md, "Order"), and the drop-in's `atexit` handler sends them, as a NIC
//! acknowledges a SEND on arrival whatever the program does next. Without it the sender's
//! SEND ended in `RETRY_EXC_ERR` after its retries, for a message that was delivered.
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing. Run inside
//! `unshare -n` (the daemons bind UDP 4791 on 127.x addresses).

mod support;

use support::{c_toolchain_missing, compile, Daemon, Proc};

/// A loopback address of this test process's own (`support::loopback_addr`).
fn addr(host: u8) -> String {
    support::loopback_addr(220 + host)
}

#[test]
fn a_receiver_that_exits_without_cleaning_up_still_acknowledges_its_last_receive() {
    let a = Daemon::start_with_ip("exit-ack-a", &addr(1));
    let b = Daemon::start_with_ip("exit-ack-b", &addr(2));
    if let Some(why) = c_toolchain_missing() {
        eprintln!("SKIP: {why}");
        return;
    }
    let prog = a.dir.join("exit_ack");
    compile("tests/c/exit_ack.c", &prog);
    for round in 0..3 {
        let mut r: Proc = a.run("receiver", &prog, &["receiver"]);
        let mut s: Proc = b.run("sender", &prog, &["sender"]);
        let rq = r.expect("qp ");
        let sq = s.expect("qp ");
        r.tell(&format!("peer {sq}"));
        s.tell(&format!("peer {rq}"));
        r.expect("ready");
        s.expect("ready");
        s.tell("go");
        let (r_said, r_status) = r.finish();
        let (s_said, s_status) = s.finish();
        assert!(
            r_said.iter().any(|l| l == "ok received") && r_status.success(),
            "round {round}, receiver:\n{}\n{}",
            r_said.join("\n"),
            a.log()
        );
        assert!(
            s_said.iter().any(|l| l == "ok send_completed") && s_status.success(),
            "round {round}, sender:\n{}\nlogs:\n{}\n{}",
            s_said.join("\n"),
            b.log(),
            a.log()
        );
    }
}
