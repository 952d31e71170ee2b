//! Work and completion queues in memory shared with the daemon (ABI 3): posting writes a
//! ring entry and polling reads one, with no system call unless the daemon went to sleep
//! and asked to be woken (then one eventfd write).
//!
//! Set `SOFTVERBS_RINGS=0` to use one command per post/poll instead (for comparison).

use std::sync::{Arc, Mutex};

use softverbs_abi::msg::cmd;
use softverbs_abi::msg::*;
use softverbs_shm::{Consumer, Doorbell, Producer, Region, RingLayout, WorkFlag};
use zerocopy::little_endian::U32;

use crate::error::{errno, Error, Result};
use crate::Context;

fn enabled(ctx: &Context) -> bool {
    ctx.conn.abi >= 3 && std::env::var_os("SOFTVERBS_RINGS").is_none_or(|v| v != "0")
}

/// The client's ends of a QP's work queues.
#[derive(Debug)]
pub(crate) struct QpRings {
    pub(crate) sq: Producer,
    pub(crate) rq: Option<Producer>,
    /// Send requests pushed into `sq` (wrapping); against the daemon's retired count (ABI 4,
    /// the ring's note) it gives the send queue's occupancy.
    pub(crate) sq_posted: u32,
    /// The device went and the send queue's outstanding requests were flushed (`crate::flush`).
    pub(crate) sq_flushed: bool,
    /// Likewise for the receive queue.
    pub(crate) rq_flushed: bool,
    /// The QP's work flag and handle (ABI 6, with the context's ready ring).
    pub(crate) announce: Option<Announce>,
}

/// How a QP tells the daemon it has work: its flag, and the token for the ready ring.
#[derive(Debug)]
pub(crate) struct Announce {
    flag: WorkFlag,
    token: u32,
}

pub(crate) fn map_doorbell(ctx: &Context) -> Option<Doorbell> {
    if !enabled(ctx) {
        return None;
    }
    let (_, mut fds): ((), _) = ctx
        .conn
        .call_fds::<cmd::MapDoorbell>("map_doorbell", 0, &(), &[])
        .ok()?;
    Doorbell::from_fd(fds.pop()?).ok()
}

/// Asks the daemon for an object's ring. `Err` only when the daemon refused it for the
/// context's limits (`ENOMEM`, docs/guide/limits.md): the object is then refused too, as a real
/// device refuses a CQ whose buffer cannot be pinned. Anything else keeps the command path.
fn map(ctx: &Context, kind: u32, handle: u32) -> Result<Option<(Arc<Region>, QueuesResp)>> {
    if ctx.doorbell.is_none() {
        return Ok(None);
    }
    let req = MapQueuesReq {
        kind: U32::new(kind),
        handle: U32::new(handle),
    };
    let (r, mut fds): (QueuesResp, _) =
        match ctx
            .conn
            .call_fds::<cmd::MapQueues>("map_queues", 0, &req, &[])
        {
            Ok(got) => got,
            Err(e) if e.errno() == errno::ENOMEM => return Err(e),
            Err(_) => return Ok(None),
        };
    let Some(fd) = fds.pop() else {
        return Ok(None);
    };
    Ok(Region::map_populated(fd, r.region_len.get() as usize)
        .ok()
        .map(|region| (Arc::new(region), r)))
}

/// Maps the context's ready ring (ABI 6); `None` leaves the daemon visiting this context's
/// QPs every round (older daemon, rings disabled, or refused for the context's limits).
pub(crate) fn map_ready(ctx: &Context) -> Option<Mutex<Producer>> {
    if ctx.conn.abi < 6 {
        return None;
    }
    let (region, r) = map(ctx, QUEUES_READY, 0).ok().flatten()?;
    let l = RingLayout::new(r.a_capacity.get(), r.a_entry.get()).ok()?;
    if l.entry_size() != 8 {
        return None;
    }
    Producer::attach(region, r.a_offset.get() as usize, l)
        .ok()
        .map(Mutex::new)
}

