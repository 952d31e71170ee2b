//! `softverbs`: run the daemon, look inside it, and tell the XRC receive-QP story.
// One function names raw memory (bench::peer::in_place, the bench's comparison with the
// raw in-place registration); nothing else may.
#![deny(unsafe_code)]

mod actor;
mod autostart;
mod bench;
mod cluster;
mod demo;
mod device_status;
mod devnode;
mod dropin;
mod generate;
mod stream;
mod sysfs_net;
mod table;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use softverbs::{Context, Introspect};
use softverbs_core::resources::Resources;
use softverbs_core::types::EventType;
use softverbs_daemon::{Config, DeviceSpec, Server};

/// `softverbs --version`: the crate's version and the git revision it was built from
/// (build.rs; "unknown" for a build outside a git checkout). The daemon reports the same
/// string in `softverbs status`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("SOFTVERBS_GIT_REVISION"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "softverbs",
    version = VERSION,
    about = "RDMA verbs in userspace, built around shared XRC receive QPs"
)]
struct Cli {
    /// The daemon's socket (default: $SOFTVERBS_SOCKET, else $XDG_RUNTIME_DIR/softverbs/softverbs.sock,
    /// else /run/softverbs/softverbs.sock).
    #[arg(long, global = true, env = "SOFTVERBS_SOCKET")]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon in the foreground (clients start one for you when none answers).
    Daemon {
        /// A device to offer, as NAME=IP[,IP...]; repeat for several. Default: softverbs0=127.0.0.1.
        #[arg(long = "device")]
        devices: Vec<DeviceSpec>,
        /// Speak an older ABI level (to test compatibility with older daemons).
        #[arg(long, default_value_t = softverbs_abi::ABI_VERSION)]
        abi_version: u32,
        /// Do not bind the devices' UDP ports (devices then reach only each other).
        #[arg(long)]
        no_network: bool,
        /// UDP port of every device (RoCE v2 uses 4791).
        #[arg(long, default_value_t = 4791)]
        port: u16,
        /// Write each device's traffic to DIR/<device>.pcap (mode 0600). DIR must exist and be
        /// root's or this user's, writable by no one else; a symlink at a file is refused.
        #[arg(long, value_name = "DIR")]
        capture: Option<PathBuf>,
        /// Inject faults into what the devices send: loss=P,dup=P,reorder=P,corrupt=P.
        #[arg(long, value_parser = parse_faults)]
        faults: Option<softverbs_transport::Faults>,
        /// A limit, as SCOPE.RESOURCE=N; repeat for several. SCOPE: context, uid, daemon.
        /// RESOURCE: contexts, pds, mrs, cqs, srqs, qps, ahs, xrcds, channels, ring-bytes,
        /// registered-bytes, mappings, descriptors, mcast-groups, mcast-attachments. N: a number with an optional K/M/G/T suffix, or
        /// unlimited (`--limit uid.mappings=8192 --limit context.ring-bytes=256M`). Defaults
        /// follow from vm.max_map_count, physical memory and RLIMIT_NOFILE; `softverbs
        /// status` shows them.
        #[arg(long = "limit", value_name = "SCOPE.RESOURCE=N")]
        limits: Vec<String>,
    },
    /// The daemon's pid, uptime, object counts and limits ("no daemon", exit 3, if none
    /// runs; never starts one).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The devices the daemon offers ("no daemon", exit 3, if none runs).
    Devices,
    /// Every object the daemon holds, and who holds each XRC receive QP ("no daemon",
    /// exit 3, if none runs).
    Resources {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Raise an async event on a QP or a port, as the NIC would (fault injection; the
    /// daemon's uid or root).
    InjectEvent {
        /// The QP number (QP events).
        #[arg(long, value_parser = parse_u32, required_unless_present = "port", conflicts_with = "port")]
        qpn: Option<u32>,
        /// The port, numbered from 1 (port events: every context of the device hears it).
        #[arg(long)]
        port: Option<u8>,
        /// The device index (port events).
        #[arg(long, default_value_t = 0)]
        device: u32,
        /// QP events: path-mig, path-mig-err, comm-est, qp-fatal, qp-req-err, qp-access-err,
        /// sq-drained, last-wqe-reached. Port events: port-active, port-err, lid-change,
        /// pkey-change, sm-change, client-reregister, gid-change.
        #[arg(long)]
        event: String,
    },
    /// The main job: the XRC receive-QP story with real processes (see the README).
    Demo {
        /// Worker processes that join the receive QP.
        #[arg(long, default_value_t = 3)]
        workers: usize,
        /// Address of the second daemon's device, where the stream's sender runs (any
        /// loopback address other than the daemon's own).
        #[arg(long, default_value = "127.0.0.2")]
        remote_ip: std::net::IpAddr,
    },
    /// Benchmarks (see docs/performance.md).
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
    /// Run an unmodified verbs program on softverbs: puts the drop-in libibverbs.so.1 first
    /// on LD_LIBRARY_PATH and makes sure a daemon is up (`softverbs run -- ibv_devinfo -v`).
    Run {
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// A virtual RDMA cluster on this machine: hosts in network namespaces, one daemon each,
    /// and the remote shell MPI launchers use to start ranks on them (docs/mpi.md).
    Cluster {
        #[command(subcommand)]
        what: cluster::ClusterCmd,
    },
    /// Copy the softverbs binary, the drop-in library and the legacy XRC header into a prefix
    /// (bin/, lib/softverbs/, include/softverbs/).
    Install {
        /// Where to install.
        #[arg(long)]
        prefix: PathBuf,
    },
    /// Write the man pages (DIR/softverbs.1, DIR/softverbs-SUBCOMMAND.1, ...), the bash, zsh
    /// and fish completions, or the Debian package's tree below /usr into DIR (used by
    /// scripts/deb.sh).
    #[command(hide = true)]
    Generate {
        #[arg(value_enum)]
        what: generate::What,
        /// The directory to write into (made if missing).
        dir: PathBuf,
    },
    /// Make the UCX device nodes, then exec the program (used by `run`).
    #[command(hide = true)]
    WithDeviceNodes {
        count: u32,
        /// DEVICE=IFNAME: the netdev to show under the device in sysfs (sysfs_net.rs).
        #[arg(long)]
        net: Vec<String>,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// One side of `bench lat|bw` (used by `bench`).
    #[command(hide = true)]
    BenchPeer(bench::peer::PeerArgs),
    /// One of the demo's processes (used by `demo`).
    #[command(hide = true)]
    DemoActor {
        #[command(subcommand)]
        role: ActorRole,
    },
}

fn parse_faults(s: &str) -> Result<softverbs_transport::Faults, String> {
    let mut f = softverbs_transport::Faults::NONE;
    f.delay = std::time::Duration::ZERO;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part}: expected KEY=PROBABILITY"))?;
        let p: f64 = v.parse().map_err(|e| format!("{part}: {e}"))?;
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("{part}: a probability is between 0 and 1"));
        }
        match k {
            "loss" => f.loss = p,
            "dup" => f.duplicate = p,
            "reorder" => f.reorder = p,
            "corrupt" => f.corrupt = p,
            _ => return Err(format!("{k}: unknown fault (loss, dup, reorder, corrupt)")),
        }
    }
    Ok(f)
}

