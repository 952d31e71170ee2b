//! The daemon's data path: one transport engine per device, its UDP side, client memory,
//! and the completion queues clients poll.
//!
//! The core stays the authority on objects; this mirrors what the engines need (QPs, SRQs,
//! CQs) as commands succeed, moves packets (in-process between this daemon's own devices, over
//! UDP to others), runs the engines' timers, and turns engine outputs into CQ entries and
//! async events.

use foldhash::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use softverbs_abi::convert;
use softverbs_abi::msg::{send_flags, PostRecvReq, QueuesResp, SendWrWire, WcWire};
use softverbs_core::attr::QpAttr;
use softverbs_core::datapath::{OwnedQpInfo, SrqInfo};
use softverbs_core::device::Gid;
use softverbs_core::event::EventElement;
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::types::{Access, EventType, Mtu, QpType};
use softverbs_core::{Core, CoreChange};
use softverbs_memaccess::{ProcessMem, ProcessMemory, RegionId, SharedMappings};
use softverbs_shm::{Consumer, Producer, ReadySet, Region, RingLayout, WorkFlag, WORK_FLAG_SIZE};
use softverbs_transport::cq::{CompChannel, CompletionQueue, Delivery};
use softverbs_transport::faults::Faults;
use softverbs_transport::wr::{RecvWr, SendWr, WcStatus, WorkCompletion};
use softverbs_transport::{cq_id, DropStats};
use softverbs_transport::{CqId, Engine, Output, PostError, QpConfig, SrqConfig, MAX_PACKET};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use zerocopy::little_endian::{U32, U64};
use zerocopy::FromBytes;

use crate::netdev::{engine_time, until, NetDev};

pub mod counters;
mod direct_ops;
mod fed_srq;
mod mcast;
mod net_path;
use crate::sq_retire::SqRetire;
pub use direct_ops::RemoteRefusal;
pub use fed_srq::FedSrqShare;
pub(crate) use net_path::stale;

use softverbs_core::errno::{EBUSY, EEXIST, EINVAL, ENOENT, ENOMEM};

struct Dev {
    engine: Engine,
    net: Option<NetDev>,
    gid: Gid,
    /// Every address of the device (its GID table's used slots, `gids[0]` = `gid`).
    gids: Vec<Gid>,
    /// The UDP sockets of its further addresses (`gids[1..]`), when it is on the network.
    more_net: Vec<NetDev>,
    port_mtu: Mtu,
}

impl Dev {
    /// The source GID of a packet to `dgid` from GID index `sgid_index`: that slot, unless
    /// it is of the other IP family (or empty), then the device's first GID of `dgid`'s.
    fn sgid_for(&self, sgid_index: u8, dgid: Gid) -> Gid {
        let v4 = |g: &Gid| g.to_ip().is_ipv4();
        self.gids
            .get(usize::from(sgid_index))
            .filter(|g| v4(g) == v4(&dgid))
            .or_else(|| self.gids.iter().find(|g| v4(g) == v4(&dgid)))
            .copied()
            .unwrap_or(self.gid)
    }

    /// Every socket of the device, its first address's first.
    fn sockets(&mut self) -> impl Iterator<Item = &mut NetDev> {
        self.net.iter_mut().chain(self.more_net.iter_mut())
    }

    /// Socket `k`: the first address's (0) or further address `k`'s.
    fn socket_at(&mut self, k: usize) -> Option<&mut NetDev> {
        match k {
            0 => self.net.as_mut(),
            k => self.more_net.get_mut(k - 1),
        }
    }

    /// The socket that sends from address `src`.
    fn socket_from(&mut self, src: Gid) -> Option<&mut NetDev> {
        let ip = src.to_ip();
        self.sockets().find(|n| n.local() == ip)
    }
}

/// A completion channel (`ibv_comp_channel`): CQs that fired, and the eventfd that says so.
struct Channel {
    efd: std::os::fd::OwnedFd,
    fired: CompChannel<Handle>,
}

/// Network options of the data path.
#[derive(Clone, Debug, Default)]
pub struct NetOptions {
    /// Bind each device's UDP port (4791); without it devices reach only each other.
    pub bind: bool,
    /// Port to bind (4791 unless testing).
    pub port: u16,
    /// Faults to inject into what the devices send.
    pub faults: Option<Faults>,
    /// Directory to write one pcap per device into.
    pub capture_dir: Option<std::path::PathBuf>,
    /// Whether the captures keep the packets the daemon rejected, each marked with its
    /// reason (`--capture-rejected`: pcapng files; docs/guide/capture.md).
    pub capture_rejected: crate::capture::Rejected,
    /// Every device's retry floor (`softverbs_transport::time::RETRY_FLOOR`, the default;
    /// `--retry-floor-ms`): the daemon's engines and its net-path libraries' retry by it.
    pub retry_floor: std::time::Duration,
    /// How the devices check received ICRCs (`[icrc]`; docs/design/roce-wire.md §6).
    pub icrc: crate::netdev::IcrcPolicy,
}

/// Engines, devices, memory and CQs of one daemon.
pub struct DataPath {
    /// Whether the last [`drive`](DataPath::drive) moved any packet: the event loop keeps
    /// polling after work that arrived without an epoll event (ring entries, packets behind
    /// an edge already reported).
    pub moved_packets: bool,
    devs: Vec<Dev>,
    mem: SharedMappings<ProcessMem>,
    /// CQ semantics (crates/transport/src/cq.rs); the rings and eventfds stay here.
    cqs: HashMap<CqId, CompletionQueue>,
    ctx_cqs: HashMap<CtxId, HashSet<CqId>>,
    qp_dev: HashMap<u32, usize>,
    /// QPs whose library runs their engine, and the contexts' private sockets
    /// (docs/design/net-path.md, `net_path`).
    net_path: net_path::NetPaths,
    mr_regions: HashMap<(CtxId, Handle), RegionId>,
    /// A descriptor of each shared-memory MR's memfd, with the MR's address and length, for
    /// the direct path's peers to map (`DirectMrFd`, crates/daemon/src/direct/mr_fd.rs).
    mr_fds: HashMap<(CtxId, Handle), (std::os::fd::OwnedFd, u64, u64)>,
    channels: HashMap<(CtxId, u32), Channel>,
    next_channel: u32,
    qp_rings: HashMap<u32, QpRings>,
    /// Which QP rings to visit next round (by QPN): those announced through a context's
    /// ready ring, those still holding work, and those of clients without a ready ring.
    qp_sched: ReadySet<u32>,
    /// QPNs of the QPs with rings, by context.
    ctx_qp_rings: HashMap<CtxId, HashSet<u32>>,
    /// Ready rings of contexts (ABI 6), with the QPs whose work flag they announce.
    ready: HashMap<CtxId, ReadyRing>,
    /// The QPs of the round being run (scratch, kept across rounds).
    visit: Vec<u32>,
    /// QPs whose send completions the round wrote, to settle their retired count at its end.
    settle: Vec<u32>,
    /// What the rounds cost, in ring visits.
    stats: RoundStats,
    cq_rings: HashMap<CqId, Producer>,
    /// CQs grown by `resize_cq` beyond their ring: new completions go to the PollCq queue
    /// (the client drains the ring first, then polls by command), the ring only counts.
    cq_rings_outgrown: HashSet<CqId>,
    /// Receive rings of SRQs, by (owner, handle), with the device whose engine holds the SRQ.
    srq_rings: HashMap<(CtxId, Handle), (usize, Consumer)>,
    /// SRQs whose ring held an entry the engine refused: the owner gets IBV_EVENT_SRQ_ERR.
    srq_faults: Vec<(CtxId, Handle)>,
    /// SRQs the engine takes from one receive at a time, shared with direct peers
    /// (`fed_srq`).
    fed_srqs: HashMap<(CtxId, Handle), fed_srq::FedSrq>,
    /// Fed SRQs whose limit was crossed: the owner gets IBV_EVENT_SRQ_LIMIT_REACHED.
    srq_limit_hits: Vec<(CtxId, Handle)>,
    /// Scratch entries for [`pump_rings`](Self::pump_rings) (send WQE, receive WQE).
    ring_scratch: (Vec<u8>, Vec<u8>),
    doorbells: HashMap<CtxId, OwnedFd>,
    new_doorbells: Vec<(CtxId, OwnedFd)>,
    epoch: Instant,
    /// The loop's own stalls, by the engines' clock: lateness of a round against the
    /// planned wake-up ([`sleeping`](Self::sleeping)), passed to every engine before the
    /// round (docs/design/net-path.md, "Stalls").
    stalls: softverbs_transport::time::StallMeter,
    buf: Vec<u8>,
    /// Multicast packets and MADs received, for the round that handles them.
    rx_scratch: Vec<u8>,
    /// Receive only from sockets the event loop reported readable since they were last found
    /// empty ([`gate_receives`](Self::gate_receives)).
    gate_rx: bool,
    /// The devices' connection managers on QP1 (docs/design/cm.md §4).
    pub cm: crate::cm::CmPorts,
    /// Every address of every device of this daemon: a packet from the network claiming one
    /// of them as its source is forged (this daemon's own traffic between its devices never
    /// crosses a socket), whatever local user sent it (docs/design/security.md, "CM").
    own_gids: Vec<Gid>,
    /// RoCE packets dropped for that, since start.
    pub own_source_drops: u64,
    /// CQs of direct QPs to wake when their retries would have run out (`direct_ops`).
    direct_wakes: Vec<(Instant, CtxId, Handle)>,
}

/// Whether the process path batches (docs/design/registered-memory.md, "One system call per work
/// request"): on unless `SOFTVERBS_MEM_BATCH=0` (for measuring against per-packet access).
fn mem_batching() -> bool {
    std::env::var_os("SOFTVERBS_MEM_BATCH").is_none_or(|v| v != "0")
}

/// The errno `ibv_post_send(3)` / `ibv_post_recv(3)` return for an engine refusal: a full
/// queue is `ENOMEM`, anything else `EINVAL`.
fn post_errno(e: PostError) -> i32 {
    match e {
        PostError::NoQueue | PostError::BadState | PostError::Invalid => EINVAL,
        PostError::Full => ENOMEM,
    }
}

