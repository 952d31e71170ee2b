//! The thin I/O layer both ends of the softverbs socket share: `SOCK_SEQPACKET` Unix sockets
//! carrying one command per datagram, file descriptors passed with `SCM_RIGHTS`, the peer's
//! credentials (`SO_PEERCRED`), and the eventfd/memfd helpers. Everything goes through
//! rustix's safe wrappers; there is no `unsafe` here.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::event::{eventfd, EventfdFlags};
use rustix::fs::{fstat, memfd_create, MemfdFlags};
use rustix::io::Errno;
use rustix::net::{
    accept_with, bind, connect, listen, recvmsg, sendmsg, socket_with, sockopt, AddressFamily,
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

pub mod private_dir;

pub use rustix::io::Errno as IpcErrno;

/// Most file descriptors one message may carry; more is a protocol violation.
pub const MAX_FDS: usize = 2;

/// One received datagram.
#[derive(Debug)]
pub struct Datagram {
    /// Bytes received (at most the buffer size).
    pub len: usize,
    /// The datagram did not fit the buffer (a framing error for the daemon).
    pub truncated: bool,
    /// Descriptors that came with it (closed when dropped).
    pub fds: Vec<OwnedFd>,
    /// More descriptors were sent than fit (they were closed by the kernel).
    pub fds_truncated: bool,
    /// The process that sent it (`SCM_CREDENTIALS`, on a socket with [`pass_credentials`];
    /// `None` otherwise or when the sender is not visible in this pid namespace).
    pub sender_pid: Option<u32>,
}

/// The system daemon's socket: the one daemon that serves every user of a host (run by root,
/// e.g. from `softverbs.service`; docs/guide/multi-user.md).
pub const SYSTEM_SOCKET: &str = "/run/softverbs/softverbs.sock";

/// Where a client finds the daemon, in this order (docs/guide/multi-user.md):
///
/// 1. `$SOFTVERBS_SOCKET` (an explicit setting always wins);
/// 2. [`SYSTEM_SOCKET`], when a daemon answers there ([`system_daemon`]), whatever
///    `$XDG_RUNTIME_DIR` says: one system daemon serves all users of a host;
/// 3. else this user's own daemon, [`own_socket_path`] (which a client autostarts).
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SOFTVERBS_SOCKET") {
        return PathBuf::from(p);
    }
    if system_daemon() {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    own_socket_path()
}

/// Where this user's own daemon listens (and where `softverbs daemon` binds by default):
/// `$SOFTVERBS_SOCKET`, else `$XDG_RUNTIME_DIR/softverbs/softverbs.sock`, else
/// [`SYSTEM_SOCKET`] (root's own daemon is the system daemon).
pub fn own_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SOFTVERBS_SOCKET") {
        return PathBuf::from(p);
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        Some(x) => PathBuf::from(x).join("softverbs").join("softverbs.sock"),
        None => PathBuf::from(SYSTEM_SOCKET),
    }
}

/// Whether a daemon answers at [`SYSTEM_SOCKET`]: its directory is root's (or this user's)
/// and writable by no one else ([`private_dir::open_checked`], so no other user can have
/// put a socket there), and a connect succeeds. The probe connection is closed at once; a
/// socket file nobody serves (a daemon killed without cleaning up) is not a system daemon,
/// so clients then fall back to their own instead of failing.
pub fn system_daemon() -> bool {
    let path = Path::new(SYSTEM_SOCKET);
    let dir = path.parent().expect("an absolute path with a file name");
    private_dir::open_checked(dir, private_dir::Owner::MeOrRoot).is_ok()
        && connect_seqpacket(path).is_ok()
}

/// A listening `SOCK_SEQPACKET` socket bound to `path` (non-blocking, close-on-exec).
pub fn listen_seqpacket(path: &Path) -> std::io::Result<OwnedFd> {
    let fd = bind_seqpacket(path)?;
    listen(&fd, 128)?;
    Ok(fd)
}

/// A non-blocking, close-on-exec `SOCK_SEQPACKET` socket bound to `path` that does not listen:
/// a connect to `path` is refused (`ECONNREFUSED`) for as long as it exists, whichever
/// processes hold a copy of it.
pub fn bind_seqpacket(path: &Path) -> std::io::Result<OwnedFd> {
    let fd = socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    bind(&fd, &SocketAddrUnix::new(path)?)?;
    Ok(fd)
}

/// Accepts one connection (non-blocking, close-on-exec); `None` when none is waiting.
pub fn accept(listener: BorrowedFd<'_>) -> std::io::Result<Option<OwnedFd>> {
    match accept_with(listener, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::AGAIN) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Connects a blocking `SOCK_SEQPACKET` socket to `path`.
pub fn connect_seqpacket(path: &Path) -> std::io::Result<OwnedFd> {
    let fd = socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    connect(&fd, &SocketAddrUnix::new(path)?)?;
    Ok(fd)
}

/// Sends one datagram with optional descriptors. `Err(AGAIN)` on a full non-blocking socket.
pub fn send(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), Errno> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Errno::INVAL);
    }
    // MSG_NOSIGNAL: a client that went away must not kill the daemon with SIGPIPE.
    sendmsg(
        sock,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receives one datagram into `buf`. `Ok(None)` at end of stream (peer closed);
/// `Err(AGAIN)` when a non-blocking socket has nothing.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Option<Datagram>, Errno> {
    recv_with(sock, buf, RecvFlags::CMSG_CLOEXEC)
}

