//! Registered memory that safe code cannot misuse.
//!
//! Two forms, both sound while the daemon (or a peer's RDMA WRITE, READ or atomic) reaches
//! the memory at any moment:
//!
//! * [`OwnedMr`]: the library allocates the memory itself as a sealed memfd mapped
//!   `MAP_SHARED` ([`softverbs_shm::Region`]) and passes the memfd to the daemon with the
//!   registration, so the daemon reaches it with plain copies and CPU atomics, no system
//!   call per access and no conversion in place (`docs/design/registered-memory.md`). The memory
//!   is carved into [`Buf`]s, owned handles to disjoint ranges that move into a work request
//!   and come back with its completion (`crate::wr`).
//! * [`BorrowedMr`]: the caller's own `&'a mut [u8]`, exclusively borrowed for the whole life
//!   of the registration, so the borrow checker rejects an MR that outlives its buffer or
//!   code that touches the buffer while it is registered. The daemon reaches it with
//!   `process_vm_writev`/`readv`.
//!
//! In both, this process sees the bytes only as atomics (relaxed loads and stores, or
//! `&AtomicU64` for 8-byte words), never as `&[u8]`/`&mut [u8]`: another process writing
//! them concurrently is then a value that changes, not undefined behaviour. The raw-address
//! registrations ([`Pd::reg_mr`], [`Pd::reg_mr_shared`]) remain for FFI callers as
//! `unsafe fn`s whose contract says the same thing in prose.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use softverbs_core::types::Access;
use softverbs_shm::Region;

use crate::context::Context;
use crate::error::{errno, Error, Result};
use crate::objects::{Mr, Pd};

/// Which context and PD a registration belongs to, so a work request naming memory of
/// another PD is refused before it reaches the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The context's address (objects borrow it, so it is stable while they live).
    pub(crate) ctx: usize,
    /// The daemon's id of the context.
    pub(crate) ctx_id: u64,
    /// The PD's handle.
    pub(crate) pd: u32,
}

impl Owner {
    pub(crate) fn of(ctx: &Context, pd: u32) -> Owner {
        Owner {
            ctx: std::ptr::from_ref(ctx) as usize,
            ctx_id: ctx.conn.ctx_id,
            pd,
        }
    }
}

/// Where a peer may reach registered memory: the address (iova), length and remote key to
/// send it, e.g. for [`Op::Write`](crate::Op::Write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Remote {
    /// The first byte's address as the peer names it.
    pub addr: u64,
    /// Bytes from `addr`.
    pub len: u64,
    /// The R_Key.
    pub rkey: u32,
}

impl Remote {
    /// The sub-range `[offset, offset + len)`, or `None` if it does not lie inside `self`.
    pub fn slice(&self, offset: u64, len: u64) -> Option<Remote> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then_some(Remote {
            addr: self.addr + offset,
            len,
            rkey: self.rkey,
        })
    }

    /// The 16 bytes a peer needs, for exchanging out of band: `addr` (u64), `len` (u32,
    /// saturated) and `rkey` (u32), little-endian.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&(self.len.min(u64::from(u32::MAX)) as u32).to_le_bytes());
        b[12..].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// The inverse of [`to_bytes`](Remote::to_bytes).
    pub fn from_bytes(b: [u8; 16]) -> Remote {
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(w)
        };
        Remote {
            addr: word(0..8),
            len: word(8..12),
            rkey: word(12..16) as u32,
        }
    }
}

/// The memory of an [`OwnedMr`], shared by it and every [`Buf`] carved from it. It stays
/// mapped in this process while any of them lives; the daemon has its own mapping, removed
/// at deregistration, so neither side's lifetime can make the other touch unmapped memory.
#[derive(Debug)]
pub(crate) struct Shared {
    region: Region,
    /// Bytes registered (the region is rounded up to whole pages).
    len: usize,
    lkey: u32,
    rkey: u32,
    pub(crate) owner: Owner,
}

impl Shared {
    fn addr(&self) -> u64 {
        self.region.addr() as u64
    }
}

