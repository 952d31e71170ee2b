//! Work requests that cannot race with the daemon: a [`Buf`] posted for a send, a receive,
//! a READ target or an atomic result moves into the request and comes back with its
//! completion ([`Cq::poll_bufs`]), so no other code holds it while the daemon may access
//! it. What the library can know is checked before anything is posted, as a typed
//! [`WrError`]: a buffer of another PD's MR, a local buffer longer than the remote range
//! it reads or writes, an atomic whose operands are not 8 aligned bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use softverbs_core::wr::{SendOp, Sge, WorkCompletion};

use crate::buffer::{Buf, Owner, Remote};
use crate::datapath::{SendRequest, UdAddress};
use crate::error::Error;
use crate::objects::{Cq, Qp, Srq};

/// What a send work request does, with the peer's memory named by a [`Remote`] so the
/// library can check the local buffer against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`. The immediate is a number whose big-endian bytes are the
    /// ImmDt on the wire (`0x2d` sends `00 00 00 2d`, what C's `htobe32(0x2d)` sends), and
    /// the receiver's [`crate::WorkCompletion::imm_data`] is that number
    /// again (docs/guide/safe-api.md, "Immediate data").
    SendWithImm(u32),
    /// `IBV_WR_RDMA_WRITE` of the buffer to the start of `Remote`.
    Write(Remote),
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: the write, then a completion at the peer carrying the
    /// immediate (consuming one of its receive requests); the immediate as in
    /// [`Op::SendWithImm`].
    WriteWithImm(Remote, u32),
    /// `IBV_WR_RDMA_READ` of `Remote` into the buffer.
    Read(Remote),
    /// `IBV_WR_ATOMIC_CMP_AND_SWP` on the 8-byte word at `remote`; the old value lands in
    /// the 8-byte buffer.
    CompareSwap {
        /// The word (8-aligned, 8 bytes).
        remote: Remote,
        /// Compared with the word.
        compare: u64,
        /// Stored if equal.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD` on the 8-byte word at `remote`; the old value lands in
    /// the 8-byte buffer.
    FetchAdd {
        /// The word (8-aligned, 8 bytes).
        remote: Remote,
        /// Added to the word.
        add: u64,
    },
}

impl Op {
    /// The remote range and the wire operation.
    fn lower(&self) -> (Option<Remote>, SendOp) {
        match *self {
            Op::Send => (None, SendOp::Send),
            Op::SendWithImm(imm) => (None, SendOp::SendWithImm(imm)),
            Op::Write(r) => (
                Some(r),
                SendOp::Write {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                },
            ),
            Op::WriteWithImm(r, imm) => (
                Some(r),
                SendOp::WriteWithImm {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                    imm,
                },
            ),
            Op::Read(r) => (
                Some(r),
                SendOp::Read {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                },
            ),
            Op::CompareSwap {
                remote,
                compare,
                swap,
            } => (
                Some(remote),
                SendOp::CompareSwap {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                    compare,
                    swap,
                },
            ),
            Op::FetchAdd { remote, add } => (
                Some(remote),
                SendOp::FetchAdd {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                    add,
                },
            ),
        }
    }
}

/// One send work request of the owning API: always signaled, so its buffer comes back.
#[derive(Debug)]
pub struct SendWork<'a> {
    /// The operation.
    pub op: Op,
    /// The local buffer (sent, written from, read into, or receiving an atomic's result);
    /// `None` for a zero-length request.
    pub buf: Option<Buf>,
    /// UD destination.
    pub ud: Option<UdAddress<'a>>,
    /// XRC: the SRQ number at the target.
    pub remote_srqn: u32,
    /// `IBV_SEND_SOLICITED`.
    pub solicited: bool,
}

impl<'a> SendWork<'a> {
    /// `op` over `buf`.
    pub fn new(op: Op, buf: Buf) -> SendWork<'a> {
        SendWork {
            op,
            buf: Some(buf),
            ud: None,
            remote_srqn: 0,
            solicited: false,
        }
    }

    /// `op` with no local data (a zero-length SEND or WRITE with immediate).
    pub fn no_data(op: Op) -> SendWork<'a> {
        SendWork {
            op,
            buf: None,
            ud: None,
            remote_srqn: 0,
            solicited: false,
        }
    }

    /// Sends to a UD destination.
    pub fn ud(self, to: UdAddress<'a>) -> SendWork<'a> {
        SendWork {
            ud: Some(to),
            ..self
        }
    }

    /// XRC: delivers to the SRQ numbered `srqn` at the target.
    pub fn remote_srqn(self, srqn: u32) -> SendWork<'a> {
        SendWork {
            remote_srqn: srqn,
            ..self
        }
    }

    /// Sets `IBV_SEND_SOLICITED`.
    pub fn solicited(self, on: bool) -> SendWork<'a> {
        SendWork {
            solicited: on,
            ..self
        }
    }
}

