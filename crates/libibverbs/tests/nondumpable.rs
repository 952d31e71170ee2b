//! A process that is not dumpable (`prctl(PR_SET_DUMPABLE, 0)`, as privilege-dropping
//! programs make themselves) uses the device, and no same-uid process gets a descriptor of
//! its memory from the daemon (issue 35, item 5; docs/design/direct-path.md, "Who goes direct";
//! docs/design/registered-memory.md, "A process that is not dumpable"). `tests/c/nondumpable.c`
//! forks a second process of the same uid; each opens its own context and they ping-pong
//! SENDs and RDMA WRITEs over a pair of RC QPs, then report whether they hold the other's
//! `/proc/<pid>/mem`.
//!
//! Runs the program as uid 65534: root may open any process's memory (`CAP_SYS_PTRACE`,
//! `CAP_DAC_OVERRIDE`), so only another uid shows the rule. Needs root to switch (else it
//! says `SKIP`), and gcc and rdma-core's `verbs.h`.

mod support;

use std::os::unix::process::CommandExt;

use support::{assert_nothing_left, c_toolchain_missing, compile, is_root, Daemon};

const NOBODY: u32 = 65534;

/// Runs `nondumpable MODE` as uid 65534 and returns, per side, whether it held its peer's
/// `mem` descriptor.
fn run(name: &str, mode: &str) -> Option<[bool; 2]> {
    if let Some(why) = c_toolchain_missing() {
        eprintln!("SKIP: {why}");
        return None;
    }
    if !is_root() {
        eprintln!("SKIP: needs root to run the program as uid {NOBODY}");
        return None;
    }
    let d = Daemon::start_with_options(softverbs_testkit::Daemon::options(name).open_to_all());
    let prog = d.dir.join("nondumpable");
    compile("tests/c/nondumpable.c", &prog);
    let mut cmd = d.command(&prog, &[mode]);
    cmd.uid(NOBODY).gid(NOBODY).env_remove("XDG_RUNTIME_DIR");
    let out = cmd.output().expect("run nondumpable");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let text = format!(
        "{said}\n{}\ndaemon log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    eprintln!("{text}");
    for check in ["side0_pingpong", "side1_pingpong", "child_exited_cleanly"] {
        assert!(
            said.lines().any(|l| l == format!("ok {check}")),
            "{check}: {text}"
        );
    }
    // The parent's summary counts its own two checks (the child's is its exit status).
    assert!(
        said.lines().any(|l| l == "nondumpable: 2 checks, 0 failed"),
        "{text}"
    );
    assert!(
        !said
            .lines()
            .any(|l| l.starts_with("FAIL") || l.starts_with("FATAL")),
        "{text}"
    );
    assert!(out.status.success(), "exit {}: {text}", out.status);
    let holds = |side: u32| {
        let v = said
            .lines()
            .find_map(|l| l.strip_prefix(&format!("info holds_peer_mem {side} ")))
            .unwrap_or_else(|| panic!("side {side} did not say: {text}"));
        v == "1"
    };
    let r = [holds(0), holds(1)];
    assert_nothing_left(&d);
    Some(r)
}

/// The control: two dumpable processes of one uid go direct, each holding the other's
/// `mem` (so the checks below can see a descriptor when there is one).
#[test]
fn dumpable_processes_of_one_uid_go_direct() {
    if let Some(holds) = run("nd-none", "none") {
        assert_eq!(holds, [true, true]);
    }
}

/// Before: `ibv_open_device` failed with `EACCES` in the non-dumpable process (it could
/// not open its own `/proc/self/mem`).
#[test]
fn a_process_that_is_not_dumpable_uses_the_device() {
    if let Some(holds) = run("nd-early", "early") {
        assert_eq!(
            holds,
            [false, false],
            "no descriptor of a non-dumpable process"
        );
    }
}

/// Before: the pair went direct and the dumpable side held the non-dumpable side's `mem`.
#[test]
fn a_process_that_became_not_dumpable_gives_no_peer_its_memory() {
    if let Some(holds) = run("nd-late", "late") {
        assert_eq!(
            holds,
            [false, false],
            "the pair must stay on the daemon path"
        );
    }
}
