//! `DirectMrFd` (docs/design/direct-path.md, "Shared-memory MRs"): the memfd of a peer's MR
//! registered as shared memory, so the library of a direct QP maps it and copies with
//! `memcpy` instead of going through the peer's `/proc/<pid>/mem`.
//!
//! Handing it over grants nothing new: the pair is direct only between processes of one uid,
//! which already hold each other's memory descriptor. Whether an access is allowed stays the
//! MR table's business, checked by the library before every access (a deregistered key is
//! gone from the table, so the mapping is never used for it again).

use std::os::fd::OwnedFd;

use softverbs_abi::msg::{DirectMrFdReq, DirectMrFdResp};
use softverbs_core::errno::{EINVAL, ENOENT, ENOMEM};
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::Core;
use zerocopy::little_endian::U64;

use super::Direct;
use crate::datapath::DataPath;

impl Direct {
    /// The memfd behind MR `r.key` of the peer of `(ctx, r.qp)`: `ENOENT` if that MR is not
    /// (or no longer) registered as shared memory, `EINVAL` if the QP is not direct.
    pub fn mr_fd(
        &self,
        core: &Core,
        dp: &DataPath,
        ctx: CtxId,
        r: &DirectMrFdReq,
    ) -> Result<(DirectMrFdResp, OwnedFd), i32> {
        let qpn = core
            .qp_num(ctx, Handle(r.qp.get()))
            .map_err(|e| e.errno())?;
        let pair = self
            .pairs
            .iter()
            .find(|(&(a, b), p)| (a == qpn && p.ctx[0] == ctx) || (b == qpn && p.ctx[1] == ctx))
            .map(|(&(a, _), p)| p.ctx[usize::from(qpn == a)])
            .ok_or(EINVAL)?;
        let key = r.key.get();
        let &(_, _, _, _, len, addr) = core
            .context_mrs(pair)
            .iter()
            .find(|m| m.0 == key)
            .ok_or(ENOENT)?;
        let fd = dp.shared_mr_fd(pair, addr, len).ok_or(ENOENT)?;
        let page = softverbs_memaccess::page_size() as u64;
        let first = addr & !(page - 1);
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(page))
            .ok_or(EINVAL)?;
        let resp = DirectMrFdResp {
            addr: U64::new(addr),
            len: U64::new(len),
            map_len: U64::new(end - first),
        };
        Ok((resp, fd.try_clone().map_err(|_| ENOMEM)?))
    }
}
