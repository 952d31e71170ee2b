//! `softverbs cluster`: N RDMA hosts on one machine (docs/guide/mpi.md).
//!
//! `up` makes a bridge, one network namespace per host with a veth on it (net.rs), and one
//! daemon per host whose device `softverbs0` has the host's address, so the hosts talk RoCE v2
//! over UDP 4791 across the bridge as machines on one Ethernet segment do. `exec` runs a
//! command on a host (enter.rs) and doubles as an MPI launcher's remote shell (agent.rs);
//! `status` shows the hosts, their daemons and their objects; `down` removes everything `up`
//! made, found by name (state.rs), so it also cleans up after a crash.
//!
//! Connection managers and other per-host services plug in as more processes per host: `up`
//! starts each host's processes in `spawn_host_services`, `down` stops every process in the
//! host's namespace, and `status` asks each host's daemon.

mod agent;
mod enter;
mod net;
mod state;
mod teardown;

use std::ffi::OsString;
use std::fmt::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Subcommand;
use softverbs::Introspect;
pub use state::Cluster;
use teardown::{leftovers, remove};

/// How long a new daemon may take to accept connections.
const DAEMON_START: Duration = Duration::from_secs(10);

/// Exit status of `down`, `status` and `exec` when there is no such cluster: 3, "not
/// running", as for `softverbs status` without a daemon.
const NOT_UP: u8 = 3;

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Build N hosts (root): network namespaces NAME-1..NAME-N on bridge NAME-br, addresses
    /// 198.18.x.1..N/24 (RFC 2544's benchmarking range), one daemon per host.
    Up {
        /// How many hosts.
        #[arg(long, default_value_t = 2)]
        hosts: usize,
        /// The cluster's name: the prefix of its hosts, links and state directory.
        #[arg(long, default_value = "sv", env = "SOFTVERBS_CLUSTER")]
        name: String,
        /// Have each host's daemon write its device's traffic to DIR/HOST/softverbs0.pcap
        /// (the daemon's `--capture`), for Wireshark or tshark.
        #[arg(long, value_name = "DIR")]
        capture: Option<std::path::PathBuf>,
    },
    /// Stop every process on the hosts and remove the namespaces, links and state.
    Down {
        #[arg(long, default_value = "sv", env = "SOFTVERBS_CLUSTER")]
        name: String,
    },
    /// The hosts, their daemons and the objects each daemon holds.
    Status {
        #[arg(long, default_value = "sv", env = "SOFTVERBS_CLUSTER")]
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command on a host: `exec HOST -- PROGRAM ARGS...`, or ssh's shape
    /// `exec [ssh options] HOST COMMAND...` (the words run by /bin/sh, with a login's
    /// environment), so it serves as `mpirun --mca plm_rsh_agent` and hydra's
    /// `-launcher-exec` (the link STATE/softverbs-rsh that `up` prints).
    Exec {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<OsString>,
    },
}

pub fn run(cmd: &ClusterCmd) -> ExitCode {
    let r = match cmd {
        ClusterCmd::Up {
            hosts,
            name,
            capture,
        } => up(name, *hosts, capture.as_deref()),
        ClusterCmd::Down { name } => down(name),
        ClusterCmd::Status { name, json } => status(name, *json),
        ClusterCmd::Exec { args } => exec(args),
    };
    r.unwrap_or_else(|(code, e)| {
        eprintln!("softverbs cluster: {e}");
        ExitCode::from(code)
    })
}

type Outcome = Result<ExitCode, (u8, String)>;

fn err(e: impl Into<String>) -> (u8, String) {
    (1, e.into())
}

fn need_root(what: &str) -> Result<(), (u8, String)> {
    if rustix::process::geteuid().is_root() {
        Ok(())
    } else {
        Err(err(format!(
            "{what} needs root (network namespaces, veth links and mounts need CAP_SYS_ADMIN and CAP_NET_ADMIN): run it with sudo"
        )))
    }
}

fn namespaces_available() -> Result<(), (u8, String)> {
    if Path::new("/proc/self/ns/net").exists() {
        Ok(())
    } else {
        Err(err(
            "network namespaces are unavailable (no /proc/self/ns/net: a kernel without CONFIG_NET_NS, or /proc not mounted)",
        ))
    }
}

/// Whether a daemon answers at `socket`.
fn answers(socket: &Path) -> bool {
    Introspect::connect_running(socket).is_ok()
}