/// Why a work request of the owning API was not posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WrError {
    /// The buffer belongs to an MR of another PD (or context) than the queue's (IBA 10.6.3.1
    /// makes the HCA fail such a request with a protection error; the library knows first).
    #[error("the buffer's memory region belongs to another protection domain")]
    ForeignPd,
    /// The local buffer does not fit the remote range it reads or writes, or an atomic's
    /// local or remote operand is not 8 bytes (remote: 8-aligned; IBA 9.4.5, C9-28).
    #[error("the buffer does not fit the remote range")]
    OutOfRange,
    /// The daemon (or the client's own post-time checks, `ibv_post_send(3)`) refused it.
    #[error(transparent)]
    Verbs(#[from] Error),
}

/// A work request that was not posted, with its buffer handed back.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Rejected {
    /// Why.
    pub error: WrError,
    /// The buffer, untouched.
    pub buf: Option<Buf>,
}

/// The `wr_id` the library gave a work request of the owning API; its completion carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WrId(pub u64);

/// A completion, with the buffer of the request it completes.
#[derive(Debug)]
pub struct Completion {
    /// The work completion (`wr_id` is the request's [`WrId`]).
    pub wc: WorkCompletion,
    /// The buffer posted with the request, handed back (with a receive's or a READ's data
    /// in it on success); `None` for a request posted without one, or through the raw API.
    pub buf: Option<Buf>,
}

/// Library `wr_id`s: the top bit set, then a process-wide counter, so they never repeat
/// and never meet the small numbers applications choose for the raw API.
const WR_ID_TAG: u64 = 1 << 63;
static NEXT_WR_ID: AtomicU64 = AtomicU64::new(0);

fn next_wr_id() -> WrId {
    WrId(WR_ID_TAG | NEXT_WR_ID.fetch_add(1, Ordering::Relaxed))
}

/// The buffers of a context's posted requests by `wr_id`, until their completions are
/// polled. Dropped with the context: the memory stays valid for the daemon regardless (it
/// has its own mapping), so forgetting a buffer only loses it.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    bufs: Mutex<Table>,
}

/// Keys are library `wr_id`s, distinct counter values chosen by this process (never by a
/// peer), so they need no DoS-resistant hash: the value itself spreads well enough.
type Table = HashMap<u64, Option<Buf>, std::hash::BuildHasherDefault<IdHasher>>;

#[derive(Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        // Multiplying spreads the counter's low bits into the high ones hashbrown groups by.
        self.0 = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.bufs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the buffer before posting, so a completion polled by another thread at once
    /// finds it.
    fn hold(&self, id: WrId, buf: Option<Buf>) {
        self.lock().insert(id.0, buf);
    }

    /// Takes the buffer of a request that was not posted after all.
    fn unhold(&self, id: WrId) -> Option<Buf> {
        self.lock().remove(&id.0).flatten()
    }
}

fn check_owner(buf: &Option<Buf>, owner: Option<Owner>) -> Result<(), WrError> {
    match buf {
        Some(b) if Some(b.mem.owner) != owner => Err(WrError::ForeignPd),
        _ => Ok(()),
    }
}

fn sge_of(buf: &Option<Buf>) -> Result<Option<Sge>, WrError> {
    buf.as_ref()
        .map(|b| {
            Ok(Sge {
                addr: b.addr(),
                length: u32::try_from(b.len()).map_err(|_| WrError::OutOfRange)?,
                lkey: b.lkey(),
            })
        })
        .transpose()
}

fn check_range(op: &Op, local: u64, remote: Option<Remote>) -> Result<(), WrError> {
    let ok = match (op, remote) {
        (Op::CompareSwap { .. } | Op::FetchAdd { .. }, Some(r)) => {
            local == 8 && r.len >= 8 && r.addr % 8 == 0
        }
        (_, Some(r)) => local <= r.len,
        (_, None) => true,
    };
    ok.then_some(()).ok_or(WrError::OutOfRange)
}

impl Qp<'_> {
    fn owner(&self) -> Option<Owner> {
        self.pd.map(|pd| Owner::of(self.ctx, pd))
    }

    /// `ibv_post_send` of one signaled request of the owning API. The buffer moves into
    /// the request and comes back in the [`Completion`] of the returned [`WrId`]; on
    /// refusal it comes back in the [`Rejected`].
    pub fn post(&self, wr: SendWork<'_>) -> Result<WrId, Rejected> {
        let SendWork {
            op,
            buf,
            ud,
            remote_srqn,
            solicited,
        } = wr;
        let (remote, send_op) = op.lower();
        let local = buf.as_ref().map_or(0, |b| b.len() as u64);
        let sge = match check_owner(&buf, self.owner())
            .and_then(|()| check_range(&op, local, remote))
            .and_then(|()| sge_of(&buf))
        {
            Ok(s) => s,
            Err(error) => return Err(Rejected { error, buf }),
        };
        let id = next_wr_id();
        let sges: &[Sge] = sge.as_slice();
        let req = SendRequest {
            wr_id: id.0,
            op: send_op,
            sges,
            inline: None,
            signaled: true,
            solicited,
            ud,
            remote_srqn,
        };
        self.ctx.in_flight.hold(id, buf);
        match self.post_send(&req) {
            Ok(()) => Ok(id),
            Err(e) => Err(Rejected {
                error: e.into(),
                buf: self.ctx.in_flight.unhold(id),
            }),
        }
    }

    /// `ibv_post_recv` of `buf` (the owning API): it comes back, holding the message, in the
    /// [`Completion`] of the returned [`WrId`].
    pub fn post_recv_buf(&self, buf: Buf) -> Result<WrId, Rejected> {
        let buf = Some(buf);
        let sge = match check_owner(&buf, self.owner()).and_then(|()| sge_of(&buf)) {
            Ok(s) => s,
            Err(error) => return Err(Rejected { error, buf }),
        };
        let id = next_wr_id();
        self.ctx.in_flight.hold(id, buf);
        match self.post_recv(id.0, sge.as_slice()) {
            Ok(()) => Ok(id),
            Err(e) => Err(Rejected {
                error: e.into(),
                buf: self.ctx.in_flight.unhold(id),
            }),
        }
    }
}

