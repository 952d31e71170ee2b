//! The [`Core`]: every object of every context, the shared XRC state, and context life.
//!
//! Ownership rule (the isolation the issue asks for): each context resolves handles only in
//! its own tables. The only ways to reach something another context made are the sharing
//! rules — an XRC domain by file identity, and an XRC receive QP by number inside a domain
//! the caller has open. Everything else answers "invalid handle" whatever value is guessed.

use std::collections::{BTreeMap, VecDeque};

use foldhash::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::attr::{AhAttr, QpAttr, QpInitInfo, SrqAttr};
use crate::change::CoreChange;
use crate::device::Device;
use crate::error::{Error, ObjectKind, Result};
use crate::event::{AsyncEvent, EventElement, EventQueue};
use crate::ids::{CtxId, FileId, Handle, NumberPool, XrcdId};
use crate::limits::{Limits, Ring, Usage};
use crate::mcast::McastTable;
use crate::types::{Access, MAX_24BIT};

/// Who is on the other end of a context: filled in by the daemon from `SO_PEERCRED` and
/// `/proc`, shown by introspection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextInfo {
    /// Process id of the client.
    pub pid: u32,
    /// User id of the client.
    pub uid: u32,
    /// Command name of the client.
    pub comm: String,
}

#[derive(Debug, Default)]
pub(crate) struct Pd {
    /// Objects created on this PD (QPs, SRQs, MRs, AHs): dealloc is `EBUSY` while non-zero.
    pub(crate) usecnt: u32,
}

#[derive(Debug)]
pub(crate) struct Mr {
    pub(crate) pd: Handle,
    pub(crate) addr: u64,
    pub(crate) length: u64,
    pub(crate) iova: u64,
    pub(crate) access: Access,
    pub(crate) key: u32,
    /// Memory windows bound to it (crate::mw): dereg and rereg are `EINVAL` while non-zero.
    pub(crate) bound_mws: u32,
}

#[derive(Debug)]
pub(crate) struct Cq {
    pub(crate) cqe: u32,
    pub(crate) comp_vector: u32,
    /// QPs and XRC SRQs completing into this CQ.
    pub(crate) usecnt: u32,
    pub(crate) events_reported: u32,
}

#[derive(Debug)]
pub(crate) struct Ah {
    pub(crate) pd: Handle,
    pub(crate) attr: AhAttr,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum SrqKind {
    Basic,
    Xrc {
        xrcd_handle: Handle,
        xrcd: XrcdId,
        cq: Handle,
        srqn: u32,
    },
}

#[derive(Debug)]
pub(crate) struct Srq {
    pub(crate) pd: Handle,
    pub(crate) kind: SrqKind,
    pub(crate) attr: SrqAttr,
    /// QPs attached to this (basic) SRQ. XRC receive QPs never count (docs/design/xrc-semantics.md §1.2).
    pub(crate) usecnt: u32,
    pub(crate) events_reported: u32,
}

#[derive(Debug)]
pub(crate) struct OwnedQp {
    pub(crate) qpn: u32,
    pub(crate) init: QpInitInfo,
    pub(crate) pd: Handle,
    pub(crate) send_cq: Handle,
    pub(crate) recv_cq: Option<Handle>,
    pub(crate) srq: Option<Handle>,
    pub(crate) attr: QpAttr,
    pub(crate) events_reported: u32,
}

#[derive(Debug)]
pub(crate) enum QpEntry {
    Owned(Box<OwnedQp>),
    /// A handle on a shared XRC receive QP (upstream face: from `create_qp` or `open_qp`).
    XrcRecv {
        qpn: u32,
        xrcd_handle: Handle,
    },
}

#[derive(Debug)]
pub(crate) struct XrcdHandle {
    pub(crate) xrcd: XrcdId,
    /// SRQs, receive-QP handles and registrations made through this handle: close is
    /// `EBUSY` while non-zero (uverbs `uxrcd.refcnt`).
    pub(crate) refcnt: u32,
}

#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) device: usize,
    pub(crate) info: ContextInfo,
    pub(crate) pds: HashMap<Handle, Pd>,
    pub(crate) mrs: HashMap<Handle, Mr>,
    pub(crate) mws: HashMap<Handle, crate::mw::Mw>,
    pub(crate) cqs: HashMap<Handle, Cq>,
    pub(crate) srqs: HashMap<Handle, Srq>,
    pub(crate) ahs: HashMap<Handle, Ah>,
    pub(crate) qps: HashMap<Handle, QpEntry>,
    pub(crate) xrcds: HashMap<Handle, XrcdHandle>,
    /// Legacy/minimal registrations on XRC receive QPs: QP number → the XRCD handle it was
    /// made through. One per QP per context, however often the context registers.
    pub(crate) xrc_regs: HashMap<u32, Handle>,
    pub(crate) events: EventQueue,
    /// What the context is charged with (docs/guide/limits.md).
    pub(crate) usage: Usage,
    /// Rings the daemon made for the context's objects, and their sizes.
    pub(crate) rings: HashMap<Ring, u64>,
    /// MRs the daemon reaches through a mapping of their memory (shared MRs).
    pub(crate) mapped_mrs: HashSet<Handle>,
}

