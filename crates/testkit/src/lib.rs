//! Test support shared by the softverbs crates: a daemon process of a test's own
//! ([`Daemon`]), the client processes a test drives one line at a time ([`Actor`]), what
//! `softverbs resources --json` says ([`resources`]), bounded waits for child processes
//! ([`process`]), where the workspace's binaries are ([`bins`]), and running `tshark` on a
//! capture with the project's Wireshark plugin.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod actor;
pub mod bins;
pub mod daemon;
pub mod process;
pub mod resources;
mod roce_socket;
mod tshark;

pub use actor::Actor;
pub use daemon::{Daemon, DaemonOptions};
pub use roce_socket::roce_udp_socket;
pub use tshark::{frame_numbers, plugin_path, tshark, tshark_available};

/// How long any one step of a process test may take (debug builds on a loaded machine) before
/// the test fails instead of hanging.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(60);
