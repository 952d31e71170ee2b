//! The verbs an rsocket's data path uses: registered regions and the inline verbs of
//! `infiniband/verbs.h` (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`), which C code
//! calls through `ibv_context.ops`; the drop-in libibverbs fills those slots
//! (crates/libibverbs/src/ffi.rs pins their offsets: poll_cq 96, post_send 208,
//! post_recv 216).

use core::ffi::{c_int, c_void};

use crate::ffi::{ibv_context, ibv_qp};

/// `struct ibv_sge`.
#[repr(C)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct RecvWr {
    pub wr_id: u64,
    pub next: *mut RecvWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
}

/// `struct ibv_send_wr` (128 bytes); only the `wr.rdma` member of its unions is used.
#[repr(C)]
pub struct SendWr {
    pub wr_id: u64,
    pub next: *mut SendWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pad: [u8; 76],
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct Mr {
    pub context: *mut ibv_context,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<SendWr>() == 128);
    assert!(offset_of!(SendWr, opcode) == 28);
    assert!(offset_of!(SendWr, imm_data) == 36);
    assert!(offset_of!(SendWr, remote_addr) == 40);
    assert!(offset_of!(SendWr, rkey) == 48);
    assert!(size_of::<RecvWr>() == 32);
    assert!(size_of::<Wc>() == 48);
    assert!(offset_of!(Wc, byte_len) == 20);
    assert!(offset_of!(Wc, wc_flags) == 36);
    assert!(offset_of!(Mr, lkey) == 36);
};

/// `enum ibv_wr_opcode`.
pub const WR_RDMA_WRITE: u32 = 0;
pub const WR_SEND: u32 = 2;
pub const WR_SEND_WITH_IMM: u32 = 3;
/// `IBV_SEND_SIGNALED`.
pub const SEND_SIGNALED: u32 = 2;
/// `IBV_WC_RECV`: receive opcodes have this bit.
pub const WC_RECV: u32 = 128;
/// `IBV_WC_WITH_IMM`.
pub const WC_WITH_IMM: u32 = 2;
/// `IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE`.
pub const ACCESS_LOCAL_REMOTE_WRITE: c_int = 1 | 2;

#[link(name = "ibverbs")]
unsafe extern "C" {
    pub fn ibv_reg_mr(pd: *mut c_void, addr: *mut c_void, len: usize, access: c_int) -> *mut Mr;
    pub fn ibv_dereg_mr(mr: *mut Mr) -> c_int;
    pub fn ibv_dealloc_pd(pd: *mut c_void) -> c_int;
}

type PostSend = unsafe extern "C" fn(*mut ibv_qp, *mut SendWr, *mut *mut SendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut ibv_qp, *mut RecvWr, *mut *mut RecvWr) -> c_int;
type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut Wc) -> c_int;

/// The op in the context's `ops` table at `off` bytes from the context.
///
/// # Safety
/// `ctx` is a live context of the drop-in libibverbs and `off` one of its op slots of type `T`.
unsafe fn op<T: Copy>(ctx: *mut ibv_context, off: usize) -> T {
    // SAFETY: the caller's promise; the slot holds a function pointer of type `T`.
    unsafe { *(ctx.cast::<u8>().add(off).cast::<T>()) }
}

/// Posts one signaled send work request of one SGE.
///
/// # Safety
/// `qp` is a live QP and the SGE lies in a region registered on its PD.
pub unsafe fn post_send(
    qp: *mut ibv_qp,
    wr_id: u64,
    opcode: u32,
    imm: u32,
    sge: Sge,
    remote: (u64, u32),
) -> Result<(), i32> {
    let mut sge = sge;
    let mut wr = SendWr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: if sge.length == 0 { 0 } else { 1 },
        opcode,
        send_flags: SEND_SIGNALED,
        imm_data: imm,
        remote_addr: remote.0,
        rkey: remote.1,
        pad: [0; 76],
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: the caller's promise; `ops.post_send` of the QP's context.
    let r = unsafe {
        let f: PostSend = op((*qp).context, 208);
        f(qp, &mut wr, &mut bad)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(r)
    }
}

/// Posts one receive of one SGE.
///
/// # Safety
/// As [`post_send`].
pub unsafe fn post_recv(qp: *mut ibv_qp, wr_id: u64, sge: Sge) -> Result<(), i32> {
    let mut sge = sge;
    let mut wr = RecvWr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: the caller's promise; `ops.post_recv` of the QP's context.
    let r = unsafe {
        let f: PostRecv = op((*qp).context, 216);
        f(qp, &mut wr, &mut bad)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(r)
    }
}

/// Polls up to `wc.len()` completions.
///
/// # Safety
/// `cq` is a live CQ of context `ctx`.
pub unsafe fn poll_cq(ctx: *mut ibv_context, cq: *mut c_void, wc: &mut [Wc]) -> c_int {
    // SAFETY: the caller's promise; `ops.poll_cq`.
    unsafe {
        let f: PollCq = op(ctx, 96);
        f(cq, wc.len() as c_int, wc.as_mut_ptr())
    }
}

/// An anonymous mapping registered on a PD.
pub struct Region {
    pub base: *mut u8,
    pub len: usize,
    pub mr: *mut Mr,
}

impl Region {
    pub fn new(pd: *mut c_void, len: usize) -> Result<Region, i32> {
        // SAFETY: a fresh private anonymous mapping.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(libc::ENOMEM);
        }
        // SAFETY: the mapping just made, kept until `drop` deregisters it.
        let mr = unsafe { ibv_reg_mr(pd, base, len, ACCESS_LOCAL_REMOTE_WRITE) };
        if mr.is_null() {
            // SAFETY: ours, unused.
            unsafe { libc::munmap(base, len) };
            return Err(libc::ENOMEM);
        }
        Ok(Region {
            base: base.cast(),
            len,
            mr,
        })
    }

    pub fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.base as u64 + off as u64,
            length: len as u32,
            // SAFETY: our registered MR.
            lkey: unsafe { (*self.mr).lkey },
        }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: our registered MR.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: our MR and mapping; no work request refers to them any more (the QP is
        // destroyed first).
        unsafe {
            ibv_dereg_mr(self.mr);
            libc::munmap(self.base.cast(), self.len);
        }
    }
}
