//! rdma-core's own test suite, as Debian ships it with python3-pyverbs
//! (`/usr/share/doc/rdma-core/tests`), run unmodified on the drop-in `libibverbs.so.1` through
//! `softverbs run`, for the modules that exercise plain verbs: test_device, test_pd, test_mr,
//! test_cq, test_cq_events, test_qp, test_addr and test_fork, and for test_odp (on-demand paging).
//!
//! The run must have no failure and no error, and every skip must carry a reason listed in
//! [`ALLOWED_SKIPS`]: each is the skip rdma-core itself makes for a device without that feature
//! (docs/guide/dropin.md, "rdma-core's test suite").
//!
//! Skipped (with a message) only when `/usr/bin/python3` cannot import pyverbs or the suite is
//! not installed. The `softverbs` binary must be built in the same profile
//! (`cargo build -p softverbs-cli`): this crate cannot depend on it.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{finish_within, Daemon};

const PYTHON: &str = "/usr/bin/python3";
const SUITE: &str = "/usr/share/doc/rdma-core/tests";
const MODULES: &[&str] = &[
    "tests.test_device",
    "tests.test_pd",
    "tests.test_mr",
    "tests.test_cq",
    "tests.test_cq_events",
    "tests.test_qp",
    "tests.test_addr",
    "tests.test_fork",
];
/// How long the suite may take to run (it takes a few seconds).
const RUN: Duration = Duration::from_secs(300);

/// Every skip reason the run may print, with why it is what rdma-core does on a device
/// without the feature. A reason not listed here fails the test.
const ALLOWED_SKIPS: &[(&str, &str)] = &[
    (
        "Device memory is not supported",
        "ibv_alloc_dm → EOPNOTSUPP and max_dm_size = 0: softverbs has no on-device memory",
    ),
    (
        "Allocating dmabuf is not supported by /dev/dri/renderD128",
        "pyverbs' GPU buffer allocator fails first (Debian builds it without libdrm), any device",
    ),
    (
        "Device /dev/dri/renderD128 is not present",
        "the same, for a pyverbs built with libdrm on a host without a GPU",
    ),
    (
        "Reg dma-buf MR is not supported by the RDMA driver",
        "ibv_reg_dmabuf_mr → EOPNOTSUPP: softverbs cannot register a dma-buf",
    ),
    (
        "Create Raw Packet QP without extended attrs is not supported",
        "IBV_QPT_RAW_PACKET → EOPNOTSUPP: softverbs has no raw Ethernet QPs",
    ),
    (
        "Create Raw Packet QP with extended attrs is not supported",
        "as above, through ibv_create_qp_ex",
    ),
    (
        "Create Raw Packet QP without attrs is not supported",
        "as above, through ibv_create_qp",
    ),
    (
        "Create Raw Packet QP with attrs is not supported",
        "as above, through ibv_create_qp with a QPAttr",
    ),
    (
        "Must be run by root on Ethernet link layer",
        "run as non-root, the raw-QP tests stop before asking (any RoCE device)",
    ),
    (
        "Lack of permission to access /dev/dri/renderD128",
        "the dma-buf allocator's host permission, before any verbs call",
    ),
];

fn have_pyverbs() -> bool {
    let ok = Command::new(PYTHON)
        .args(["-c", "import pyverbs.device"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP: {PYTHON} cannot import pyverbs (apt-get install python3-pyverbs)");
        return false;
    }
    let suite = Path::new(SUITE);
    if !suite.join("run_tests.py").is_file() && !suite.join("run_tests.py.gz").is_file() {
        eprintln!("SKIP: {SUITE} is missing (apt-get install rdma-core)");
        return false;
    }
    true
}

/// Copies the suite into `dst` and unpacks its gzipped files (Debian compresses the larger
/// ones).
fn copy_suite(dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    let mut gz = false;
    for e in std::fs::read_dir(SUITE).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
            gz |= e.path().extension().is_some_and(|x| x == "gz");
        }
    }
    if gz {
        let st = Command::new("sh")
            .arg("-c")
            .arg("gunzip -f ./*.gz")
            .current_dir(dst)
            .status()
            .unwrap();
        assert!(st.success(), "gunzip failed in {}", dst.display());
    }
}

/// What unittest's verbose output says.
#[derive(Debug, Default, PartialEq)]
struct Summary {
    ran: usize,
    failures: usize,
    errors: usize,
    skipped: usize,
    /// The reason of every `... skipped 'REASON'` line, in order.
    skip_reasons: Vec<String>,
    /// The result lines that are neither ok nor skipped.
    bad: Vec<String>,
}

