//! `softverbs`: run the daemon, look inside it, and tell the XRC receive-QP story.
// One function names raw memory (bench::peer::in_place, the bench's comparison with the
// raw in-place registration), and one owns the descriptor a service manager passes
// (service::take_listener); nothing else may.
#![deny(unsafe_code)]

/// `println!` that never panics on a closed stdout (sigpipe.rs).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::sigpipe::line(format_args!($($arg)*))
    };
}

/// `print!` that never panics on a closed stdout (sigpipe.rs).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::sigpipe::text(format_args!($($arg)*))
    };
}

mod actor;
mod autostart;
mod bench;
mod cluster;
mod demo;
mod device_status;
mod devnode;
mod dropin;
mod generate;
mod json_out;
mod service;
mod sigpipe;
mod stat;
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
    /// The daemon's socket (default: $SOFTVERBS_SOCKET, else the system daemon's
    /// /run/softverbs/softverbs.sock when one answers there, else
    /// $XDG_RUNTIME_DIR/softverbs/softverbs.sock, else /run/softverbs/softverbs.sock; the
    /// daemon itself binds the last two).
    #[arg(long, global = true, env = "SOFTVERBS_SOCKET")]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon in the foreground (clients start one for you when none answers).
    /// Settings come from --config's file, each flag given overriding it
    /// (docs/guide/configuration.md).
    Daemon(DaemonArgs),
    /// The daemon's pid, uptime, object counts and limits ("no daemon", exit 3, if none
    /// runs; never starts one).
    Status {
        /// Print JSON (docs/guide/json.md).
        #[arg(long)]
        json: bool,
    },
    /// The devices the daemon offers ("no daemon", exit 3, if none runs).
    Devices {
        /// Print JSON (docs/guide/json.md).
        #[arg(long)]
        json: bool,
    },
    /// Port and QP counters, as `rdma statistic` shows a NIC's: each port's totals, then
    /// each QP's ("no daemon", exit 3, if none runs; docs/guide/counters.md).
    Stat {
        /// Print one JSON object (`schema`, `ports`, `qps`).
        #[arg(long)]
        json: bool,
        /// Only this QP (by number).
        #[arg(long, value_parser = parse_u32)]
        qp: Option<u32>,
        /// Only this device's port and QPs.
        #[arg(long)]
        device: Option<String>,
    },
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
        /// loopback address other than the daemon's own). Default: 127.0.0.2, or when another
        /// daemon holds it (a second demo at once) a loopback address of the demo's own.
        #[arg(long)]
        remote_ip: Option<std::net::IpAddr>,
    },
    /// Benchmarks (see docs/performance.md).
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
    /// Run an unmodified verbs program on softverbs: puts the drop-in libibverbs.so.1 first
    /// on LD_LIBRARY_PATH and makes sure a daemon is up (`softverbs run -- ibv_devinfo -v`).
    Run {
        /// A device the program's daemon offers, as NAME=IP[,IP...]; repeat for several.
        /// Without --socket, the program then gets a daemon of its own for these devices
        /// (started if none answers, exiting when idle), not the system or default daemon.
        #[arg(long = "device")]
        devices: Vec<DeviceSpec>,
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// A virtual RDMA cluster on this machine: hosts in network namespaces, one daemon each,
    /// and the remote shell MPI launchers use to start ranks on them (docs/guide/mpi.md).
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

/// `softverbs daemon`'s flags: each one given overrides the configuration file's key of the
/// same meaning (docs/guide/configuration.md).
#[derive(clap::Args, Clone)]
struct DaemonArgs {
    /// Read settings from this TOML file (the service reads /etc/softverbs/softverbs.toml);
    /// SIGHUP reads it again.
    #[arg(long, value_name = "FILE", env = "SOFTVERBS_CONFIG")]
    config: Option<PathBuf>,
    /// A device to offer, as NAME=IP|INTERFACE[,...] (an interface contributes its IPv4 and
    /// non-link-local IPv6 addresses); repeat for several; replaces the file's devices.
    /// Default: softverbs0=127.0.0.1.
    #[arg(long = "device", value_name = "NAME=IP|INTERFACE", value_parser = softverbs_daemon::config_file::device_flag)]
    devices: Vec<DeviceSpec>,
    /// Speak an older ABI level (to test compatibility with older daemons).
    #[arg(long)]
    abi_version: Option<u32>,
    /// Do not bind the devices' UDP ports (devices then reach only each other).
    #[arg(long)]
    no_network: bool,
    /// UDP port of every device (default 4791, RoCE v2's).
    #[arg(long)]
    port: Option<u16>,
    /// The largest IB MTU the devices report: 256, 512, 1024, 2048 or 4096 (default: what
    /// their links allow, which also caps this).
    #[arg(long, value_parser = softverbs_daemon::config_file::mtu_flag)]
    mtu: Option<softverbs_core::types::Mtu>,
    /// Write each device's traffic to DIR/<device>.pcap (mode 0600). DIR must exist and be
    /// root's or this user's, writable by no one else; a symlink at a file is refused.
    #[arg(long, value_name = "DIR")]
    capture: Option<PathBuf>,
    /// With --capture: keep the packets the daemon rejected too, each marked with its
    /// reason ("softverbs: rejected: bad ICRC") as a packet comment; the files are then
    /// pcapng, DIR/<device>.pcapng.
    #[arg(long, requires = "capture")]
    capture_rejected: bool,
    /// Inject faults into what the devices send: loss=P,dup=P,reorder=P,corrupt=P.
    #[arg(long, value_parser = softverbs_daemon::config_file::faults_flag)]
    faults: Option<softverbs_transport::Faults>,
    /// A limit, as SCOPE.RESOURCE=N; repeat for several. SCOPE: context, uid, daemon.
    /// RESOURCE: contexts, pds, mrs, cqs, srqs, qps, ahs, xrcds, channels, ring-bytes,
    /// registered-bytes, mappings, descriptors, mcast-groups, mcast-attachments. N: a number with an optional K/M/G/T suffix, or
    /// unlimited (`--limit uid.mappings=8192 --limit context.ring-bytes=256M`). Defaults
    /// follow from vm.max_map_count, physical memory and RLIMIT_NOFILE; `softverbs
    /// status` shows them.
    #[arg(long = "limit", value_name = "SCOPE.RESOURCE=N")]
    limits: Vec<String>,
    /// Exit after this many seconds without a client (0: never). Default: never, or
    /// $SOFTVERBS_IDLE_EXIT (else 60) with --autostarted.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    idle_exit: Option<std::time::Duration>,
    /// Started by a client (autostart; docs/guide/multi-user.md): exit when idle (see
    /// --idle-exit), and without --device, when another daemon holds 127.0.0.1's RoCE
    /// port take an address of its own in 127.0.0.0/8, or run without a network when
    /// every one tried is taken (`softverbs status` says which).
    #[arg(long)]
    autostarted: bool,
    /// Serve the port and QP counters (`softverbs stat`) as Prometheus text at
    /// http://ADDR/metrics. Off by default; binds only ADDR (e.g. 127.0.0.1:9464), and
    /// anyone who can reach it reads every QP's counters.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Fail an RC request with RETRY_EXC_ERR only after its retry_cnt retries and at
    /// least this many milliseconds without progress (0: IBA's plain retry count; default
    /// 1000). A software NIC's answers wait for a CPU; see docs/design/net-path.md, "Stalls".
    #[arg(long, value_name = "MS")]
    retry_floor_ms: Option<u64>,
    /// Accept packets from peers in PEER_CIDR (kernel rxe, RoCE NICs: `10.0.0.0/24`,
    /// `192.0.2.7`) whose ICRC checks out with any IPv4 identification, solved for when the
    /// device cannot see it (the UDP receive path); repeat for several. Replaces the
    /// file's `[icrc] solve_ip_id_peers`. Leaves a 16-bit check on their packets
    /// (docs/design/roce-wire.md §6).
    #[arg(long = "solve-ip-id", value_name = "PEER_CIDR")]
    solve_ip_id: Vec<softverbs_daemon::netdev::Cidr>,
    /// Where the devices read received IP headers: auto (a raw socket for an IPv4 device
    /// when the daemon may open one, else the UDP socket), raw or udp.
    #[arg(long, value_name = "MODE")]
    ip_header: Option<softverbs_daemon::netdev::IpHeader>,
}

impl DaemonArgs {
    /// What the flags set (`socket`: --socket or $SOFTVERBS_SOCKET).
    fn settings(&self, socket: Option<PathBuf>) -> softverbs_daemon::config_file::Settings {
        softverbs_daemon::config_file::Settings {
            socket,
            devices: (!self.devices.is_empty()).then(|| self.devices.clone()),
            network: self.no_network.then_some(false),
            port: self.port,
            mtu: self.mtu,
            capture: self.capture.clone(),
            capture_rejected: self.capture_rejected.then_some(true),
            faults: self.faults,
            limits: self.limits.clone(),
            abi_version: self.abi_version,
            retry_floor_ms: self.retry_floor_ms,
            solve_ip_id_peers: (!self.solve_ip_id.is_empty()).then(|| self.solve_ip_id.clone()),
            ip_header: self.ip_header,
        }
    }

    /// The configuration: the file's settings (read now), the flags over them.
    fn config(&self, socket: Option<PathBuf>) -> Result<Config, String> {
        let file = match &self.config {
            Some(p) => softverbs_daemon::config_file::load(p)?,
            None => Default::default(),
        };
        let mut config = file
            .overridden_by(&self.settings(socket))
            .into_config(softverbs_ipc::own_socket_path())?;
        config.version = VERSION.into();
        config.own_address = self.autostarted;
        config.idle_exit = idle_exit(self.idle_exit, self.autostarted)?;
        Ok(config)
    }
}

/// `softverbs daemon`: serves the socket the service manager passed, or binds its own;
/// tells the service manager when it is ready, and reads its configuration again on SIGHUP.
fn daemon(args: &DaemonArgs, socket: Option<PathBuf>) -> ExitCode {
    // SAFETY: the first thing the daemon does: nothing has opened or closed a descriptor
    // since exec (argument parsing opens none) and no other thread runs.
    #[allow(unsafe_code)]
    let activated = match unsafe { service::take_listener() } {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    init_tracing();
    let config = match args.config(socket.clone()) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let run = || -> std::io::Result<()> {
        let mut server = match activated {
            Some(l) => Server::bind_activated(config, l)?,
            None => Server::bind(config)?,
        };
        server.handle_signals()?;
        let metrics = args.metrics;
        let args = args.clone();
        server.on_reload(Box::new(move || args.config(socket.clone())));
        server.on_notice(Box::new(service::notify));
        if let Some(addr) = metrics {
            stat::serve_metrics(addr, server.socket().clone())
                .map_err(|e| std::io::Error::new(e.kind(), format!("--metrics {addr}: {e}")))?;
        }
        server.run()
    };
    run().map_or_else(fail, |()| ExitCode::SUCCESS)
}

/// How long an autostarted daemon waits without clients before it exits, unless
/// `$SOFTVERBS_IDLE_EXIT` or `--idle-exit` says otherwise.
const AUTOSTART_IDLE_EXIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Seconds (a decimal number; 0 means never) as the daemon's idle time.
fn parse_seconds(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s.trim().parse().map_err(|e| format!("{s}: {e}"))?;
    std::time::Duration::try_from_secs_f64(secs).map_err(|e| format!("{s}: {e}"))
}

/// The idle time of a daemon: `--idle-exit`, else for an autostarted one
/// `$SOFTVERBS_IDLE_EXIT` or [`AUTOSTART_IDLE_EXIT`]; zero is never.
fn idle_exit(
    flag: Option<std::time::Duration>,
    autostarted: bool,
) -> Result<Option<std::time::Duration>, String> {
    let d = match flag {
        Some(d) => d,
        None if autostarted => match std::env::var("SOFTVERBS_IDLE_EXIT") {
            Ok(v) => parse_seconds(&v).map_err(|e| format!("SOFTVERBS_IDLE_EXIT={e}"))?,
            Err(_) => AUTOSTART_IDLE_EXIT,
        },
        None => return Ok(None),
    };
    Ok(Some(d).filter(|d| !d.is_zero()))
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

/// The socket a command uses: `--socket`/`$SOFTVERBS_SOCKET`; else a daemon binds its own
/// default ([`softverbs_ipc::own_socket_path`]) and every other command finds the daemon
/// ([`softverbs_ipc::default_socket_path`]: the system daemon first, whatever
/// `$XDG_RUNTIME_DIR` says).
fn socket_path(cli: &Cli) -> PathBuf {
    cli.socket.clone().unwrap_or_else(|| match cli.cmd {
        Command::Daemon { .. } => softverbs_ipc::own_socket_path(),
        _ => softverbs_ipc::default_socket_path(),
    })
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
    outln!(
        "{:<18}{:>14}{:>14}{:>14}{:>14}",
        "limit",
        "per context",
        "per uid",
        "daemon",
        "used"
    );
    for r in rows {
        let b = r.resource.is_bytes();
        outln!(
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
    // Before parsing: `--help`, `--version` and usage errors print, and end like a C tool's
    // on a closed pipe (sigpipe.rs).
    sigpipe::default_action();
    let cli = Cli::parse();
    let socket = socket_path(&cli);
    match &cli.cmd {
        // The daemon never dies of a client that went away; the others talk to processes
        // they start through pipes, where a peer's end is an error they report.
        Command::Daemon { .. }
        | Command::Demo { .. }
        | Command::DemoActor { .. }
        | Command::Bench { .. }
        | Command::BenchPeer(_)
        | Command::Cluster { .. } => sigpipe::ignore(),
        // Print and exit, or exec a program (which starts with SIGPIPE at its default, as
        // from a shell).
        Command::Status { .. }
        | Command::Devices { .. }
        | Command::Stat { .. }
        | Command::Resources { .. }
        | Command::InjectEvent { .. }
        | Command::Run { .. }
        | Command::WithDeviceNodes { .. }
        | Command::Install { .. }
        | Command::Generate { .. } => {}
    }
    match &cli.cmd {
        Command::Daemon(args) => daemon(args, cli.socket.clone()),
        Command::Status { json } => {
            let i = match introspect(&socket) {
                Ok(i) => i,
                Err(code) => return code,
            };
            let text = i.resources_json();
            let snapshot = text
                .as_ref()
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
                .unwrap_or_default();
            // Where the devices are on the network, or why nowhere (a daemon before this
            // field says nothing).
            let network = snapshot["network"].as_str().map(String::from);
            // Where each device socket receives (raw or udp); a daemon before it says nothing.
            let receive = snapshot.get("receive").cloned();
            let limits = text
                .and_then(|t| {
                    serde_json::from_str::<Resources>(&t)
                        .map_err(|_| softverbs::Error::new("resources", softverbs::errno::EPROTO))
                })
                .map(|r| (r.limits, r.devices, r.daemon_version));
            match i.status().and_then(|s| limits.map(|l| (s, l))) {
                Ok((s, (limits, devs, version))) if *json => {
                    let mut v = json_out::status(&s, &limits, &devs, &network, &receive, &version);
                    device_status::add_drops(&mut v["device_status"], &snapshot);
                    outln!("{v}");
                    ExitCode::SUCCESS
                }
                Ok((s, (limits, devs, version))) => {
                    outln!(
                        "daemon pid {} on {} (softverbs {}, ABI {}), up {:.1} s",
                        s.daemon_pid,
                        socket.display(),
                        // A daemon older than the version field did not say.
                        version.as_deref().unwrap_or("unknown: an older daemon"),
                        s.abi_version,
                        s.uptime_ms as f64 / 1e3
                    );
                    outln!(
                    "devices {}  contexts {}  xrc domains {}  xrc receive qps {}  qps {}  srqs {}  cqs {}  mrs {}",
                    s.devices, s.contexts, s.xrcds, s.xrc_recv_qps, s.qps, s.srqs, s.cqs, s.mrs
                );
                    if let Some(n) = &network {
                        outln!("network: {n}");
                    }
                    if let Some(rows) = receive.as_ref().and_then(|r| r.as_array()) {
                        // docs/design/roce-wire.md §6: raw sees the IPv4 identification.
                        for r in rows {
                            outln!(
                                "receive: {} {} on a {} socket",
                                r["device"].as_str().unwrap_or("?"),
                                r["addr"].as_str().unwrap_or("?"),
                                r["mode"].as_str().unwrap_or("?")
                            );
                        }
                    }
                    out!("{}", device_status::render(&devs));
                    out!("{}", device_status::render_drops(&snapshot));
                    print_limits(&limits);
                    outln!(
                        "data path: {} rounds, {} QP visits ({:.2} per round, at most {}), {} QPs queued",
                        s.dp_rounds,
                        s.dp_qp_visits,
                        s.dp_qp_visits as f64 / s.dp_rounds.max(1) as f64,
                        s.dp_max_qp_visits,
                        s.dp_queued_qps
                    );
                    outln!(
                        "transport drops: {} from a foreign source, {} outside the PSN window",
                        s.net_foreign_source,
                        s.net_outside_window
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Devices { json: true } => {
            let i = match introspect(&socket) {
                Ok(i) => i,
                Err(code) => return code,
            };
            let rows = i.resources_json().and_then(|t| {
                serde_json::from_str::<Resources>(&t)
                    .map_err(|_| softverbs::Error::new("resources", softverbs::errno::EPROTO))
            });
            match i.devices().and_then(|l| rows.map(|r| (l, r.devices))) {
                Ok((list, rows)) => {
                    outln!("{}", json_out::devices(&list, &rows));
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Devices { json: false } => match introspect(&socket).map(|i| i.devices()) {
            Err(code) => code,
            Ok(r) => match r {
                Ok(list) => {
                    outln!("    device          \t   node GUID");
                    outln!("    ------          \t----------------");
                    for d in list {
                        outln!("    {:<16}\t{:016x}", d.name, d.node_guid);
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            },
        },
        Command::Stat { json, qp, device } => {
            let i = match introspect(&socket) {
                Ok(i) => i,
                Err(code) => return code,
            };
            let v = match i.resources_json().and_then(|t| {
                serde_json::from_str::<serde_json::Value>(&t)
                    .map_err(|_| softverbs::Error::new("resources", softverbs::errno::EPROTO))
            }) {
                Ok(v) => stat::select(&v, *qp, device.as_deref()),
                Err(e) => return fail(e),
            };
            if let Some(q) = qp.filter(|_| v["qps"].as_array().is_none_or(Vec::is_empty)) {
                return fail(format!("no QP {q}"));
            }
            let text = if *json {
                format!("{v}\n")
            } else {
                stat::render(&v)
            };
            // A closed pipe (`softverbs stat | head`) ends the output, not the program.
            use std::io::Write;
            let _ = std::io::stdout().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Command::Resources { json } => {
            let i = match introspect(&socket) {
                Ok(i) => i,
                Err(code) => return code,
            };
            match i.resources_json() {
                Ok(text) if *json => {
                    outln!("{text}");
                    ExitCode::SUCCESS
                }
                Ok(text) => match serde_json::from_str::<Resources>(&text) {
                    Ok(r) => {
                        out!("{}", table::render(&r));
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
                    outln!("{event} on {what}: delivered to {n} context(s)");
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
        Command::Run { devices, cmd } => {
            if devices.is_empty() {
                dropin::run(&socket, &[], cmd)
            } else {
                match dropin::device_socket(cli.socket.as_deref(), devices) {
                    Ok(s) => dropin::run(&s, devices, cmd),
                    Err(e) => {
                        eprintln!("softverbs run: {e}");
                        ExitCode::from(127)
                    }
                }
            }
        }
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
