//! Quotas: how much of the daemon one context, one uid and the whole daemon may use.
//!
//! The kernel bounds what a verbs user can take from a real HCA with the device's tables and
//! with `RLIMIT_MEMLOCK` (ib_umem charges pinned pages and `ibv_reg_mr` fails with `ENOMEM`
//! past the limit). softverbs runs its "HCA" in one daemon shared by every local user, so a
//! client that creates objects without end would exhaust the daemon's heap, its descriptors
//! and the kernel's per-process limit of memory mappings (`vm.max_map_count`), and then every
//! other client fails. Each [`Resource`] therefore has a limit per context, per uid (summed
//! over every context of that uid) and for the whole daemon; a request that would pass any of
//! the three fails with [`Error::OverLimit`](crate::Error::OverLimit), `ENOMEM` at the C
//! boundary, as a full device table answers, and nothing is charged.
//!
//! The core counts the objects it owns, and the ring bytes, mappings and registered bytes the
//! daemon reports to it ([`Core::attach_ring`](crate::Core::attach_ring),
//! [`Core::set_mr_mapped`](crate::Core::set_mr_mapped), and `reg_mr`'s length). A context's
//! charges go with the context, whatever way it closes. `docs/guide/limits.md` gives the budget
//! the defaults come from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::core::{Core, QpEntry};
use crate::device::{MAX_MCAST_GRP, MAX_TOTAL_MCAST_QP_ATTACH};
use crate::error::{Error, ObjectKind, Result};
use crate::ids::{CtxId, Handle};

/// No limit.
pub const UNLIMITED: u64 = u64::MAX;

/// What a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resource {
    /// Open contexts (device connections: a socket and two eventfds in the daemon each).
    Contexts,
    /// Protection domains.
    Pds,
    /// Memory regions.
    Mrs,
    /// Completion queues.
    Cqs,
    /// Shared receive queues, basic and XRC.
    Srqs,
    /// QP handles: owned QPs, handles on XRC receive QPs and legacy registrations with them.
    Qps,
    /// Address handles.
    Ahs,
    /// XRC domain handles.
    Xrcds,
    /// Completion channels (an eventfd in the daemon each).
    Channels,
    /// Bytes of the shared-memory rings the daemon made for work queues and CQs.
    RingBytes,
    /// Bytes of registered memory (every MR's length, as `RLIMIT_MEMLOCK` counts pinned pages).
    RegisteredBytes,
    /// Memory mappings the daemon holds for the client: one per ring, one per shared MR.
    Mappings,
    /// Connection manager listeners (`rdma_listen`, `CmListen`): charged by the daemon's CM.
    CmListeners,
    /// Connection manager ids with a connection or SIDR request (`rdma_connect`, a connect
    /// request received, a SIDR request): charged by the daemon's CM.
    CmIds,
    /// Descriptors the daemon holds for the client: each connection's socket (charged to the
    /// uid from accept to close) and every descriptor it keeps for a context (eventfds, the
    /// opener's `mem` and `maps`, memfds; the table in docs/guide/limits.md).
    Descriptors,
    /// Multicast groups a context has a QP in (a slot of the device's group table each).
    McastGroups,
    /// Attachments of a QP to a multicast group.
    McastAttachments,
}

impl Resource {
    /// Every resource, in display order.
    pub const ALL: [Resource; 17] = [
        Resource::Contexts,
        Resource::Pds,
        Resource::Mrs,
        Resource::Cqs,
        Resource::Srqs,
        Resource::Qps,
        Resource::Ahs,
        Resource::Xrcds,
        Resource::Channels,
        Resource::RingBytes,
        Resource::RegisteredBytes,
        Resource::Mappings,
        Resource::CmListeners,
        Resource::CmIds,
        Resource::Descriptors,
        Resource::McastGroups,
        Resource::McastAttachments,
    ];

