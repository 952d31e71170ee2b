//! Posting work requests and polling completions (ABI 3 command path).
//!
//! Each call is one command to the daemon. Registered memory is this process's own memory:
//! the daemon reaches it with `process_vm_readv/writev` (the same uid or root may), or
//! through a memfd mapping when the region was shared.

use softverbs_abi::convert;
use softverbs_abi::msg::*;
use softverbs_abi::msg::{cmd, Command};
use softverbs_core::wr::{SendOp, Sge, WcOpcode, WorkCompletion};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromZeros, IntoBytes};

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;

use crate::error::{errno, Error, Result};
use crate::objects::{Ah, Cq, Qp, Srq};

/// Where a UD send goes: an address handle and the remote QP.
#[derive(Clone, Copy, Debug)]
pub struct UdAddress<'a> {
    /// Address handle (destination GID).
    pub ah: &'a Ah<'a>,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// One send work request (`struct ibv_send_wr`).
#[derive(Clone, Copy, Debug)]
pub struct SendRequest<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Operation and its remote operands.
    pub op: SendOp,
    /// Local buffers (for READ and atomics: where the result lands).
    pub sges: &'a [Sge],
    /// Inline data instead of `sges` (`IBV_SEND_INLINE`).
    pub inline: Option<&'a [u8]>,
    /// `IBV_SEND_SIGNALED`.
    pub signaled: bool,
    /// `IBV_SEND_SOLICITED`.
    pub solicited: bool,
    /// UD destination.
    pub ud: Option<UdAddress<'a>>,
    /// XRC: the SRQ number at the target.
    pub remote_srqn: u32,
}

