//! libfabric's connected endpoints over softverbs' connection manager, across the hosts of a
//! `softverbs cluster` (docs/mpi.md, docs/cm.md): `fi_pingpong` over `verbs` MSG endpoints
//! and over `verbs;ofi_rxm` RDM endpoints (RC, and XRC with `FI_VERBS_PREFER_XRC=1`), each
//! with fabtests' data check (`-c`), and Open MPI's `mtl ofi` over `verbs;ofi_rxm` on RC and
//! XRC running tests/mpi/mpi_check.c on 2 hosts × 2 ranks.
//!
//! Each test builds its own cluster (names `sv10…`), checks what the programs print, that
//! the hosts' daemons hold no CM state afterwards (every connection torn down), and that
//! `cluster down` leaves no namespace, link, process or state directory. A cluster is taken
//! down on drop, so a failing test cleans up too.
//!
//! Needs root, iproute2, libfabric-bin (and for the MPI tests openmpi-bin/libopenmpi-dev);
//! skipped, saying which, only when one is missing (CI has all and runs as root).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use softverbs_testkit::process::text;

#[macro_use]
mod cluster_support;
use cluster_support::*;

/// fabtests' out-of-band control port (`fi_pingpong -B`/`-P`).
const OOB_PORT: &str = "47592";