    /// The name used by flags, JSON and `softverbs status`.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Contexts => "contexts",
            Resource::Pds => "pds",
            Resource::Mrs => "mrs",
            Resource::Cqs => "cqs",
            Resource::Srqs => "srqs",
            Resource::Qps => "qps",
            Resource::Ahs => "ahs",
            Resource::Xrcds => "xrcds",
            Resource::Channels => "channels",
            Resource::RingBytes => "ring-bytes",
            Resource::RegisteredBytes => "registered-bytes",
            Resource::Mappings => "mappings",
            Resource::CmListeners => "cm-listeners",
            Resource::CmIds => "cm-ids",
            Resource::Descriptors => "descriptors",
            Resource::McastGroups => "mcast-groups",
            Resource::McastAttachments => "mcast-attachments",
        }
    }

    /// The resource named `name` ([`Resource::name`]).
    pub fn from_name(name: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Whether the resource counts bytes (shown with a unit).
    pub fn is_bytes(self) -> bool {
        matches!(self, Resource::RingBytes | Resource::RegisteredBytes)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Whose share a limit bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// One context (one connection of one process).
    Context,
    /// All contexts of one uid.
    Uid,
    /// The whole daemon.
    Daemon,
}

impl Scope {
    /// The name used by flags and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Context => "context",
            Scope::Uid => "uid",
            Scope::Daemon => "daemon",
        }
    }

    /// The scope named `name`.
    pub fn from_name(name: &str) -> Option<Scope> {
        [Scope::Context, Scope::Uid, Scope::Daemon]
            .into_iter()
            .find(|s| s.name() == name)
    }
}

/// The three limits of one resource ([`UNLIMITED`] where there is none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    /// Per context.
    pub context: u64,
    /// Per uid.
    pub uid: u64,
    /// For the whole daemon.
    pub daemon: u64,
}

impl Limit {
    const NONE: Limit = Limit {
        context: UNLIMITED,
        uid: UNLIMITED,
        daemon: UNLIMITED,
    };

    /// The limit of `scope`.
    pub fn get(&self, scope: Scope) -> u64 {
        match scope {
            Scope::Context => self.context,
            Scope::Uid => self.uid,
            Scope::Daemon => self.daemon,
        }
    }
}

/// What the daemon may spend, from which [`Limits::for_budget`] derives its defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The kernel's limit of mappings per process (`/proc/sys/vm/max_map_count`, 65530 by
    /// default).
    pub max_map_count: u64,
    /// Physical memory in bytes (`MemTotal` of `/proc/meminfo`).
    pub mem_total: u64,
    /// Descriptors the daemon may hold (its `RLIMIT_NOFILE` soft limit).
    pub max_fds: u64,
}

/// Every resource's limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    by: [Limit; Resource::ALL.len()],
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::unlimited()
    }
}

/// Objects of one kind per context and per uid by default. A CQ, QP or MR costs the daemon
/// a few hundred bytes to a few KiB of heap (engine state, tables, completion queue), so one
/// uid's 64 Ki of each kind stay within a few hundred MiB; 32 Ki per context is three times
/// what the largest MPI ranks hold (10,000 QPs).
const OBJECTS_PER_CONTEXT: u64 = 32 << 10;
const OBJECTS_PER_UID: u64 = 64 << 10;
/// CM listeners per uid by default: a port space has 64 Ki ports; one user may hold 4 Ki.
const CM_LISTENERS_PER_UID: u64 = 4 << 10;

impl Limits {
    /// No limits at all (what [`Core::new`](crate::Core::new) starts with).
    pub fn unlimited() -> Limits {
        Limits {
            by: [Limit::NONE; Resource::ALL.len()],
        }
    }