impl<'a> SendRequest<'a> {
    /// A signaled request of `op` over `sges`.
    pub fn new(wr_id: u64, op: SendOp, sges: &'a [Sge]) -> SendRequest<'a> {
        SendRequest {
            wr_id,
            op,
            sges,
            inline: None,
            signaled: true,
            solicited: false,
            ud: None,
            remote_srqn: 0,
        }
    }
}

/// What the engine refuses at post time (engine `post_send`), checked by the client.
fn check_send(qp: &Qp<'_>, wr: &SendRequest<'_>) -> std::result::Result<(), i32> {
    use softverbs_core::types::{QpState, QpType};
    if !matches!(qp.local_state(), QpState::Rts | QpState::Sqd | QpState::Err) {
        return Err(errno::EINVAL);
    }
    let cap = qp.cap();
    match wr.inline {
        Some(b) if b.len() > cap.max_inline_data as usize => return Err(errno::EINVAL),
        None if wr.sges.len() > cap.max_send_sge as usize => return Err(errno::EINVAL),
        _ => {}
    }
    let allowed = match qp.qp_type() {
        // Binds and local invalidations carry no data and need a connected QP (IBA 10.6.7.2).
        t if wr.op.is_local() => t != QpType::Ud && wr.sges.is_empty() && wr.inline.is_none(),
        QpType::Ud => matches!(wr.op, SendOp::Send | SendOp::SendWithImm(_)) && wr.ud.is_some(),
        QpType::Uc => !wr.op.is_read_or_atomic() && !matches!(wr.op, SendOp::SendWithInv(_)),
        QpType::XrcRecv => false,
        _ => true,
    };
    let len: u64 = wr.sges.iter().map(|s| u64::from(s.length)).sum();
    if !allowed || (wr.op.is_atomic() && (wr.inline.is_some() || len != 8)) {
        return Err(errno::EINVAL);
    }
    Ok(())
}

/// A receive work request for queue `handle`, refused as `op` when the ABI cannot carry it.
fn recv_wire(op: &'static str, handle: u32, wr_id: u64, sges: &[Sge]) -> Result<PostRecvReq> {
    let mut req = PostRecvReq::new_zeroed();
    fill_recv(op, &mut req, handle, wr_id, sges)?;
    Ok(req)
}

/// [`recv_wire`] into `req` (zeroed): on the direct path's receive, building the 272-byte
/// form in place rather than moving it through `Result`s was a tenth of an 8-byte SEND.
fn fill_recv(
    op: &'static str,
    req: &mut PostRecvReq,
    handle: u32,
    wr_id: u64,
    sges: &[Sge],
) -> Result<()> {
    if sges.len() > req.sg_list.len() {
        return Err(Error::new(op, errno::EINVAL));
    }
    req.handle = U32::new(handle);
    req.num_sge = U32::new(sges.len() as u32);
    req.wr_id = U64::new(wr_id);
    for (w, s) in req.sg_list.iter_mut().zip(sges) {
        *w = s.into();
    }
    Ok(())
}

/// What the ABI's wire form cannot carry (`EINVAL`, as the command path refuses it).
fn check_wire_limits(wr: &SendRequest<'_>) -> std::result::Result<(), softverbs_core::Error> {
    use softverbs_abi::msg::{MAX_WIRE_INLINE, MAX_WIRE_SGE};
    if wr.sges.len() > MAX_WIRE_SGE {
        return Err(softverbs_core::Error::InvalidArgument(
            "more scatter/gather entries than the ABI carries",
        ));
    }
    if wr.inline.is_some_and(|b| b.len() > MAX_WIRE_INLINE) {
        return Err(softverbs_core::Error::InvalidArgument(
            "more inline data than the ABI carries",
        ));
    }
    Ok(())
}

/// The wire form of a send work request, as the daemon's ring and command carry it.
pub(crate) fn send_wire(
    wr: &SendRequest<'_>,
) -> std::result::Result<SendWrWire, softverbs_core::Error> {
    let mut flags = 0;
    if wr.signaled {
        flags |= send_flags::SIGNALED;
    }
    if wr.solicited {
        flags |= send_flags::SOLICITED;
    }
    let (ah, remote_qpn, remote_qkey) = wr
        .ud
        .map_or((0, 0, 0), |u| (u.ah.handle(), u.remote_qpn, u.remote_qkey));
    let (sg_list, num_sge) = convert::sg_list_to_wire(wr.sges)?;
    let mut w = SendWrWire {
        wr_id: U64::new(wr.wr_id),
        send_flags: U32::new(flags),
        remote_srqn: U32::new(wr.remote_srqn),
        ah: U32::new(ah),
        remote_qpn: U32::new(remote_qpn),
        remote_qkey: U32::new(remote_qkey),
        num_sge: U32::new(num_sge),
        sg_list,
        ..SendWrWire::default()
    };
    w.set_op(wr.op);
    if let Some(b) = wr.inline {
        w.set_inline(b)?;
    }
    Ok(w)
}

impl Qp<'_> {
    /// `ibv_post_send` of one work request.
    pub fn post_send(&self, wr: &SendRequest<'_>) -> Result<()> {
        const OP: &str = "post_send";
        let invalid = |e: softverbs_core::Error| Error::new(OP, e.errno());
        let mut checked = false;
        if let Some(d) = self.ctx.direct.as_ref() {
            if self.rings.is_some() {
                // The direct path builds no wire form (576 bytes, a fifth of an 8-byte
                // SEND's time there): only a request that falls back to the daemon needs it.
                check_send(self, wr).map_err(|e| Error::new(OP, e))?;
                check_wire_limits(wr).map_err(invalid)?;
                checked = true;
                if self.ctx.fatal.is_dead() && d.owns(self.handle()) {
                    return Err(Error::device_fatal(OP));
                }
                match d.post_send(self.ctx, self.handle(), wr, self.cap().max_send_wr)? {
                    crate::direct::Posted::Done => return Ok(()),
                    crate::direct::Posted::Left(f) => {
                        post_fallback(self.ctx, self.handle(), f);
                        return Ok(());
                    }
                    crate::direct::Posted::NotDirect => {}
                }
            }
        }
        let req = PostSendReq {
            qp: U32::new(self.handle()),
            reserved: U32::new(0),
            wr: send_wire(wr).map_err(invalid)?,
        };
        if let Some(rings) = &self.rings {
            // A ring has no return path: check here what the daemon would refuse at post
            // time, so the caller gets the errno rdma-core gives (ibv_post_send(3)).
            if !checked {
                check_send(self, wr).map_err(|e| Error::new(OP, e))?;
            }
            let mut r = rings.lock().unwrap_or_else(|e| e.into_inner());
            // Checked under the queue's lock, which a flush takes too: a request is either
            // refused here or posted before the flush that completes it.
            if self.ctx.fatal.is_dead() {
                return Err(Error::device_fatal(OP));
            }
            // ABI 4: the daemon counts what it retired, so the queue's occupancy is exact
            // (ibv_post_send(3): ENOMEM past max_send_wr outstanding requests).
            if self.ctx.conn.abi >= 4
                && r.sq_posted.wrapping_sub(r.sq.note()) >= self.cap().max_send_wr
            {
                return Err(Error::new(OP, errno::ENOMEM));
            }
            let r = &mut *r;
            crate::rings::push(
                self.ctx,
                &mut r.sq,
                r.announce.as_ref(),
                OP,
                req.wr.as_bytes(),
            )?;
            r.sq_posted = r.sq_posted.wrapping_add(1);
            return Ok(());
        }
        self.ctx.conn.call::<cmd::PostSend>(OP, 0, &req)
    }

