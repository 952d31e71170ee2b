//! One rsocket: its CM id and, once connected, the stream protocol of docs/design/rsockets.md —
//! an RC QP, a ring of `nb` receive buffers of `bs` bytes each side, data as SENDs into
//! them, credits returned by an RDMA WRITE of the receiver's consumed-message count into a
//! cell of the sender's, end of stream as a zero-length SEND with immediate.

use core::ffi::c_void;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use super::ib::{self, Region, Wc};
use crate::api;
use crate::cm::ev;
use crate::ffi::*;

/// "SVRS": the first word of the private data of an rsocket's REQ and REP.
pub const MAGIC: u32 = 0x5356_5253;
/// The immediate of the end-of-stream message.
pub const FIN_IMM: u32 = 0x4649_4e00;
/// The immediate of a message announcing (or withdrawing) a `riomap` mapping.
pub const IOMAP_IMM: u32 = 0x494f_4d00;
/// Work request ids of the credit write and the FIN (data messages use their slot).
const CREDIT_WR: u64 = u64::MAX;
const FIN_WR: u64 = u64::MAX - 1;
/// The protocol version in the private data.
pub const VERSION: u16 = 1;

/// What each side tells the other in its private data (28 bytes, little-endian).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Info {
    pub nb: u32,
    pub bs: u32,
    pub ctl_addr: u64,
    pub ctl_rkey: u32,
}

impl Info {
    pub fn emit(&self) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.nb.to_le_bytes());
        b[12..16].copy_from_slice(&self.bs.to_le_bytes());
        b[16..24].copy_from_slice(&self.ctl_addr.to_le_bytes());
        b[24..28].copy_from_slice(&self.ctl_rkey.to_le_bytes());
        b
    }

    pub fn parse(b: &[u8]) -> Option<Info> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        if b.len() < 28 || u32_at(0) != MAGIC || u16::from_le_bytes([b[4], b[5]]) != VERSION {
            return None;
        }
        let i = Info {
            nb: u32_at(8),
            bs: u32_at(12),
            ctl_addr: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            ctl_rkey: u32_at(24),
        };
        (i.nb >= 2 && i.bs >= 64).then_some(i)
    }
}

/// Socket options (rsocket(7)); the sizes take effect at connect/accept.
#[derive(Clone, Copy)]
pub struct Opts {
    pub sndbuf: u32,
    pub rcvbuf: u32,
    pub nodelay: i32,
    pub reuseaddr: i32,
    pub keepalive: i32,
    pub linger: libc::linger,
    pub sqsize: u32,
    pub rqsize: u32,
    pub inline: u32,
    pub iomapsize: u32,
}

/// Message buffer size.
pub const BS: usize = 16 * 1024;

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            sndbuf: 32 * BS as u32,
            rcvbuf: 32 * BS as u32,
            nodelay: 0,
            reuseaddr: 0,
            keepalive: 0,
            linger: libc::linger {
                l_onoff: 0,
                l_linger: 0,
            },
            sqsize: 32,
            rqsize: 32,
            inline: 64,
            iomapsize: 0,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum State {
    Fresh,
    Listening,
    Connecting,
    Connected,
    /// A connect that failed (the error is in `err`).
    Failed,
}

/// A CM event copied out of the channel for the id it concerns.
pub struct EvInfo {
    pub kind: i32,
    pub pd: Vec<u8>,
    pub child: *mut rdma_cm_id,
}

// SAFETY: the child pointer is an id of this library, used under the registry's lock.
unsafe impl Send for EvInfo {}

/// Events by the id (or listener) they concern: ids of one listener share its channel,
/// so whichever socket drains it files its siblings' events here.
static PENDING: Mutex<Option<HashMap<usize, Vec<EvInfo>>>> = Mutex::new(None);

