//! Fewer, larger system calls on the process path: read-ahead streams and write-behind runs
//! (docs/design/registered-memory.md, "One system call per work request").
//!
//! The engine reads and writes payload one packet (≤ 4 KiB) at a time. On the process path
//! each access is a `pread`/`pwrite` on the client's `/proc/self/mem`, whose fixed cost
//! (~1.5 µs) dwarfs the copy of a packet, so this module gathers them:
//!
//! * **Read-ahead.** [`Memory::will_read`](softverbs_core::memory::Memory::will_read) opens a
//!   *stream* over the bytes one work request will read front to back. A read inside a
//!   stream is served from the stream's window, refilled with one `pread` of up to
//!   [`WINDOW`] bytes from the address asked for. A new hint replaces every stream it
//!   overlaps, so a request never reads bytes fetched before it was posted (its own hint
//!   came after its post and before its reads); within one request the bytes cannot change
//!   legally (ibv_post_send(3): the buffer belongs to the device until the completion).
//! * **Write-behind.** A write that continues no run is made at once (so that memory which
//!   is gone fails the request at its first packet, as without batching) and starts a *run*
//!   after it: the contiguous bytes of one context that the following packets of the message
//!   extend; [`Batch::flush`] writes each run with one `pwrite`. The daemon flushes before any completion reaches a CQ and before any packet
//!   leaves on a wire, so what a program can learn of the writes (a CQE, an ACK that lets a
//!   requester complete) always comes after the bytes are in its memory.
//!
//! Consistency inside the daemon: a write drops every window it overlaps, and every actual
//! read (a refill, a read outside streams, an atomic) first flushes the runs it overlaps, so
//! reads see earlier writes in order. Overlap is judged on addresses alone, whatever the
//! context: two contexts of one process share one address space.
//!
//! Memory use is bounded: at most [`MAX_STREAMS`] streams (the oldest is forgotten), each
//! window at most [`WINDOW`] bytes, and held-back writes at most [`MAX_HELD`] bytes (then
//! they are flushed at once).

use std::collections::VecDeque;

use softverbs_core::ids::CtxId;
use softverbs_core::memory::Fault;

/// The largest read-ahead: one `pread` per this many bytes of a message. `/proc/pid/mem`
/// copies through one bounce page per page, so beyond a few dozen pages a larger call only
/// saves its fixed cost, already small against the copy.
pub const WINDOW: usize = 256 * 1024;

/// Hints shorter than this open no stream: such a message is read in one or two packets
/// anyway, and a stream for it would only push out a useful one.
pub const MIN_STREAM: u64 = 8 * 1024;

/// Streams kept at once (with a window each, so at most this many × [`WINDOW`] bytes).
pub const MAX_STREAMS: usize = 32;

/// Held-back write bytes beyond which the runs are written out at once.
pub const MAX_HELD: usize = 4 * 1024 * 1024;