    /// A receive for this QP's own receive queue, checked as the engine checks it at post
    /// time: `EINVAL` in RESET or past `max_recv_sge`, `ENOMEM` when the queue is full
    /// (ibv_post_recv(3)); its wire form is filled into `req` (zeroed) in place, as moving
    /// the 272 bytes out through a `Result` was a copy per receive on the direct path.
    fn ring_recv(&self, req: &mut PostRecvReq, wr_id: u64, sges: &[Sge]) -> Result<()> {
        if self.local_state() == softverbs_core::types::QpState::Reset
            || sges.len() > self.cap().max_recv_sge as usize
        {
            return Err(Error::new("post_recv", errno::EINVAL));
        }
        fill_recv("post_recv", req, self.handle(), wr_id, sges)?;
        let full = self.rq_count.as_ref();
        if full.is_some_and(|c| c.load(Ordering::Acquire) >= self.cap().max_recv_wr) {
            return Err(Error::new("post_recv", errno::ENOMEM));
        }
        Ok(())
    }

    /// `ibv_post_recv` of one work request.
    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        if let (Some(d), Some(count)) = (&self.ctx.direct, &self.rq_count) {
            // Before the rings' lock, which a direct QP does not need (its flush on the
            // daemon's death runs under the direct path's own lock, `direct::ops`).
            if self.ctx.fatal.is_dead() && d.owns(self.handle()) {
                return Err(Error::device_fatal("post_recv"));
            }
            let mut req = PostRecvReq::new_zeroed();
            self.ring_recv(&mut req, wr_id, sges)?;
            if d.post_recv(self.ctx, self.handle(), &req)? {
                count.fetch_add(1, Ordering::AcqRel);
                return Ok(());
            }
        }
        if let Some(rings) = &self.rings {
            let mut guard = rings.lock().unwrap_or_else(|e| e.into_inner());
            let r = &mut *guard;
            if r.rq.is_some() && self.ctx.fatal.is_dead() {
                return Err(Error::device_fatal("post_recv"));
            }
            if let Some(rq) = &mut r.rq {
                let mut req = PostRecvReq::new_zeroed();
                self.ring_recv(&mut req, wr_id, sges)?;
                let count = self.rq_count.as_ref();
                crate::rings::push(
                    self.ctx,
                    rq,
                    r.announce.as_ref(),
                    "post_recv",
                    req.as_bytes(),
                )?;
                if let Some(c) = count {
                    c.fetch_add(1, Ordering::AcqRel);
                }
                return Ok(());
            }
        }
        post_recv::<cmd::PostRecv>(self.ctx, "post_recv", self.handle(), wr_id, sges)
    }
}

impl Srq<'_> {
    /// `ibv_post_srq_recv` of one work request.
    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        if let Some(ring) = &self.ring {
            const OP: &str = "post_srq_recv";
            if sges.len() > self.max_sge as usize {
                return Err(Error::new(OP, errno::EINVAL));
            }
            let req = recv_wire(OP, self.handle, wr_id, sges)?;
            let mut p = ring.lock().unwrap_or_else(|e| e.into_inner());
            if self.ctx.fatal.is_dead() {
                return Err(Error::device_fatal(OP));
            }
            crate::rings::push(self.ctx, &mut p, None, OP, req.as_bytes())?;
            drop(p);
            if let Some(d) = &self.ctx.direct {
                d.posted_srq_recv(self.ctx, self.handle);
            }
            return Ok(());
        }
        post_recv::<cmd::PostSrqRecv>(self.ctx, "post_srq_recv", self.handle, wr_id, sges)
    }
}

fn post_recv<C: Command<Req = PostRecvReq, Resp = ()>>(
    ctx: &crate::Context,
    op: &'static str,
    handle: u32,
    wr_id: u64,
    sges: &[Sge],
) -> Result<()> {
    let req = recv_wire(op, handle, wr_id, sges)?;
    ctx.conn.call::<C>(op, 0, &req)
}