impl Context {
    fn holds_handle(&self, h: Handle) -> bool {
        self.pds.contains_key(&h)
            || self.mrs.contains_key(&h)
            || self.mws.contains_key(&h)
            || self.cqs.contains_key(&h)
            || self.srqs.contains_key(&h)
            || self.ahs.contains_key(&h)
            || self.qps.contains_key(&h)
            || self.xrcds.contains_key(&h)
    }
}

/// A shared XRC domain (docs/design/xrc-semantics.md §1.1). It exists while `opens + srqs + tgt_qps > 0`
/// (uverbs `xrcd.usecnt`); the three parts are kept apart for introspection.
#[derive(Debug)]
pub(crate) struct Xrcd {
    pub(crate) device: usize,
    pub(crate) file: Option<FileId>,
    pub(crate) opens: u32,
    pub(crate) srqs: u32,
    pub(crate) tgt_qps: u32,
}

impl Xrcd {
    pub(crate) fn usecnt(&self) -> u32 {
        self.opens + self.srqs + self.tgt_qps
    }
}

/// A real XRC receive (target) QP: owned by the core, never by a context.
#[derive(Debug)]
pub(crate) struct TgtQp {
    pub(crate) xrcd: XrcdId,
    pub(crate) attr: QpAttr,
    /// Number of entries in [`Core::holders`] for this QP; the QP is destroyed when it
    /// drops to zero.
    pub(crate) holders: u32,
}

/// How a context holds an XRC receive QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum HolderRef {
    /// The legacy/minimal API's per-context registration (named by QP number).
    Registration,
    /// An upstream QP handle of the context.
    Handle(Handle),
}

/// How the holder came to hold the QP, for introspection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HolderKind {
    /// Created the QP (legacy create, minimal register-with-no-number, or create_qp).
    Creator,
    /// Joined with a legacy or minimal registration.
    Registration,
    /// Joined with `open_qp`.
    Opened,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct HolderKey {
    pub(crate) qpn: u32,
    pub(crate) ctx: CtxId,
    pub(crate) via: HolderRef,
}

#[derive(Debug)]
pub(crate) struct Holder {
    pub(crate) kind: HolderKind,
    pub(crate) events_reported: u32,
}

/// Where a QP number leads (for the data path and for event routing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpRoute {
    Owned { ctx: CtxId, handle: Handle },
    XrcRecv,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DeviceUsage {
    pub(crate) qps: u32,
    pub(crate) cqs: u32,
    pub(crate) mrs: u32,
    pub(crate) mws: u32,
    pub(crate) pds: u32,
    pub(crate) srqs: u32,
    pub(crate) ahs: u32,
}

/// Counts of everything the core holds, for leak checks and introspection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Counts {
    pub contexts: usize,
    pub pds: usize,
    pub mrs: usize,
    /// Memory windows.
    #[serde(default)]
    pub mws: usize,
    pub cqs: usize,
    pub srqs: usize,
    pub ahs: usize,
    /// QP handles of all contexts (owned QPs and receive-QP handles).
    pub qp_handles: usize,
    pub xrcd_handles: usize,
    pub xrcds: usize,
    pub xrc_recv_qps: usize,
    pub xrc_recv_holders: usize,
    pub registrations: usize,
    pub qpns_in_use: usize,
    pub srqns_in_use: usize,
    pub keys_in_use: usize,
    pub files: usize,
    pub pending_events: usize,
}

