//! The daemon's death as a device fatal error (`IBV_EVENT_DEVICE_FATAL`, ibv_get_async_event(3)).
//!
//! The daemon plays the device: when its process dies the kernel closes its end of every
//! context's socket. One watcher thread per process sleeps in `epoll_wait` on all the
//! context sockets of the process, asking only for hang-ups (a reply arriving on a socket
//! is no event), so the data path pays nothing for it: posting and polling never make a
//! system call to find out, they read one flag. When a socket hangs up the watcher marks its
//! context dead and signals the context's async eventfd and every completion-channel eventfd,
//! so a program asleep in `ibv_get_async_event`, `ibv_get_cq_event` or `poll()` on those fds
//! wakes up. A call that finds the connection gone before the watcher does marks it the same
//! way. What happens next is the kernel's behaviour for a device that disappears (uverbs
//! "disassociate"): the async fd yields one `IBV_EVENT_DEVICE_FATAL` and then `EIO`, event
//! fds stay readable, commands fail with `EIO`, destroy calls succeed, and outstanding work
//! completes with `IBV_WC_WR_FLUSH_ERR` (see `crate::flush` and docs/guide/dropin.md, "When the
//! daemon dies").

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use softverbs_ipc::{signal_eventfd, HangupSet};

/// Whether a context's device is gone, and the descriptors to wake when it goes.
#[derive(Debug)]
pub(crate) struct Fatal {
    dead: AtomicBool,
    /// The one `IBV_EVENT_DEVICE_FATAL` was handed out.
    reported: AtomicBool,
    async_fd: Arc<OwnedFd>,
    /// Completion-channel eventfds by channel handle.
    channels: Mutex<HashMap<u32, Arc<OwnedFd>>>,
}

impl Fatal {
    pub(crate) fn new(async_fd: Arc<OwnedFd>) -> Arc<Fatal> {
        Arc::new(Fatal {
            dead: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            async_fd,
            channels: Mutex::new(HashMap::new()),
        })
    }

    /// Whether the device is gone. Acquire: everything the daemon wrote into shared memory
    /// before it died is visible once this says so (the watcher learnt of the death from the
    /// kernel after the process was gone).
    #[inline]
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Marks the device gone and wakes every sleeper (once).
    pub(crate) fn die(&self) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        // Channels first: a program woken by the async event finds its channels readable.
        for fd in self.lock_channels().values() {
            signal_eventfd(fd.as_fd());
        }
        signal_eventfd(self.async_fd.as_fd());
    }

    /// Whether this call hands out the device fatal event (the first after death does).
    pub(crate) fn take_event(&self) -> bool {
        !self.reported.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn add_channel(&self, handle: u32, fd: Arc<OwnedFd>) {
        if self.is_dead() {
            signal_eventfd(fd.as_fd());
        }
        self.lock_channels().insert(handle, fd);
    }

    pub(crate) fn remove_channel(&self, handle: u32) {
        self.lock_channels().remove(&handle);
    }

    fn lock_channels(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<OwnedFd>>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The process's watcher: its epoll set and what each key stands for.
struct Watcher {
    set: HangupSet,
    watched: Mutex<HashMap<u64, Weak<Fatal>>>,
}

impl Watcher {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Weak<Fatal>>> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(&self) {
        while let Ok(keys) = self.set.wait() {
            for k in keys {
                let f = self.lock().remove(&k).and_then(|w| w.upgrade());
                if let Some(f) = f {
                    f.die();
                }
            }
        }
    }
}

/// The watcher of this process, with the pid it was started in: a child made by `fork()`
/// inherits the parent's epoll instance but not its thread, and starts its own.
static WATCHER: Mutex<Option<(u32, Arc<Watcher>)>> = Mutex::new(None);
/// Keys are never reused, so a late hang-up of a closed context names nothing.
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

fn watcher() -> Option<Arc<Watcher>> {
    let pid = std::process::id();
    let mut g = WATCHER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, w)) = &*g {
        if *p == pid {
            return Some(w.clone());
        }
    }
    let w = Arc::new(Watcher {
        set: HangupSet::new().ok()?,
        watched: Mutex::new(HashMap::new()),
    });
    let run = w.clone();
    std::thread::Builder::new()
        .name("softverbs-watch".into())
        .stack_size(64 * 1024)
        .spawn(move || run.run())
        .ok()?;
    *g = Some((pid, w.clone()));
    Some(w)
}

/// One context socket in the watcher's set.
pub(crate) struct Watch {
    watcher: Arc<Watcher>,
    key: u64,
    pid: u32,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("key", &self.key).finish()
    }
}

/// Watches `sock` for the daemon's death on behalf of `fatal`. `None` when no watcher can
/// run (no epoll, no thread): then death is noticed by the first call that fails.
pub(crate) fn watch(sock: BorrowedFd<'_>, fatal: &Arc<Fatal>) -> Option<Watch> {
    let watcher = watcher()?;
    let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    watcher.lock().insert(key, Arc::downgrade(fatal));
    if watcher.set.add(sock, key).is_err() {
        watcher.lock().remove(&key);
        return None;
    }
    Some(Watch {
        watcher,
        key,
        pid: std::process::id(),
    })
}

impl Watch {
    /// Stops watching `sock` (before it is closed). In a forked child the epoll instance is
    /// the parent's, whose watch must stay, so the child only forgets its copy.
    pub(crate) fn end(self, sock: BorrowedFd<'_>) {
        if std::process::id() != self.pid {
            return;
        }
        self.watcher.lock().remove(&self.key);
        self.watcher.set.remove(sock);
    }
}