/// Why device `device` cannot play its NIC: its address, port and the OS error, by errno
/// name, with what to do about the two usual causes (bind(2): `EADDRINUSE`, `EADDRNOTAVAIL`).
fn bind_error(device: &str, ip: std::net::IpAddr, port: u16, e: &std::io::Error) -> std::io::Error {
    let addr = std::net::SocketAddr::new(ip, port);
    // "Address already in use (EADDRINUSE, os error 98)": the errno by name, as bind(2) has it.
    let what = match e.raw_os_error() {
        Some(n) => {
            let text = e.to_string();
            let text = text
                .strip_suffix(&format!(" (os error {n})"))
                .unwrap_or(&text);
            format!(
                "{text} ({:?}, os error {n})",
                nix::errno::Errno::from_raw(n)
            )
        }
        None => e.to_string(),
    };
    let hint = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            ": another daemon (or program) holds this address's RoCE port; give this daemon \
             another --device address, or run it with --no-network"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            ": no interface of this host has this address; add it (ip addr add) or give \
             --device an address of this host"
        }
        _ => "",
    };
    std::io::Error::new(
        e.kind(),
        format!("device {device}: cannot bind UDP {addr}: {what}{hint}"),
    )
}

/// The answer to `MapQueues` for a region of `len` bytes holding the one ring `l` at its start.
pub(crate) fn one_ring(len: usize, l: &RingLayout) -> QueuesResp {
    QueuesResp {
        region_len: U64::new(len as u64),
        a_offset: U32::new(0),
        a_capacity: U32::new(l.capacity()),
        a_entry: U32::new(l.entry_size() as u32),
        ..Default::default()
    }
}

impl DataPath {
    /// A data path for the core's devices. With [`NetOptions::bind`], every device's UDP
    /// port must bind: a device whose address another daemon holds, or that no interface of
    /// this host has, would drop all its traffic, so the daemon refuses to start instead
    /// ([`bind_error`]).
    pub fn new(core: &Core, net: &NetOptions) -> std::io::Result<DataPath> {
        let mut devs = Vec::new();
        let capture_dir = match &net.capture_dir {
            Some(dir) if net.bind => Some(crate::capture::CaptureDir::open(dir)?),
            Some(dir) => {
                // Captures belong to device sockets (docs/guide/capture.md): said, not silent.
                tracing::warn!(
                    "--capture {}: this daemon has no network, so nothing is captured",
                    dir.display()
                );
                None
            }
            None => None,
        };
        for (i, d) in core.devices().iter().enumerate() {
            let port = &d.ports[0];
            let gid = port.gids[0];
            let mut netdev = None;
            if net.bind {
                let mut n = NetDev::bind(gid.to_ip(), net.port)
                    .map_err(|e| bind_error(&d.name, gid.to_ip(), net.port, &e))?;
                n.set_icrc_policy(net.icrc.clone())
                    .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", d.name)))?;
                if let Some(f) = net.faults {
                    n.inject(f, 0x5eed ^ i as u64);
                }
                if let Some(dir) = &capture_dir {
                    let name = net.capture_rejected.file_name(&d.name);
                    n.capture_to(dir.create(&name, net.capture_rejected)?);
                }
                tracing::info!(device = %d.name, addr = %gid.to_ip(), port = net.port, "device on the network");
                netdev = Some(n);
            }
            let gids: Vec<Gid> = port
                .gids
                .iter()
                .copied()
                .filter(|g| *g != Gid::default())
                .collect();
            let mut more_net = Vec::new();
            // A device's further addresses (IPv6 beside IPv4, ...) get sockets of their
            // own, so that it reaches other hosts over each (docs/design/cm.md §7).
            for (k, g) in gids.iter().enumerate().skip(1).filter(|_| net.bind) {
                let ip = g.to_ip();
                let mut n = NetDev::bind(ip, net.port)
                    .map_err(|e| bind_error(&d.name, ip, net.port, &e))?;
                n.set_icrc_policy(net.icrc.clone())
                    .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", d.name)))?;
                if let Some(f) = net.faults {
                    n.inject(f, 0x5eed ^ i as u64 ^ (k as u64) << 32);
                }
                if let Some(dir) = &capture_dir {
                    let name = net.capture_rejected.file_name(&format!("{}-{k}", d.name));
                    n.capture_to(dir.create(&name, net.capture_rejected)?);
                }
                tracing::info!(device = %d.name, addr = %ip, port = net.port, "device on the network");
                more_net.push(n);
            }
            let mut engine = Engine::new();
            engine.set_retry_floor(net.retry_floor);
            engine.set_gids(gids.clone());
            devs.push(Dev {
                engine,
                net: netdev,
                gid,
                gids,
                more_net,
                port_mtu: port.active_mtu,
            });
        }
        let ips: Vec<Vec<std::net::IpAddr>> = devs
            .iter()
            .map(|d| d.gids.iter().map(|g| g.to_ip()).collect())
            .collect();
        let mut cm = crate::cm::CmPorts::new(&ips);
        if capture_dir.is_some() {
            cm.copy_own_mads();
        }
        Ok(DataPath {
            direct_wakes: Vec::new(),
            own_gids: devs.iter().flat_map(|d| d.gids.iter().copied()).collect(),
            own_source_drops: 0,
            cm,
            devs,
            mem: SharedMappings::with_fallback(ProcessMem::new().with_batching(mem_batching())),
            cqs: HashMap::default(),
            ctx_cqs: HashMap::default(),
            qp_dev: HashMap::default(),
            net_path: net_path::NetPaths::default(),
            mr_regions: HashMap::default(),
            mr_fds: HashMap::default(),
            channels: HashMap::default(),
            next_channel: 1,
            qp_rings: HashMap::default(),
            qp_sched: ReadySet::with_grace(IDLE_GRACE_ROUNDS),
            ctx_qp_rings: HashMap::default(),
            ready: HashMap::default(),
            visit: Vec::new(),
            settle: Vec::new(),
            stats: RoundStats::default(),
            cq_rings: HashMap::default(),
            cq_rings_outgrown: HashSet::default(),
            srq_rings: HashMap::default(),
            srq_faults: Vec::new(),
            fed_srqs: HashMap::default(),
            srq_limit_hits: Vec::new(),
            ring_scratch: (Vec::new(), Vec::new()),
            doorbells: HashMap::default(),
            new_doorbells: Vec::new(),
            epoch: Instant::now(),
            stalls: Default::default(),
            buf: vec![0; MAX_PACKET],
            rx_scratch: vec![0; MAX_PACKET],
            gate_rx: false,
            moved_packets: false,
        })
    }

    /// Each device socket's address and where it receives (`"raw"` or `"udp"`,
    /// `NetDev::rx_mode`), by device index, for `softverbs status`.
    pub fn rx_modes(&self) -> Vec<(usize, std::net::IpAddr, &'static str)> {
        self.devs
            .iter()
            .enumerate()
            .flat_map(|(i, d)| {
                d.net
                    .iter()
                    .chain(&d.more_net)
                    .map(move |n| (i, n.local(), n.rx_mode()))
            })
            .collect()
    }

    /// The UDP sockets, to watch for readability (device index, fd).
    pub fn net_fds(&self) -> Vec<(usize, BorrowedFd<'_>)> {
        self.devs
            .iter()
            .enumerate()
            .flat_map(|(i, d)| d.net.iter().chain(&d.more_net).map(move |n| (i, n.fd())))
            .collect()
    }

    /// From now on [`drive`](Self::drive) receives from a device's sockets only after
    /// [`mark_readable`](Self::mark_readable) said they may hold packets, not in every round:
    /// for an event loop that watches [`net_fds`](Self::net_fds) and the group sockets
    /// edge-triggered and reports every readiness event. Without it every round of a drive
    /// asked every socket, and an idle daemon's wake-up cost two or more receives that
    /// returned `EAGAIN` (docs/performance.md "Issue 16: two daemons").
    pub fn gate_receives(&mut self) {
        self.gate_rx = true;
    }

    /// One of device `dev`'s sockets, or with `None` any socket of any device (group sockets
    /// share one event token), became readable.
    pub fn mark_readable(&mut self, dev: Option<usize>) {
        for (i, d) in self.devs.iter_mut().enumerate() {
            if dev.is_none_or(|x| x == i) {
                for n in d.sockets() {
                    n.mark_readable();
                }
            }
        }
    }

    /// How long until an engine timer is due.
    pub fn next_timeout(&self) -> Option<Duration> {
        self.devs
            .iter()
            .filter_map(|d| d.engine.poll_timeout())
            .chain(self.cm.poll_timeout())
            .min()
            .map(|t| until(self.epoch, t))
            .into_iter()
            .chain(self.direct_next_wake())
            .chain(self.net_watch_next())
            .chain(self.captures_due())
            .min()
    }

    /// Flushes capture files.
    pub fn flush_captures(&mut self) {
        for d in &mut self.devs {
            for n in d.sockets() {
                if let Some(c) = n.capture() {
                    c.flush();
                }
            }
        }
    }

    /// Flushes the capture files whose oldest unwritten packet waited long enough
    /// (capture.rs, [`crate::capture::FLUSH_AFTER`]).
    fn flush_captures_due(&mut self) {
        let now = Instant::now();
        for d in &mut self.devs {
            for n in d.sockets() {
                if let Some(c) = n.capture() {
                    c.flush_if_due(now);
                }
            }
        }
    }

    /// How long until a capture file must be flushed: the loop wakes for it, so a packet
    /// recorded just before the daemon fell idle still reaches the file in time.
    fn captures_due(&self) -> Option<Duration> {
        self.devs
            .iter()
            .flat_map(|d| d.net.iter().chain(&d.more_net))
            .filter_map(NetDev::capture_due)
            .min()
            .map(|t| t.saturating_duration_since(Instant::now()))
    }

    /// Records a packet device `d` hands to device `t` of this daemon (no socket carries it)
    /// in the captures of the sending address and, when another socket owns the
    /// destination address, of that one too: what captures on two NICs would show.
    fn capture_local(&mut self, d: usize, t: usize, src: Gid, dst: Gid, pkt: &[u8]) {
        let dst_ip = dst.to_ip();
        if let Some(n) = self.devs[d].socket_from(src) {
            n.record_local(dst_ip, pkt);
        }
        if (t, dst) != (d, src) {
            // The receiving socket records it as sent from `src` (its own view).
            let src_ip = src.to_ip();
            if let Some(n) = self.devs[t].socket_from(dst) {
                n.record_local_received(src_ip, pkt);
            }
        }
    }

    // ---- mirroring core objects -----------------------------------------------------------