/// Parses unittest's `-v` output: result lines (`NAME ... ok|FAIL|ERROR|skipped 'why'`, where
/// a test's own prints may come between the dots and the verdict), `Ran N tests` and the final
/// `OK (skipped=N)` or `FAILED (failures=N, errors=N, skipped=N)`.
fn parse(out: &str) -> Summary {
    let mut s = Summary::default();
    for line in out.lines() {
        let l = line.trim_end();
        // unittest prints the reason's repr: single quotes, or double ones around a reason
        // that contains a single quote.
        let quoted = [(" skipped '", '\''), (" skipped \"", '"')]
            .into_iter()
            .find_map(|(tag, q)| {
                l.find(tag)
                    .filter(|_| l.ends_with(q))
                    .map(|i| i + tag.len())
            });
        if let Some(start) = quoted {
            s.skip_reasons.push(l[start..l.len() - 1].to_string());
            continue;
        }
        if l.ends_with("... ERROR")
            || l.ends_with("... FAIL")
            || l == "ERROR"
            || l == "FAIL"
            || l.ends_with("... unexpected success")
        {
            s.bad.push(l.to_string());
        }
        if let Some(rest) = l.strip_prefix("Ran ") {
            if let Some(n) = rest.split_whitespace().next() {
                s.ran = n.parse().unwrap_or(0);
            }
        }
        let verdict = l
            .strip_prefix("OK")
            .or_else(|| l.strip_prefix("FAILED"))
            .map(str::trim);
        if let Some(v) = verdict.filter(|v| v.is_empty() || v.starts_with('(')) {
            let v = v.trim_start_matches('(').trim_end_matches(')');
            for kv in v.split(',').map(str::trim).filter(|x| !x.is_empty()) {
                let (k, n) = kv.split_once('=').unwrap_or((kv, "0"));
                let n: usize = n.parse().unwrap_or(0);
                match k {
                    "failures" => s.failures = n,
                    "errors" => s.errors = n,
                    "skipped" => s.skipped = n,
                    _ => {}
                }
            }
        }
    }
    s
}

/// Skips the whole suite adds to the eight modules' ones: tests of other vendors' devices and
/// of features a generic RoCE device lacks; each is raised by rdma-core's test code itself.
const WHOLE_SUITE_SKIPS: &[(&str, &str)] = &[
    (
        "Can not run the test over non MLX5 device",
        "mlx5-only tests",
    ),
    (
        "Could not open mlx5 context (This is not an MLX5 device)",
        "mlx5dv_open_device on another vendor's device",
    ),
    ("Can not run the test over non EFA device", "EFA-only tests"),
    (
        "Create QP type 8 is not supported",
        "raw packet QP → EOPNOTSUPP",
    ),
    (
        "Parent Domain is not supported on this device",
        "ibv_alloc_td/alloc_parent_domain → EOPNOTSUPP",
    ),
    (
        "Extended CQ is not supported",
        "tag-matching CQ flags → EOPNOTSUPP (no tag matching)",
    ),
    (
        "Extended QP is not supported on this device",
        "ibv_wr_atomic_write (IBV_QP_EX_WITH_ATOMIC_WRITE) → EOPNOTSUPP: no atomic write; bind_mw runs (docs/design/memory-windows.md)",
    ),
    (
        "Converting timestamp to nanoseconds is not supported",
        "mlx5dv timestamp conversion, mlx5 only",
    ),
    HUGE_PAGES_SKIP,
    (
        "cuda-python 12.0+ must be installed to run CUDA tests",
        "host software",
    ),
    (
        "PCI device must be passed by the user",
        "mlx5 VFIO tests need a PCI device argument",
    ),
    (
        "Importing a device is not supported",
        "ibv_import_device → EOPNOTSUPP",
    ),
];

/// The eight plain-verbs modules the drop-in must pass.
#[test]
fn rdma_core_test_suite_passes() {
    check_suite("modules", MODULES, &[]);
}

/// rdma-core's on-demand-paging tests (RC, UD, XRC and SRQ traffic over ODP MRs, the
/// implicit MR, RDMA and atomics into ODP MRs, sync and async prefetch of each advice): all
/// run, none skips for a missing feature. The hugetlb pair needs 2 MiB pages reserved on
/// the host (`vm.nr_hugepages`), which is the host's configuration, not the device's; with
/// them reserved they pass too.
#[test]
fn rdma_core_odp_tests_pass() {
    check_suite("odp", &["tests.test_odp"], &[HUGE_PAGES_SKIP]);
}

/// rdma-core's RDMA-CM tests (test_rdmacm: sync and async ids, RC and UD traffic, reject,
/// an external QP brought up with rdma_init_qp_attr, RDMA read and write, multicast joins
/// with rdma_join_multicast and _ex, and a leave after which the group's traffic no longer
/// arrives) on the drop-in librdmacm. They run only because `softverbs run` shows the
/// device's netdev in sysfs (crates/cli/src/sysfs_net.rs): without it every one skips with
/// "Device softverbs0 doesn't have net interface", which no list here allows.
#[test]
fn rdma_core_rdmacm_tests_pass() {
    check_suite("rdmacm", &["tests.test_rdmacm"], &[]);
}

