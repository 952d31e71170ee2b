//! Command dispatch: decode one request, apply it to the core, encode the answer.
//!
//! Everything a client can send passes through [`Dispatcher::handle`], which never panics on
//! any input (the fuzz target drives it directly): framing errors, unknown commands, bad
//! `comp_mask` bits, bad enum values, stray or missing file descriptors and handles of other
//! contexts all become errno replies.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use softverbs_abi::codec::{decode_request, encode_response, peek_cmd, Request};
use softverbs_abi::convert::qp_attr_from_wire;
use softverbs_abi::msg::*;
use softverbs_abi::msg::{cmd, Command};
use softverbs_abi::MIN_ABI_VERSION;
use softverbs_core::attr::{AhAttr, QpInitAttr, SrqAttr};
use softverbs_core::ids::{CtxId, FileId, Handle};
use softverbs_core::limits::{Resource, Ring};
use softverbs_core::qp::QpQuery;
use softverbs_core::types::{Access, AttrMask, EventType, QpType};
use softverbs_core::{ContextInfo, Core, Error};
use softverbs_ipc::PeerCred;
use softverbs_memaccess::ProcessMemory;

use crate::datapath::{DataPath, NetOptions};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;

use softverbs_core::errno::{EAGAIN, EBADF, EINVAL, ENOMEM, EOPNOTSUPP, EPERM, EPROTONOSUPPORT};

/// What a connection has established so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Nothing yet: only `Hello` is accepted.
    New,
    /// Introspection only (no device opened).
    Introspect,
    /// A context is open.
    Context(CtxId),
}

/// Per-connection state the dispatcher needs.
#[derive(Debug)]
pub struct Session {
    /// Credentials of the client (`SO_PEERCRED`).
    pub cred: PeerCred,
    /// The client's command name.
    pub comm: String,
    /// What has been established.
    pub phase: Phase,
    /// The daemon's end of the async-event eventfd.
    pub eventfd: Option<OwnedFd>,
    /// The process that sent the request being handled (`SCM_CREDENTIALS`), set by the
    /// server before each [`Dispatcher::handle`]; `None` when the kernel did not say.
    pub sender_pid: Option<u32>,
    /// The process that opened the context (sent `Hello`), whose memory the context's
    /// memory descriptor is. Only it may register memory (see [`Dispatcher::handle`]).
    pub opener_pid: Option<u32>,
}

impl Session {
    /// A fresh session for a client.
    pub fn new(cred: PeerCred, comm: String) -> Session {
        Session {
            cred,
            comm,
            phase: Phase::New,
            eventfd: None,
            sender_pid: None,
            opener_pid: None,
        }
    }

    /// The sender of the current request: what the kernel said, else the connecting process.
    fn sender(&self) -> u32 {
        self.sender_pid.unwrap_or(self.cred.pid)
    }

    /// The open context, if any.
    pub fn ctx(&self) -> Option<CtxId> {
        match self.phase {
            Phase::Context(c) => Some(c),
            _ => None,
        }
    }
}

/// The result of one request.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The encoded response datagram.
    pub reply: Vec<u8>,
    /// Descriptors to send with it.
    pub fds: Vec<OwnedFd>,
    /// Contexts that got new async events (their eventfds must be signalled).
    pub woken: Vec<CtxId>,
}

/// The daemon's state that commands act on.
pub struct Dispatcher {
    /// The verbs core.
    pub core: Core,
    /// Engines, devices, client memory and CQs.
    pub dp: DataPath,
    /// ABI level spoken.
    pub abi: u32,
    /// The version `resources` reports (`Config::version`).
    pub version: String,
    started: Instant,
    daemon_uid: u32,
    /// The same-host direct path's control side (docs/design/direct-path.md).
    pub direct: crate::direct::Direct,
    /// What the daemon's network side is, in words, for `softverbs status` (`network` in
    /// the resources snapshot): which addresses it bound, or why it has none.
    pub network: String,
}

type Reply = Result<(Vec<u8>, Vec<OwnedFd>), i32>;

/// The reply of command `C`: its response struct, as the command table types it.
fn ok<C: Command>(v: C::Resp) -> Reply {
    Ok((v.as_bytes().to_vec(), Vec::new()))
}

/// The reply of command `C` with descriptors.
fn with_fds<C: Command>(v: C::Resp, fds: Vec<OwnedFd>) -> Reply {
    Ok((v.as_bytes().to_vec(), fds))
}

fn core_err(e: Error) -> i32 {
    e.errno()
}

/// Descriptors the daemon keeps for a context's doorbell (the data path's end and the event
/// loop's copy) and for its direct path (the opener's `mem` and the MR table's memfd).
const DOORBELL_FDS: u64 = 2;
const DIRECT_OPEN_FDS: u64 = 2;

/// Charges `n` descriptors the daemon is about to keep for `ctx` (docs/guide/limits.md): `ENOMEM`
/// past the context's, its uid's or the daemon's share.
fn charge_fds(core: &mut Core, ctx: CtxId, n: u64) -> Result<(), i32> {
    core.charge(ctx, Resource::Descriptors, n).map_err(core_err)
}

/// Runs `make`, which leaves `n` more descriptors open in the daemon for `ctx`, if the shares
/// allow them ([`charge_fds`]); they stay charged only if it succeeds.
fn holding_fds<T>(
    core: &mut Core,
    ctx: CtxId,
    n: u64,
    make: impl FnOnce() -> Result<T, i32>,
) -> Result<T, i32> {
    if n > 0 {
        charge_fds(core, ctx, n)?;
    }
    make().inspect_err(|_| core.uncharge(ctx, Resource::Descriptors, n))
}

fn handle_of(v: U32) -> Handle {
    Handle(v.get())
}

fn events(n: u32) -> EventsResp {
    EventsResp {
        events_reported: U32::new(n),
    }
}

fn handle_resp(h: Handle) -> HandleResp {
    HandleResp {
        handle: U32::new(h.0),
    }
}

fn query_resp(q: &QpQuery, qpn: u32) -> QueryQpResp {
    QueryQpResp {
        attr: (&q.attr).into(),
        qp_type: U32::new(q.init.qp_type as u32),
        sq_sig_all: U32::new(u32::from(q.init.sq_sig_all)),
        create_flags: U32::new(q.init.create_flags),
        qpn: U32::new(qpn),
        init_cap: (&q.init.cap).into(),
    }
}

fn srq_resp(handle: Handle, a: SrqAttr, srqn: Option<u32>) -> SrqResp {
    SrqResp {
        handle: U32::new(handle.0),
        max_wr: U32::new(a.max_wr),
        max_sge: U32::new(a.max_sge),
        srq_limit: U32::new(a.srq_limit),
        srqn: U32::new(srqn.unwrap_or(0)),
    }
}

impl Dispatcher {
    /// A dispatcher over `core`, speaking ABI `abi`; fails if a device cannot take its
    /// network side ([`DataPath::new`]).
    pub fn new(core: Core, abi: u32, net: &NetOptions) -> std::io::Result<Dispatcher> {
        let dp = DataPath::new(&core, net)?;
        let mut d = Dispatcher {
            core,
            dp,
            abi,
            version: env!("CARGO_PKG_VERSION").into(),
            started: Instant::now(),
            daemon_uid: rustix::process::geteuid().as_raw(),
            direct: Default::default(),
            network: String::new(),
        };
        d.apply_changes();
        Ok(d)
    }

    /// Handles one request datagram with the descriptors that came with it. Descriptors the
    /// command does not take are closed (dropped) here.
    pub fn handle(&mut self, session: &mut Session, msg: &[u8], fds: Vec<OwnedFd>) -> Outcome {
        let mut woken = Vec::new();
        let result = match decode_request(msg) {
            Err(e) => Err(e.errno()),
            Ok(req) => self.command(session, &req, fds, &mut woken),
        };
        // Whatever the command changed reaches the data path before the client hears back.
        self.apply_changes();
        let cmd = peek_cmd(msg);
        let resp_len = decode_request(msg).map_or(0, |r| r.resp_len);
        match result {
            Ok((body, fds)) => Outcome {
                reply: encode_response(cmd, 0, &body, resp_len),
                fds,
                woken,
            },
            Err(errno) => Outcome {
                reply: encode_response(cmd, errno, &[], 0),
                fds: Vec::new(),
                woken,
            },
        }
    }

    /// Drains the core's changes into the data path (`Core::poll_change` →
    /// `DataPath::apply`): the one way objects reach the engines.
    pub(crate) fn apply_changes(&mut self) {
        while let Some(c) = self.core.poll_change() {
            self.dp.apply(c);
        }
        self.dp.settle_windows(&mut self.core);
    }