    /// Applies one change the core made ([`Core::poll_change`]): the one way objects reach
    /// the engines and the data path's tables.
    pub fn apply(&mut self, change: CoreChange) {
        match change {
            CoreChange::ContextClosed { ctx } => self.context_closed(ctx),
            CoreChange::CqCreated { ctx, cq, cqe } => self.cq_created(ctx, cq, cqe),
            CoreChange::CqResized { ctx, cq, cqe } => self.cq_resized(ctx, cq, cqe),
            CoreChange::CqDestroyed { ctx, cq } => self.cq_destroyed(ctx, cq),
            CoreChange::QpCreated {
                ctx, device, info, ..
            } => self.qp_created(ctx, device, &info),
            CoreChange::XrcRecvQpCreated { device, qpn } => self.xrc_recv_created(device, qpn),
            CoreChange::QpModified { qpn, attr } => self.qp_modified(qpn, &attr),
            CoreChange::QpDestroyed { qpn } => self.qp_destroyed(qpn),
            CoreChange::SrqCreated {
                ctx,
                srq,
                device,
                info,
            } => self.srq_created(ctx, srq, device, &info),
            CoreChange::SrqLimitArmed { ctx, srq, limit } => self.srq_limit(ctx, srq, limit),
            CoreChange::SrqDestroyed { ctx, srq } => self.srq_destroyed(ctx, srq),
            // Either way the shared mapping (if any) no longer backs the MR.
            CoreChange::MrDeregistered { ctx, mr } | CoreChange::MrRangeChanged { ctx, mr } => {
                self.mr_deregistered(ctx, mr)
            }
            CoreChange::McastAttached {
                device, mgid, qpn, ..
            } => self.mcast_attached(device, mgid, qpn),
            CoreChange::McastDetached {
                device,
                mgid,
                qpn,
                last,
            } => self.mcast_detached(device, mgid, qpn, last),
            CoreChange::MwAllocated { device, info, .. } => {
                self.devs[device].engine.add_window(&info)
            }
            CoreChange::MwDeallocated { device, rkey, .. } => {
                self.devs[device].engine.remove_window(rkey)
            }
        }
    }

    /// Tells the core which MRs the engines' memory windows are bound to (a deregistration
    /// of an MR with bound windows is refused: docs/design/memory-windows.md). Run after every
    /// command's changes and in every round, so the next command sees the engines' state.
    pub fn settle_windows(&mut self, core: &mut Core) {
        for d in &mut self.devs {
            while let Some(n) = d.engine.poll_window_note() {
                core.note_window_binding(n.ctx, n.mr, n.bound);
            }
        }
    }

    /// A context was opened; `memory` is the opener's own `mem` descriptor (none from an
    /// older client: then only its shared MRs can be reached).
    pub fn context_opened(&mut self, ctx: CtxId, memory: Option<ProcessMemory>) {
        if let Some(m) = memory {
            self.mem.fallback_mut().register_process(ctx, m);
        }
    }

    /// `reg_mr`/`rereg_mr` of `len` bytes at `addr` with `access`: `EFAULT` if some page is
    /// not mapped readable, or not writable while `access` lets the MR be written (the
    /// flags for which `ib_umem_get` pins with `FOLL_WRITE`), judged through the opener's
    /// own `maps` descriptor (docs/design/registered-memory.md, "Writes to read-only pages").
    pub fn check_range(&self, ctx: CtxId, addr: u64, len: u64, access: Access) -> Result<(), i32> {
        let write = access.intersects(
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC | Access::MW_BIND,
        );
        self.mem
            .fallback()
            .check_range(ctx, addr, len, write)
            .map_err(|e| {
                tracing::debug!(ctx = ctx.0, "reg_mr refused: {e}");
                e.errno()
            })
    }

    /// `ibv_advise_mr` prefetch of `[addr, addr+len)` of `ctx`: makes every page present by
    /// reading one byte of it as an on-demand-paging access would (the client's address space
    /// as mapped now), so the kernel faults it in. `EFAULT` at the first page that is not
    /// mapped.
    pub fn prefetch(&mut self, ctx: CtxId, addr: u64, len: u64) -> Result<(), i32> {
        use softverbs_transport::Memory;
        const PAGE: u64 = 4096;
        let end = addr.checked_add(len).ok_or(softverbs_core::errno::EFAULT)?;
        let mut at = addr;
        let mut byte = [0u8; 1];
        while at < end {
            self.mem
                .read_mapped(ctx, at, &mut byte)
                .map_err(|_| softverbs_core::errno::EFAULT)?;
            at = (at / PAGE + 1).saturating_mul(PAGE);
        }
        Ok(())
    }

    /// A context was closed (the QPs that went with it came first, as `QpDestroyed`).
    fn context_closed(&mut self, ctx: CtxId) {
        // By the context's own sets, so closing a context costs what it held, not what the
        // whole daemon holds.
        for cq in self.ctx_cqs.remove(&ctx).unwrap_or_default() {
            self.cqs.remove(&cq);
            self.cq_rings.remove(&cq);
            self.cq_rings_outgrown.remove(&cq);
        }
        self.mr_regions.retain(|(c, _), _| *c != ctx);
        self.mr_fds.retain(|(c, _), _| *c != ctx);
        self.channels.retain(|(c, _), _| *c != ctx);
        for qpn in self.ctx_qp_rings.remove(&ctx).unwrap_or_default() {
            self.forget_qp_rings(qpn);
        }
        self.ready.remove(&ctx);
        self.srq_rings.retain(|(c, _), _| *c != ctx);
        self.fed_srqs.retain(|(c, _), _| *c != ctx);
        self.doorbells.remove(&ctx);
        self.mem.remove_context(ctx);
        self.mem.fallback_mut().unregister_process(ctx);
        for d in &mut self.devs {
            d.engine.forget_srqs_of(ctx);
        }
        let now = self.now();
        self.cm.close_context(now, ctx);
        self.net_context_closed(ctx);
    }

    /// `ibv_create_comp_channel`: returns the channel's handle and the client's end of its
    /// eventfd.
    pub fn create_channel(&mut self, ctx: CtxId) -> std::io::Result<(u32, std::os::fd::OwnedFd)> {
        let efd = softverbs_ipc::new_eventfd()?;
        let client = efd.try_clone()?;
        let h = self.next_channel;
        self.next_channel = self.next_channel.wrapping_add(1).max(1);
        self.channels.insert(
            (ctx, h),
            Channel {
                efd,
                fired: CompChannel::new(),
            },
        );
        Ok((h, client))
    }

    /// Whether CQ `cq` of `ctx` is armed and has a channel to fire (ibv_req_notify_cq(3)).
    pub fn cq_armed(&self, ctx: CtxId, cq: softverbs_core::ids::Handle) -> bool {
        self.cqs
            .get(&cq_id(ctx, cq))
            .is_some_and(|c| c.channel().is_some() && c.armed().is_some())
    }

    /// True if `ctx` has channel `h`.
    pub fn has_channel(&self, ctx: CtxId, h: u32) -> bool {
        self.channels.contains_key(&(ctx, h))
    }

    /// `ibv_destroy_comp_channel`: `EBUSY` while a CQ reports to it.
    pub fn destroy_channel(&mut self, ctx: CtxId, h: u32) -> Result<(), i32> {
        if !self.channels.contains_key(&(ctx, h)) {
            return Err(ENOENT);
        }
        let used = self.ctx_cqs.get(&ctx).is_some_and(|s| {
            s.iter()
                .any(|id| self.cqs.get(id).is_some_and(|c| c.channel() == Some(h)))
        });
        if used {
            return Err(EBUSY);
        }
        self.channels.remove(&(ctx, h));
        Ok(())
    }

    /// `ibv_req_notify_cq`: the next completion (only a solicited or unsuccessful one with
    /// `solicited_only`) raises an event on the CQ's channel (IBA 11.4.2.2).
    pub fn req_notify(&mut self, ctx: CtxId, cq: Handle, solicited_only: bool) -> Result<(), i32> {
        let c = self.cqs.get_mut(&cq_id(ctx, cq)).ok_or(EINVAL)?;
        c.arm(solicited_only);
        Ok(())
    }

    /// `ibv_get_cq_event` without blocking: the next CQ that fired on channel `h`.
    pub fn next_cq_event(&mut self, ctx: CtxId, h: u32) -> Result<Option<Handle>, i32> {
        let ch = self.channels.get_mut(&(ctx, h)).ok_or(EINVAL)?;
        Ok(ch.fired.next_event())
    }

    /// A CQ was created.
    fn cq_created(&mut self, ctx: CtxId, cq: Handle, cqe: u32) {
        let id = cq_id(ctx, cq);
        self.cqs.insert(id, CompletionQueue::new(cqe, None));
        self.ctx_cqs.entry(ctx).or_default().insert(id);
    }

    /// The new CQ `cq` reports to completion channel `channel` (checked by
    /// [`has_channel`](Self::has_channel)); the channel is the data path's, not the core's.
    pub fn set_cq_channel(&mut self, ctx: CtxId, cq: Handle, channel: u32) {
        if let Some(c) = self.cqs.get_mut(&cq_id(ctx, cq)) {
            c.set_channel(Some(channel));
        }
    }

    /// Completions of a CQ not yet polled (its PollCq queue and its ring), or `None` for an
    /// unknown CQ.
    pub fn cq_outstanding(&mut self, ctx: CtxId, cq: Handle) -> Option<u32> {
        let id = cq_id(ctx, cq);
        let queued = self.cqs.get(&id)?.queued() as u32;
        let in_ring = match self.cq_rings.get_mut(&id) {
            Some(p) => {
                let cap = p.layout().capacity();
                cap - p.free().unwrap_or(cap)
            }
            None => 0,
        };
        Some(queued + in_ring)
    }

    /// A CQ was resized. Rings are not remapped: a CQ that outgrows its ring keeps the ring for
    /// the completions already in it and queues the rest for PollCq, which the client switches
    /// to by the same rule (`Cq::resize` in the client), so no completion is lost and order
    /// holds (everything in the ring is older than anything queued).
    fn cq_resized(&mut self, ctx: CtxId, cq: Handle, cqe: u32) {
        let id = cq_id(ctx, cq);
        if let Some(c) = self.cqs.get_mut(&id) {
            c.resize(cqe);
        }
        if self
            .cq_rings
            .get(&id)
            .is_some_and(|p| cqe > p.layout().capacity())
        {
            self.cq_rings_outgrown.insert(id);
        }
    }

    /// A CQ was destroyed.
    fn cq_destroyed(&mut self, ctx: CtxId, cq: Handle) {
        let id = cq_id(ctx, cq);
        self.cqs.remove(&id);
        self.cq_rings.remove(&id);
        self.cq_rings_outgrown.remove(&id);
        if let Some(s) = self.ctx_cqs.get_mut(&ctx) {
            s.remove(&id);
        }
    }

