//! Introspection: a connection that opens no device, for listing devices, the daemon's
//! status and its resource dump.

use std::path::Path;

use softverbs_abi::msg::cmd;
use softverbs_abi::msg::{BlobResp, StatusResp, NO_DEVICE};
use softverbs_ipc as ipc;

use crate::conn::{connect_socket, connect_socket_with, default_socket_path, hello, Conn};
use crate::context::{list_devices, DeviceInfo};
use crate::error::{Error, Result};

/// The daemon's status (`softverbs status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// The daemon's pid.
    pub daemon_pid: u32,
    /// The ABI version it speaks.
    pub abi_version: u32,
    /// Milliseconds since it started.
    pub uptime_ms: u64,
    /// Devices.
    pub devices: u32,
    /// Open contexts.
    pub contexts: u32,
    /// XRC domains.
    pub xrcds: u32,
    /// Shared XRC receive QPs.
    pub xrc_recv_qps: u32,
    /// QPs of every type.
    pub qps: u32,
    /// SRQs.
    pub srqs: u32,
    /// CQs.
    pub cqs: u32,
    /// MRs.
    pub mrs: u32,
    /// Data-path rounds run (ABI 6; 0 from an older daemon).
    pub dp_rounds: u64,
    /// QP ring visits over all rounds (a QP's send and receive ring count once).
    pub dp_qp_visits: u64,
    /// The most QPs visited in one round: bounded by the QPs with work, not by all QPs.
    pub dp_max_qp_visits: u32,
    /// QPs queued for the next round.
    pub dp_queued_qps: u32,
    /// Packets dropped for coming to a connected QP from an address other than its peer's.
    pub net_foreign_source: u64,
    /// Responses dropped for a PSN outside the window of outstanding PSNs.
    pub net_outside_window: u64,
}

/// A connection to the daemon with no device opened: for devices, status and resources.
#[derive(Debug)]
pub struct Introspect {
    conn: Conn,
}

impl Introspect {
    /// Connects to the daemon at the default socket (starting it if needed).
    pub fn connect() -> Result<Introspect> {
        Introspect::connect_at(&default_socket_path())
    }

    /// Connects to the daemon at `path` (starting it if needed, as [`connect_socket`] does).
    pub fn connect_at(path: &Path) -> Result<Introspect> {
        let (conn, _fds) = hello(connect_socket(path)?, NO_DEVICE)?;
        Ok(Introspect { conn })
    }

    /// [`connect_at`](Self::connect_at) that gives a daemon it starts `daemon_args` too
    /// ([`connect_socket_starting`](crate::connect_socket_starting)).
    pub fn connect_starting(path: &Path, daemon_args: &[std::ffi::OsString]) -> Result<Introspect> {
        let (conn, _fds) = hello(
            crate::conn::connect_socket_starting(path, daemon_args)?,
            NO_DEVICE,
        )?;
        Ok(Introspect { conn })
    }

    /// Connects to a daemon already serving `path`, never starting one: looking inside a
    /// daemon that is not running must not start it. With none, fails with op `"connect"`
    /// and `ENOENT` (no socket) or `ECONNREFUSED` (a socket nobody serves).
    pub fn connect_running(path: &Path) -> Result<Introspect> {
        let (conn, _fds) = hello(connect_socket_with(path, false)?, NO_DEVICE)?;
        Ok(Introspect { conn })
    }

    /// The ABI version the daemon speaks.
    pub fn abi_version(&self) -> u32 {
        self.conn.abi
    }

    /// The daemon's devices.
    pub fn devices(&self) -> Result<Vec<DeviceInfo>> {
        list_devices(&self.conn)
    }

    /// The daemon's status.
    pub fn status(&self) -> Result<Status> {
        let r: StatusResp = self.conn.call::<cmd::Status>("status", 0, &())?;
        Ok(Status {
            daemon_pid: r.daemon_pid.get(),
            abi_version: r.abi_version.get(),
            uptime_ms: r.uptime_ms.get(),
            devices: r.devices.get(),
            contexts: r.contexts.get(),
            xrcds: r.xrcds.get(),
            xrc_recv_qps: r.xrc_recv_qps.get(),
            qps: r.qps.get(),
            srqs: r.srqs.get(),
            cqs: r.cqs.get(),
            mrs: r.mrs.get(),
            dp_rounds: r.dp_rounds.get(),
            dp_qp_visits: r.dp_qp_visits.get(),
            dp_max_qp_visits: r.dp_max_qp_visits.get(),
            dp_queued_qps: r.dp_queued_qps.get(),
            net_foreign_source: r.net_foreign_source.get(),
            net_outside_window: r.net_outside_window.get(),
        })
    }

    /// The daemon's resources as JSON text (every context, domain, receive QP and holder).
    pub fn resources_json(&self) -> Result<String> {
        const OP: &str = "resources";
        let (r, mut fds): (BlobResp, _) = self.conn.call_fds::<cmd::Resources>(OP, 0, &(), &[])?;
        let (Some(fd), true) = (fds.pop(), fds.is_empty()) else {
            return Err(Error::proto(OP));
        };
        let len = usize::try_from(r.len.get()).map_err(|_| Error::proto(OP))?;
        let bytes = ipc::read_memfd(&fd, len).map_err(|e| Error::from_io(OP, &e))?;
        if bytes.len() != len {
            return Err(Error::proto(OP));
        }
        String::from_utf8(bytes).map_err(|_| Error::proto(OP))
    }

    /// The daemon's resources, parsed.
    pub fn resources(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.resources_json()?).map_err(|_| Error::proto("resources"))
    }
}

/// [`Introspect::status`] of the daemon at the default socket.
pub fn status() -> Result<Status> {
    Introspect::connect()?.status()
}

/// [`Introspect::resources_json`] of the daemon at the default socket.
pub fn resources_json() -> Result<String> {
    Introspect::connect()?.resources_json()
}
