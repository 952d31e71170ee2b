//! UD multicast groups (`ibv_attach_mcast(3)`): which QPs of each device are
//! attached to which multicast GID, with the device's three limits.
//!
//! The rules are the kernel's, as rdma-core programs meet them through uverbs and rxe
//! (`docs/guide/dropin.md`, "Multicast"):
//!
//! - Only UD QPs attach, and only to a multicast GID: for RoCE v2 an IPv4-mapped
//!   `::ffff:224.0.0.0/4` or an IPv6 `ff00::/8` address (`ib_attach_mcast` in the kernel's
//!   `verbs.c`, `rdma_is_multicast_addr`): anything else is `EINVAL`. The LID is ignored on
//!   an Ethernet port.
//! - Attaching a QP to a group it is already attached to succeeds and changes nothing: "the
//!   QP will still receive a single copy" (`ibv_attach_mcast(3)`; uverbs `ib_uverbs_attach_mcast` finds it in the QP's list; rxe's `rxe_attach_mcg`
//!   finds it in the group), so one QP receives one copy of each datagram.
//! - Detaching from a group the QP is not attached to is `EINVAL` (uverbs
//!   `ib_uverbs_detach_mcast`, rxe `rxe_detach_mcg`).
//! - A new group past `max_mcast_grp`, a QP past `max_mcast_qp_attach` in one group, or an
//!   attachment past `max_total_mcast_qp_attach` on the device is `ENOMEM` (rxe
//!   `rxe_get_mcg`, `__rxe_init_mca`).
//! - A destroyed QP leaves every group it was in (uverbs `ib_uverbs_detach_umcast`), also
//!   when its context closes.
//!
//! One device table serves every local user, so each uid also has a share of it
//! ([`Resource::McastGroups`]: a context is charged once for each group it has a QP in, and a
//! group slot costs the daemon a socket; [`Resource::McastAttachments`]: one per QP in a group).
//! Past a share the attach is `ENOMEM` for that uid only, and the charge goes back at detach,
//! at destroy or when the context closes (docs/guide/limits.md).
//!
//! Each change queues [`CoreChange::McastAttached`] / [`CoreChange::McastDetached`] with
//! whether it was the device's first or last QP in the group: the daemon joins the IP
//! multicast group on the device's interface at the first and leaves it at the last.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv6Addr;

use crate::change::CoreChange;
use crate::core::{Core, QpEntry};
use crate::device::{DeviceAttr, Gid};
use crate::error::{Error, ObjectKind, Result};
use crate::ids::{CtxId, Handle};
use crate::limits::Resource;
use crate::types::QpType;

/// The destination QP number of every multicast datagram: `0xFFFFFF`, the kernel's
/// `IB_MULTICAST_QPN`, which rxe puts in the BTH of a datagram to a multicast GID.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

impl Gid {
    /// Whether this GID names a multicast group: an IPv4-mapped address in `224.0.0.0/4`
    /// (RoCE v2 over IPv4) or an IPv6 address in `ff00::/8` (which is also the IB MGID
    /// prefix, IBA 4.1.1).
    pub fn is_multicast(self) -> bool {
        match Ipv6Addr::from(self.0).to_ipv4_mapped() {
            Some(v4) => v4.is_multicast(),
            None => self.0[0] == 0xff,
        }
    }
}

/// The multicast groups of one device.
#[derive(Debug, Default)]
pub(crate) struct McastTable {
    /// Group → QP numbers attached to it.
    groups: BTreeMap<Gid, BTreeSet<u32>>,
    /// QP number → the groups it is attached to (for destroy).
    by_qp: HashMap<u32, BTreeSet<Gid>>,
    /// Attachments over all groups (`max_total_mcast_qp_attach` bounds it).
    attached: u32,
    /// The context of each attached QP, and how many QPs of each context are in each group:
    /// what the uid shares are charged by.
    ctx_of: HashMap<u32, CtxId>,
    ctx_members: HashMap<(CtxId, Gid), u32>,
}

