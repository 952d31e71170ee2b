//! The daemon's connection manager (docs/design/cm.md §4): one [`softverbs_cm::Cm`] per device,
//! speaking IB CM MADs on the device's QP1 (the GSI: UD SENDs, Q_Key `0x80010000`) over
//! RoCE v2, and each context's CM ids and events.
//!
//! CM ids are daemon objects owned by the context that made them, so a client that dies
//! mid-handshake or while connected has its peer told (REJ or DREQ, by
//! [`softverbs_cm::Cm::destroy_owner`]) and leaves nothing but time-wait tombstones, which
//! expire by themselves.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};

use softverbs_abi::cm::*;
use softverbs_cm::{
    AcceptParams, Cm, CmError, CmId, Config, ConnectParams, Counts, Event, Instant, Owner, QpKind,
    SidrParams, SidrReplyParams,
};
use softverbs_core::device::Gid;
use softverbs_core::errno::{EADDRINUSE, EAGAIN, EEXIST, EINVAL, ENOMEM};
use softverbs_core::ids::CtxId;
use softverbs_core::limits::Resource;
use softverbs_core::Core;
use softverbs_wire::cm::{gsi_headers, ServiceId, SidrStatus, GSI_QPN};
use softverbs_wire::{deth::GSI_QKEY, emit_packet, Packet};
use zerocopy::little_endian::{U16, U32, U64};

/// Events a context may leave unread before the oldest are dropped (a client that never
/// reads its CM events must not grow the daemon without bound).
const MAX_QUEUED_EVENTS: usize = 4096;

struct Port {
    cm: Cm,
    /// The device's addresses, IPv4 and IPv6 (its GID table).
    ips: Vec<IpAddr>,
    psn: u32,
}

impl Port {
    /// The address this device speaks to `peer` from: its first of `peer`'s family (a
    /// device with several addresses of one family answers from the first of them).
    fn local_for(&self, peer: IpAddr) -> Option<IpAddr> {
        self.ips
            .iter()
            .copied()
            .find(|ip| ip.is_ipv4() == peer.is_ipv4())
    }
}

#[derive(Default)]
struct CtxCm {
    events: VecDeque<CmEventResp>,
    efd: Option<OwnedFd>,
}

/// A MAD to put on the wire: from device `dev` to `dst`, as a whole IB packet (BTH through
/// the ICRC slot).
pub struct GsiPacket {
    /// Sending device.
    pub dev: usize,
    /// Destination.
    pub dst: Gid,
    /// The packet.
    pub bytes: Vec<u8>,
}

/// Every device's CM and every context's CM events.
pub struct CmPorts {
    ports: Vec<Port>,
    ctxs: HashMap<CtxId, CtxCm>,
    /// Contexts whose CM eventfd should be signalled.
    woken: Vec<CtxId>,
    /// What each context is charged in the core for what it holds in the CMs: (listeners,
    /// ids). At most what it holds (a connect request arriving for a context at its share
    /// is held, bounded by its listener's backlog, but not charged).
    charged: HashMap<CtxId, (u64, u64)>,
    /// Whether a [`Self::flush`] moved a MAD or an event since [`Self::take_moved`]: what
    /// contexts hold may have changed.
    moved: bool,
    /// With a capture on, the MADs [`Self::flush`] delivered between this daemon's own
    /// devices, as the packets they would have been (source address, destination device,
    /// packet), for [`Self::take_own_copies`].
    own_copies: Option<Vec<(IpAddr, usize, GsiPacket)>>,
}

fn owner(ctx: CtxId) -> Owner {
    Owner(ctx.0)
}

fn cm_errno(e: CmError) -> i32 {
    match e {
        CmError::UnknownId | CmError::State(_) | CmError::Wire(_) => EINVAL,
        CmError::ServiceInUse(_) => EADDRINUSE,
    }
}

fn ip_of(b: [u8; 16]) -> IpAddr {
    Gid(b).to_ip()
}

