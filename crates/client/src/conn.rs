//! One connection to the daemon: connecting (and starting the daemon on demand), the
//! handshake, and the strictly one-at-a-time request/response exchange.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use softverbs_abi::codec::{decode_response, encode_request};
use softverbs_abi::msg::{Cmd, HelloReq, HelloResp};
use softverbs_abi::{ABI_VERSION, MAX_MSG};
use softverbs_ipc as ipc;
use softverbs_ipc::private_dir;
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::error::{errno, Error, Result};
use crate::fatal::{Fatal, Watch};

/// Where the daemon is found by default: `$SOFTVERBS_SOCKET`, else the system daemon's
/// `/run/softverbs/softverbs.sock` when one answers there, else this user's own
/// (`$XDG_RUNTIME_DIR/softverbs/softverbs.sock`, else `/run/softverbs/softverbs.sock`);
/// [`ipc::default_socket_path`].
pub fn default_socket_path() -> PathBuf {
    ipc::default_socket_path()
}

/// How long [`connect_socket`] waits for a daemon it started.
const AUTOSTART_WAIT: Duration = Duration::from_secs(5);
/// How long it keeps trying after the daemon it started exited.
const AUTOSTART_GRACE: Duration = Duration::from_millis(500);
/// How often it retries meanwhile.
const AUTOSTART_POLL: Duration = Duration::from_millis(20);

/// Connects to the daemon at `path`. If nothing listens there (`ENOENT`/`ECONNREFUSED`) and
/// `SOFTVERBS_AUTOSTART` is not `0`, starts one (`<bin> daemon --socket <path> --autostarted`,
/// with `--device` for each device of `$SOFTVERBS_DEVICES`: it picks a device address of its
/// own when another daemon holds the default one, and exits when it has had no client for a
/// while; `<bin>` is `$SOFTVERBS_DAEMON_BIN`, else a `softverbs` executable next to the current
/// executable or in its parent directory, else `softverbs` from `PATH`) and retries for up
/// to 5 s. Fails with op `"connect"` and the connect errno otherwise.
pub fn connect_socket(path: &Path) -> Result<OwnedFd> {
    connect_socket_with(path, autostart_enabled())
}

/// [`connect_socket`] with autostart chosen by the caller instead of by
/// `SOFTVERBS_AUTOSTART`.
pub fn connect_socket_with(path: &Path, autostart: bool) -> Result<OwnedFd> {
    connect_inner(path, autostart.then(daemon_binary), &[])
}

/// [`connect_socket`] that, when it starts a daemon, gives it `daemon_args` too (e.g.
/// `--device NAME=IP`, for `softverbs run --device`). A daemon already serving `path` is
/// taken as it is.
pub fn connect_socket_starting(path: &Path, daemon_args: &[OsString]) -> Result<OwnedFd> {
    connect_inner(path, autostart_enabled().then(daemon_binary), daemon_args)
}

/// Connects, starting `daemon` (if given, with `args`) when nothing listens.
fn connect_inner(path: &Path, daemon: Option<PathBuf>, args: &[OsString]) -> Result<OwnedFd> {
    let first = match ipc::connect_seqpacket(path) {
        Ok(fd) => return Ok(fd),
        Err(e) => Error::from_io("connect", &e),
    };
    let Some(bin) = daemon.filter(|_| matches!(first.errno, errno::ENOENT | errno::ECONNREFUSED))
    else {
        return Err(first);
    };
    let Ok(mut child) = start_daemon(path, &bin, args) else {
        return Err(first);
    };
    let mut deadline = Instant::now() + AUTOSTART_WAIT;
    let mut exited = false;
    let result = loop {
        let last = match ipc::connect_seqpacket(path) {
            Ok(fd) => break Ok(fd),
            Err(e) => Error::from_io("connect", &e),
        };
        // A daemon that exited failed, or lost the race for the socket to another client's
        // daemon, which may still be coming up: give that one a short grace, not 5 s.
        if !exited && matches!(child.try_wait(), Ok(Some(_))) {
            exited = true;
            deadline = deadline.min(Instant::now() + AUTOSTART_GRACE);
        }
        if Instant::now() >= deadline {
            break Err(last);
        }
        std::thread::sleep(AUTOSTART_POLL);
    };
    // Reap the daemon whenever it exits, so it never lingers as a zombie of this process.
    let _ = std::thread::Builder::new()
        .name("softverbs-reaper".into())
        .spawn(move || child.wait());
    result
}