/// What a detach did.
struct Detached {
    /// The group lost its last QP on the device.
    last: bool,
    /// The QP's context.
    ctx: CtxId,
    /// That context has no QP left in the group.
    ctx_left: bool,
}

impl McastTable {
    fn is_member(&self, mgid: Gid, qpn: u32) -> bool {
        self.groups.get(&mgid).is_some_and(|m| m.contains(&qpn))
    }

    /// Attaches `qpn` of `ctx` (not a member yet); `Ok(first)` if it is the group's first QP.
    fn attach(&mut self, attr: &DeviceAttr, mgid: Gid, qpn: u32, ctx: CtxId) -> Result<bool> {
        let members = self.groups.get(&mgid);
        if members.is_none() && self.groups.len() as u64 >= u64::from(attr.max_mcast_grp) {
            return Err(Error::NoResources("max_mcast_grp multicast groups"));
        }
        if members.map_or(0, |m| m.len()) as u64 >= u64::from(attr.max_mcast_qp_attach) {
            return Err(Error::NoResources("max_mcast_qp_attach QPs in this group"));
        }
        if u64::from(self.attached) >= u64::from(attr.max_total_mcast_qp_attach) {
            return Err(Error::NoResources("max_total_mcast_qp_attach attachments"));
        }
        let m = self.groups.entry(mgid).or_default();
        let first = m.is_empty();
        m.insert(qpn);
        self.by_qp.entry(qpn).or_default().insert(mgid);
        self.attached += 1;
        self.ctx_of.insert(qpn, ctx);
        *self.ctx_members.entry((ctx, mgid)).or_default() += 1;
        Ok(first)
    }

    /// Removes `qpn` from `mgid`, if it was attached.
    fn detach(&mut self, mgid: Gid, qpn: u32) -> Option<Detached> {
        let ctx = *self.ctx_of.get(&qpn)?;
        let m = self.groups.get_mut(&mgid)?;
        if !m.remove(&qpn) {
            return None;
        }
        let last = m.is_empty();
        if last {
            self.groups.remove(&mgid);
        }
        if let Some(g) = self.by_qp.get_mut(&qpn) {
            g.remove(&mgid);
            if g.is_empty() {
                self.by_qp.remove(&qpn);
                self.ctx_of.remove(&qpn);
            }
        }
        self.attached -= 1;
        let n = self.ctx_members.entry((ctx, mgid)).or_insert(1);
        *n -= 1;
        let ctx_left = *n == 0;
        if ctx_left {
            self.ctx_members.remove(&(ctx, mgid));
        }
        Some(Detached {
            last,
            ctx,
            ctx_left,
        })
    }
}