/// [`recv`] that never blocks, even on a blocking socket (`MSG_DONTWAIT`): `Err(AGAIN)` when
/// nothing is there yet.
pub fn try_recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Option<Datagram>, Errno> {
    recv_with(sock, buf, RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT)
}

fn recv_with(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: RecvFlags,
) -> Result<Option<Datagram>, Errno> {
    let mut space =
        [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS), ScmCredentials(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = recvmsg(sock, &mut [IoSliceMut::new(buf)], &mut control, flags)?;
    let mut fds = Vec::new();
    let mut sender_pid = None;
    for m in control.drain() {
        match m {
            RecvAncillaryMessage::ScmRights(rights) => fds.extend(rights),
            // The kernel fills these in itself for a receiver with SO_PASSCRED (unix(7)); a
            // sender that sends its own can name only itself, unless it has CAP_SYS_ADMIN
            // over its pid namespace (then any process of that namespace, all of which it
            // controls anyway). Pid 0: the sender is not visible in our pid namespace.
            RecvAncillaryMessage::ScmCredentials(c) => {
                sender_pid = Some(c.pid.as_raw_nonzero().get() as u32).filter(|&p| p != 0)
            }
            _ => {}
        }
    }
    let truncated = msg.flags.contains(ReturnFlags::TRUNC);
    if msg.bytes == 0 && !truncated && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some(Datagram {
        len: msg.bytes,
        truncated,
        fds,
        fds_truncated: msg.flags.contains(ReturnFlags::CTRUNC),
        sender_pid,
    }))
}

/// Asks for the sender's credentials with every message received on `sock` (`SO_PASSCRED`,
/// unix(7)): [`Datagram::sender_pid`] then names the process that sent each request, which
/// on a connection inherited across `fork()` need not be the process that connected.
pub fn pass_credentials(sock: BorrowedFd<'_>) -> std::io::Result<()> {
    Ok(sockopt::set_socket_passcred(sock, true)?)
}

/// Credentials of the process at the other end of a Unix socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: u32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// `SO_PEERCRED` of a connected socket.
pub fn peer_cred(sock: BorrowedFd<'_>) -> std::io::Result<PeerCred> {
    let c = sockopt::socket_peercred(sock)?;
    Ok(PeerCred {
        pid: c.pid.as_raw_nonzero().get() as u32,
        uid: c.uid.as_raw(),
        gid: c.gid.as_raw(),
    })
}