fn autostart_enabled() -> bool {
    std::env::var_os("SOFTVERBS_AUTOSTART").is_none_or(|v| v != "0")
}

/// The daemon executable autostart runs.
pub(crate) fn daemon_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SOFTVERBS_DAEMON_BIN") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        // Test binaries live in target/<profile>/deps, the CLI one level up.
        let mut dir = exe.parent();
        for _ in 0..2 {
            let Some(d) = dir else { break };
            let candidate = d.join("softverbs");
            if candidate.is_file() {
                return candidate;
            }
            dir = d.parent();
        }
    }
    PathBuf::from("softverbs")
}

/// Where a daemon started for socket `path` writes its standard error (appended): `daemon.log`
/// beside the socket. A daemon that fails to start says why there.
pub fn autostart_log(path: &Path) -> PathBuf {
    socket_dir(path).join("daemon.log")
}

fn socket_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// `--device SPEC` for each whitespace-separated `NAME=IP[,IP...]` of `$SOFTVERBS_DEVICES`,
/// unless the caller named daemon arguments itself: the devices an autostarted daemon offers
/// (`softverbs run --device` sets it for its program, so a daemon the program's library starts
/// again after an idle exit offers the same devices; docs/guide/multi-user.md).
fn devices_from_env(args: &[OsString]) -> Vec<OsString> {
    if !args.is_empty() {
        return Vec::new();
    }
    let specs = std::env::var("SOFTVERBS_DEVICES").unwrap_or_default();
    specs
        .split_whitespace()
        .flat_map(|d| [OsString::from("--device"), OsString::from(d)])
        .collect()
}

fn start_daemon(
    path: &Path,
    bin: &Path,
    args: &[OsString],
) -> std::io::Result<std::process::Child> {
    // The directory is checked and the log opened through it without following a symlink,
    // as the daemon does with its socket (docs/design/security.md, "Paths"): a program run as root
    // never appends to a file another user named.
    let dir = private_dir::ensure(socket_dir(path), 0o755, private_dir::Owner::MeOrRoot)?;
    let log = private_dir::append_in(&dir, "daemon.log", 0o644)?;
    Command::new(bin)
        .arg("daemon")
        .arg("--socket")
        .arg(path)
        .arg("--autostarted")
        .args(args)
        .args(devices_from_env(args))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
}

/// A connected, greeted socket. Requests are serialized by the mutex.
pub(crate) struct Conn {
    sock: Mutex<OwnedFd>,
    /// A context's connection: whether the daemon is gone (`None` for introspection).
    fatal: Option<Arc<Fatal>>,
    watch: Option<Watch>,
    /// The daemon's ABI version from the handshake.
    pub(crate) abi: u32,
    /// Devices the daemon has.
    pub(crate) num_devices: u32,
    /// The daemon's id of this connection's context (0 without a device).
    pub(crate) ctx_id: u64,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("abi", &self.abi)
            .field("num_devices", &self.num_devices)
            .field("ctx_id", &self.ctx_id)
            .finish_non_exhaustive()
    }
}

/// This process's `/proc/self/mem`, or, when it may not open it (`EACCES`: it is not
/// dumpable, so the file belongs to root), a pidfd of itself, from which a root daemon opens
/// it on its behalf (`ProcessMemory::open_for`, docs/design/registered-memory.md, "A process that
/// is not dumpable").
fn own_memory_or_pidfd() -> std::io::Result<OwnedFd> {
    match softverbs_memaccess::open_own_memory() {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            softverbs_memaccess::own_pidfd().map_err(|_| e)
        }
        other => other,
    }
}