/// A memory region whose memory the library allocated as shared memory from birth
/// ([`Pd::alloc_mr`]). Dropping it deregisters it; [`Buf`]s carved from it keep their
/// memory alive (not registered any more, so a post of them completes in error) until they
/// are dropped too.
#[derive(Debug)]
pub struct OwnedMr<'a> {
    mr: Mr<'a>,
    mem: Arc<Shared>,
    /// Bytes not yet handed out by [`take`](OwnedMr::take).
    next: usize,
}

/// `offset + len` when that lies in `0..=size`.
fn inside(offset: usize, len: usize, size: usize) -> Result<usize> {
    offset
        .checked_add(len)
        .filter(|&end| end <= size)
        .ok_or(Error::new("buffer_range", errno::EINVAL))
}

impl<'c> Pd<'c> {
    /// `ibv_reg_mr` of `len` new zeroed bytes that the library allocates as a sealed memfd
    /// and hands to the daemon with the registration, so it reaches them without a system
    /// call (the fast path of `docs/design/registered-memory.md`, with no conversion in place).
    /// Carve the memory into [`Buf`]s with [`OwnedMr::take`].
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<OwnedMr<'_>> {
        const OP: &str = "alloc_mr";
        if len == 0 {
            return Err(Error::new(OP, errno::EINVAL));
        }
        let page = softverbs_memaccess::page_size();
        let size = len
            .checked_next_multiple_of(page)
            .ok_or(Error::new(OP, errno::ENOMEM))?;
        let (region, fd) =
            Region::create("softverbs-mr", size).map_err(|e| Error::from_io(OP, &e))?;
        let addr = region.addr() as u64;
        let mr = self.reg_mr_with(addr, len as u64, addr, access, Some(fd))?;
        let mem = Arc::new(Shared {
            region,
            len,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            owner: Owner::of(self.ctx, self.handle),
        });
        Ok(OwnedMr { mr, mem, next: 0 })
    }

    /// `ibv_reg_mr` of the caller's `buf`, borrowed for the whole life of the registration:
    /// the buffer cannot be touched, moved or freed until the [`BorrowedMr`] is dropped
    /// (which deregisters it), and meanwhile is read and written through the MR's atomic
    /// copies. The daemon reaches it with `process_vm_readv`/`writev`.
    pub fn reg_slice<'a>(&'a self, buf: &'a mut [u8], access: Access) -> Result<BorrowedMr<'a>> {
        if buf.is_empty() {
            return Err(Error::new("reg_slice", errno::EINVAL));
        }
        self.reg_view(View::Bytes(softverbs_shm::atomic_bytes(buf)), access)
    }

    /// `ibv_reg_mr` of atomic words the caller borrows to the MR for its whole life and may
    /// keep using meanwhile (atomics may change under any observer, so the daemon writing
    /// them is sound): e.g. a flag word a peer's RDMA WRITE ends with, polled with
    /// `Acquire` loads.
    pub fn reg_words<'a>(
        &'a self,
        words: &'a [AtomicU64],
        access: Access,
    ) -> Result<BorrowedMr<'a>> {
        if words.is_empty() {
            return Err(Error::new("reg_words", errno::EINVAL));
        }
        self.reg_view(View::Words(words), access)
    }

    fn reg_view<'a>(&'a self, view: View<'a>, access: Access) -> Result<BorrowedMr<'a>> {
        let addr = view.addr();
        let mr = self.reg_mr_with(addr, view.len() as u64, addr, access, None)?;
        Ok(BorrowedMr { mr: Some(mr), view })
    }
}