impl Counts {
    /// True when nothing but devices is left.
    pub fn is_empty(&self) -> bool {
        *self == Counts::default()
    }
}

/// The verbs object model of one daemon: all devices, contexts and objects.
///
/// Every method runs in O(1) or O(log n) in the number of objects, except context teardown,
/// which is linear in what that one context holds.
#[derive(Debug)]
pub struct Core {
    pub(crate) devices: Vec<Device>,
    pub(crate) usage: Vec<DeviceUsage>,
    pub(crate) contexts: HashMap<CtxId, Context>,
    next_ctx: u64,
    next_handle: u32,
    pub(crate) xrcds: HashMap<XrcdId, Xrcd>,
    pub(crate) next_xrcd: u64,
    pub(crate) xrcd_by_file: HashMap<(usize, FileId), XrcdId>,
    pub(crate) tgt_qps: HashMap<u32, TgtQp>,
    pub(crate) holders: BTreeMap<HolderKey, Holder>,
    pub(crate) qpns: NumberPool,
    pub(crate) qp_routes: HashMap<u32, QpRoute>,
    pub(crate) srqns: NumberPool,
    pub(crate) srq_routes: HashMap<u32, (CtxId, Handle)>,
    pub(crate) keys: NumberPool,
    pub(crate) key_routes: HashMap<u32, (CtxId, Handle)>,
    /// Memory window key indices (crate::mw: disjoint from MR keys).
    pub(crate) mw_indices: NumberPool,
    pub(crate) limits: Limits,
    /// What each uid's contexts use together (uids using nothing have no entry).
    pub(crate) uid_usage: HashMap<u32, Usage>,
    pub(crate) daemon_usage: Usage,
    /// Changes the data path has not taken yet ([`Core::poll_change`]).
    pub(crate) changes: VecDeque<CoreChange>,
    /// Multicast groups, per device (`crate::mcast`).
    pub(crate) mcast: Vec<McastTable>,
}

/// The last MR key: MR keys stay below the memory window keys (crate::mw).
pub const MR_KEY_LAST: u32 = 0x7FFF_FFFF;

/// First QP number handed out: 0 and 1 are the special QPs of IBA 3.5.11 (SMI, GSI).
pub const FIRST_QPN: u32 = 0x11;

impl Core {
    /// A core serving `devices`.
    pub fn new(devices: Vec<Device>) -> Core {
        let usage = vec![DeviceUsage::default(); devices.len()];
        let mcast = devices.iter().map(|_| McastTable::default()).collect();
        Core {
            devices,
            usage,
            contexts: HashMap::default(),
            next_ctx: 1,
            next_handle: 1,
            xrcds: HashMap::default(),
            next_xrcd: 1,
            xrcd_by_file: HashMap::default(),
            tgt_qps: HashMap::default(),
            holders: BTreeMap::new(),
            // 0xFFFFFF is the multicast destination QPN (`crate::mcast`), never a QP's.
            qpns: NumberPool::new(FIRST_QPN, crate::mcast::MULTICAST_QPN - 1),
            qp_routes: HashMap::default(),
            srqns: NumberPool::new(1, MAX_24BIT),
            srq_routes: HashMap::default(),
            keys: NumberPool::new(1, MR_KEY_LAST),
            mw_indices: NumberPool::new(crate::mw::MW_INDEX_FIRST, crate::mw::MW_INDEX_LAST),
            key_routes: HashMap::default(),
            limits: Limits::unlimited(),
            uid_usage: HashMap::default(),
            daemon_usage: Usage::default(),
            changes: VecDeque::new(),
            mcast,
        }
    }

    /// The devices, indexed as contexts refer to them.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Opens a context on device `device` for a client (`ibv_open_device`). Fails with
    /// [`Error::OverLimit`] when the client's uid has its limit of contexts open.
    pub fn open_context(&mut self, device: usize, info: ContextInfo) -> Result<CtxId> {
        if device >= self.devices.len() {
            return Err(Error::InvalidHandle(ObjectKind::Device));
        }
        self.admit_new_context(info.uid)?;
        let id = CtxId(self.next_ctx);
        self.next_ctx += 1;
        self.contexts.insert(
            id,
            Context {
                device,
                info,
                pds: HashMap::default(),
                mrs: HashMap::default(),
                mws: HashMap::default(),
                cqs: HashMap::default(),
                srqs: HashMap::default(),
                ahs: HashMap::default(),
                qps: HashMap::default(),
                xrcds: HashMap::default(),
                xrc_regs: HashMap::default(),
                events: EventQueue::default(),
                usage: Usage::default(),
                rings: HashMap::default(),
                mapped_mrs: HashSet::default(),
            },
        );
        self.add_usage(id, crate::limits::Resource::Contexts, 1);
        Ok(id)
    }

