//! The peer's shared-memory MRs mapped into this process (docs/design/direct-path.md,
//! "Shared-memory MRs"): an MR the peer registered as shared memory (the MR table marks it
//! `MR_SHARED`) is asked for once (`DirectMrFd`), mapped, and reached with `memcpy` from
//! then on instead of through the peer's `/proc/<pid>/mem`.
//!
//! The mapping never decides whether an access is allowed: every request checks the key in
//! the peer's MR table first, and a mapping is used only for the registration it was made
//! for (same key, address and length). A key gone from the table (deregistered) loses its
//! mapping at the next request that names it; the owner's `dereg_mr` waits until no request
//! of this library is between its check and its copy (`DirectCtx::revoked`), so nothing is
//! copied into memory the owner deregistered.

use std::collections::HashMap;

use softverbs_abi::direct::{MrEntry, MR_SHARED};
use softverbs_abi::msg::{cmd, DirectMrFdReq};
use softverbs_memaccess::PeerMapping;
use zerocopy::little_endian::U32;

use crate::Context;

/// Mappings by key; `None`: the daemon had no memfd for that registration (asked once).
#[derive(Debug, Default)]
pub(super) struct Maps {
    by_key: HashMap<u32, (MrEntry, Option<PeerMapping>)>,
}

/// Mappings held per channel at most (a peer with more shared MRs gets the `/proc` copy for
/// the ones beyond).
const MAX_MAPS: usize = 256;

impl Maps {
    /// The mapping of the peer's MR `e` (just found in its table), mapping it on first use.
    pub(super) fn get(&mut self, ctx: &Context, qp: u32, e: &MrEntry) -> Option<&PeerMapping> {
        if e.flags & MR_SHARED == 0 {
            return None;
        }
        let stale = self.by_key.get(&e.key).is_some_and(|(was, _)| was != e);
        if stale {
            self.by_key.remove(&e.key);
        }
        if !self.by_key.contains_key(&e.key) {
            if self.by_key.len() >= MAX_MAPS {
                return None;
            }
            let m = map(ctx, qp, e);
            self.by_key.insert(e.key, (*e, m));
        }
        self.by_key.get(&e.key).and_then(|(_, m)| m.as_ref())
    }

    /// The peer's table no longer holds `key`: its mapping goes.
    pub(super) fn forget(&mut self, key: u32) {
        self.by_key.remove(&key);
    }
}

fn map(ctx: &Context, qp: u32, e: &MrEntry) -> Option<PeerMapping> {
    if ctx.conn.abi < 14 {
        return None;
    }
    let req = DirectMrFdReq {
        qp: U32::new(qp),
        key: U32::new(e.key),
    };
    let (r, mut fds) = ctx
        .conn
        .call_fds::<cmd::DirectMrFd>("direct_mr_fd", 0, &req, &[])
        .ok()?;
    // The memfd the daemon holds must be the registration the table showed.
    if r.addr.get() != e.addr || r.len.get() != e.len {
        return None;
    }
    let page = softverbs_memaccess::page_size() as u64;
    let len = usize::try_from(r.map_len.get()).ok()?;
    PeerMapping::map(fds.pop()?, e.addr & !(page - 1), len).ok()
}