    /// An owned QP was created on device `dev`.
    fn qp_created(&mut self, ctx: CtxId, dev: usize, i: &OwnedQpInfo) {
        let cfg = QpConfig {
            qpn: i.qpn,
            qp_type: i.qp_type,
            pd: Some(i.pd),
            send_cq: Some(cq_id(ctx, i.send_cq)),
            recv_cq: i.recv_cq.map(|h| cq_id(ctx, h)),
            srq: i.srq.map(|h| (ctx, h)),
            sq_sig_all: i.sq_sig_all,
            max_send_wr: i.cap.max_send_wr,
            max_recv_wr: i.cap.max_recv_wr,
            max_send_sge: i.cap.max_send_sge,
            max_recv_sge: i.cap.max_recv_sge,
            max_inline: i.cap.max_inline_data,
            port_mtu: self.devs[dev].port_mtu,
        };
        self.devs[dev].engine.create_qp(cfg);
        self.qp_dev.insert(i.qpn, dev);
    }

    /// An XRC receive QP `qpn` was created on device `dev`.
    fn xrc_recv_created(&mut self, dev: usize, qpn: u32) {
        let cfg = QpConfig {
            qpn,
            qp_type: QpType::XrcRecv,
            pd: None,
            send_cq: None,
            recv_cq: None,
            srq: None,
            sq_sig_all: false,
            max_send_wr: 0,
            max_recv_wr: 0,
            max_send_sge: 0,
            max_recv_sge: 0,
            max_inline: 0,
            port_mtu: self.devs[dev].port_mtu,
        };
        self.devs[dev].engine.create_qp(cfg);
        self.qp_dev.insert(qpn, dev);
    }

    /// QP `qpn` was modified; `attr` is what the core now holds.
    fn qp_modified(&mut self, qpn: u32, attr: &QpAttr) {
        let Some(&d) = self.qp_dev.get(&qpn) else {
            return;
        };
        self.devs[d].engine.modify_qp(qpn, attr);
        // A transition may retire requests (flush, RESET) without a completion: the next
        // visit publishes the send ring's retired count.
        self.qp_sched.wake(qpn);
        if attr.qp_state == softverbs_core::types::QpState::Reset {
            // Entering RESET also drops the QP's completions not yet polled from its own CQs,
            // as mlx4 and mlx5 clean them (a QP brought back from ERR does not meet its old
            // flushes). Completions already in a client's ring are dropped by the client.
            for cq in self.devs[d].engine.qp_cqs(qpn).into_iter().flatten() {
                if let Some(c) = self.cqs.get_mut(&cq) {
                    c.purge_qp(qpn);
                }
            }
        }
    }

    /// QP `qpn` is gone from the core (its owner destroyed it, or its last holder left).
    fn qp_destroyed(&mut self, qpn: u32) {
        self.net_detach(qpn);
        self.forget_qp_rings(qpn);
        if let Some(d) = self.qp_dev.remove(&qpn) {
            self.devs[d].engine.destroy_qp(qpn);
        }
    }

    /// An SRQ was created on device `dev`.
    fn srq_created(&mut self, ctx: CtxId, srq: Handle, dev: usize, i: &SrqInfo) {
        self.devs[dev].engine.create_srq(SrqConfig {
            key: (ctx, srq),
            pd: i.pd,
            cq: i.cq.map(|h| cq_id(ctx, h)),
            max_wr: i.attr.max_wr,
            max_sge: i.attr.max_sge,
        });
    }

    /// An SRQ's limit was (re)armed.
    fn srq_limit(&mut self, ctx: CtxId, srq: Handle, limit: u32) {
        if self.fed_srq_limit((ctx, srq), limit) {
            return;
        }
        for d in &mut self.devs {
            d.engine.set_srq_limit((ctx, srq), limit);
        }
    }

    /// An SRQ was destroyed.
    fn srq_destroyed(&mut self, ctx: CtxId, srq: Handle) {
        self.srq_rings.remove(&(ctx, srq));
        self.fed_srqs.remove(&(ctx, srq));
        for d in &mut self.devs {
            d.engine.destroy_srq((ctx, srq));
        }
    }

    /// An MR was registered; with `fd` (a sealed memfd the client made of the range) the
    /// daemon maps it and reaches the memory without system calls, otherwise through
    /// `process_vm_readv/writev`.
    pub fn mr_registered(
        &mut self,
        ctx: CtxId,
        mr: Handle,
        addr: u64,
        len: u64,
        fd: Option<impl AsFd>,
    ) -> Result<(), i32> {
        if let Some(fd) = fd {
            let id = self
                .mem
                .add_region(ctx, addr, len, fd.as_fd())
                .map_err(|_| EINVAL)?;
            self.mr_regions.insert((ctx, mr), id);
            if let Ok(keep) = fd.as_fd().try_clone_to_owned() {
                self.mr_fds.insert((ctx, mr), (keep, addr, len));
            }
        }
        Ok(())
    }

    /// An MR was deregistered (or got a new range): after this, nothing touches its mapping.
    fn mr_deregistered(&mut self, ctx: CtxId, mr: Handle) {
        if let Some(id) = self.mr_regions.remove(&(ctx, mr)) {
            self.mem.remove_region(id);
        }
        self.mr_fds.remove(&(ctx, mr));
    }

    /// The memfd of `ctx`'s shared-memory MR over exactly `[addr, addr + len)`, if it has one.
    pub fn shared_mr_fd(&self, ctx: CtxId, addr: u64, len: u64) -> Option<&std::os::fd::OwnedFd> {
        self.mr_fds
            .iter()
            .find(|(&(c, _), &(_, a, l))| c == ctx && a == addr && l == len)
            .map(|(_, (fd, _, _))| fd)
    }

    // ---- work requests --------------------------------------------------------------------

