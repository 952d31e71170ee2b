//! What `softverbs stat` and `--metrics` show (docs/guide/counters.md): each port's and each
//! QP's counters as the engines counted them (`softverbs_transport::counters`), the ICRC
//! failures of each device's sockets, and where each QP sends and its PSNs (for
//! `softverbs resources`). Read-only snapshots for introspection, linear in the QPs.

use std::sync::atomic::Ordering;

use softverbs_abi::direct::{
    NS_CAPACITY, NS_COUNTERS, NS_COUNTER_WORDS, NS_LEN_COUNTERS, NS_RETIRED, NS_SLOT, NS_SLOTS,
    NS_VALID,
};
use softverbs_core::ids::CtxId;
use softverbs_shm::Region;
use softverbs_transport::engine::QpWire;
use softverbs_transport::{Counters, Reject, Rejects};

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
    /// Of those, the ones whose ICRC would check out with an IPv4 identification outside
    /// the window a softverbs sender uses (docs/design/roce-wire.md §6).
    pub icrc_id_unseen: u64,
    /// Datagrams taken from a `solve_ip_id_peers` peer with a solved identification.
    pub icrc_solved: u64,
    /// Received packets dropped, by reason (`softverbs_transport::Reject`): the device's
    /// engine's, its sockets' (ICRC, malformed, forged own source) and its forwarder's
    /// (a net-path QP's packet from a foreign source). A net-path library's own engine
    /// reports only its foreign-source and PSN-window drops, daemon-wide
    /// (`DataPath::drop_stats`), so they are not in a port's figures.
    pub rejects: Rejects,
}

/// Where a QP's packets are run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carrier {
    /// The daemon's engine.
    Daemon,
    /// The same-host direct path: no packets, the libraries copy (docs/design/direct-path.md).
    Direct,
    /// The library's own engine (docs/design/net-path.md).
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
                let mut rejects = d.engine.rejects();
                for n in d.net.iter().chain(&d.more_net) {
                    rejects.add(&n.rejects);
                    rejects.count_n(Reject::ForeignSource, n.forward_stats().foreign_source);
                }
                PortCounters {
                    device,
                    counters,
                    icrc_errors: d.net.iter().chain(&d.more_net).map(|n| n.icrc_errors).sum(),
                    icrc_id_unseen: d
                        .net
                        .iter()
                        .chain(&d.more_net)
                        .map(|n| n.icrc_id_unseen)
                        .sum(),
                    icrc_solved: d.net.iter().chain(&d.more_net).map(|n| n.icrc_solved).sum(),
                    rejects,
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

    /// QP `qpn`'s device.
    pub fn qp_device(&self, qpn: u32) -> Option<usize> {
        self.qp_dev.get(&qpn).copied()
    }

    /// Where QP `qpn` sends and its PSNs, from the daemon's engine (for a net-path QP its
    /// copy, which knows the peer but not the library's PSNs: `None` for those).
    pub fn qp_wire(&self, qpn: u32) -> Option<(QpWire, bool)> {
        let d = *self.qp_dev.get(&qpn)?;
        let w = self.devs[d].engine.qp_wire(qpn)?;
        Some((w, !self.on_net_path(qpn)))
    }
}

/// The counter block at `off` of a net status region (`softverbs_abi::direct::NS_COUNTERS`):
/// word `i` is `Counters::NAMES[i]`.
fn read_block(r: &Region, off: usize) -> Counters {
    let words = r.atomic_u64s(off, NS_COUNTER_WORDS);
    let mut c = Counters::default();
    for (name, w) in Counters::NAMES.iter().zip(words) {
        c.set(name, w.load(Ordering::Acquire));
    }
    c
}

/// The slots of a net status region whose QP `owned` accepts (the library's word, checked
/// against the daemon's own list of the context's QPs: a slot naming another context's QP
/// is ignored), each QP once: `(qpn, slot)`.
fn owned_slots(r: &Region, owned: impl Fn(u32) -> bool) -> Vec<(u32, usize)> {
    let mut seen = std::collections::HashSet::new();
    (0..NS_CAPACITY)
        .filter_map(|i| {
            let w = r.atomic_u64s(NS_SLOTS + i * NS_SLOT, 1)[0].load(Ordering::Acquire);
            let qpn = w as u32;
            (w & NS_VALID != 0 && owned(qpn) && seen.insert(qpn)).then_some((qpn, i))
        })
        .collect()
}

impl DataPath {
    /// Context `ctx`'s device (the one its net-path sockets are on).
    fn net_ctx_device(&self, ctx: CtxId) -> Option<usize> {
        self.net_path
            .sockets
            .keys()
            .find(|(c, _)| *c == ctx)
            .map(|&(_, d)| d)
    }

