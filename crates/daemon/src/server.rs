//! The daemon's event loop: accept connections, read one command datagram at a time,
//! dispatch it, write the answer, and tear the context down when a connection ends.
//!
//! Single-threaded on purpose: the core is one state machine, and a command costs a few
//! microseconds, so a thread per client would buy contention, not throughput.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use softverbs_abi::codec::{encode_response, peek_cmd};
use softverbs_abi::MAX_MSG;
use softverbs_core::errno::ENOMEM;
use softverbs_core::ids::CtxId;
use softverbs_core::limits::Resource;
use softverbs_core::Core;
use softverbs_ipc::IpcErrno as Errno;

use rustix::fs::{chmodat, openat, statat, unlinkat, AtFlags, FileType, Mode, OFlags};
use softverbs_ipc::private_dir::{self, Owner};

use crate::config::{own_addresses, Config, DeviceSpec, DEFAULT_DEVICE};
use crate::conn::{Conn, Outgoing, MAX_QUEUED_REPLIES, REFUSED_PER_UID};
use crate::dispatch::Dispatcher;
use crate::spin::SpinPolicy;

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const WAKER: Token = Token(2);
/// Every client doorbell (the loop only needs to wake; `drive` reads all rings).
const DOORBELL: Token = Token(3);
/// SIGHUP: read the configuration again.
const RELOAD: Token = Token(4);
/// Device UDP sockets are tokens `NET_BASE + device index`.
const NET_BASE: usize = 8;
const FIRST_CONN: usize = 16;

/// Stops a running [`Server`] from another thread.
#[derive(Clone)]
pub struct StopHandle {
    waker: Arc<Waker>,
    flag: Arc<std::sync::atomic::AtomicBool>,
}

impl StopHandle {
    /// Asks the loop to finish (it tears every context down and removes its socket).
    pub fn stop(&self) {
        self.flag.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

/// The directory and file name of a socket path.
fn split_socket_path(path: &std::path::Path) -> io::Result<(PathBuf, String)> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--socket {}: no file name", path.display()),
            )
        })?
        .to_string();
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."))
        .to_path_buf();
    Ok((dir, name))
}

/// What the daemon tells its service manager (sd_notify(3)); the shell maps these to its
/// notification socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The configuration is being read again (`RELOADING=1`).
    Reloading,
    /// Serving (`READY=1`): after start-up, and after every reload, whether it was taken.
    Ready,
    /// A line for `systemctl status` (`STATUS=`).
    Status(String),
}

/// Reads the configuration again on SIGHUP: the new one, or why there is none.
pub type Reload = Box<dyn FnMut() -> Result<Config, String> + Send>;
/// Passes [`Notice`]s on.
pub type Notify = Box<dyn FnMut(&[Notice]) + Send>;

