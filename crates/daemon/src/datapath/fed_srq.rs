//! SRQs the engine takes receives from one at a time (docs/design/direct-path.md, "SRQs"): the
//! SRQs of contexts whose direct path takes SRQ receives (`DirectOpenReq::caps`). Their ring
//! is the one queue of posted receives, shared with the libraries of every direct peer of
//! their QPs; nobody keeps a stock of them, so a receive posted is there for whichever
//! message comes first, on either path.
//!
//! The daemon never waits on these rings (nothing is moved ahead of need), and decides the
//! SRQ's limit event for what the engine takes; the libraries decide it for what they take
//! (`crates/abi/src/direct.rs`, `srq_limit_offset`).

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use foldhash::HashMap;
use softverbs_abi::direct::{srq_limit_offset, srq_region_len};
use softverbs_abi::msg::{PostRecvReq, QueuesResp};
use softverbs_core::ids::{CtxId, Handle};
use softverbs_shm::{Region, RingLayout, SharedConsumer};
use softverbs_transport::wr::RecvWr;
use softverbs_transport::{SrqFeed, SrqKey};
use zerocopy::{FromZeros, IntoBytes};

use super::{entry_size, recv_wr_from_wire, ring_capacity, DataPath};
use softverbs_core::errno::{EINVAL, ENOMEM};

/// One fed SRQ.
#[derive(Debug)]
pub(super) struct FedSrq {
    taker: SharedConsumer,
    region: Arc<Region>,
    /// The region, for the direct peers of its QPs.
    fd: OwnedFd,
    limit_at: usize,
}

impl FedSrq {
    fn limit(&self) -> &std::sync::atomic::AtomicU32 {
        self.region.atomic_u32(self.limit_at)
    }

    /// After a take: fewer posted than the armed limit disarms it, once (whoever swaps it
    /// to 0 raises the event).
    fn crossed_limit(&self) -> bool {
        let limit = self.limit().load(Ordering::Acquire);
        limit > 0
            && self.taker.available().is_ok_and(|n| n < limit)
            && self
                .limit()
                .compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }
}

/// What a peer library needs to take receives from a fed SRQ.
#[derive(Debug)]
pub struct FedSrqShare {
    /// The region's descriptor.
    pub fd: OwnedFd,
    /// Its length.
    pub len: u64,
    /// Its ring.
    pub layout: RingLayout,
    /// Its limit word.
    pub limit_at: u32,
}

/// The engine's feed: takes from the fed SRQs' rings, noting entries it cannot use and
/// limits crossed.
pub(super) struct Feed<'a> {
    pub(super) srqs: &'a HashMap<SrqKey, FedSrq>,
    pub(super) faults: &'a mut Vec<SrqKey>,
    pub(super) limits: &'a mut Vec<SrqKey>,
}

impl SrqFeed for Feed<'_> {
    fn next_recv(&mut self, key: SrqKey) -> Option<RecvWr> {
        let s = self.srqs.get(&key)?;
        loop {
            let mut r = PostRecvReq::new_zeroed();
            let got = s.taker.pop_with(|region, at| {
                let n = r.as_bytes().len().min(s.taker.layout().entry_size());
                region.read(at, &mut r.as_mut_bytes()[..n]);
            });
            match got {
                Ok(Some(())) => {}
                Ok(None) => return None,
                Err(_) => {
                    // A scribbled ring: the owner hears of it as an SRQ error (each time a
                    // message finds it so; the ring stays, as its owner may still post).
                    self.faults.push(key);
                    return None;
                }
            }
            if s.crossed_limit() {
                self.limits.push(key);
            }
            match recv_wr_from_wire(&r) {
                Ok(wr) => return Some(wr),
                // An SRQ has no CQ of its own to report a bad entry on (IBA 10.2.9): the
                // owner hears of it as an SRQ error, and the next entry serves.
                Err(_) => self.faults.push(key),
            }
        }
    }
}

impl DataPath {
    /// Maps SRQ `key` as a fed SRQ (see the module): its region holds the ring and the
    /// limit word.
    pub(super) fn map_fed_srq(
        &mut self,
        key: SrqKey,
        max_wr: u32,
        admit: impl FnOnce(u64) -> Result<(), i32>,
    ) -> Result<(QueuesResp, OwnedFd), i32> {
        let l = RingLayout::new(ring_capacity(max_wr), entry_size::<PostRecvReq>())
            .map_err(|_| EINVAL)?;
        let len = srq_region_len(l.size());
        let (region, fd) = Region::create("softverbs-srq", len).map_err(|_| ENOMEM)?;
        l.init(&region, 0).map_err(|_| EINVAL)?;
        let region = Arc::new(region);
        let taker = SharedConsumer::attach(region.clone(), 0, l).map_err(|_| EINVAL)?;
        admit(len as u64)?;
        let give = fd.try_clone().map_err(|_| ENOMEM)?;
        self.fed_srqs.insert(
            key,
            FedSrq {
                taker,
                region,
                fd,
                limit_at: srq_limit_offset(l.size()),
            },
        );
        let resp = super::one_ring(len, &l);
        Ok((resp, give))
    }

    /// Arms (or disarms) a fed SRQ's limit; `false` if `key` is not fed.
    pub(super) fn fed_srq_limit(&mut self, key: SrqKey, limit: u32) -> bool {
        let Some(s) = self.fed_srqs.get(&key) else {
            return false;
        };
        s.limit().store(limit, Ordering::Release);
        // Armed below what is posted already: the event is due now (ibv_modify_srq(3)).
        if s.crossed_limit() {
            self.srq_limit_hits.push(key);
        }
        true
    }

    /// Whether SRQ `(ctx, srq)` is a fed one.
    pub fn is_fed_srq(&self, ctx: CtxId, srq: Handle) -> bool {
        self.fed_srqs.contains_key(&(ctx, srq))
    }

    /// What a direct peer of a QP on SRQ `(ctx, srq)` maps to take its receives.
    pub fn fed_srq_share(&self, ctx: CtxId, srq: Handle) -> Option<FedSrqShare> {
        let s = self.fed_srqs.get(&(ctx, srq))?;
        Some(FedSrqShare {
            fd: s.fd.try_clone().ok()?,
            len: s.region.len() as u64,
            layout: s.taker.layout(),
            limit_at: s.limit_at as u32,
        })
    }

    /// A peer library says it took a receive of SRQ `key` and swapped its limit to 0:
    /// plausible only if the SRQ is fed and its limit is disarmed now (the caller raises
    /// the event).
    pub fn fed_srq_limit_reached(&self, key: SrqKey) -> Result<(), i32> {
        let s = self.fed_srqs.get(&key).ok_or(EINVAL)?;
        if s.limit().load(Ordering::Acquire) != 0 {
            return Err(EINVAL);
        }
        Ok(())
    }
}