/// Maps a QP's queues; `None` keeps the command path (older daemon, rings disabled).
pub(crate) fn map_qp(ctx: &Context, handle: u32) -> Result<Option<Arc<Mutex<QpRings>>>> {
    Ok(map(ctx, QUEUES_QP, handle)?.and_then(|(region, r)| qp_rings(ctx, handle, region, &r)))
}

fn qp_rings(
    ctx: &Context,
    handle: u32,
    region: Arc<Region>,
    r: &QueuesResp,
) -> Option<Arc<Mutex<QpRings>>> {
    let sq_l = RingLayout::new(r.a_capacity.get(), r.a_entry.get()).ok()?;
    let sq = Producer::attach(region.clone(), r.a_offset.get() as usize, sq_l).ok()?;
    let announce = match r.flag_offset.get() {
        0 => None,
        _ if ctx.ready.is_none() || ctx.conn.abi < 6 => None,
        off => Some(Announce {
            flag: WorkFlag::attach(region.clone(), off as usize).ok()?,
            token: handle,
        }),
    };
    let rq = if r.b_capacity.get() > 0 {
        let l = RingLayout::new(r.b_capacity.get(), r.b_entry.get()).ok()?;
        Some(Producer::attach(region, r.b_offset.get() as usize, l).ok()?)
    } else {
        None
    };
    Some(Arc::new(Mutex::new(QpRings {
        sq,
        rq,
        sq_posted: 0,
        sq_flushed: false,
        rq_flushed: false,
        announce,
    })))
}

/// Maps an SRQ's receive ring; `None` keeps `PostSrqRecv` commands (older daemon, rings
/// disabled).
pub(crate) fn map_srq(ctx: &Context, handle: u32) -> Result<Option<Mutex<Producer>>> {
    Ok(map(ctx, QUEUES_SRQ, handle)?.and_then(|(region, r)| {
        let l = RingLayout::new(r.a_capacity.get(), r.a_entry.get()).ok()?;
        Producer::attach(region, r.a_offset.get() as usize, l)
            .ok()
            .map(Mutex::new)
    }))
}

/// Maps a CQ's completion ring.
pub(crate) fn map_cq(ctx: &Context, handle: u32) -> Result<Option<Mutex<Consumer>>> {
    Ok(map(ctx, QUEUES_CQ, handle)?.and_then(|(region, r)| {
        let l = RingLayout::new(r.a_capacity.get(), r.a_entry.get()).ok()?;
        Consumer::attach(region, r.a_offset.get() as usize, l)
            .ok()
            .map(Mutex::new)
    }))
}

/// Pushes one entry (padded to the ring's entry size), announces the QP if it was idle
/// (`announce`: its work flag), and rings the doorbell if the daemon asked to be woken.
pub(crate) fn push(
    ctx: &Context,
    p: &mut Producer,
    announce: Option<&Announce>,
    op: &'static str,
    bytes: &[u8],
) -> Result<()> {
    // Padded in the slot itself: posting is the hot path.
    match p.push_padded(bytes) {
        Ok(mut wake) => {
            if let Some(a) = announce {
                // After the publish (its fence orders our entry before the flag's load).
                if a.flag.announce() {
                    wake |= announce_ready(ctx, a.token);
                }
            }
            if wake {
                if let Some(d) = &ctx.doorbell {
                    d.ring();
                }
            }
            Ok(())
        }
        Err(softverbs_shm::PushError::Full) => Err(Error::new(op, errno::ENOMEM)),
        Err(softverbs_shm::PushError::Corrupt(_)) => Err(Error::new(op, errno::EIO)),
    }
}

/// Pushes a QP's token into the context's ready ring; `true`: ring the doorbell.
fn announce_ready(ctx: &Context, token: u32) -> bool {
    let Some(ready) = &ctx.ready else {
        return true;
    };
    let mut p = ready.lock().unwrap_or_else(|e| e.into_inner());
    // The ring has a slot for every QP with a flag and each has at most one token in flight,
    // so it fills only if this process scribbled on it; then ring anyway (the daemon finds
    // the ring corrupt or full and visits this context's QPs every round).
    p.push(&u64::from(token).to_le_bytes()).unwrap_or(true)
}
