//! The fast path: client memory the daemon has mapped from a memfd, reached with `memcpy`.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsFd;

use rustix::fs::{fcntl_get_seals, fstat, SealFlags};
use softverbs_core::ids::CtxId;
use softverbs_core::memory::{AtomicOp, Fault, Memory};

use crate::map::Mapping;
use crate::page_size;

/// Names a region added with [`SharedMappings::add_region`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u64);

/// Why a memfd could not become a region.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// Zero length, or the range wraps around the address space.
    #[error("empty range or one that wraps around the address space")]
    BadRange,
    /// The file is not sealed against shrinking: the client could truncate it and make the
    /// daemon's next access raise `SIGBUS`.
    #[error("the file is not a memfd sealed against shrinking (F_SEAL_SHRINK)")]
    NotSealed,
    /// The file is shorter than the page-rounded range.
    #[error("the file holds {size} bytes, the page-rounded range needs {needed}")]
    TooSmall {
        /// File size.
        size: u64,
        /// Bytes needed.
        needed: u64,
    },
    /// The range overlaps a region of the same context.
    #[error("the range overlaps region {0:?} of the same context")]
    Overlap(RegionId),
    /// `fstat`, `fcntl` or `mmap` failed.
    #[error("mapping the file: {0}")]
    Io(#[from] std::io::Error),
}

impl From<rustix::io::Errno> for RegionError {
    fn from(e: rustix::io::Errno) -> Self {
        Self::Io(e.into())
    }
}

/// The backend behind [`SharedMappings`] that serves nothing: every non-empty access is a
/// [`Fault`].
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFallback;

impl Memory for NoFallback {
    fn read(&mut self, ctx: CtxId, addr: u64, _buf: &mut [u8]) -> Result<(), Fault> {
        Err(Fault { ctx, addr })
    }

    fn write(&mut self, ctx: CtxId, addr: u64, _data: &[u8]) -> Result<(), Fault> {
        Err(Fault { ctx, addr })
    }
}

#[derive(Debug)]
struct Region {
    id: RegionId,
    /// Client address of the first registered byte.
    start: u64,
    /// Registered bytes.
    len: u64,
    /// Offset of `start` in `map` (`start` modulo the page size).
    offset: usize,
    map: Mapping,
}

/// Client memory the daemon has mapped from memfds the clients passed
/// ([`share_in_place`](crate::share_in_place) on their side), reached with a plain copy
/// and, for aligned atomics, real CPU atomics; every other address goes to the fallback `F`
/// (typically [`ProcessVm`](crate::ProcessVm); [`NoFallback`] by default).
///
/// Lookups are O(log n) in the regions of the context: one `BTreeMap` per context, keyed by
/// the client start address; regions of one context never overlap. An access is served by
/// a region only if it lies wholly inside it; otherwise (no region, or it runs past the end
/// of one) it goes to the fallback, so an access that straddles two adjacent regions still
/// works through `process_vm_*`.
///
/// Empty accesses succeed without touching anything.
///
/// # Deregistration
///
/// [`remove_region`](Self::remove_region) unmaps the region before it returns. All access
/// goes through `&mut self`, so no access is in flight then and none can use the mapping
/// afterwards. (Whether an address *may* be accessed is the core's key check; an address
/// no longer covered by a region but still mapped in the client would be served by the
/// fallback if the engine asked, which it does not after `dereg_mr`.)
#[derive(Debug)]
pub struct SharedMappings<F = NoFallback> {
    regions: HashMap<CtxId, BTreeMap<u64, Region>>,
    index: HashMap<RegionId, (CtxId, u64)>,
    next_id: u64,
    fallback: F,
}

impl Default for SharedMappings<NoFallback> {
    fn default() -> Self {
        Self::with_fallback(NoFallback)
    }
}

impl SharedMappings<NoFallback> {
    /// No regions, no fallback.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<F> SharedMappings<F> {
    /// No regions; addresses not covered by one go to `fallback`.
    pub fn with_fallback(fallback: F) -> Self {
        Self {
            regions: HashMap::new(),
            index: HashMap::new(),
            next_id: 1,
            fallback,
        }
    }

