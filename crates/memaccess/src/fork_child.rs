//! A child created by `fork()` gets its own copy of the memory [`share_in_place`] converted,
//! as it would of the `malloc`ed memory the program registered (docs/registered-memory.md,
//! "fork"). Converted pages are `MAP_SHARED`, which `fork` would leave shared between parent
//! and child: the child's writes (to the buffer, or to malloc's metadata on its first and
//! last page) would land in the parent's memory and the parent's, and its peers' RDMA
//! writes, in the child's. Linux ≥ 5.8 gives a child its own copy of DMA-pinned anonymous
//! pages at fork, so that is also what a program registering with a NIC sees.
//!
//! How: a `pthread_atfork(3)` child handler, installed at the first conversion, which finds
//! every mapping of a memfd of ours in `/proc/self/maps` and moves a private copy of it over
//! it, in the child, before `fork` returns there. The child has one thread then, so nothing
//! writes the pages during the move. What the copy holds is the pages at that moment: a write
//! the parent's other threads (or a peer, through RDMA) make between `fork` and the copy may
//! be in it, as a DMA into a pinned page during the kernel's copy may be. A peer's memory
//! that the direct path mapped is kept out of children altogether (`MADV_DONTFORK`).
//! Children made with `vfork`, `posix_spawn` or `clone` without `fork`'s handlers share the
//! parent's memory anyway or exec at once; they run no handler.
//!
//! [`share_in_place`]: crate::share_in_place

use std::sync::Once;

use rustix::mm::{mprotect, MprotectFlags};

use crate::client::MapsLine;
use crate::map::Mapping;

/// Installs the child handler once per process.
pub(crate) fn install() {
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

extern "C" fn privatize_in_child() {
    // Reading the file allocates: glibc's fork leaves malloc usable in the child, which is
    // what a child handler may rely on.
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    for line in maps.lines() {
        let Some(m) = MapsLine::parse(line) else {
            continue;
        };
        if !m.converted_by_us() || !m.perms.starts_with('r') || m.end <= m.start {
            // Not ours, or unreadable (the program made it PROT_NONE): nothing to copy.
            continue;
        }
        let writable = m.perms.as_bytes().get(1) == Some(&b'w');
        let _ = privatize(m.start, m.end - m.start, writable);
    }
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