    /// Checks what the connection may send, then dispatches: the one `match` on the command.
    fn command(
        &mut self,
        s: &mut Session,
        req: &Request<'_>,
        mut fds: Vec<OwnedFd>,
        woken: &mut Vec<CtxId>,
    ) -> Reply {
        let abi = self.abi;
        // Only Hello (the client's memory), OpenXrcd and RegMr (a memfd of the range) take a
        // descriptor, and only one.
        if !matches!(
            req.cmd,
            Cmd::Hello | Cmd::OpenXrcd | Cmd::RegMr | Cmd::DirectOpen
        ) && !fds.is_empty()
        {
            return Err(EINVAL);
        }
        if abi < req.cmd.since_abi() {
            return Err(EOPNOTSUPP);
        }
        let mr_fd = if req.cmd == Cmd::RegMr {
            fds.pop()
        } else {
            None
        };
        if !fds.is_empty() && req.cmd == Cmd::RegMr {
            return Err(EINVAL);
        }
        // Hello opens the connection and nothing else may come first; the commands that need
        // a context refuse a connection without one (`ctx()?` below, before reading a body).
        match (req.cmd, s.phase) {
            (Cmd::Hello, Phase::New) => {}
            (Cmd::Hello, _) | (_, Phase::New) => return Err(EINVAL),
            _ => {}
        }
        let session_ctx = s.ctx();
        let ctx = || session_ctx.ok_or(EINVAL);
        macro_rules! read {
            ($c:ident) => {
                req.read::<cmd::$c>(abi).map_err(|e| e.errno())?
            };
        }
        if session_ctx.is_some() && takes_away(req.cmd) {
            // A NIC starts on a work request when its doorbell rings; here the daemon may not
            // have read the rings yet. What the process posted before this command goes out
            // first, so the command cannot take away what those requests use: rdma-core's
            // `mckey -s` posts unsignaled UD sends and destroys their AH and QP right after,
            // and its datagrams were refused (no such AH) whenever the daemon read the send
            // ring only after the destroy.
            woken.extend(self.drive());
        }
        match req.cmd {
            Cmd::Hello => self.hello(s, read!(Hello), req.comp_mask, fds),
            Cmd::QueryDeviceList => self.device_list(read!(QueryDeviceList)),
            Cmd::Status => self.status(),
            Cmd::Resources => self.resources(),
            Cmd::InjectEvent => self.inject(s, read!(InjectEvent), woken),
            Cmd::QueryDevice => self.query_device(ctx()?),
            Cmd::QueryPort => self.query_port(ctx()?, read!(QueryPort)),
            Cmd::QueryGid => self.query_gid(ctx()?, read!(QueryGid)),
            Cmd::GetAsyncEvent => self.get_async_event(ctx()?),
            Cmd::AllocPd => self.alloc_pd(ctx()?),
            Cmd::DeallocPd => self.dealloc_pd(ctx()?, read!(DeallocPd)),
            Cmd::RegMr => {
                let c = ctx()?;
                opener_only(s)?;
                let r = self.reg_mr(c, read!(RegMr), mr_fd);
                self.direct.mrs_changed(&self.core, &self.dp, c);
                r
            }
            Cmd::ReregMr => {
                let c = ctx()?;
                let r = read!(ReregMr);
                if r.flags.get() & REREG_MR_CHANGE_TRANSLATION != 0 {
                    opener_only(s)?;
                }
                let r = self.rereg_mr(c, r);
                self.direct.mrs_changed(&self.core, &self.dp, c);
                r
            }
            Cmd::DeregMr => {
                let c = ctx()?;
                let r = self.dereg_mr(c, read!(DeregMr));
                self.direct.mrs_changed(&self.core, &self.dp, c);
                r
            }
            Cmd::QueryOdpCaps => {
                ctx()?;
                ok::<cmd::QueryOdpCaps>(crate::odp::caps())
            }
            Cmd::AdviseMr => {
                let c = ctx()?;
                self.advise_mr(c, read!(AdviseMr))?;
                ok::<cmd::AdviseMr>(())
            }
            Cmd::AllocMw => self.alloc_mw(ctx()?, read!(AllocMw)),
            Cmd::DeallocMw => self.dealloc_mw(ctx()?, read!(DeallocMw)),
            Cmd::CreateCq => self.create_cq(ctx()?, req.comp_mask, read!(CreateCq)),
            Cmd::ResizeCq => self.resize_cq(ctx()?, read!(ResizeCq), woken),
            Cmd::DestroyCq => self.destroy_cq(ctx()?, read!(DestroyCq)),
            Cmd::CreateSrq => self.create_srq(ctx()?, read!(CreateSrq)),
            Cmd::CreateXrcSrq => self.create_xrc_srq(ctx()?, read!(CreateXrcSrq)),
            Cmd::ModifySrq => self.modify_srq(ctx()?, read!(ModifySrq)),
            Cmd::QuerySrq => self.query_srq(ctx()?, read!(QuerySrq)),
            Cmd::DestroySrq => self.destroy_srq(ctx()?, read!(DestroySrq)),
            Cmd::GetSrqNum => self.get_srq_num(ctx()?, read!(GetSrqNum)),
            Cmd::CreateAh => self.create_ah(ctx()?, read!(CreateAh)),
            Cmd::DestroyAh => self.destroy_ah(ctx()?, read!(DestroyAh)),
            Cmd::OpenXrcd => self.open_xrcd(ctx()?, read!(OpenXrcd), fds),
            Cmd::CloseXrcd => self.close_xrcd(ctx()?, read!(CloseXrcd)),
            Cmd::CreateQp => self.create_qp(ctx()?, read!(CreateQp)),
            Cmd::ModifyQp => {
                let (c, r) = (ctx()?, read!(ModifyQp));
                let qp = handle_of(r.handle);
                let done = self.modify_qp(c, r)?;
                // A direct peer checks this QP's access flags as they are now.
                self.direct.modified(&self.core, &mut self.dp, c, qp);
                Ok(done)
            }
            Cmd::QueryQp => self.query_qp(ctx()?, read!(QueryQp)),
            Cmd::DestroyQp => {
                let (c, r) = (ctx()?, read!(DestroyQp));
                if let Ok(qpn) = self.core.qp_num(c, handle_of(r.handle)) {
                    self.direct
                        .wake_partners(&self.core, &mut self.dp, qpn, true);
                    self.direct.qp_gone(qpn);
                    self.uncharge_pairs();
                }
                self.destroy_qp(c, r)
            }
            Cmd::OpenQp => self.open_qp(ctx()?, read!(OpenQp)),
            Cmd::CreateXrcRcvQp => self.create_xrc_rcv_qp(ctx()?, read!(CreateXrcRcvQp)),
            Cmd::ModifyXrcRcvQp => self.modify_xrc_rcv_qp(ctx()?, read!(ModifyXrcRcvQp)),
            Cmd::QueryXrcRcvQp => self.query_xrc_rcv_qp(ctx()?, read!(QueryXrcRcvQp)),
            Cmd::RegXrcRcvQp => self.reg_xrc_rcv_qp(ctx()?, read!(RegXrcRcvQp)),
            Cmd::UnregXrcRcvQp => self.unreg_xrc_rcv_qp(ctx()?, read!(UnregXrcRcvQp)),
            Cmd::DestroyXrcRcvQp => self.destroy_xrc_rcv_qp(ctx()?, read!(DestroyXrcRcvQp)),
            Cmd::RegisterXrcRcvQp => self.register_xrc_rcv_qp(ctx()?, read!(RegisterXrcRcvQp)),
            Cmd::UnregisterXrcRcvQp => {
                self.unregister_xrc_rcv_qp(ctx()?, read!(UnregisterXrcRcvQp))
            }
            // The data-path commands (ABI 3) run the engines after them, whatever they answer.
            Cmd::PostSend => self.driven(ctx()?, woken, |d, c| d.post_send(c, req)),
            Cmd::PostRecv | Cmd::PostSrqRecv => {
                self.driven(ctx()?, woken, |d, c| d.post_recv(c, req))
            }
            Cmd::PollCq => self.driven(ctx()?, woken, |d, c| d.poll_cq(c, req)),
            Cmd::CreateCompChannel => self.driven(ctx()?, woken, |d, c| d.create_channel(c)),
            Cmd::DestroyCompChannel => {
                self.driven(ctx()?, woken, |d, c| d.destroy_comp_channel(c, req))
            }
            Cmd::ReqNotifyCq => self.driven(ctx()?, woken, |d, c| d.req_notify_cq(c, req)),
            Cmd::GetCqEvent => self.driven(ctx()?, woken, |d, c| d.get_cq_event(c, req)),
            Cmd::MapQueues => self.driven(ctx()?, woken, |d, c| d.map_queues(c, req)),
            Cmd::MapDoorbell => self.driven(ctx()?, woken, |d, c| d.map_doorbell(c)),
            Cmd::AttachMcast => self.attach_mcast(ctx()?, read!(AttachMcast)),
            Cmd::DetachMcast => self.detach_mcast(ctx()?, read!(DetachMcast)),
            Cmd::CmOpen
            | Cmd::CmListen
            | Cmd::CmConnect
            | Cmd::CmAccept
            | Cmd::CmReject
            | Cmd::CmEstablish
            | Cmd::CmDisconnect
            | Cmd::CmDestroyId
            | Cmd::CmGetEvent
            | Cmd::CmSidrRequest
            | Cmd::CmSidrReply
            | Cmd::CmCounts
            | Cmd::CmAdopt => self.driven(ctx()?, woken, |d, c| d.cm_command(c, req)),
            Cmd::DirectOpen => {
                let c = ctx()?;
                opener_only(s)?;
                let mem = fds.pop().ok_or(EINVAL)?;
                let pid = s.opener_pid.unwrap_or(s.cred.pid);
                let caps = read!(DirectOpen).caps.get();
                // The daemon keeps the opener's `mem` and the MR table's memfd (a second
                // open replaces both).
                let new = !self.direct.is_open(c);
                if new {
                    charge_fds(&mut self.core, c, DIRECT_OPEN_FDS)?;
                }
                let table = self
                    .direct
                    .open(&self.core, &self.dp, c, s.cred.uid, pid, caps, mem)
                    .inspect_err(|_| {
                        if new {
                            self.core
                                .uncharge(c, Resource::Descriptors, DIRECT_OPEN_FDS);
                        }
                    })?;
                with_fds::<cmd::DirectOpen>((), vec![table])
            }
            Cmd::DirectAttach => {
                let c = ctx()?;
                let r = read!(DirectAttach);
                let attached = self.direct.attach(&mut self.core, &self.dp, c, &r);
                self.uncharge_pairs();
                let (resp, fds) = attached?;
                let pid = s.opener_pid.unwrap_or(s.cred.pid);
                let (resp, fds) = self.net_path(c, pid, &r, resp, fds);
                self.direct.publish_attrs(&self.core, c, handle_of(r.qp));
                if let Ok(qpn) = self.core.qp_num(c, handle_of(r.qp)) {
                    // A partner whose requests waited for this side may go on.
                    self.direct
                        .wake_partners(&self.core, &mut self.dp, qpn, false);
                }
                with_fds::<cmd::DirectAttach>(resp, fds)
            }
            Cmd::DirectPeerError => {
                let (c, r) = (ctx()?, read!(DirectPeerError));
                woken.extend(self.direct.peer_error(
                    &mut self.core,
                    c,
                    handle_of(r.qp),
                    r.event.get(),
                )?);
                if let Ok(qpn) = self.core.qp_num(c, handle_of(r.qp)) {
                    self.direct
                        .wake_partners(&self.core, &mut self.dp, qpn, true);
                }
                ok::<cmd::DirectPeerError>(())
            }
            Cmd::DirectMrFd => {
                let (c, r) = (ctx()?, read!(DirectMrFd));
                let (resp, fd) = self.direct.mr_fd(&self.core, &self.dp, c, &r)?;
                with_fds::<cmd::DirectMrFd>(resp, vec![fd])
            }
            Cmd::DirectAtomic => {
                let (c, r) = (ctx()?, read!(DirectAtomic));
                ok::<cmd::DirectAtomic>(self.direct.atomic(&self.core, &mut self.dp, c, &r)?)
            }
            Cmd::DirectLocalOp => {
                let (c, r) = (ctx()?, read!(DirectLocalOp));
                ok::<cmd::DirectLocalOp>(self.direct.local_op(&self.core, &mut self.dp, c, &r)?)
            }
            Cmd::DirectWindowTarget => {
                let (c, r) = (ctx()?, read!(DirectWindowTarget));
                ok::<cmd::DirectWindowTarget>(
                    self.direct.window_target(&self.core, &self.dp, c, &r)?,
                )
            }
            Cmd::DirectRemoteInv => {
                let (c, r) = (ctx()?, read!(DirectRemoteInv));
                ok::<cmd::DirectRemoteInv>(self.direct.remote_inv(
                    &self.core,
                    &mut self.dp,
                    c,
                    &r,
                )?)
            }
            Cmd::DirectCqOverrun => {
                let (c, r) = (ctx()?, read!(DirectCqOverrun));
                let cq = handle_of(r.handle);
                self.dp.cq_outstanding(c, cq).ok_or(EINVAL)?;
                if self.core.raise_object_event(
                    c,
                    softverbs_core::event::EventElement::Cq(cq),
                    EventType::CqErr,
                ) {
                    woken.push(c);
                }
                ok::<cmd::DirectCqOverrun>(())
            }
            Cmd::DirectSrqLimit => {
                let (c, r) = (ctx()?, read!(DirectSrqLimit));
                // The direct peer's SRQ; for a QP on the net path (docs/design/net-path.md), whose
                // library takes from its own SRQ, that one.
                let own = || {
                    let qp = handle_of(r.handle);
                    let qpn = self.core.qp_num(c, qp).ok()?;
                    self.dp.on_net_path(qpn).then_some(())?;
                    let srq = self.core.owned_qp_info(c, qp)?.srq?;
                    Some((c, srq))
                };
                let srq = self
                    .direct
                    .peer_srq(&self.core, c, handle_of(r.handle))
                    .or_else(own)
                    .ok_or(EINVAL)?;
                self.dp.fed_srq_limit_reached(srq)?;
                if self.core.raise_object_event(
                    srq.0,
                    softverbs_core::event::EventElement::Srq(srq.1),
                    EventType::SrqLimitReached,
                ) {
                    woken.push(srq.0);
                }
                ok::<cmd::DirectSrqLimit>(())
            }
            Cmd::NetQpError => {
                let (c, r) = (ctx()?, read!(NetQpError));
                woken.extend(self.net_qp_error(c, handle_of(r.qp), r.event.get())?);
                ok::<cmd::NetQpError>(())
            }
            Cmd::NetDrops => {
                let (c, r) = (ctx()?, read!(NetDrops));
                let totals = softverbs_transport::DropStats {
                    foreign_source: r.foreign_source.get(),
                    outside_window: r.outside_window.get(),
                };
                self.dp.net_drops_reported(c, totals);
                ok::<cmd::NetDrops>(())
            }
            Cmd::DirectNotify => {
                let (c, r) = (ctx()?, read!(DirectNotify));
                self.direct.notify(&self.core, &mut self.dp, c, &r)?;
                ok::<cmd::DirectNotify>(())
            }
        }
    }

