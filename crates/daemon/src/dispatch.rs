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
use softverbs_abi::MIN_ABI_VERSION;
use softverbs_core::attr::{AhAttr, QpAttr, QpInitAttr, SrqAttr};
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

const EINVAL: i32 = 22;
const EOPNOTSUPP: i32 = 95;
const EAGAIN: i32 = 11;
const EBADF: i32 = 9;
const EPERM: i32 = 1;
const EPROTONOSUPPORT: i32 = 93;
const ENOMEM: i32 = 12;

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
    started: Instant,
    daemon_uid: u32,
}

type Reply = Result<(Vec<u8>, Vec<OwnedFd>), i32>;

fn ok<T: IntoBytes + zerocopy::Immutable>(v: T) -> Reply {
    Ok((v.as_bytes().to_vec(), Vec::new()))
}

fn empty() -> Reply {
    Ok((Vec::new(), Vec::new()))
}

fn core_err(e: Error) -> i32 {
    e.errno()
}

fn handle_of(v: U32) -> Handle {
    Handle(v.get())
}

fn events(n: u32) -> Reply {
    ok(EventsResp {
        events_reported: U32::new(n),
    })
}

fn query_resp(q: &QpQuery, qpn: u32) -> Reply {
    ok(QueryQpResp {
        attr: (&q.attr).into(),
        qp_type: U32::new(q.init.qp_type as u32),
        sq_sig_all: U32::new(u32::from(q.init.sq_sig_all)),
        create_flags: U32::new(q.init.create_flags),
        qpn: U32::new(qpn),
        init_cap: (&q.init.cap).into(),
    })
}

fn srq_resp(handle: Handle, a: SrqAttr, srqn: Option<u32>) -> Reply {
    ok(SrqResp {
        handle: U32::new(handle.0),
        max_wr: U32::new(a.max_wr),
        max_sge: U32::new(a.max_sge),
        srq_limit: U32::new(a.srq_limit),
        srqn: U32::new(srqn.unwrap_or(0)),
    })
}

impl Dispatcher {
    /// A dispatcher over `core`, speaking ABI `abi`.
    pub fn new(core: Core, abi: u32, net: &NetOptions) -> Dispatcher {
        let dp = DataPath::new(&core, net);
        Dispatcher {
            core,
            dp,
            abi,
            started: Instant::now(),
            daemon_uid: rustix::process::geteuid().as_raw(),
        }
    }