    /// The defaults for a daemon with `budget` (docs/guide/limits.md):
    ///
    /// - mappings: a quarter of `max_map_count` per uid and per context (a context also
    ///   maps every ring on its side, so it reaches its own process's limit about as soon),
    ///   and all but a sixteenth for the daemon, which keeps that sixteenth for its own
    ///   libraries, heap and stacks. Three uids at their limit leave room for everyone else.
    /// - ring bytes: an eighth of physical memory per uid and per context, half for the daemon.
    /// - registered bytes: physical memory per uid and per context (no HCA pins more than the
    ///   machine has; registering costs the daemon no memory, a shared MR a mapping, counted
    ///   apart).
    /// - contexts and completion channels: an eighth of the daemon's descriptors per uid each,
    ///   a sixteenth per context for channels.
    /// - descriptors (every one a uid's connections and contexts cost the daemon): a quarter
    ///   per uid, so three uids at their share leave room for the rest; the daemon keeps an
    ///   eighth for multicast group sockets and a sixteenth for its own.
    /// - multicast: a quarter of the group table (`max_mcast_grp`, at most an eighth of the
    ///   descriptors) and of rxe's `max_total_mcast_qp_attach` attachments per uid.
    /// - other objects: 32 Ki per context and 64 Ki per uid of each kind (device limits
    ///   bound the daemon as a whole).
    pub fn for_budget(b: &Budget) -> Limits {
        let mut l = Limits::unlimited();
        let maps = b.max_map_count.max(64);
        l.set_all(Resource::Mappings, maps / 4, maps / 4, maps - maps / 16);
        let mem = b.mem_total.max(1 << 30);
        l.set_all(Resource::RingBytes, mem / 8, mem / 8, mem / 2);
        l.set_all(Resource::RegisteredBytes, mem, mem, UNLIMITED);
        let fds = b.max_fds.max(64);
        l.set_all(Resource::Contexts, UNLIMITED, fds / 8, UNLIMITED);
        l.set_all(Resource::Channels, fds / 16, fds / 8, UNLIMITED);
        // CM state is heap only (a few hundred bytes an id); the share keeps one user from
        // taking every rdma_cm port of a port space (64 Ki) or growing the CM without bound.
        l.set_all(
            Resource::CmListeners,
            UNLIMITED,
            CM_LISTENERS_PER_UID,
            UNLIMITED,
        );
        l.set_all(Resource::CmIds, UNLIMITED, OBJECTS_PER_UID, UNLIMITED);
        l.set_all(
            Resource::Descriptors,
            UNLIMITED,
            fds / 4,
            fds - fds / 8 - fds / 16,
        );
        let groups = (fds / 8).min(MAX_MCAST_GRP);
        l.set_all(Resource::McastGroups, UNLIMITED, groups / 4, UNLIMITED);
        let attach = u64::from(MAX_TOTAL_MCAST_QP_ATTACH) / 4;
        l.set_all(Resource::McastAttachments, UNLIMITED, attach, UNLIMITED);
        for r in [
            Resource::Pds,
            Resource::Mrs,
            Resource::Cqs,
            Resource::Srqs,
            Resource::Qps,
            Resource::Ahs,
            Resource::Xrcds,
        ] {
            l.set_all(r, OBJECTS_PER_CONTEXT, OBJECTS_PER_UID, UNLIMITED);
        }
        l
    }

    /// The limits of `r`.
    pub fn get(&self, r: Resource) -> Limit {
        self.by[r.index()]
    }

    /// Sets the limit of `r` in `scope` ([`UNLIMITED`] removes it).
    pub fn set(&mut self, r: Resource, scope: Scope, value: u64) {
        let l = &mut self.by[r.index()];
        match scope {
            Scope::Context => l.context = value,
            Scope::Uid => l.uid = value,
            Scope::Daemon => l.daemon = value,
        }
    }

    fn set_all(&mut self, r: Resource, context: u64, uid: u64, daemon: u64) {
        self.by[r.index()] = Limit {
            context,
            uid,
            daemon,
        };
    }