/// Sends `Hello` on a fresh socket; returns the connection and the descriptors that came
/// with the answer (the async eventfd when a device was opened).
///
/// With a device, the request carries this process's own `/proc/self/mem` (ABI 5,
/// `HELLO_MEM_FD`): the daemon reaches memory that is not shared through it, bound to this
/// process's address space rather than to its pid (docs/design/registered-memory.md). A daemon
/// speaking an ABI older than 5 refuses the bit (`EOPNOTSUPP`); the greeting is then repeated
/// without it. An older daemon binary then reaches the memory by pid as it always did; a
/// current daemon started at an older ABI level reaches only shared MRs. Since ABI 7 the
/// process's own `/proc/self/maps` comes too (`HELLO_MAPS_FD`), by which the daemon refuses
/// registrations over unmapped or read-only pages; an ABI-5 or -6 daemon refuses that bit and is
/// greeted with the `mem` descriptor alone. A process that is not dumpable cannot open its
/// `mem` and sends a pidfd of itself in its place ([`own_memory_or_pidfd`]).
pub(crate) fn hello(sock: OwnedFd, device: u32) -> Result<(Conn, Vec<OwnedFd>)> {
    let req = HelloReq {
        abi_version: U32::new(ABI_VERSION),
        device: U32::new(device),
    };
    let own = |open: fn() -> std::io::Result<OwnedFd>| {
        open().map_err(|e| Error::new("hello", e.raw_os_error().unwrap_or(errno::EINVAL)))
    };
    let (mem, maps) = if device == softverbs_abi::msg::NO_DEVICE {
        (None, None)
    } else {
        (
            Some(own(own_memory_or_pidfd)?),
            Some(own(softverbs_memaccess::open_own_maps)?),
        )
    };
    let hello = |mask: u64, fds: &[BorrowedFd<'_>]| {
        exchange(sock.as_fd(), "hello", Cmd::Hello, mask, req.as_bytes(), fds)
    };
    let refused = |r: &std::result::Result<_, Failure>| matches!(r, Err(Failure::Refused(e)) if e.errno == errno::EOPNOTSUPP);
    // Newest first: mem and maps (ABI 7), then mem alone (ABI 5, 6), then neither.
    let first = match (&mem, &maps) {
        (Some(m), Some(p)) => {
            let r = hello(
                softverbs_abi::msg::HELLO_MEM_FD | softverbs_abi::msg::HELLO_MAPS_FD,
                &[m.as_fd(), p.as_fd()],
            );
            if refused(&r) {
                hello(softverbs_abi::msg::HELLO_MEM_FD, &[m.as_fd()])
            } else {
                r
            }
        }
        _ => hello(0, &[]),
    };
    let (resp, fds): (HelloResp, _) = match first {
        r if mem.is_some() && refused(&r) => hello(0, &[]).map_err(Failure::into_error)?,
        other => other.map_err(Failure::into_error)?,
    };
    let conn = Conn {
        sock: Mutex::new(sock),
        fatal: None,
        watch: None,
        abi: resp.abi_version.get(),
        num_devices: resp.num_devices.get(),
        ctx_id: resp.ctx_id.get(),
    };
    // An older daemon reaches memory with process_vm_*: let it in without root (Yama's
    // ptrace scope); harmless where Yama is absent. A daemon of ABI 5 needs no such grant.
    let daemon = resp.daemon_pid.get();
    if device != softverbs_abi::msg::NO_DEVICE && daemon != 0 && conn.abi < 5 {
        let _ = softverbs_memaccess::authorize_daemon(daemon as i32);
    }
    Ok((conn, fds))
}

impl Conn {
    fn lock(&self) -> MutexGuard<'_, OwnedFd> {
        // The socket holds no state a panicking holder could have left half-updated between
        // whole exchanges.
        self.sock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes this a context's connection: the daemon's death becomes `fatal`'s (watched
    /// from now on, and noticed by any call that finds the connection gone).
    pub(crate) fn watch(&mut self, fatal: Arc<Fatal>) {
        let sock = self.sock.get_mut().unwrap_or_else(|e| e.into_inner());
        self.watch = crate::fatal::watch(sock.as_fd(), &fatal);
        self.fatal = Some(fatal);
    }