/// Waits (bounded) until a TCP listener on `port` exists in host `i`'s namespace.
fn wait_tcp_listener(c: &Cluster, i: usize, port: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", &c.host(i), "ss", "-Hltn"])
            .arg(format!("sport = :{port}"))
            .output()
            .expect("ss");
        if !out.stdout.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nothing listens on {port} on {}",
            c.host(i)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn finish(child: Child, what: &str) -> Output {
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `fi_pingpong ARGS` as server on host 1 and client on host 2 (environment `env` on both);
/// both must succeed. Returns the client's standard output and both sides' standard error.
fn pingpong(c: &Cluster, env: &[&str], args: &[&str]) -> (String, String) {
    let mut base = vec!["env"];
    base.extend(env);
    base.push("fi_pingpong");
    base.extend(args);
    let server = c
        .exec_cmd(1, &base)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the fi_pingpong server");
    wait_tcp_listener(c, 1, OOB_PORT);
    let peer = c.addr(1);
    let mut cargs = base.clone();
    cargs.push(&peer);
    let client = c.exec(2, &cargs);
    let server = finish(server, "fi_pingpong server");
    assert!(client.status.success(), "client: {}", text(&client));
    assert!(server.status.success(), "server: {}", text(&server));
    let err = String::from_utf8_lossy(&client.stderr).into_owned()
        + &String::from_utf8_lossy(&server.stderr);
    (String::from_utf8_lossy(&client.stdout).into_owned(), err)
}

/// The result rows of fi_pingpong's table for `sizes`, each with all `iters` acknowledged.
fn assert_rows(out: &str, sizes: &[&str], iters: u32) {
    for size in sizes {
        let row = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(size))
            .unwrap_or_else(|| panic!("no {size} row: {out}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols.get(1), Some(&iters.to_string().as_str()), "{row}");
        assert_eq!(
            cols.get(2),
            Some(&format!("={iters}").as_str()),
            "every transfer acknowledged: {row}"
        );
    }
}

/// Runs fi_pingpong on a fresh cluster with the data check on, for 64 B and 64 KiB, checks
/// the rows and that nothing is left behind. Returns the programs' standard error.
fn pingpong_test(name: &str, env: &[&str], provider: &str, ep: &str) -> String {
    let _one = JOBS.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up(name, 2);
    let mut logs = String::new();
    for size in ["64", "65536"] {
        let (out, err) = pingpong(
            &c,
            env,
            &["-p", provider, "-e", ep, "-c", "-I", "100", "-S", size],
        );
        let label = if size == "64" { "64" } else { "64k" };
        assert_rows(&out, &[label], 100);
        logs += &err;
    }
    c.assert_cm_drained(1);
    c.assert_cm_drained(2);
    c.down();
    logs
}

/// `fi_pingpong -p verbs -e msg`: libfabric's MSG endpoints are rdma_cm ids (resolve,
/// connect/accept with private data, the QP through `rdma_create_qp`).
#[test]
fn fi_pingpong_verbs_msg_between_two_hosts() {
    skip_unless!("fi_pingpong");
    pingpong_test("sv10m", &[], "verbs", "msg");
}

/// `fi_pingpong -p "verbs;ofi_rxm" -e rdm`: ofi_rxm's RDM endpoints over verbs MSG
/// endpoints, a passive endpoint on every host and connections made on first send.
#[test]
fn fi_pingpong_verbs_rxm_rdm_between_two_hosts() {
    skip_unless!("fi_pingpong");
    pingpong_test("sv10r", &[], "verbs;ofi_rxm", "rdm");
}

/// The same over XRC (`FI_VERBS_PREFER_XRC=1`, shared receive contexts): the verbs provider
/// makes XRC send QPs and XRC receive QPs with `rdma_create_qp_ex`, XRC SRQs, and connects
/// each direction separately; its log names both connections and the receive QP.
#[test]
fn fi_pingpong_verbs_rxm_rdm_over_xrc_between_two_hosts() {
    skip_unless!("fi_pingpong");
    let logs = pingpong_test(
        "sv10x",
        &[
            "FI_VERBS_PREFER_XRC=1",
            "FI_OFI_RXM_USE_SRX=1",
            "FI_LOG_LEVEL=info",
            "FI_LOG_PROV=verbs",
        ],
        "verbs;ofi_rxm",
        "rdm",
    );
    for line in ["INI Connection Done", "TGT Connection Done", "TGT QP Num"] {
        assert!(logs.contains(line), "not over XRC ({line} missing): {logs}");
    }
    assert!(!logs.contains("failed"), "{logs}");
}

/// Compiles tests/mpi/mpi_check.c with Open MPI's `mpicc` into a directory every host sees.
fn build_check() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi/mpi_check.c");
    let dir = std::env::temp_dir().join(format!("sv10-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("mpi_check_openmpi");
    let out = Command::new("mpicc.openmpi")
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run mpicc");
    assert!(out.status.success(), "mpicc: {}", text(&out));
    exe
}

/// Open MPI 4.1's `mtl ofi` over libfabric `verbs;ofi_rxm` (RC MSG endpoints through the
/// connection manager), 2 hosts × 2 ranks, as docs/mpi.md gives it: mpi_check's all-to-all,
/// allreduce, put/get and ring results, every rank on the softverbs0 domain, and every
/// connection torn down afterwards.
#[test]
fn open_mpi_mtl_ofi_verbs_rxm_runs_our_checks_across_two_hosts() {
    skip_unless!("mpirun", "mpicc.openmpi", "fi_info");
    let _one = JOBS.lock().unwrap_or_else(|e| e.into_inner());
    let exe = build_check();
    let c = Cluster::up("sv10o", 2);
    let dir = c.dir();
    let hostfile = dir.join("hostfile");
    let agent = dir.join("softverbs-rsh");
    let out = c.exec(
        1,
        &[
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "--hostfile",
            hostfile.to_str().unwrap(),
            "-np",
            "4",
            "--map-by",
            "ppr:2:node",
            "--mca",
            "plm_rsh_agent",
            agent.to_str().unwrap(),
            "--mca",
            "pml",
            "cm",
            "--mca",
            "mtl",
            "ofi",
            "--mca",
            "mtl_ofi_provider_include",
            "verbs;ofi_rxm",
            "--mca",
            "osc",
            "pt2pt",
            "--mca",
            "mtl_base_verbose",
            "100",
            exe.to_str().unwrap(),
        ],
    );
    let t = text(&out);
    assert!(out.status.success(), "mpirun: {t}");
    assert!(t.contains("mpi_check OK ranks=4 hosts=2"), "{t}");
    for i in 1..=2 {
        let on_host = t
            .lines()
            .filter(|l| l.starts_with("host ") && l.ends_with(&format!(" {}", c.host(i))))
            .count();
        assert_eq!(on_host, 2, "two ranks on {}: {t}", c.host(i));
    }
    assert_eq!(
        t.matches("mtl:ofi:provider: softverbs0\n").count(),
        4,
        "every rank on the RC domain: {t}"
    );
    c.assert_cm_drained(1);
    c.assert_cm_drained(2);
    c.down();
}
