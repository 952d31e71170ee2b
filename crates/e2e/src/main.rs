//! `softverbs-test-actor`: the client processes of this crate's real-process tests (`tests/`).
//! They are not part of the product: the `softverbs` binary holds only what users run (the
//! demo's creator and workers, the bench's peer). Each role opens its own context on the
//! daemon at `--socket`, and talks to its test one line at a time on stdin and stdout.
// One function (dp_actor::raw_memory) names raw memory for the test actors; nothing else may.
#![deny(unsafe_code)]

mod dp_actor;
mod hoarder;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "softverbs-test-actor",
    about = "Client processes for the softverbs process tests"
)]
struct Cli {
    /// The daemon's socket (default: as `softverbs --socket`).
    #[arg(long, env = "SOFTVERBS_SOCKET")]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Holds one object of every kind (and an XRC domain on `file`) until killed.
    Hoarder {
        #[arg(long)]
        file: PathBuf,
    },
    /// The data-path actors (tests/datapath_processes.rs).
    #[command(flatten)]
    Dp(dp_actor::DpRole),
}

/// How an actor joins an XRC receive QP (as `softverbs demo-actor worker --face`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Face {
    /// Legacy OFED `ibv_reg_xrc_rcv_qp`.
    Legacy,
    /// The thread's minimal `register(xrcd, qpn)`.
    Minimal,
    /// Upstream `ibv_open_qp`.
    Upstream,
}

fn main() {
    let cli = Cli::parse();
    let socket = cli
        .socket
        .unwrap_or_else(softverbs_ipc::default_socket_path);
    match &cli.role {
        Role::Hoarder { file } => hoarder::run(&socket, file),
        Role::Dp(role) => dp_actor::run(&socket, role),
    }
}