fn pending() -> MutexGuard<'static, Option<HashMap<usize, Vec<EvInfo>>>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Moves every event waiting on `ch` into [`PENDING`].
pub fn pump(ch: *mut rdma_event_channel) {
    loop {
        let mut e: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: a channel of ours whose fd is non-blocking.
        if unsafe { api::get_cm_event(ch, &mut e) } != 0 {
            return;
        }
        // SAFETY: the event just returned, acked below.
        let r = unsafe { &*e };
        let conn = // SAFETY: connected-mode events carry the conn member.
            unsafe { r.param.conn };
        let pd = if conn.private_data.is_null() {
            Vec::new()
        } else {
            // SAFETY: the event's private data of its length.
            unsafe {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len.into(),
                )
            }
            .to_vec()
        };
        let (key, child) = if r.event == ev::CONNECT_REQUEST {
            (r.listen_id as usize, r.id)
        } else {
            (r.id as usize, std::ptr::null_mut())
        };
        let info = EvInfo {
            kind: r.event,
            pd,
            child,
        };
        // SAFETY: ours, copied out.
        unsafe { api::ack_cm_event(e) };
        pending()
            .get_or_insert_with(HashMap::new)
            .entry(key)
            .or_default()
            .push(info);
    }
}

fn take_pending(id: *mut rdma_cm_id) -> Vec<EvInfo> {
    pending()
        .get_or_insert_with(HashMap::new)
        .remove(&(id as usize))
        .unwrap_or_default()
}

/// The connected state: QP, regions and the counters of the protocol.
pub struct Conn {
    ctx: *mut ibv_context,
    pd: *mut c_void,
    cq: *mut c_void,
    qp: *mut ibv_qp,
    rbuf: Option<Region>,
    sbuf: Option<Region>,
    ctl: Option<Region>,
    nb: usize,
    sq: usize,
    bs: usize,
    peer: Option<Info>,
    /// Messages (data and FIN) sent.
    sent: u64,
    /// Send work requests posted and completed.
    posted: u64,
    done: u64,
    /// Received data messages not yet read: (buffer, length, read offset).
    ready: VecDeque<(usize, usize, usize)>,
    /// Receive buffers read and reposted; the count last written to the peer.
    consumed: u64,
    reported: u64,
    pub fin_sent: bool,
    pub fin_recv: bool,
    pub disconnected: bool,
    pub reset: bool,
    /// The peer's `riomap` mappings: (offset, address, length, rkey).
    remote_maps: Vec<(u64, u64, u64, u32)>,
    /// Ours: (offset, address, length, MR).
    local_maps: Vec<(u64, u64, u64, *mut ib::Mr)>,
}

impl Conn {
    /// PD, CQ, QP on `id` (resolved or a connect request's) and the posted receives.
    pub fn new(id: *mut rdma_cm_id, o: &Opts) -> Result<Box<Conn>, i32> {
        // SAFETY: an id of ours.
        let ctx = unsafe { (*id).verbs };
        if ctx.is_null() {
            return Err(libc::ENODEV);
        }
        let nb = (o.rqsize as usize)
            .min(o.rcvbuf as usize / BS)
            .clamp(2, 256);
        let sq = (o.sqsize as usize)
            .min(o.sndbuf as usize / BS)
            .clamp(2, 256);
        // SAFETY: the id's context.
        let pd = unsafe { ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(libc::ENOMEM);
        }
        let mut c = Box::new(Conn {
            ctx,
            pd,
            cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            rbuf: None,
            sbuf: None,
            ctl: None,
            nb,
            sq,
            bs: BS,
            peer: None,
            sent: 0,
            posted: 0,
            done: 0,
            ready: VecDeque::new(),
            consumed: 0,
            reported: 0,
            fin_sent: false,
            fin_recv: false,
            disconnected: false,
            reset: false,
            remote_maps: Vec::new(),
            local_maps: Vec::new(),
        });
        match c.setup(id, nb, sq) {
            Ok(()) => Ok(c),
            Err(e) => {
                c.free(id);
                Err(e)
            }
        }
    }

