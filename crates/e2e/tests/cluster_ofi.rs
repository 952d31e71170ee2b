//! libfabric's connected endpoints over softverbs' connection manager, across the hosts of a
//! `softverbs cluster` (docs/guide/mpi.md, docs/design/cm.md): `fi_pingpong` over `verbs` MSG endpoints
//! and over `verbs;ofi_rxm` RDM endpoints (RC, and XRC with `FI_VERBS_PREFER_XRC=1`), each
//! with fabtests' data check (`-c`), and Open MPI's `mtl ofi` over `verbs;ofi_rxm` on RC and
//! XRC running tests/mpi/mpi_check.c (and, over XRC, mpi4py.bench) on 2 hosts × 2 ranks, the
//! XRC run reading each host's QPs during the job against the formulas of docs/guide/mpi.md.
//!
//! Each test builds its own cluster (names `sv10…`, `sv3o`), checks what the programs print, that
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
/// connection manager), 2 hosts × 2 ranks, as docs/guide/mpi.md gives it: mpi_check's all-to-all,
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

/// How a `verbs;ofi_rxm` job asks libfabric for its endpoints.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rxm {
    /// RC, each endpoint with its own receive queue: libfabric offers only `softverbs0`.
    Rc,
    /// RC with shared receive contexts (`FI_OFI_RXM_USE_SRX=1`): libfabric then offers
    /// `softverbs0` and `softverbs0-xrc` alternately, RC first, and every rank must take RC.
    RcSrx,
    /// XRC: shared receive contexts and `FI_VERBS_PREFER_XRC=1`, which lists the XRC domain
    /// first; every rank must take `softverbs0-xrc`.
    Xrc,
}

impl Rxm {
    fn domain(self) -> &'static str {
        match self {
            Rxm::Rc | Rxm::RcSrx => "softverbs0",
            Rxm::Xrc => "softverbs0-xrc",
        }
    }
}

/// `mpirun` of Open MPI's `mtl ofi` over `verbs;ofi_rxm` on host 1, 2 hosts × 2 ranks, with
/// the environment of `how` and nothing else: no LD_PRELOAD, no domain named anywhere.
/// Open MPI 4.1 cannot be told a domain; it spreads ranks over the fi_infos alike the first
/// (`opal_mca_common_ofi_select_provider`), and libfabric's XRC and RC fi_infos differ only in
/// `inject_size` (XRC send QPs' 16 bytes less inline, `softverbs_core::qp::max_inline_data`).
fn rxm_job(c: &Cluster, how: Rxm, program: &[&str]) -> Command {
    let dir = c.dir();
    let hostfile = dir.join("hostfile").to_str().unwrap().to_string();
    let agent = dir.join("softverbs-rsh").to_str().unwrap().to_string();
    let mut args: Vec<&str> = vec![
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "--hostfile",
        &hostfile,
        "-np",
        "4",
        "--map-by",
        "ppr:2:node",
        "--mca",
        "plm_rsh_agent",
        &agent,
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
    ];
    if how != Rxm::Rc {
        args.extend(["-x", "FI_OFI_RXM_USE_SRX=1"]);
    }
    if how == Rxm::Xrc {
        args.extend(["-x", "FI_VERBS_PREFER_XRC=1"]);
    }
    args.extend(program);
    c.exec_cmd(1, &args)
}

/// The QPs one host's daemon holds: by type, and the holders of each XRC receive QP.
#[derive(Debug, PartialEq)]
struct HostQps {
    rc: usize,
    xrc_send: usize,
    xrc_srqs: usize,
    /// Holders of each XRC receive QP, ascending.
    xrc_recv_holders: Vec<usize>,
}