    /// The fallback backend.
    pub fn fallback(&self) -> &F {
        &self.fallback
    }

    /// The fallback backend (e.g. to register a client's pid with a
    /// [`ProcessVm`](crate::ProcessVm)).
    pub fn fallback_mut(&mut self) -> &mut F {
        &mut self.fallback
    }

    /// Maps the memfd `fd` shared into the daemon and serves the client addresses
    /// `[client_addr, client_addr + len)` of `ctx` from it.
    ///
    /// Layout convention (what [`share_in_place`](crate::share_in_place) produces): byte 0
    /// of the file is the first byte of the page holding `client_addr`, so the file covers
    /// the range rounded outward to pages. The file must hold at least that many bytes and be
    /// sealed against shrinking (`F_SEAL_SHRINK`), so the client cannot make the daemon's
    /// accesses raise `SIGBUS` by truncating it. The daemon keeps no descriptor: the mapping
    /// keeps the file alive.
    pub fn add_region(
        &mut self,
        ctx: CtxId,
        client_addr: u64,
        len: u64,
        fd: impl AsFd,
    ) -> Result<RegionId, RegionError> {
        let page = page_size() as u64;
        let end = client_addr.checked_add(len).ok_or(RegionError::BadRange)?;
        if len == 0 {
            return Err(RegionError::BadRange);
        }
        let first_page = client_addr & !(page - 1);
        let map_end = end
            .checked_next_multiple_of(page)
            .ok_or(RegionError::BadRange)?;
        let map_len = usize::try_from(map_end - first_page).map_err(|_| RegionError::BadRange)?;
        let offset = (client_addr - first_page) as usize;

        let fd = fd.as_fd();
        if !fcntl_get_seals(fd)
            .map_err(|_| RegionError::NotSealed)?
            .contains(SealFlags::SHRINK)
        {
            return Err(RegionError::NotSealed);
        }
        let size = u64::try_from(fstat(fd)?.st_size).unwrap_or(0);
        if size < map_len as u64 {
            return Err(RegionError::TooSmall {
                size,
                needed: map_len as u64,
            });
        }

        let regions = self.regions.entry(ctx).or_default();
        // Regions do not overlap, so their ends ascend with their starts: only the last
        // region starting before `end` can overlap the new one.
        if let Some((_, r)) = regions.range(..end).next_back() {
            if r.start + r.len > client_addr {
                return Err(RegionError::Overlap(r.id));
            }
        }

        let map = Mapping::shared(fd, map_len, false)?;
        let id = RegionId(self.next_id);
        self.next_id += 1;
        regions.insert(
            client_addr,
            Region {
                id,
                start: client_addr,
                len,
                offset,
                map,
            },
        );
        self.index.insert(id, (ctx, client_addr));
        Ok(id)
    }

    /// Unmaps region `id` (what `dereg_mr` calls); when it returns no access reaches that
    /// mapping any more. False if `id` is unknown.
    pub fn remove_region(&mut self, id: RegionId) -> bool {
        let Some((ctx, start)) = self.index.remove(&id) else {
            return false;
        };
        if let Some(regions) = self.regions.get_mut(&ctx) {
            regions.remove(&start);
            if regions.is_empty() {
                self.regions.remove(&ctx);
            }
        }
        true
    }

    /// Unmaps every region of `ctx` (the context is closed); how many there were.
    pub fn remove_context(&mut self, ctx: CtxId) -> usize {
        let Some(regions) = self.regions.remove(&ctx) else {
            return 0;
        };
        for r in regions.values() {
            self.index.remove(&r.id);
        }
        regions.len()
    }

    /// Regions mapped, over all contexts.
    pub fn region_count(&self) -> usize {
        self.index.len()
    }