    /// Tears a context down (its connection closed) in the core and the data path.
    /// Tears context `ctx` down; the engines first run what it posted (as for
    /// `DestroyQp`). Returns the contexts that got async events meanwhile with the result.
    pub fn close_context(&mut self, ctx: CtxId) -> (Vec<CtxId>, Result<(), Error>) {
        let woken = self.drive();
        (woken, self.close_context_now(ctx))
    }

    fn close_context_now(&mut self, ctx: CtxId) -> Result<(), Error> {
        let qpns = self.core.context_qpns(ctx);
        self.direct
            .wake_partners_of_context(&self.core, &mut self.dp, ctx);
        self.direct.context_closed(ctx, &qpns);
        self.uncharge_pairs();
        let r = self.core.close_context(ctx);
        self.apply_changes();
        r
    }

    /// Gives back the descriptor of each direct-path pair memfd closed since the last call.
    fn uncharge_pairs(&mut self) {
        for c in self.direct.take_released() {
            self.core.uncharge(c, Resource::Descriptors, 1);
        }
    }

    /// Runs the engines; returns the contexts that got async events.
    pub fn drive(&mut self) -> Vec<CtxId> {
        let woken = self.dp.drive(&mut self.core);
        self.apply_changes();
        woken
    }

    /// A data-path command on `ctx`, then the engines run (it may have made work for them),
    /// whatever it answered.
    fn driven(
        &mut self,
        ctx: CtxId,
        woken: &mut Vec<CtxId>,
        f: impl FnOnce(&mut Self, CtxId) -> Reply,
    ) -> Reply {
        let r = f(self, ctx);
        woken.extend(self.drive());
        r
    }

    // ---- objects ---------------------------------------------------------------------------

    fn get_async_event(&mut self, c: CtxId) -> Reply {
        match self.core.next_event(c).map_err(core_err)? {
            Some(ev) => ok::<cmd::GetAsyncEvent>(AsyncEventResp::from(&ev)),
            None => Err(EAGAIN),
        }
    }

    fn alloc_pd(&mut self, c: CtxId) -> Reply {
        let h = self.core.alloc_pd(c).map_err(core_err)?;
        ok::<cmd::AllocPd>(handle_resp(h))
    }

    fn dealloc_pd(&mut self, c: CtxId, r: <cmd::DeallocPd as Command>::Req) -> Reply {
        self.core
            .dealloc_pd(c, handle_of(r.handle))
            .map_err(core_err)?;
        ok::<cmd::DeallocPd>(())
    }

    fn dereg_mr(&mut self, c: CtxId, r: <cmd::DeregMr as Command>::Req) -> Reply {
        self.core
            .dereg_mr(c, handle_of(r.handle))
            .map_err(core_err)?;
        ok::<cmd::DeregMr>(())
    }

    /// `ibv_alloc_mw`: the window reaches the engine of its device through the core's change.
    fn alloc_mw(&mut self, c: CtxId, r: <cmd::AllocMw as Command>::Req) -> Reply {
        let t = softverbs_core::mw::MwType::from_raw(r.mw_type.get()).map_err(core_err)?;
        let a = self
            .core
            .alloc_mw(c, handle_of(r.pd), t)
            .map_err(core_err)?;
        ok::<cmd::AllocMw>(AllocMwResp {
            handle: U32::new(a.handle.0),
            rkey: U32::new(a.rkey),
        })
    }

    fn dealloc_mw(&mut self, c: CtxId, r: <cmd::DeallocMw as Command>::Req) -> Reply {
        self.core
            .dealloc_mw(c, handle_of(r.handle))
            .map_err(core_err)?;
        ok::<cmd::DeallocMw>(())
    }

    fn destroy_cq(&mut self, c: CtxId, r: <cmd::DestroyCq as Command>::Req) -> Reply {
        let n = self
            .core
            .destroy_cq(c, handle_of(r.handle))
            .map_err(core_err)?;
        ok::<cmd::DestroyCq>(events(n))
    }