/// The system calls behind a batch (the client's `mem` file in the daemon; a vector in
/// tests). Both transfer everything or fail with the fault at the first byte not moved.
pub trait Backend {
    /// Reads `buf.len()` bytes at `addr` of `ctx`.
    fn read_at(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault>;
    /// Writes `data` at `addr` of `ctx`.
    fn write_at(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault>;
}

#[derive(Debug)]
struct Stream {
    ctx: CtxId,
    /// The hinted bytes `[start, end)`.
    start: u64,
    end: u64,
    /// The window holds the bytes at `[win_at, win_at + valid)` in `win[..valid]` (the
    /// vector keeps its length across refills, so a refill never zero-fills it again).
    win_at: u64,
    valid: usize,
    win: Vec<u8>,
}

#[derive(Debug)]
struct Run {
    ctx: CtxId,
    addr: u64,
    data: Vec<u8>,
}

impl Run {
    fn end(&self) -> u64 {
        self.addr + self.data.len() as u64
    }
}

fn overlaps(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// What this batch saved, for the bench and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Reads served from a window without a system call.
    pub window_hits: u64,
    /// `pread`s made (refills, reads outside streams, atomics).
    pub reads: u64,
    /// Writes the engine made.
    pub writes_held: u64,
    /// `pwrite`s made.
    pub writes: u64,
}

/// Read-ahead streams and write-behind runs over one [`Backend`].
#[derive(Debug, Default)]
pub struct Batch {
    streams: VecDeque<Stream>,
    runs: Vec<Run>,
    held: usize,
    spare: Vec<Vec<u8>>,
    stats: BatchStats,
}

impl Batch {
    /// Counters so far.
    pub fn stats(&self) -> BatchStats {
        self.stats
    }

    /// Whether writes are held back.
    pub fn holds_writes(&self) -> bool {
        !self.runs.is_empty()
    }

    /// Opens a stream over `[addr, addr + len)` of `ctx`, forgetting every stream that
    /// overlaps it (their bytes may be older than the request this hint is for).
    pub fn will_read(&mut self, ctx: CtxId, addr: u64, len: u64) {
        if len == 0 {
            return;
        }
        self.drop_streams(addr, len);
        if len < MIN_STREAM {
            return;
        }
        if self.streams.len() >= MAX_STREAMS {
            if let Some(old) = self.streams.pop_front() {
                self.recycle(old.win);
            }
        }
        let win = self.spare.pop().unwrap_or_default();
        self.streams.push_back(Stream {
            ctx,
            start: addr,
            end: addr.saturating_add(len),
            win_at: addr,
            valid: 0,
            win,
        });
    }

    /// Reads `buf.len()` bytes at `addr` of `ctx`: from a stream's window, refilling it with
    /// one large read when the bytes are not in it, or, outside every stream, directly.
    pub fn read<B: Backend>(
        &mut self,
        be: &mut B,
        ctx: CtxId,
        addr: u64,
        buf: &mut [u8],
    ) -> Result<(), Fault> {
        let len = buf.len() as u64;
        let Some(i) = self
            .streams
            .iter()
            .rposition(|s| s.ctx == ctx && s.start <= addr && addr.saturating_add(len) <= s.end)
        else {
            return self.read_direct(be, ctx, addr, buf);
        };
        let s = &self.streams[i];
        if s.win_at <= addr && addr + len <= s.win_at + s.valid as u64 {
            let off = (addr - s.win_at) as usize;
            buf.copy_from_slice(&s.win[off..off + buf.len()]);
            self.stats.window_hits += 1;
            return Ok(());
        }
        // Refill from `addr`: what follows is what the request reads next.
        let n = (s.end - addr).min(WINDOW as u64).max(len) as usize;
        let _ = s;
        self.flush_overlapping(be, addr, n as u64)?;
        let mut win = std::mem::take(&mut self.streams[i].win);
        if win.len() < n {
            win.resize(n, 0);
        }
        self.stats.reads += 1;
        match be.read_at(ctx, addr, &mut win[..n]) {
            Ok(()) => {
                buf.copy_from_slice(&win[..buf.len()]);
                let s = &mut self.streams[i];
                s.win = win;
                s.win_at = addr;
                s.valid = n;
                Ok(())
            }
            Err(_) => {
                // Part of the window is not readable (the stream runs past what is mapped,
                // or the program unmapped something): no window, and the exact answer for
                // the bytes asked for.
                let s = &mut self.streams[i];
                s.win = win;
                s.win_at = addr;
                s.valid = 0;
                self.read_direct(be, ctx, addr, buf)
            }
        }
    }

    /// Reads around every stream and run (flushing the runs it overlaps first).
    pub fn read_direct<B: Backend>(
        &mut self,
        be: &mut B,
        ctx: CtxId,
        addr: u64,
        buf: &mut [u8],
    ) -> Result<(), Fault> {
        self.flush_overlapping(be, addr, buf.len() as u64)?;
        self.stats.reads += 1;
        be.read_at(ctx, addr, buf)
    }

    /// Holds `data` back for `addr` of `ctx`, joined to the run it continues if there is one.
    pub fn write<B: Backend>(
        &mut self,
        be: &mut B,
        ctx: CtxId,
        addr: u64,
        data: &[u8],
    ) -> Result<(), Fault> {
        let len = data.len() as u64;
        self.drop_windows(addr, len);
        self.stats.writes_held += 1;
        // Join the newest run this continues, unless a later run overlaps the new bytes
        // (then joining would reorder two writes of the same bytes).
        let join = self
            .runs
            .iter()
            .rposition(|r| r.ctx == ctx && r.end() == addr)
            .filter(|&i| {
                !self.runs[i + 1..]
                    .iter()
                    .any(|r| overlaps(r.addr, r.data.len() as u64, addr, len))
            });
        let Some(i) = join else {
            // The first packet of a run is written at once: memory that is gone (freed by
            // the program, or the program died) fails the request at its first packet, as
            // without batching; the packets that follow it are held back.
            self.write_direct(be, ctx, addr, data)?;
            let mut buf = self.spare.pop().unwrap_or_default();
            buf.clear();
            // A message's packets follow: room for a typical one without regrowing.
            buf.reserve(64 * 1024);
            self.runs.push(Run {
                ctx,
                addr: addr + len,
                data: buf,
            });
            return Ok(());
        };
        self.runs[i].data.extend_from_slice(data);
        self.held += data.len();
        if self.held > MAX_HELD {
            self.flush(be)?;
        }
        Ok(())
    }

    /// Writes around the runs and streams, in order after every run it overlaps.
    pub fn write_direct<B: Backend>(
        &mut self,
        be: &mut B,
        ctx: CtxId,
        addr: u64,
        data: &[u8],
    ) -> Result<(), Fault> {
        let len = data.len() as u64;
        self.drop_windows(addr, len);
        self.flush_overlapping(be, addr, len)?;
        self.stats.writes += 1;
        be.write_at(ctx, addr, data)
    }

    /// Writes every run, oldest first, one system call each. Every run is attempted; the
    /// fault of the first that failed is returned.
    pub fn flush<B: Backend>(&mut self, be: &mut B) -> Result<(), Fault> {
        let mut first = Ok(());
        for r in std::mem::take(&mut self.runs) {
            if r.data.is_empty() {
                self.recycle(r.data);
                continue;
            }
            self.stats.writes += 1;
            if let Err(f) = be.write_at(r.ctx, r.addr, &r.data) {
                if first.is_ok() {
                    first = Err(f);
                }
            }
            self.recycle(r.data);
        }
        self.held = 0;
        first
    }

    /// Forgets everything of `ctx` (its process closed the context): its streams, and its
    /// runs, which are attempted first.
    pub fn forget<B: Backend>(&mut self, be: &mut B, ctx: CtxId) {
        let _ = self.flush(be);
        self.streams.retain(|s| s.ctx != ctx);
    }

    /// Flushes all runs if any overlaps `[addr, addr + len)` (all of them, so that their
    /// order among themselves is kept).
    fn flush_overlapping<B: Backend>(
        &mut self,
        be: &mut B,
        addr: u64,
        len: u64,
    ) -> Result<(), Fault> {
        if self
            .runs
            .iter()
            .any(|r| overlaps(r.addr, r.data.len() as u64, addr, len))
        {
            self.flush(be)?;
        }
        Ok(())
    }

    fn drop_streams(&mut self, addr: u64, len: u64) {
        let mut i = 0;
        while i < self.streams.len() {
            let s = &self.streams[i];
            if overlaps(s.start, s.end - s.start, addr, len) {
                let s = self.streams.remove(i).expect("index in range");
                self.recycle(s.win);
            } else {
                i += 1;
            }
        }
    }

    fn drop_windows(&mut self, addr: u64, len: u64) {
        for s in &mut self.streams {
            if overlaps(s.win_at, s.valid as u64, addr, len) {
                s.valid = 0;
            }
        }
    }

    /// Keeps a buffer for the next window or run (allocating and faulting in fresh pages
    /// for every message showed in profiles).
    fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < 16 && buf.capacity() <= WINDOW.max(1 << 20) {
            self.spare.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flat address space per context that counts its system calls.
    #[derive(Default)]
    struct Flat {
        bytes: std::collections::HashMap<CtxId, Vec<u8>>,
        reads: Vec<(u64, usize)>,
        writes: Vec<(u64, usize)>,
        hole: Option<(u64, u64)>,
    }

    impl Flat {
        fn with(ctx: CtxId, len: usize) -> Self {
            let mut f = Flat::default();
            f.bytes
                .insert(ctx, (0..len).map(|i| (i * 7 % 251) as u8).collect());
            f
        }
        fn check(&self, ctx: CtxId, addr: u64, len: usize) -> Result<(), Fault> {
            if let Some((lo, hi)) = self.hole {
                if overlaps(lo, hi - lo, addr, len as u64) {
                    return Err(Fault {
                        ctx,
                        addr: addr.max(lo),
                    });
                }
            }
            if addr as usize + len > self.bytes[&ctx].len() {
                return Err(Fault { ctx, addr });
            }
            Ok(())
        }
    }

    impl Backend for Flat {
        fn read_at(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
            self.reads.push((addr, buf.len()));
            self.check(ctx, addr, buf.len())?;
            let a = addr as usize;
            buf.copy_from_slice(&self.bytes[&ctx][a..a + buf.len()]);
            Ok(())
        }
        fn write_at(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
            self.writes.push((addr, data.len()));
            self.check(ctx, addr, data.len())?;
            let a = addr as usize;
            self.bytes.get_mut(&ctx).unwrap()[a..a + data.len()].copy_from_slice(data);
            Ok(())
        }
    }

    const C: CtxId = CtxId(1);

    #[test]
    fn a_hinted_message_is_read_in_one_call_per_window() {
        let mut be = Flat::with(C, 4 << 20);
        let mut b = Batch::default();
        let len = 3 * WINDOW as u64 + 100;
        b.will_read(C, 4096, len);
        let mut got = Vec::new();
        let mut pkt = vec![0u8; 4096];
        let mut at = 4096u64;
        while at < 4096 + len {
            let n = (4096 + len - at).min(4096) as usize;
            b.read(&mut be, C, at, &mut pkt[..n]).unwrap();
            got.extend_from_slice(&pkt[..n]);
            at += n as u64;
        }
        assert_eq!(&got[..], &be.bytes[&C][4096..4096 + len as usize]);
        assert_eq!(be.reads.len(), 4, "{:?}", be.reads);
        assert_eq!(be.reads[0], (4096, WINDOW));
        assert_eq!(be.reads[3], (4096 + 3 * WINDOW as u64, 100));
    }

    #[test]
    fn a_new_hint_reads_the_bytes_again() {
        let mut be = Flat::with(C, 1 << 20);
        let mut b = Batch::default();
        let mut pkt = [0u8; 4096];
        b.will_read(C, 0, 65536);
        b.read(&mut be, C, 0, &mut pkt).unwrap();
        // The program changes its buffer after the first request completed, posts again.
        be.bytes.get_mut(&C).unwrap()[4096] = 0xAA;
        b.will_read(C, 0, 65536);
        b.read(&mut be, C, 4096, &mut pkt).unwrap();
        assert_eq!(pkt[0], 0xAA);
        // Without a hint (no stream) reads go straight to memory.
        be.bytes.get_mut(&C).unwrap()[200_000] = 0xBB;
        b.read(&mut be, C, 200_000, &mut pkt[..1]).unwrap();
        assert_eq!(pkt[0], 0xBB);
    }

    #[test]
    fn consecutive_writes_become_one_and_land_at_flush() {
        let mut be = Flat::with(C, 1 << 20);
        let mut b = Batch::default();
        for i in 0..16u64 {
            b.write(&mut be, C, 8192 + i * 4096, &[i as u8; 4096])
                .unwrap();
        }
        // The first packet at once, the other 15 held.
        assert_eq!(be.writes, vec![(8192, 4096)]);
        assert!(b.holds_writes());
        b.flush(&mut be).unwrap();
        assert_eq!(be.writes, vec![(8192, 4096), (12288, 61440)]);
        for i in 0..16usize {
            assert_eq!(be.bytes[&C][8192 + i * 4096], i as u8);
        }
        assert!(!b.holds_writes());
    }

    #[test]
    fn reads_see_held_writes_and_overwrites_keep_their_order() {
        let mut be = Flat::with(C, 1 << 20);
        let mut b = Batch::default();
        b.will_read(C, 0, 65536);
        let mut pkt = [0u8; 16];
        b.read(&mut be, C, 0, &mut pkt).unwrap(); // window filled
        b.write(&mut be, C, 0, &[1u8; 4096]).unwrap();
        b.write(&mut be, C, 100, &[2u8; 8]).unwrap();
        // Continues the first run, but the second overlaps it: must not be joined.
        b.write(&mut be, C, 4096, &[3u8; 4096]).unwrap();
        b.write(&mut be, C, 104, &[4u8; 4]).unwrap();
        b.read(&mut be, C, 96, &mut pkt).unwrap();
        assert_eq!(pkt, [1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4, 1, 1, 1, 1]);
        assert_eq!(be.bytes[&C][4096], 3);
    }

    #[test]
    fn a_fault_in_the_window_gives_the_exact_fault() {
        let mut be = Flat::with(C, 1 << 20);
        be.hole = Some((40_960, 45_056));
        let mut b = Batch::default();
        b.will_read(C, 0, 65536);
        let mut pkt = [0u8; 4096];
        b.read(&mut be, C, 0, &mut pkt).unwrap();
        b.read(&mut be, C, 36_864, &mut pkt).unwrap();
        let e = b.read(&mut be, C, 40_960, &mut pkt).unwrap_err();
        assert_eq!(e.addr, 40_960);
        // Memory that is gone fails the first packet of a run at once...
        assert_eq!(b.write(&mut be, C, 40_960, &pkt).unwrap_err().addr, 40_960);
        // ...and a later packet of a run at the flush, which still writes the other runs.
        b.write(&mut be, C, 32_768, &pkt).unwrap();
        b.write(&mut be, C, 36_864, &pkt).unwrap();
        b.write(&mut be, C, 40_960, &pkt).unwrap();
        b.write(&mut be, C, 0, &pkt).unwrap();
        b.write(&mut be, C, 4096, &[9u8; 4096]).unwrap();
        assert_eq!(b.flush(&mut be).unwrap_err().addr, 40_960);
        assert_eq!(be.bytes[&C][4096], 9, "the later run is still written");
    }

    #[test]
    fn memory_stays_bounded() {
        let mut be = Flat::with(C, 64 << 20);
        let mut b = Batch::default();
        let mut pkt = [0u8; 64];
        for i in 0..(MAX_STREAMS as u64 * 3) {
            b.will_read(C, i * 262_144, 262_144);
            b.read(&mut be, C, i * 262_144, &mut pkt).unwrap();
        }
        assert_eq!(b.streams.len(), MAX_STREAMS);
        for i in 0..2048u64 {
            b.write(&mut be, C, i * 4096, &[1u8; 4096]).unwrap();
        }
        assert!(b.held <= MAX_HELD);
        assert!(!be.writes.is_empty(), "flushed on its own past the limit");
    }
}
