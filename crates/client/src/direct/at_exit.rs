//! What a process that exits without destroying its QPs still owes its peers: the ACKs its
//! net path holds for the program's next round (docs/design/net-path.md, "Order"). A NIC
//! acknowledges a message on arrival whatever the program does next; a held ACK that dies
//! with the process instead ends the peer's request in `RETRY_EXC_ERR` after its retries,
//! for a message that was delivered. `Drop` of the engine and QP destroy send them
//! (`net::Net`); a program that calls `exit(3)` runs neither, so the drop-in registers
//! [`send_held_acks`] with `atexit(3)` (`crates/libibverbs/src/device.rs`).

use std::sync::{Arc, Mutex, TryLockError, Weak};
use std::time::{Duration, Instant};

use super::Inner;

/// The contexts of this process whose net path was started.
static LIVE: Mutex<Vec<Weak<Mutex<Inner>>>> = Mutex::new(Vec::new());

/// How long [`send_held_acks`] waits for a context another thread holds (polling on its
/// way out, or the progress thread mid-round) before it leaves that context's ACKs.
const WAIT: Duration = Duration::from_millis(20);

/// A context's net path started: its held ACKs are sent at exit.
pub(super) fn register(inner: &Arc<Mutex<Inner>>) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(inner));
}

/// Sends the ACKs every live context's net path holds. For the exit of a process that
/// does not destroy its QPs; harmless at any other time (a later round would have sent
/// them). Never blocks for longer than a few [`WAIT`]s: a lock another thread keeps is
/// left alone.
pub fn send_held_acks() {
    let Some(live) = locked(&LIVE, |l| {
        l.iter().filter_map(Weak::upgrade).collect::<Vec<_>>()
    }) else {
        return;
    };
    for inner in live {
        locked(&inner, |g| {
            if let Some(n) = g.net.as_mut() {
                n.send_held_acks();
            }
        });
    }
}

/// `f` on what `m` guards, if it can be had within [`WAIT`].
fn locked<T, R>(m: &Mutex<T>, f: impl FnOnce(&mut T) -> R) -> Option<R> {
    let until = Instant::now() + WAIT;
    loop {
        match m.try_lock() {
            Ok(mut g) => return Some(f(&mut g)),
            Err(TryLockError::Poisoned(p)) => return Some(f(&mut p.into_inner())),
            Err(TryLockError::WouldBlock) if Instant::now() < until => std::thread::yield_now(),
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}