    fn query_srq(&mut self, c: CtxId, r: <cmd::QuerySrq as Command>::Req) -> Reply {
        let h = handle_of(r.handle);
        let a = self.core.query_srq(c, h).map_err(core_err)?;
        ok::<cmd::QuerySrq>(srq_resp(h, a, self.core.srq_num(c, h).ok()))
    }

    fn destroy_srq(&mut self, c: CtxId, r: <cmd::DestroySrq as Command>::Req) -> Reply {
        let fed = self.dp.is_fed_srq(c, handle_of(r.handle));
        let n = self
            .core
            .destroy_srq(c, handle_of(r.handle))
            .map_err(core_err)?;
        if fed {
            self.core.uncharge(c, Resource::Descriptors, 1);
        }
        ok::<cmd::DestroySrq>(events(n))
    }

    fn get_srq_num(&mut self, c: CtxId, r: <cmd::GetSrqNum as Command>::Req) -> Reply {
        let srqn = self
            .core
            .srq_num(c, handle_of(r.handle))
            .map_err(core_err)?;
        ok::<cmd::GetSrqNum>(SrqNumResp {
            srqn: U32::new(srqn),
        })
    }

    fn create_ah(&mut self, c: CtxId, r: <cmd::CreateAh as Command>::Req) -> Reply {
        let attr = AhAttr::from(&r.attr);
        let h = self
            .core
            .create_ah(c, handle_of(r.pd), attr)
            .map_err(core_err)?;
        ok::<cmd::CreateAh>(handle_resp(h))
    }

    fn destroy_ah(&mut self, c: CtxId, r: <cmd::DestroyAh as Command>::Req) -> Reply {
        self.core
            .destroy_ah(c, handle_of(r.handle))
            .map_err(core_err)?;
        ok::<cmd::DestroyAh>(())
    }

    fn attach_mcast(&mut self, c: CtxId, r: <cmd::AttachMcast as Command>::Req) -> Reply {
        self.core
            .attach_mcast(c, handle_of(r.qp), softverbs_core::device::Gid(r.gid))
            .map_err(core_err)?;
        ok::<cmd::AttachMcast>(())
    }

    fn detach_mcast(&mut self, c: CtxId, r: <cmd::DetachMcast as Command>::Req) -> Reply {
        self.core
            .detach_mcast(c, handle_of(r.qp), softverbs_core::device::Gid(r.gid))
            .map_err(core_err)?;
        ok::<cmd::DetachMcast>(())
    }

    fn close_xrcd(&mut self, c: CtxId, r: <cmd::CloseXrcd as Command>::Req) -> Reply {
        self.core
            .close_xrcd(c, handle_of(r.handle))
            .map_err(core_err)?;
        ok::<cmd::CloseXrcd>(())
    }

    fn modify_qp(&mut self, c: CtxId, r: <cmd::ModifyQp as Command>::Req) -> Reply {
        let attr = qp_attr_from_wire(&r.attr, r.attr_mask.get()).map_err(core_err)?;
        let mask = AttrMask(r.attr_mask.get());
        self.core
            .modify_qp(c, handle_of(r.handle), &attr, mask)
            .map_err(core_err)?;
        ok::<cmd::ModifyQp>(())
    }

    fn query_qp(&mut self, c: CtxId, r: <cmd::QueryQp as Command>::Req) -> Reply {
        let q = self
            .core
            .query_qp(c, handle_of(r.handle))
            .map_err(core_err)?;
        let qpn = self.core.qp_num(c, handle_of(r.handle)).map_err(core_err)?;
        ok::<cmd::QueryQp>(query_resp(&q, qpn))
    }

    fn destroy_qp(&mut self, c: CtxId, r: <cmd::DestroyQp as Command>::Req) -> Reply {
        let n = self
            .core
            .destroy_qp(c, handle_of(r.handle))
            .map_err(core_err)?;
        ok::<cmd::DestroyQp>(events(n))
    }

    fn open_qp(&mut self, c: CtxId, r: <cmd::OpenQp as Command>::Req) -> Reply {
        let t = QpType::from_raw(r.qp_type.get()).ok_or(EINVAL)?;
        let h = self
            .core
            .open_qp(c, handle_of(r.xrcd), r.qp_num.get(), t)
            .map_err(core_err)?;
        ok::<cmd::OpenQp>(CreateQpResp {
            handle: U32::new(h.0),
            qpn: r.qp_num,
            cap: QpCapWire::default(),
        })
    }

    fn create_xrc_rcv_qp(&mut self, c: CtxId, r: <cmd::CreateXrcRcvQp as Command>::Req) -> Reply {
        let qpn = self
            .core
            .create_xrc_rcv_qp(c, handle_of(r.xrcd))
            .map_err(core_err)?;
        ok::<cmd::CreateXrcRcvQp>(QpNumResp { qpn: U32::new(qpn) })
    }

    fn modify_xrc_rcv_qp(&mut self, c: CtxId, r: <cmd::ModifyXrcRcvQp as Command>::Req) -> Reply {
        let attr = qp_attr_from_wire(&r.attr, r.attr_mask.get()).map_err(core_err)?;
        let mask = AttrMask(r.attr_mask.get());
        let (x, qpn) = (handle_of(r.xrcd), r.qp_num.get());
        self.core
            .modify_xrc_rcv_qp(c, x, qpn, &attr, mask)
            .map_err(core_err)?;
        ok::<cmd::ModifyXrcRcvQp>(())
    }

    fn query_xrc_rcv_qp(&mut self, c: CtxId, r: <cmd::QueryXrcRcvQp as Command>::Req) -> Reply {
        let (x, qpn) = (handle_of(r.xrcd), r.qp_num.get());
        let q = self.core.query_xrc_rcv_qp(c, x, qpn).map_err(core_err)?;
        ok::<cmd::QueryXrcRcvQp>(query_resp(&q, qpn))
    }

    fn reg_xrc_rcv_qp(&mut self, c: CtxId, r: <cmd::RegXrcRcvQp as Command>::Req) -> Reply {
        let (x, qpn) = (handle_of(r.xrcd), r.qp_num.get());
        self.core.reg_xrc_rcv_qp(c, x, qpn).map_err(core_err)?;
        ok::<cmd::RegXrcRcvQp>(())
    }

    fn unreg_xrc_rcv_qp(&mut self, c: CtxId, r: <cmd::UnregXrcRcvQp as Command>::Req) -> Reply {
        let (x, qpn) = (handle_of(r.xrcd), r.qp_num.get());
        let n = self.core.unreg_xrc_rcv_qp(c, x, qpn).map_err(core_err)?;
        ok::<cmd::UnregXrcRcvQp>(events(n))
    }

    fn destroy_xrc_rcv_qp(&mut self, c: CtxId, r: <cmd::DestroyXrcRcvQp as Command>::Req) -> Reply {
        let (x, qpn) = (handle_of(r.xrcd), r.qp_num.get());
        let n = self.core.destroy_xrc_rcv_qp(c, x, qpn).map_err(core_err)?;
        ok::<cmd::DestroyXrcRcvQp>(events(n))
    }

    fn register_xrc_rcv_qp(
        &mut self,
        c: CtxId,
        r: <cmd::RegisterXrcRcvQp as Command>::Req,
    ) -> Reply {
        let want = (r.qp_num.get() != CREATE_NEW_QP).then(|| r.qp_num.get());
        let qpn = self
            .core
            .register_xrc_rcv_qp(c, handle_of(r.xrcd), want)
            .map_err(core_err)?;
        ok::<cmd::RegisterXrcRcvQp>(QpNumResp { qpn: U32::new(qpn) })
    }

    fn unregister_xrc_rcv_qp(
        &mut self,
        c: CtxId,
        r: <cmd::UnregisterXrcRcvQp as Command>::Req,
    ) -> Reply {
        let (x, qpn) = (handle_of(r.xrcd), r.qp_num.get());
        let n = self
            .core
            .unregister_xrc_rcv_qp(c, x, qpn)
            .map_err(core_err)?;
        ok::<cmd::UnregisterXrcRcvQp>(events(n))
    }

    // ---- devices ---------------------------------------------------------------------------

