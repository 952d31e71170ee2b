//! Per-context objects: protection domains, memory regions, CQs, address handles and SRQs
//! (basic and XRC). Their rules follow uverbs and rxe: dependants make destroy `EBUSY`,
//! arguments that name a missing object are `EINVAL`, limits are `EINVAL` (per object) or
//! `ENOMEM` (device-wide counts).

use serde::{Deserialize, Serialize};

use crate::attr::{AhAttr, SrqAttr, SRQ_LIMIT, SRQ_MAX_WR};
use crate::change::CoreChange;
use crate::core::{Ah, Core, Cq, Mr, Pd, Srq, SrqKind};
use crate::device::Device;
use crate::error::{Error, ObjectKind, Result};
use crate::ids::{CtxId, Handle};
use crate::limits::{Resource, Ring};
use crate::odp;
use crate::types::Access;

/// What `reg_mr` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MrKeys {
    /// The MR handle.
    pub handle: Handle,
    /// Local key, used in scatter/gather entries.
    pub lkey: u32,
    /// Remote key, used by peers in RETH/AtomicETH. softverbs, like rxe, uses one key for
    /// both.
    pub rkey: u32,
}

/// What `create_srq` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrqCreated {
    /// The SRQ handle.
    pub handle: Handle,
    /// Granted attributes.
    pub attr: SrqAttr,
    /// The 24-bit SRQ number peers put in XRCETH (XRC SRQs only; `ibv_get_srq_num`).
    pub srqn: Option<u32>,
}

/// Checks an address vector against a device (kernel `rdma_check_ah_attr`): the port must
/// exist, a RoCE port needs a GRH, and the source GID index must name a filled slot.
pub(crate) fn check_ah(dev: &Device, ah: &AhAttr) -> Result<()> {
    let port = dev
        .port(ah.port_num)
        .ok_or(Error::InvalidArgument("address vector port_num"))?;
    if !ah.is_global {
        return Err(Error::InvalidArgument(
            "RoCE address vectors need a GRH (is_global)",
        ));
    }
    match port.gids.get(ah.sgid_index as usize) {
        Some(g) if !g.is_zero() => Ok(()),
        _ => Err(Error::InvalidArgument("sgid_index names no GID")),
    }
}

