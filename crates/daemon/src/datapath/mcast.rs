//! The data path's side of UD multicast (`softverbs_core::mcast` decides who is attached;
//! `softverbs_transport`'s engine fans a datagram out to its device's attached QPs).
//!
//! Here: mirroring attachments into the engines, joining and leaving the IP group on the
//! device's interface with the device's first and last QP ([`NetDev::join`]), and the
//! delivery of a datagram a device sends to a group. Every device of this daemon that has the
//! group gets it in-process, like unicast between the daemon's own devices (the sending
//! device's own QPs except the sender: `Engine::handle_own_multicast`); the device's socket
//! sends one copy to the group's address for the other daemons, and the kernel's multicast
//! loopback brings that copy back to this host's group sockets too — copies from an address
//! of this daemon's own devices are dropped there, having been delivered already, so each
//! attached QP completes one copy per datagram.

use softverbs_core::device::Gid;
use softverbs_transport::{Instant, RxMeta};

use super::{DataPath, NetDev};

impl DataPath {
    /// `CoreChange::McastAttached`.
    pub(super) fn mcast_attached(&mut self, device: usize, mgid: Gid, qpn: u32) {
        let Some(d) = self.devs.get_mut(device) else {
            return;
        };
        d.engine.attach_mcast(mgid, qpn);
        // Joined with the device's first QP; a later attach retries a join that failed
        // then (a route or address added since).
        if let Some(n) = d.net.as_mut() {
            join(n, mgid);
        }
    }

    /// `CoreChange::McastDetached`.
    pub(super) fn mcast_detached(&mut self, device: usize, mgid: Gid, qpn: u32, last: bool) {
        let Some(d) = self.devs.get_mut(device) else {
            return;
        };
        d.engine.detach_mcast(mgid, qpn);
        if let (true, Some(n)) = (last, d.net.as_mut()) {
            n.leave(mgid);
            tracing::debug!(group = %mgid.to_ip(), addr = %n.local(), "left multicast group");
        }
    }

    /// Delivers datagram `pkt`, which device `from` sent to group `mgid`, to every device of
    /// this daemon attached to the group.
    pub(super) fn deliver_multicast_locally(
        &mut self,
        now: Instant,
        core: &softverbs_core::Core,
        from: usize,
        mgid: Gid,
        pkt: &[u8],
    ) {
        let meta = RxMeta {
            sgid: self.devs[from].gid,
            dgid: mgid,
        };
        for t in 0..self.devs.len() {
            let e = &mut self.devs[t].engine;
            if !e.in_mcast_group(mgid) {
                continue;
            }
            let mut feed = super::fed_srq::Feed {
                srqs: &self.fed_srqs,
                faults: &mut self.srq_faults,
                limits: &mut self.srq_limit_hits,
            };
            if t == from {
                e.handle_own_multicast_fed(now, core, &mut self.mem, &mut feed, meta, pkt);
            } else {
                e.handle_packet_fed(now, core, &mut self.mem, &mut feed, meta, pkt);
            }
        }
    }

    /// Whether a datagram received from the network is the kernel's loopback copy of one of
    /// this daemon's own multicast sends (already delivered in-process).
    pub(super) fn is_own_multicast(&self, meta: &RxMeta) -> bool {
        meta.dgid.is_multicast() && self.devs.iter().any(|d| d.gid == meta.sgid)
    }

    /// Whether device `device` is a member of group `mgid` on its interface; `None` for a
    /// device without network (`softverbs status`).
    pub fn mcast_net_joined(&self, device: usize, mgid: Gid) -> Option<bool> {
        let n = self.devs.get(device)?.net.as_ref()?;
        Some(n.has_joined(mgid))
    }

    /// Group sockets made since the last call, for the event loop to watch.
    pub fn take_new_net_fds(&mut self) -> Vec<std::os::fd::RawFd> {
        self.devs
            .iter_mut()
            .filter_map(|d| d.net.as_mut())
            .flat_map(|n| n.take_new_fds())
            .collect()
    }
}

/// A device that cannot join still delivers the group to this daemon's own QPs; the log says
/// why other hosts' datagrams will not arrive.
fn join(n: &mut NetDev, mgid: Gid) {
    match n.join(mgid) {
        Ok(()) => {
            tracing::debug!(group = %mgid.to_ip(), addr = %n.local(), "joined multicast group")
        }
        Err(e) => {
            tracing::warn!(group = %mgid.to_ip(), addr = %n.local(), "cannot join multicast group: {e}")
        }
    }
}
