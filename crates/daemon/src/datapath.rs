//! The daemon's data path: one transport engine per device, its UDP side, client memory,
//! and the completion queues clients poll.
//!
//! The core stays the authority on objects; this mirrors what the engines need (QPs, SRQs,
//! CQs) as commands succeed, moves packets (in-process between this daemon's own devices, over
//! UDP to others), runs the engines' timers, and turns engine outputs into CQ entries and
//! async events.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use softverbs_core::attr::QpAttr;
use softverbs_core::device::Gid;
use softverbs_core::event::EventElement;
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::types::{EventType, Mtu, QpType};
use softverbs_core::Core;
use softverbs_memaccess::{ProcessVm, RegionId, SharedMappings};
use softverbs_transport::sim::{cq_id, Faults};
use softverbs_transport::wr::{RecvWr, SendWr, WorkCompletion};
use softverbs_transport::{CqId, Engine, Output, PostError, QpConfig, SrqConfig, MAX_PACKET};

use crate::netdev::{engine_time, until, NetDev};

const EINVAL: i32 = 22;

struct Dev {
    engine: Engine,
    net: Option<NetDev>,
    gid: Gid,
    port_mtu: Mtu,
}

struct CqState {
    queue: VecDeque<WorkCompletion>,
    cqe: u32,
    /// The completion channel events go to.
    channel: Option<u32>,
    /// Armed by `ibv_req_notify_cq`: `Some(solicited_only)` until the next event.
    armed: Option<bool>,
}

/// A completion channel (`ibv_comp_channel`): CQs that fired, and the eventfd that says so.
struct Channel {
    efd: std::os::fd::OwnedFd,
    fired: VecDeque<Handle>,
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
}

/// Engines, devices, memory and CQs of one daemon.
pub struct DataPath {
    devs: Vec<Dev>,
    mem: SharedMappings<ProcessVm>,
    cqs: HashMap<CqId, CqState>,
    ctx_cqs: HashMap<CtxId, HashSet<CqId>>,
    qp_dev: HashMap<u32, usize>,
    mr_regions: HashMap<(CtxId, Handle), RegionId>,
    channels: HashMap<(CtxId, u32), Channel>,
    next_channel: u32,
    epoch: Instant,
    buf: Vec<u8>,
}

fn post_errno(e: PostError) -> i32 {
    e.errno()
}

impl DataPath {
    /// A data path for the core's devices. Devices whose UDP port cannot be bound run without
    /// network (a warning is logged), so a second daemon on one machine still serves its own
    /// clients.
    pub fn new(core: &Core, net: &NetOptions) -> DataPath {
        let mut devs = Vec::new();
        for (i, d) in core.devices().iter().enumerate() {
            let port = &d.ports[0];
            let gid = port.gids[0];
            let mut netdev = None;
            if net.bind {
                match NetDev::bind(gid.to_ip(), net.port) {
                    Ok(mut n) => {
                        if let Some(f) = net.faults {
                            n.inject(f, 0x5eed ^ i as u64);
                        }
                        if let Some(dir) = &net.capture_dir {
                            let path = dir.join(format!("{}.pcap", d.name));
                            if let Err(e) = n.capture_to(&path) {
                                tracing::warn!("cannot capture to {}: {e}", path.display());
                            }
                        }
                        tracing::info!(device = %d.name, addr = %gid.to_ip(), port = net.port, "device on the network");
                        netdev = Some(n);
                    }
                    Err(e) => {
                        tracing::warn!(device = %d.name, addr = %gid.to_ip(), "no network for this device: {e}")
                    }
                }
            }
            devs.push(Dev {
                engine: Engine::new(),
                net: netdev,
                gid,
                port_mtu: port.active_mtu,
            });
        }
        DataPath {
            devs,
            mem: SharedMappings::with_fallback(ProcessVm::new()),
            cqs: HashMap::new(),
            ctx_cqs: HashMap::new(),
            qp_dev: HashMap::new(),
            mr_regions: HashMap::new(),
            channels: HashMap::new(),
            next_channel: 1,
            epoch: Instant::now(),
            buf: vec![0; MAX_PACKET],
        }
    }