/// The devices of `config` with their network side. An [`Config::own_address`] daemon
/// whose default device's address another daemon holds (`EADDRINUSE`) tries the next of
/// [`own_addresses`], and runs without a network when every one is taken; `config` is left
/// saying what it got, and so is the dispatcher's `network` note (and the log).
fn bind_devices(config: &mut Config) -> io::Result<Dispatcher> {
    let dispatcher = |config: &Config| {
        let mut core = Core::new(config.build_devices());
        core.set_limits(config.limits.clone());
        let mut d = Dispatcher::new(core, config.abi_version, &config.net)?;
        d.version = config.version.clone();
        Ok::<_, io::Error>(d)
    };
    let bound = |config: &Config| -> String {
        let addrs: Vec<String> = config
            .build_devices()
            .iter()
            .flat_map(|d| d.ports[0].gids.iter().copied())
            .filter(|g| *g != softverbs_core::device::Gid::default())
            .map(|g| std::net::SocketAddr::new(g.to_ip(), config.net.port).to_string())
            .collect();
        format!("UDP {}", addrs.join(" "))
    };
    if !config.net.bind {
        let mut d = dispatcher(config)?;
        d.network = "none (--no-network): the devices reach only each other".into();
        return Ok(d);
    }
    if !config.own_address || !config.devices.is_empty() {
        let mut d = dispatcher(config)?;
        d.network = bound(config);
        return Ok(d);
    }
    let uid = rustix::process::geteuid().as_raw();
    let candidates = own_addresses(uid, &config.socket);
    let mut taken = Vec::new();
    for ip in &candidates {
        config.devices = vec![DeviceSpec {
            name: DEFAULT_DEVICE.into(),
            ips: vec![*ip],
        }];
        match dispatcher(config) {
            Ok(mut d) => {
                d.network = bound(config);
                if !taken.is_empty() {
                    d.network += &format!(
                        ", an address of its own: {} was taken (another daemon's)",
                        taken.join(", ")
                    );
                    tracing::warn!(device = DEFAULT_DEVICE, addr = %ip, taken = %taken.join(", "), "the default address is another daemon's: this daemon took an address of its own");
                }
                return Ok(d);
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                taken.push(std::net::SocketAddr::new(*ip, config.net.port).to_string());
            }
            Err(e) => return Err(e),
        }
    }
    config.devices.clear();
    config.net.bind = false;
    let mut d = dispatcher(config)?;
    d.network = format!(
        "none: every address tried was taken ({} addresses from {}), so the devices reach \
         only each other; name a free address with --device",
        taken.len(),
        taken.first().map_or("", String::as_str)
    );
    tracing::warn!(
        tried = taken.len(),
        "every address tried is another daemon's: running without a network"
    );
    Ok(d)
}

/// A bound daemon, ready to [`run`](Server::run).
pub struct Server {
    config: Config,
    /// `None` when the service manager bound the socket (it holds it, and the lock's job).
    _lock: Option<std::fs::File>,
    /// The socket came from the service manager: it stays when the daemon stops.
    activated: bool,
    listener: OwnedFd,
    poll: Poll,
    signals: Option<UnixStream>,
    hangup: Option<UnixStream>,
    reload: Option<Reload>,
    notify: Option<Notify>,
    stop: StopHandle,
    conns: HashMap<usize, Conn>,
    next_token: usize,
    dispatcher: Dispatcher,
    by_ctx: HashMap<CtxId, usize>,
    buf: Vec<u8>,
    /// The daemon's ends of the clients' doorbells, watched while their context lives.
    doorbells: HashMap<CtxId, OwnedFd>,
    /// Connections per uid kept, uncharged, only to answer `ENOMEM` (`Conn::charged`).
    refused: HashMap<u32, usize>,
}