    /// The CQ, regions, QP and posted receives of `new`; on failure `free` undoes what
    /// was made.
    fn setup(&mut self, id: *mut rdma_cm_id, nb: usize, sq: usize) -> Result<(), i32> {
        let (ctx, pd) = (self.ctx, self.pd);
        let c = self;
        // SAFETY: the id's context.
        c.cq = unsafe {
            ibv_create_cq(
                ctx,
                (nb + sq) as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if c.cq.is_null() {
            return Err(libc::ENOMEM);
        }
        c.rbuf = Some(Region::new(pd, nb * BS)?);
        c.sbuf = Some(Region::new(pd, sq * BS)?);
        c.ctl = Some(Region::new(pd, 4096)?);
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: c.cq,
            recv_cq: c.cq,
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: sq as u32,
                max_recv_wr: nb as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: 2,
            sq_sig_all: 0,
        };
        // SAFETY: our id, PD and attributes.
        if unsafe { api::create_qp(id, pd, &mut attr) } != 0 {
            return Err(errno());
        }
        // SAFETY: just made.
        c.qp = unsafe { (*id).qp };
        for slot in 0..nb {
            c.repost(slot)?;
        }
        Ok(())
    }

    pub fn info(&self) -> Info {
        let ctl = self.ctl.as_ref().expect("made in new");
        Info {
            nb: self.nb as u32,
            bs: self.bs as u32,
            ctl_addr: ctl.base as u64,
            ctl_rkey: ctl.rkey(),
        }
    }

    pub fn set_peer(&mut self, p: Info) {
        self.peer = Some(p);
    }

    fn repost(&mut self, slot: usize) -> Result<(), i32> {
        let sge = self.rbuf.as_ref().expect("made in new").sge(slot * BS, BS);
        // SAFETY: our QP; the buffer is in our registered region.
        unsafe { ib::post_recv(self.qp, slot as u64, sge) }
    }

    /// The count of our messages the peer has read (written into our control cell).
    fn peer_consumed(&self) -> u64 {
        let ctl = self.ctl.as_ref().expect("made in new");
        // SAFETY: the first 8 bytes of our control region, written by the peer's RDMA
        // WRITEs (aligned; a volatile read sees the newest value).
        unsafe { std::ptr::read_volatile(ctl.base.cast::<u64>()) }
    }

    fn credits(&self) -> u64 {
        let Some(p) = self.peer else { return 0 };
        (p.nb as u64).saturating_sub(self.sent - self.peer_consumed().min(self.sent))
    }

    fn sq_free(&self) -> bool {
        self.posted - self.done < self.sq as u64
    }

    /// Whether a data message may go now: one credit always stays for the FIN.
    pub fn can_send(&self) -> bool {
        !self.fin_sent && !self.reset && self.sq_free() && self.credits() > 1
    }

    pub fn readable(&self) -> bool {
        !self.ready.is_empty() || self.fin_recv || self.reset
    }

    pub fn drained(&self) -> bool {
        self.posted == self.done
    }

    /// Polls the CQ, returns credits, notes the end of the connection.
    pub fn progress(&mut self) {
        if self.qp.is_null() {
            return;
        }
        let mut wc = [Wc::default(); 16];
        loop {
            // SAFETY: our CQ on our context.
            let n = unsafe { ib::poll_cq(self.ctx, self.cq, &mut wc) };
            if n <= 0 {
                break;
            }
            for w in &wc[..n as usize] {
                self.complete(w);
            }
        }
        if self.disconnected && !self.fin_recv {
            self.reset = true;
        }
        self.report(false);
    }

    fn complete(&mut self, w: &Wc) {
        if w.opcode & ib::WC_RECV == 0 {
            self.done += 1;
            // A credit write or FIN flushed by the peer's disconnect loses nothing the
            // peer wanted (it closed); a flushed data message is data lost: a reset, as
            // TCP's RST for data the peer never read.
            let control = w.wr_id == CREDIT_WR || w.wr_id == FIN_WR;
            if w.status != 0 && !(w.status == 5 && control) {
                self.reset = true;
            }
            return;
        }
        if w.status != 0 {
            // Flushed receives after a disconnect say nothing about the stream.
            if w.status != 5 {
                self.reset = true;
            }
            return;
        }
        let slot = w.wr_id as usize;
        if w.wc_flags & ib::WC_WITH_IMM != 0 && w.imm_data == FIN_IMM.to_be() {
            self.fin_recv = true;
            self.consumed += 1;
            let _ = self.repost(slot);
        } else if w.wc_flags & ib::WC_WITH_IMM != 0 && w.imm_data == IOMAP_IMM.to_be() {
            self.iomap_message(slot, w.byte_len as usize);
            self.consumed += 1;
            let _ = self.repost(slot);
        } else if w.byte_len == 0 {
            self.consumed += 1;
            let _ = self.repost(slot);
        } else {
            self.ready.push_back((slot, w.byte_len as usize, 0));
        }
    }

    /// Writes our consumed count into the peer's control cell when half its buffers (or,
    /// with `all`, any) wait to be returned.
    fn report(&mut self, all: bool) {
        let Some(p) = self.peer else { return };
        let owed = self.consumed - self.reported;
        let want = if all { 1 } else { (self.nb as u64 / 2).max(1) };
        if owed < want || !self.sq_free() || self.reset {
            return;
        }
        let slot = (self.posted % self.sq as u64) as usize;
        let sbuf = self.sbuf.as_ref().expect("made in new");
        // SAFETY: the first 8 bytes of a send slot no posted request uses (the SQ is in
        // order and this slot's previous request completed).
        unsafe { std::ptr::write_unaligned(sbuf.base.add(slot * BS).cast::<u64>(), self.consumed) };
        let sge = sbuf.sge(slot * BS, 8);
        // SAFETY: our QP and registered slot; the peer's cell from its private data.
        let r = unsafe {
            ib::post_send(
                self.qp,
                CREDIT_WR,
                ib::WR_RDMA_WRITE,
                0,
                sge,
                (p.ctl_addr, p.ctl_rkey),
            )
        };
        match r {
            Ok(()) => {
                self.posted += 1;
                self.reported = self.consumed;
            }
            Err(_) => self.reset = true,
        }
    }

    /// Sends as much of `buf` as credits allow; the bytes sent.
    pub fn send(&mut self, buf: &[u8]) -> Result<usize, i32> {
        let Some(p) = self.peer else {
            return Err(libc::ENOTCONN);
        };
        let chunk = self.bs.min(p.bs as usize);
        let mut off = 0;
        while off < buf.len() && self.can_send() {
            let n = chunk.min(buf.len() - off);
            let slot = (self.posted % self.sq as u64) as usize;
            let sbuf = self.sbuf.as_ref().expect("made in new");
            // SAFETY: a free send slot of BS bytes (n <= BS).
            unsafe {
                std::ptr::copy_nonoverlapping(buf[off..].as_ptr(), sbuf.base.add(slot * BS), n)
            };
            let sge = sbuf.sge(slot * BS, n);
            // SAFETY: our QP and registered slot.
            if unsafe { ib::post_send(self.qp, slot as u64, ib::WR_SEND, 0, sge, (0, 0)) }.is_err()
            {
                self.reset = true;
                break;
            }
            self.posted += 1;
            self.sent += 1;
            off += n;
        }
        Ok(off)
    }

    /// Sends the end of stream if a credit and a send slot are there.
    pub fn try_fin(&mut self) -> bool {
        if self.fin_sent {
            return true;
        }
        if self.reset || self.peer.is_none() || !self.sq_free() || self.credits() == 0 {
            return false;
        }
        let sge = self.sbuf.as_ref().expect("made in new").sge(0, 0);
        // SAFETY: our QP; no data.
        let r = unsafe {
            ib::post_send(
                self.qp,
                FIN_WR,
                ib::WR_SEND_WITH_IMM,
                FIN_IMM.to_be(),
                sge,
                (0, 0),
            )
        };
        if r.is_err() {
            self.reset = true;
            return false;
        }
        self.posted += 1;
        self.sent += 1;
        self.fin_sent = true;
        true
    }

    /// Copies received bytes into `buf`; `peek` leaves them.
    pub fn recv(&mut self, buf: &mut [u8], peek: bool) -> usize {
        let mut got = 0;
        let mut i = 0;
        while got < buf.len() {
            let Some(&(slot, len, off)) = self.ready.get(i) else {
                break;
            };
            let n = (len - off).min(buf.len() - got);
            let rbuf = self.rbuf.as_ref().expect("made in new");
            // SAFETY: a received buffer of `len` bytes in our region, not reposted yet.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    rbuf.base.add(slot * BS + off),
                    buf[got..].as_mut_ptr(),
                    n,
                )
            };
            got += n;
            if peek {
                i += 1;
                continue;
            }
            if off + n == len {
                self.ready.pop_front();
                self.consumed += 1;
                if self.repost(slot).is_err() {
                    self.reset = true;
                }
            } else {
                self.ready[0].2 = off + n;
            }
        }
        if !peek {
            self.report(self.ready.is_empty());
        }
        got
    }

    /// A peer's mapping message (docs/design/rsockets.md): kind 1 maps, 2 unmaps.
    fn iomap_message(&mut self, slot: usize, len: usize) {
        if len < 32 {
            return;
        }
        let mut b = [0u8; 32];
        let rbuf = self.rbuf.as_ref().expect("made in new");
        // SAFETY: a received buffer of at least 32 bytes in our region.
        unsafe { std::ptr::copy_nonoverlapping(rbuf.base.add(slot * BS), b.as_mut_ptr(), 32) };
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let kind = u32::from_le_bytes(b[0..4].try_into().unwrap());
        let (off, addr, len) = (u64_at(4), u64_at(12), u64_at(20));
        let rkey = u32::from_le_bytes(b[28..32].try_into().unwrap());
        self.remote_maps.retain(|m| m.0 != off);
        if kind == 1 {
            self.remote_maps.push((off, addr, len, rkey));
        }
    }

    /// Sends a mapping message if a data credit is there.
    fn send_iomap(&mut self, kind: u32, off: u64, addr: u64, len: u64, rkey: u32) -> bool {
        if !self.can_send() {
            return false;
        }
        let slot = (self.posted % self.sq as u64) as usize;
        let mut b = [0u8; 32];
        b[0..4].copy_from_slice(&kind.to_le_bytes());
        b[4..12].copy_from_slice(&off.to_le_bytes());
        b[12..20].copy_from_slice(&addr.to_le_bytes());
        b[20..28].copy_from_slice(&len.to_le_bytes());
        b[28..32].copy_from_slice(&rkey.to_le_bytes());
        let sbuf = self.sbuf.as_ref().expect("made in new");
        // SAFETY: a free send slot.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), sbuf.base.add(slot * BS), 32) };
        let sge = sbuf.sge(slot * BS, 32);
        // SAFETY: our QP and registered slot.
        let r = unsafe {
            ib::post_send(
                self.qp,
                slot as u64,
                ib::WR_SEND_WITH_IMM,
                IOMAP_IMM.to_be(),
                sge,
                (0, 0),
            )
        };
        if r.is_err() {
            self.reset = true;
            return false;
        }
        self.posted += 1;
        self.sent += 1;
        true
    }

    /// Registers `[addr, addr+len)` for the peer's `riowrite`s at `offset` (or one chosen
    /// here) and tells the peer; `None` until a credit is there.
    pub fn iomap(&mut self, addr: u64, len: u64, offset: Option<u64>) -> Result<Option<u64>, i32> {
        if !self.can_send() {
            return Ok(None);
        }
        // Offset -1: the buffer's address, as rdma-core's riomap picks it (rsocket(7) says
        // only "rsockets selects one"; programs written against rdma-core see the address).
        let off = offset.unwrap_or(addr);
        if self
            .local_maps
            .iter()
            .any(|m| off < m.0 + m.2 && m.0 < off + len)
        {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's buffer, registered until riounmap or close.
        let mr = unsafe {
            ib::ibv_reg_mr(
                self.pd,
                addr as *mut c_void,
                len as usize,
                ib::ACCESS_LOCAL_REMOTE_WRITE,
            )
        };
        if mr.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: just registered.
        let rkey = unsafe { (*mr).rkey };
        if !self.send_iomap(1, off, addr, len, rkey) {
            // SAFETY: ours, unannounced.
            unsafe { ib::ibv_dereg_mr(mr) };
            return Err(libc::ECONNRESET);
        }
        self.local_maps.push((off, addr, len, mr));
        Ok(Some(off))
    }

    /// Withdraws the mapping of `addr`; `Ok(false)` until a credit is there.
    pub fn iounmap(&mut self, addr: u64) -> Result<bool, i32> {
        let Some(i) = self.local_maps.iter().position(|m| m.1 == addr) else {
            return Err(libc::EINVAL);
        };
        if !self.can_send() && !self.reset {
            return Ok(false);
        }
        let (off, _, _, mr) = self.local_maps.remove(i);
        if !self.reset {
            self.send_iomap(2, off, 0, 0, 0);
        }
        // SAFETY: our MR; the peer was told it is gone (writes already in flight land before
        // our unmap message is read, RC ordering).
        unsafe { ib::ibv_dereg_mr(mr) };
        Ok(true)
    }

    /// The peer's mapping that holds `offset`: (offset, address, length, rkey).
    fn remote_map_at(&self, offset: u64) -> Option<(u64, u64, u64, u32)> {
        self.remote_maps
            .iter()
            .find(|m| offset >= m.0 && offset - m.0 < m.2)
            .copied()
    }

    /// RDMA WRITEs as much of `buf` as send slots allow into the peer's mappings from
    /// `offset` on. The range may run through adjacent mappings (rdma-core's riowrite moves
    /// to the mapping that holds the next offset); a range any byte of which no mapping
    /// holds is `EINVAL` and nothing of it is written.
    pub fn iowrite(&mut self, buf: &[u8], offset: u64) -> Result<usize, i32> {
        let end = offset.checked_add(buf.len() as u64).ok_or(libc::EINVAL)?;
        let mut at = offset;
        while at < end {
            let m = self.remote_map_at(at).ok_or(libc::EINVAL)?;
            at = m.0 + m.2;
        }
        let mut done = 0;
        while done < buf.len() && self.sq_free() && !self.reset {
            let here = offset + done as u64;
            let (moff, maddr, mlen, rkey) = self.remote_map_at(here).expect("checked above");
            let n = BS.min(buf.len() - done).min((moff + mlen - here) as usize);
            let slot = (self.posted % self.sq as u64) as usize;
            let sbuf = self.sbuf.as_ref().expect("made in new");
            // SAFETY: a free send slot of BS bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(buf[done..].as_ptr(), sbuf.base.add(slot * BS), n)
            };
            let sge = sbuf.sge(slot * BS, n);
            let at = maddr + (here - moff);
            // SAFETY: our QP and registered slot; the peer's mapping from its message.
            if unsafe { ib::post_send(self.qp, slot as u64, ib::WR_RDMA_WRITE, 0, sge, (at, rkey)) }
                .is_err()
            {
                self.reset = true;
                break;
            }
            self.posted += 1;
            done += n;
        }
        Ok(done)
    }

    /// Frees the QP and the regions; `id` is the id the QP was made on.
    pub fn free(&mut self, id: *mut rdma_cm_id) {
        if !self.qp.is_null() {
            // SAFETY: the id's QP (made by rdma_create_qp here).
            unsafe { api::destroy_qp(id) };
            self.qp = std::ptr::null_mut();
        }
        for (_, _, _, mr) in self.local_maps.drain(..) {
            // SAFETY: our MR, its QP gone.
            unsafe { ib::ibv_dereg_mr(mr) };
        }
        self.rbuf = None;
        self.sbuf = None;
        self.ctl = None;
        // SAFETY: ours, no QP uses them any more.
        unsafe {
            if !self.cq.is_null() {
                ibv_destroy_cq(self.cq);
                self.cq = std::ptr::null_mut();
            }
            if !self.pd.is_null() {
                ib::ibv_dealloc_pd(self.pd);
                self.pd = std::ptr::null_mut();
            }
        }
    }
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// An rsocket.
pub struct Sock {
    pub domain: i32,
    pub nonblock: bool,
    pub state: State,
    /// The event channel this socket made (listeners and connecting sockets); accepted
    /// sockets use their listener's.
    pub own_chan: *mut rdma_event_channel,
    pub id: *mut rdma_cm_id,
    pub backlog: VecDeque<(*mut rdma_cm_id, Vec<u8>)>,
    pub conn: Option<Box<Conn>>,
    pub err: i32,
    pub opts: Opts,
    pub rd_shut: bool,
    pub established: bool,
}

