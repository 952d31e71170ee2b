//! What `softverbs stat` and `--metrics` show (docs/guide/counters.md): each port's and each
//! QP's counters as the engines counted them (`softverbs_transport::counters`), the ICRC
//! failures of each device's sockets, and where each QP sends and its PSNs (for
//! `softverbs resources`). Read-only snapshots for introspection, linear in the QPs.

use softverbs_transport::engine::QpWire;
use softverbs_transport::Counters;

use super::DataPath;

/// One port's counters.
#[derive(Clone, Copy, Debug)]
pub struct PortCounters {
    /// The device's index.
    pub device: usize,
    /// The sum over the port's QPs, the destroyed ones and the net path's included.
    pub counters: Counters,
    /// Datagrams to the device's sockets whose ICRC did not check out, dropped there
    /// (IBA 9.6.1.1.2; the packet never reaches a QP, so the port counts it).
    pub icrc_errors: u64,
}

/// Where a QP's packets are run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carrier {
    /// The daemon's engine.
    Daemon,
    /// The same-host direct path: no packets, the libraries copy (docs/direct-path.md).
    Direct,
    /// The library's own engine (docs/net-path.md).
    Net,
}

impl Carrier {
    /// The name `resources` and `stat` show.
    pub fn name(self) -> &'static str {
        match self {
            Carrier::Daemon => "daemon",
            Carrier::Direct => "direct",
            Carrier::Net => "net",
        }
    }
}

impl DataPath {
    /// Every device's port counters, by device index.
    pub fn port_counters(&self) -> Vec<PortCounters> {
        self.devs
            .iter()
            .enumerate()
            .map(|(device, d)| {
                let mut counters = d.engine.counters();
                counters.add(&self.net_port_counters(device));
                PortCounters {
                    device,
                    counters,
                    icrc_errors: d.net.iter().chain(&d.more_net).map(|n| n.icrc_errors).sum(),
                }
            })
            .collect()
    }

    /// QP `qpn`'s device and counters: the library's for a QP on the net path (as it last
    /// published them), else the daemon's engine's.
    pub fn qp_counters(&self, qpn: u32) -> Option<(usize, Counters)> {
        let d = *self.qp_dev.get(&qpn)?;
        if self.on_net_path(qpn) {
            return Some((d, self.net_qp_counters(qpn).unwrap_or_default()));
        }
        Some((d, self.devs[d].engine.qp_counters(qpn)?))
    }

    /// Where QP `qpn` sends and its PSNs, from the daemon's engine (for a net-path QP its
    /// copy, which knows the peer but not the library's PSNs: `None` for those).
    pub fn qp_wire(&self, qpn: u32) -> Option<(QpWire, bool)> {
        let d = *self.qp_dev.get(&qpn)?;
        let w = self.devs[d].engine.qp_wire(qpn)?;
        Some((w, !self.on_net_path(qpn)))
    }
}

impl DataPath {
    /// The counters the net path's libraries published for device `device`'s QPs (none
    /// yet: the libraries do not publish counters; see docs/guide/counters.md).
    fn net_port_counters(&self, _device: usize) -> Counters {
        Counters::default()
    }

    /// The expected PSN the library running net-path QP `qpn` last published.
    pub fn net_published_epsn(&self, _qpn: u32) -> Option<u32> {
        None
    }

    /// The counters the library running net-path QP `qpn` published.
    fn net_qp_counters(&self, _qpn: u32) -> Option<Counters> {
        None
    }
}