    /// Parses one `SCOPE.RESOURCE=N` setting (`uid.mappings=8192`, `context.ring-bytes=64M`,
    /// `daemon.cqs=unlimited`) into `self`. `N` takes a K, M, G or T suffix (powers of 1024).
    pub fn apply(&mut self, setting: &str) -> Result<(), String> {
        let (key, value) = setting.split_once('=').ok_or("expected SCOPE.RESOURCE=N")?;
        let (scope, resource) = key.split_once('.').ok_or("expected SCOPE.RESOURCE=N")?;
        let scope = Scope::from_name(scope)
            .ok_or(format!("unknown scope {scope:?} (context, uid or daemon)"))?;
        let resource = Resource::from_name(resource).ok_or_else(|| {
            let names: Vec<_> = Resource::ALL.iter().map(|r| r.name()).collect();
            format!("unknown resource {resource:?} ({})", names.join(", "))
        })?;
        self.set(resource, scope, parse_amount(value)?);
        Ok(())
    }
}

/// `N`, `N` with a K/M/G/T suffix, or `unlimited`.
fn parse_amount(s: &str) -> Result<u64, String> {
    if s == "unlimited" {
        return Ok(UNLIMITED);
    }
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        Some(b'T' | b't') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// What one context, one uid or the daemon uses, by resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage([u64; Resource::ALL.len()]);

impl Usage {
    pub(crate) fn get(&self, r: Resource) -> u64 {
        self.0[r.index()]
    }

    fn one(r: Resource, n: u64) -> Usage {
        let mut u = Usage::default();
        u.add(r, n);
        u
    }

    pub(crate) fn add(&mut self, r: Resource, n: u64) {
        self.0[r.index()] += n;
    }

    pub(crate) fn sub(&mut self, r: Resource, n: u64) {
        let v = &mut self.0[r.index()];
        *v = v.saturating_sub(n);
    }

    pub(crate) fn sub_all(&mut self, other: &Usage) {
        for r in Resource::ALL {
            self.sub(r, other.get(r));
        }
    }

    pub(crate) fn is_zero(&self) -> bool {
        self.0.iter().all(|&v| v == 0)
    }
}

/// One resource's limits and use, for `softverbs status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitRow {
    /// The resource ([`Resource::name`]).
    pub resource: Resource,
    /// Its limits ([`UNLIMITED`] shown as `null`).
    pub context: Option<u64>,
    /// Per uid.
    pub uid: Option<u64>,
    /// For the daemon.
    pub daemon: Option<u64>,
    /// What the daemon uses now.
    pub used: u64,
    /// The most any one context uses now.
    pub max_context_used: u64,
    /// What each uid uses now (uids using something).
    pub used_by_uid: BTreeMap<u32, u64>,
}

pub(crate) fn finite(v: u64) -> Option<u64> {
    (v != UNLIMITED).then_some(v)
}

/// An object whose work queues or completions the daemon put in a shared-memory ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ring {
    /// An owned QP's send and receive queues (one region).
    Qp(Handle),
    /// A CQ.
    Cq(Handle),
    /// An SRQ's receive queue.
    Srq(Handle),
    /// The context's ready ring (one per context; its charge goes when the context closes).
    Ready,
}

impl Core {
    /// Replaces the limits. Usage above a lowered limit stays; only new requests meet it.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether `n` more of `r` fit every scope of a context using `used`, owned by `uid`.
    fn check(&self, used: &Usage, uid: u32, r: Resource, n: u64) -> Result<()> {
        let l = self.limits.get(r);
        let uid_used = self.uid_usage.get(&uid).map_or(0, |u| u.get(r));
        for (scope, used, limit) in [
            (Scope::Context, used.get(r), l.context),
            (Scope::Uid, uid_used, l.uid),
            (Scope::Daemon, self.daemon_usage.get(r), l.daemon),
        ] {
            if used.saturating_add(n) > limit {
                return Err(Error::OverLimit {
                    resource: r,
                    scope,
                    limit,
                });
            }
        }
        Ok(())
    }

    /// Whether context `ctx` may take `n` more of `r` (nothing is charged).
    pub(crate) fn admit(&self, ctx: CtxId, r: Resource, n: u64) -> Result<()> {
        let c = self.ctx(ctx)?;
        self.check(&c.usage, c.info.uid, r, n)
    }