    /// `ibv_post_send` on QP `qpn`.
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), i32> {
        let d = *self.qp_dev.get(&qpn).ok_or(EINVAL)?;
        self.devs[d].engine.post_send(qpn, wr).map_err(post_errno)
    }

    /// `ibv_post_recv` on QP `qpn`.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), i32> {
        let d = *self.qp_dev.get(&qpn).ok_or(EINVAL)?;
        self.devs[d].engine.post_recv(qpn, wr).map_err(post_errno)
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, ctx: CtxId, srq: Handle, wr: RecvWr) -> Result<(), i32> {
        for d in &mut self.devs {
            match d.engine.post_srq_recv((ctx, srq), wr.clone()) {
                Err(PostError::NoQueue) => continue,
                r => return r.map_err(post_errno),
            }
        }
        Err(EINVAL)
    }

    /// Up to `max` completions of CQ `cq` of `ctx`, oldest first.
    pub fn poll_cq(&mut self, ctx: CtxId, cq: Handle, max: usize) -> Vec<WorkCompletion> {
        self.cqs
            .get_mut(&cq_id(ctx, cq))
            .map_or_else(Vec::new, |c| c.poll(max))
    }

    // ---- moving packets -------------------------------------------------------------------

    /// Runs the engines until nothing is left to do right now: transmits (in-process to this
    /// daemon's own devices, by UDP to others), receives, timers, and outputs. Returns the
    /// contexts that got async events.
    pub fn drive(&mut self, core: &mut Core) -> Vec<CtxId> {
        self.rebase_after_stall();
        self.direct_fire_due();
        self.net_watch();
        let mut woken = Vec::new();
        let mut buf = std::mem::take(&mut self.buf);
        let mut scratch = std::mem::take(&mut self.rx_scratch);
        self.moved_packets = false;
        for _round in 0..64 {
            let now = engine_time(self.epoch, Instant::now());
            self.net_clock();
            let mut progressed = false;
            for (o, refused) in self.pump_rings(core) {
                self.route(core, o, refused, &mut woken);
            }
            self.raise_srq_events(core, &mut woken);
            for d in 0..self.devs.len() {
                for _ in 0..256 {
                    // The engine writes into the batch of the device's first socket, where
                    // nearly every packet goes, so the payload is not copied once more.
                    let dev = &mut self.devs[d];
                    let staging = dev.net.as_ref().is_some_and(NetDev::can_stage);
                    let tx = match &mut dev.net {
                        Some(n) if staging => {
                            dev.engine
                                .poll_transmit(now, core, &mut self.mem, n.stage())
                        }
                        _ => dev.engine.poll_transmit(now, core, &mut self.mem, &mut buf),
                    };
                    let Some(tx) = tx else {
                        break;
                    };
                    progressed = true;
                    if staging {
                        let remote = !tx.dgid.is_multicast()
                            && !self.devs.iter().any(|x| x.gids.contains(&tx.dgid));
                        let dev = &self.devs[d];
                        let src = dev.sgid_for(tx.sgid_index, tx.dgid);
                        let first = dev.net.as_ref().is_some_and(|n| n.local() == src.to_ip());
                        if remote && first {
                            // A packet for another host may be the ACK of writes held back.
                            self.flush_memory();
                            if let Some(n) = &mut self.devs[d].net {
                                if let Err(e) = n.send_staged(&tx) {
                                    tracing::warn!("send failed: {e}");
                                }
                            }
                            continue;
                        }
                        // Elsewhere (this daemon, a group, another address's socket): from
                        // the engine's buffer, as without staging.
                        if let Some(n) = &self.devs[d].net {
                            buf[..tx.len].copy_from_slice(n.staged(tx.len));
                        }
                    }
                    if tx.dgid.is_multicast() {
                        self.deliver_multicast_locally(now, core, d, tx.dgid, &buf[..tx.len]);
                        self.flush_memory();
                        if let Some(n) = &mut self.devs[d].net {
                            if let Err(e) = n.send(&tx, &mut buf[..tx.len]) {
                                tracing::warn!("multicast send failed: {e}");
                            }
                        }
                    } else if let Some(t) = self.devs.iter().position(|x| x.gids.contains(&tx.dgid))
                    {
                        // Our own device (any of its addresses): no socket (the ICRC protects
                        // wires, and there is none).
                        if let Some(qpn) = takes_a_receive(&buf[..tx.len]) {
                            for (o, refused) in self.catch_up_receives(qpn) {
                                self.route(core, o, refused, &mut woken);
                            }
                        }
                        let meta = softverbs_transport::RxMeta {
                            sgid: self.devs[d].sgid_for(tx.sgid_index, tx.dgid),
                            dgid: tx.dgid,
                        };
                        self.capture_local(d, t, meta.sgid, meta.dgid, &buf[..tx.len]);
                        let mut feed = fed_srq::Feed {
                            srqs: &self.fed_srqs,
                            faults: &mut self.srq_faults,
                            limits: &mut self.srq_limit_hits,
                        };
                        self.devs[t].engine.handle_packet_fed(
                            now,
                            core,
                            &mut self.mem,
                            &mut feed,
                            meta,
                            &buf[..tx.len],
                        );
                    } else {
                        // A packet for another host may be the ACK of writes held back.
                        self.flush_memory();
                        let dev = &mut self.devs[d];
                        let src = dev.sgid_for(tx.sgid_index, tx.dgid);
                        if let Some(n) = dev.socket_from(src) {
                            if let Err(e) = n.send(&tx, &mut buf[..tx.len]) {
                                tracing::warn!("send failed: {e}");
                            }
                        }
                    }
                }
                // What the engine queued for the wire leaves in batches (GSO, sendmmsg).
                self.flush_memory();
                for n in self.devs[d].sockets() {
                    if let Err(e) = n.flush() {
                        tracing::warn!("send failed: {e}");
                    }
                }
            }
            // Packets forwarded to net-path libraries never reach the loop below: they count
            // as moved too, so the loop keeps polling for the next one (`spin.rs`).
            let handed_on = self.forwarded_total();
            // Every socket of every device: (device, socket), a device's first address's first.
            let socks: Vec<(usize, usize)> = (0..self.devs.len())
                .flat_map(|d| (0..=self.devs[d].more_net.len()).map(move |k| (d, k)))
                .collect();
            for (d, k) in socks {
                for _ in 0..256 {
                    let dev = &mut self.devs[d];
                    let n = match k {
                        0 => dev.net.as_mut(),
                        k => dev.more_net.get_mut(k - 1),
                    };
                    let Some(n) = n else {
                        break;
                    };
                    if self.gate_rx && !n.may_have_packets() {
                        break;
                    }
                    // Unicast packets go to the engine from where they arrived (no copy);
                    // group traffic and MADs, rare, through a buffer of their own.
                    let (meta, len) = match n.recv_ref(&mut buf) {
                        Ok(Some((meta, pkt)))
                            if !meta.dgid.is_multicast()
                                && !crate::cm::is_gsi(pkt)
                                && !self.own_gids.contains(&meta.sgid)
                                && !self.net_path.runs(pkt) =>
                        {
                            progressed = true;
                            let mut feed = fed_srq::Feed {
                                srqs: &self.fed_srqs,
                                faults: &mut self.srq_faults,
                                limits: &mut self.srq_limit_hits,
                            };
                            let verdict = dev.engine.handle_packet_fed(
                                now,
                                core,
                                &mut self.mem,
                                &mut feed,
                                meta,
                                pkt,
                            );
                            n.verdict(verdict);
                            continue;
                        }
                        Ok(Some((meta, pkt))) => {
                            let len = pkt.len();
                            scratch[..len].copy_from_slice(pkt);
                            (meta, len)
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!("receive failed: {e}");
                            break;
                        }
                    };
                    progressed = true;
                    if self.is_own_multicast(&meta) {
                        continue;
                    }
                    if self.own_gids.contains(&meta.sgid) {
                        // Forged: from this daemon's own address, yet from the network.
                        self.own_source_drops += 1;
                        if let Some(n) = self.devs[d].socket_at(k) {
                            n.reject(softverbs_transport::Reject::OwnSource);
                        }
                        continue;
                    }
                    if crate::cm::is_gsi(&scratch[..len]) {
                        let rejected = self.cm.receive(now, d, meta.sgid, &scratch[..len]);
                        if let Some(n) = self.devs[d].socket_at(k) {
                            match rejected {
                                Some(r) => n.reject(r),
                                None => n.verdict(None),
                            }
                        }
                    } else if self.net_path.runs(&scratch[..len]) {
                        self.net_answer(d, &scratch[..len]);
                    } else {
                        let mut feed = fed_srq::Feed {
                            srqs: &self.fed_srqs,
                            faults: &mut self.srq_faults,
                            limits: &mut self.srq_limit_hits,
                        };
                        let verdict = self.devs[d].engine.handle_packet_fed(
                            now,
                            core,
                            &mut self.mem,
                            &mut feed,
                            meta,
                            &scratch[..len],
                        );
                        if let Some(n) = self.devs[d].socket_at(k) {
                            n.verdict(verdict);
                        }
                    }
                }
                if k == self.devs[d].more_net.len() {
                    self.devs[d].engine.handle_timeout(now);
                }
            }
            progressed |= self.forwarded_total() != handed_on;
            self.settle_windows(core);
            self.cm.handle_timeout(now);
            progressed |= self.send_cm(now);
            if self.cm.take_moved() {
                // Connect requests received or SIDR requests ended change what contexts
                // hold: their per-uid shares follow (docs/guide/limits.md).
                self.cm.sync_charges(core);
            }
            // Completions reach their CQs below: the bytes they announce go first.
            self.flush_memory();
            for d in 0..self.devs.len() {
                while let Some(o) = self.devs[d].engine.poll_output() {
                    self.route(core, o, None, &mut woken);
                }
            }
            // Every completion of the round is in its CQ: requests that retired without one
            // may be counted now.
            self.settle_sq_notes();
            self.moved_packets |= progressed;
            if !progressed {
                for d in &mut self.devs {
                    for n in d.sockets() {
                        let _ = n.release_held();
                    }
                }
                break;
            }
        }
        self.raise_srq_events(core, &mut woken);
        self.flush_captures_due();
        self.buf = buf;
        self.rx_scratch = scratch;
        // The daemon goes on at once (a command, the loop): a long drive is work, not a
        // stall, and the next one is measured from its end.
        self.sleeping(Some(Duration::ZERO));
        woken
    }

    /// The SRQ events the rounds found due: bad entries and (fed SRQs) limits crossed.
    fn raise_srq_events(&mut self, core: &mut Core, woken: &mut Vec<CtxId>) {
        let faults = std::mem::take(&mut self.srq_faults)
            .into_iter()
            .map(|k| (k, EventType::SrqErr));
        let limits = std::mem::take(&mut self.srq_limit_hits)
            .into_iter()
            .map(|k| (k, EventType::SrqLimitReached));
        for ((ctx, srq), ev) in faults.chain(limits) {
            if core.raise_object_event(ctx, EventElement::Srq(srq), ev) {
                woken.push(ctx);
            }
        }
    }

    /// Makes the payload writes the memory held back (process path: one `pwrite` per
    /// contiguous run instead of one per packet, docs/design/registered-memory.md) land in the
    /// clients' memory. Called before anything that lets a program see them leaves the
    /// daemon: a completion, a packet for another host. A write that fails now (the program
    /// unmapped pages of a pinned MR, or exited) cannot fail its request any more.
    fn flush_memory(&mut self) {
        if let Err(f) = softverbs_transport::Memory::flush(&mut self.mem) {
            tracing::warn!(
                "a held-back write into {:?} at {:#x} failed: the memory is gone",
                f.ctx,
                f.addr
            );
        }
    }

    /// Puts the CMs' MADs for other hosts on the wire; true if any MAD moved.
    fn send_cm(&mut self, now: softverbs_transport::Instant) -> bool {
        let pkts = self.cm.flush(now);
        let moved = !pkts.is_empty();
        for (from, to, p) in self.cm.take_own_copies() {
            let src = Gid::from_ip(from);
            self.capture_local(p.dev, to, src, p.dst, &p.bytes);
        }
        for mut p in pkts {
            let tx = softverbs_transport::Transmit {
                len: p.bytes.len(),
                dgid: p.dst,
                sgid_index: 0,
                udp_sport: 0,
            };
            // From the device's socket of the peer's family (the CM's source, docs/design/cm.md §7).
            let v4 = p.dst.to_ip().is_ipv4();
            if let Some(n) = self.devs[p.dev]
                .sockets()
                .find(|n| n.local().is_ipv4() == v4)
            {
                if let Err(e) = n.send(&tx, &mut p.bytes) {
                    tracing::warn!("CM send failed: {e}");
                }
            }
        }
        moved
    }

    /// The event loop sleeps for at most `timeout` (`None`: until an event), from now: a
    /// round that starts later than that by more than `time::STALL` finds the daemon itself
    /// could not run meanwhile.
    pub fn sleeping(&mut self, timeout: Option<Duration>) {
        let now = self.now();
        self.stalls.sleeping(now, timeout);
    }

    /// Time this daemon could not run (stopped, or waiting for a CPU) is not its peers'
    /// silence: every engine's requester timers move by it, and no retry is counted
    /// (`Engine::stalled`; IBA 9.7.6.1.3 counts the peer's time to answer). The same rule
    /// as the library's (`softverbs_transport::time::stall`). Commands the loop handled
    /// between its wake-up and this round count too: the engines could not take ACKs then
    /// either. Returns what was lost.
    fn rebase_after_stall(&mut self) -> Duration {
        let lost = self.stalls.running(self.now());
        if !lost.is_zero() {
            tracing::debug!(?lost, "daemon stalled: requester timers rebased");
            for d in &mut self.devs {
                d.engine.stalled(lost);
            }
            // The net-path libraries' ACKs waited in this daemon's forwarder meanwhile.
            self.net_status_stalled(lost);
        }
        lost
    }

    /// The engine's time now (for commands that start CM timers).
    pub fn now(&self) -> softverbs_transport::Instant {
        engine_time(self.epoch, Instant::now())
    }

    /// `refused`: the (QPN, send ring position) of a send request refused at the ring.
    fn route(
        &mut self,
        core: &mut Core,
        o: Output,
        refused: Option<(u32, u32)>,
        woken: &mut Vec<CtxId>,
    ) {
        match o {
            Output::Completion { cq, wc } => {
                let Some(c) = self.cqs.get_mut(&cq) else {
                    return;
                };
                // A mapped CQ's completions go to its ring, otherwise to the PollCq queue.
                let mut ring = self
                    .cq_rings
                    .get_mut(&cq)
                    .filter(|_| !self.cq_rings_outgrown.contains(&cq));
                // The client may post again once it sees this completion: its send queue's
                // retired count must already cover the request. It must cover no later one
                // whose completion is not written yet (a client whose daemon died flushes from
                // it), and the pending pair says whether this one landed (sq_retire.rs).
                if !matches!(
                    wc.opcode,
                    softverbs_transport::wr::WcOpcode::Recv
                        | softverbs_transport::wr::WcOpcode::RecvRdmaWithImm
                ) {
                    if let Some(r) = self.qp_rings.get_mut(&wc.qp_num) {
                        let note = match refused {
                            Some((_, pos)) => r.retire.refused(pos),
                            None => r.retire.completed(wc.wr_id, wc.status == WcStatus::Success),
                        };
                        if let Some(n) = note {
                            if let Some(p) = ring.as_deref_mut() {
                                r.sq.publish_pending(u64::from(n) | u64::from(p.produced()) << 32);
                            }
                            r.sq.publish_note(n);
                        }
                        self.settle.push(wc.qp_num);
                    }
                }
                let mut push =
                    ring.map(|p| move |w: &WorkCompletion| p.push_value(&WcWire::from(w)).is_ok());
                let ctx = CtxId(cq >> 32);
                match c.complete(
                    wc,
                    push.as_mut()
                        .map(|f| f as &mut dyn FnMut(&WorkCompletion) -> bool),
                ) {
                    Delivery::Overrun => {
                        // The completion is lost and the owner hears of it (cq.rs).
                        if core.raise_object_event(
                            ctx,
                            EventElement::Cq(Handle(cq as u32)),
                            EventType::CqErr,
                        ) {
                            woken.push(ctx);
                        }
                    }
                    Delivery::Stored { notify: Some(h) } => {
                        if let Some(ch) = self.channels.get_mut(&(ctx, h)) {
                            ch.fired.fire(Handle(cq as u32));
                            softverbs_ipc::signal_eventfd(ch.efd.as_fd());
                        }
                    }
                    Delivery::Stored { notify: None } => {}
                }
            }
            Output::QpError { qpn, event } => match event {
                Some(e) => woken.extend(core.fail_qp(qpn, e)),
                None => core.mark_qp_error(qpn),
            },
            Output::SrqLimitReached { srq } => {
                if core.raise_object_event(
                    srq.0,
                    EventElement::Srq(srq.1),
                    EventType::SrqLimitReached,
                ) {
                    woken.push(srq.0);
                }
            }
        }
    }
}