impl Cq<'_> {
    /// `ibv_poll_cq`: up to `max` completions (at most 32 per call), oldest first.
    pub fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>> {
        let mut out = Vec::new();
        self.poll_with(max, |wc| out.push(*wc))?;
        Ok(out)
    }

    /// `ibv_poll_cq` without allocating: hands up to `max` completions, oldest first, to `f`
    /// and returns how many (the C drop-in writes them straight into the caller's array).
    pub fn poll_with(&self, max: usize, mut f: impl FnMut(&WorkCompletion)) -> Result<usize> {
        let mut n = 0;
        if let Some(d) = &self.ctx.direct {
            // The direct path counts its QPs' receive completions itself, under the lock
            // it holds anyway (a second lock per poll was a tenth of a small SEND).
            let (got, left) = d.poll(self.ctx, self.handle, max, &mut f);
            for (qp, f) in left {
                post_fallback(self.ctx, qp, f);
            }
            n = got;
            if n == max {
                return Ok(n);
            }
        }
        let mut counts = None;
        let mut each = |wc: &WorkCompletion| {
            if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                // Every receive request completes exactly once (success, error or flush),
                // which frees its slot in its QP's ring receive queue.
                let map = counts.get_or_insert_with(|| {
                    self.ctx
                        .rq_outstanding
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                });
                if let Some(q) = map.get(&wc.qp_num) {
                    let _ = q.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                        Some(v.saturating_sub(1))
                    });
                }
            }
            f(wc);
        };
        let Some(ring) = &self.ring else {
            let k = self.poll_command(max - n, &mut each)?;
            self.note_daemon(k);
            return Ok(n + k);
        };
        let quiet = !self.ctx.fatal.is_dead() && !self.outgrown.load(Ordering::Acquire);
        if quiet && self.ring_peek.as_ref().is_some_and(|p| !p.maybe_ready()) {
            return Ok(n);
        }
        let k = drain(ring, max - n, &mut each)?;
        self.note_daemon(k);
        n += k;
        if n == max {
            return Ok(n);
        }
        if self.ctx.fatal.is_dead() {
            // The daemon is gone, so the ring holds all it will ever hold: what it wrote
            // after the drain above is taken now, then the flush of what never completed.
            n += drain(ring, max - n, &mut each)?;
            return Ok(n + self.poll_flushed(max - n, &mut each));
        }
        if !self.outgrown.load(Ordering::Acquire) {
            return Ok(n);
        }
        // Resized past the ring: the ring is drained, newer completions wait in the daemon.
        let k = self.poll_command(max - n, &mut each)?;
        self.note_daemon(k);
        Ok(n + k)
    }

    fn note_daemon(&self, delivered: usize) {
        if delivered > 0 && !self.daemon_fed.load(Ordering::Relaxed) {
            self.daemon_fed.store(true, Ordering::Relaxed);
        }
    }

    /// Whether this CQ's completions come from the same-host direct path only: every QP of
    /// the context that completes to it exchanges work with its peer directly now, and the
    /// daemon never delivered a completion to it (an SRQ's or XRC receive QP's, a QP that
    /// left the path). A poller that finds it empty then waits for a peer library, which
    /// runs in the peer's own process, not for a daemon that might need this CPU; a busy
    /// poller may spin a little before it yields (the drop-in's `ibv_poll_cq`). `false`
    /// when no such QP exists. Takes two locks: for an occasional look, not every poll.
    pub fn fed_directly(&self) -> bool {
        if self.ring.is_none() || self.daemon_fed.load(Ordering::Relaxed) {
            return false;
        }
        let Some(d) = &self.ctx.direct else {
            return false;
        };
        let qps = self.ctx.ring_qps.lock().unwrap_or_else(|e| e.into_inner());
        let mut any = false;
        for (&h, q) in qps.iter() {
            if q.send_cq == Some(self.handle) || q.recv_cq == Some(self.handle) {
                if !d.is_fed_here(h) {
                    return false;
                }
                any = true;
            }
        }
        any
    }

    /// Hands out up to `max` flush completions (collected on the first call).
    fn poll_flushed(&self, max: usize, f: &mut impl FnMut(&WorkCompletion)) -> usize {
        let mut g = self.flushed.lock().unwrap_or_else(|e| e.into_inner());
        let written = self.ring.as_ref().map(|r| {
            let mut c = r.lock().unwrap_or_else(|e| e.into_inner());
            c.consumed().wrapping_add(c.available().unwrap_or(0))
        });
        let q = g.get_or_insert_with(|| crate::flush::collect(self.ctx, self.handle, written));
        let mut n = 0;
        while n < max {
            let Some(wc) = q.pop_front() else { break };
            f(&wc);
            n += 1;
        }
        n
    }

    /// Polls by command (no ring, or a CQ resized past its ring).
    fn poll_command(&self, max: usize, f: &mut impl FnMut(&WorkCompletion)) -> Result<usize> {
        let req = PollCqReq {
            cq: U32::new(self.handle),
            max: U32::new(max.min(MAX_WIRE_WC) as u32),
        };
        let r: PollCqResp = self.ctx.conn.call::<cmd::PollCq>("poll_cq", 0, &req)?;
        let n = (r.count.get() as usize).min(MAX_WIRE_WC);
        r.wc[..n].iter().for_each(|w| f(&WorkCompletion::from(w)));
        Ok(n)
    }

    /// Polls until `n` completions arrived or `timeout` passed; returns what arrived.
    pub fn wait(&self, n: usize, timeout: std::time::Duration) -> Result<Vec<WorkCompletion>> {
        let end = std::time::Instant::now() + timeout;
        let mut got = Vec::with_capacity(n);
        while got.len() < n && std::time::Instant::now() < end {
            let more = self.poll(n - got.len())?;
            if more.is_empty() {
                std::thread::yield_now();
            }
            got.extend(more);
        }
        Ok(got)
    }
}