// SAFETY: the pointers are this library's CM and verbs objects, used under the socket's
// mutex.
unsafe impl Send for Sock {}

impl Sock {
    pub fn chan(&self) -> *mut rdma_event_channel {
        // SAFETY: our id.
        unsafe { (*self.id).channel }
    }

    /// Everything that can move without the program: events and completions.
    pub fn progress(&mut self) {
        if self.id.is_null() {
            return;
        }
        // Completions first: a FIN acked before the peer disconnected is in our CQ by the
        // time its DISCONNECTED is.
        if let Some(c) = self.conn.as_mut() {
            c.progress();
        }
        pump(self.chan());
        for e in take_pending(self.id) {
            self.event(e);
        }
        if let Some(c) = self.conn.as_mut() {
            c.progress();
        }
    }

    fn event(&mut self, e: EvInfo) {
        match e.kind {
            ev::CONNECT_REQUEST if self.state == State::Listening => {
                self.backlog.push_back((e.child, e.pd));
            }
            ev::ESTABLISHED => {
                self.established = true;
                if self.state == State::Connecting {
                    match (Info::parse(&e.pd), self.conn.as_mut()) {
                        (Some(p), Some(c)) => {
                            c.set_peer(p);
                            self.state = State::Connected;
                        }
                        _ => {
                            self.err = libc::ECONNREFUSED;
                            self.state = State::Failed;
                        }
                    }
                }
            }
            ev::REJECTED => self.fail(libc::ECONNREFUSED),
            ev::UNREACHABLE => self.fail(libc::ETIMEDOUT),
            ev::DISCONNECTED => {
                if let Some(c) = self.conn.as_mut() {
                    c.disconnected = true;
                }
                if self.state == State::Connecting {
                    self.fail(libc::ECONNRESET);
                }
            }
            _ => {}
        }
    }