fn parse_u32(s: &str) -> Result<u32, String> {
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| e.to_string())
}

fn event_by_name(name: &str) -> Option<EventType> {
    Some(match name {
        "path-mig" => EventType::PathMig,
        "path-mig-err" => EventType::PathMigErr,
        "comm-est" => EventType::CommEst,
        "qp-fatal" => EventType::QpFatal,
        "qp-req-err" => EventType::QpReqErr,
        "qp-access-err" => EventType::QpAccessErr,
        "sq-drained" => EventType::SqDrained,
        "last-wqe-reached" => EventType::QpLastWqeReached,
        "port-active" => EventType::PortActive,
        "port-err" => EventType::PortErr,
        "lid-change" => EventType::LidChange,
        "pkey-change" => EventType::PkeyChange,
        "sm-change" => EventType::SmChange,
        "client-reregister" => EventType::ClientReregister,
        "gid-change" => EventType::GidChange,
        _ => return None,
    })
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Command round trips through the daemon, from one client and from several.
    Commands {
        /// Concurrent clients for the second run.
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// Round trips per client per operation.
        #[arg(long, default_value_t = 20000)]
        iters: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Latency: SEND/RECV or WRITE ping-pong, or READ round trips, between two processes
    /// (perftest's ib_*_lat).
    Lat(bench::PerfArgs),
    /// Bandwidth: pipelined requests with a window of outstanding ones (perftest's ib_*_bw).
    Bw(bench::PerfArgs),
    /// One SVG plot from the --json outputs of several `bench lat|bw` runs.
    Plot {
        /// The JSON files.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// The SVG to write.
        #[arg(long, short)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum ActorRole {
    Creator {
        #[arg(long)]
        file: PathBuf,
    },
    Worker {
        #[arg(long)]
        file: PathBuf,
        #[arg(long)]
        qpn: u32,
        #[arg(long, value_enum)]
        face: actor::Face,
    },
    /// The stream's sender, on the second daemon (`--socket` is that daemon's).
    Sender,
}

fn socket_path(cli: &Cli) -> PathBuf {
    cli.socket
        .clone()
        .unwrap_or_else(softverbs_ipc::default_socket_path)
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SOFTVERBS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("softverbs: {e}");
    ExitCode::FAILURE
}

/// Exit status of `status`, `devices` and `resources` when no daemon runs: 3, "program is
/// not running" in the LSB init-script `status` convention that `systemctl status` follows.
const NO_DAEMON: u8 = 3;

/// Connects for introspection without starting a daemon; with none running, says so.
fn introspect(socket: &std::path::Path) -> Result<Introspect, ExitCode> {
    use softverbs::errno::{ECONNREFUSED, ENOENT};
    match Introspect::connect_running(socket) {
        Ok(i) => Ok(i),
        Err(e) if e.op() == "connect" && matches!(e.errno(), ENOENT | ECONNREFUSED) => {
            eprintln!("softverbs: no daemon at {}", socket.display());
            Err(ExitCode::from(NO_DAEMON))
        }
        Err(e) => Err(fail(e)),
    }
}

/// A limit or an amount for `softverbs status`.
fn amount(v: Option<u64>, bytes: bool) -> String {
    match v {
        None => "unlimited".into(),
        Some(n) if bytes && n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1 << 20)),
        Some(n) => n.to_string(),
    }
}