impl Srq<'_> {
    /// `ibv_post_srq_recv` of `buf` (the owning API): it comes back, holding the message,
    /// in the [`Completion`] of the returned [`WrId`] (on the CQ of whichever QP consumed
    /// it).
    pub fn post_recv_buf(&self, buf: Buf) -> Result<WrId, Rejected> {
        let buf = Some(buf);
        let owner = Some(Owner::of(self.ctx, self.pd));
        let sge = match check_owner(&buf, owner).and_then(|()| sge_of(&buf)) {
            Ok(s) => s,
            Err(error) => return Err(Rejected { error, buf }),
        };
        let id = next_wr_id();
        self.ctx.in_flight.hold(id, buf);
        match self.post_recv(id.0, sge.as_slice()) {
            Ok(()) => Ok(id),
            Err(e) => Err(Rejected {
                error: e.into(),
                buf: self.ctx.in_flight.unhold(id),
            }),
        }
    }
}

impl Cq<'_> {
    /// `ibv_poll_cq` for the owning API: up to `max` completions, each with the buffer its
    /// request was posted with. Completions of requests posted with the raw API come with
    /// `buf: None`.
    pub fn poll_bufs(&self, max: usize) -> crate::Result<Vec<Completion>> {
        let wcs = self.poll(max)?;
        Ok(self.attach_bufs(wcs))
    }

    pub(crate) fn attach_bufs(&self, wcs: Vec<WorkCompletion>) -> Vec<Completion> {
        if wcs.is_empty() {
            return Vec::new();
        }
        let mut held = self.ctx.in_flight.lock();
        wcs.into_iter()
            .map(|wc| {
                let buf = if wc.wr_id & WR_ID_TAG != 0 {
                    held.remove(&wc.wr_id).flatten()
                } else {
                    None
                };
                Completion { wc, buf }
            })
            .collect()
    }

    /// Polls until `n` completions arrived or `timeout` passed; returns what arrived.
    pub fn wait_bufs(&self, n: usize, timeout: Duration) -> crate::Result<Vec<Completion>> {
        let end = Instant::now() + timeout;
        let mut got = Vec::with_capacity(n);
        while got.len() < n && Instant::now() < end {
            let more = self.poll_bufs(n - got.len())?;
            if more.is_empty() {
                std::thread::yield_now();
            }
            got.extend(more);
        }
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Remote = Remote {
        addr: 0x1000,
        len: 64,
        rkey: 7,
    };

    #[test]
    fn local_buffers_must_fit_the_remote_range() {
        assert!(check_range(&Op::Write(R), 64, Some(R)).is_ok());
        assert_eq!(
            check_range(&Op::Read(R), 65, Some(R)),
            Err(WrError::OutOfRange)
        );
        assert!(check_range(&Op::Send, 1 << 20, None).is_ok());
    }

    #[test]
    fn atomics_need_8_aligned_bytes_on_both_sides() {
        let fa = |remote| Op::FetchAdd { remote, add: 1 };
        assert!(check_range(&fa(R), 8, Some(R)).is_ok());
        assert_eq!(check_range(&fa(R), 4, Some(R)), Err(WrError::OutOfRange));
        let odd = R.slice(4, 8).unwrap();
        assert_eq!(
            check_range(&fa(odd), 8, Some(odd)),
            Err(WrError::OutOfRange)
        );
        let short = R.slice(0, 4).unwrap();
        assert_eq!(
            check_range(&fa(short), 8, Some(short)),
            Err(WrError::OutOfRange)
        );
    }

    #[test]
    fn library_wr_ids_are_tagged_and_never_repeat() {
        let (a, b) = (next_wr_id(), next_wr_id());
        assert_ne!(a, b);
        assert!(a.0 & WR_ID_TAG != 0 && b.0 & WR_ID_TAG != 0);
    }

    #[test]
    fn ops_lower_to_the_wire_operation_with_the_remote_operands() {
        let (r, op) = Op::WriteWithImm(R, 9).lower();
        assert_eq!(r, Some(R));
        assert_eq!(
            op,
            SendOp::WriteWithImm {
                remote_addr: 0x1000,
                rkey: 7,
                imm: 9
            }
        );
        assert_eq!(Op::SendWithImm(3).lower(), (None, SendOp::SendWithImm(3)));
    }
}
