//! A child created by `fork()` gets its own copy of the memory [`share_in_place`] converted,
//! as it would of the `malloc`ed memory the program registered (docs/design/registered-memory.md,
//! "fork"). Converted pages are `MAP_SHARED`, which `fork` would leave shared between parent
//! and child: the child's writes (to the buffer, or to malloc's metadata on its first and
//! last page) would land in the parent's memory and the parent's, and its peers' RDMA
//! writes, in the child's. Linux ≥ 5.8 gives a child its own copy of DMA-pinned anonymous
//! pages at fork, so that is also what a program registering with a NIC sees.
//!
//! How: a `pthread_atfork(3)` child handler, installed when the drop-in library is loaded
//! ([`install_fork_handler`], called from its ELF constructor, so that it is registered
//! before any handler of the program's own and, child handlers running in registration order,
//! runs before them: a program's child handler that writes a registered buffer then writes
//! the child's copy), else at the first conversion; it finds
//! every mapping of a memfd of ours in `/proc/self/maps` and moves a private copy of it over
//! it, in the child, before `fork` returns there. The child has one thread then, so nothing
//! writes the pages during the move. What the copy holds is the pages at that moment: a write
//! the parent's other threads (or a peer, through RDMA) make between `fork` and the copy may
//! be in it, as a DMA into a pinned page during the kernel's copy may be. A peer's memory
//! that the direct path mapped is kept out of children altogether (`MADV_DONTFORK`).
//! Children made with `vfork` or `posix_spawn` share the parent's memory until they exec
//! anyway. Children made with `_Fork()` or a raw `clone` system call run no handler at all:
//! they keep sharing converted pages with the parent (docs/design/registered-memory.md, "What
//! registration must not change"); a program that makes such children and writes registered
//! memory in them should run with `SOFTVERBS_SHARED_MR=0`.
//!
//! [`share_in_place`]: crate::share_in_place

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use rustix::mm::{mprotect, MprotectFlags};

use crate::client::MapsLine;
use crate::map::Mapping;

/// Whether this process converted anything yet: until then the child handler has nothing
/// to look for and returns at once (it runs in every child of every program that loads the
/// drop-in).
static CONVERTED: AtomicBool = AtomicBool::new(false);

/// Installs the child handler once per process, without marking anything converted: what the
/// drop-in's ELF constructor calls, so that the handler comes before the program's own.
pub fn install_fork_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that glibc runs in the child of every fork(), with
        // no arguments; `privatize_in_child` neither unwinds (it catches nothing because it
        // cannot panic: no indexing or unwrapping) nor keeps state between calls.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(privatize_in_child)) };
        if rc != 0 {
            eprintln!(
                "softverbs: pthread_atfork failed ({rc}): a forked child would share registered \
                 pages with its parent"
            );
        }
    });
}

/// Installs the child handler (if the drop-in's constructor did not) and arms it: called by
/// each conversion.
pub(crate) fn install() {
    install_fork_handler();
    CONVERTED.store(true, Ordering::Release);
}

extern "C" fn privatize_in_child() {
    if !CONVERTED.load(Ordering::Acquire) {
        return;
    }
    // Nothing here may allocate before the pages are private: the heap's own pages (a
    // registered `malloc`ed buffer, its neighbours, the free chunks beside it) may be
    // converted ones, still shared with the parent, and malloc writes its bookkeeping into
    // free chunks, i.e. into the parent's heap ("malloc(): mismatching next->prev_size" in
    // the parent, tests/c/mem_semantics.c). So the file is read into a buffer on the stack
    // and parsed in place; the path is a C string literal (no conversion).
    let Ok(maps) = rustix::fs::open(
        c"/proc/self/maps",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return;
    };
    // A maps line is at most a path (PATH_MAX, 4096) and ~100 bytes before it.
    let mut buf = [0u8; 8192];
    let mut have = 0;
    loop {
        let n = match rustix::io::read(&maps, &mut buf[have..]) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => 0,
        };
        have += n;
        let mut done = 0;
        while let Some(nl) = buf[done..have].iter().position(|&b| b == b'\n') {
            privatize_line(&buf[done..done + nl]);
            done += nl + 1;
        }
        if n == 0 {
            // End of file (or an error): a last line without a newline, if any.
            privatize_line(&buf[done..have]);
            return;
        }
        buf.copy_within(done..have, 0);
        have -= done;
        if have == buf.len() {
            have = 0; // A line longer than any maps line can be: not one of ours.
        }
    }
}

/// Privatizes the mapping one `/proc/self/maps` line describes if it is one of ours.
fn privatize_line(line: &[u8]) {
    let Ok(line) = std::str::from_utf8(line) else {
        return;
    };
    let Some(m) = MapsLine::parse(line) else {
        return;
    };
    if !m.converted_by_us() || !m.perms.starts_with('r') || m.end <= m.start {
        // Not ours, or unreadable (the program made it PROT_NONE): nothing to copy.
        return;
    }
    let writable = m.perms.as_bytes().get(1) == Some(&b'w');
    let _ = privatize(m.start, m.end - m.start, writable);
}

/// Moves a private copy over `[lo, lo + n)`, keeping it read-only if it was.
fn privatize(lo: usize, n: usize, writable: bool) -> std::io::Result<()> {
    crate::client::in_pieces(lo, n, |_, len| Mapping::private_anonymous(len))?;
    if !writable {
        // SAFETY: takes write permission away from exactly the range just moved in, which
        // was read-only before; nothing in this (single-threaded) child holds a reference
        // that writes it.
        unsafe { mprotect(lo as *mut std::ffi::c_void, n, MprotectFlags::READ) }?;
    }
    Ok(())
}