fn print_limits(rows: &[softverbs_core::limits::LimitRow]) {
    println!(
        "{:<18}{:>14}{:>14}{:>14}{:>14}",
        "limit", "per context", "per uid", "daemon", "used"
    );
    for r in rows {
        let b = r.resource.is_bytes();
        println!(
            "{:<18}{:>14}{:>14}{:>14}{:>14}",
            r.resource.name(),
            amount(r.context, b),
            amount(r.uid, b),
            amount(r.daemon, b),
            amount(Some(r.used), b)
        );
    }
}

fn main() -> ExitCode {
    // Invoked through the link `cluster up` makes, this is an MPI launcher's remote shell:
    // `softverbs-rsh [ssh options] HOST COMMAND...` is `softverbs cluster exec ...`.
    let mut argv = std::env::args_os();
    if argv.next().is_some_and(|a0| {
        Path::new(&a0)
            .file_name()
            .is_some_and(|n| n == "softverbs-rsh")
    }) {
        let rest: Vec<std::ffi::OsString> = argv.collect();
        return cluster::run(&cluster::ClusterCmd::Exec { args: rest });
    }
    let cli = Cli::parse();
    let socket = socket_path(&cli);
    match &cli.cmd {
        Command::Daemon {
            devices,
            abi_version,
            no_network,
            port,
            capture,
            faults,
            limits,
        } => {
            init_tracing();
            let mut config = Config::new(socket);
            for l in limits {
                if let Err(e) = config.limits.apply(l) {
                    return fail(format!("--limit {l}: {e}"));
                }
            }
            config.devices = devices.clone();
            config.abi_version = *abi_version;
            config.net.bind = !no_network;
            config.net.port = *port;
            config.net.capture_dir = capture.clone();
            config.net.faults = *faults;
            config.version = VERSION.into();
            let run = || -> std::io::Result<()> {
                let mut server = Server::bind(config)?;
                server.handle_signals()?;
                server.run()
            };
            run().map_or_else(fail, |()| ExitCode::SUCCESS)
        }
        Command::Status { json } => {
            let i = match introspect(&socket) {
                Ok(i) => i,
                Err(code) => return code,
            };
            let limits = i
                .resources_json()
                .and_then(|t| {
                    serde_json::from_str::<Resources>(&t)
                        .map_err(|_| softverbs::Error::new("resources", softverbs::errno::EPROTO))
                })
                .map(|r| (r.limits, r.devices, r.daemon_version));
            match i.status().and_then(|s| limits.map(|l| (s, l))) {
                Ok((s, (limits, devs, version))) if *json => {
                    println!(
                        "{}",
                        serde_json::json!({
                            "daemon_pid": s.daemon_pid, "version": version, "abi_version": s.abi_version, "uptime_ms": s.uptime_ms,
                            "devices": s.devices, "contexts": s.contexts, "xrcds": s.xrcds, "xrc_recv_qps": s.xrc_recv_qps,
                            "qps": s.qps, "srqs": s.srqs, "cqs": s.cqs, "mrs": s.mrs,
                            "limits": limits, "device_status": device_status::json(&devs),
                            "dp_rounds": s.dp_rounds, "dp_qp_visits": s.dp_qp_visits,
                            "dp_max_qp_visits": s.dp_max_qp_visits, "dp_queued_qps": s.dp_queued_qps,
                            "net_foreign_source": s.net_foreign_source, "net_outside_window": s.net_outside_window,
                        })
                    );
                    ExitCode::SUCCESS
                }
                Ok((s, (limits, devs, version))) => {
                    println!(
                        "daemon pid {} on {} (softverbs {}, ABI {}), up {:.1} s",
                        s.daemon_pid,
                        socket.display(),
                        // A daemon older than the version field did not say.
                        version.as_deref().unwrap_or("unknown: an older daemon"),
                        s.abi_version,
                        s.uptime_ms as f64 / 1e3
                    );
                    println!(
                    "devices {}  contexts {}  xrc domains {}  xrc receive qps {}  qps {}  srqs {}  cqs {}  mrs {}",
                    s.devices, s.contexts, s.xrcds, s.xrc_recv_qps, s.qps, s.srqs, s.cqs, s.mrs
                );
                    print!("{}", device_status::render(&devs));
                    print_limits(&limits);
                    println!(
                        "data path: {} rounds, {} QP visits ({:.2} per round, at most {}), {} QPs queued",
                        s.dp_rounds,
                        s.dp_qp_visits,
                        s.dp_qp_visits as f64 / s.dp_rounds.max(1) as f64,
                        s.dp_max_qp_visits,
                        s.dp_queued_qps
                    );
                    println!(
                        "transport drops: {} from a foreign source, {} outside the PSN window",
                        s.net_foreign_source, s.net_outside_window
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Devices => match introspect(&socket).map(|i| i.devices()) {
            Err(code) => code,
            Ok(r) => match r {
                Ok(list) => {
                    println!("    device          \t   node GUID");
                    println!("    ------          \t----------------");
                    for d in list {
                        println!("    {:<16}\t{:016x}", d.name, d.node_guid);
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            },
        },
        Command::Resources { json } => {
            let i = match introspect(&socket) {
                Ok(i) => i,
                Err(code) => return code,
            };
            match i.resources_json() {
                Ok(text) if *json => {
                    println!("{text}");
                    ExitCode::SUCCESS
                }
                Ok(text) => match serde_json::from_str::<Resources>(&text) {
                    Ok(r) => {
                        print!("{}", table::render(&r));
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail(e),
                },
                Err(e) => fail(e),
            }
        }
        Command::InjectEvent {
            qpn,
            port,
            device,
            event,
        } => {
            let Some(t) = event_by_name(event) else {
                return fail(format!("unknown event {event:?}"));
            };
            let (what, r) = match (qpn, port) {
                (Some(q), _) => (
                    format!("QP {q:#08x}"),
                    Context::open_at(&socket, 0).and_then(|c| c.inject_event(*q, t)),
                ),
                (None, Some(p)) => (
                    format!("port {p} of device {device}"),
                    Context::open_at(&socket, *device)
                        .and_then(|c| c.inject_port_event(*device, *p, t)),
                ),
                (None, None) => return fail("--qpn or --port"),
            };
            match r {
                Ok(n) => {
                    println!("{event} on {what}: delivered to {n} context(s)");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Demo { workers, remote_ip } => match demo::run(&socket, *workers, *remote_ip) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("softverbs demo FAILED: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Bench { what } => match what {
            BenchWhat::Commands {
                clients,
                iters,
                json,
            } => bench::commands(&socket, *clients, *iters, *json),
            BenchWhat::Lat(a) => bench::perf(&socket, bench::Mode::Lat, a),
            BenchWhat::Bw(a) => bench::perf(&socket, bench::Mode::Bw, a),
            BenchWhat::Plot { inputs, out } => bench::plot_files(inputs, out),
        }
        .map_or_else(fail, |()| ExitCode::SUCCESS),
        Command::Run { cmd } => dropin::run(&socket, cmd),
        Command::WithDeviceNodes { count, net, cmd } => dropin::with_device_nodes(*count, net, cmd),
        Command::Cluster { what } => cluster::run(what),
        Command::Generate { what, dir } => {
            generate::write(*what, dir).map_or_else(fail, |()| ExitCode::SUCCESS)
        }
        Command::Install { prefix } => {
            dropin::install(prefix).map_or_else(fail, |()| ExitCode::SUCCESS)
        }
        Command::BenchPeer(a) => bench::peer::run(&socket, a),
        Command::DemoActor { role } => match role {
            ActorRole::Creator { file } => actor::creator(&socket, file),
            ActorRole::Worker { file, qpn, face } => actor::worker(&socket, file, *qpn, *face),
            ActorRole::Sender => stream::sender(&socket),
        },
    }
}