    /// The device a context was opened on.
    pub fn context_device(&self, ctx: CtxId) -> Result<&Device> {
        let c = self.ctx(ctx)?;
        Ok(&self.devices[c.device])
    }

    /// The client information of a context.
    pub fn context_info(&self, ctx: CtxId) -> Result<&ContextInfo> {
        Ok(&self.ctx(ctx)?.info)
    }

    /// Tears a context down, as process exit does (uverbs `uverbs_destroy_ufile_hw`): every
    /// object it holds is destroyed. The effect is that of destroying in dependency order —
    /// QP handles and receive-QP registrations, then SRQs, AHs, MRs, CQs, PDs, and last the
    /// XRC domain handles — without the per-object bookkeeping inside the dying context.
    /// Shared objects (domains, receive QPs) survive while anyone else holds them.
    ///
    /// Costs O(objects of this context × log n); nothing else is walked.
    pub fn close_context(&mut self, ctx: CtxId) -> Result<()> {
        // The context's own tables go as a whole; only what others can see — shared receive
        // QPs, domains, and the global number and key tables — needs releasing one by one.
        // Unread events go with the context: nobody is left to read them.
        let c = self
            .contexts
            .remove(&ctx)
            .ok_or(Error::InvalidHandle(ObjectKind::Context))?;
        let dev = c.device;
        self.release_context_usage(c.info.uid, &c.usage);
        let mut held: Vec<(u32, HolderRef)> = c
            .xrc_regs
            .keys()
            .map(|&qpn| (qpn, HolderRef::Registration))
            .collect();
        for (&h, entry) in &c.qps {
            match entry {
                QpEntry::Owned(q) => {
                    self.qp_routes.remove(&q.qpn);
                    self.qpns.free(q.qpn);
                    self.usage[dev].qps -= 1;
                    self.leave_mcast_groups(dev, q.qpn);
                    self.push_change(CoreChange::QpDestroyed { qpn: q.qpn });
                }
                QpEntry::XrcRecv { qpn, .. } => held.push((*qpn, HolderRef::Handle(h))),
            }
        }
        // In QP-number order, the walk of the ordered holder map is sequential: this halves
        // the teardown of 100,000 registrations (cache misses dominate).
        held.sort_unstable();
        for (qpn, via) in held {
            self.release_holder(qpn, ctx, via);
        }
        for s in c.srqs.values() {
            if let SrqKind::Xrc { xrcd, srqn, .. } = s.kind {
                self.srq_routes.remove(&srqn);
                self.srqns.free(srqn);
                self.release_xrcd_count(xrcd, |x| x.srqs -= 1);
            }
        }
        for m in c.mrs.values() {
            self.key_routes.remove(&m.key);
            self.keys.free(m.key);
        }
        for (&mw, w) in &c.mws {
            self.mw_indices.free(w.rkey >> 8);
            self.changes.push_back(CoreChange::MwDeallocated {
                ctx,
                mw,
                device: dev,
                rkey: w.rkey,
            });
        }
        let u = &mut self.usage[dev];
        u.mws -= c.mws.len() as u32;
        u.srqs -= c.srqs.len() as u32;
        u.mrs -= c.mrs.len() as u32;
        u.cqs -= c.cqs.len() as u32;
        u.pds -= c.pds.len() as u32;
        u.ahs -= c.ahs.len() as u32;
        for x in c.xrcds.values() {
            self.release_xrcd_count(x.xrcd, |d| d.opens -= 1);
        }
        self.push_change(CoreChange::ContextClosed { ctx });
        Ok(())
    }

