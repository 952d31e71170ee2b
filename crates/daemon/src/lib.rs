//! The softverbs daemon: plays the kernel's uverbs layer for client processes.
//!
//! One Unix `SOCK_SEQPACKET` socket, one connection per client context, one
//! [`softverbs_core::Core`] behind them. The daemon decodes commands ([`dispatch`]), applies
//! them to the core, answers with errno values, wakes clients' async-event eventfds, and
//! tears a context down through the core when its connection closes for any reason —
//! including `kill -9` of the client, which the kernel reports as end of stream.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod capture;
pub mod cm;
pub mod config;
pub mod config_file;
mod conn;
pub mod datapath;
pub mod direct;
pub mod dispatch;
pub mod link_mtu;
mod net_path;
pub mod netdev;
mod odp;
pub mod server;
pub mod spin;
mod sq_retire;

pub use config::{Config, DeviceSpec};
pub use server::{Notice, Server, StopHandle};

use std::path::PathBuf;
use std::thread::JoinHandle;

/// A daemon running on a background thread, for tests and benchmarks; stopped (and its
/// socket removed) when dropped.
pub struct TestDaemon {
    /// The socket it serves.
    pub socket: PathBuf,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
}

/// Starts a daemon with default devices on `socket` in a background thread.
pub fn spawn_test_daemon(socket: impl Into<PathBuf>) -> std::io::Result<TestDaemon> {
    spawn_daemon_with(Config::new(socket.into()))
}

/// Starts a daemon with `config` in a background thread.
pub fn spawn_daemon_with(config: Config) -> std::io::Result<TestDaemon> {
    let socket = config.socket.clone();
    let mut server = Server::bind(config)?;
    let stop = server.stop_handle();
    let thread = std::thread::Builder::new()
        .name("softverbs-daemon".into())
        .spawn(move || {
            if let Err(e) = server.run() {
                tracing::error!("daemon loop failed: {e}");
            }
        })?;
    Ok(TestDaemon {
        socket,
        stop,
        thread: Some(thread),
    })
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