    fn query_device(&self, ctx: CtxId) -> Reply {
        let d = self.core.context_device(ctx).map_err(core_err)?;
        let a = &d.attr;
        ok::<cmd::QueryDevice>(QueryDeviceResp {
            fw_ver: name_bytes(&a.fw_ver),
            node_guid: U64::new(a.node_guid),
            sys_image_guid: U64::new(a.sys_image_guid),
            max_mr_size: U64::new(a.max_mr_size),
            page_size_cap: U64::new(a.page_size_cap),
            device_cap_flags: U64::new(a.device_cap_flags),
            vendor_id: U32::new(a.vendor_id),
            vendor_part_id: U32::new(a.vendor_part_id),
            hw_ver: U32::new(a.hw_ver),
            max_qp: U32::new(a.max_qp),
            max_qp_wr: U32::new(a.max_qp_wr),
            max_sge: U32::new(a.max_sge),
            max_sge_rd: U32::new(a.max_sge_rd),
            max_cq: U32::new(a.max_cq),
            max_cqe: U32::new(a.max_cqe),
            max_mr: U32::new(a.max_mr),
            max_pd: U32::new(a.max_pd),
            max_qp_rd_atom: U32::new(a.max_qp_rd_atom),
            max_ee_rd_atom: U32::new(a.max_ee_rd_atom),
            max_res_rd_atom: U32::new(a.max_res_rd_atom),
            max_qp_init_rd_atom: U32::new(a.max_qp_init_rd_atom),
            max_ee_init_rd_atom: U32::new(a.max_ee_init_rd_atom),
            atomic_cap: U32::new(a.atomic_cap),
            max_ah: U32::new(a.max_ah),
            max_srq: U32::new(a.max_srq),
            max_srq_wr: U32::new(a.max_srq_wr),
            max_srq_sge: U32::new(a.max_srq_sge),
            max_inline_data: U32::new(a.max_inline_data),
            num_comp_vectors: U32::new(a.num_comp_vectors),
            max_pkeys: U16::new(a.max_pkeys),
            local_ca_ack_delay: a.local_ca_ack_delay,
            phys_port_cnt: a.phys_port_cnt,
            max_mcast_grp: U32::new(a.max_mcast_grp),
            max_mcast_qp_attach: U32::new(a.max_mcast_qp_attach),
            max_total_mcast_qp_attach: U32::new(a.max_total_mcast_qp_attach),
            max_mw: U32::new(a.max_mw),
        })
    }

    fn port_of(&self, ctx: CtxId, port: U32) -> Result<&softverbs_core::device::PortAttr, i32> {
        let d = self.core.context_device(ctx).map_err(core_err)?;
        u8::try_from(port.get())
            .ok()
            .and_then(|p| d.port(p))
            .ok_or(EINVAL)
    }

    fn query_port(&self, ctx: CtxId, r: QueryPortReq) -> Reply {
        let port = self.port_of(ctx, r.port)?;
        ok::<cmd::QueryPort>(QueryPortResp {
            state: U32::new(port.state as u32),
            max_mtu: U32::new(port.max_mtu as u32),
            active_mtu: U32::new(port.active_mtu as u32),
            gid_tbl_len: U32::new(port.gids.len() as u32),
            max_msg_sz: U32::new(port.max_msg_sz),
            pkey_tbl_len: U16::new(port.pkey_tbl_len),
            link_layer: port.link_layer,
            reserved: 0,
        })
    }

    fn query_gid(&self, ctx: CtxId, r: QueryGidReq) -> Reply {
        let port = self.port_of(ctx, r.port)?;
        let gid = port.gids.get(r.index.get() as usize).ok_or(EINVAL)?;
        ok::<cmd::QueryGid>(QueryGidResp { gid: gid.0 })
    }

    // ---- memory regions --------------------------------------------------------------------

    fn reg_mr(&mut self, ctx: CtxId, r: RegMrReq, fd: Option<OwnedFd>) -> Reply {
        let access = Access(r.access.get());
        let (addr, len) = (r.addr.get(), r.length.get());
        crate::odp::check_registration(&self.dp, ctx, addr, len, access, fd.is_some())?;
        let k = self
            .core
            .reg_mr(ctx, handle_of(r.pd), addr, len, r.iova.get(), access)
            .map_err(core_err)?;
        if let Some(fd) = fd {
            // A shared MR is one more mapping of the daemon's, charged to the context; if it
            // cannot be had, or the memory cannot be reached, the registration is undone.
            if let Err(e) = self.core.set_mr_mapped(ctx, k.handle, true) {
                let _ = self.core.dereg_mr(ctx, k.handle);
                return Err(core_err(e));
            }
            if let Err(e) = self.dp.mr_registered(ctx, k.handle, addr, len, Some(fd)) {
                let _ = self.core.dereg_mr(ctx, k.handle);
                return Err(e);
            }
        }
        ok::<cmd::RegMr>(RegMrResp {
            handle: U32::new(k.handle.0),
            lkey: U32::new(k.lkey),
            rkey: U32::new(k.rkey),
        })
    }

    fn rereg_mr(&mut self, ctx: CtxId, r: ReregMrReq) -> Reply {
        let f = r.flags.get();
        let all = REREG_MR_CHANGE_TRANSLATION | REREG_MR_CHANGE_PD | REREG_MR_CHANGE_ACCESS;
        // uverbs rereg_mr: no flag, or an unknown one, is EINVAL.
        if f == 0 || f & !all != 0 {
            return Err(EINVAL);
        }
        if f & (REREG_MR_CHANGE_TRANSLATION | REREG_MR_CHANGE_ACCESS) != 0 {
            // The range and access the MR will have, judged as reg_mr judges them.
            let (addr, length, access) = self
                .core
                .mr_range(ctx, handle_of(r.handle))
                .map_err(core_err)?;
            let (addr, length) = if f & REREG_MR_CHANGE_TRANSLATION != 0 {
                (r.addr.get(), r.length.get())
            } else {
                (addr, length)
            };
            let access = if f & REREG_MR_CHANGE_ACCESS != 0 {
                Access(r.access.get())
            } else {
                access
            };
            crate::odp::check_registration(&self.dp, ctx, addr, length, access, false)?;
        }
        let k = self
            .core
            .rereg_mr(
                ctx,
                handle_of(r.handle),
                (f & REREG_MR_CHANGE_PD != 0).then(|| handle_of(r.pd)),
                (f & REREG_MR_CHANGE_ACCESS != 0).then(|| Access(r.access.get())),
                (f & REREG_MR_CHANGE_TRANSLATION != 0)
                    .then(|| (r.addr.get(), r.length.get(), r.iova.get())),
            )
            .map_err(core_err)?;
        ok::<cmd::ReregMr>(RegMrResp {
            handle: U32::new(k.handle.0),
            lkey: U32::new(k.lkey),
            rkey: U32::new(k.rkey),
        })
    }

    // ---- CQs and SRQs ----------------------------------------------------------------------

    fn create_cq(&mut self, ctx: CtxId, comp_mask: u64, r: CreateCqReq) -> Reply {
        let channel = (comp_mask & CREATE_CQ_CHANNEL != 0).then(|| r.channel.get());
        if channel.is_some_and(|ch| !self.dp.has_channel(ctx, ch)) {
            return Err(EINVAL);
        }
        let (h, cqe) = self
            .core
            .create_cq(ctx, r.cqe.get(), r.comp_vector.get())
            .map_err(core_err)?;
        if let Some(ch) = channel {
            // The channel is the data path's, not the core's: the CQ reaches the data path
            // first, then learns where its events go.
            self.apply_changes();
            self.dp.set_cq_channel(ctx, h, ch);
        }
        ok::<cmd::CreateCq>(CreateCqResp {
            handle: U32::new(h.0),
            cqe: U32::new(cqe),
        })
    }

    fn resize_cq(&mut self, ctx: CtxId, r: ResizeCqReq, woken: &mut Vec<CtxId>) -> Reply {
        // A CQ cannot shrink below the completions it still holds (rxe and mlx5 answer
        // EINVAL; rdma-core's test_resize_cq checks it). Work posted before this call
        // completes first, as it would have on a NIC by now.
        woken.extend(self.drive());
        if self
            .dp
            .cq_outstanding(ctx, handle_of(r.handle))
            .is_some_and(|n| r.cqe.get() < n)
        {
            return Err(EINVAL);
        }
        let cqe = self
            .core
            .resize_cq(ctx, handle_of(r.handle), r.cqe.get())
            .map_err(core_err)?;
        ok::<cmd::ResizeCq>(CreateCqResp {
            handle: r.handle,
            cqe: U32::new(cqe),
        })
    }

    fn create_srq(&mut self, ctx: CtxId, r: CreateSrqReq) -> Reply {
        let a = SrqAttr {
            max_wr: r.max_wr.get(),
            max_sge: r.max_sge.get(),
            srq_limit: r.srq_limit.get(),
        };
        let c = self
            .core
            .create_srq(ctx, handle_of(r.pd), a)
            .map_err(core_err)?;
        ok::<cmd::CreateSrq>(srq_resp(c.handle, c.attr, c.srqn))
    }

    fn create_xrc_srq(&mut self, ctx: CtxId, r: CreateXrcSrqReq) -> Reply {
        let p = r.present.get();
        let opt = |bit: u32, v: U32| (p & bit != 0).then(|| handle_of(v));
        let a = SrqAttr {
            max_wr: r.max_wr.get(),
            max_sge: r.max_sge.get(),
            srq_limit: r.srq_limit.get(),
        };
        let c = self
            .core
            .create_xrc_srq(
                ctx,
                opt(PRESENT_PD, r.pd),
                opt(PRESENT_XRCD, r.xrcd),
                opt(PRESENT_CQ, r.cq),
                a,
            )
            .map_err(core_err)?;
        ok::<cmd::CreateXrcSrq>(srq_resp(c.handle, c.attr, c.srqn))
    }

    fn modify_srq(&mut self, ctx: CtxId, r: ModifySrqReq) -> Reply {
        let a = SrqAttr {
            max_wr: r.max_wr.get(),
            max_sge: 0,
            srq_limit: r.srq_limit.get(),
        };
        let h = handle_of(r.handle);
        let got = self
            .core
            .modify_srq(ctx, h, a, r.attr_mask.get())
            .map_err(core_err)?;
        ok::<cmd::ModifySrq>(srq_resp(h, got, self.core.srq_num(ctx, h).ok()))
    }