impl<'a> OwnedMr<'a> {
    /// The underlying registration (handle and keys).
    pub fn mr(&self) -> &Mr<'a> {
        &self.mr
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mem.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mem.rkey
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Always `false`: an MR is never empty.
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }

    /// The whole region as peers address it.
    pub fn remote(&self) -> Remote {
        Remote {
            addr: self.mem.addr(),
            len: self.mem.len as u64,
            rkey: self.mem.rkey,
        }
    }

    /// Bytes not yet handed out.
    pub fn remaining(&self) -> usize {
        self.mem.len - self.next
    }

    /// The next `len` bytes not yet handed out, as a [`Buf`] (`EINVAL` if fewer remain).
    /// Bufs of one MR never overlap, so owning one is owning its bytes.
    pub fn take(&mut self, len: usize) -> Result<Buf> {
        let end = inside(self.next, len, self.mem.len)?;
        let buf = Buf {
            mem: self.mem.clone(),
            offset: self.next,
            len,
        };
        self.next = end;
        Ok(buf)
    }

    /// Every byte not yet handed out, as one [`Buf`].
    pub fn take_rest(&mut self) -> Buf {
        let n = self.remaining();
        self.take(n).expect("the rest is inside")
    }

    /// `ibv_dereg_mr`, reporting the daemon's answer.
    pub fn dereg(self) -> Result<()> {
        self.mr.dereg()
    }
}

/// An owned range of an [`OwnedMr`]'s memory: what the owning API posts. Posting moves it
/// into the work request and the completion hands it back
/// ([`Completion::buf`](crate::Completion)), so while the daemon may access it nobody else
/// holds it. Its bytes are copied in and out with [`read`](Buf::read) and
/// [`write`](Buf::write) (atomic copies, sound even if a peer writes them at the same time
/// through the region's R_Key).
#[derive(Debug)]
pub struct Buf {
    pub(crate) mem: Arc<Shared>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl Buf {
    /// Bytes in this buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte's address (the iova the MR registered it under).
    pub fn addr(&self) -> u64 {
        self.mem.addr() + self.offset as u64
    }

    /// The MR's local key.
    pub fn lkey(&self) -> u32 {
        self.mem.lkey
    }

    /// This buffer as a peer addresses it (with the MR's R_Key).
    pub fn remote(&self) -> Remote {
        Remote {
            addr: self.addr(),
            len: self.len as u64,
            rkey: self.mem.rkey,
        }
    }

    /// Copies `dst.len()` bytes from `offset` out of the buffer (`EINVAL` outside it).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        inside(offset, dst.len(), self.len)?;
        self.mem.region.read(self.offset + offset, dst);
        Ok(())
    }

    /// Copies `src` into the buffer at `offset` (`EINVAL` outside it).
    pub fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        inside(offset, src.len(), self.len)?;
        self.mem.region.write(self.offset + offset, src);
        Ok(())
    }

    /// The whole buffer, copied out.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.mem.region.read(self.offset, &mut v);
        v
    }

    /// Sets every byte to `byte`.
    pub fn fill(&mut self, byte: u8) {
        let chunk = [byte; 256];
        let mut at = 0;
        while at < self.len {
            let n = (self.len - at).min(chunk.len());
            self.mem.region.write(self.offset + at, &chunk[..n]);
            at += n;
        }
    }

    /// The 8-byte word at `offset` as an atomic, the same word a peer's RDMA atomic
    /// (`ATOMIC_CMP_AND_SWP`, `ATOMIC_FETCH_AND_ADD`) updates: the daemon performs those
    /// with CPU atomics on its mapping of the same memory, so this is atomic with respect to
    /// them (`IBV_ATOMIC_GLOB`). `EINVAL` unless `offset` is 8-aligned (in the MR) and
    /// inside the buffer.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        inside(offset, 8, self.len)?;
        let at = self.offset + offset;
        if at % 8 != 0 {
            return Err(Error::new("buffer_range", errno::EINVAL));
        }
        Ok(&self.mem.region.atomic_u64s(at, 1)[0])
    }

    /// The whole buffer as 8-byte atomic words (`EINVAL` unless it starts 8-aligned in the
    /// MR and is a whole number of words), for code that polls a word a peer's WRITE ends
    /// with.
    pub fn atomic_words(&self) -> Result<&[AtomicU64]> {
        if self.offset % 8 != 0 || self.len % 8 != 0 {
            return Err(Error::new("buffer_range", errno::EINVAL));
        }
        Ok(self.mem.region.atomic_u64s(self.offset, self.len / 8))
    }

    /// Splits the buffer at `mid` into `[0, mid)` and `[mid, len)` (`EINVAL` if `mid` is past
    /// the end; the buffer comes back in the error).
    pub fn split_at(self, mid: usize) -> std::result::Result<(Buf, Buf), (Error, Buf)> {
        if mid > self.len {
            return Err((Error::new("buffer_range", errno::EINVAL), self));
        }
        let tail = Buf {
            mem: self.mem.clone(),
            offset: self.offset + mid,
            len: self.len - mid,
        };
        Ok((
            Buf {
                mem: self.mem,
                offset: self.offset,
                len: mid,
            },
            tail,
        ))
    }

    /// Joins `self` with `next`, the buffer that starts where `self` ends in the same MR
    /// (both come back otherwise).
    pub fn unsplit(self, next: Buf) -> std::result::Result<Buf, (Buf, Buf)> {
        if Arc::ptr_eq(&self.mem, &next.mem) && self.offset + self.len == next.offset {
            Ok(Buf {
                len: self.len + next.len,
                ..self
            })
        } else {
            Err((self, next))
        }
    }
}