impl Core {
    /// The device and QP number of an owned UD QP handle, or the errno-carrying refusal of
    /// `ib_attach_mcast`: a handle that names no QP, or a QP that is not UD, is `EINVAL`.
    fn mcast_qp(&self, ctx: CtxId, qp: Handle, mgid: Gid) -> Result<(usize, u32)> {
        let c = self.ctx(ctx)?;
        let q = match c.qps.get(&qp) {
            Some(QpEntry::Owned(q)) => q,
            Some(QpEntry::XrcRecv { .. }) => {
                return Err(Error::InvalidArgument(
                    "only UD QPs attach to multicast groups",
                ))
            }
            None => return Err(Error::InvalidHandle(ObjectKind::Qp)),
        };
        if q.init.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument(
                "only UD QPs attach to multicast groups",
            ));
        }
        if !mgid.is_multicast() {
            return Err(Error::InvalidArgument("the GID is not a multicast address"));
        }
        Ok((c.device, q.qpn))
    }

    /// `ibv_attach_mcast`: attaches UD QP `qp` to multicast group `mgid` (module docs).
    pub fn attach_mcast(&mut self, ctx: CtxId, qp: Handle, mgid: Gid) -> Result<()> {
        let (device, qpn) = self.mcast_qp(ctx, qp, mgid)?;
        let table = &self.mcast[device];
        if table.is_member(mgid, qpn) {
            return Ok(());
        }
        let new_group = !table.ctx_members.contains_key(&(ctx, mgid));
        self.admit(ctx, Resource::McastAttachments, 1)?;
        if new_group {
            self.admit(ctx, Resource::McastGroups, 1)?;
        }
        let attr = &self.devices[device].attr;
        let first = self.mcast[device].attach(attr, mgid, qpn, ctx)?;
        self.add_usage(ctx, Resource::McastAttachments, 1);
        self.add_usage(ctx, Resource::McastGroups, u64::from(new_group));
        self.push_change(CoreChange::McastAttached {
            device,
            mgid,
            qpn,
            first,
        });
        Ok(())
    }

    /// Takes `qpn` out of `mgid` on `device` and gives its charges back; `Some(last)` if it
    /// was attached.
    fn detach_and_uncharge(&mut self, device: usize, mgid: Gid, qpn: u32) -> Option<bool> {
        let d = self.mcast[device].detach(mgid, qpn)?;
        self.uncharge(d.ctx, Resource::McastAttachments, 1);
        if d.ctx_left {
            self.uncharge(d.ctx, Resource::McastGroups, 1);
        }
        self.push_change(CoreChange::McastDetached {
            device,
            mgid,
            qpn,
            last: d.last,
        });
        Some(d.last)
    }

    /// `ibv_detach_mcast`: `EINVAL` unless `qp` is attached to `mgid`.
    pub fn detach_mcast(&mut self, ctx: CtxId, qp: Handle, mgid: Gid) -> Result<()> {
        let (device, qpn) = self.mcast_qp(ctx, qp, mgid)?;
        self.detach_and_uncharge(device, mgid, qpn)
            .map(|_| ())
            .ok_or(Error::InvalidArgument(
                "the QP is not attached to that group",
            ))
    }

    /// The groups QP `qp` is attached to, in GID order.
    pub fn qp_mcast_groups(&self, ctx: CtxId, qp: Handle) -> Result<Vec<Gid>> {
        let c = self.ctx(ctx)?;
        let qpn = match c.qps.get(&qp) {
            Some(QpEntry::Owned(q)) => q.qpn,
            Some(QpEntry::XrcRecv { .. }) => return Ok(Vec::new()),
            None => return Err(Error::InvalidHandle(ObjectKind::Qp)),
        };
        Ok(self.mcast[c.device]
            .by_qp
            .get(&qpn)
            .map(|g| g.iter().copied().collect())
            .unwrap_or_default())
    }

    /// The QPs of device `device` attached to `mgid`, in QP-number order.
    pub fn mcast_members(&self, device: usize, mgid: Gid) -> Vec<u32> {
        self.mcast
            .get(device)
            .and_then(|t| t.groups.get(&mgid))
            .map(|m| m.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The groups of device `device` with at least one QP attached, in GID order, each with
    /// its QPs in QP-number order.
    pub fn mcast_groups(&self, device: usize) -> Vec<(Gid, Vec<u32>)> {
        self.mcast.get(device).map_or(Vec::new(), |t| {
            t.groups
                .iter()
                .map(|(g, m)| (*g, m.iter().copied().collect()))
                .collect()
        })
    }

    /// Groups of device `device` with at least one QP attached.
    pub fn mcast_group_count(&self, device: usize) -> usize {
        self.mcast.get(device).map_or(0, |t| t.groups.len())
    }

    /// Takes QP `qpn` of `device` out of every group, as its destruction does (queued before
    /// its `QpDestroyed`).
    pub(crate) fn leave_mcast_groups(&mut self, device: usize, qpn: u32) {
        let Some(groups) = self.mcast[device].by_qp.get(&qpn).cloned() else {
            return;
        };
        for mgid in groups {
            self.detach_and_uncharge(device, mgid, qpn);
        }
    }
}