    /// What `ctx`'s library published: the blocks of its QPs on the net path plus the
    /// retired sums; with `every_slot`, the blocks of every slot in use — at the context's
    /// close, when the daemon has already taken its QPs off the path, and a library that
    /// died left its last QPs' counts there (a library could put any number in its retired
    /// block anyway, so counting its slots unchecked into its port's sums grants it nothing).
    fn net_ctx_counters(&self, ctx: CtxId, every_slot: bool) -> Counters {
        let mut sum = Counters::default();
        let Some(st) = self.net_path.status.get(&ctx) else {
            return sum;
        };
        let r = &st.region;
        if r.len() < NS_LEN_COUNTERS {
            return sum;
        }
        let owners = &self.net_path.owners;
        for (_, i) in owned_slots(r, |q| every_slot || owners.get(&q) == Some(&ctx)) {
            sum.add(&read_block(r, NS_COUNTERS + i * NS_COUNTER_WORDS * 8));
        }
        sum.add(&read_block(r, NS_RETIRED));
        sum
    }

    /// The counters the net path's libraries published for device `device`'s QPs, those
    /// of closed contexts included.
    fn net_port_counters(&self, device: usize) -> Counters {
        let mut sum = self
            .net_path
            .closed_counters
            .get(&device)
            .copied()
            .unwrap_or_default();
        for &ctx in self.net_path.status.keys() {
            if self.net_ctx_device(ctx) == Some(device) {
                sum.add(&self.net_ctx_counters(ctx, false));
            }
        }
        sum
    }

    /// Context `ctx` closes: what its library last published stays in its port's totals.
    pub(super) fn net_counters_closed(&mut self, ctx: CtxId) {
        if let Some(d) = self.net_ctx_device(ctx) {
            let c = self.net_ctx_counters(ctx, true);
            self.net_path.closed_counters.entry(d).or_default().add(&c);
        }
    }

    /// The slot of net-path QP `qpn` in its library's region.
    fn net_slot(&self, qpn: u32) -> Option<(&Region, usize)> {
        let ctx = self.net_path.owners.get(&qpn)?;
        let r = &self.net_path.status.get(ctx)?.region;
        let (_, i) = owned_slots(r, |q| q == qpn).into_iter().next()?;
        Some((r, i))
    }

    /// The expected PSN the library running net-path QP `qpn` last published.
    pub fn net_published_epsn(&self, qpn: u32) -> Option<u32> {
        let (r, i) = self.net_slot(qpn)?;
        let v = r.atomic_u64s(NS_SLOTS + i * NS_SLOT + 8, 1)[0].load(Ordering::Acquire);
        (v != u64::MAX).then_some((v >> 32) as u32 & 0xFF_FFFF)
    }

    /// The counters the library running net-path QP `qpn` published.
    fn net_qp_counters(&self, qpn: u32) -> Option<Counters> {
        let (r, i) = self.net_slot(qpn)?;
        (r.len() >= NS_LEN_COUNTERS).then(|| read_block(r, NS_COUNTERS + i * NS_COUNTER_WORDS * 8))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region() -> Region {
        Region::create("test-net-status", NS_LEN_COUNTERS)
            .unwrap()
            .0
    }

    fn put(r: &Region, slot: usize, qpn: u32, sent: u64) {
        r.atomic_u64s(NS_SLOTS + slot * NS_SLOT, 1)[0]
            .store(u64::from(qpn) | NS_VALID, Ordering::Release);
        let words = r.atomic_u64s(NS_COUNTERS + slot * NS_COUNTER_WORDS * 8, NS_COUNTER_WORDS);
        let i = Counters::NAMES
            .iter()
            .position(|n| *n == "sent_pkts")
            .unwrap();
        words[i].store(sent, Ordering::Release);
    }

    #[test]
    fn a_block_reads_back_by_name() {
        let r = region();
        put(&r, 3, 0x21, 17);
        assert_eq!(
            read_block(&r, NS_COUNTERS + 3 * NS_COUNTER_WORDS * 8).sent_pkts,
            17
        );
        assert_eq!(read_block(&r, NS_RETIRED), Counters::default());
    }

    #[test]
    fn a_library_cannot_speak_for_a_qp_that_is_not_its_own_nor_twice_for_its_own() {
        let r = region();
        put(&r, 0, 0x21, 5);
        // Another context's QP, and the library's own QP named again in a second slot.
        put(&r, 1, 0x99, 1_000_000);
        put(&r, 2, 0x21, 1_000_000);
        // A slot not in use is not read, whatever its block holds.
        let words = r.atomic_u64s(NS_COUNTERS + 4 * NS_COUNTER_WORDS * 8, 1);
        words[0].store(7, Ordering::Release);
        let got = owned_slots(&r, |q| q == 0x21);
        assert_eq!(got, vec![(0x21, 0)]);
    }
}