    /// Handles one request datagram with the descriptors that came with it. Descriptors the
    /// command does not take are closed (dropped) here.
    pub fn handle(&mut self, session: &mut Session, msg: &[u8], fds: Vec<OwnedFd>) -> Outcome {
        let mut woken = Vec::new();
        let result = match decode_request(msg) {
            Err(e) => Err(e.errno()),
            Ok(req) => self.command(session, &req, fds, &mut woken),
        };
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
        if !matches!(req.cmd, Cmd::Hello | Cmd::OpenXrcd | Cmd::RegMr) && !fds.is_empty() {
            return Err(EINVAL);
        }
        if matches!(
            req.cmd,
            Cmd::PostSend
                | Cmd::PostRecv
                | Cmd::PostSrqRecv
                | Cmd::PollCq
                | Cmd::CreateCompChannel
                | Cmd::DestroyCompChannel
                | Cmd::ReqNotifyCq
                | Cmd::GetCqEvent
                | Cmd::MapQueues
                | Cmd::MapDoorbell
        ) && abi < 3
        {
            // The data-path commands arrived in ABI 3.
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
        match (req.cmd, s.phase) {
            (Cmd::Hello, Phase::New) => {
                let body = req.body(abi).map_err(|e| e.errno())?;
                return self.hello(s, body, req.comp_mask, fds);
            }
            (Cmd::Hello, _) => return Err(EINVAL),
            (_, Phase::New) => return Err(EINVAL),
            (Cmd::QueryDeviceList, _) => {
                return self.device_list(req.body(abi).map_err(|e| e.errno())?)
            }
            (Cmd::Status, _) => return self.status(),
            (Cmd::Resources, _) => return self.resources(),
            (Cmd::InjectEvent, _) => {
                let r: InjectEventReq = req.body(abi).map_err(|e| e.errno())?;
                return self.inject(s, r, woken);
            }
            (_, Phase::Introspect) => return Err(EINVAL),
            (_, Phase::Context(_)) => {}
        }
        let ctx = s.ctx().expect("phase checked above");
        if registers_memory(req) && s.opener_pid != Some(s.sender()) {
            // The context's memory descriptor is the opener's address space: a process that
            // inherited or was handed the connection (a fork child) must not get memory of
            // the opener registered in its name. It opens its own context instead.
            // (Equal numbers from two processes mean the opener is dead and reaped, and its
            // descriptor reaches nothing.)
            return Err(EPERM);
        }
        if let Some(r) = self.data_command(ctx, req, woken) {
            return r;
        }
        let gone = self.qpn_before(ctx, req);
        let result = self.object_command(ctx, req, fds, woken);
        if let Ok((body, _)) = &result {
            self.mirror(ctx, req, body, gone, mr_fd)?;
        }
        result
    }

    fn object_command(
        &mut self,
        ctx: CtxId,
        req: &Request<'_>,
        mut fds: Vec<OwnedFd>,
        woken: &mut Vec<CtxId>,
    ) -> Reply {
        let abi = self.abi;
        let core = &mut self.core;
        macro_rules! body {
            () => {
                req.body(abi).map_err(|e| e.errno())?
            };
        }
        match req.cmd {
            Cmd::QueryDevice => {
                let d = core.context_device(ctx).map_err(core_err)?;
                let a = &d.attr;
                ok(QueryDeviceResp {
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
                })
            }
            Cmd::QueryPort => {
                let r: QueryPortReq = body!();
                let d = core.context_device(ctx).map_err(core_err)?;
                let port = u8::try_from(r.port.get())
                    .ok()
                    .and_then(|p| d.port(p))
                    .ok_or(EINVAL)?;
                ok(QueryPortResp {
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
            Cmd::QueryGid => {
                let r: QueryGidReq = body!();
                let d = core.context_device(ctx).map_err(core_err)?;
                let port = u8::try_from(r.port.get())
                    .ok()
                    .and_then(|p| d.port(p))
                    .ok_or(EINVAL)?;
                let gid = port.gids.get(r.index.get() as usize).ok_or(EINVAL)?;
                ok(QueryGidResp { gid: gid.0 })
            }
            Cmd::AllocPd => {
                let h = core.alloc_pd(ctx).map_err(core_err)?;
                ok(HandleResp {
                    handle: U32::new(h.0),
                })
            }
            Cmd::DeallocPd => {
                let r: HandleReq = body!();
                core.dealloc_pd(ctx, handle_of(r.handle))
                    .map_err(core_err)?;
                empty()
            }
            Cmd::RegMr => {
                let r: RegMrReq = body!();
                let k = core
                    .reg_mr(
                        ctx,
                        handle_of(r.pd),
                        r.addr.get(),
                        r.length.get(),
                        r.iova.get(),
                        Access(r.access.get()),
                    )
                    .map_err(core_err)?;
                ok(RegMrResp {
                    handle: U32::new(k.handle.0),
                    lkey: U32::new(k.lkey),
                    rkey: U32::new(k.rkey),
                })
            }
            Cmd::DeregMr => {
                let r: HandleReq = body!();
                core.dereg_mr(ctx, handle_of(r.handle)).map_err(core_err)?;
                empty()
            }
            Cmd::ReregMr => {
                let r: ReregMrReq = body!();
                let f = r.flags.get();
                let all = REREG_MR_CHANGE_TRANSLATION | REREG_MR_CHANGE_PD | REREG_MR_CHANGE_ACCESS;
                // uverbs rereg_mr: no flag, or an unknown one, is EINVAL.
                if f == 0 || f & !all != 0 {
                    return Err(EINVAL);
                }
                let k = core
                    .rereg_mr(
                        ctx,
                        handle_of(r.handle),
                        (f & REREG_MR_CHANGE_PD != 0).then(|| handle_of(r.pd)),
                        (f & REREG_MR_CHANGE_ACCESS != 0).then(|| Access(r.access.get())),
                        (f & REREG_MR_CHANGE_TRANSLATION != 0)
                            .then(|| (r.addr.get(), r.length.get(), r.iova.get())),
                    )
                    .map_err(core_err)?;
                ok(RegMrResp {
                    handle: U32::new(k.handle.0),
                    lkey: U32::new(k.lkey),
                    rkey: U32::new(k.rkey),
                })
            }
            Cmd::CreateCq => {
                let r: CreateCqReq = body!();
                if req.comp_mask & CREATE_CQ_CHANNEL != 0
                    && !self.dp.has_channel(ctx, r.channel.get())
                {
                    return Err(EINVAL);
                }
                let (h, cqe) = core
                    .create_cq(ctx, r.cqe.get(), r.comp_vector.get())
                    .map_err(core_err)?;
                ok(CreateCqResp {
                    handle: U32::new(h.0),
                    cqe: U32::new(cqe),
                })
            }
            Cmd::ResizeCq => {
                let r: ResizeCqReq = body!();
                // A CQ cannot shrink below the completions it still holds (rxe and mlx5
                // answer EINVAL; rdma-core's test_resize_cq checks it). Work posted before
                // this call completes first, as it would have on a NIC by now.
                woken.extend(self.dp.drive(core));
                if self
                    .dp
                    .cq_outstanding(ctx, handle_of(r.handle))
                    .is_some_and(|n| r.cqe.get() < n)
                {
                    return Err(EINVAL);
                }
                let cqe = core
                    .resize_cq(ctx, handle_of(r.handle), r.cqe.get())
                    .map_err(core_err)?;
                ok(CreateCqResp {
                    handle: r.handle,
                    cqe: U32::new(cqe),
                })
            }
            Cmd::DestroyCq => {
                let r: HandleReq = body!();
                events(
                    core.destroy_cq(ctx, handle_of(r.handle))
                        .map_err(core_err)?,
                )
            }
            Cmd::CreateSrq => {
                let r: CreateSrqReq = body!();
                let a = SrqAttr {
                    max_wr: r.max_wr.get(),
                    max_sge: r.max_sge.get(),
                    srq_limit: r.srq_limit.get(),
                };
                let c = core.create_srq(ctx, handle_of(r.pd), a).map_err(core_err)?;
                srq_resp(c.handle, c.attr, c.srqn)
            }
            Cmd::CreateXrcSrq => {
                let r: CreateXrcSrqReq = body!();
                let p = r.present.get();
                let opt = |bit: u32, v: U32| (p & bit != 0).then(|| handle_of(v));
                let a = SrqAttr {
                    max_wr: r.max_wr.get(),
                    max_sge: r.max_sge.get(),
                    srq_limit: r.srq_limit.get(),
                };
                let c = core
                    .create_xrc_srq(
                        ctx,
                        opt(PRESENT_PD, r.pd),
                        opt(PRESENT_XRCD, r.xrcd),
                        opt(PRESENT_CQ, r.cq),
                        a,
                    )
                    .map_err(core_err)?;
                srq_resp(c.handle, c.attr, c.srqn)
            }
            Cmd::ModifySrq => {
                let r: ModifySrqReq = body!();
                let a = SrqAttr {
                    max_wr: r.max_wr.get(),
                    max_sge: 0,
                    srq_limit: r.srq_limit.get(),
                };
                let got = core
                    .modify_srq(ctx, handle_of(r.handle), a, r.attr_mask.get())
                    .map_err(core_err)?;
                srq_resp(
                    handle_of(r.handle),
                    got,
                    core.srq_num(ctx, handle_of(r.handle)).ok(),
                )
            }
            Cmd::QuerySrq => {
                let r: HandleReq = body!();
                let a = core.query_srq(ctx, handle_of(r.handle)).map_err(core_err)?;
                srq_resp(
                    handle_of(r.handle),
                    a,
                    core.srq_num(ctx, handle_of(r.handle)).ok(),
                )
            }
            Cmd::DestroySrq => {
                let r: HandleReq = body!();
                events(
                    core.destroy_srq(ctx, handle_of(r.handle))
                        .map_err(core_err)?,
                )
            }
            Cmd::GetSrqNum => {
                let r: HandleReq = body!();
                ok(SrqNumResp {
                    srqn: U32::new(core.srq_num(ctx, handle_of(r.handle)).map_err(core_err)?),
                })
            }
            Cmd::CreateAh => {
                let r: CreateAhReq = body!();
                let h = core
                    .create_ah(ctx, handle_of(r.pd), AhAttr::from(&r.attr))
                    .map_err(core_err)?;
                ok(HandleResp {
                    handle: U32::new(h.0),
                })
            }
            Cmd::DestroyAh => {
                let r: HandleReq = body!();
                core.destroy_ah(ctx, handle_of(r.handle))
                    .map_err(core_err)?;
                empty()
            }
            Cmd::OpenXrcd => {
                let r: OpenXrcdReq = body!();
                let file = match (r.has_fd.get(), fds.len()) {
                    (0, 0) => None,
                    (1, 1) => {
                        let fd = fds.pop().expect("one fd");
                        let (dev, ino) =
                            softverbs_ipc::file_identity(fd.as_fd()).map_err(|_| EBADF)?;
                        // The domain is keyed on the file's identity; the descriptor itself is
                        // not kept (uverbs keeps an inode reference instead).
                        Some(FileId { dev, ino })
                    }
                    (1, 0) => return Err(EBADF),
                    _ => return Err(EINVAL),
                };
                let o = core
                    .open_xrcd(ctx, file, r.oflags.get())
                    .map_err(core_err)?;
                ok(OpenXrcdResp {
                    handle: U32::new(o.handle.0),
                    created: U32::new(u32::from(o.created)),
                    xrcd_id: U64::new(o.xrcd.0),
                })
            }
            Cmd::CloseXrcd => {
                let r: HandleReq = body!();
                core.close_xrcd(ctx, handle_of(r.handle))
                    .map_err(core_err)?;
                empty()
            }
            Cmd::CreateQp => {
                let r: CreateQpReq = body!();
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
                let c = core.create_qp(ctx, &init).map_err(core_err)?;
                ok(CreateQpResp {
                    handle: U32::new(c.handle.0),
                    qpn: U32::new(c.qpn),
                    cap: (&c.cap).into(),
                })
            }
            Cmd::ModifyQp => {
                let r: ModifyQpReq = body!();
                let attr = qp_attr_from_wire(&r.attr, r.attr_mask.get()).map_err(core_err)?;
                core.modify_qp(ctx, handle_of(r.handle), &attr, AttrMask(r.attr_mask.get()))
                    .map_err(core_err)?;
                empty()
            }
            Cmd::QueryQp => {
                let r: HandleReq = body!();
                let q = core.query_qp(ctx, handle_of(r.handle)).map_err(core_err)?;
                query_resp(&q, core.qp_num(ctx, handle_of(r.handle)).map_err(core_err)?)
            }
            Cmd::DestroyQp => {
                let r: HandleReq = body!();
                events(
                    core.destroy_qp(ctx, handle_of(r.handle))
                        .map_err(core_err)?,
                )
            }
            Cmd::OpenQp => {
                let r: OpenQpReq = body!();
                let t = QpType::from_raw(r.qp_type.get()).ok_or(EINVAL)?;
                let h = core
                    .open_qp(ctx, handle_of(r.xrcd), r.qp_num.get(), t)
                    .map_err(core_err)?;
                ok(CreateQpResp {
                    handle: U32::new(h.0),
                    qpn: r.qp_num,
                    cap: QpCapWire::default(),
                })
            }
            Cmd::CreateXrcRcvQp => {
                let r: XrcdReq = body!();
                ok(QpNumResp {
                    qpn: U32::new(
                        core.create_xrc_rcv_qp(ctx, handle_of(r.xrcd))
                            .map_err(core_err)?,
                    ),
                })
            }
            Cmd::ModifyXrcRcvQp => {
                let r: ModifyXrcRcvQpReq = body!();
                let attr: QpAttr =
                    qp_attr_from_wire(&r.attr, r.attr_mask.get()).map_err(core_err)?;
                core.modify_xrc_rcv_qp(
                    ctx,
                    handle_of(r.xrcd),
                    r.qp_num.get(),
                    &attr,
                    AttrMask(r.attr_mask.get()),
                )
                .map_err(core_err)?;
                empty()
            }
            Cmd::QueryXrcRcvQp => {
                let r: XrcRcvQpReq = body!();
                let q = core
                    .query_xrc_rcv_qp(ctx, handle_of(r.xrcd), r.qp_num.get())
                    .map_err(core_err)?;
                query_resp(&q, r.qp_num.get())
            }
            Cmd::RegXrcRcvQp => {
                let r: XrcRcvQpReq = body!();
                core.reg_xrc_rcv_qp(ctx, handle_of(r.xrcd), r.qp_num.get())
                    .map_err(core_err)?;
                empty()
            }
            Cmd::UnregXrcRcvQp => {
                let r: XrcRcvQpReq = body!();
                events(
                    core.unreg_xrc_rcv_qp(ctx, handle_of(r.xrcd), r.qp_num.get())
                        .map_err(core_err)?,
                )
            }
            Cmd::DestroyXrcRcvQp => {
                let r: XrcRcvQpReq = body!();
                events(
                    core.destroy_xrc_rcv_qp(ctx, handle_of(r.xrcd), r.qp_num.get())
                        .map_err(core_err)?,
                )
            }
            Cmd::RegisterXrcRcvQp => {
                let r: XrcRcvQpReq = body!();
                let want = (r.qp_num.get() != CREATE_NEW_QP).then(|| r.qp_num.get());
                let qpn = core
                    .register_xrc_rcv_qp(ctx, handle_of(r.xrcd), want)
                    .map_err(core_err)?;
                ok(QpNumResp { qpn: U32::new(qpn) })
            }
            Cmd::UnregisterXrcRcvQp => {
                let r: XrcRcvQpReq = body!();
                events(
                    core.unregister_xrc_rcv_qp(ctx, handle_of(r.xrcd), r.qp_num.get())
                        .map_err(core_err)?,
                )
            }
            Cmd::GetAsyncEvent => match core.next_event(ctx).map_err(core_err)? {
                Some(ev) => ok(AsyncEventResp::from(&ev)),
                None => Err(EAGAIN),
            },
            Cmd::Hello
            | Cmd::QueryDeviceList
            | Cmd::Status
            | Cmd::Resources
            | Cmd::InjectEvent
            | Cmd::PostSend
            | Cmd::PostRecv
            | Cmd::PostSrqRecv
            | Cmd::PollCq
            | Cmd::CreateCompChannel
            | Cmd::DestroyCompChannel
            | Cmd::ReqNotifyCq
            | Cmd::GetCqEvent
            | Cmd::MapQueues
            | Cmd::MapDoorbell => unreachable!("handled before the object commands"),
        }
    }

    /// Tears a context down (its connection closed) in the core and the data path.
    pub fn close_context(&mut self, ctx: CtxId) -> Result<(), Error> {
        let qpns = self.core.context_qpns(ctx);
        self.core.close_context(ctx)?;
        self.dp.context_closed(&self.core, ctx, &qpns);
        Ok(())
    }

    /// Runs the engines; returns the contexts that got async events.
    pub fn drive(&mut self) -> Vec<CtxId> {
        self.dp.drive(&mut self.core)
    }

    /// The QP a destroy-like command may take with it, named before the command runs (the
    /// handle is gone after).
    fn qpn_before(&self, ctx: CtxId, req: &Request<'_>) -> Option<u32> {
        match req.cmd {
            Cmd::DestroyQp => {
                let r: HandleReq = req.body(self.abi).ok()?;
                self.core.qp_num(ctx, handle_of(r.handle)).ok()
            }
            Cmd::UnregXrcRcvQp | Cmd::DestroyXrcRcvQp | Cmd::UnregisterXrcRcvQp => {
                let r: XrcRcvQpReq = req.body(self.abi).ok()?;
                Some(r.qp_num.get())
            }
            _ => None,
        }
    }

    /// Mirrors a successful object command into the data path.
    fn mirror(
        &mut self,
        ctx: CtxId,
        req: &Request<'_>,
        body: &[u8],
        gone: Option<u32>,
        mr_fd: Option<OwnedFd>,
    ) -> Result<(), i32> {
        use zerocopy::FromBytes;
        let abi = self.abi;
        let (core, dp) = (&mut self.core, &mut self.dp);
        match req.cmd {
            Cmd::CreateCq | Cmd::ResizeCq => {
                let r = CreateCqResp::read_from_prefix(body).map_err(|_| EINVAL)?.0;
                if req.cmd == Cmd::CreateCq {
                    let q: CreateCqReq = req.body(abi).map_err(|e| e.errno())?;
                    let channel = (req.comp_mask & CREATE_CQ_CHANNEL != 0).then(|| q.channel.get());
                    dp.cq_created(ctx, handle_of(r.handle), r.cqe.get(), channel);
                } else {
                    dp.cq_resized(ctx, handle_of(r.handle), r.cqe.get());
                }
            }
            Cmd::DestroyCq => {
                let r: HandleReq = req.body(abi).map_err(|e| e.errno())?;
                dp.cq_destroyed(ctx, handle_of(r.handle));
            }
            Cmd::CreateSrq | Cmd::CreateXrcSrq => {
                let r = SrqResp::read_from_prefix(body).map_err(|_| EINVAL)?.0;
                dp.srq_created(core, ctx, handle_of(r.handle));
            }
            Cmd::ModifySrq => {
                let r: ModifySrqReq = req.body(abi).map_err(|e| e.errno())?;
                if r.attr_mask.get() & softverbs_core::attr::SRQ_LIMIT != 0 {
                    dp.srq_limit(ctx, handle_of(r.handle), r.srq_limit.get());
                }
            }
            Cmd::DestroySrq => {
                let r: HandleReq = req.body(abi).map_err(|e| e.errno())?;
                dp.srq_destroyed(ctx, handle_of(r.handle));
            }
            Cmd::RegMr => {
                let q: RegMrReq = req.body(abi).map_err(|e| e.errno())?;
                let r = RegMrResp::read_from_prefix(body).map_err(|_| EINVAL)?.0;
                // A shared MR is one more mapping of the daemon's, charged to the context.
                if mr_fd.is_some() {
                    if let Err(e) = core.set_mr_mapped(ctx, handle_of(r.handle), true) {
                        let _ = core.dereg_mr(ctx, handle_of(r.handle));
                        return Err(core_err(e));
                    }
                }
                if let Err(e) = dp.mr_registered(
                    ctx,
                    handle_of(r.handle),
                    q.addr.get(),
                    q.length.get(),
                    mr_fd,
                ) {
                    // The memory cannot be reached: undo the registration.
                    let _ = core.dereg_mr(ctx, handle_of(r.handle));
                    return Err(e);
                }
            }
            Cmd::DeregMr => {
                let r: HandleReq = req.body(abi).map_err(|e| e.errno())?;
                dp.mr_deregistered(ctx, handle_of(r.handle));
            }
            Cmd::ReregMr => {
                let r: ReregMrReq = req.body(abi).map_err(|e| e.errno())?;
                if r.flags.get() & REREG_MR_CHANGE_TRANSLATION != 0 {
                    // The shared mapping of the old range (if any) no longer backs the MR;
                    // the new range is reached the ordinary way.
                    dp.mr_deregistered(ctx, handle_of(r.handle));
                    let _ = core.set_mr_mapped(ctx, handle_of(r.handle), false);
                }
            }
            Cmd::CreateQp => {
                let q: CreateQpReq = req.body(abi).map_err(|e| e.errno())?;
                let r = CreateQpResp::read_from_prefix(body).map_err(|_| EINVAL)?.0;
                if q.qp_type.get() == QpType::XrcRecv as u32 {
                    dp.xrc_recv_created(core, ctx, r.qpn.get());
                } else {
                    dp.qp_created(core, ctx, handle_of(r.handle));
                }
            }
            Cmd::CreateXrcRcvQp => {
                let r = QpNumResp::read_from_prefix(body).map_err(|_| EINVAL)?.0;
                dp.xrc_recv_created(core, ctx, r.qpn.get());
            }
            Cmd::RegisterXrcRcvQp => {
                let q: XrcRcvQpReq = req.body(abi).map_err(|e| e.errno())?;
                if q.qp_num.get() == CREATE_NEW_QP {
                    let r = QpNumResp::read_from_prefix(body).map_err(|_| EINVAL)?.0;
                    dp.xrc_recv_created(core, ctx, r.qpn.get());
                }
            }
            Cmd::ModifyQp => {
                let q: ModifyQpReq = req.body(abi).map_err(|e| e.errno())?;
                let h = handle_of(q.handle);
                if let (Ok(qpn), Ok(now)) = (core.qp_num(ctx, h), core.query_qp(ctx, h)) {
                    dp.qp_modified(qpn, &now.attr);
                }
            }
            Cmd::ModifyXrcRcvQp => {
                let q: ModifyXrcRcvQpReq = req.body(abi).map_err(|e| e.errno())?;
                if let Ok(now) = core.query_xrc_rcv_qp(ctx, handle_of(q.xrcd), q.qp_num.get()) {
                    dp.qp_modified(q.qp_num.get(), &now.attr);
                }
            }
            _ => {}
        }
        if let Some(q) = gone {
            dp.qp_maybe_gone(core, q);
        }
        Ok(())
    }

    /// The data-path commands (ABI 3): posting work requests and polling completions.
    fn data_command(
        &mut self,
        ctx: CtxId,
        req: &Request<'_>,
        woken: &mut Vec<CtxId>,
    ) -> Option<Reply> {
        let r = match req.cmd {
            Cmd::PostSend => self.post_send(ctx, req),
            Cmd::PostRecv | Cmd::PostSrqRecv => self.post_recv(ctx, req),
            Cmd::PollCq => self.poll_cq(ctx, req),
            // A channel is an eventfd of the daemon's: charged to the context.
            Cmd::CreateCompChannel => match self.core.charge(ctx, Resource::Channels, 1) {
                Err(e) => Err(core_err(e)),
                Ok(()) => match self.dp.create_channel(ctx) {
                    Ok((h, fd)) => Ok((
                        HandleResp {
                            handle: U32::new(h),
                        }
                        .as_bytes()
                        .to_vec(),
                        vec![fd],
                    )),
                    Err(_) => {
                        self.core.uncharge(ctx, Resource::Channels, 1);
                        Err(ENOMEM)
                    }
                },
            },
            Cmd::DestroyCompChannel => req
                .body::<HandleReq>(self.abi)
                .map_err(|e| e.errno())
                .and_then(|r| self.dp.destroy_channel(ctx, r.handle.get()))
                .map(|()| self.core.uncharge(ctx, Resource::Channels, 1))
                .and_then(|()| empty()),
            Cmd::ReqNotifyCq => req
                .body::<ReqNotifyCqReq>(self.abi)
                .map_err(|e| e.errno())
                .and_then(|r| {
                    self.dp
                        .req_notify(ctx, handle_of(r.cq), r.solicited_only.get() != 0)
                })
                .and_then(|()| empty()),
            Cmd::GetCqEvent => {
                let r: Result<HandleReq, i32> = req.body(self.abi).map_err(|e| e.errno());
                r.and_then(|r| match self.dp.next_cq_event(ctx, r.handle.get())? {
                    Some(cq) => ok(CqEventResp { cq: U32::new(cq.0) }),
                    None => Err(EAGAIN),
                })
            }
            Cmd::MapQueues => {
                let r: Result<MapQueuesReq, i32> = req.body(self.abi).map_err(|e| e.errno());
                r.and_then(|r| {
                    let h = handle_of(r.handle);
                    let (core, dp) = (&mut self.core, &mut self.dp);
                    let qp = match r.kind.get() {
                        QUEUES_QP => Some(core.owned_qp_info(ctx, h).ok_or(EINVAL)?),
                        QUEUES_SRQ => core.srq_info(ctx, h).map(|_| None).ok_or(EINVAL)?,
                        QUEUES_CQ => core.cq_attr(ctx, h).map(|_| None).map_err(core_err)?,
                        QUEUES_READY if self.abi >= 6 && h.0 == 0 => None,
                        _ => return Err(EINVAL),
                    };
                    // The ring is charged to the context (ring bytes, one mapping) before the
                    // data path keeps it; over a limit the client gets ENOMEM.
                    let admit = |ring: Ring| {
                        move |len: u64| core.attach_ring(ctx, ring, len).map_err(core_err)
                    };
                    let (resp, fd) = match (r.kind.get(), qp) {
                        (QUEUES_QP, Some(i)) => dp.map_qp(&i, ctx, h, admit(Ring::Qp(h)))?,
                        (QUEUES_SRQ, _) => dp.map_srq(ctx, h, admit(Ring::Srq(h)))?,
                        (QUEUES_READY, _) => dp.map_ready(ctx, admit(Ring::Ready))?,
                        _ => dp.map_cq(ctx, h, admit(Ring::Cq(h)))?,
                    };
                    Ok((resp.as_bytes().to_vec(), vec![fd]))
                })
            }
            Cmd::MapDoorbell => self.dp.doorbell(ctx).map(|fd| (Vec::new(), vec![fd])),
            _ => return None,
        };
        woken.extend(self.drive());
        Some(r)
    }

    fn post_send(&mut self, ctx: CtxId, req: &Request<'_>) -> Reply {
        let r: PostSendReq = req.body(self.abi).map_err(|e| e.errno())?;
        let qpn = self.core.qp_num(ctx, handle_of(r.qp)).map_err(core_err)?;
        let wr = crate::datapath::send_wr_from_wire(&self.core, ctx, handle_of(r.qp), &r.wr)?;
        self.dp.post_send(qpn, wr)?;
        empty()
    }

    fn post_recv(&mut self, ctx: CtxId, req: &Request<'_>) -> Reply {
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
        empty()
    }

    fn poll_cq(&mut self, ctx: CtxId, req: &Request<'_>) -> Reply {
        let r: PollCqReq = req.body(self.abi).map_err(|e| e.errno())?;
        self.core.cq_attr(ctx, handle_of(r.cq)).map_err(core_err)?;
        let max = (r.max.get() as usize).min(MAX_WIRE_WC);
        let got = self.dp.poll_cq(ctx, handle_of(r.cq), max);
        let mut resp = PollCqResp {
            count: U32::new(got.len() as u32),
            ..Default::default()
        };
        for (slot, wc) in resp.wc.iter_mut().zip(&got) {
            *slot = WcWire {
                wr_id: U64::new(wc.wr_id),
                status: U32::new(wc.status as u32),
                opcode: U32::new(wc.opcode as u32),
                vendor_err: U32::new(0),
                byte_len: U32::new(wc.byte_len),
                imm_data: U32::new(wc.imm_data),
                qp_num: U32::new(wc.qp_num),
                src_qp: U32::new(wc.src_qp),
                wc_flags: U32::new(wc.wc_flags),
                pkey_index: U16::new(0),
                slid: U16::new(0),
                sl: 0,
                dlid_path_bits: 0,
                reserved: [0; 2],
            };
        }
        ok(resp)
    }

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
        if fds.len() != usize::from(with_mem) || (with_mem && r.device.get() == NO_DEVICE) {
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
            return ok(resp(0, n));
        }
        let opener = s.sender();
        let memory = match fds.pop() {
            Some(fd) => Some(ProcessMemory::validate(fd, opener).map_err(|e| {
                tracing::info!(pid = opener, "context refused: {e}");
                e.errno()
            })?),
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
        let ctx = self
            .core
            .open_context(r.device.get() as usize, info)
            .map_err(core_err)?;
        s.eventfd = Some(efd);
        s.phase = Phase::Context(ctx);
        s.opener_pid = Some(opener);
        self.dp.context_opened(ctx, memory);
        Ok((resp(ctx.0, n).as_bytes().to_vec(), vec![client_end]))
    }

    fn device_list(&self, r: QueryDeviceListReq) -> Reply {
        let d = self
            .core
            .devices()
            .get(r.index.get() as usize)
            .ok_or(EINVAL)?;
        ok(QueryDeviceListResp {
            name: name_bytes(&d.name),
            node_guid: U64::new(d.attr.node_guid),
        })
    }

    fn status(&self) -> Reply {
        let n = self.core.counts();
        let dp = self.dp.round_stats();
        let drops = self.dp.drop_stats();
        ok(StatusResp {
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
        let json = serde_json::to_vec(&self.core.resources()).map_err(|_| ENOMEM)?;
        let fd = softverbs_ipc::memfd_with("softverbs-resources", &json).map_err(|_| ENOMEM)?;
        Ok((
            BlobResp {
                len: U64::new(json.len() as u64),
            }
            .as_bytes()
            .to_vec(),
            vec![fd],
        ))
    }

    fn inject(&mut self, s: &Session, r: InjectEventReq, woken: &mut Vec<CtxId>) -> Reply {
        if s.cred.uid != 0 && s.cred.uid != self.daemon_uid {
            return Err(EPERM);
        }
        let t = EventType::from_raw(r.event_type.get()).ok_or(EINVAL)?;
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
            return ok(InjectEventResp {
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
        ok(InjectEventResp {
            contexts: U32::new(n),
        })
    }
}

/// Whether `req` tells the daemon where in the client's address space memory is: `reg_mr`
/// and `rereg_mr` with a new translation.
fn registers_memory(req: &Request<'_>) -> bool {
    match req.cmd {
        Cmd::RegMr => true,
        Cmd::ReregMr => <ReregMrReq as zerocopy::FromBytes>::read_from_prefix(req.body)
            .map_or(true, |(r, _)| {
                r.flags.get() & REREG_MR_CHANGE_TRANSLATION != 0
            }),
        _ => false,
    }
}