impl Core {
    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&mut self, ctx: CtxId) -> Result<Handle> {
        let dev = self.ctx(ctx)?.device;
        if self.usage[dev].pds >= self.devices[dev].attr.max_pd {
            return Err(Error::NoResources("max_pd"));
        }
        self.admit(ctx, Resource::Pds, 1)?;
        let h = self.new_handle(ctx)?;
        self.ctx_mut(ctx)?.pds.insert(h, Pd::default());
        self.usage[dev].pds += 1;
        self.add_usage(ctx, Resource::Pds, 1);
        Ok(h)
    }

    /// `ibv_dealloc_pd`: `EBUSY` while QPs, SRQs, MRs or AHs use it.
    pub fn dealloc_pd(&mut self, ctx: CtxId, pd: Handle) -> Result<()> {
        let c = self.ctx_mut(ctx)?;
        let p = c.pds.get(&pd).ok_or(Error::UnknownHandle(ObjectKind::Pd))?;
        if p.usecnt > 0 {
            return Err(Error::Busy(ObjectKind::Pd, "objects still use this PD"));
        }
        c.pds.remove(&pd);
        let dev = c.device;
        self.usage[dev].pds -= 1;
        self.uncharge(ctx, Resource::Pds, 1);
        Ok(())
    }

    /// `ibv_reg_mr` / `ibv_reg_mr_iova`: registers `[addr, addr+length)` of the client's
    /// memory, addressed by peers as `[iova, iova+length)`.
    ///
    /// Access rules of `ib_check_mr_access` (IBA 10.6.3.2 / 11.2.8.1): remote write or
    /// remote atomic access requires local write.
    pub fn reg_mr(
        &mut self,
        ctx: CtxId,
        pd: Handle,
        addr: u64,
        length: u64,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys> {
        let c = self.ctx(ctx)?;
        let dev = c.device;
        if !c.pds.contains_key(&pd) {
            return Err(Error::InvalidHandle(ObjectKind::Pd));
        }
        check_mr(&self.devices[dev], addr, length, iova, access)?;
        if self.usage[dev].mrs >= self.devices[dev].attr.max_mr {
            return Err(Error::NoResources("max_mr"));
        }
        let pinned = odp::pinned_bytes(length, access);
        self.admit(ctx, Resource::Mrs, 1)?;
        self.admit(ctx, Resource::RegisteredBytes, pinned)?;
        let key = self.keys.alloc().ok_or(Error::NoResources("memory keys"))?;
        let h = self.new_handle(ctx)?;
        let c = self.ctx_mut(ctx)?;
        c.mrs.insert(
            h,
            Mr {
                pd,
                addr,
                length,
                iova,
                access,
                key,
                bound_mws: 0,
            },
        );
        c.pds.get_mut(&pd).expect("checked above").usecnt += 1;
        self.key_routes.insert(key, (ctx, h));
        self.usage[dev].mrs += 1;
        self.add_usage(ctx, Resource::Mrs, 1);
        self.add_usage(ctx, Resource::RegisteredBytes, pinned);
        Ok(MrKeys {
            handle: h,
            lkey: key,
            rkey: key,
        })
    }

    /// `ibv_rereg_mr`: gives MR `mr` a new PD, access and/or range (`None` keeps the current
    /// one) in place, under `reg_mr`'s rules. Its handle and keys stay, as rxe and mlx5 keep
    /// them, so a peer holding the rkey reaches the MR as it is now. On error nothing changes.
    pub fn rereg_mr(
        &mut self,
        ctx: CtxId,
        mr: Handle,
        pd: Option<Handle>,
        access: Option<Access>,
        range: Option<(u64, u64, u64)>,
    ) -> Result<MrKeys> {
        let c = self.ctx(ctx)?;
        let m = c.mrs.get(&mr).ok_or(Error::InvalidHandle(ObjectKind::Mr))?;
        if m.bound_mws > 0 {
            // IBA 10.6.7.2.6: an MR with bound windows keeps its range, access and PD.
            return Err(Error::InvalidArgument(
                "memory windows are bound to this MR",
            ));
        }
        let new_pd = pd.unwrap_or(m.pd);
        if !c.pds.contains_key(&new_pd) {
            return Err(Error::InvalidHandle(ObjectKind::Pd));
        }
        let access = access.unwrap_or(m.access);
        let (addr, length, iova) = range.unwrap_or((m.addr, m.length, m.iova));
        if odp::is_implicit(m.addr, m.length)
            && range.is_none()
            && !access.contains(Access::ON_DEMAND)
        {
            // mlx5's rereg_user_mr: an implicit MR keeps covering the whole address space
            // unless given a new translation, which it can only do on demand.
            return Err(Error::NotSupported(
                "an implicit ODP MR without IBV_ACCESS_ON_DEMAND",
            ));
        }
        check_mr(&self.devices[c.device], addr, length, iova, access)?;
        let old_pinned = odp::pinned_bytes(m.length, m.access);
        let pinned = odp::pinned_bytes(length, access);
        self.admit(
            ctx,
            Resource::RegisteredBytes,
            pinned.saturating_sub(old_pinned),
        )?;
        self.uncharge(ctx, Resource::RegisteredBytes, old_pinned);
        self.add_usage(ctx, Resource::RegisteredBytes, pinned);
        let c = self.ctx_mut(ctx)?;
        let m = c.mrs.get_mut(&mr).expect("checked above");
        let old_pd = m.pd;
        *m = Mr {
            pd: new_pd,
            addr,
            length,
            iova,
            access,
            key: m.key,
            bound_mws: 0,
        };
        let key = m.key;
        if old_pd != new_pd {
            if let Some(p) = c.pds.get_mut(&old_pd) {
                p.usecnt -= 1;
            }
            c.pds.get_mut(&new_pd).expect("checked above").usecnt += 1;
        }
        if range.is_some() {
            // A mapping the daemon made of the old range no longer backs the MR: the new
            // range is reached the ordinary way, and the mapping is no longer counted.
            self.forget_mr_mapping(ctx, mr);
            self.push_change(CoreChange::MrRangeChanged { ctx, mr });
        }
        Ok(MrKeys {
            handle: mr,
            lkey: key,
            rkey: key,
        })
    }

    /// MR `mr`'s current `(addr, length, access)`, which `rereg_mr` keeps for what it
    /// does not change.
    pub fn mr_range(&self, ctx: CtxId, mr: Handle) -> Result<(u64, u64, Access)> {
        let m = self
            .ctx(ctx)?
            .mrs
            .get(&mr)
            .ok_or(Error::InvalidHandle(ObjectKind::Mr))?;
        Ok((m.addr, m.length, m.access))
    }

    /// `ibv_dereg_mr`. Once this returns, the key resolves to nothing, so the data path can no
    /// longer reach the memory. An MR with memory windows bound to it is `EINVAL` (IBA
    /// 10.6.7.2.6; rxe's `rxe_dereg_mr`): its windows must be invalidated or deallocated first.
    pub fn dereg_mr(&mut self, ctx: CtxId, mr: Handle) -> Result<()> {
        let c = self.ctx_mut(ctx)?;
        if c.mrs.get(&mr).is_some_and(|m| m.bound_mws > 0) {
            return Err(Error::InvalidArgument(
                "memory windows are bound to this MR",
            ));
        }
        let m = c
            .mrs
            .remove(&mr)
            .ok_or(Error::UnknownHandle(ObjectKind::Mr))?;
        if let Some(p) = c.pds.get_mut(&m.pd) {
            p.usecnt -= 1;
        }
        let dev = c.device;
        self.key_routes.remove(&m.key);
        self.keys.free(m.key);
        self.usage[dev].mrs -= 1;
        self.uncharge(ctx, Resource::Mrs, 1);
        self.uncharge(
            ctx,
            Resource::RegisteredBytes,
            odp::pinned_bytes(m.length, m.access),
        );
        self.forget_mr_mapping(ctx, mr);
        self.push_change(CoreChange::MrDeregistered { ctx, mr });
        Ok(())
    }

    /// `ibv_create_cq`: `cqe` must be 1..=max_cqe and `comp_vector` below
    /// `num_comp_vectors`. Returns the handle and the granted size.
    pub fn create_cq(&mut self, ctx: CtxId, cqe: u32, comp_vector: u32) -> Result<(Handle, u32)> {
        let dev = self.ctx(ctx)?.device;
        let attr = &self.devices[dev].attr;
        if cqe == 0 || cqe > attr.max_cqe {
            return Err(Error::InvalidArgument("cqe out of range"));
        }
        if comp_vector >= attr.num_comp_vectors {
            return Err(Error::InvalidArgument("comp_vector out of range"));
        }
        if self.usage[dev].cqs >= attr.max_cq {
            return Err(Error::NoResources("max_cq"));
        }
        self.admit(ctx, Resource::Cqs, 1)?;
        let h = self.new_handle(ctx)?;
        self.ctx_mut(ctx)?.cqs.insert(
            h,
            Cq {
                cqe,
                comp_vector,
                usecnt: 0,
                events_reported: 0,
            },
        );
        self.usage[dev].cqs += 1;
        self.add_usage(ctx, Resource::Cqs, 1);
        self.push_change(CoreChange::CqCreated { ctx, cq: h, cqe });
        Ok((h, cqe))
    }

    /// `ibv_resize_cq`.
    pub fn resize_cq(&mut self, ctx: CtxId, cq: Handle, cqe: u32) -> Result<u32> {
        let c = self.ctx(ctx)?;
        let max = self.devices[c.device].attr.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(Error::InvalidArgument("cqe out of range"));
        }
        let q = self
            .ctx_mut(ctx)?
            .cqs
            .get_mut(&cq)
            .ok_or(Error::InvalidHandle(ObjectKind::Cq))?;
        q.cqe = cqe;
        self.push_change(CoreChange::CqResized { ctx, cq, cqe });
        Ok(cqe)
    }

    /// Size and completion vector of a CQ.
    pub fn cq_attr(&self, ctx: CtxId, cq: Handle) -> Result<(u32, u32)> {
        let q = self
            .ctx(ctx)?
            .cqs
            .get(&cq)
            .ok_or(Error::InvalidHandle(ObjectKind::Cq))?;
        Ok((q.cqe, q.comp_vector))
    }

    /// `ibv_destroy_cq`: `EBUSY` while QPs or XRC SRQs complete into it. Returns the number
    /// of async events reported for it.
    pub fn destroy_cq(&mut self, ctx: CtxId, cq: Handle) -> Result<u32> {
        let c = self.ctx_mut(ctx)?;
        let q = c.cqs.get(&cq).ok_or(Error::UnknownHandle(ObjectKind::Cq))?;
        if q.usecnt > 0 {
            return Err(Error::Busy(ObjectKind::Cq, "QPs or SRQs still use this CQ"));
        }
        let q = c.cqs.remove(&cq).expect("checked above");
        c.events.purge(crate::event::EventElement::Cq(cq));
        let dev = c.device;
        self.usage[dev].cqs -= 1;
        self.uncharge(ctx, Resource::Cqs, 1);
        self.detach_ring(ctx, Ring::Cq(cq));
        self.push_change(CoreChange::CqDestroyed { ctx, cq });
        Ok(q.events_reported)
    }

    /// `ibv_create_ah`.
    pub fn create_ah(&mut self, ctx: CtxId, pd: Handle, attr: AhAttr) -> Result<Handle> {
        let c = self.ctx(ctx)?;
        let dev = c.device;
        if !c.pds.contains_key(&pd) {
            return Err(Error::InvalidHandle(ObjectKind::Pd));
        }
        check_ah(&self.devices[dev], &attr)?;
        if self.usage[dev].ahs >= self.devices[dev].attr.max_ah {
            return Err(Error::NoResources("max_ah"));
        }
        self.admit(ctx, Resource::Ahs, 1)?;
        let h = self.new_handle(ctx)?;
        let c = self.ctx_mut(ctx)?;
        c.ahs.insert(h, Ah { pd, attr });
        c.pds.get_mut(&pd).expect("checked above").usecnt += 1;
        self.usage[dev].ahs += 1;
        self.add_usage(ctx, Resource::Ahs, 1);
        Ok(h)
    }

    /// `ibv_destroy_ah`.
    pub fn destroy_ah(&mut self, ctx: CtxId, ah: Handle) -> Result<()> {
        let c = self.ctx_mut(ctx)?;
        let a = c
            .ahs
            .remove(&ah)
            .ok_or(Error::UnknownHandle(ObjectKind::Ah))?;
        if let Some(p) = c.pds.get_mut(&a.pd) {
            p.usecnt -= 1;
        }
        let dev = c.device;
        self.usage[dev].ahs -= 1;
        self.uncharge(ctx, Resource::Ahs, 1);
        Ok(())
    }

    /// The attributes of an AH (for the data path of UD sends).
    pub fn ah_attr(&self, ctx: CtxId, ah: Handle) -> Result<AhAttr> {
        let c = self.ctx(ctx)?;
        Ok(c.ahs
            .get(&ah)
            .ok_or(Error::InvalidHandle(ObjectKind::Ah))?
            .attr)
    }

    fn check_srq_attr(dev: &Device, attr: &SrqAttr) -> Result<SrqAttr> {
        if attr.max_wr > dev.attr.max_srq_wr {
            return Err(Error::InvalidArgument("SRQ max_wr above device limit"));
        }
        if attr.max_sge > dev.attr.max_srq_sge {
            return Err(Error::InvalidArgument("SRQ max_sge above device limit"));
        }
        // rxe grants a minimum depth rather than failing a zero-sized request.
        Ok(SrqAttr {
            max_wr: attr.max_wr.max(1),
            max_sge: attr.max_sge.max(1),
            srq_limit: 0,
        })
    }

    /// `ibv_create_srq` (basic SRQ).
    pub fn create_srq(&mut self, ctx: CtxId, pd: Handle, attr: SrqAttr) -> Result<SrqCreated> {
        let c = self.ctx(ctx)?;
        let dev = c.device;
        if !c.pds.contains_key(&pd) {
            return Err(Error::InvalidHandle(ObjectKind::Pd));
        }
        let attr = Self::check_srq_attr(&self.devices[dev], &attr)?;
        if self.usage[dev].srqs >= self.devices[dev].attr.max_srq {
            return Err(Error::NoResources("max_srq"));
        }
        self.admit(ctx, Resource::Srqs, 1)?;
        let h = self.new_handle(ctx)?;
        let c = self.ctx_mut(ctx)?;
        c.srqs.insert(
            h,
            Srq {
                pd,
                kind: SrqKind::Basic,
                attr,
                usecnt: 0,
                events_reported: 0,
            },
        );
        c.pds.get_mut(&pd).expect("checked above").usecnt += 1;
        self.usage[dev].srqs += 1;
        self.add_usage(ctx, Resource::Srqs, 1);
        self.srq_created(ctx, h, dev);
        Ok(SrqCreated {
            handle: h,
            attr,
            srqn: None,
        })
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC` (or legacy `ibv_create_xrc_srq`): needs a PD,
    /// an XRC domain handle and a CQ of this context (docs/design/xrc-semantics.md §1.2). The SRQ takes a
    /// count on the domain and gets a 24-bit SRQ number.
    ///
    /// A missing PD, domain or CQ (`comp_mask` bit not set) is `EINVAL`, as libibverbs
    /// answers; so is a handle that names nothing.
    pub fn create_xrc_srq(
        &mut self,
        ctx: CtxId,
        pd: Option<Handle>,
        xrcd_handle: Option<Handle>,
        cq: Option<Handle>,
        attr: SrqAttr,
    ) -> Result<SrqCreated> {
        let pd = pd.ok_or(Error::InvalidArgument("XRC SRQ needs a PD"))?;
        let xrcd_handle =
            xrcd_handle.ok_or(Error::InvalidArgument("XRC SRQ needs an XRC domain"))?;
        let cq = cq.ok_or(Error::InvalidArgument("XRC SRQ needs a CQ"))?;
        let c = self.ctx(ctx)?;
        let dev = c.device;
        if !c.pds.contains_key(&pd) {
            return Err(Error::InvalidHandle(ObjectKind::Pd));
        }
        if !c.cqs.contains_key(&cq) {
            return Err(Error::InvalidHandle(ObjectKind::Cq));
        }
        let xrcd = c
            .xrcds
            .get(&xrcd_handle)
            .ok_or(Error::InvalidHandle(ObjectKind::Xrcd))?
            .xrcd;
        let attr = Self::check_srq_attr(&self.devices[dev], &attr)?;
        if self.usage[dev].srqs >= self.devices[dev].attr.max_srq {
            return Err(Error::NoResources("max_srq"));
        }
        self.admit(ctx, Resource::Srqs, 1)?;
        let srqn = self
            .srqns
            .alloc()
            .ok_or(Error::NoResources("SRQ numbers"))?;
        let h = self.new_handle(ctx)?;
        let c = self.ctx_mut(ctx)?;
        c.srqs.insert(
            h,
            Srq {
                pd,
                kind: SrqKind::Xrc {
                    xrcd_handle,
                    xrcd,
                    cq,
                    srqn,
                },
                attr,
                usecnt: 0,
                events_reported: 0,
            },
        );
        c.pds.get_mut(&pd).expect("checked above").usecnt += 1;
        c.cqs.get_mut(&cq).expect("checked above").usecnt += 1;
        c.xrcds.get_mut(&xrcd_handle).expect("checked above").refcnt += 1;
        self.xrcds
            .get_mut(&xrcd)
            .expect("handle implies domain")
            .srqs += 1;
        self.srq_routes.insert(srqn, (ctx, h));
        self.usage[dev].srqs += 1;
        self.add_usage(ctx, Resource::Srqs, 1);
        self.srq_created(ctx, h, dev);
        Ok(SrqCreated {
            handle: h,
            attr,
            srqn: Some(srqn),
        })
    }

    fn srq_created(&mut self, ctx: CtxId, srq: Handle, device: usize) {
        let info = self.srq_info(ctx, srq).expect("created by the caller");
        self.push_change(CoreChange::SrqCreated {
            ctx,
            srq,
            device,
            info,
        });
    }

    /// `ibv_get_srq_num`: the SRQ number of an XRC SRQ; `EOPNOTSUPP` for a basic SRQ, as the
    /// mlx4 provider answers.
    pub fn srq_num(&self, ctx: CtxId, srq: Handle) -> Result<u32> {
        let s = self
            .ctx(ctx)?
            .srqs
            .get(&srq)
            .ok_or(Error::InvalidHandle(ObjectKind::Srq))?;
        match s.kind {
            SrqKind::Xrc { srqn, .. } => Ok(srqn),
            SrqKind::Basic => Err(Error::NotSupported("SRQ number of a non-XRC SRQ")),
        }
    }

    /// `ibv_modify_srq`: `IBV_SRQ_MAX_WR` resizes, `IBV_SRQ_LIMIT` arms the limit event
    /// (IBA 10.2.9.3: the limit must not exceed the queue depth).
    pub fn modify_srq(
        &mut self,
        ctx: CtxId,
        srq: Handle,
        attr: SrqAttr,
        mask: u32,
    ) -> Result<SrqAttr> {
        if mask & !(SRQ_MAX_WR | SRQ_LIMIT) != 0 {
            return Err(Error::InvalidArgument("unknown SRQ attribute mask bits"));
        }
        let c = self.ctx(ctx)?;
        let max_srq_wr = self.devices[c.device].attr.max_srq_wr;
        let s = self
            .ctx_mut(ctx)?
            .srqs
            .get_mut(&srq)
            .ok_or(Error::InvalidHandle(ObjectKind::Srq))?;
        let mut next = s.attr;
        if mask & SRQ_MAX_WR != 0 {
            if attr.max_wr == 0 || attr.max_wr > max_srq_wr {
                return Err(Error::InvalidArgument("SRQ max_wr out of range"));
            }
            next.max_wr = attr.max_wr;
        }
        if mask & SRQ_LIMIT != 0 {
            next.srq_limit = attr.srq_limit;
        }
        if next.srq_limit > next.max_wr {
            return Err(Error::InvalidArgument("SRQ limit above max_wr"));
        }
        s.attr = next;
        if mask & SRQ_LIMIT != 0 {
            self.push_change(CoreChange::SrqLimitArmed {
                ctx,
                srq,
                limit: next.srq_limit,
            });
        }
        Ok(next)
    }

    /// `ibv_query_srq`.
    pub fn query_srq(&self, ctx: CtxId, srq: Handle) -> Result<SrqAttr> {
        Ok(self
            .ctx(ctx)?
            .srqs
            .get(&srq)
            .ok_or(Error::InvalidHandle(ObjectKind::Srq))?
            .attr)
    }

    /// `ibv_destroy_srq`: `EBUSY` while QPs are attached (XRC receive QPs never are). An XRC
    /// SRQ gives back its domain count and its SRQ number; later packets naming that number
    /// find nothing. Returns the number of async events reported for it.
    pub fn destroy_srq(&mut self, ctx: CtxId, srq: Handle) -> Result<u32> {
        let c = self.ctx_mut(ctx)?;
        let s = c
            .srqs
            .get(&srq)
            .ok_or(Error::UnknownHandle(ObjectKind::Srq))?;
        if s.usecnt > 0 {
            return Err(Error::Busy(ObjectKind::Srq, "QPs are still attached"));
        }
        let s = c.srqs.remove(&srq).expect("checked above");
        c.events.purge(crate::event::EventElement::Srq(srq));
        if let Some(p) = c.pds.get_mut(&s.pd) {
            p.usecnt -= 1;
        }
        let dev = c.device;
        if let SrqKind::Xrc {
            xrcd_handle,
            xrcd,
            cq,
            srqn,
        } = s.kind
        {
            if let Some(q) = c.cqs.get_mut(&cq) {
                q.usecnt -= 1;
            }
            if let Some(x) = c.xrcds.get_mut(&xrcd_handle) {
                x.refcnt -= 1;
            }
            self.srq_routes.remove(&srqn);
            self.srqns.free(srqn);
            self.release_xrcd_count(xrcd, |x| x.srqs -= 1);
        }
        self.usage[dev].srqs -= 1;
        self.uncharge(ctx, Resource::Srqs, 1);
        self.detach_ring(ctx, Ring::Srq(srq));
        self.push_change(CoreChange::SrqDestroyed { ctx, srq });
        Ok(s.events_reported)
    }
}

/// The access and range rules of `reg_mr` and `rereg_mr` (`ib_check_mr_access`, IBA
/// 10.6.3.2 / 11.2.8.1: remote write or remote atomic access requires local write).
fn check_mr(dev: &Device, addr: u64, length: u64, iova: u64, access: Access) -> Result<()> {
    if !Access::MR_ALLOWED.contains(access) {
        return Err(Error::InvalidArgument("unsupported MR access flags"));
    }
    if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
        && !access.contains(Access::LOCAL_WRITE)
    {
        return Err(Error::InvalidArgument(
            "remote write/atomic access needs local write",
        ));
    }
    if odp::check_implicit(addr, length, iova, access)? {
        // The whole address space: no range to bound (max_mr_size is for explicit MRs).
        return Ok(());
    }
    if addr.checked_add(length).is_none() || iova.checked_add(length).is_none() {
        return Err(Error::InvalidArgument("MR range overflows"));
    }
    if length > dev.attr.max_mr_size {
        return Err(Error::InvalidArgument("MR longer than max_mr_size"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::datapath::{MemError, PdRef};
    use crate::device::Device;
    use crate::types::{Access, Mtu};
    use crate::{ContextInfo, Core};

    #[test]
    fn rereg_mr_keeps_keys_and_changes_pd_access_and_range() {
        let mut core = Core::new(vec![Device::roce(
            "sv0",
            1,
            &["127.0.0.1".parse().unwrap()],
            Mtu::M1024,
        )]);
        let info = ContextInfo {
            pid: 1,
            uid: 0,
            comm: "t".into(),
        };
        let c = core.open_context(0, info).unwrap();
        let (pd1, pd2) = (core.alloc_pd(c).unwrap(), core.alloc_pd(c).unwrap());
        let k = core
            .reg_mr(c, pd1, 0x1000, 64, 0x1000, Access::LOCAL_WRITE)
            .unwrap();
        let p1 = PdRef { ctx: c, pd: pd1 };
        let p2 = PdRef { ctx: c, pd: pd2 };
        let write = Access::REMOTE_WRITE;
        assert_eq!(
            core.check_mem(p1, k.rkey, 0x1000, 8, write).unwrap_err(),
            MemError::AccessDenied
        );
        // Access: same keys, now writable remotely.
        let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let k2 = core.rereg_mr(c, k.handle, None, Some(acc), None).unwrap();
        assert_eq!(k2, k);
        assert!(core.check_mem(p1, k.rkey, 0x1000, 8, write).is_ok());
        // Remote write without local write is refused, and nothing changes.
        assert!(core.rereg_mr(c, k.handle, None, Some(write), None).is_err());
        assert!(core.check_mem(p1, k.rkey, 0x1000, 8, write).is_ok());
        // PD: the old PD is free to go, the new one is held.
        core.rereg_mr(c, k.handle, Some(pd2), None, None).unwrap();
        assert_eq!(
            core.check_mem(p1, k.rkey, 0x1000, 8, write).unwrap_err(),
            MemError::WrongPd
        );
        assert!(core.check_mem(p2, k.rkey, 0x1000, 8, write).is_ok());
        assert!(core.dealloc_pd(c, pd2).is_err());
        core.dealloc_pd(c, pd1).unwrap();
        // Range.
        core.rereg_mr(c, k.handle, None, None, Some((0x9000, 16, 0x9000)))
            .unwrap();
        assert_eq!(
            core.check_mem(p2, k.rkey, 0x1000, 8, write).unwrap_err(),
            MemError::OutOfBounds
        );
        let t = core.check_mem(p2, k.rkey, 0x9008, 8, write).unwrap();
        assert_eq!(t.addr, 0x9008);
        core.dereg_mr(c, k.handle).unwrap();
        core.dealloc_pd(c, pd2).unwrap();
    }
}