    /// Charges `n` of `r` to a context known to exist, its uid and the daemon, unchecked
    /// (after [`admit`](Self::admit)).
    pub(crate) fn add_usage(&mut self, ctx: CtxId, r: Resource, n: u64) {
        let Some(c) = self.contexts.get_mut(&ctx) else {
            return;
        };
        c.usage.add(r, n);
        self.uid_usage.entry(c.info.uid).or_default().add(r, n);
        self.daemon_usage.add(r, n);
    }

    /// Checks the limits before a context opens (its uid's contexts, the daemon's).
    pub(crate) fn admit_new_context(&self, uid: u32) -> Result<()> {
        self.check(&Usage::default(), uid, Resource::Contexts, 1)
    }

    /// Gives back what a closed context used.
    pub(crate) fn release_context_usage(&mut self, uid: u32, used: &Usage) {
        if let Some(u) = self.uid_usage.get_mut(&uid) {
            u.sub_all(used);
            if u.is_zero() {
                self.uid_usage.remove(&uid);
            }
        }
        self.daemon_usage.sub_all(used);
    }

    /// Charges `n` of `r` to context `ctx` if every limit allows it, for what the daemon holds
    /// on the context's behalf outside the core (completion channels).
    pub fn charge(&mut self, ctx: CtxId, r: Resource, n: u64) -> Result<()> {
        self.admit(ctx, r, n)?;
        self.add_usage(ctx, r, n);
        Ok(())
    }

    /// Gives back `n` of `r` charged with [`charge`](Self::charge) (nothing if the context is
    /// gone: its charges went with it).
    pub fn uncharge(&mut self, ctx: CtxId, r: Resource, n: u64) {
        let Some(c) = self.contexts.get_mut(&ctx) else {
            return;
        };
        let n = n.min(c.usage.get(r));
        c.usage.sub(r, n);
        if let Some(u) = self.uid_usage.get_mut(&c.info.uid) {
            u.sub(r, n);
        }
        self.daemon_usage.sub(r, n);
    }

    /// Charges `n` of `r` to uid `uid` itself, for what the daemon holds for it outside any
    /// context: a connection's socket, from accept to close, whether or not it opens a
    /// device. Fails with nothing charged past the uid's or the daemon's limit.
    pub fn charge_uid(&mut self, uid: u32, r: Resource, n: u64) -> Result<()> {
        self.check(&Usage::default(), uid, r, n)?;
        self.uid_usage.entry(uid).or_default().add(r, n);
        self.daemon_usage.add(r, n);
        Ok(())
    }

    /// [`open_context`](Self::open_context) for a context that costs the daemon `fds`
    /// descriptors from the start: past the descriptors share it fails with nothing opened.
    pub fn open_context_holding(
        &mut self,
        device: usize,
        info: crate::core::ContextInfo,
        fds: u64,
    ) -> Result<CtxId> {
        self.check(&Usage::default(), info.uid, Resource::Descriptors, fds)?;
        let ctx = self.open_context(device, info)?;
        self.add_usage(ctx, Resource::Descriptors, fds);
        Ok(ctx)
    }

    /// Gives back `n` of `r` charged with [`charge_uid`](Self::charge_uid).
    pub fn uncharge_uid(&mut self, uid: u32, r: Resource, n: u64) {
        self.release_context_usage(uid, &Usage::one(r, n));
    }

    /// The daemon made a ring of `bytes` for `ring` of context `ctx` (one mapping): charges
    /// it, replacing the ring the object had, or fails with nothing charged. The charge goes
    /// when the object is destroyed.
    pub fn attach_ring(&mut self, ctx: CtxId, ring: Ring, bytes: u64) -> Result<()> {
        let c = self.ctx(ctx)?;
        let exists = match ring {
            Ring::Qp(h) => matches!(c.qps.get(&h), Some(QpEntry::Owned(_))),
            Ring::Cq(h) => c.cqs.contains_key(&h),
            Ring::Srq(h) => c.srqs.contains_key(&h),
            Ring::Ready => true,
        };
        if !exists {
            return Err(Error::InvalidHandle(match ring {
                Ring::Qp(_) => ObjectKind::Qp,
                Ring::Cq(_) => ObjectKind::Cq,
                Ring::Srq(_) | Ring::Ready => ObjectKind::Srq,
            }));
        }
        let old = c.rings.get(&ring).copied();
        self.admit(
            ctx,
            Resource::RingBytes,
            bytes.saturating_sub(old.unwrap_or(0)),
        )?;
        if old.is_none() {
            self.admit(ctx, Resource::Mappings, 1)?;
        }
        self.detach_ring(ctx, ring);
        self.add_usage(ctx, Resource::RingBytes, bytes);
        self.add_usage(ctx, Resource::Mappings, 1);
        self.ctx_mut(ctx)?.rings.insert(ring, bytes);
        Ok(())
    }