    // ---- XRC domains and QPs ---------------------------------------------------------------

    fn open_xrcd(&mut self, ctx: CtxId, r: OpenXrcdReq, mut fds: Vec<OwnedFd>) -> Reply {
        let file = match (r.has_fd.get(), fds.len()) {
            (0, 0) => None,
            (1, 1) => {
                let fd = fds.pop().expect("one fd");
                let (dev, ino) = softverbs_ipc::file_identity(fd.as_fd()).map_err(|_| EBADF)?;
                // The domain is keyed on the file's identity; the descriptor itself is not
                // kept (uverbs keeps an inode reference instead).
                Some(FileId { dev, ino })
            }
            (1, 0) => return Err(EBADF),
            _ => return Err(EINVAL),
        };
        let o = self
            .core
            .open_xrcd(ctx, file, r.oflags.get())
            .map_err(core_err)?;
        ok::<cmd::OpenXrcd>(OpenXrcdResp {
            handle: U32::new(o.handle.0),
            created: U32::new(u32::from(o.created)),
            xrcd_id: U64::new(o.xrcd.0),
        })
    }

    fn create_qp(&mut self, ctx: CtxId, r: CreateQpReq) -> Reply {
        let qp_type = QpType::from_raw(r.qp_type.get()).ok_or(EINVAL)?;
        let p = r.present.get();
        let opt = |bit: u32, v: U32| (p & bit != 0).then(|| handle_of(v));
        let init = QpInitAttr {
            qp_type,
            pd: opt(PRESENT_PD, r.pd),
            send_cq: opt(PRESENT_SEND_CQ, r.send_cq),
            recv_cq: opt(PRESENT_RECV_CQ, r.recv_cq),
            srq: opt(PRESENT_SRQ, r.srq),
            xrcd: opt(PRESENT_XRCD, r.xrcd),
            cap: (&r.cap).into(),
            sq_sig_all: r.sq_sig_all.get() != 0,
            create_flags: r.create_flags.get(),
        };
        let c = self.core.create_qp(ctx, &init).map_err(core_err)?;
        ok::<cmd::CreateQp>(CreateQpResp {
            handle: U32::new(c.handle.0),
            qpn: U32::new(c.qpn),
            cap: (&c.cap).into(),
        })
    }

    // ---- the data path (ABI 3) -------------------------------------------------------------

    fn destroy_comp_channel(&mut self, c: CtxId, req: &Request<'_>) -> Reply {
        let r = req
            .read::<cmd::DestroyCompChannel>(self.abi)
            .map_err(|e| e.errno())?;
        self.dp.destroy_channel(c, r.handle.get())?;
        self.core.uncharge(c, Resource::Channels, 1);
        self.core.uncharge(c, Resource::Descriptors, 1);
        ok::<cmd::DestroyCompChannel>(())
    }

    fn req_notify_cq(&mut self, c: CtxId, req: &Request<'_>) -> Reply {
        let r = req
            .read::<cmd::ReqNotifyCq>(self.abi)
            .map_err(|e| e.errno())?;
        let solicited_only = r.solicited_only.get() != 0;
        self.dp.req_notify(c, handle_of(r.cq), solicited_only)?;
        let armed = self.dp.cq_armed(c, handle_of(r.cq));
        self.direct
            .recv_cq_armed(&self.core, c, handle_of(r.cq), armed);
        ok::<cmd::ReqNotifyCq>(())
    }

    fn get_cq_event(&mut self, c: CtxId, req: &Request<'_>) -> Reply {
        let r = req
            .read::<cmd::GetCqEvent>(self.abi)
            .map_err(|e| e.errno())?;
        match self.dp.next_cq_event(c, r.handle.get())? {
            Some(cq) => ok::<cmd::GetCqEvent>(CqEventResp { cq: U32::new(cq.0) }),
            None => Err(EAGAIN),
        }
    }

    fn map_doorbell(&mut self, c: CtxId) -> Reply {
        // The first call makes the doorbell: the data path keeps one end and the event loop a
        // copy it watches.
        let n = if self.dp.has_doorbell(c) {
            0
        } else {
            DOORBELL_FDS
        };
        let fd = holding_fds(&mut self.core, c, n, || self.dp.doorbell(c))?;
        with_fds::<cmd::MapDoorbell>((), vec![fd])
    }

    /// The connection manager's commands (crates/daemon/src/cm.rs), on the CM of the
    /// context's device.
    fn cm_command(&mut self, ctx: CtxId, req: &Request<'_>) -> Reply {
        let name = &self.core.context_device(ctx).map_err(core_err)?.name;
        let dev = self
            .core
            .devices()
            .iter()
            .position(|d| &d.name == name)
            .ok_or(EINVAL)?;
        let now = self.dp.now();
        let who = self
            .core
            .context_info(ctx)
            .map(|i| (i.pid, i.uid))
            .map_err(core_err)?;
        // A command that makes a listener or an id is charged first (per-uid shares,
        // docs/guide/limits.md); afterwards the charges follow what the CM holds.
        let makes = match req.cmd {
            Cmd::CmListen => Some(true),
            Cmd::CmConnect | Cmd::CmSidrRequest => Some(false),
            _ => None,
        };
        if let Some(listener) = makes {
            self.dp.cm.precharge(&mut self.core, ctx, listener)?;
        }
        let r = self.cm_run(ctx, dev, now, who, req);
        self.dp.cm.sync_charges(&mut self.core);
        r
    }

    fn cm_run(
        &mut self,
        ctx: CtxId,
        dev: usize,
        now: softverbs_transport::Instant,
        who: (u32, u32),
        req: &Request<'_>,
    ) -> Reply {
        let abi = self.abi;
        macro_rules! read {
            ($c:ident) => {
                req.read::<cmd::$c>(abi).map_err(|e| e.errno())?
            };
        }
        let cm = &mut self.dp.cm;
        match req.cmd {
            Cmd::CmOpen => {
                // The daemon keeps the CM eventfd for the context: one descriptor.
                let fd = holding_fds(&mut self.core, ctx, 1, || cm.open(ctx))?;
                with_fds::<cmd::CmOpen>((), vec![fd])
            }
            Cmd::CmListen => ok::<cmd::CmListen>(cm.listen(ctx, dev, &read!(CmListen), || {
                crate::cm::may_bind_privileged(who.0, who.1)
            })?),
            Cmd::CmConnect => ok::<cmd::CmConnect>(cm.connect(now, ctx, dev, &read!(CmConnect))?),
            Cmd::CmAccept => ok::<cmd::CmAccept>(cm.accept(now, ctx, dev, &read!(CmAccept))?),
            Cmd::CmReject => ok::<cmd::CmReject>(cm.reject(now, ctx, dev, &read!(CmReject))?),
            Cmd::CmEstablish => {
                ok::<cmd::CmEstablish>(cm.establish(now, ctx, dev, &read!(CmEstablish))?)
            }
            Cmd::CmDisconnect => {
                ok::<cmd::CmDisconnect>(cm.disconnect(now, ctx, dev, &read!(CmDisconnect))?)
            }
            Cmd::CmDestroyId => {
                ok::<cmd::CmDestroyId>(cm.destroy(now, ctx, dev, &read!(CmDestroyId))?)
            }
            Cmd::CmGetEvent => ok::<cmd::CmGetEvent>(cm.get_event(ctx)?),
            Cmd::CmSidrRequest => {
                ok::<cmd::CmSidrRequest>(cm.sidr_request(now, ctx, dev, &read!(CmSidrRequest))?)
            }
            Cmd::CmSidrReply => {
                ok::<cmd::CmSidrReply>(cm.sidr_reply(now, ctx, dev, &read!(CmSidrReply))?)
            }
            Cmd::CmCounts => ok::<cmd::CmCounts>(cm.ctx_counts(ctx)),
            Cmd::CmAdopt => {
                let r = read!(CmAdopt);
                let from = cm.holder(dev, &r).ok_or(EINVAL)?;
                // Only between contexts of one process (both alive, so one pid is one
                // process), as rdma_migrate_id moves ids between a process's own channels.
                let pid = |c| self.core.context_info(c).map(|i| (i.pid, i.uid));
                if pid(from).map_err(core_err)? != pid(ctx).map_err(core_err)? {
                    return Err(EPERM);
                }
                ok::<cmd::CmAdopt>(cm.adopt(ctx, from, dev, &r)?)
            }
            _ => Err(EINVAL),
        }
    }

    /// A channel is an eventfd of the daemon's: charged to the context as a channel and as
    /// a descriptor.
    fn create_channel(&mut self, ctx: CtxId) -> Reply {
        self.core
            .charge(ctx, Resource::Channels, 1)
            .map_err(core_err)?;
        let made = holding_fds(&mut self.core, ctx, 1, || {
            self.dp.create_channel(ctx).map_err(|_| ENOMEM)
        });
        match made {
            Ok((h, fd)) => with_fds::<cmd::CreateCompChannel>(handle_resp(Handle(h)), vec![fd]),
            Err(e) => {
                self.core.uncharge(ctx, Resource::Channels, 1);
                Err(e)
            }
        }
    }

