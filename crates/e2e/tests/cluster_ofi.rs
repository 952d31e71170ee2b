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
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use softverbs_testkit::bins::softverbs_bin;
use softverbs_testkit::process::text;

/// Where `cluster up` keeps its state (crates/cli/src/cluster/state.rs).
const STATE_ROOT: &str = "/run/softverbs/cluster";

/// One job at a time: two daemons and four processes already fill two cores.
static JOBS: Mutex<()> = Mutex::new(());

/// The bound on any one command (a hang fails the test instead of stalling it).
const JOB_TIMEOUT: &str = "60";

fn why_skip(programs: &[&str]) -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not root (network namespaces need it)".into());
    }
    for p in programs.iter().chain(&["ip", "ss", "timeout"]) {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()));
        if !found {
            return Some(format!("{p} is not installed"));
        }
    }
    None
}

macro_rules! skip_unless {
    ($($p:expr),*) => {
        if let Some(why) = why_skip(&[$($p),*]) {
            assert!(std::env::var_os("CI").is_none(), "CI has everything: {why}");
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}

fn softverbs_cmd(args: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    c.args(["--kill-after=5", JOB_TIMEOUT])
        .arg(softverbs_bin())
        .args(args);
    c
}

fn softverbs(args: &[&str]) -> Output {
    softverbs_cmd(args).output().expect("run softverbs")
}

/// A cluster of the test's own, taken down on drop.
struct Cluster {
    name: String,
    down: bool,
}

impl Cluster {
    fn up(name: &str, hosts: usize) -> Cluster {
        assert!(
            name.starts_with("sv10"),
            "test clusters carry the sv10 prefix"
        );
        let out = softverbs(&[
            "cluster",
            "up",
            "--name",
            name,
            "--hosts",
            &hosts.to_string(),
        ]);
        assert!(out.status.success(), "cluster up: {}", text(&out));
        Cluster {
            name: name.to_string(),
            down: false,
        }
    }

    fn dir(&self) -> PathBuf {
        Path::new(STATE_ROOT).join(&self.name)
    }

    fn host(&self, i: usize) -> String {
        format!("{}-{i}", self.name)
    }

    fn addr(&self, i: usize) -> String {
        let out = softverbs(&["cluster", "status", "--name", &self.name, "--json"]);
        let s: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("cluster status --json: {e}: {}", text(&out)));
        s["hosts"][i - 1]["addr"]
            .as_str()
            .unwrap_or_else(|| panic!("no address for host {i}: {s}"))
            .to_string()
    }

    /// The `cm` object of `softverbs resources --json` from host `i`'s daemon.
    fn cm(&self, i: usize) -> Value {
        let sock = self.dir().join(self.host(i)).join("softverbs.sock");
        let out = softverbs(&["--socket", sock.to_str().unwrap(), "resources", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["cm"].clone()
    }

    /// Waits (bounded) until host `i`'s daemon holds no listener, connection or CM id.
    fn assert_cm_drained(&self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let cm = self.cm(i);
            if ["listeners", "connections", "time_wait", "owned"]
                .iter()
                .all(|k| cm[k] == 0)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "CM state left on {}: {cm}",
                self.host(i)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn exec_cmd(&self, i: usize, args: &[&str]) -> Command {
        let host = self.host(i);
        let mut all = vec!["cluster", "exec", &host, "--"];
        all.extend(args);
        softverbs_cmd(&all)
    }

    fn exec(&self, i: usize, args: &[&str]) -> Output {
        self.exec_cmd(i, args).output().expect("cluster exec")
    }

    /// Takes the cluster down and checks that nothing of it is left.
    fn down(mut self) {
        self.down = true;
        let out = softverbs(&["cluster", "down", "--name", &self.name]);
        assert!(out.status.success(), "cluster down: {}", text(&out));
        assert_gone(&self.name);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.down {
            let _ = softverbs(&["cluster", "down", "--name", &self.name]);
        }
    }
}

/// Namespaces, links, processes and state of cluster `name` still on the machine.
fn leftovers(name: &str) -> Vec<String> {
    let lines = |args: &[&str]| -> Vec<String> {
        let out = Command::new("ip").args(args).output().expect("ip");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let ours = |s: &str| s.starts_with(&format!("{name}-"));
    let mut left: Vec<String> = lines(&["netns", "list"])
        .into_iter()
        .filter(|l| ours(l))
        .map(|l| format!("namespace {l}"))
        .collect();
    left.extend(
        lines(&["-o", "link", "show"])
            .into_iter()
            .filter_map(|l| {
                l.split(": ")
                    .nth(1)
                    .map(|n| n.split('@').next().unwrap_or(n).to_string())
            })
            .filter(|n| ours(n))
            .map(|n| format!("link {n}")),
    );
    let dir = format!("{STATE_ROOT}/{name}/");
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(&dir) && !cmd.contains("cluster status") {
            left.push(format!("process {pid}: {cmd}"));
        }
    }
    if Path::new(&dir).exists() {
        left.push(format!("state {dir}"));
    }
    left
}

fn assert_gone(name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = leftovers(name);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "after cluster down: {left:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

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