    /// The mapping and offset in it of client bytes `[addr, addr + len)` of `ctx`, if one
    /// region covers all of them.
    fn translate(&self, ctx: CtxId, addr: u64, len: usize) -> Option<(&Mapping, usize)> {
        let (_, r) = self.regions.get(&ctx)?.range(..=addr).next_back()?;
        let off = addr - r.start; // `range(..=addr)`: `r.start <= addr`.
        if off.checked_add(len as u64)? > r.len {
            return None;
        }
        let at = r.offset + off as usize; // `< r.offset + r.len <= r.map.len()`.
        debug_assert!(at + len <= r.map.len());
        Some((&r.map, at))
    }

    /// Whether some region of `ctx` holds any of the bytes `[addr, addr + len)`.
    fn touches_region(&self, ctx: CtxId, addr: u64, len: usize) -> bool {
        let Some(rs) = self.regions.get(&ctx) else {
            return false;
        };
        let end = addr.saturating_add(len as u64);
        rs.range(..end)
            .next_back()
            .is_some_and(|(_, r)| r.start.saturating_add(r.len) > addr)
    }
}

impl<F: Memory> Memory for SharedMappings<F> {
    fn read(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        if buf.is_empty() {
            return Ok(());
        }
        match self.translate(ctx, addr, buf.len()) {
            Some((map, at)) => map.read(at, buf),
            None => return self.fallback.read(ctx, addr, buf),
        }
        Ok(())
    }

    fn write(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        if data.is_empty() {
            return Ok(());
        }
        match self.translate(ctx, addr, data.len()) {
            Some((map, at)) => map.write(at, data),
            None if self.touches_region(ctx, addr, data.len()) => {
                // Straddles a region (two adjacent MRs): written at once, so that the
                // fallback never holds back bytes a region access would miss.
                self.fallback.write(ctx, addr, data)?;
                return self.fallback.flush();
            }
            None => return self.fallback.write(ctx, addr, data),
        }
        Ok(())
    }

    /// Forwarded to the fallback for bytes no region holds (a region needs no read-ahead;
    /// a range partly in a region is read without it, so that the fallback never keeps a
    /// copy of bytes a region access could change).
    fn will_read(&mut self, on_demand: bool, ctx: CtxId, addr: u64, len: u64) {
        let len_usize = usize::try_from(len).unwrap_or(usize::MAX);
        if on_demand || !self.touches_region(ctx, addr, len_usize) {
            self.fallback.will_read(on_demand, ctx, addr, len);
        }
    }

    fn flush(&mut self) -> Result<(), Fault> {
        self.fallback.flush()
    }

    /// Aligned and inside a region: a CPU atomic on the shared page (`lock cmpxchg`/`lock
    /// xadd`), atomic with respect to the client's own atomics too. Inside a region but not
    /// 8-byte aligned (IBA requires alignment, so the core should have refused it): a
    /// read-modify-write on the mapping, atomic only against this daemon. Elsewhere: the
    /// fallback's `atomic`.
    fn atomic(&mut self, ctx: CtxId, addr: u64, op: AtomicOp) -> Result<u64, Fault> {
        let Some((map, at)) = self.translate(ctx, addr, 8) else {
            return self.fallback.atomic(ctx, addr, op);
        };
        if let Some(old) = map.atomic(at, op) {
            return Ok(old);
        }
        let mut old = [0u8; 8];
        self.read(ctx, addr, &mut old)?;
        let old = u64::from_ne_bytes(old);
        self.write(ctx, addr, &op.apply(old).to_ne_bytes())?;
        Ok(old)
    }

    /// An on-demand-paging access skips the regions: a region is the memfd a shared MR
    /// pinned at registration, which the client may since have unmapped or mapped over, and
    /// an ODP MR must see what is mapped now (the fallback reaches the client's address
    /// space itself, `/proc/<pid>/mem`, with no cache of its mappings).
    fn read_mapped(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.fallback.read_mapped(ctx, addr, buf)
    }

    fn write_mapped(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.fallback.write_mapped(ctx, addr, data)
    }

    fn atomic_mapped(&mut self, ctx: CtxId, addr: u64, op: AtomicOp) -> Result<u64, Fault> {
        self.fallback.atomic_mapped(ctx, addr, op)
    }
}