    /// The UDP sockets, to watch for readability (device index, fd).
    pub fn net_fds(&self) -> Vec<(usize, BorrowedFd<'_>)> {
        self.devs
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.net.as_ref().map(|n| (i, n.fd())))
            .collect()
    }

    /// How long until an engine timer is due.
    pub fn next_timeout(&self) -> Option<Duration> {
        self.devs
            .iter()
            .filter_map(|d| d.engine.poll_timeout())
            .min()
            .map(|t| until(self.epoch, t))
    }

    /// Flushes capture files.
    pub fn flush_captures(&mut self) {
        for d in &mut self.devs {
            if let Some(n) = &mut d.net {
                let _ = n.flush_capture();
            }
        }
    }

    // ---- mirroring core objects -----------------------------------------------------------

    /// A context was opened by process `pid`.
    pub fn context_opened(&mut self, ctx: CtxId, pid: u32) {
        self.mem.fallback_mut().register_process(ctx, pid as i32);
    }

    /// A context was closed; `qpns` are the QPs it touched before the core tore it down.
    pub fn context_closed(&mut self, core: &Core, ctx: CtxId, qpns: &[u32]) {
        for &q in qpns {
            self.qp_maybe_gone(core, q);
        }
        for cq in self.ctx_cqs.remove(&ctx).unwrap_or_default() {
            self.cqs.remove(&cq);
        }
        self.mr_regions.retain(|(c, _), _| *c != ctx);
        self.channels.retain(|(c, _), _| *c != ctx);
        self.mem.remove_context(ctx);
        self.mem.fallback_mut().unregister_process(ctx);
        for d in &mut self.devs {
            d.engine.forget_srqs_of(ctx);
        }
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
                fired: VecDeque::new(),
            },
        );
        Ok((h, client))
    }

    /// True if `ctx` has channel `h`.
    pub fn has_channel(&self, ctx: CtxId, h: u32) -> bool {
        self.channels.contains_key(&(ctx, h))
    }

    /// `ibv_destroy_comp_channel`: `EBUSY` while a CQ reports to it.
    pub fn destroy_channel(&mut self, ctx: CtxId, h: u32) -> Result<(), i32> {
        if !self.channels.contains_key(&(ctx, h)) {
            return Err(2);
        }
        let used = self.ctx_cqs.get(&ctx).is_some_and(|s| {
            s.iter()
                .any(|id| self.cqs.get(id).is_some_and(|c| c.channel == Some(h)))
        });
        if used {
            return Err(16);
        }
        self.channels.remove(&(ctx, h));
        Ok(())
    }

    /// `ibv_req_notify_cq`: the next completion (only a solicited or unsuccessful one with
    /// `solicited_only`) raises an event on the CQ's channel (IBA 11.4.2.2).
    pub fn req_notify(&mut self, ctx: CtxId, cq: Handle, solicited_only: bool) -> Result<(), i32> {
        let c = self.cqs.get_mut(&cq_id(ctx, cq)).ok_or(EINVAL)?;
        // Arming for "any" wins over an earlier solicited-only arm.
        c.armed = Some(c.armed.map_or(solicited_only, |s| s && solicited_only));
        Ok(())
    }

    /// `ibv_get_cq_event` without blocking: the next CQ that fired on channel `h`.
    pub fn next_cq_event(&mut self, ctx: CtxId, h: u32) -> Result<Option<Handle>, i32> {
        let ch = self.channels.get_mut(&(ctx, h)).ok_or(EINVAL)?;
        Ok(ch.fired.pop_front())
    }

    /// A CQ was created, reporting to completion channel `channel` if given.
    pub fn cq_created(&mut self, ctx: CtxId, cq: Handle, cqe: u32, channel: Option<u32>) {
        let id = cq_id(ctx, cq);
        self.cqs.insert(
            id,
            CqState {
                queue: VecDeque::new(),
                cqe,
                channel,
                armed: None,
            },
        );
        self.ctx_cqs.entry(ctx).or_default().insert(id);
    }

    /// A CQ was resized.
    pub fn cq_resized(&mut self, ctx: CtxId, cq: Handle, cqe: u32) {
        if let Some(c) = self.cqs.get_mut(&cq_id(ctx, cq)) {
            c.cqe = cqe;
        }
    }

    /// A CQ was destroyed.
    pub fn cq_destroyed(&mut self, ctx: CtxId, cq: Handle) {
        let id = cq_id(ctx, cq);
        self.cqs.remove(&id);
        if let Some(s) = self.ctx_cqs.get_mut(&ctx) {
            s.remove(&id);
        }
    }

    /// An owned QP was created.
    pub fn qp_created(&mut self, core: &Core, ctx: CtxId, qp: Handle) {
        let Some(i) = core.owned_qp_info(ctx, qp) else {
            return;
        };
        let Ok(dev) = core
            .context_device(ctx)
            .map(|d| self.dev_index(&d.name, core))
        else {
            return;
        };
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

    /// An XRC receive QP `qpn` was created by a context of device `dev_name`.
    pub fn xrc_recv_created(&mut self, core: &Core, ctx: CtxId, qpn: u32) {
        let Ok(dev) = core
            .context_device(ctx)
            .map(|d| self.dev_index(&d.name, core))
        else {
            return;
        };
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

    fn dev_index(&self, name: &str, core: &Core) -> usize {
        core.devices()
            .iter()
            .position(|d| d.name == name)
            .unwrap_or(0)
    }

    /// QP `qpn` was modified; `attr` is what the core now holds.
    pub fn qp_modified(&mut self, qpn: u32, attr: &QpAttr) {
        if let Some(&d) = self.qp_dev.get(&qpn) {
            self.devs[d].engine.modify_qp(qpn, attr);
        }
    }

    /// QP `qpn` may have been destroyed by the core (last holder gone, owner destroyed it).
    pub fn qp_maybe_gone(&mut self, core: &Core, qpn: u32) {
        if core.qp_target(qpn).is_none() {
            if let Some(d) = self.qp_dev.remove(&qpn) {
                self.devs[d].engine.destroy_qp(qpn);
            }
        }
    }

    /// An SRQ was created.
    pub fn srq_created(&mut self, core: &Core, ctx: CtxId, srq: Handle) {
        let Some(i) = core.srq_info(ctx, srq) else {
            return;
        };
        let Ok(dev) = core
            .context_device(ctx)
            .map(|d| self.dev_index(&d.name, core))
        else {
            return;
        };
        self.devs[dev].engine.create_srq(SrqConfig {
            key: (ctx, srq),
            pd: i.pd,
            cq: i.cq.map(|h| cq_id(ctx, h)),
            max_wr: i.attr.max_wr,
            max_sge: i.attr.max_sge,
        });
    }

    /// An SRQ's limit was (re)armed.
    pub fn srq_limit(&mut self, ctx: CtxId, srq: Handle, limit: u32) {
        for d in &mut self.devs {
            d.engine.set_srq_limit((ctx, srq), limit);
        }
    }

    /// An SRQ was destroyed.
    pub fn srq_destroyed(&mut self, ctx: CtxId, srq: Handle) {
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
                .add_region(ctx, addr, len, fd)
                .map_err(|_| EINVAL)?;
            self.mr_regions.insert((ctx, mr), id);
        }
        Ok(())
    }

    /// An MR was deregistered: after this, nothing touches its mapping.
    pub fn mr_deregistered(&mut self, ctx: CtxId, mr: Handle) {
        if let Some(id) = self.mr_regions.remove(&(ctx, mr)) {
            self.mem.remove_region(id);
        }
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
        let Some(c) = self.cqs.get_mut(&cq_id(ctx, cq)) else {
            return Vec::new();
        };
        let n = max.min(c.queue.len());
        c.queue.drain(..n).collect()
    }

    // ---- moving packets -------------------------------------------------------------------

    /// Runs the engines until nothing is left to do right now: transmits (in-process to this
    /// daemon's own devices, by UDP to others), receives, timers, and outputs. Returns the
    /// contexts that got async events.
    pub fn drive(&mut self, core: &mut Core) -> Vec<CtxId> {
        let mut woken = Vec::new();
        let mut buf = std::mem::take(&mut self.buf);
        for _round in 0..64 {
            let now = engine_time(self.epoch, Instant::now());
            let mut progressed = false;
            for d in 0..self.devs.len() {
                for _ in 0..256 {
                    let Some(tx) =
                        self.devs[d]
                            .engine
                            .poll_transmit(now, core, &mut self.mem, &mut buf)
                    else {
                        break;
                    };
                    progressed = true;
                    if let Some(t) = self.devs.iter().position(|x| x.gid == tx.dgid) {
                        // Our own device: no socket (the ICRC protects wires, and there is none).
                        let meta = softverbs_transport::RxMeta {
                            sgid: self.devs[d].gid,
                            dgid: tx.dgid,
                        };
                        self.devs[t].engine.handle_packet(
                            now,
                            core,
                            &mut self.mem,
                            meta,
                            &buf[..tx.len],
                        );
                    } else if let Some(n) = &mut self.devs[d].net {
                        if let Err(e) = n.send(&tx, &mut buf[..tx.len]) {
                            tracing::warn!("send failed: {e}");
                        }
                    }
                }
            }
            for d in 0..self.devs.len() {
                for _ in 0..256 {
                    let Some(n) = &mut self.devs[d].net else {
                        break;
                    };
                    match n.recv(&mut buf) {
                        Ok(Some((meta, len))) => {
                            progressed = true;
                            self.devs[d].engine.handle_packet(
                                now,
                                core,
                                &mut self.mem,
                                meta,
                                &buf[..len],
                            );
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!("receive failed: {e}");
                            break;
                        }
                    }
                }
                self.devs[d].engine.handle_timeout(now);
            }
            for d in 0..self.devs.len() {
                while let Some(o) = self.devs[d].engine.poll_output() {
                    self.route(core, o, &mut woken);
                }
            }
            if !progressed {
                for d in &mut self.devs {
                    if let Some(n) = &mut d.net {
                        let _ = n.release_held();
                    }
                }
                break;
            }
        }
        self.buf = buf;
        woken
    }

    fn route(&mut self, core: &mut Core, o: Output, woken: &mut Vec<CtxId>) {
        match o {
            Output::Completion { cq, wc } => {
                let Some(c) = self.cqs.get_mut(&cq) else {
                    return;
                };
                if c.queue.len() >= c.cqe as usize {
                    // CQ overrun (IBA 11.4.2.1): the completion is lost and the owner hears of it.
                    let ctx = CtxId(cq >> 32);
                    if core.raise_object_event(
                        ctx,
                        EventElement::Cq(Handle(cq as u32)),
                        EventType::CqErr,
                    ) {
                        woken.push(ctx);
                    }
                    return;
                }
                let fires = c.armed.is_some_and(|solicited_only| {
                    !solicited_only
                        || wc.solicited
                        || wc.status != softverbs_transport::wr::WcStatus::Success
                });
                c.queue.push_back(wc);
                if fires {
                    c.armed = None;
                    let ctx = CtxId(cq >> 32);
                    if let Some(ch) = c.channel.and_then(|h| self.channels.get_mut(&(ctx, h))) {
                        ch.fired.push_back(Handle(cq as u32));
                        softverbs_ipc::signal_eventfd(ch.efd.as_fd());
                    }
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