    fn map_queues(&mut self, ctx: CtxId, req: &Request<'_>) -> Reply {
        let r = req
            .read::<cmd::MapQueues>(self.abi)
            .map_err(|e| e.errno())?;
        let h = handle_of(r.handle);
        let fed = self.direct.takes_srqs(ctx);
        let (core, dp) = (&mut self.core, &mut self.dp);
        let qp = match r.kind.get() {
            QUEUES_QP => Some(core.owned_qp_info(ctx, h).ok_or(EINVAL)?),
            QUEUES_SRQ => core.srq_info(ctx, h).map(|_| None).ok_or(EINVAL)?,
            QUEUES_CQ => core.cq_attr(ctx, h).map(|_| None).map_err(core_err)?,
            QUEUES_READY if self.abi >= 6 && h.0 == 0 => None,
            _ => return Err(EINVAL),
        };
        // The ring is charged to the context (ring bytes, one mapping) before the data path
        // keeps it; over a limit the client gets ENOMEM.
        // A fed SRQ's region also stays open in the daemon for its direct peers: one
        // descriptor, charged first and given back unless the SRQ became fed.
        let new_fed = r.kind.get() == QUEUES_SRQ && fed && !dp.is_fed_srq(ctx, h);
        if new_fed {
            charge_fds(core, ctx, 1)?;
        }
        let admit = |ring: Ring| move |len: u64| core.attach_ring(ctx, ring, len).map_err(core_err);
        let mapped = match (r.kind.get(), qp) {
            (QUEUES_QP, Some(i)) => dp.map_qp(&i, ctx, h, admit(Ring::Qp(h))),
            (QUEUES_SRQ, _) => dp.map_srq(ctx, h, fed, admit(Ring::Srq(h))),
            (QUEUES_READY, _) => dp.map_ready(ctx, admit(Ring::Ready)),
            _ => dp.map_cq(ctx, h, admit(Ring::Cq(h))),
        };
        if new_fed && !(mapped.is_ok() && dp.is_fed_srq(ctx, h)) {
            self.core.uncharge(ctx, Resource::Descriptors, 1);
        }
        let (resp, fd) = mapped?;
        with_fds::<cmd::MapQueues>(resp, vec![fd])
    }

    fn post_send(&mut self, ctx: CtxId, req: &Request<'_>) -> Reply {
        let r = req.read::<cmd::PostSend>(self.abi).map_err(|e| e.errno())?;
        let qpn = self.core.qp_num(ctx, handle_of(r.qp)).map_err(core_err)?;
        let wr = crate::datapath::send_wr_from_wire(&self.core, ctx, handle_of(r.qp), &r.wr)?;
        self.dp.post_send(qpn, wr)?;
        ok::<cmd::PostSend>(())
    }

    fn post_recv(&mut self, ctx: CtxId, req: &Request<'_>) -> Reply {
        // PostRecv and PostSrqRecv share their request struct.
        let r: PostRecvReq = req.body(self.abi).map_err(|e| e.errno())?;
        let wr = crate::datapath::recv_wr_from_wire(&r)?;
        if req.cmd == Cmd::PostRecv {
            let qpn = self
                .core
                .qp_num(ctx, handle_of(r.handle))
                .map_err(core_err)?;
            self.dp.post_recv(qpn, wr)?;
        } else {
            self.core
                .query_srq(ctx, handle_of(r.handle))
                .map_err(core_err)?;
            self.dp.post_srq_recv(ctx, handle_of(r.handle), wr)?;
        }
        ok::<cmd::PostRecv>(())
    }

    fn poll_cq(&mut self, ctx: CtxId, req: &Request<'_>) -> Reply {
        let r = req.read::<cmd::PollCq>(self.abi).map_err(|e| e.errno())?;
        self.core.cq_attr(ctx, handle_of(r.cq)).map_err(core_err)?;
        let max = (r.max.get() as usize).min(MAX_WIRE_WC);
        let got = self.dp.poll_cq(ctx, handle_of(r.cq), max);
        let mut resp = PollCqResp {
            count: U32::new(got.len() as u32),
            ..Default::default()
        };
        for (slot, wc) in resp.wc.iter_mut().zip(&got) {
            *slot = WcWire::from(wc);
        }
        ok::<cmd::PollCq>(resp)
    }

    // ---- connection-level commands ---------------------------------------------------------

    fn hello(
        &mut self,
        s: &mut Session,
        r: HelloReq,
        comp_mask: u64,
        mut fds: Vec<OwnedFd>,
    ) -> Reply {
        if r.abi_version.get() < MIN_ABI_VERSION {
            return Err(EPROTONOSUPPORT);
        }
        let with_mem = comp_mask & HELLO_MEM_FD != 0;
        let with_maps = comp_mask & HELLO_MAPS_FD != 0;
        if fds.len() != usize::from(with_mem) + usize::from(with_maps)
            || (with_maps && !with_mem)
            || (with_mem && r.device.get() == NO_DEVICE)
        {
            return Err(EINVAL);
        }
        let resp = |ctx_id: u64, n: usize| HelloResp {
            abi_version: U32::new(self.abi),
            num_devices: U32::new(n as u32),
            ctx_id: U64::new(ctx_id),
            daemon_pid: U32::new(std::process::id()),
            reserved: U32::new(0),
        };
        let n = self.core.devices().len();
        if r.device.get() == NO_DEVICE {
            s.phase = Phase::Introspect;
            return ok::<cmd::Hello>(resp(0, n));
        }
        let opener = s.sender();
        let maps = if with_maps { fds.pop() } else { None };
        let refuse = |e: softverbs_memaccess::MemFdError| {
            tracing::info!(pid = opener, "context refused: {e}");
            e.errno()
        };
        let memory = match fds.pop() {
            Some(fd) => {
                let m = ProcessMemory::accept(fd, opener).map_err(refuse)?;
                Some(match maps {
                    Some(maps) => m.with_maps(maps).map_err(refuse)?,
                    None => m,
                })
            }
            None => None,
        };
        // The eventfd first: a context must not exist unless the session records it.
        let efd = softverbs_ipc::new_eventfd().map_err(|_| ENOMEM)?;
        let client_end = efd.try_clone().map_err(|_| ENOMEM)?;
        let info = ContextInfo {
            pid: s.cred.pid,
            uid: s.cred.uid,
            comm: s.comm.clone(),
        };
        // Besides its socket (charged to the uid at accept) a context costs the daemon the
        // async eventfd and the opener's `mem` and `maps` descriptors.
        let held = 1 + u64::from(with_mem) + u64::from(with_maps);
        let ctx = self
            .core
            .open_context_holding(r.device.get() as usize, info, held)
            .map_err(core_err)?;
        s.eventfd = Some(efd);
        s.phase = Phase::Context(ctx);
        s.opener_pid = Some(opener);
        // The memory descriptor is the daemon's, not the core's: the data path gets it here.
        self.dp.context_opened(ctx, memory);
        with_fds::<cmd::Hello>(resp(ctx.0, n), vec![client_end])
    }

    fn device_list(&self, r: QueryDeviceListReq) -> Reply {
        let d = self
            .core
            .devices()
            .get(r.index.get() as usize)
            .ok_or(EINVAL)?;
        ok::<cmd::QueryDeviceList>(QueryDeviceListResp {
            name: name_bytes(&d.name),
            node_guid: U64::new(d.attr.node_guid),
        })
    }

    fn status(&self) -> Reply {
        let n = self.core.counts();
        let dp = self.dp.round_stats();
        let drops = self.dp.drop_stats();
        ok::<cmd::Status>(StatusResp {
            daemon_pid: U32::new(std::process::id()),
            abi_version: U32::new(self.abi),
            uptime_ms: U64::new(self.started.elapsed().as_millis() as u64),
            devices: U32::new(self.core.devices().len() as u32),
            contexts: U32::new(n.contexts as u32),
            xrcds: U32::new(n.xrcds as u32),
            xrc_recv_qps: U32::new(n.xrc_recv_qps as u32),
            qps: U32::new(n.qp_handles as u32),
            srqs: U32::new(n.srqs as u32),
            cqs: U32::new(n.cqs as u32),
            mrs: U32::new(n.mrs as u32),
            dp_rounds: U64::new(dp.rounds),
            dp_qp_visits: U64::new(dp.qp_visits),
            dp_max_qp_visits: U32::new(dp.max_qp_visits),
            dp_queued_qps: U32::new(dp.queued_qps),
            net_foreign_source: U64::new(drops.foreign_source),
            net_outside_window: U64::new(drops.outside_window),
        })
    }

