//! `softverbs`: run the daemon, look inside it, and tell the XRC receive-QP story.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use softverbs_daemon::{Config, DeviceSpec, Server};

#[derive(Parser)]
#[command(name = "softverbs", version, about = "RDMA verbs in userspace, built around shared XRC receive QPs")]
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
        #[arg(long, default_value_t = softverbs_abi_version())]
        abi_version: u32,
    },
}

fn softverbs_abi_version() -> u32 {
    2
}

fn socket_path(cli: &Cli) -> PathBuf {
    cli.socket.clone().unwrap_or_else(softverbs_ipc::default_socket_path)
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SOFTVERBS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.cmd {
        Command::Daemon { devices, abi_version } => {
            init_tracing();
            let mut config = Config::new(socket_path(&cli));
            config.devices = devices.clone();
            config.abi_version = *abi_version;
            let run = || -> std::io::Result<()> {
                let mut server = Server::bind(config)?;
                server.handle_signals()?;
                server.run()
            };
            match run() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("softverbs daemon: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