    /// The object of `ring` is gone: its ring's charge goes too.
    pub(crate) fn detach_ring(&mut self, ctx: CtxId, ring: Ring) {
        let Some(bytes) = self
            .contexts
            .get_mut(&ctx)
            .and_then(|c| c.rings.remove(&ring))
        else {
            return;
        };
        self.uncharge(ctx, Resource::RingBytes, bytes);
        self.uncharge(ctx, Resource::Mappings, 1);
    }

    /// The daemon mapped (`true`) or unmapped MR `mr`'s memory (a shared MR: one mapping, and
    /// the memfd the daemon keeps for direct peers: one descriptor). Mapping fails with
    /// nothing charged when the context is at its mappings or descriptors limit.
    pub fn set_mr_mapped(&mut self, ctx: CtxId, mr: Handle, mapped: bool) -> Result<()> {
        let c = self.ctx(ctx)?;
        if !c.mrs.contains_key(&mr) {
            return Err(Error::InvalidHandle(ObjectKind::Mr));
        }
        let was = c.mapped_mrs.contains(&mr);
        match (was, mapped) {
            (false, true) => {
                self.admit(ctx, Resource::Descriptors, 1)?;
                self.charge(ctx, Resource::Mappings, 1)?;
                self.add_usage(ctx, Resource::Descriptors, 1);
                self.ctx_mut(ctx)?.mapped_mrs.insert(mr);
            }
            (true, false) => self.forget_mr_mapping(ctx, mr),
            _ => {}
        }
        Ok(())
    }

    /// MR `mr` is no longer backed by a mapping of the daemon's (unmapped, deregistered, or
    /// given a new range): its mapping and descriptor go back.
    pub(crate) fn forget_mr_mapping(&mut self, ctx: CtxId, mr: Handle) {
        if let Some(c) = self.contexts.get_mut(&ctx) {
            if c.mapped_mrs.remove(&mr) {
                self.uncharge(ctx, Resource::Mappings, 1);
                self.uncharge(ctx, Resource::Descriptors, 1);
            }
        }
    }

    /// What context `ctx` uses of `r`.
    pub fn context_usage(&self, ctx: CtxId, r: Resource) -> Result<u64> {
        Ok(self.ctx(ctx)?.usage.get(r))
    }

    /// What uid `uid` uses of `r` over all its contexts.
    pub fn uid_usage(&self, uid: u32, r: Resource) -> u64 {
        self.uid_usage.get(&uid).map_or(0, |u| u.get(r))
    }

    /// Every resource's limits and use, for `softverbs status`.
    pub fn limit_rows(&self) -> Vec<LimitRow> {
        Resource::ALL
            .into_iter()
            .map(|r| {
                let l = self.limits.get(r);
                LimitRow {
                    resource: r,
                    context: finite(l.context),
                    uid: finite(l.uid),
                    daemon: finite(l.daemon),
                    used: self.daemon_usage.get(r),
                    max_context_used: self
                        .contexts
                        .values()
                        .map(|c| c.usage.get(r))
                        .max()
                        .unwrap_or(0),
                    used_by_uid: self
                        .uid_usage
                        .iter()
                        .filter(|(_, u)| u.get(r) > 0)
                        .map(|(&uid, u)| (uid, u.get(r)))
                        .collect(),
                }
            })
            .collect()
    }
}