    /// Ids of the live contexts.
    pub fn context_ids(&self) -> impl Iterator<Item = CtxId> + '_ {
        self.contexts.keys().copied()
    }

    /// Counts of all objects, for leak checks.
    pub fn counts(&self) -> Counts {
        let mut n = Counts {
            contexts: self.contexts.len(),
            xrcds: self.xrcds.len(),
            xrc_recv_qps: self.tgt_qps.len(),
            xrc_recv_holders: self.holders.len(),
            qpns_in_use: self.qpns.in_use(),
            srqns_in_use: self.srqns.in_use(),
            keys_in_use: self.keys.in_use(),
            files: self.xrcd_by_file.len(),
            ..Counts::default()
        };
        for c in self.contexts.values() {
            n.pds += c.pds.len();
            n.mrs += c.mrs.len();
            n.mws += c.mws.len();
            n.cqs += c.cqs.len();
            n.srqs += c.srqs.len();
            n.ahs += c.ahs.len();
            n.qp_handles += c.qps.len();
            n.xrcd_handles += c.xrcds.len();
            n.registrations += c.xrc_regs.len();
            n.pending_events += c.events.len();
        }
        n
    }

    /// Reads the oldest unread async event of a context (`ibv_get_async_event`), counting it
    /// as reported for its object (what destroy later returns as `events_reported`).
    pub fn next_event(&mut self, ctx: CtxId) -> Result<Option<AsyncEvent>> {
        let c = self.ctx_mut(ctx)?;
        let Some(ev) = c.events.pop() else {
            return Ok(None);
        };
        match ev.element {
            EventElement::Qp(h) => match c.qps.get_mut(&h) {
                Some(QpEntry::Owned(q)) => q.events_reported += 1,
                Some(QpEntry::XrcRecv { qpn, .. }) => {
                    let key = HolderKey {
                        qpn: *qpn,
                        ctx,
                        via: HolderRef::Handle(h),
                    };
                    if let Some(holder) = self.holders.get_mut(&key) {
                        holder.events_reported += 1;
                    }
                }
                None => {}
            },
            EventElement::XrcRecvQpNum(qpn) => {
                let key = HolderKey {
                    qpn,
                    ctx,
                    via: HolderRef::Registration,
                };
                if let Some(holder) = self.holders.get_mut(&key) {
                    holder.events_reported += 1;
                }
            }
            EventElement::Cq(h) => {
                if let Some(cq) = c.cqs.get_mut(&h) {
                    cq.events_reported += 1;
                }
            }
            EventElement::Srq(h) => {
                if let Some(srq) = c.srqs.get_mut(&h) {
                    srq.events_reported += 1;
                }
            }
            EventElement::Port(_) | EventElement::Device => {}
        }
        Ok(Some(ev))
    }

    /// Number of unread async events of a context (the daemon makes its async fd readable
    /// while this is non-zero).
    pub fn pending_events(&self, ctx: CtxId) -> Result<usize> {
        Ok(self.ctx(ctx)?.events.len())
    }

    /// Events dropped for a context because its queue was full.
    pub fn dropped_events(&self, ctx: CtxId) -> Result<u64> {
        Ok(self.ctx(ctx)?.events.dropped)
    }

    pub(crate) fn ctx(&self, ctx: CtxId) -> Result<&Context> {
        self.contexts
            .get(&ctx)
            .ok_or(Error::InvalidHandle(ObjectKind::Context))
    }

    pub(crate) fn ctx_mut(&mut self, ctx: CtxId) -> Result<&mut Context> {
        self.contexts
            .get_mut(&ctx)
            .ok_or(Error::InvalidHandle(ObjectKind::Context))
    }

    /// A fresh handle value, unused by `ctx` (values are global, so wrap-around is the only
    /// way to meet one in use).
    pub(crate) fn new_handle(&mut self, ctx: CtxId) -> Result<Handle> {
        let c = self
            .contexts
            .get(&ctx)
            .ok_or(Error::InvalidHandle(ObjectKind::Context))?;
        loop {
            let h = Handle(self.next_handle);
            self.next_handle = self.next_handle.wrapping_add(1);
            if !c.holds_handle(h) {
                return Ok(h);
            }
        }
    }

    /// Queues `ev` for `ctx`; returns whether it was queued (false: queue full or context
    /// gone).
    pub(crate) fn post_event(&mut self, ctx: CtxId, ev: AsyncEvent) -> bool {
        self.contexts
            .get_mut(&ctx)
            .is_some_and(|c| c.events.push(ev))
    }
}
