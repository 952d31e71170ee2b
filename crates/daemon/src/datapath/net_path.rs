//! The daemon's side of the net path (docs/net-path.md): which QPs a client library runs
//! itself over a private socket, and each context's socket. The daemon's engine keeps its
//! copy of such a QP (its state mirrors the core's) but never sees its packets: the device
//! forwards them to the library's socket (`crate::netdev`, `NetDev::forward_qp`).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;

use softverbs_core::device::Gid;
use softverbs_core::errno::{EINVAL, ENOMEM};
use softverbs_core::ids::CtxId;
use softverbs_transport::DropStats;

use super::DataPath;

/// The net path's bookkeeping.
#[derive(Debug, Default)]
pub(super) struct NetPaths {
    /// Each context's private socket on a device, by (context, device): the daemon's copy
    /// (the port stays the context's until it closes) and its address.
    sockets: HashMap<(CtxId, usize), (UdpSocket, SocketAddr)>,
    /// QPs on the path, with their device.
    qps: HashMap<u32, usize>,
    /// What each context's library engine reported it dropped (`NetDrops`: totals).
    reported: HashMap<CtxId, DropStats>,
    /// The last reports of contexts that are gone.
    closed: DropStats,
}

/// `a + b`, saturating: a report is the client's word, and any value must leave the daemon
/// standing (the protocol fuzz test sends them).
pub(super) fn add_drops(a: DropStats, b: DropStats) -> DropStats {
    DropStats {
        foreign_source: a.foreign_source.saturating_add(b.foreign_source),
        outside_window: a.outside_window.saturating_add(b.outside_window),
    }
}

impl DataPath {
    /// Whether QP `qpn`'s device may hand its traffic to a library: it is on the network
    /// with its first address, and neither injects faults nor captures (both only see what
    /// the daemon's own socket carries).
    pub fn net_capable(&self, qpn: u32) -> bool {
        let Some(&d) = self.qp_dev.get(&qpn) else {
            return false;
        };
        self.devs[d].net.as_ref().is_some_and(|n| !n.taps())
    }

    /// Puts QP `qpn` of `ctx`, connected to `peer`, on the net path: its packets from
    /// `peer` are forwarded to the context's private socket from now on. The socket comes
    /// back the first time the context asks (the library keeps it); `Ok(None)` after that.
    pub fn net_attach(&mut self, ctx: CtxId, qpn: u32, peer: Gid) -> Result<Option<OwnedFd>, i32> {
        let &d = self.qp_dev.get(&qpn).ok_or(EINVAL)?;
        let net = self.devs[d].net.as_mut().ok_or(EINVAL)?;
        let (to, fd) = match self.net_path.sockets.get(&(ctx, d)) {
            Some(&(_, to)) => (to, None),
            None => {
                let (sock, fd, to) = net.open_net_socket().map_err(|_| ENOMEM)?;
                self.net_path.sockets.insert((ctx, d), (sock, to));
                (to, Some(fd))
            }
        };
        net.forward_qp(qpn, peer, to);
        self.net_path.qps.insert(qpn, d);
        Ok(fd)
    }

    /// The device port QP `qpn`'s peers send to (4791 outside tests), for the library.
    pub fn net_port(&self, qpn: u32) -> Option<u16> {
        let &d = self.qp_dev.get(&qpn)?;
        Some(self.devs[d].net.as_ref()?.port())
    }

    /// QP `qpn` leaves the net path (destroyed, or connected anew elsewhere): its packets
    /// reach the daemon's engine again.
    pub fn net_detach(&mut self, qpn: u32) {
        if let Some(d) = self.net_path.qps.remove(&qpn) {
            if let Some(n) = self.devs[d].net.as_mut() {
                n.unforward_qp(qpn);
            }
        }
    }

    /// Whether QP `qpn` is on the net path.
    pub fn on_net_path(&self, qpn: u32) -> bool {
        self.net_path.qps.contains_key(&qpn)
    }

    /// How many QPs are on the net path.
    pub fn net_qps(&self) -> usize {
        self.net_path.qps.len()
    }

    /// `NetDrops`: the totals of `ctx`'s library engine, replacing its last report (a
    /// library can only report for the context it holds).
    pub fn net_drops_reported(&mut self, ctx: CtxId, totals: DropStats) {
        self.net_path.reported.insert(ctx, totals);
    }

    /// What the libraries' engines reported, those of closed contexts included.
    pub(super) fn net_reported_drops(&self) -> DropStats {
        self.net_path
            .reported
            .values()
            .fold(self.net_path.closed, |a, &b| add_drops(a, b))
    }

    /// Context `ctx` is gone: its sockets close and nothing is forwarded to them any more
    /// (its QPs were detached as they were destroyed), and its last report stays counted.
    pub(super) fn net_context_closed(&mut self, ctx: CtxId) {
        if let Some(r) = self.net_path.reported.remove(&ctx) {
            self.net_path.closed = add_drops(self.net_path.closed, r);
        }
        let mine: Vec<usize> = self
            .net_path
            .sockets
            .keys()
            .filter(|(c, _)| *c == ctx)
            .map(|&(_, d)| d)
            .collect();
        for d in mine {
            if let Some((_sock, to)) = self.net_path.sockets.remove(&(ctx, d)) {
                if let Some(n) = self.devs[d].net.as_mut() {
                    n.unforward_to(to);
                }
            }
        }
    }
}