fn up(name: &str, hosts: usize, capture: Option<&Path>) -> Outcome {
    need_root("cluster up")?;
    namespaces_available()?;
    state::check_name(name).map_err(err)?;
    if !(1..=state::MAX_HOSTS).contains(&hosts) {
        return Err(err(format!("--hosts {hosts}: 1 to {}", state::MAX_HOSTS)));
    }
    // One `up` at a time on this machine, so two clusters never pick the same subnet.
    let _lock = state::lock().map_err(err)?;
    if let Some(old) = Cluster::load(name) {
        let alive = (1..=old.hosts).filter(|&i| answers(&old.socket(i))).count();
        if alive > 0 {
            return Err(err(format!(
                "cluster {name} is already up ({} hosts, {alive} daemons answering): `softverbs cluster down --name {name}` first",
                old.hosts
            )));
        }
    }
    if !leftovers(name).is_empty() || Cluster::load(name).is_some() {
        eprintln!("softverbs cluster: cleaning up what a previous cluster {name} left behind");
        let removed = remove(name);
        eprint!("{removed}");
    }
    let c = Cluster {
        name: name.to_string(),
        subnet: Cluster::free_subnet().map_err(err)?,
        hosts,
    };
    // The state comes first: if anything below fails or the machine crashes, `down` and the
    // next `up` know what to look for.
    c.save().map_err(err)?;
    if let Err(e) = build(&c, capture) {
        let _ = remove(name);
        return Err(err(e));
    }
    outln!(
        "cluster {name}: {hosts} hosts on {} (bridge {}, {})",
        net::subnet_addr(c.subnet, 0),
        c.bridge(),
        c.bridge_addr()
    );
    for i in 1..=hosts {
        outln!(
            "  {}  {}  daemon {}",
            c.host(i),
            c.addr(i),
            c.socket(i).display()
        );
    }
    outln!("remote-shell agent: {}", c.agent().display());
    outln!(
        "hostfiles: {} (Open MPI), {} (MPICH)",
        c.dir().join("hostfile").display(),
        c.dir().join("machinefile").display()
    );
    Ok(ExitCode::SUCCESS)
}