    /// One command and its response, with descriptors both ways: the request and response
    /// types are those of `C`'s row in the command table. On a context whose device is gone
    /// nothing is sent: commands that destroy an object succeed (rdma-core lets a program
    /// clean up after `IBV_EVENT_DEVICE_FATAL`; the daemon freed everything when it died) and
    /// answer zeros, every other command fails with [`ErrorKind::DeviceFatal`].
    ///
    /// [`ErrorKind::DeviceFatal`]: crate::ErrorKind::DeviceFatal
    pub(crate) fn call_fds<C: softverbs_abi::msg::Command>(
        &self,
        op: &'static str,
        comp_mask: u64,
        req: &C::Req,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(C::Resp, Vec<OwnedFd>)> {
        if self.fatal.as_ref().is_some_and(|f| f.is_dead()) {
            return after_death(op, C::CMD);
        }
        let sock = self.lock();
        match exchange(sock.as_fd(), op, C::CMD, comp_mask, req.as_bytes(), fds) {
            Ok(r) => Ok(r),
            Err(Failure::Refused(e)) => Err(e),
            Err(Failure::Lost(e)) => match &self.fatal {
                Some(f) => {
                    f.die();
                    after_death(op, C::CMD)
                }
                None => Err(e),
            },
        }
    }

    /// One command and its response (descriptors that come back are closed).
    pub(crate) fn call<C: softverbs_abi::msg::Command>(
        &self,
        op: &'static str,
        comp_mask: u64,
        req: &C::Req,
    ) -> Result<C::Resp> {
        self.call_fds::<C>(op, comp_mask, req, &[]).map(|(r, _)| r)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(w) = self.watch.take() {
            let sock = self.sock.get_mut().unwrap_or_else(|e| e.into_inner());
            w.end(sock.as_fd());
        }
    }
}

/// Commands that destroy or release an object.
fn is_teardown(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::DeallocPd
            | Cmd::DeregMr
            | Cmd::DestroyCq
            | Cmd::DestroySrq
            | Cmd::DestroyAh
            | Cmd::CloseXrcd
            | Cmd::DestroyQp
            | Cmd::UnregXrcRcvQp
            | Cmd::DestroyXrcRcvQp
            | Cmd::UnregisterXrcRcvQp
            | Cmd::DestroyCompChannel
    )
}

/// What a command gets once the device is gone (see [`Conn::call_fds`]).
fn after_death<R: FromBytes + IntoBytes + Immutable + KnownLayout + Default>(
    op: &'static str,
    cmd: Cmd,
) -> Result<(R, Vec<OwnedFd>)> {
    if is_teardown(cmd) {
        Ok((R::default(), Vec::new()))
    } else {
        Err(Error::device_fatal(op))
    }
}

/// Why an exchange failed.
enum Failure {
    /// The daemon answered with an error (or an answer that broke the ABI).
    Refused(Error),
    /// The connection is gone: the daemon closed it or died.
    Lost(Error),
}

impl Failure {
    fn into_error(self) -> Error {
        match self {
            Failure::Refused(e) | Failure::Lost(e) => e,
        }
    }
}

/// Socket errors that mean the other end is gone.
fn lost(op: &'static str, e: ipc::IpcErrno) -> Failure {
    let err = Error::from_ipc(op, e);
    if matches!(
        e,
        ipc::IpcErrno::PIPE | ipc::IpcErrno::CONNRESET | ipc::IpcErrno::NOTCONN
    ) {
        Failure::Lost(err)
    } else {
        Failure::Refused(err)
    }
}

/// How long a request polls for its reply before blocking.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