    fn fail(&mut self, e: i32) {
        if self.state == State::Connecting {
            self.err = e;
            self.state = State::Failed;
        }
    }

    /// `poll(2)` events of this socket.
    pub fn revents(&self) -> i16 {
        match self.state {
            State::Listening => {
                if self.backlog.is_empty() {
                    0
                } else {
                    libc::POLLIN
                }
            }
            State::Connecting => 0,
            State::Failed => libc::POLLOUT | libc::POLLERR | libc::POLLHUP,
            State::Fresh => libc::POLLOUT | libc::POLLHUP,
            State::Connected => {
                let c = self.conn.as_ref().expect("connected");
                let mut r = 0;
                if c.readable() || self.rd_shut {
                    r |= libc::POLLIN;
                }
                if c.can_send() || c.reset {
                    r |= libc::POLLOUT;
                }
                if c.reset {
                    r |= libc::POLLERR | libc::POLLHUP;
                } else if c.fin_recv && c.fin_sent {
                    r |= libc::POLLHUP;
                }
                r
            }
        }
    }

    /// Tears the socket down: FIN, the wait for sends, disconnect, the objects.
    pub fn close(&mut self) {
        for (child, _) in std::mem::take(&mut self.backlog) {
            // SAFETY: ids from connect requests nobody accepted.
            unsafe {
                api::reject(child, std::ptr::null(), 0);
                api::destroy_id(child);
            }
        }
        if self.state == State::Connected {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            loop {
                self.progress();
                let c = self.conn.as_mut().expect("connected");
                let fin = c.reset || c.try_fin();
                if (fin && c.drained()) || c.reset || std::time::Instant::now() > deadline {
                    break;
                }
                super::backoff(0);
            }
        }
        if !self.id.is_null() {
            if matches!(
                self.state,
                State::Connected | State::Connecting | State::Failed
            ) {
                // SAFETY: our id.
                unsafe { api::disconnect(self.id) };
            }
            if let Some(mut c) = self.conn.take() {
                c.free(self.id);
            }
            take_pending(self.id);
            // SAFETY: our id, its QP gone.
            unsafe { api::destroy_id(self.id) };
            self.id = std::ptr::null_mut();
        }
        if !self.own_chan.is_null() {
            // SAFETY: the channel this socket made; ids on it hold their own references.
            unsafe { api::destroy_event_channel(self.own_chan) };
            self.own_chan = std::ptr::null_mut();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_round_trips_and_refuses_what_is_not_ours() {
        let i = Info {
            nb: 32,
            bs: 16384,
            ctl_addr: 0x7f00_1234_5000,
            ctl_rkey: 0xabcd,
        };
        let b = i.emit();
        assert_eq!(Info::parse(&b), Some(i));
        // rdma_cm pads a REQ's private data: trailing bytes are fine.
        let mut long = b.to_vec();
        long.extend([0u8; 28]);
        assert_eq!(Info::parse(&long), Some(i));
        assert_eq!(Info::parse(&b[..27]), None);
        let mut other = b;
        other[0] ^= 1;
        assert_eq!(Info::parse(&other), None, "magic");
        let mut v2 = b;
        v2[4] = 2;
        assert_eq!(Info::parse(&v2), None, "version");
        let one = Info { nb: 1, ..i }.emit();
        assert_eq!(
            Info::parse(&one),
            None,
            "a ring of one buffer has no credit for data"
        );
    }
}