/// `st_dev` and `st_ino` of an open file: the key of an XRC domain.
///
/// The descriptor must be one opened for reading or writing: an `O_PATH` descriptor needs no
/// permission on the file (only search permission on its directory), so accepting one would let
/// a user who may not open a 0600 domain file join the domain. uverbs refuses such descriptors
/// the same way (`ib_uverbs_open_xrcd` takes the file with `fdget`, which ignores `O_PATH`
/// files, and answers `EBADF`; docs/design/xrc-semantics.md). Refused with `EBADF`.
pub fn file_identity(fd: BorrowedFd<'_>) -> std::io::Result<(u64, u64)> {
    if rustix::fs::fcntl_getfl(fd)?.contains(rustix::fs::OFlags::PATH) {
        return Err(Errno::BADF.into());
    }
    let st = fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// A non-blocking, close-on-exec eventfd.
pub fn new_eventfd() -> std::io::Result<OwnedFd> {
    Ok(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?)
}

/// Adds 1 to an eventfd (makes it readable). A saturated counter is still readable, so
/// `EAGAIN` is not an error here.
pub fn signal_eventfd(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Resets an eventfd to zero; returns whether it was signalled.
pub fn drain_eventfd(fd: BorrowedFd<'_>) -> bool {
    let mut b = [0u8; 8];
    matches!(rustix::io::read(fd, &mut b), Ok(8))
}

/// A memfd holding `bytes` (used to hand large read-only blobs to a client).
pub fn memfd_with(name: &str, bytes: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = memfd_create(name, MemfdFlags::CLOEXEC)?;
    let mut off = 0;
    while off < bytes.len() {
        off += rustix::io::write(&fd, &bytes[off..])?;
    }
    Ok(fd)
}

/// Reads a whole memfd (from offset 0) into memory.
pub fn read_memfd(fd: impl AsFd, len: usize) -> std::io::Result<Vec<u8>> {
    let mut out = vec![0u8; len];
    let mut off = 0;
    while off < len {
        let n = rustix::io::pread(&fd, &mut out[off..], off as u64)?;
        if n == 0 {
            break;
        }
        off += n;
    }
    out.truncate(off);
    Ok(out)
}

/// Waits until `fd` is readable or `timeout_ms` passes (`None`: forever). Returns whether it
/// is readable.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout_ms: Option<i32>) -> std::io::Result<bool> {
    wait_readable_within(
        fd,
        timeout_ms.map(|ms| std::time::Duration::from_millis(ms.max(0) as u64)),
    )
}

/// Like [`wait_readable`], with a timeout of any precision (`None`: forever).
pub fn wait_readable_within(
    fd: BorrowedFd<'_>,
    timeout: Option<std::time::Duration>,
) -> std::io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let timeout = timeout.map(|d| rustix::event::Timespec {
        tv_sec: d.as_secs() as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    });
    loop {
        match poll(&mut fds, timeout.as_ref()) {
            Ok(n) => return Ok(n > 0),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sockets watched for their peer going away (`EPOLLRDHUP`/`EPOLLHUP`: closed, or the process
/// died and the kernel closed its end), each reported once (`EPOLLONESHOT`). Data arriving on
/// a socket is not an event here, so a watched socket keeps its ordinary request/response use.
#[derive(Debug)]
pub struct HangupSet {
    epoll: OwnedFd,
}

impl HangupSet {
    /// An empty set (a close-on-exec epoll instance).
    pub fn new() -> std::io::Result<HangupSet> {
        let epoll = rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)?;
        Ok(HangupSet { epoll })
    }

    /// Watches `sock`; its hang-up is reported as `key`.
    pub fn add(&self, sock: BorrowedFd<'_>, key: u64) -> std::io::Result<()> {
        use rustix::event::epoll::{add, EventData, EventFlags};
        add(
            &self.epoll,
            sock,
            EventData::new_u64(key),
            EventFlags::RDHUP | EventFlags::ONESHOT,
        )?;
        Ok(())
    }

    /// Stops watching `sock` (a socket not in the set is no error).
    pub fn remove(&self, sock: BorrowedFd<'_>) {
        let _ = rustix::event::epoll::delete(&self.epoll, sock);
    }

    /// Waits until at least one watched socket hangs up; returns their keys.
    pub fn wait(&self) -> std::io::Result<Vec<u64>> {
        let mut events = Vec::with_capacity(16);
        loop {
            match rustix::event::epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                None,
            ) {
                Ok(_) => return Ok(events.iter().map(|e| e.data.u64()).collect()),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_keep_boundaries_and_carry_fds() {
        let dir = std::env::temp_dir().join(format!("svipc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let l = listen_seqpacket(&path).unwrap();
        let c = connect_seqpacket(&path).unwrap();
        let s = loop {
            if let Some(s) = accept(l.as_fd()).unwrap() {
                break s;
            }
        };
        let efd = new_eventfd().unwrap();
        send(c.as_fd(), b"hello", &[efd.as_fd()]).unwrap();
        send(c.as_fd(), b"world!", &[]).unwrap();
        let mut buf = [0u8; 64];
        let d = recv(s.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!((&buf[..d.len], d.fds.len()), (&b"hello"[..], 1));
        let d = recv(s.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!(&buf[..d.len], b"world!");
        // Oversized datagrams are reported as truncated.
        send(c.as_fd(), &[7u8; 100], &[]).unwrap();
        let mut small = [0u8; 10];
        assert!(recv(s.as_fd(), &mut small).unwrap().unwrap().truncated);
        assert_eq!(peer_cred(s.as_fd()).unwrap().pid, std::process::id());
        drop(c);
        assert!(recv(s.as_fd(), &mut buf).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn eventfd_signal_and_drain() {
        let e = new_eventfd().unwrap();
        assert!(!drain_eventfd(e.as_fd()));
        signal_eventfd(e.as_fd());
        signal_eventfd(e.as_fd());
        assert!(wait_readable(e.as_fd(), Some(0)).unwrap());
        assert!(drain_eventfd(e.as_fd()));
        assert!(!drain_eventfd(e.as_fd()));
    }

    #[test]
    fn hangup_set_reports_a_closed_peer_once_and_not_data() {
        let dir = std::env::temp_dir().join(format!("svipc-hup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let l = listen_seqpacket(&path).unwrap();
        let c = connect_seqpacket(&path).unwrap();
        let s = loop {
            if let Some(s) = accept(l.as_fd()).unwrap() {
                break s;
            }
        };
        let set = std::sync::Arc::new(HangupSet::new().unwrap());
        set.add(c.as_fd(), 7).unwrap();
        let waiter = {
            let set = set.clone();
            std::thread::spawn(move || set.wait().unwrap())
        };
        // A datagram for the watched socket is not a hang-up.
        send(s.as_fd(), b"answer", &[]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "data woke the hang-up watch");
        drop(s);
        assert_eq!(waiter.join().unwrap(), vec![7]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn memfd_round_trip() {
        let m = memfd_with("t", b"{\"a\":1}").unwrap();
        assert_eq!(read_memfd(&m, 7).unwrap(), b"{\"a\":1}");
    }
}