    fn resources(&self) -> Reply {
        let mut r = self.core.resources();
        r.daemon_version = Some(self.version.clone());
        for (i, d) in r.devices.iter_mut().enumerate() {
            for g in &mut d.mcast_groups {
                g.net_joined = self
                    .dp
                    .mcast_net_joined(i, softverbs_core::device::Gid::from_ip(g.group));
            }
        }
        for q in &mut r.qps {
            self.fill_qp_row(q);
        }
        let counters = self.counters_json(&r);
        let mut value = serde_json::to_value(r).map_err(|_| ENOMEM)?;
        let cm = self.dp.cm.counts();
        if let Some(map) = value.as_object_mut() {
            // One schema for every `--json` of the CLI (`status`, `devices`, `resources`,
            // `stat`): bumped when a key changes meaning or goes away.
            map.insert("schema".into(), serde_json::json!(1));
            // Port and QP counters (docs/guide/counters.md), for `softverbs stat`.
            map.insert("counters".into(), counters);
            // The connection manager's state (docs/design/cm.md §4): zero after every CM client is
            // gone and time-wait has passed.
            map.insert(
                "cm".into(),
                serde_json::json!({
                    "listeners": cm.listeners,
                    "connections": cm.connections,
                    "time_wait": cm.time_wait,
                    "owned": cm.owned,
                    // REQs and SIDR_REQs dropped over their source's rate (issue 35 item 4).
                    "rate_dropped": cm.rate_dropped,
                }),
            );
            // RoCE packets (MADs included) that came from the network with one of this
            // daemon's own addresses as their source, dropped (docs/design/security.md, "CM").
            map.insert(
                "own_source_drops".into(),
                serde_json::json!(self.dp.own_source_drops),
            );
            // Which QP pairs run on the same-host direct path (docs/design/direct-path.md).
            map.insert("direct_pairs".into(), self.direct.pairs_json());
            // Where the devices are on the network, or why nowhere (an autostarted daemon
            // that found every address it tried taken: docs/guide/multi-user.md).
            map.insert("network".into(), self.network.clone().into());
            // Where each device socket reads what it receives: "raw" sees the IPv4 header
            // and checks every ICRC exactly, "udp" cannot (docs/design/roce-wire.md §6).
            let receive: Vec<serde_json::Value> = self
                .dp
                .rx_modes()
                .into_iter()
                .map(|(d, addr, mode)| {
                    serde_json::json!({
                        "device": self.core.devices().get(d).map(|d| d.name.as_str()),
                        "addr": addr.to_string(),
                        "mode": mode,
                    })
                })
                .collect();
            map.insert("receive".into(), receive.into());
        }
        let json = serde_json::to_vec(&value).map_err(|_| ENOMEM)?;
        let fd = softverbs_ipc::memfd_with("softverbs-resources", &json).map_err(|_| ENOMEM)?;
        let len = U64::new(json.len() as u64);
        with_fds::<cmd::Resources>(BlobResp { len }, vec![fd])
    }

    /// Which path carries QP `q`, its peer and its PSNs (`softverbs resources`).
    fn fill_qp_row(&self, q: &mut softverbs_core::resources::QpRow) {
        use crate::datapath::counters::Carrier;
        let carrier = if self.direct.is_direct(q.qpn) {
            Carrier::Direct
        } else if self.dp.on_net_path(q.qpn) {
            Carrier::Net
        } else {
            Carrier::Daemon
        };
        q.path = Some(carrier.name().into());
        let connected = !matches!(
            q.state,
            softverbs_core::types::QpState::Reset | softverbs_core::types::QpState::Init
        ) && q.qp_type != softverbs_core::types::QpType::Ud;
        let Some((w, psns_known)) = self.dp.qp_wire(q.qpn) else {
            return;
        };
        if connected {
            q.remote_qpn = Some(w.dest_qpn);
            q.remote_addr = Some(w.dgid.to_ip());
        }
        if connected && psns_known && carrier == Carrier::Daemon {
            q.sq_psn = Some(w.sq_psn);
            q.rq_psn = Some(w.rq_psn);
        } else if carrier == Carrier::Net {
            q.rq_psn = self.dp.net_published_epsn(q.qpn);
        }
    }

    /// The `counters` object of `resources`: per port and per QP, every counter by its
    /// name (`softverbs_transport::Counters::NAMES`), flat.
    fn counters_json(&self, r: &softverbs_core::resources::Resources) -> serde_json::Value {
        let devices = self.core.devices();
        let flat = |base: serde_json::Value, c: &softverbs_transport::Counters| {
            let mut v = base;
            if let Some(m) = v.as_object_mut() {
                for (k, n) in c.fields() {
                    m.insert(k.into(), serde_json::json!(n));
                }
            }
            v
        };
        let ports: Vec<serde_json::Value> = self
            .dp
            .port_counters()
            .iter()
            .map(|p| {
                let mut c = p.counters;
                c.add(&self.direct.port_counters(p.device));
                let mut v = flat(
                    serde_json::json!({
                        "device": devices.get(p.device).map(|d| d.name.as_str()),
                        "port": 1,
                    }),
                    &c,
                );
                if let Some(m) = v.as_object_mut() {
                    m.insert("rx_icrc_errors".into(), serde_json::json!(p.icrc_errors));
                    m.insert(
                        "rx_icrc_id_unseen".into(),
                        serde_json::json!(p.icrc_id_unseen),
                    );
                    m.insert("rx_icrc_solved".into(), serde_json::json!(p.icrc_solved));
                    // Received packets dropped, by reason (docs/guide/counters.md,
                    // "Rejected packets"): `rx_drop_bad_icrc` counts what `rx_icrc_errors`
                    // does, under the taxonomy's name.
                    for (k, n) in p.rejects.fields() {
                        m.insert(k.into(), serde_json::json!(n));
                    }
                }
                v
            })
            .collect();
        let qpns = r.qps.iter().map(|q| (q.qpn, q.path.clone())).chain(
            r.xrc_recv_qps
                .iter()
                .map(|t| (t.qpn, Some("daemon".into()))),
        );
        let qps: Vec<serde_json::Value> = qpns
            .filter_map(|(qpn, path)| {
                let (d, mut c) = self.dp.qp_counters(qpn)?;
                if path.as_deref() == Some("direct") {
                    c = self.direct.qp_counters(qpn).unwrap_or_default();
                }
                Some(flat(
                    serde_json::json!({
                        "qpn": qpn,
                        "device": devices.get(d).map(|d| d.name.as_str()),
                        "port": 1,
                        "path": path,
                    }),
                    &c,
                ))
            })
            .collect();
        serde_json::json!({ "ports": ports, "qps": qps })
    }

    fn inject(&mut self, s: &Session, r: InjectEventReq, woken: &mut Vec<CtxId>) -> Reply {
        let t = EventType::from_raw(r.event_type.get()).ok_or(EINVAL)?;
        // Root and the daemon's uid inject anything. Another user (of a system daemon that
        // serves every user) injects only QP events that reach none but its own contexts
        // (its QP, or a receive QP all of whose holders are its own): a forged event must
        // never reach another user's program (docs/design/security.md).
        if s.cred.uid != 0 && s.cred.uid != self.daemon_uid {
            let targets = if t.is_qp_affiliated() {
                self.core.qp_event_contexts(r.qpn.get())
            } else {
                Vec::new()
            };
            let own = |c: &CtxId| {
                self.core
                    .context_info(*c)
                    .is_ok_and(|i| i.uid == s.cred.uid)
            };
            if targets.is_empty() || !targets.iter().all(own) {
                return Err(EPERM);
            }
        }
        if t.is_port_affiliated() {
            // IBA 11.6.3: a port event goes to every context of the device, naming the port.
            let dev = r.device.get() as usize;
            let ports = self.core.devices().get(dev).map_or(0, |d| d.ports.len());
            let port = r.port.get();
            if port == 0 || port as usize > ports {
                return Err(EINVAL);
            }
            let got = self.core.raise_device_event(
                dev,
                softverbs_core::event::EventElement::Port(port as u8),
                t,
            );
            let n = got.len() as u32;
            woken.extend(got);
            return ok::<cmd::InjectEvent>(InjectEventResp {
                contexts: U32::new(n),
            });
        }
        if !t.is_qp_affiliated() {
            return Err(EINVAL);
        }
        let got = self.core.raise_qp_event(r.qpn.get(), t);
        if got.is_empty() && self.core.qp_target(r.qpn.get()).is_none() {
            return Err(EINVAL);
        }
        let n = got.len() as u32;
        woken.extend(got);
        ok::<cmd::InjectEvent>(InjectEventResp {
            contexts: U32::new(n),
        })
    }
}

/// `reg_mr`, and `rereg_mr` with a new translation, tell the daemon where in the client's
/// address space memory is; the context's memory descriptor is the opener's address space, so
/// a process that inherited or was handed the connection (a fork child) must not get memory of
/// the opener registered in its name: `EPERM`, it opens its own context instead. (Equal
/// numbers from two processes mean the opener is dead and reaped, and its descriptor reaches
/// nothing.)
fn opener_only(s: &Session) -> Result<(), i32> {
    if s.opener_pid == Some(s.sender()) {
        Ok(())
    } else {
        Err(EPERM)
    }
}

/// Commands that destroy, deregister, detach or move an object that work requests already
/// posted to a ring may use (an AH, MR, MW, QP, CQ, SRQ, PD, XRC domain or receive QP, a
/// multicast attachment, a completion channel): the daemon runs the rings before them.
fn takes_away(c: Cmd) -> bool {
    matches!(
        c,
        Cmd::DeallocPd
            | Cmd::ReregMr
            | Cmd::DeregMr
            | Cmd::DeallocMw
            | Cmd::ResizeCq
            | Cmd::DestroyCq
            | Cmd::DestroySrq
            | Cmd::DestroyAh
            | Cmd::CloseXrcd
            | Cmd::ModifyQp
            | Cmd::DestroyQp
            | Cmd::UnregXrcRcvQp
            | Cmd::DestroyXrcRcvQp
            | Cmd::UnregisterXrcRcvQp
            | Cmd::DestroyCompChannel
            | Cmd::DetachMcast
    )
}
