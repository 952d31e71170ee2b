//! Moving bytes between a message and the scatter/gather list of a work request, with the
//! local-key checks of IBA 10.6.3.1 (the key must name an MR of the QP's PD that covers the
//! range and, for writes into it, grants local write).

use softverbs_core::datapath::PdRef;
use softverbs_core::types::Access;

use crate::memory::Memory;
use crate::qp::Env;
use crate::wr::{Sge, WcStatus};

/// Calls `f(sge, address, range of the message)` for each piece of the message bytes
/// `[offset, offset + len)` as laid out over `sges`; returns how many bytes the list held.
fn walk(
    sges: &[Sge],
    offset: u32,
    len: usize,
    mut f: impl FnMut(&Sge, u64, std::ops::Range<usize>) -> Result<(), WcStatus>,
) -> Result<usize, WcStatus> {
    let (mut skip, mut done) = (u64::from(offset), 0usize);
    for s in sges {
        if done == len {
            break;
        }
        let sl = u64::from(s.length);
        if skip >= sl {
            skip -= sl;
            continue;
        }
        let n = ((sl - skip) as usize).min(len - done);
        f(s, s.addr + skip, done..done + n)?;
        done += n;
        skip = 0;
    }
    Ok(done)
}

/// Copies message bytes at `offset` out of local memory into `out`.
pub(crate) fn gather<M: Memory>(
    env: &mut Env<'_, M>,
    pd: PdRef,
    sges: &[Sge],
    offset: u32,
    out: &mut [u8],
) -> Result<(), WcStatus> {
    let len = out.len();
    let got = walk(sges, offset, len, |s, at, r| {
        let t = env
            .core
            .check_mem(pd, s.lkey, at, r.len() as u64, Access::EMPTY)
            .map_err(|_| WcStatus::LocProtErr)?;
        env.mem
            .read_for(t.on_demand, t.ctx, t.addr, &mut out[r])
            .map_err(|_| WcStatus::LocProtErr)
    })?;
    if got < len {
        return Err(WcStatus::LocLenErr);
    }
    Ok(())
}

/// Tells the memory which local bytes a message of `len` bytes gathered from `sges` will
/// read ([`Memory::will_read`]), piece by piece as the list lays them out. Pieces whose key
/// check fails get no hint: the gather of the packet that reaches them reports the error, at
/// the same packet as without hints.
pub(crate) fn will_gather<M: Memory>(env: &mut Env<'_, M>, pd: PdRef, sges: &[Sge], len: usize) {
    let _ = walk(sges, 0, len, |s, at, r| {
        if let Ok(t) = env
            .core
            .check_mem(pd, s.lkey, at, r.len() as u64, Access::EMPTY)
        {
            env.mem
                .will_read(t.on_demand, t.ctx, t.addr, r.len() as u64);
        }
        Ok(())
    });
}

/// Copies `data` into local memory at message offset `offset`; `LOC_LEN_ERR` if the list is
/// too short (IBA 10.7.3.1: the receive buffer could not hold the message).
pub(crate) fn scatter<M: Memory>(
    env: &mut Env<'_, M>,
    pd: PdRef,
    sges: &[Sge],
    offset: u32,
    data: &[u8],
) -> Result<(), WcStatus> {
    let got = walk(sges, offset, data.len(), |s, at, r| {
        let t = env
            .core
            .check_mem(pd, s.lkey, at, r.len() as u64, Access::LOCAL_WRITE)
            .map_err(|_| WcStatus::LocProtErr)?;
        env.mem
            .write_for(t.on_demand, t.ctx, t.addr, &data[r])
            .map_err(|_| WcStatus::LocProtErr)
    })?;
    if got < data.len() {
        return Err(WcStatus::LocLenErr);
    }
    Ok(())
}