impl std::fmt::Debug for DataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPath")
            .field("devices", &self.devs.len())
            .field("cqs", &self.cqs.len())
            .finish_non_exhaustive()
    }
}

/// Turns a posted send work request (command or ring entry) into the engine's form. UD
/// destinations come from an address handle of the same context.
pub fn send_wr_from_wire(
    core: &Core,
    ctx: CtxId,
    qp: Handle,
    w: &SendWrWire,
) -> Result<SendWr, i32> {
    let is_ud = core
        .owned_qp_info(ctx, qp)
        .is_some_and(|i| i.qp_type == QpType::Ud);
    convert::send_wr_from_wire(w, |ah| {
        is_ud
            .then(|| core.ah_attr(ctx, Handle(ah)).map(|a| a.dgid))
            .transpose()
    })
    .map_err(|e| e.errno())
}

/// Turns a posted receive work request into the engine's form.
pub fn recv_wr_from_wire(r: &PostRecvReq) -> Result<RecvWr, i32> {
    convert::recv_wr_from_wire(r).map_err(|e| e.errno())
}

/// Ring sizes: the work-request entries of the command ABI, rounded to 8 bytes.
fn entry_size<T>() -> u32 {
    (std::mem::size_of::<T>() as u32).next_multiple_of(8)
}

fn ring_capacity(depth: u32) -> u32 {
    (depth.saturating_add(1))
        .next_power_of_two()
        .clamp(8, softverbs_shm::MAX_CAPACITY)
}

impl DataPath {
    /// Publishes in the send rings of the QPs of the round how many of their requests the QPs
    /// retired — taken from the ring and no longer in the engine (completed, flushed, refused,
    /// or dropped at RESET) — so the client counts the queue's occupancy exactly and refuses
    /// a post past `max_send_wr` with ENOMEM (ibv_post_send(3)). Called once every completion
    /// of the round is written: unsignaled requests retire without a completion to count, and
    /// the count may pass them only then (sq_retire.rs).
    fn settle_sq_notes(&mut self) {
        let mut settle = std::mem::take(&mut self.settle);
        settle.extend_from_slice(&self.visit);
        for qpn in settle.drain(..) {
            let (Some(r), Some(&d)) = (self.qp_rings.get_mut(&qpn), self.qp_dev.get(&qpn)) else {
                continue;
            };
            let left = self.devs[d].engine.send_queued(qpn);
            if let Some(n) = r.retire.settle(left, r.sq.consumed()) {
                r.sq.publish_note(n);
            }
        }
        self.settle = settle;
    }
}

/// Slots of a context's ready ring: at most this many QPs of one context get a work flag
/// (each has at most one announcement in flight, so the ring never fills); QPs beyond it are
/// visited every round.
const READY_SLOTS: u32 = 1 << 16;

/// Announcements taken from one ready ring per round, so a client flooding its ring with
/// tokens delays others by a bounded amount (the rest wait for the next round).
const READY_PER_ROUND: usize = 1024;

/// Rounds a QP found idle stays queued before its flag is cleared (`ReadySet::with_grace`):
/// a ping-pong's QPs post again within a few rounds, and then post without announcing.
pub const IDLE_GRACE_ROUNDS: u32 = 64;

/// A context's ready ring (the client produces QP handles, the daemon consumes).
struct ReadyRing {
    ring: Consumer,
    /// QP handle → QPN of the QPs with a work flag.
    qps: HashMap<u32, u32>,
}

/// What the data path's rounds cost: one round is one pass over the QP rings to visit, in
/// [`DataPath::drive`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundStats {
    /// Rounds run.
    pub rounds: u64,
    /// QP ring visits (a QP's send and receive ring count once) over all rounds.
    pub qp_visits: u64,
    /// The most QPs visited in one round.
    pub max_qp_visits: u32,
    /// QPs queued for the next round now.
    pub queued_qps: u32,
}

impl DataPath {
    /// Takes the announcements of every context's ready ring into the schedule.
    fn take_announcements(&mut self) {
        let mut corrupt = Vec::new();
        for (&ctx, rr) in self.ready.iter_mut() {
            for _ in 0..READY_PER_ROUND {
                match rr.ring.pop_value::<U64>() {
                    Ok(Some(t)) => {
                        // Unknown handles (a destroyed QP, a forged token) are ignored.
                        if let Some(&qpn) = rr.qps.get(&(t.get() as u32)) {
                            self.qp_sched.announced(qpn);
                        }
                    }
                    Ok(None) => break,
                    Err(_) => {
                        corrupt.push(ctx);
                        break;
                    }
                }
            }
        }
        for ctx in corrupt {
            // A client that corrupts its ready ring gets its QPs visited every round.
            tracing::warn!(
                ctx = ctx.0,
                "corrupt ready ring; visiting its QPs every round"
            );
            if let Some(rr) = self.ready.remove(&ctx) {
                for qpn in rr.qps.into_values() {
                    self.qp_sched.insert(qpn, None);
                }
            }
        }
    }
}

/// The completion of a request refused at its ring: its CQ, and for a send request the
/// (QPN, send ring position).
type RefusedCompletion = (Option<CqId>, WorkCompletion, Option<(u32, u32)>);

/// Shared-memory work queues of one QP (the client produces, the daemon consumes).
struct QpRings {
    ctx: CtxId,
    handle: Handle,
    send_cq: Option<CqId>,
    recv_cq: Option<CqId>,
    sq: Consumer,
    rq: Option<Consumer>,
    /// The QP signals every send request (`sq_sig_all`).
    sig_all: bool,
    /// Which send ring positions may be counted as retired.
    retire: SqRetire,
}

impl DataPath {
    /// Maps the work queues of QP `qp` into shared memory (ABI 3 `MapQueues`): returns the
    /// layout and the memfd. From then on the client posts by writing ring entries; the
    /// daemon takes them in [`drive`](Self::drive). `admit` is asked about the region's size
    /// first (the context's limits); its refusal leaves everything as it was.
    pub fn map_qp(
        &mut self,
        i: &softverbs_core::datapath::OwnedQpInfo,
        ctx: CtxId,
        qp: Handle,
        admit: impl FnOnce(u64) -> Result<(), i32>,
    ) -> Result<(QueuesResp, OwnedFd), i32> {
        let sq = RingLayout::new(ring_capacity(i.cap.max_send_wr), entry_size::<SendWrWire>())
            .map_err(|_| EINVAL)?;
        let has_rq = i.srq.is_none() && i.qp_type != QpType::XrcSend;
        let rq = has_rq
            .then(|| {
                RingLayout::new(
                    ring_capacity(i.cap.max_recv_wr),
                    entry_size::<PostRecvReq>(),
                )
            })
            .transpose()
            .map_err(|_| EINVAL)?;
        let rq_off = sq.size().next_multiple_of(4096);
        let mut len = rq_off + rq.map_or(0, |l| l.size());
        // With a ready ring the QP gets a work flag after its rings (ABI 6), as long as the
        // ready ring has a slot for every flagged QP (then it never fills; see
        // crates/shm/src/ready.rs); other QPs are visited every round.
        let flag_off = self
            .ready
            .get(&ctx)
            .filter(|rr| rr.qps.len() < rr.ring.layout().capacity() as usize)
            .map(|_| len.next_multiple_of(softverbs_shm::CACHE_LINE));
        if let Some(off) = flag_off {
            len = off + WORK_FLAG_SIZE;
        }
        let (region, fd) = Region::create("softverbs-qp", len.max(4096)).map_err(|_| ENOMEM)?;
        sq.init(&region, 0).map_err(|_| EINVAL)?;
        if let Some(l) = rq {
            l.init(&region, rq_off).map_err(|_| EINVAL)?;
        }
        let region = Arc::new(region);
        let sq_c = Consumer::attach(region.clone(), 0, sq).map_err(|_| EINVAL)?;
        let rq_c = rq
            .map(|l| Consumer::attach(region.clone(), rq_off, l))
            .transpose()
            .map_err(|_| EINVAL)?;
        let flag = flag_off
            .map(|off| WorkFlag::attach(region.clone(), off))
            .transpose()
            .map_err(|_| EINVAL)?;
        admit(region.len() as u64)?;
        if flag.is_some() {
            if let Some(rr) = self.ready.get_mut(&ctx) {
                rr.qps.insert(qp.0, i.qpn);
            }
        }
        self.qp_sched.insert(i.qpn, flag);
        self.ctx_qp_rings.entry(ctx).or_default().insert(i.qpn);
        self.qp_rings.insert(
            i.qpn,
            QpRings {
                ctx,
                handle: qp,
                send_cq: Some(cq_id(ctx, i.send_cq)),
                recv_cq: i.recv_cq.map(|h| cq_id(ctx, h)),
                sq: sq_c,
                rq: rq_c,
                sig_all: i.sq_sig_all,
                retire: SqRetire::default(),
            },
        );
        let resp = QueuesResp {
            region_len: U64::new(region.len() as u64),
            a_offset: U32::new(0),
            a_capacity: U32::new(sq.capacity()),
            a_entry: U32::new(sq.entry_size() as u32),
            b_offset: U32::new(if rq.is_some() { rq_off as u32 } else { 0 }),
            b_capacity: U32::new(rq.map_or(0, |l| l.capacity())),
            b_entry: U32::new(rq.map_or(0, |l| l.entry_size() as u32)),
            flag_offset: U32::new(flag_off.unwrap_or(0) as u32),
        };
        Ok((resp, fd))
    }

