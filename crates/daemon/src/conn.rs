//! One client connection: its socket, credentials, context and outbound queue.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;

use softverbs_ipc::PeerCred;

use crate::dispatch::Session;

/// A reply waiting to be sent (the client's socket buffer was full).
pub(crate) struct Outgoing {
    pub(crate) bytes: Vec<u8>,
    pub(crate) fds: Vec<OwnedFd>,
}

pub(crate) struct Conn {
    pub(crate) sock: OwnedFd,
    pub(crate) session: Session,
    pub(crate) out: VecDeque<Outgoing>,
    /// The socket is charged to the uid's descriptors; if not, the uid was over its share at
    /// accept and the connection only lives to answer its first request with `ENOMEM`.
    pub(crate) charged: bool,
}

impl Conn {
    pub(crate) fn new(sock: OwnedFd, cred: PeerCred, charged: bool) -> Conn {
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", cred.pid))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_default();
        Conn {
            sock,
            session: Session::new(cred, comm),
            out: VecDeque::new(),
            charged,
        }
    }
}

/// Replies queued beyond this many mean the client sends without reading: it is cut off
/// rather than allowed to grow the daemon's memory.
pub(crate) const MAX_QUEUED_REPLIES: usize = 1024;

/// Connections of one uid kept past its descriptors share only to answer `ENOMEM`; more are
/// closed at accept, so a uid that connects without sending cannot hold more than this.
pub(crate) const REFUSED_PER_UID: usize = 8;
