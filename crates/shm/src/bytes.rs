//! Plain memory seen as atomics, for buffers another process may write at any time.

use std::sync::atomic::AtomicU8;

/// Views `buf` as atomic bytes for as long as it is borrowed (what the unstable
/// `AtomicU8::from_mut_slice` does). The exclusive borrow guarantees that no plain reference
/// into the bytes exists while the atomic view does, so another process (the softverbs
/// daemon, a peer's RDMA WRITE) may write them concurrently without undefined behaviour
/// here: this process reads and writes them only through the atomics.
pub fn atomic_bytes(buf: &mut [u8]) -> &[AtomicU8] {
    let len = buf.len();
    let ptr = buf.as_mut_ptr().cast::<AtomicU8>();
    // SAFETY: `AtomicU8` has the size, alignment and bit validity of `u8`, and interior
    // mutability. `ptr..ptr+len` is the memory of `buf`, which stays valid and is borrowed
    // exclusively (so unaliased by any other reference) for the returned lifetime.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn the_view_reads_and_writes_the_buffer() {
        let mut v = vec![1u8, 2, 3];
        let a = atomic_bytes(&mut v);
        a[1].store(9, Ordering::Relaxed);
        assert_eq!(a[0].load(Ordering::Relaxed), 1);
        assert_eq!(v, [1, 9, 3]);
    }
}