/// rdma-core's skip when the host has no 2 MiB huge pages reserved.
const HUGE_PAGES_SKIP: (&str, &str) = (
    "There are no huge pages of size 2M allocated",
    "host configuration",
);

/// The whole suite as shipped (273 tests), so `ibv_qp_ex`, `ibv_cq_ex`, atomics and XRC
/// traffic (test_qpex, test_cqex, test_atomic, test_relaxed_ordering) are covered too.
#[test]
fn the_whole_rdma_core_suite_has_no_failure_or_error() {
    check_suite("all", &[], WHOLE_SUITE_SKIPS);
}

/// The drop-in librdmacm of this build (`cargo build -p softverbs-librdmacm`).
fn rdmacm_library() -> std::path::PathBuf {
    let profile = support::profile_dir();
    [
        profile.join("deps/librdmacm.so"),
        profile.join("librdmacm.so"),
    ]
    .into_iter()
    .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
    .max()
    .map(|(_, p)| p)
    .unwrap_or_else(|| {
        panic!(
            "no librdmacm.so in {} (cargo build -p softverbs-librdmacm)",
            profile.display()
        )
    })
}

fn check_suite(name: &str, modules: &[&str], extra_skips: &[(&str, &str)]) {
    if !have_pyverbs() {
        return;
    }
    let daemon = Daemon::start(name);
    let work = daemon.dir.join("t");
    copy_suite(&work.join("tests"));
    // test_rdmacm's players load librdmacm.so.1: this build's drop-in, beside the drop-in
    // libibverbs in the directory `softverbs run` puts on LD_LIBRARY_PATH.
    std::os::unix::fs::symlink(
        rdmacm_library(),
        daemon.lib.with_file_name("librdmacm.so.1"),
    )
    .expect("symlink the drop-in librdmacm");

    let child = daemon
        .command(PYTHON, &["tests/run_tests.py", "--dev", "softverbs0", "-v"])
        .args(modules)
        .current_dir(&work)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = finish_within(child, "the suite", RUN);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let s = parse(&out);
    let unexpected: Vec<&String> = s
        .skip_reasons
        .iter()
        .filter(|r| !ALLOWED_SKIPS.iter().chain(extra_skips).any(|(a, _)| a == r))
        .collect();
    eprintln!(
        "rdma-core tests ({name}): {} ran, {} ok, {} skipped, {} failures, {} errors",
        s.ran,
        s.ran.saturating_sub(s.skipped + s.failures + s.errors),
        s.skipped,
        s.failures,
        s.errors
    );
    let ctx = || {
        format!(
            "\n--- suite output ---\n{out}\n--- daemon log ---\n{}",
            daemon.log()
        )
    };
    assert!(s.ran > 0, "the suite ran no test{}", ctx());
    assert_eq!(
        (s.failures, s.errors),
        (0, 0),
        "failures/errors: {:#?}{}",
        s.bad,
        ctx()
    );
    assert!(s.bad.is_empty(), "failed tests: {:#?}{}", s.bad, ctx());
    assert!(
        o.status.success(),
        "the suite exited with {}{}",
        o.status,
        ctx()
    );
    assert_eq!(
        s.skip_reasons.len(),
        s.skipped,
        "skip lines and summary disagree{}",
        ctx()
    );
    assert!(
        unexpected.is_empty(),
        "skips rdma-core does not make for a device without the feature: {unexpected:#?}{}",
        ctx()
    );
}

#[test]
fn parses_unittest_output() {
    let out = r#"test_a (tests.x.A.test_a)
Doc line ... ok
test_b (tests.x.A.test_b) ... skipped 'Device memory is not supported'
test_b2 (tests.x.A.test_b2) ... skipped "Device x doesn't have net interface"
test_c (tests.x.A.test_c) ... some print
ok
test_d (tests.x.A.test_d) ... FAIL
test_e (tests.x.A.test_e) ... ERROR

----------------------------------------------------------------------
Ran 6 tests in 0.4s

FAILED (failures=1, errors=1, skipped=2)
"#;
    let s = parse(out);
    assert_eq!(s.ran, 6);
    assert_eq!((s.failures, s.errors, s.skipped), (1, 1, 2));
    assert_eq!(
        s.skip_reasons,
        vec![
            "Device memory is not supported",
            "Device x doesn't have net interface"
        ]
    );
    assert_eq!(s.bad.len(), 2);
    let ok = parse("Ran 3 tests in 1s\n\nOK (skipped=2)\n");
    assert_eq!((ok.ran, ok.skipped, ok.failures), (3, 2, 0));
    assert_eq!(parse("Ran 1 test in 0s\n\nOK\n").ran, 1);
}