    /// Maps the context's ready ring (ABI 6 `MapQueues` kind `QUEUES_READY`): QPs mapped from
    /// then on get a work flag, and the daemon visits them only after the client announced
    /// work here (crates/shm/src/ready.rs). `EEXIST` if the context has one.
    pub fn map_ready(
        &mut self,
        ctx: CtxId,
        admit: impl FnOnce(u64) -> Result<(), i32>,
    ) -> Result<(QueuesResp, OwnedFd), i32> {
        if self.ready.contains_key(&ctx) {
            return Err(EEXIST);
        }
        let l = RingLayout::new(READY_SLOTS, 8).map_err(|_| EINVAL)?;
        let len = l.size().next_multiple_of(4096);
        let (region, fd) = Region::create("softverbs-ready", len).map_err(|_| ENOMEM)?;
        l.init(&region, 0).map_err(|_| EINVAL)?;
        let ring = Consumer::attach(Arc::new(region), 0, l).map_err(|_| EINVAL)?;
        admit(len as u64)?;
        self.ready.insert(
            ctx,
            ReadyRing {
                ring,
                qps: HashMap::default(),
            },
        );
        let resp = QueuesResp {
            region_len: U64::new(len as u64),
            a_offset: U32::new(0),
            a_capacity: U32::new(l.capacity()),
            a_entry: U32::new(8),
            ..Default::default()
        };
        Ok((resp, fd))
    }

    /// Drops a QP's rings (destroyed, or its ring was corrupt).
    fn forget_qp_rings(&mut self, qpn: u32) {
        if let Some(r) = self.qp_rings.remove(&qpn) {
            if let Some(rr) = self.ready.get_mut(&r.ctx) {
                rr.qps.remove(&r.handle.0);
            }
            if let Some(set) = self.ctx_qp_rings.get_mut(&r.ctx) {
                set.remove(&qpn);
            }
        }
        self.qp_sched.remove(qpn);
    }

    /// Packets the devices' forwarders took so far (forwarded, refused or lost), for telling
    /// whether a round moved any (`netdev/forward.rs`).
    fn forwarded_total(&self) -> u64 {
        self.devs
            .iter()
            .flat_map(|d| d.net.iter().chain(&d.more_net))
            .map(|n| {
                let f = n.forward_stats();
                f.forwarded + f.foreign_source + f.client_full
            })
            .sum()
    }

    /// What the devices' engines and the libraries' (the net path's) dropped for its source
    /// or its PSN, summed; a net-path QP's packets from a foreign source are dropped by the
    /// device's forwarder before any engine (`netdev/forward.rs`), and counted here too.
    pub fn drop_stats(&self) -> DropStats {
        self.devs.iter().fold(self.net_reported_drops(), |a, d| {
            let forwarder = DropStats {
                foreign_source: d
                    .net
                    .iter()
                    .chain(&d.more_net)
                    .map(|n| n.forward_stats().foreign_source)
                    .sum(),
                outside_window: 0,
            };
            let a = net_path::add_drops(a, forwarder);
            net_path::add_drops(a, d.engine.drop_stats())
        })
    }

    /// What the data path's rounds have cost so far.
    pub fn round_stats(&self) -> RoundStats {
        RoundStats {
            queued_qps: self.qp_sched.queued().len() as u32,
            ..self.stats
        }
    }

    /// Maps the receive queue of SRQ `srq` into shared memory: the owner posts receives by
    /// writing ring entries. `fed`: the context's direct path takes SRQ receives, so a
    /// basic SRQ becomes a fed one (`fed_srq`); an XRC SRQ (its own CQ) stays the engine's.
    pub fn map_srq(
        &mut self,
        ctx: CtxId,
        srq: Handle,
        fed: bool,
        admit: impl FnOnce(u64) -> Result<(), i32>,
    ) -> Result<(QueuesResp, OwnedFd), i32> {
        let key = (ctx, srq);
        let (dev, cfg) = self
            .devs
            .iter()
            .enumerate()
            .find_map(|(i, d)| d.engine.srq_config(key).map(|c| (i, c)))
            .ok_or(EINVAL)?;
        let max_wr = cfg.max_wr;
        if fed && cfg.cq.is_none() {
            let armed = self.devs[dev].engine.take_srq_limit(key);
            let got = self.map_fed_srq(key, max_wr, admit)?;
            if armed > 0 {
                self.fed_srq_limit(key, armed);
            }
            return Ok(got);
        }
        let l = RingLayout::new(ring_capacity(max_wr), entry_size::<PostRecvReq>())
            .map_err(|_| EINVAL)?;
        let len = l.size().max(4096);
        let (region, fd) = Region::create("softverbs-srq", len).map_err(|_| ENOMEM)?;
        l.init(&region, 0).map_err(|_| EINVAL)?;
        let c = Consumer::attach(Arc::new(region), 0, l).map_err(|_| EINVAL)?;
        admit(len as u64)?;
        self.srq_rings.insert(key, (dev, c));
        let resp = one_ring(len, &l);
        Ok((resp, fd))
    }

    /// Maps CQ `cq` into shared memory: completions go to the ring, which the client reads
    /// without asking the daemon.
    pub fn map_cq(
        &mut self,
        ctx: CtxId,
        cq: Handle,
        admit: impl FnOnce(u64) -> Result<(), i32>,
    ) -> Result<(QueuesResp, OwnedFd), i32> {
        let id = cq_id(ctx, cq);
        let cqe = self.cqs.get(&id).ok_or(EINVAL)?.cqe();
        let l = RingLayout::new(ring_capacity(cqe), entry_size::<WcWire>()).map_err(|_| EINVAL)?;
        let (region, fd) =
            Region::create("softverbs-cq", l.size().max(4096)).map_err(|_| ENOMEM)?;
        l.init(&region, 0).map_err(|_| EINVAL)?;
        let p = Producer::attach(Arc::new(region), 0, l).map_err(|_| EINVAL)?;
        let len = l.size().max(4096);
        admit(len as u64)?;
        self.cq_rings.insert(id, p);
        let resp = one_ring(len, &l);
        Ok((resp, fd))
    }

    /// The context's doorbell (`MapDoorbell`): the client rings it after a post when the
    /// daemon asked to be woken. Returns the client's end, and remembers the daemon's end
    /// for the event loop to watch ([`take_new_doorbells`](Self::take_new_doorbells)).
    pub fn doorbell(&mut self, ctx: CtxId) -> Result<OwnedFd, i32> {
        if let Some(d) = self.doorbells.get(&ctx) {
            return d.try_clone().map_err(|_| ENOMEM);
        }
        let d = softverbs_ipc::new_eventfd().map_err(|_| ENOMEM)?;
        let client = d.try_clone().map_err(|_| ENOMEM)?;
        self.new_doorbells
            .push((ctx, d.try_clone().map_err(|_| ENOMEM)?));
        self.doorbells.insert(ctx, d);
        Ok(client)
    }

    /// Whether `ctx` has its doorbell.
    pub fn has_doorbell(&self, ctx: CtxId) -> bool {
        self.doorbells.contains_key(&ctx)
    }

    /// Doorbells created since the last call (the server registers them with its poller).
    pub fn take_new_doorbells(&mut self) -> Vec<(CtxId, OwnedFd)> {
        std::mem::take(&mut self.new_doorbells)
    }

    /// Before the event loop blocks: asks every ring producer to ring the doorbell on its
    /// next post. Returns false if entries arrived meanwhile (then do not block).
    pub fn prepare_sleep(&mut self) -> bool {
        let mut idle = true;
        // QPs not queued have a clear work flag: their next post announces itself through
        // the ready ring, whose own need_wakeup covers it.
        for rr in self.ready.values_mut() {
            if !matches!(rr.ring.prepare_sleep(), Ok(true)) {
                idle = false;
            }
        }
        for &qpn in self.qp_sched.queued() {
            let Some(r) = self.qp_rings.get_mut(&qpn) else {
                continue;
            };
            // Entries the engine has no room for yet are not work: they wait for completions,
            // which come with packets or timers that wake the loop anyway.
            let (sq_room, rq_room) = self.qp_dev.get(&qpn).map_or((0, 0), |&d| {
                let e = &self.devs[d].engine;
                (e.send_room(qpn), e.recv_room(qpn))
            });
            let queues =
                std::iter::once((&mut r.sq, sq_room)).chain(r.rq.as_mut().map(|rq| (rq, rq_room)));
            for (c, room) in queues {
                if !matches!(c.prepare_sleep(), Ok(true)) && room > 0 {
                    idle = false;
                }
            }
        }
        for (&key, (dev, c)) in self.srq_rings.iter_mut() {
            let room = self.devs[*dev].engine.srq_room(key).unwrap_or(0);
            if !matches!(c.prepare_sleep(), Ok(true)) && room > 0 {
                idle = false;
            }
        }
        if !idle {
            // Not sleeping after all: producers need not ring.
            self.clear_wakeups();
        }
        idle
    }

    fn clear_wakeups(&mut self) {
        for rr in self.ready.values_mut() {
            rr.ring.finish_sleep();
        }
        for &qpn in self.qp_sched.queued() {
            if let Some(r) = self.qp_rings.get_mut(&qpn) {
                r.sq.finish_sleep();
                if let Some(rq) = &mut r.rq {
                    rq.finish_sleep();
                }
            }
        }
        for (_, c) in self.srq_rings.values_mut() {
            c.finish_sleep();
        }
    }