/// Posts through the daemon's rings what a QP that left the direct path had held (its
/// receives, then its send requests, in posting order).
pub(crate) fn post_fallback(ctx: &crate::Context, handle: u32, f: crate::direct::Fallback) {
    let qps = ctx.ring_qps.lock().unwrap_or_else(|e| e.into_inner());
    let Some(q) = qps.get(&handle) else {
        return;
    };
    let mut r = q.rings.lock().unwrap_or_else(|e| e.into_inner());
    let r = &mut *r;
    for req in &f.recvs {
        if let Some(rq) = &mut r.rq {
            let _ = crate::rings::push(ctx, rq, r.announce.as_ref(), "post_recv", req.as_bytes());
        }
    }
    for p in &f.sends {
        if crate::rings::push(
            ctx,
            &mut r.sq,
            r.announce.as_ref(),
            "post_send",
            p.wire().as_bytes(),
        )
        .is_ok()
        {
            r.sq_posted = r.sq_posted.wrapping_add(1);
        }
    }
}

/// Pops up to `max` completions from a CQ ring.
fn drain(
    ring: &std::sync::Mutex<softverbs_shm::Consumer>,
    max: usize,
    f: &mut impl FnMut(&WorkCompletion),
) -> Result<usize> {
    let mut c = ring.lock().unwrap_or_else(|e| e.into_inner());
    let mut n = 0;
    while n < max {
        match c.pop_value::<WcWire>() {
            Ok(Some(w)) => {
                f(&WorkCompletion::from(&w));
                n += 1;
            }
            Ok(None) => break,
            Err(_) => return Err(Error::new("poll_cq", errno::EIO)),
        }
    }
    Ok(n)
}

/// A completion channel (`ibv_comp_channel`): a pollable fd that becomes readable when an
/// armed CQ gets a completion.
#[derive(Debug)]
pub struct CompChannel<'c> {
    ctx: &'c crate::Context,
    handle: u32,
    fd: std::sync::Arc<OwnedFd>,
    /// After the device went: the armed CQs still to report (`None` until first asked).
    fatal_events: std::sync::Mutex<Option<std::collections::VecDeque<u32>>>,
}

impl crate::Context {
    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel<'_>> {
        let (r, mut fds): (HandleResp, _) =
            self.conn
                .call_fds::<cmd::CreateCompChannel>("create_comp_channel", 0, &(), &[])?;
        let fd = std::sync::Arc::new(
            fds.pop()
                .ok_or(Error::new("create_comp_channel", errno::EPROTO))?,
        );
        self.fatal.add_channel(r.handle.get(), fd.clone());
        Ok(CompChannel {
            ctx: self,
            handle: r.handle.get(),
            fd,
            fatal_events: std::sync::Mutex::new(None),
        })
    }

    /// `ibv_create_cq` with a completion channel.
    pub fn create_cq_with_channel<'c>(
        &'c self,
        cqe: u32,
        channel: &CompChannel<'c>,
    ) -> Result<Cq<'c>> {
        self.create_cq_inner(cqe, 0, Some(channel.handle))
    }
}

