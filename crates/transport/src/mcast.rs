//! UD multicast delivery (`ibv_attach_mcast(3)`): the engine's mirror of the core's groups
//! (`softverbs_core::mcast`) and the fan-out of one datagram addressed to DQPN `0xFFFFFF`
//! to every QP of this device attached to its destination GID.
//!
//! Each attached QP gets one copy, checked as a unicast UD datagram is checked — QP state,
//! transport, its own Q_Key (IBA 10.2.5), a posted receive (none: that QP drops its copy,
//! IBA 9.8.1) — so one QP refusing does not keep the others from receiving, as rxe's
//! `rxe_rcv_mcast_pkt` goes on to the next QP. The completion reports `IBV_WC_GRH` with the
//! GRH area holding the network header the datagram arrived with: its destination is the
//! group's address (`docs/design/roce-wire.md` §8).
//!
//! A datagram a device sent itself comes back to its own attached QPs without the wire, but
//! not to the QP that sent it. That is rxe's rule as its maintainers wrote it down (the
//! linux-rdma series "RDMA/rxe: Fix sending of mcast packets", Nov 2023: the receive side
//! skips the QP whose number is the DETH's source QP for a locally sent multicast packet).
//! mlx5 loops it back to the sender unless the QP was created with
//! `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`, so a program that needs its own copies cannot rely
//! on them across devices; softverbs follows rxe (`docs/design/roce-wire.md` §8).

use std::collections::HashMap;

use softverbs_core::device::Gid;

/// Group → attached QP numbers of one device.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    members: HashMap<Gid, Vec<u32>>,
}

impl Groups {
    pub(crate) fn attach(&mut self, mgid: Gid, qpn: u32) {
        let m = self.members.entry(mgid).or_default();
        if !m.contains(&qpn) {
            m.push(qpn);
        }
    }

    pub(crate) fn detach(&mut self, mgid: Gid, qpn: u32) {
        if let Some(m) = self.members.get_mut(&mgid) {
            m.retain(|&q| q != qpn);
            if m.is_empty() {
                self.members.remove(&mgid);
            }
        }
    }

    /// Takes a destroyed QP out of every group (the core has already queued its detaches;
    /// this keeps the mirror right even if a shell applies them late).
    pub(crate) fn forget_qp(&mut self, qpn: u32) {
        self.members.retain(|_, m| {
            m.retain(|&q| q != qpn);
            !m.is_empty()
        });
    }

    /// The QPs to deliver a copy to, in attach order.
    pub(crate) fn members(&self, mgid: Gid) -> &[u32] {
        self.members.get(&mgid).map_or(&[], |m| m.as_slice())
    }

    pub(crate) fn has(&self, mgid: Gid) -> bool {
        self.members.contains_key(&mgid)
    }
}