fn exchange<R>(
    sock: BorrowedFd<'_>,
    op: &'static str,
    cmd: Cmd,
    comp_mask: u64,
    body: &[u8],
    fds: &[BorrowedFd<'_>],
) -> std::result::Result<(R, Vec<OwnedFd>), Failure>
where
    R: FromBytes + IntoBytes + Immutable + KnownLayout + Default,
{
    let msg = encode_request(cmd, comp_mask, body, core::mem::size_of::<R>());
    loop {
        match ipc::send(sock, &msg, fds) {
            Ok(()) => break,
            Err(ipc::IpcErrno::INTR) => continue,
            Err(e) => return Err(lost(op, e)),
        }
    }
    let mut buf = [0u8; MAX_MSG];
    // Poll briefly before sleeping: the daemon answers in a few microseconds when it is
    // awake, while a sleep/wake-up pair across CPUs costs tens of microseconds (see
    // docs/performance.md). Yielding keeps a third busy process from being starved.
    let spin_until = std::time::Instant::now() + SPIN;
    let mut spinning = true;
    let dgram = loop {
        let got = if spinning {
            ipc::try_recv(sock, &mut buf)
        } else {
            ipc::recv(sock, &mut buf)
        };
        match got {
            Err(ipc::IpcErrno::AGAIN) if spinning => {
                if std::time::Instant::now() >= spin_until {
                    spinning = false;
                }
                std::thread::yield_now();
                continue;
            }
            Ok(Some(d)) => break d,
            Ok(None) => return Err(Failure::Lost(Error::new(op, errno::ECONNRESET))),
            Err(ipc::IpcErrno::INTR) => continue,
            Err(e) => return Err(lost(op, e)),
        }
    };
    if dgram.truncated || dgram.fds_truncated {
        return Err(Failure::Refused(Error::proto(op)));
    }
    match decode_response::<R>(&buf[..dgram.len], cmd) {
        Ok(Ok(r)) => Ok((r, dgram.fds)),
        Ok(Err(status)) if status > 0 => Err(Failure::Refused(Error::new(op, status))),
        Ok(Err(_)) | Err(_) => Err(Failure::Refused(Error::proto(op))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_without_autostart_reports_the_connect_errno() {
        let dir = std::env::temp_dir().join(format!("svclient-conn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("nothing.sock");
        let e = connect_socket_with(&missing, false).unwrap_err();
        assert_eq!((e.op, e.errno), ("connect", errno::ENOENT));
        // A socket file nobody listens on: ECONNREFUSED. Bound but never listening, rather
        // than a listener closed again: a child forked by a concurrent test could hold a copy
        // of that listener and let the connect in.
        let stale = dir.join("stale.sock");
        let _ = std::fs::remove_file(&stale);
        let _bound = ipc::bind_seqpacket(&stale).unwrap();
        let e = connect_socket_with(&stale, false).unwrap_err();
        assert_eq!((e.op, e.errno), ("connect", errno::ECONNREFUSED));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn autostart_runs_the_daemon_detached_and_gives_up_when_it_exits() {
        let dir = std::env::temp_dir().join(format!("svclient-auto-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A "daemon" that logs its arguments and process group, then fails.
        let bin = dir.join("fake-daemon");
        // Written by a child `install`: a test thread's fork while this process held the
        // script open for writing would make exec'ing it fail with ETXTBSY.
        let text = dir.join("fake-daemon.txt");
        std::fs::write(&text, "#!/bin/sh\necho \"args: $*\" >&2\nexit 1\n").unwrap();
        let st = std::process::Command::new("install")
            .args(["-m", "0755"])
            .arg(&text)
            .arg(&bin)
            .status()
            .unwrap();
        assert!(st.success());
        let sock = dir.join("run").join("s.sock");
        let start = Instant::now();
        let e = connect_inner(
            &sock,
            Some(bin),
            &["--device".into(), "d0=127.0.0.9".into()],
        )
        .unwrap_err();
        assert_eq!((e.op, e.errno), ("connect", errno::ENOENT));
        assert!(
            start.elapsed() < AUTOSTART_WAIT,
            "an exited daemon is not waited for"
        );
        let log = std::fs::read_to_string(dir.join("run").join("daemon.log")).unwrap();
        assert_eq!(
            log.trim(),
            format!(
                "args: daemon --socket {} --autostarted --device d0=127.0.0.9",
                sock.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