/// Whether client process `pid`, connected as `uid`, may take an rdma_cm port below 1024:
/// uid 0, or `CAP_NET_BIND_SERVICE` (capability 10, capabilities(7)) in its effective set as
/// `/proc/<pid>/status` shows it now, and only while that process still runs as `uid` (its
/// connection is open, so the pid is its own; the uid check keeps a recycled pid from
/// lending another process's capability).
pub fn may_bind_privileged(pid: u32, uid: u32) -> bool {
    if uid == 0 {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let euid = field("Uid:")
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u32>().ok());
    let cap_eff = field("CapEff:").and_then(|v| u64::from_str_radix(v, 16).ok());
    const CAP_NET_BIND_SERVICE: u32 = 10;
    euid == Some(uid) && cap_eff.is_some_and(|c| c & (1 << CAP_NET_BIND_SERVICE) != 0)
}

/// True for a packet to QP1 (BTH DestQP 1, UD SEND_ONLY): the GSI's, not an engine's.
pub fn is_gsi(pkt: &[u8]) -> bool {
    pkt.len() >= 12 && pkt[0] == 0x64 && pkt[5..8] == [0, 0, GSI_QPN as u8]
}

impl CmPorts {
    /// Keeps a copy of every MAD delivered between this daemon's own devices, as a packet,
    /// for a capture ([`Self::take_own_copies`]).
    pub fn copy_own_mads(&mut self) {
        self.own_copies.get_or_insert_with(Vec::new);
    }