/// A memory region over the caller's buffer, borrowed for the registration's whole life
/// ([`Pd::reg_slice`]). Dropping it deregisters it, and only then does the buffer's borrow
/// end. While registered, the bytes are reached through [`read`](BorrowedMr::read) and
/// [`write`](BorrowedMr::write) (atomic copies), so a peer or the daemon writing them at
/// the same time is not undefined behaviour.
#[derive(Debug)]
pub struct BorrowedMr<'a> {
    /// `Some` until dropped.
    mr: Option<Mr<'a>>,
    view: View<'a>,
}

/// How this process sees borrowed registered memory: always as atomics.
#[derive(Clone, Copy, Debug)]
enum View<'a> {
    /// A `&mut [u8]` the MR borrowed exclusively.
    Bytes(&'a [AtomicU8]),
    /// Atomic words the caller keeps reading and writing too (sound: they are atomics).
    Words(&'a [AtomicU64]),
}

impl View<'_> {
    fn addr(&self) -> u64 {
        match self {
            View::Bytes(b) => b.as_ptr() as u64,
            View::Words(w) => w.as_ptr() as u64,
        }
    }

    fn len(&self) -> usize {
        match self {
            View::Bytes(b) => b.len(),
            View::Words(w) => w.len() * 8,
        }
    }

    fn load(&self, i: usize) -> u8 {
        match self {
            View::Bytes(b) => b[i].load(Ordering::Relaxed),
            View::Words(w) => w[i / 8].load(Ordering::Relaxed).to_ne_bytes()[i % 8],
        }
    }

    fn store(&self, i: usize, v: u8) {
        match self {
            View::Bytes(b) => b[i].store(v, Ordering::Relaxed),
            View::Words(w) => {
                let _ = w[i / 8].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| {
                    let mut b = x.to_ne_bytes();
                    b[i % 8] = v;
                    Some(u64::from_ne_bytes(b))
                });
            }
        }
    }
}

