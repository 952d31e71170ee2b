//! Identifiers: contexts, per-context handles, XRC domains, file identities, and the
//! allocator behind 24-bit QP/SRQ numbers and 32-bit memory keys.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// One client connection (one `ibv_context`). Never reused within a core's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CtxId(pub u64);

/// A per-context object handle, as uverbs hands them out. Values are unique across the
/// whole core (so a value guessed from another context never names anything by accident),
/// but they resolve only inside the context that owns them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Handle(pub u32);

/// A shared XRC domain (global; clients see it only through their own [`Handle`]s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct XrcdId(pub u64);

/// The identity of the file an XRC domain is keyed on: `st_dev` and `st_ino` of the fd the
/// client passed (uverbs keys its xrcd table on the inode; this is the userspace equivalent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FileId {
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub ino: u64,
}

/// Hands out numbers from `first..=last`, sequentially with wrap-around, never one in use.
///
/// Sequential allocation (rather than lowest-free) delays the reuse of a number that was just
/// freed, so a late packet or stale key for a dead object is unlikely to reach a new one.
#[derive(Debug)]
pub struct NumberPool {
    first: u32,
    last: u32,
    next: u32,
    used: HashSet<u32>,
}

impl NumberPool {
    /// A pool of `first..=last`.
    pub fn new(first: u32, last: u32) -> Self {
        assert!(first <= last);
        NumberPool {
            first,
            last,
            next: first,
            used: HashSet::new(),
        }
    }

    /// Takes a free number, or `None` if all are in use.
    pub fn alloc(&mut self) -> Option<u32> {
        let span = u64::from(self.last - self.first) + 1;
        if self.used.len() as u64 >= span {
            return None;
        }
        loop {
            let n = self.next;
            self.next = if n == self.last { self.first } else { n + 1 };
            if self.used.insert(n) {
                return Some(n);
            }
        }
    }

    /// Returns `n` to the pool.
    pub fn free(&mut self, n: u32) {
        self.used.remove(&n);
    }

    /// How many numbers are taken.
    pub fn in_use(&self) -> usize {
        self.used.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_wraps_and_skips_used_numbers() {
        let mut p = NumberPool::new(2, 4);
        assert_eq!(p.alloc(), Some(2));
        assert_eq!(p.alloc(), Some(3));
        p.free(2);
        assert_eq!(p.alloc(), Some(4));
        assert_eq!(p.alloc(), Some(2));
        assert_eq!(p.alloc(), None);
        assert_eq!(p.in_use(), 3);
    }
}