impl CompChannel<'_> {
    /// The fd to poll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The next CQ (its handle) that fired, or `None` (`ibv_get_cq_event` on a non-blocking
    /// channel).
    pub fn try_get_event(&self) -> Result<Option<u32>> {
        if self.ctx.fatal.is_dead() {
            return self.fatal_event();
        }
        let req = HandleReq {
            handle: U32::new(self.handle),
        };
        match self
            .ctx
            .conn
            .call::<cmd::GetCqEvent>("get_cq_event", 0, &req)
        {
            Ok(r) => {
                let cq = r.cq.get();
                self.ctx
                    .armed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&cq);
                Ok(Some(cq))
            }
            Err(e) if e.errno() == errno::EAGAIN => Ok(None),
            Err(e) if e.is_device_fatal() => self.fatal_event(),
            Err(e) => Err(e),
        }
    }

    /// After the device went: one event for each CQ of this channel that was armed, so a
    /// program waiting for one polls and finds the flush completions; then `EIO`, as the
    /// kernel's completion event file of a disassociated device answers. The fd stays
    /// readable so that a program polling it does not sleep forever.
    fn fatal_event(&self) -> Result<Option<u32>> {
        softverbs_ipc::signal_eventfd(self.fd.as_fd());
        let mut g = self.fatal_events.lock().unwrap_or_else(|e| e.into_inner());
        let q = g.get_or_insert_with(|| {
            let mut armed = self.ctx.armed.lock().unwrap_or_else(|e| e.into_inner());
            let mine: std::collections::VecDeque<u32> = armed
                .iter()
                .filter(|&(_, &ch)| ch == self.handle)
                .map(|(&cq, _)| cq)
                .collect();
            armed.retain(|_, ch| *ch != self.handle);
            mine
        });
        match q.pop_front() {
            Some(cq) => Ok(Some(cq)),
            None => Err(Error::device_fatal("get_cq_event")),
        }
    }

    /// The next CQ that fired, waiting up to `timeout` (`None`: forever).
    pub fn get_event(&self, timeout: Option<std::time::Duration>) -> Result<Option<u32>> {
        let end = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(cq) = self.try_get_event()? {
                return Ok(Some(cq));
            }
            softverbs_ipc::drain_eventfd(self.fd.as_fd());
            if let Some(cq) = self.try_get_event()? {
                return Ok(Some(cq));
            }
            let left = end.map(|e| e.saturating_duration_since(std::time::Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Ok(None);
            }
            let ms = left.map(|l| l.as_millis().min(i32::MAX as u128) as i32);
            softverbs_ipc::wait_readable(self.fd.as_fd(), ms)
                .map_err(|e| Error::from_io("get_cq_event", &e))?;
        }
    }
}

impl Drop for CompChannel<'_> {
    fn drop(&mut self) {
        self.ctx.fatal.remove_channel(self.handle);
        let req = HandleReq {
            handle: U32::new(self.handle),
        };
        let _ = self
            .ctx
            .conn
            .call::<cmd::DestroyCompChannel>("destroy_comp_channel", 0, &req);
    }
}

impl Cq<'_> {
    /// `ibv_req_notify_cq`: the next completion (solicited or unsuccessful only, with
    /// `solicited_only`) makes the CQ's channel readable.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // Recorded before and after the daemon's answer (`DirectCtx::armed`); a CQ without
        // a channel raises no event to record.
        let direct = self.ctx.direct.as_ref().filter(|_| self.channel.is_some());
        if let Some(d) = direct {
            d.armed(self.handle, solicited_only);
        }
        let req = ReqNotifyCqReq {
            cq: U32::new(self.handle),
            solicited_only: U32::new(u32::from(solicited_only)),
        };
        self.ctx
            .conn
            .call::<cmd::ReqNotifyCq>("req_notify_cq", 0, &req)?;
        if let Some(d) = direct {
            d.armed(self.handle, solicited_only);
        }
        if let Some(ch) = self.channel {
            self.ctx
                .armed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(self.handle, ch);
        }
        Ok(())
    }
}