impl<'a> BorrowedMr<'a> {
    /// The underlying registration (handle and keys).
    pub fn mr(&self) -> &Mr<'a> {
        self.mr.as_ref().expect("registered until dropped")
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr().lkey()
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr().rkey()
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.view.len()
    }

    /// Always `false`: an MR is never empty.
    pub fn is_empty(&self) -> bool {
        self.view.len() == 0
    }

    /// The first byte's address (the iova).
    pub fn addr(&self) -> u64 {
        self.view.addr()
    }

    /// The words registered with [`Pd::reg_words`] (`None` for a byte buffer).
    pub fn words(&self) -> Option<&'a [AtomicU64]> {
        match self.view {
            View::Words(w) => Some(w),
            View::Bytes(_) => None,
        }
    }

    /// The whole region as peers address it.
    pub fn remote(&self) -> Remote {
        Remote {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey(),
        }
    }

    /// The scatter/gather entry for `[offset, offset + len)`, checked to lie inside the MR
    /// (`EINVAL` otherwise), for [`Qp::post_send`](crate::Qp::post_send) and
    /// [`Qp::post_recv`](crate::Qp::post_recv).
    pub fn sge(&self, offset: usize, len: usize) -> Result<crate::Sge> {
        inside(offset, len, self.len())?;
        Ok(crate::Sge {
            addr: self.addr() + offset as u64,
            length: u32::try_from(len).map_err(|_| Error::new("buffer_range", errno::EINVAL))?,
            lkey: self.lkey(),
        })
    }

    /// Copies `dst.len()` bytes from `offset` out of the MR (`EINVAL` outside it).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        inside(offset, dst.len(), self.len())?;
        for (i, d) in dst.iter_mut().enumerate() {
            *d = self.view.load(offset + i);
        }
        Ok(())
    }

    /// Copies `src` into the MR at `offset` (`EINVAL` outside it).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        inside(offset, src.len(), self.len())?;
        for (i, s) in src.iter().enumerate() {
            self.view.store(offset + i, *s);
        }
        Ok(())
    }

    /// The whole MR, copied out.
    pub fn to_vec(&self) -> Vec<u8> {
        (0..self.len()).map(|i| self.view.load(i)).collect()
    }

    /// `ibv_rereg_mr` of the access flags only (`IBV_REREG_MR_CHANGE_ACCESS`): the MR keeps
    /// its memory, PD, handle and keys, so keys a peer already holds see the new access. Sound
    /// for any access: this process reaches the memory only through atomics, whoever else
    /// may write it. On error the MR is unchanged.
    pub fn rereg_access(&mut self, access: Access) -> Result<()> {
        self.mr
            .as_mut()
            .expect("registered until dropped")
            .rereg(None, Some(access), None)
    }

    /// `ibv_dereg_mr`, reporting the daemon's answer.
    pub fn dereg(mut self) -> Result<()> {
        let mr = self.mr.take().expect("registered until dropped");
        let r = mr.dereg();
        settle(r)
    }
}

/// After a failed deregistration of borrowed memory the daemon might still write it once
/// the borrow ends, so the only sound outcomes are "the daemon is gone" (its connection
/// failed: a closed connection ends every access, as process exit does) or stopping the
/// process.
fn settle(r: Result<()>) -> Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.errno(),
                errno::ECONNRESET | errno::EPIPE | errno::ENOTCONN
            ) =>
        {
            Err(e)
        }
        Err(e) => {
            eprintln!("softverbs: {e} for borrowed memory that is still registered; aborting");
            std::process::abort()
        }
    }
}

impl Drop for BorrowedMr<'_> {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            let _ = settle(mr.dereg());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_slices_stay_inside_and_round_trip_as_bytes() {
        let r = Remote {
            addr: 0x7f00_0000_1000,
            len: 4096,
            rkey: 0xabcd,
        };
        assert_eq!(
            r.slice(4000, 96),
            Some(Remote {
                addr: 0x7f00_0000_1000 + 4000,
                len: 96,
                rkey: 0xabcd
            })
        );
        assert_eq!(r.slice(4000, 97), None);
        assert_eq!(r.slice(u64::MAX, 2), None, "no overflow");
        assert_eq!(Remote::from_bytes(r.to_bytes()), r);
    }

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert_eq!(inside(0, 10, 10).unwrap(), 10);
        assert!(inside(1, 10, 10).is_err());
        assert!(inside(usize::MAX, 2, 10).is_err());
    }

    #[test]
    fn views_of_bytes_and_words_read_and_write_the_same_way() {
        let mut bytes = [0u8; 16];
        let words = [AtomicU64::new(0), AtomicU64::new(0)];
        for v in [
            View::Bytes(softverbs_shm::atomic_bytes(&mut bytes)),
            View::Words(&words),
        ] {
            assert_eq!(v.len(), 16);
            for i in 0..16 {
                v.store(i, i as u8 * 3);
            }
            assert_eq!(
                (0..16).map(|i| v.load(i)).collect::<Vec<_>>(),
                (0..16).map(|i| i as u8 * 3).collect::<Vec<_>>()
            );
        }
        assert_eq!(words[1].load(Ordering::Relaxed).to_ne_bytes()[0], 24);
    }
}