    /// After the event loop wakes: producers may stop ringing. `rang`: the wake-up reported
    /// a doorbell, whose eventfds are then emptied. A doorbell left full costs nothing: the
    /// loop watches them edge-triggered, and every later ring raises a new event whatever the
    /// count (eventfd(2) wakes its waiters on each write), so a wake-up by a socket or a timer
    /// skips one `read` per context.
    pub fn finish_sleep(&mut self, rang: bool) {
        self.clear_wakeups();
        if rang {
            for d in self.doorbells.values() {
                softverbs_ipc::drain_eventfd(d.as_fd());
            }
        }
    }

    /// Takes posted entries from the rings into the engines, as many as each queue has room
    /// for (the rest stay in the ring, which the client then finds full). A request the engine
    /// refuses completes with an error instead of a return code (the client already
    /// returned from its post).
    fn pump_rings(&mut self, core: &Core) -> Vec<(Output, Option<(u32, u32)>)> {
        // Scratch entries kept across calls: this runs in every round of every `drive`.
        let (mut sbuf, mut rbuf) = std::mem::take(&mut self.ring_scratch);
        sbuf.resize(entry_size::<SendWrWire>() as usize, 0);
        rbuf.resize(entry_size::<PostRecvReq>() as usize, 0);
        let mut failed = Vec::new();
        // Completions of refused requests, with the send ring position of a refused send.
        let mut errors: Vec<RefusedCompletion> = Vec::new();
        self.take_announcements();
        let mut visit = std::mem::take(&mut self.visit);
        self.qp_sched.start_round(&mut visit);
        self.stats.rounds += 1;
        self.stats.qp_visits += visit.len() as u64;
        self.stats.max_qp_visits = self.stats.max_qp_visits.max(visit.len() as u32);
        for &qpn in &visit {
            let (Some(r), Some(&dev)) = (self.qp_rings.get_mut(&qpn), self.qp_dev.get(&qpn)) else {
                self.qp_sched.settle(qpn, false, || false);
                continue;
            };
            let engine = &mut self.devs[dev].engine;
            for _ in 0..engine.send_room(qpn).min(4096) {
                match r.sq.pop(&mut sbuf) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(_) => {
                        failed.push(qpn);
                        break;
                    }
                }
                let pos = r.sq.consumed().wrapping_sub(1);
                let Ok((w, _)) = SendWrWire::read_from_prefix(&sbuf) else {
                    continue;
                };
                let signaled = r.sig_all || w.send_flags.get() & send_flags::SIGNALED != 0;
                let res = send_wr_from_wire(core, r.ctx, r.handle, &w)
                    .and_then(|wr| engine.post_send(qpn, wr).map_err(post_errno));
                match res {
                    Ok(()) => r.retire.taken(pos, w.wr_id.get(), signaled),
                    Err(_) => {
                        let mut wc = WorkCompletion::new_error(w.wr_id.get(), qpn);
                        wc.opcode = softverbs_transport::wr::WcOpcode::Send;
                        errors.push((r.send_cq, wc, Some((qpn, pos))));
                    }
                }
            }
            if pop_receives(engine, qpn, r, &mut rbuf, &mut errors).is_err() {
                failed.push(qpn);
            }
            // Still busy: entries the engine had no room for, or send requests in the engine
            // (they retire later, maybe without a completion, and the end of the round that
            // visits the QP next publishes the retired count).
            let mut has_entries = || {
                let left = |c: &mut Consumer| c.available().map_or(true, |n| n > 0);
                left(&mut r.sq) || r.rq.as_mut().is_some_and(left)
            };
            let busy = engine.send_queued(qpn) > 0 || has_entries();
            if !self.qp_sched.settle(qpn, busy, has_entries) {
                r.sq.finish_sleep();
                if let Some(rq) = &mut r.rq {
                    rq.finish_sleep();
                }
            }
        }
        self.visit = visit;
        for qpn in failed {
            // A peer that corrupts its ring indices loses the shared-memory queues.
            tracing::warn!(qpn, "corrupt work-queue ring; unmapping it");
            self.forget_qp_rings(qpn);
        }
        self.pump_srqs(&mut rbuf);
        self.ring_scratch = (sbuf, rbuf);
        errors
            .into_iter()
            .filter_map(|(cq, wc, pos)| cq.map(|cq| (Output::Completion { cq, wc }, pos)))
            .collect()
    }

    /// Moves what the SRQ rings hold into the engine.
    fn pump_srqs(&mut self, rbuf: &mut [u8]) {
        let mut corrupt = Vec::new();
        for (&key, (dev, c)) in self.srq_rings.iter_mut() {
            let engine = &mut self.devs[*dev].engine;
            for _ in 0..engine.srq_room(key).unwrap_or(0).min(4096) {
                match c.pop(rbuf) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(_) => {
                        corrupt.push(key);
                        break;
                    }
                }
                let ok = PostRecvReq::read_from_prefix(rbuf)
                    .ok()
                    .and_then(|(w, _)| recv_wr_from_wire(&w).ok())
                    .is_some_and(|wr| engine.post_srq_recv(key, wr).is_ok());
                if !ok {
                    // An SRQ has no CQ of its own to report a bad entry on (IBA 10.2.9):
                    // the owner hears of it as an SRQ error.
                    self.srq_faults.push(key);
                }
            }
        }
        for key in corrupt {
            tracing::warn!(ctx = key.0 .0, "corrupt SRQ ring; unmapping it");
            self.srq_rings.remove(&key);
            self.srq_faults.push(key);
        }
    }

    /// Before a packet of this daemon is delivered to QP `qpn` of this daemon: the receives
    /// posted to it (or to the SRQs) so far go into the engine first. A round reads each
    /// QP's rings once, in its own order, so it may read the receiver's ring just before a
    /// receive is posted there and the sender's ring just after a send posted later — by
    /// the same thread, as rdma-core's tests do (`test_odp_ud_traffic` posts a receive on one
    /// context, then a UD send to it on another): a UD datagram would then find no receive
    /// and be dropped (IBA 9.7.6.1.5), an RC SEND draw an RNR NAK and wait out the RNR
    /// timer. On a NIC the receive's doorbell reaches the device before the send's. Having
    /// read the send, every receive posted before it is visible now (its ring's release,
    /// then the sender's, then our acquire), so reading the receiver's rings again closes
    /// that gap.
    fn catch_up_receives(&mut self, qpn: u32) -> Vec<(Output, Option<(u32, u32)>)> {
        let (mut sbuf, mut rbuf) = std::mem::take(&mut self.ring_scratch);
        rbuf.resize(entry_size::<PostRecvReq>() as usize, 0);
        let mut errors: Vec<RefusedCompletion> = Vec::new();
        if let (Some(r), Some(&dev)) = (self.qp_rings.get_mut(&qpn), self.qp_dev.get(&qpn)) {
            let engine = &mut self.devs[dev].engine;
            if pop_receives(engine, qpn, r, &mut rbuf, &mut errors).is_err() {
                tracing::warn!(qpn, "corrupt work-queue ring; unmapping it");
                self.forget_qp_rings(qpn);
            }
        }
        if !self.srq_rings.is_empty() {
            self.pump_srqs(&mut rbuf);
        }
        sbuf.clear();
        self.ring_scratch = (sbuf, rbuf);
        errors
            .into_iter()
            .filter_map(|(cq, wc, pos)| cq.map(|cq| (Output::Completion { cq, wc }, pos)))
            .collect()
    }
}

/// The destination QP of a packet (BTH first) that consumes a receive there: the first or
/// only packet of a SEND, the last or only one of an RDMA WRITE with immediate (IBA 9.4.1,
/// 9.4.3).
fn takes_a_receive(pkt: &[u8]) -> Option<u32> {
    use softverbs_wire::opcode::Operation as Op;
    let bth = softverbs_wire::bth::Bth::new_checked(pkt).ok()?;
    let takes = matches!(
        bth.opcode().operation()?,
        Op::SendFirst
            | Op::SendOnly
            | Op::SendOnlyWithImmediate
            | Op::SendOnlyWithInvalidate
            | Op::RdmaWriteLastWithImmediate
            | Op::RdmaWriteOnlyWithImmediate
    );
    takes.then(|| bth.dest_qp())
}

/// Moves what QP `qpn`'s receive ring holds into the engine, as far as it has room; a refused
/// receive becomes an error completion in `errors`. `Err` if the ring is corrupt.
fn pop_receives(
    engine: &mut Engine,
    qpn: u32,
    r: &mut QpRings,
    rbuf: &mut [u8],
    errors: &mut Vec<RefusedCompletion>,
) -> Result<(), ()> {
    let Some(rq) = &mut r.rq else {
        return Ok(());
    };
    for _ in 0..engine.recv_room(qpn).min(4096) {
        match rq.pop(rbuf) {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) => return Err(()),
        }
        let Ok((w, _)) = PostRecvReq::read_from_prefix(rbuf) else {
            continue;
        };
        let res =
            recv_wr_from_wire(&w).and_then(|wr| engine.post_recv(qpn, wr).map_err(post_errno));
        if res.is_err() {
            let mut wc = WorkCompletion::new_error(w.wr_id.get(), qpn);
            wc.opcode = softverbs_transport::wr::WcOpcode::Recv;
            errors.push((r.recv_cq, wc, None));
        }
    }
    Ok(())
}

#[cfg(test)]
mod stall_tests {
    use super::*;

    /// The loop's own stalls are measured against the wake-up it planned
    /// (`DataPath::sleeping`, or the end of a drive); a sleep without a deadline plans
    /// nothing. Only lower bounds and plan-free cases are asserted (a loaded machine may
    /// add lateness anywhere). (What `Engine::stalled` does with them: `crates/transport/tests/stall.rs`.)
    #[test]
    fn the_loop_measures_its_own_stalls_against_its_plan() {
        let core = Core::new(Vec::new());
        let mut dp = DataPath::new(&core, &NetOptions::default()).unwrap();
        assert_eq!(dp.rebase_after_stall(), Duration::ZERO, "the first round");
        // Meant to go on at once, ran 30 ms later: at least that is lost.
        dp.sleeping(Some(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(30));
        assert!(dp.rebase_after_stall() >= Duration::from_millis(29));
        // Slept until an event: however late it came, nothing was planned.
        dp.sleeping(None);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(dp.rebase_after_stall(), Duration::ZERO);
        // A drive notes its end as the plan: a stall after it is measured from there.
        let mut core = core;
        dp.drive(&mut core);
        std::thread::sleep(Duration::from_millis(30));
        assert!(dp.rebase_after_stall() >= Duration::from_millis(29));
    }
}