fn host_qps(c: &Cluster, i: usize) -> HostQps {
    let sock = c.dir().join(c.host(i)).join("softverbs.sock");
    let out = softverbs(&["--socket", sock.to_str().unwrap(), "resources", "--json"]);
    assert!(out.status.success(), "resources: {}", text(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("resources JSON");
    let of_type = |t: &str| {
        r["qps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|q| q["qp_type"] == t)
            .count()
    };
    let mut xrc_recv_holders: Vec<usize> = r["xrc_recv_qps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["holders"].as_array().unwrap().len())
        .collect();
    xrc_recv_holders.sort_unstable();
    HostQps {
        rc: of_type("Rc"),
        xrc_send: of_type("XrcSend"),
        xrc_srqs: r["srqs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| !s["xrcd"].is_null())
            .count(),
        xrc_recv_holders,
    }
}

/// Runs `job` (mpi_check with a hold), reads both hosts' QPs once every rank has passed its
/// checks and holds its connections, and returns them with the job's output.
fn qps_during(c: &Cluster, mut job: Command) -> (Vec<HostQps>, String) {
    use std::io::{BufRead as _, BufReader, Read as _};
    let mut child = job
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the job");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("mpi_check OK") {
                let _ = tx.send(());
            }
            all += &line;
            all.push('\n');
        }
        all
    });
    let passed = rx.recv_timeout(Duration::from_secs(90)).is_ok();
    let qps = if passed {
        (1..=2).map(|i| host_qps(c, i)).collect()
    } else {
        Vec::new()
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).ok();
    let status = child.wait().expect("wait for the job");
    let out = reader.join().unwrap() + &err;
    assert!(passed && status.success(), "mpirun ({status}): {out}");
    (qps, out)
}

/// The counts of an all-to-all job of N hosts × P ranks through `verbs;ofi_rxm`, per host
/// (docs/guide/mpi.md, "XRC's savings"): over RC every rank has one RC QP per other rank; over XRC
/// every rank has one XRC send QP per host it has a peer on (its own included when P > 1,
/// libfabric's shared INI connection per destination address) and every such send QP ends in
/// one XRC receive QP on its destination host, held by each rank there it carries traffic
/// for (P, or P − 1 for a send QP of the host's own ranks); one XRC SRQ per rank.
fn rc_formula(n: usize, p: usize) -> HostQps {
    HostQps {
        rc: p * (n * p - 1),
        xrc_send: 0,
        xrc_srqs: 0,
        xrc_recv_holders: vec![],
    }
}

fn xrc_formula(n: usize, p: usize) -> HostQps {
    let local = if p > 1 { p } else { 0 };
    let mut holders = vec![p; p * (n - 1)];
    holders.extend(vec![p - 1; local]);
    holders.sort_unstable();
    HostQps {
        rc: 0,
        xrc_send: p * (n - 1) + local,
        xrc_srqs: p,
        xrc_recv_holders: holders,
    }
}

/// Open MPI's `mtl ofi` over `verbs;ofi_rxm` over XRC (`FI_OFI_RXM_USE_SRX=1`,
/// `FI_VERBS_PREFER_XRC=1`, no LD_PRELOAD filter), 2 hosts × 2 ranks: every rank on the
/// `softverbs0-xrc` domain (before XRC send QPs reported 16 bytes less inline than RC QPs,
/// Open MPI put two ranks on each domain and the job hung),
/// mpi_check's results and mpi4py.bench helloworld/ringtest; and the same all-to-all over RC,
/// and mpi4py.bench over RC with shared receive contexts (where libfabric offers both
/// domains, RC first), on the same cluster for comparison. Read while the jobs hold their connections, each
/// host's QPs follow the formulas of [`rc_formula`] and [`xrc_formula`]: 4 XRC send QPs per
/// host where RC needs 6 RC QPs, plus 4 XRC receive QPs (two shared by both of the host's
/// ranks) that live in the host's XRC domain rather than in any process.
#[test]
fn open_mpi_mtl_ofi_verbs_rxm_over_xrc_runs_our_checks_and_mpi4py_with_fewer_qps() {
    skip_unless!("mpirun", "mpicc.openmpi", "fi_info", "python3");
    let _one = JOBS.lock().unwrap_or_else(|e| e.into_inner());
    let exe = build_check();
    let exe = exe.to_str().unwrap();
    let c = Cluster::up("sv3o", 2);

    let (rc, out) = qps_during(&c, rxm_job(&c, Rxm::Rc, &[exe, "10", "3"]));
    assert_eq!(
        out.matches("mtl:ofi:provider: softverbs0\n").count(),
        4,
        "every rank on the RC domain: {out}"
    );
    let (xrc, out) = qps_during(&c, rxm_job(&c, Rxm::Xrc, &[exe, "10", "3"]));
    assert!(out.contains("mpi_check OK ranks=4 hosts=2"), "{out}");
    assert_eq!(
        out.matches("mtl:ofi:provider: softverbs0-xrc\n").count(),
        4,
        "every rank on the XRC domain: {out}"
    );
    assert!(!out.contains("Segmentation fault"), "{out}");
    for (h, (rc, xrc)) in rc.iter().zip(&xrc).enumerate() {
        assert_eq!(rc, &rc_formula(2, 2), "RC QPs of host {}", h + 1);
        assert_eq!(xrc, &xrc_formula(2, 2), "XRC QPs of host {}", h + 1);
        assert!(
            xrc.xrc_send < rc.rc,
            "host {}: {} XRC send QPs, {} RC QPs",
            h + 1,
            xrc.xrc_send,
            rc.rc
        );
    }

    // mpi4py.bench over both domains: RC (`softverbs0`, here with shared receive contexts,
    // so that libfabric offers both) and XRC (`softverbs0-xrc`).
    for how in [Rxm::RcSrx, Rxm::Xrc] {
        let domain = how.domain();
        let py = |args: &[&str]| {
            let mut prog = vec!["/usr/bin/python3", "-m", "mpi4py.bench"];
            prog.extend(args);
            let out = rxm_job(&c, how, &prog).output().expect("mpirun");
            let t = text(&out);
            assert!(
                out.status.success(),
                "mpi4py.bench {args:?} on {domain}: {t}"
            );
            let chosen = format!("mtl:ofi:provider: {domain}\n");
            assert_eq!(t.matches(&chosen).count(), 4, "{t}");
            t
        };
        let t = py(&["helloworld"]);
        for (rank, host) in [(0, 1), (1, 1), (2, 2), (3, 2)] {
            let line = format!(
                "Hello, World! I am process {rank} of 4 on {}.",
                c.host(host)
            );
            assert!(t.contains(&line), "{line:?} in {t}");
        }
        let t = py(&["ringtest", "-l", "20", "-n", "65536"]);
        assert!(t.contains("(4 processes, 65536 bytes)"), "{t}");
    }

    c.assert_cm_drained(1);
    c.assert_cm_drained(2);
    c.down();
}