    /// The MADs delivered between own devices since the last call (source address,
    /// destination device, packet with its ICRC slot unwritten); none unless
    /// [`Self::copy_own_mads`] was called.
    pub fn take_own_copies(&mut self) -> Vec<(IpAddr, usize, GsiPacket)> {
        self.own_copies
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// A CM for each device, given the device's addresses (its GIDs).
    pub fn new(ips: &[Vec<IpAddr>]) -> Self {
        let ports = ips
            .iter()
            .enumerate()
            .map(|(i, ips)| Port {
                cm: Cm::new(Config {
                    local_ca_guid: 0x0200_00ff_fe00_0000 | i as u64,
                    // IDs nobody can predict (the operating system's generator seeds the
                    // CM's ChaCha20), so a sender that is not the peer cannot name a
                    // connection, and a restarted daemon's IDs are unrelated to its
                    // predecessor's.
                    id_seed: {
                        let mut seed = [0; 32];
                        getrandom::getrandom(&mut seed).expect("the OS random generator");
                        seed
                    },
                    // A listener is made by a command from its process: a peer told
                    // "ready" out of band may connect before it arrives (docs/design/cm.md §7).
                    listen_grace: std::time::Duration::from_millis(250),
                    ..Config::default()
                }),
                ips: ips.clone(),
                psn: 0,
            })
            .collect();
        Self {
            ports,
            ctxs: HashMap::new(),
            woken: Vec::new(),
            charged: HashMap::new(),
            moved: false,
            own_copies: None,
        }
    }

    /// Whether the CMs sent or reported anything since the last call.
    pub fn take_moved(&mut self) -> bool {
        std::mem::take(&mut self.moved)
    }

    /// Charges `ctx` for one more listener (or id, `listener` false) before a command makes
    /// it: `ENOMEM` past the context's, its uid's or the daemon's share
    /// ([`Resource::CmListeners`], [`Resource::CmIds`]).
    pub fn precharge(&mut self, core: &mut Core, ctx: CtxId, listener: bool) -> Result<(), i32> {
        let r = if listener {
            Resource::CmListeners
        } else {
            Resource::CmIds
        };
        core.charge(ctx, r, 1).map_err(|e| e.errno())?;
        let c = self.charged.entry(ctx).or_default();
        if listener {
            c.0 += 1;
        } else {
            c.1 += 1;
        }
        Ok(())
    }

    /// Brings every context's charges in line with what the CMs say it holds: what went
    /// (destroyed, ended, migrated away) is given back, what came (connect requests, a
    /// migrated id) is charged as far as the shares allow.
    pub fn sync_charges(&mut self, core: &mut Core) {
        let mut held: HashMap<CtxId, (u64, u64)> = HashMap::new();
        for p in &self.ports {
            for (o, (l, c)) in p.cm.holdings() {
                let h = held.entry(CtxId(o.0)).or_default();
                h.0 += l as u64;
                h.1 += c as u64;
            }
        }
        let ctxs: Vec<CtxId> = self.charged.keys().chain(held.keys()).copied().collect();
        for ctx in ctxs {
            let want = held.get(&ctx).copied().unwrap_or_default();
            let have = self.charged.entry(ctx).or_default();
            for (r, w, h) in [
                (Resource::CmListeners, want.0, &mut have.0),
                (Resource::CmIds, want.1, &mut have.1),
            ] {
                if w < *h {
                    core.uncharge(ctx, r, *h - w);
                    *h = w;
                } else if w > *h && core.charge(ctx, r, w - *h).is_ok() {
                    *h = w;
                }
            }
            if *have == (0, 0) {
                self.charged.remove(&ctx);
            }
        }
    }

    /// Handles a packet `is_gsi` accepted, from `sgid`, on device `dev`. Anything that is
    /// not a well-formed CM MAD with the GSI Q_Key is dropped.
    ///
    /// Returns why the packet was rejected before it reached the CM, if it was: it does not
    /// parse, its Q_Key is not the GSI's, or it is not from a GSI (QP1) (docs/guide/counters.md,
    /// "Rejected packets"). What
    /// the CM itself drops (a MAD over its source's rate, a message for no connection) is
    /// the CM's protocol, counted by it (`rate_dropped`), not a rejected packet.
    pub fn receive(
        &mut self,
        now: Instant,
        dev: usize,
        sgid: Gid,
        pkt: &[u8],
    ) -> Option<softverbs_transport::Reject> {
        use softverbs_transport::Reject;
        let port = self.ports.get_mut(dev)?;
        let Ok(p) = Packet::parse(pkt) else {
            return Some(Reject::Malformed);
        };
        // A CM MAD comes from the sender's GSI, QP1, with the GSI's Q_Key (IBA 13.5.1, 12.2);
        // every CM sends from there. A datagram from any other QP is a local user's UD QP
        // on some host (which may set its Q_Key to the GSI's) speaking for that host's CM.
        match p.headers.deth.map(|d| (d.qkey, d.src_qp)) {
            None => return Some(Reject::Malformed),
            Some((GSI_QKEY, GSI_QPN)) => {}
            Some((GSI_QKEY, _)) => return Some(Reject::ForeignSource),
            Some(_) => return Some(Reject::BadQkey),
        }
        if let Err(e) = port.cm.handle_mad(now, sgid.to_ip(), p.payload) {
            tracing::debug!(dev, "CM MAD dropped: {e}");
        }
        None
    }

    /// Runs the CMs' timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        for p in &mut self.ports {
            p.cm.handle_timeout(now);
        }
    }

    /// The earliest CM timer.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ports.iter().filter_map(|p| p.cm.poll_timeout()).min()
    }

    /// Delivers MADs between this daemon's own devices directly, queues events, and
    /// returns the MADs for other hosts as packets.
    pub fn flush(&mut self, now: Instant) -> Vec<GsiPacket> {
        let mut out = Vec::new();
        loop {
            let mut moved = false;
            for d in 0..self.ports.len() {
                while let Some(t) = self.ports[d].cm.poll_transmit() {
                    moved = true;
                    let from = self.ports[d].local_for(t.peer);
                    let own = self.ports.iter().position(|p| p.ips.contains(&t.peer));
                    let own = own.zip(from);
                    if let Some((to, from)) = own {
                        if let Err(e) = self.ports[to].cm.handle_mad(now, from, &t.mad) {
                            tracing::warn!("own CM MAD refused: {e}");
                        }
                        if self.own_copies.is_none() {
                            continue;
                        }
                    }
                    let port = &mut self.ports[d];
                    let mut bytes = vec![0u8; 12 + 8 + t.mad.len() + 4];
                    match emit_packet(&gsi_headers(port.psn), &t.mad, &mut bytes) {
                        Ok(n) => bytes.truncate(n),
                        Err(e) => {
                            tracing::warn!("CM packet not built: {e}");
                            continue;
                        }
                    }
                    port.psn = port.psn.wrapping_add(1) & 0x00FF_FFFF;
                    let p = GsiPacket {
                        dev: d,
                        dst: Gid::from_ip(t.peer),
                        bytes,
                    };
                    match (own, &mut self.own_copies) {
                        (Some((to, from)), Some(copies)) => copies.push((from, to, p)),
                        _ => out.push(p),
                    }
                }
                while let Some((o, id, ev)) = self.ports[d].cm.poll_event() {
                    moved = true;
                    self.queue_event(CtxId(o.0), id, ev);
                }
            }
            self.moved |= moved;
            if !moved {
                break;
            }
        }
        for ctx in std::mem::take(&mut self.woken) {
            if let Some(efd) = self.ctxs.get(&ctx).and_then(|c| c.efd.as_ref()) {
                softverbs_ipc::signal_eventfd(efd.as_fd());
            }
        }
        out
    }

    fn queue_event(&mut self, ctx: CtxId, id: CmId, ev: Event) {
        let mut r = CmEventResp {
            id: U32::new(id.0),
            ..CmEventResp::default()
        };
        let pd = |r: &mut CmEventResp, data: &[u8]| {
            let n = data.len().min(r.private_data.len());
            r.private_data[..n].copy_from_slice(&data[..n]);
            r.private_data_len = U16::new(n as u16);
        };
        match ev {
            Event::ConnectRequest {
                listener,
                peer,
                req,
            } => {
                r.event = U32::new(cm_event::CONNECT_REQUEST);
                r.listener = U32::new(listener.0);
                r.peer = Gid::from_ip(peer).0;
                r.service_id = U64::new(req.service_id);
                r.remote_qpn = U32::new(req.local_qpn);
                r.starting_psn = U32::new(req.starting_psn);
                r.responder_resources = req.responder_resources;
                r.initiator_depth = req.initiator_depth;
                r.rnr_retry_count = req.rnr_retry_count;
                r.retry_count = req.retry_count;
                r.path_mtu = req.path_mtu;
                r.srq = u8::from(req.srq);
                pd(&mut r, &req.private_data);
            }
            Event::ConnectReply { rep } => {
                r.event = U32::new(cm_event::CONNECT_RESPONSE);
                // An XRC target names its QP in Local EE Context Number and leaves Local QPN
                // zero (IBA A14.4.2; the kernel's cm_format_rep). QP 0 is never a connected
                // QP, so a zero Local QPN means the number is in the other field.
                r.remote_qpn = U32::new(if rep.local_qpn == 0 {
                    rep.local_eecn
                } else {
                    rep.local_qpn
                });
                r.starting_psn = U32::new(rep.starting_psn);
                r.responder_resources = rep.responder_resources;
                r.initiator_depth = rep.initiator_depth;
                r.rnr_retry_count = rep.rnr_retry_count;
                r.srq = u8::from(rep.srq);
                pd(&mut r, &rep.private_data);
            }
            Event::Established => r.event = U32::new(cm_event::ESTABLISHED),
            Event::Rejected {
                reason,
                private_data,
            } => {
                r.event = U32::new(cm_event::REJECTED);
                r.status = U32::new(reason.0.into());
                pd(&mut r, &private_data);
            }
            Event::Unreachable => r.event = U32::new(cm_event::UNREACHABLE),
            Event::Disconnected => r.event = U32::new(cm_event::DISCONNECTED),
            Event::SidrRequest {
                listener,
                peer,
                req,
            } => {
                r.event = U32::new(cm_event::CONNECT_REQUEST);
                r.sidr = U32::new(1);
                r.listener = U32::new(listener.0);
                r.peer = Gid::from_ip(peer).0;
                r.service_id = U64::new(req.service_id);
                pd(&mut r, &req.private_data);
            }
            Event::SidrReply { rep } => {
                r.event = U32::new(if rep.status == SidrStatus::SUCCESS {
                    cm_event::ESTABLISHED
                } else {
                    cm_event::REJECTED
                });
                r.sidr = U32::new(1);
                r.status = U32::new(rep.status.0.into());
                r.remote_qpn = U32::new(rep.qpn);
                r.qkey = U32::new(rep.qkey);
                r.service_id = U64::new(rep.service_id);
                pd(&mut r, &rep.private_data);
            }
        }
        let c = self.ctxs.entry(ctx).or_default();
        if c.events.len() >= MAX_QUEUED_EVENTS {
            c.events.pop_front();
        }
        c.events.push_back(r);
        self.woken.push(ctx);
    }

    /// Everything a closed context held: its peers are told, its events dropped.
    pub fn close_context(&mut self, now: Instant, ctx: CtxId) {
        for p in &mut self.ports {
            p.cm.destroy_owner(now, owner(ctx));
        }
        self.ctxs.remove(&ctx);
        // The core gives back a closed context's charges with the context.
        self.charged.remove(&ctx);
    }

    /// What the CMs hold, summed over devices.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for p in &self.ports {
            let x = p.cm.counts();
            c.listeners += x.listeners;
            c.connections += x.connections;
            c.time_wait += x.time_wait;
            c.owned += x.owned;
            c.rate_dropped += x.rate_dropped;
        }
        c
    }

    fn port(&mut self, dev: usize) -> Result<&mut Cm, i32> {
        self.ports.get_mut(dev).map(|p| &mut p.cm).ok_or(EINVAL)
    }

    // ---- commands (ids 100-111) ----------------------------------------------------------

    /// `CmOpen`: the context's CM eventfd (one per context; `EEXIST` the second time).
    pub fn open(&mut self, ctx: CtxId) -> Result<OwnedFd, i32> {
        let c = self.ctxs.entry(ctx).or_default();
        if c.efd.is_some() {
            return Err(EEXIST);
        }
        let efd = softverbs_ipc::new_eventfd().map_err(|_| ENOMEM)?;
        let client = efd.try_clone().map_err(|_| ENOMEM)?;
        if !c.events.is_empty() {
            softverbs_ipc::signal_eventfd(efd.as_fd());
        }
        c.efd = Some(efd);
        Ok(client)
    }

    /// `CmListen`. An rdma_cm port below 1024 needs `privileged()` (the kernel's rdma_cm
    /// refuses such a bind with `EACCES` without `CAP_NET_BIND_SERVICE`, as bind(2) does).
    pub fn listen(
        &mut self,
        ctx: CtxId,
        dev: usize,
        r: &CmListenReq,
        privileged: impl FnOnce() -> bool,
    ) -> Result<CmIdResp, i32> {
        if ServiceId::from_u64(r.service_id.get()).is_some_and(|s| s.port != 0 && s.port < 1024)
            && !privileged()
        {
            return Err(rustix::io::Errno::ACCESS.raw_os_error());
        }
        let id = self
            .port(dev)?
            .listen_backlog(owner(ctx), r.service_id.get(), r.backlog.get())
            .map_err(cm_errno)?;
        Ok(CmIdResp { id: U32::new(id.0) })
    }

    /// `CmConnect`.
    pub fn connect(
        &mut self,
        now: Instant,
        ctx: CtxId,
        dev: usize,
        r: &CmConnectReq,
    ) -> Result<CmIdResp, i32> {
        let dst = ip_of(r.dst);
        let local_ip = self
            .ports
            .get(dev)
            .ok_or(EINVAL)?
            .local_for(dst)
            .ok_or(EINVAL)?;
        if dst.is_unspecified() {
            return Err(EINVAL);
        }
        let qp_kind = match r.qp_kind.get() {
            CM_QP_RC => QpKind::Rc,
            CM_QP_UC => QpKind::Uc,
            CM_QP_XRC => QpKind::Xrc,
            _ => return Err(EINVAL),
        };
        let p = ConnectParams {
            peer: dst,
            service_id: r.service_id.get(),
            local_gid: Gid::from_ip(local_ip).0,
            remote_gid: r.dst,
            qp_kind,
            qpn: r.qpn.get(),
            starting_psn: r.starting_psn.get(),
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq != 0,
            path_mtu: r.path_mtu,
            hop_limit: 64,
            // What the kernel's rdma_cm puts in a RoCE REQ: cm_ack_timeout(ack delay 15,
            // CMA_IBOE_PACKET_LIFETIME) = 19 with 6.1's lifetime 18 (captured from rxe,
            // crates/wire/tests/rxe_cm.rs; later kernels' 16 give 17). A kernel passive side
            // derives its QP's ACK timeout from it (cm_format_paths_from_req: packet life
            // time = this - 1), about 2 s.
            local_ack_timeout: 19,
            response_timeout: r.response_timeout,
            max_cm_retries: r.max_cm_retries,
            private_data: private(&r.private_data, r.private_data_len).to_vec(),
        };
        let id = self
            .port(dev)?
            .connect(now, owner(ctx), &p)
            .map_err(cm_errno)?;
        Ok(CmIdResp { id: U32::new(id.0) })
    }

    /// `CmAccept`.
    pub fn accept(
        &mut self,
        now: Instant,
        ctx: CtxId,
        dev: usize,
        r: &CmAcceptReq,
    ) -> Result<(), i32> {
        let p = AcceptParams {
            qpn: r.qpn.get(),
            starting_psn: r.starting_psn.get(),
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq != 0,
            private_data: private(&r.private_data, r.private_data_len).to_vec(),
        };
        self.port(dev)?
            .accept(now, owner(ctx), CmId(r.id.get()), &p)
            .map_err(cm_errno)
    }

    /// `CmReject`.
    pub fn reject(
        &mut self,
        now: Instant,
        ctx: CtxId,
        dev: usize,
        r: &CmRejectReq,
    ) -> Result<(), i32> {
        let pd = private(&r.private_data, r.private_data_len);
        self.port(dev)?
            .reject(now, owner(ctx), CmId(r.id.get()), pd)
            .map_err(cm_errno)
    }

    /// `CmEstablish`.
    pub fn establish(
        &mut self,
        now: Instant,
        ctx: CtxId,
        dev: usize,
        r: &CmIdReq,
    ) -> Result<(), i32> {
        self.port(dev)?
            .establish(now, owner(ctx), CmId(r.id.get()))
            .map_err(cm_errno)
    }

    /// `CmDisconnect`.
    pub fn disconnect(
        &mut self,
        now: Instant,
        ctx: CtxId,
        dev: usize,
        r: &CmDisconnectReq,
    ) -> Result<(), i32> {
        let pd = private(&r.private_data, r.private_data_len);
        self.port(dev)?
            .disconnect(now, owner(ctx), CmId(r.id.get()), pd)
            .map_err(cm_errno)
    }

    /// `CmDestroyId`.
    pub fn destroy(
        &mut self,
        now: Instant,
        ctx: CtxId,
        dev: usize,
        r: &CmIdReq,
    ) -> Result<(), i32> {
        self.port(dev)?
            .destroy(now, owner(ctx), CmId(r.id.get()))
            .map_err(cm_errno)
    }

    /// `CmAdopt`: the CM id `r` of context `from` becomes `ctx`'s, with the events queued for
    /// it (for a listener also its queued connect requests and their new ids). The caller
    /// checked that both contexts are the same process's.
    pub fn adopt(&mut self, ctx: CtxId, from: CtxId, dev: usize, r: &CmIdReq) -> Result<(), i32> {
        let id = CmId(r.id.get());
        let cm = self.port(dev)?;
        cm.reassign(owner(from), id, owner(ctx)).map_err(cm_errno)?;
        let Some(old) = self.ctxs.get_mut(&from) else {
            return Ok(());
        };
        let (mine, rest): (VecDeque<_>, VecDeque<_>) =
            std::mem::take(&mut old.events).into_iter().partition(|e| {
                e.id.get() == id.0
                    || (e.event.get() == cm_event::CONNECT_REQUEST && e.listener.get() == id.0)
            });
        old.events = rest;
        if let Some(efd) = &old.efd {
            softverbs_ipc::drain_eventfd(efd.as_fd());
            if !old.events.is_empty() {
                softverbs_ipc::signal_eventfd(efd.as_fd());
            }
        }
        if mine.is_empty() {
            return Ok(());
        }
        for e in &mine {
            if e.id.get() != id.0 {
                // The new id of a connect request queued for the listener.
                let _ = self.ports[dev]
                    .cm
                    .reassign(owner(from), CmId(e.id.get()), owner(ctx));
            }
        }
        let new = self.ctxs.entry(ctx).or_default();
        new.events.extend(mine);
        self.woken.push(ctx);
        Ok(())
    }

    /// Who holds CM id `r` on device `dev`.
    pub fn holder(&self, dev: usize, r: &CmIdReq) -> Option<CtxId> {
        let o = self.ports.get(dev)?.cm.owner_of(CmId(r.id.get()))?;
        Some(CtxId(o.0))
    }

    /// `CmGetEvent`.
    pub fn get_event(&mut self, ctx: CtxId) -> Result<CmEventResp, i32> {
        let c = self.ctxs.get_mut(&ctx).ok_or(EAGAIN)?;
        let ev = c.events.pop_front().ok_or(EAGAIN)?;
        if let Some(efd) = &c.efd {
            // Level-triggered for the client: drained when empty, raised while not.
            softverbs_ipc::drain_eventfd(efd.as_fd());
            if !c.events.is_empty() {
                softverbs_ipc::signal_eventfd(efd.as_fd());
            }
        }
        Ok(ev)
    }

    /// `CmSidrRequest`.
    pub fn sidr_request(
        &mut self,
        now: Instant,
        ctx: CtxId,
        dev: usize,
        r: &CmSidrReq,
    ) -> Result<CmIdResp, i32> {
        let dst = ip_of(r.dst);
        // As for a REQ: a SIDR_REQ to no address, or to a family the device has no address
        // of, could only be lost (or looped back to this host).
        let port = self.ports.get(dev).ok_or(EINVAL)?;
        if port.local_for(dst).is_none() || dst.is_unspecified() {
            return Err(EINVAL);
        }
        let p = SidrParams {
            peer: dst,
            service_id: r.service_id.get(),
            pkey: 0xFFFF,
            response_timeout: r.response_timeout,
            max_retries: r.max_retries,
            private_data: private(&r.private_data, r.private_data_len).to_vec(),
        };
        let id = self
            .port(dev)?
            .sidr_request(now, owner(ctx), &p)
            .map_err(cm_errno)?;
        Ok(CmIdResp { id: U32::new(id.0) })
    }

    /// `CmSidrReply`.
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        ctx: CtxId,
        dev: usize,
        r: &CmSidrReplyReq,
    ) -> Result<(), i32> {
        let status = u8::try_from(r.status.get()).map_err(|_| EINVAL)?;
        let p = SidrReplyParams {
            status: SidrStatus(status),
            qpn: r.qpn.get(),
            qkey: r.qkey.get(),
            private_data: private(&r.private_data, r.private_data_len).to_vec(),
        };
        self.port(dev)?
            .sidr_reply(now, owner(ctx), CmId(r.id.get()), &p)
            .map_err(cm_errno)
    }

    /// `CmCounts`: what one context holds.
    pub fn ctx_counts(&self, ctx: CtxId) -> CmCountsResp {
        let (mut l, mut i) = (0, 0);
        for p in &self.ports {
            let (a, b) = p.cm.owner_counts(owner(ctx));
            l += a;
            i += b;
        }
        CmCountsResp {
            listeners: U32::new(l as u32),
            ids: U32::new(i as u32),
            events: U32::new(self.ctxs.get(&ctx).map_or(0, |c| c.events.len()) as u32),
        }
    }
}