fn build(c: &Cluster, capture: Option<&Path>) -> Result<(), String> {
    net::add_bridge(&c.bridge(), c.bridge_addr())?;
    for i in 1..=c.hosts {
        net::add_host(&c.host(i), &c.veth(i), &c.bridge(), c.addr(i))?;
    }
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    let mut hosts =
        String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    // The machine itself, as the hosts reach it: launchers running outside the hosts publish
    // its host name.
    if !hostname.is_empty() {
        let _ = writeln!(hosts, "{}\t{hostname}", c.bridge_addr());
    }
    // Each host offers as many slots as the machine has CPUs, as a real node would: `-np`
    // up to that fills host 1 first, as on a real cluster.
    let slots = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (mut ompi, mut mpich) = (String::new(), String::new());
    for i in 1..=c.hosts {
        let _ = writeln!(hosts, "{}\t{}", c.addr(i), c.host(i));
        let _ = writeln!(ompi, "{} slots={slots}", c.host(i));
        let _ = writeln!(mpich, "{}:{slots}", c.host(i));
    }
    let write = |file: &str, text: &str| {
        let p = c.dir().join(file);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    for d in (1..=c.hosts)
        .map(|i| c.host_dir(i))
        .chain([c.this_host_dir()])
    {
        state::shared_dir(&d)?;
    }
    write("hosts", &hosts)?;
    write("hostfile", &ompi)?;
    write("machinefile", &mpich)?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let _ = std::fs::remove_file(c.agent());
    std::os::unix::fs::symlink(&exe, c.agent())
        .map_err(|e| format!("{}: {e}", c.agent().display()))?;
    for i in 1..=c.hosts {
        spawn_host_services(c, i, &exe, capture)?;
    }
    let deadline = Instant::now() + DAEMON_START;
    for i in 1..=c.hosts {
        while !answers(&c.socket(i)) {
            if Instant::now() >= deadline {
                let log = std::fs::read_to_string(c.log(i)).unwrap_or_default();
                return Err(format!(
                    "the daemon of {} did not come up within {DAEMON_START:?}; its log:\n{log}",
                    c.host(i)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Starts host `i`'s processes inside its network namespace: its daemon (and, once they
/// exist, the host's other services, e.g. a connection manager, the same way).
fn spawn_host_services(
    c: &Cluster,
    i: usize,
    exe: &Path,
    capture: Option<&Path>,
) -> Result<(), String> {
    let host = c.host(i);
    let capture = capture.map(|d| d.join(&host));
    if let Some(d) = &capture {
        state::shared_dir(d)?;
    }
    if !Path::new("/run/netns").join(&host).exists() {
        return Err(format!("/run/netns/{host}: no such network namespace"));
    }
    let log =
        std::fs::File::create(c.log(i)).map_err(|e| format!("{}: {e}", c.log(i).display()))?;
    // `ip netns exec` (ip-netns(8)) rather than setns(2) alone: it also gives the daemon a
    // sysfs of the host's namespace, where it reads its link's MTU (the active MTU follows
    // it, crates/daemon/src/link_mtu.rs). ip execs the daemon in place: the pid is its own.
    let mut daemon = std::process::Command::new("ip");
    daemon
        .args(["netns", "exec", &host])
        .arg(exe)
        .arg("--socket")
        .arg(c.socket(i))
        .arg("daemon")
        .arg("--device")
        .arg(format!("softverbs0={}", c.addr(i)));
    if let Some(d) = &capture {
        daemon.arg("--capture").arg(d);
    }
    let spawned = daemon
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn();
    spawned
        .map(|_| ())
        .map_err(|e| format!("start the daemon of {host}: {e}"))
}

fn down(name: &str) -> Outcome {
    need_root("cluster down")?;
    state::check_name(name).map_err(err)?;
    let _lock = state::lock().map_err(err)?;
    if Cluster::load(name).is_none() && leftovers(name).is_empty() {
        return Err((
            NOT_UP,
            format!("no cluster {name} is up (nothing to take down)"),
        ));
    }
    out!("cluster {name} down:\n{}", remove(name));
    Ok(ExitCode::SUCCESS)
}

fn status(name: &str, json: bool) -> Outcome {
    let Some(c) = Cluster::load(name) else {
        return Err((NOT_UP, format!("no cluster {name} is up")));
    };
    let namespaces = net::namespaces();
    let mut rows = Vec::new();
    for i in 1..=c.hosts {
        let host = c.host(i);
        let st = Introspect::connect_running(&c.socket(i)).and_then(|x| x.status());
        let mut row = serde_json::json!({
            "host": host, "addr": c.addr(i).to_string(), "socket": c.socket(i),
            "namespace": namespaces.contains(&host),
            "daemon": st.is_ok(),
        });
        if let Ok(s) = &st {
            row["daemon_pid"] = s.daemon_pid.into();
            row["objects"] = serde_json::json!({
                "contexts": s.contexts, "qps": s.qps, "srqs": s.srqs,
                "cqs": s.cqs, "mrs": s.mrs, "xrcds": s.xrcds, "xrc_recv_qps": s.xrc_recv_qps,
            });
        }
        rows.push(row);
    }
    let healthy = rows
        .iter()
        .all(|r| r["daemon"] == true && r["namespace"] == true);
    if json {
        let mut v = c.to_json();
        v["hosts"] = rows.into();
        v["agent"] = c.agent().display().to_string().into();
        outln!("{v}");
    } else {
        outln!(
            "cluster {} ({} hosts, {}/24, agent {})",
            c.name,
            c.hosts,
            net::subnet_addr(c.subnet, 0),
            c.agent().display()
        );
        outln!(
            "{:<14}{:<16}{:<16}{:>9}{:>6}{:>6}{:>6}{:>6}{:>7}",
            "host",
            "address",
            "daemon",
            "contexts",
            "qps",
            "srqs",
            "cqs",
            "mrs",
            "xrc-rq"
        );
        for r in &rows {
            let daemon = if r["daemon"] == true {
                format!("pid {}", r["daemon_pid"])
            } else if r["namespace"] == true {
                "DEAD".to_string()
            } else {
                "NO NAMESPACE".to_string()
            };
            let o = &r["objects"];
            let n = |k: &str| o[k].as_u64().map_or("-".to_string(), |v| v.to_string());
            outln!(
                "{:<14}{:<16}{:<16}{:>9}{:>6}{:>6}{:>6}{:>6}{:>7}",
                r["host"].as_str().unwrap_or(""),
                r["addr"].as_str().unwrap_or(""),
                daemon,
                n("contexts"),
                n("qps"),
                n("srqs"),
                n("cqs"),
                n("mrs"),
                n("xrc_recv_qps")
            );
        }
    }
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `cluster exec ARGS` (also `softverbs-rsh ARGS`).
pub fn exec(args: &[OsString]) -> Outcome {
    let inv = agent::parse(args).map_err(err)?;
    need_root("cluster exec")?;
    let Some((c, i)) = Cluster::of_host(&inv.host) else {
        let known: Vec<String> = Cluster::all()
            .iter()
            .flat_map(|c| (1..=c.hosts).map(|i| c.host(i)).collect::<Vec<_>>())
            .collect();
        return Err((
            NOT_UP,
            if known.is_empty() {
                format!(
                    "unknown host {}: no cluster is up (`softverbs cluster up`)",
                    inv.host
                )
            } else {
                format!(
                    "unknown host {}: the hosts are {}",
                    inv.host,
                    known.join(", ")
                )
            },
        ));
    };
    if !answers(&c.socket(i)) {
        return Err(err(format!(
            "the daemon of {} does not answer at {} (it died; its log is {}): `softverbs cluster down --name {}`, then `up` again",
            inv.host,
            c.socket(i).display(),
            c.log(i).display(),
            c.name
        )));
    }
    let ssh_like = !matches!(inv.command, agent::Command::Argv(_));
    Err((126, enter::exec(&c, i, inv.command, ssh_like)))
}