impl Server {
    /// Binds the socket of `config`, replacing a stale socket file that no daemon answers on.
    /// Fails with `AddrInUse` if another daemon is serving it, and with the device's bind error
    /// if a device's UDP port cannot be bound (`DataPath::new`), before the socket exists.
    pub fn bind(mut config: Config) -> io::Result<Server> {
        let socket = config.socket.clone();
        let path = &socket;
        // The socket's directory is checked and then used through its descriptor, so a root
        // daemon never creates, truncates or removes a file another user's symlink names
        // (issue 35, item 9; docs/design/security.md, "Paths"). 0755: every user reaches the socket.
        let (dir, name) = split_socket_path(path)?;
        let dirfd = private_dir::ensure(&dir, 0o755, Owner::MeOrRoot)
            .map_err(|e| io::Error::new(e.kind(), format!("--socket: {e}")))?;
        // One daemon per socket: the lock is held for the daemon's life, so two daemons
        // started at once (two clients autostarting) cannot both bind.
        let lock_name = format!("{name}.lock");
        let lock = openat(
            &dirfd,
            lock_name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map(std::fs::File::from)
        .map_err(|e| {
            io::Error::new(e.kind(), format!("{}: {e}", dir.join(&lock_name).display()))
        })?;
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another daemon holds {}", dir.join(&lock_name).display()),
            ));
        }
        match statat(&dirfd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::Socket => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a socket: not replacing it",
                        path.display()
                    ),
                ));
            }
            Ok(_) => {
                if softverbs_ipc::connect_seqpacket(path).is_ok() {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("a daemon already serves {}", path.display()),
                    ));
                }
                unlinkat(&dirfd, name.as_str(), AtFlags::empty())?;
            }
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        // The devices take their network side before the socket exists: a daemon that
        // cannot play its NIC exits here, before any client could connect to it.
        let dispatcher = bind_devices(&mut config)?;
        let listener = softverbs_ipc::listen_seqpacket(path)?;
        // Sender credentials on every request (which process sent it: a fork child may share
        // a connection). Set on the listener, accepted sockets inherit it (unix(7)), so even
        // the first request, sent before the accept, carries them; set before the socket
        // opens to everyone below.
        softverbs_ipc::pass_credentials(listener.as_fd())?;
        // The socket is the door to every client's objects, but file permissions on the XRC
        // domain files are the access control, as with uverbs: anyone may connect.
        chmodat(
            &dirfd,
            name.as_str(),
            Mode::from_raw_mode(0o777),
            AtFlags::empty(),
        )?;
        Self::serve(config, Some(lock), false, listener, dispatcher)
    }

    /// Serves `listener`, a listening `SOCK_SEQPACKET` Unix socket the service manager bound
    /// and passed (socket activation, sd_listen_fds(3)); `config.socket` becomes its path.
    /// The socket's file and mode are the socket unit's, and it is left in place at exit.
    pub fn bind_activated(mut config: Config, listener: OwnedFd) -> io::Result<Server> {
        let invalid = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the socket passed by the service manager {what}"),
            )
        };
        if rustix::net::sockopt::socket_type(&listener)? != rustix::net::SocketType::SEQPACKET {
            return Err(invalid("is not SOCK_SEQPACKET (ListenSequentialPacket=)"));
        }
        if !rustix::net::sockopt::socket_acceptconn(&listener)? {
            return Err(invalid("does not listen"));
        }
        let addr = rustix::net::getsockname(&listener)?;
        let unix = rustix::net::SocketAddrUnix::try_from(addr)
            .map_err(|_| invalid("is not a Unix socket"))?;
        if let Some(p) = unix.path() {
            use std::os::unix::ffi::OsStrExt;
            config.socket = PathBuf::from(std::ffi::OsStr::from_bytes(p.to_bytes()));
        }
        // The loop accepts until EAGAIN; a service manager passes a blocking socket.
        rustix::io::ioctl_fionbio(&listener, true)?;
        // As `bind` does; a request queued before this carries no sender pid unless the
        // socket unit set PassCredentials= (dist/systemd/softverbs.socket does); its context
        // is still its peer's (SO_PEERCRED, taken at connect).
        softverbs_ipc::pass_credentials(listener.as_fd())?;
        let dispatcher = bind_devices(&mut config)?;
        Self::serve(config, None, true, listener, dispatcher)
    }

    fn serve(
        config: Config,
        lock: Option<std::fs::File>,
        activated: bool,
        listener: OwnedFd,
        mut dispatcher: Dispatcher,
    ) -> io::Result<Server> {
        let poll = Poll::new()?;
        poll.registry().register(
            &mut SourceFd(&listener.as_raw_fd()),
            LISTENER,
            Interest::READABLE,
        )?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let stop = StopHandle {
            waker,
            flag: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        // Every readiness event of the sockets reaches `mark_readable` below.
        dispatcher.dp.gate_receives();
        for (i, fd) in dispatcher.dp.net_fds() {
            poll.registry().register(
                &mut SourceFd(&fd.as_raw_fd()),
                Token(NET_BASE + i),
                Interest::READABLE,
            )?;
        }
        Ok(Server {
            config,
            _lock: lock,
            activated,
            listener,
            poll,
            signals: None,
            hangup: None,
            reload: None,
            notify: None,
            stop,
            conns: HashMap::new(),
            next_token: FIRST_CONN,
            dispatcher,
            by_ctx: HashMap::new(),
            buf: vec![0; MAX_MSG + 1],
            doorbells: HashMap::new(),
            refused: HashMap::new(),
        })
    }

    /// Makes SIGTERM and SIGINT stop the loop cleanly (for the real daemon process).
    pub fn handle_signals(&mut self) -> io::Result<()> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::low_level::pipe::register(sig, write.try_clone()?)?;
        }
        self.poll.registry().register(
            &mut SourceFd(&read.as_raw_fd()),
            SIGNALS,
            Interest::READABLE,
        )?;
        self.signals = Some(read);
        // SIGHUP reads the configuration again (`ExecReload=`); without a reload hook it
        // changes nothing, rather than ending the daemon as its default action would.
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        signal_hook::low_level::pipe::register(signal_hook::consts::SIGHUP, write)?;
        self.poll.registry().register(
            &mut SourceFd(&read.as_raw_fd()),
            RELOAD,
            Interest::READABLE,
        )?;
        self.hangup = Some(read);
        Ok(())
    }

    /// What SIGHUP does: `reload` reads the configuration again (see [`Server::apply`]).
    pub fn on_reload(&mut self, reload: Reload) {
        self.reload = Some(reload);
    }

    /// Where [`Notice`]s go; the first, [`Notice::Ready`], goes as [`run`](Server::run)
    /// starts: the devices are up and the socket is served.
    pub fn on_notice(&mut self, notify: Notify) {
        self.notify = Some(notify);
    }

    fn notice(&mut self, n: &[Notice]) {
        if let Some(f) = &mut self.notify {
            f(n);
        }
    }

    /// Takes what of `new` a running daemon can take and says what needs a restart: the
    /// limits change at once (objects over a lowered limit stay; the next allocation is
    /// refused); the socket, devices, network, port, MTU, capture, faults and ABI level are
    /// the devices' and the socket's shape, made once at start. Returns the summary.
    pub fn apply(&mut self, new: Config) -> String {
        let old = &self.config;
        let mut restart = Vec::new();
        // The activated socket's path is the socket unit's, whatever the file says.
        if new.socket != old.socket && !self.activated {
            restart.push("socket");
        }
        if new.devices != old.devices {
            restart.push("devices");
        }
        if new.abi_version != old.abi_version {
            restart.push("abi_version");
        }
        if new.net.bind != old.net.bind {
            restart.push("network");
        }
        if new.net.port != old.net.port {
            restart.push("port");
        }
        if new.net.capture_dir != old.net.capture_dir
            || new.net.capture_rejected != old.net.capture_rejected
        {
            restart.push("capture");
        }
        if new.net.faults != old.net.faults {
            restart.push("faults");
        }
        if new.mtu != old.mtu {
            restart.push("mtu");
        }
        if new.net.retry_floor != old.net.retry_floor {
            restart.push("retry_floor_ms");
        }
        let limits = new.limits != old.limits;
        if limits {
            self.dispatcher.core.set_limits(new.limits.clone());
            self.config.limits = new.limits;
        }
        let mut summary = if limits {
            "configuration reloaded: limits changed".to_string()
        } else {
            "configuration reloaded: no limit changed".to_string()
        };
        if !restart.is_empty() {
            summary += &format!("; {} take effect at restart", restart.join(", "));
        }
        summary
    }

    fn reload(&mut self) {
        // One reload for any number of SIGHUPs that arrived meanwhile.
        if let Some(h) = &self.hangup {
            let mut sink = [0u8; 64];
            while matches!(io::Read::read(&mut &*h, &mut sink), Ok(n) if n > 0) {}
        }
        let Some(mut reload) = self.reload.take() else {
            tracing::info!("SIGHUP: no configuration to read again");
            return;
        };
        self.notice(&[Notice::Reloading]);
        let status = match reload() {
            Ok(new) => {
                let s = self.apply(new);
                tracing::info!("{s}");
                s
            }
            Err(e) => {
                tracing::error!("reload refused, the running configuration stays: {e}");
                format!("reload refused, the running configuration stays: {e}")
            }
        };
        self.reload = Some(reload);
        self.notice(&[Notice::Status(status), Notice::Ready]);
    }

    /// A handle that stops the loop from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The socket served.
    pub fn socket(&self) -> &PathBuf {
        &self.config.socket
    }

    /// Runs until stopped; then closes every connection (tearing contexts down) and removes
    /// the socket file.
    pub fn run(&mut self) -> io::Result<()> {
        tracing::info!(socket = %self.config.socket.display(), abi = self.config.abi_version, activated = self.activated, "daemon serving");
        self.notice(&[Notice::Ready]);
        let mut events = Events::with_capacity(256);
        let mut spin = SpinPolicy::new(std::time::Instant::now());
        // Since when no client has been connected (an autostarted daemon exits after
        // `idle_exit` of that; every connection, introspection included, counts).
        let mut idle_since = Some(std::time::Instant::now());
        while !self.stop.flag.load(std::sync::atomic::Ordering::SeqCst) {
            if let (Some(idle), Some(since)) = (self.config.idle_exit, idle_since) {
                // A client whose connect is waiting in the backlog is served, not dropped.
                if since.elapsed() >= idle {
                    self.accept_all();
                }
                if since.elapsed() >= idle && self.conns.is_empty() {
                    tracing::info!(
                        idle_s = idle.as_secs_f64(),
                        "no client for the idle time (--idle-exit): exiting"
                    );
                    break;
                }
                if !self.conns.is_empty() {
                    idle_since = None;
                }
            }
            // Adaptive polling: right after work, poll without sleeping for a short window,
            // so a client's next request finds the daemon awake (a cross-CPU wake-up costs
            // tens of microseconds on small VMs); then block. The yield keeps the spin from
            // starving clients on a machine with few CPUs.
            // When yielding stops being cheap, sleep instead (crates/daemon/src/spin.rs).
            let idle_spin = spin.spinning(std::time::Instant::now());
            let mut spinning = idle_spin;
            // Before sleeping, ask the shared-memory queues' producers to ring the doorbell;
            // if something was posted meanwhile, keep going instead.
            if !spinning && !self.dispatcher.dp.prepare_sleep() {
                spinning = true;
                spin.worked(std::time::Instant::now());
            }
            // Never sleep past an engine timer (ACK timeout, RNR wait).
            let engine = self.dispatcher.dp.next_timeout();
            let timeout = if spinning {
                Some(std::time::Duration::ZERO)
            } else {
                engine
            };
            // Nor past the idle deadline.
            let timeout = match (self.config.idle_exit, idle_since) {
                (Some(idle), Some(since)) => {
                    let left = idle.saturating_sub(since.elapsed());
                    Some(timeout.map_or(left, |t| t.min(left)))
                }
                _ => timeout,
            };
            // A round later than this plan finds the daemon itself could not run
            // (docs/design/net-path.md, "Stalls").
            self.dispatcher.dp.sleeping(timeout);
            if idle_spin {
                let start = std::time::Instant::now();
                std::thread::yield_now();
                spin.yielded(start, std::time::Instant::now());
            }
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if !spinning {
                let rang = events.iter().any(|e| e.token() == DOORBELL);
                self.dispatcher.dp.finish_sleep(rang);
            }
            if !events.is_empty() {
                spin.worked(std::time::Instant::now());
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all(),
                    SIGNALS => {
                        tracing::info!("signal received, shutting down");
                        self.stop
                            .flag
                            .store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    RELOAD => self.reload(),
                    WAKER | DOORBELL => {}
                    // Device sockets are tokens NET_BASE + device; group sockets, of any
                    // device, share NET_BASE.
                    Token(t) if t == NET_BASE => self.dispatcher.dp.mark_readable(None),
                    Token(t) if (NET_BASE..FIRST_CONN).contains(&t) => {
                        self.dispatcher.dp.mark_readable(Some(t - NET_BASE));
                    }
                    Token(t) => {
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.read_conn(t);
                        }
                        if ev.is_writable() {
                            self.flush_conn(t);
                        }
                    }
                }
            }
            // Doorbells the last commands created are watched from now on (their events only
            // wake the loop; the rings themselves are read in `drive`).
            for (ctx, d) in self.dispatcher.dp.take_new_doorbells() {
                let _ = self.poll.registry().register(
                    &mut SourceFd(&d.as_raw_fd()),
                    DOORBELL,
                    Interest::READABLE,
                );
                self.doorbells.insert(ctx, d);
            }
            // Multicast group sockets the last commands joined are watched from now on (one
            // token for all: `drive` reads every socket).
            for fd in self.dispatcher.dp.take_new_net_fds() {
                let _ = self.poll.registry().register(
                    &mut SourceFd(&fd),
                    Token(NET_BASE),
                    Interest::READABLE,
                );
            }
            idle_since = match (self.conns.is_empty(), idle_since) {
                (false, _) => None,
                (true, None) => Some(std::time::Instant::now()),
                (true, since) => since,
            };
            // Packets in and out, timers, completions; every wake-up also moves the data path.
            let woken = self.dispatcher.drive();
            if !woken.is_empty() || self.dispatcher.dp.moved_packets {
                spin.worked(std::time::Instant::now());
                self.wake(&woken);
            }
        }
        let tokens: Vec<usize> = self.conns.keys().copied().collect();
        for t in tokens {
            self.close_conn(t, "daemon shutdown");
        }
        self.dispatcher.dp.flush_captures();
        if !self.activated {
            let _ = std::fs::remove_file(&self.config.socket);
        }
        tracing::info!("daemon stopped");
        Ok(())
    }

    fn accept_all(&mut self) {
        loop {
            match softverbs_ipc::accept(self.listener.as_fd()) {
                Ok(Some(sock)) => {
                    let cred = match softverbs_ipc::peer_cred(sock.as_fd()) {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::warn!("peer credentials unavailable: {e}");
                            continue;
                        }
                    };
                    // A connection is a descriptor of the daemon's, charged to its uid until it
                    // closes, whether or not it opens a device (docs/guide/limits.md).
                    let core = &mut self.dispatcher.core;
                    let charged = core.charge_uid(cred.uid, Resource::Descriptors, 1).is_ok();
                    if !charged {
                        let n = self.refused.entry(cred.uid).or_default();
                        if *n >= REFUSED_PER_UID {
                            tracing::debug!(
                                uid = cred.uid,
                                "connection closed: over the uid's descriptors"
                            );
                            continue;
                        }
                        *n += 1;
                    }
                    let token = self.next_token;
                    self.next_token += 1;
                    let conn = Conn::new(sock, cred, charged);
                    if let Err(e) = self.poll.registry().register(
                        &mut SourceFd(&conn.sock.as_raw_fd()),
                        Token(token),
                        Interest::READABLE,
                    ) {
                        tracing::warn!("cannot watch a new connection: {e}");
                        self.release_conn(&conn);
                        continue;
                    }
                    tracing::debug!(pid = cred.pid, uid = cred.uid, token, "client connected");
                    self.conns.insert(token, conn);
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn read_conn(&mut self, token: usize) {
        loop {
            let Some(conn) = self.conns.get_mut(&token) else {
                return;
            };
            if !conn.out.is_empty() {
                // Backpressure: answer what is queued before reading more.
                return;
            }
            let dgram = match softverbs_ipc::recv(conn.sock.as_fd(), &mut self.buf) {
                Ok(Some(d)) => d,
                Ok(None) => return self.close_conn(token, "end of stream"),
                Err(Errno::AGAIN) => return,
                Err(Errno::INTR) => continue,
                Err(e) => return self.close_conn(token, &format!("receive failed: {e}")),
            };
            if dgram.truncated || dgram.fds_truncated {
                return self.close_conn(token, "message larger than the protocol allows");
            }
            if !conn.charged {
                // Over the uid's descriptors at accept: whatever it asks (a Hello) is refused
                // as a full device table refuses, and the connection goes.
                let reply = encode_response(peek_cmd(&self.buf[..dgram.len]), ENOMEM, &[], 0);
                let _ = softverbs_ipc::send(conn.sock.as_fd(), &reply, &[]);
                return self.close_conn(token, "over the uid's share of descriptors");
            }
            conn.session.sender_pid = dgram.sender_pid;
            let outcome =
                self.dispatcher
                    .handle(&mut conn.session, &self.buf[..dgram.len], dgram.fds);
            if let Some(ctx) = conn.session.ctx() {
                self.by_ctx.entry(ctx).or_insert(token);
            }
            let reply = Outgoing {
                bytes: outcome.reply,
                fds: outcome.fds,
            };
            self.wake(&outcome.woken);
            if !self.send_or_queue(token, reply) {
                return;
            }
        }
    }

    /// Sends a reply now, or queues it and asks for writability. Returns false if the
    /// connection was closed or is now waiting to write.
    fn send_or_queue(&mut self, token: usize, reply: Outgoing) -> bool {
        let Some(conn) = self.conns.get_mut(&token) else {
            return false;
        };
        if conn.out.is_empty() {
            let fds: Vec<BorrowedFd<'_>> = reply.fds.iter().map(|f| f.as_fd()).collect();
            match softverbs_ipc::send(conn.sock.as_fd(), &reply.bytes, &fds) {
                Ok(()) => return true,
                Err(Errno::AGAIN) => {}
                Err(e) => {
                    self.close_conn(token, &format!("send failed: {e}"));
                    return false;
                }
            }
        }
        conn.out.push_back(reply);
        if conn.out.len() > MAX_QUEUED_REPLIES {
            self.close_conn(token, "client does not read its replies");
            return false;
        }
        let _ = self.poll.registry().reregister(
            &mut SourceFd(&conn.sock.as_raw_fd()),
            Token(token),
            Interest::READABLE | Interest::WRITABLE,
        );
        false
    }

    fn flush_conn(&mut self, token: usize) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        while let Some(r) = conn.out.front() {
            let fds: Vec<BorrowedFd<'_>> = r.fds.iter().map(|f| f.as_fd()).collect();
            match softverbs_ipc::send(conn.sock.as_fd(), &r.bytes, &fds) {
                Ok(()) => {
                    conn.out.pop_front();
                }
                Err(Errno::AGAIN) => return,
                Err(e) => return self.close_conn(token, &format!("send failed: {e}")),
            }
        }
        let _ = self.poll.registry().reregister(
            &mut SourceFd(&conn.sock.as_raw_fd()),
            Token(token),
            Interest::READABLE,
        );
        // Requests may have arrived while we waited to write.
        self.read_conn(token);
    }

    fn wake(&mut self, woken: &[CtxId]) {
        for ctx in woken {
            if let Some(conn) = self.by_ctx.get(ctx).and_then(|t| self.conns.get(t)) {
                if let Some(efd) = &conn.session.eventfd {
                    softverbs_ipc::signal_eventfd(efd.as_fd());
                }
            }
        }
    }

    /// Gives back what accepting `conn` charged (or its place among the refused).
    fn release_conn(&mut self, conn: &Conn) {
        let uid = conn.session.cred.uid;
        if conn.charged {
            let core = &mut self.dispatcher.core;
            core.uncharge_uid(uid, Resource::Descriptors, 1);
        } else if let Some(n) = self.refused.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                self.refused.remove(&uid);
            }
        }
    }

    fn close_conn(&mut self, token: usize, why: &str) {
        let Some(conn) = self.conns.remove(&token) else {
            return;
        };
        self.release_conn(&conn);
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&conn.sock.as_raw_fd()));
        if let Some(ctx) = conn.session.ctx() {
            self.by_ctx.remove(&ctx);
            if let Some(d) = self.doorbells.remove(&ctx) {
                let _ = self
                    .poll
                    .registry()
                    .deregister(&mut SourceFd(&d.as_raw_fd()));
            }
            let (woken, r) = self.dispatcher.close_context(ctx);
            if let Err(e) = r {
                tracing::error!(ctx = ctx.0, "context teardown failed: {e}");
            }
            self.wake(&woken);
            tracing::info!(pid = conn.session.cred.pid, comm = %conn.session.comm, ctx = ctx.0, why, "context closed");
        } else {
            tracing::debug!(pid = conn.session.cred.pid, why, "connection closed");
        }
    }
}
