//! The connection manager (docs/design/cm.md §4): CM ids live in the daemon, whose CM exchanges IB
//! CM MADs with the peer's QP1 (REQ/REP/RTU, REJ, DREQ/DREP, SIDR). A [`CmChannel`] is a
//! context's door to it: commands go out on the context's connection and events come back
//! on a pollable eventfd ([`CmChannel::fd`]).
//!
//! The CM does not touch QPs: the active side connects with its QP's number and starting
//! PSN (the PSN its receive queue will expect), the passive side reads them from the
//! [`CmEventKind::ConnectRequest`], brings its QP to RTR expecting its own starting PSN and
//! to RTS sending from the REQ's, and accepts, and the active side brings its QP up on
//! [`CmEventKind::ConnectResponse`] and calls [`CmChannel::establish`] — what
//! `rdma_init_qp_attr` / `rdma_establish` hand to a program (rdma_cm(7)).

use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use softverbs_abi::cm::*;
use softverbs_abi::msg::cmd;
use softverbs_core::device::Gid;
use zerocopy::little_endian::{U32, U64};

use crate::error::{errno, Error, Result};
use crate::Context;

/// A CM id: a connection or listener of the daemon's CM, owned by this context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmId(pub u32);

/// What an event says happened (rdma_cm(7) event names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmEventKind {
    /// A REQ (or SIDR_REQ) for a service this context listens on; the id is new.
    ConnectRequest,
    /// The passive side accepted: bring the QP up, then [`CmChannel::establish`].
    ConnectResponse,
    /// No answer within the CM's retries.
    Unreachable,
    /// The peer rejected (`status` is the REJ reason or SIDR status).
    Rejected,
    /// The connection is established (or a SIDR request resolved).
    Established,
    /// The connection ended.
    Disconnected,
}

/// One CM event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// The id it concerns.
    pub id: CmId,
    /// For a connect request: the listener it matched.
    pub listener: CmId,
    /// REJ reason (IBA 12.6.7.2) or SIDR status.
    pub status: u32,
    /// True for SIDR requests and replies (UD).
    pub sidr: bool,
    /// The peer's address (connect requests).
    pub peer: Option<IpAddr>,
    /// Service ID.
    pub service_id: u64,
    /// The peer's QPN (REQ, REP, SIDR_REP).
    pub remote_qpn: u32,
    /// The Starting PSN of the peer's REQ or REP: the PSN the peer's receive queue expects
    /// first, so the `sq_psn` this side's QP sends from (IBA 12.6.5/12.6.8 as the kernel's
    /// ib_cm uses them; docs/design/cm.md, "Starting PSN").
    pub starting_psn: u32,
    /// The SIDR_REP's Q_Key.
    pub qkey: u32,
    /// Responder resources the peer offers.
    pub responder_resources: u8,
    /// The peer's initiator depth.
    pub initiator_depth: u8,
    /// A connect request's Path Packet Payload MTU (IBA 12.6.5: 1 = 256 … 5 = 4096), which
    /// the passive side's QP takes as its path MTU, as the kernel's ib_cm does
    /// (cm_format_paths_from_req); 0 in other events.
    pub path_mtu: u8,
    /// The message's private data (its whole field: rdma_cm's REQ begins with its address
    /// header).
    pub private_data: Vec<u8>,
}

/// The QP side of a connect or accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmQp {
    /// The QP's number.
    pub qpn: u32,
    /// Its Starting PSN: the PSN its receive queue expects first (its RTR `rq_psn`), which
    /// the peer sends from. Not the PSN it sends from: that is the peer's (the event's
    /// `starting_psn`). Take it from a CSPRNG (docs/design/cm.md, "Starting PSN").
    pub starting_psn: u32,
    /// RDMA READ/atomic requests this side accepts at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests this side issues at once.
    pub initiator_depth: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// The QP receives through an SRQ.
    pub srq: bool,
    /// An XRC send (initiator) QP: the REQ says XRC (IBA annex A14). An accept needs no
    /// flag: the daemon's CM formats an XRC target's REP from the REQ it answers.
    pub xrc: bool,
}

impl CmQp {
    /// A QP with rdma_cm's usual settings (7 retries, one READ each way).
    pub fn new(qpn: u32, starting_psn: u32) -> Self {
        Self {
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            retry_count: 7,
            srq: false,
            xrc: false,
        }
    }
}

/// CM timers of a connect or SIDR request (IBA 12.7.27: 4.096 µs × 2^`response_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmTimers {
    /// CM response timeout exponent (rdma_cm's default, 20, is about 4.3 s).
    pub response_timeout: u8,
    /// Retransmissions before the CM gives up (rdma_cm: 15).
    pub max_retries: u8,
}

impl Default for CmTimers {
    fn default() -> Self {
        Self {
            response_timeout: 20,
            max_retries: 15,
        }
    }
}

/// What a context holds in the CM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmCounts {
    /// Listeners.
    pub listeners: u32,
    /// Connections and SIDR requests.
    pub ids: u32,
    /// Events not yet read.
    pub events: u32,
}

/// A context's connection-manager channel; one per context.
pub struct CmChannel<'c> {
    ctx: &'c Context,
    fd: OwnedFd,
}

impl std::fmt::Debug for CmChannel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmChannel").finish_non_exhaustive()
    }
}

fn pack<const N: usize>(
    op: &'static str,
    data: &[u8],
) -> Result<([u8; N], zerocopy::little_endian::U16)> {
    pack_private::<N>(data).ok_or(Error::new(op, errno::EINVAL))
}

fn addr(ip: IpAddr) -> [u8; 16] {
    Gid::from_ip(ip).0
}

impl Context {
    /// Opens this context's CM channel (`EEXIST` if it has one).
    pub fn cm_channel(&self) -> Result<CmChannel<'_>> {
        let ((), mut fds) = self
            .conn
            .call_fds::<cmd::CmOpen>("cm_channel", 0, &(), &[])?;
        let fd = fds.pop().ok_or(Error::new("cm_channel", errno::EPROTO))?;
        Ok(CmChannel { ctx: self, fd })
    }
}

impl CmChannel<'_> {
    /// The eventfd that is readable while events are pending.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Listens on `service_id` (`EADDRINUSE` if someone else does).
    pub fn listen(&self, service_id: u64) -> Result<CmId> {
        self.listen_backlog(service_id, 0)
    }

    /// [`Self::listen`] holding at most `backlog` connect requests unanswered
    /// (rdma_listen(3)); 0 means the daemon's default (1024, also the most it grants). A
    /// request past it is refused with a REJ (No Resources). An rdma_cm port below 1024
    /// needs uid 0 or `CAP_NET_BIND_SERVICE` (`EACCES`).
    pub fn listen_backlog(&self, service_id: u64, backlog: u32) -> Result<CmId> {
        let r = self.ctx.conn.call::<cmd::CmListen>(
            "cm_listen",
            0,
            &CmListenReq {
                service_id: U64::new(service_id),
                // A daemon before ABI 20 has no backlog (and refuses a non-zero tail).
                backlog: U32::new(if self.ctx.conn.abi >= 20 { backlog } else { 0 }),
                reserved: U32::new(0),
            },
        )?;
        Ok(CmId(r.id.get()))
    }

    /// Sends a REQ for an RC connection to `dst`'s `service_id`.
    pub fn connect(
        &self,
        dst: IpAddr,
        service_id: u64,
        qp: CmQp,
        timers: CmTimers,
        private_data: &[u8],
    ) -> Result<CmId> {
        let (pd, len) = pack::<92>("cm_connect", private_data)?;
        let req = CmConnectReq {
            dst: addr(dst),
            service_id: U64::new(service_id),
            qp_kind: U32::new(if qp.xrc { CM_QP_XRC } else { CM_QP_RC }),
            qpn: U32::new(qp.qpn),
            starting_psn: U32::new(qp.starting_psn),
            responder_resources: qp.responder_resources,
            initiator_depth: qp.initiator_depth,
            retry_count: qp.retry_count,
            rnr_retry_count: qp.rnr_retry_count,
            srq: u8::from(qp.srq),
            path_mtu: 3,
            response_timeout: timers.response_timeout,
            max_cm_retries: timers.max_retries,
            private_data_len: len,
            private_data: pd,
            ..CmConnectReq::default()
        };
        let r = self
            .ctx
            .conn
            .call::<cmd::CmConnect>("cm_connect", 0, &req)?;
        Ok(CmId(r.id.get()))
    }

    /// Accepts a connect request with a REP.
    pub fn accept(&self, id: CmId, qp: CmQp, private_data: &[u8]) -> Result<()> {
        let (pd, len) = pack::<196>("cm_accept", private_data)?;
        let req = CmAcceptReq {
            id: U32::new(id.0),
            qpn: U32::new(qp.qpn),
            starting_psn: U32::new(qp.starting_psn),
            responder_resources: qp.responder_resources,
            initiator_depth: qp.initiator_depth,
            rnr_retry_count: qp.rnr_retry_count,
            srq: u8::from(qp.srq),
            private_data_len: len,
            private_data: pd,
            ..CmAcceptReq::default()
        };
        self.ctx.conn.call::<cmd::CmAccept>("cm_accept", 0, &req)
    }

    /// Rejects a connect request (REJ, consumer-defined reason 28).
    pub fn reject(&self, id: CmId, private_data: &[u8]) -> Result<()> {
        let (pd, len) = pack::<148>("cm_reject", private_data)?;
        let req = CmRejectReq {
            id: U32::new(id.0),
            private_data_len: len,
            private_data: pd,
            ..CmRejectReq::default()
        };
        self.ctx.conn.call::<cmd::CmReject>("cm_reject", 0, &req)
    }

    /// Sends the RTU once the QP is ready after a [`CmEventKind::ConnectResponse`].
    pub fn establish(&self, id: CmId) -> Result<()> {
        self.ctx
            .conn
            .call::<cmd::CmEstablish>("cm_establish", 0, &CmIdReq { id: U32::new(id.0) })
    }

    /// Sends a DREQ.
    pub fn disconnect(&self, id: CmId, private_data: &[u8]) -> Result<()> {
        let (pd, len) = pack::<220>("cm_disconnect", private_data)?;
        let req = CmDisconnectReq {
            id: U32::new(id.0),
            private_data_len: len,
            private_data: pd,
            ..CmDisconnectReq::default()
        };
        self.ctx
            .conn
            .call::<cmd::CmDisconnect>("cm_disconnect", 0, &req)
    }

    /// Lets go of an id or listener; the peer of a connection in progress gets a REJ, that
    /// of an established one a DREQ.
    pub fn destroy(&self, id: CmId) -> Result<()> {
        self.ctx
            .conn
            .call::<cmd::CmDestroyId>("cm_destroy_id", 0, &CmIdReq { id: U32::new(id.0) })
    }

    /// Takes over CM id `id` from another of this process's CM channels on the same device
    /// (`rdma_migrate_id(3)`): its future events, and those queued for it, come here.
    pub fn adopt(&self, id: CmId) -> Result<()> {
        self.ctx
            .conn
            .call::<cmd::CmAdopt>("cm_adopt", 0, &CmIdReq { id: U32::new(id.0) })
    }

    /// Sends a SIDR_REQ: which UD QP serves `service_id` at `dst`?
    pub fn sidr_request(
        &self,
        dst: IpAddr,
        service_id: u64,
        timers: CmTimers,
        private_data: &[u8],
    ) -> Result<CmId> {
        let (pd, len) = pack::<216>("cm_sidr_request", private_data)?;
        let req = CmSidrReq {
            dst: addr(dst),
            service_id: U64::new(service_id),
            response_timeout: timers.response_timeout,
            max_retries: timers.max_retries,
            private_data_len: len,
            private_data: pd,
            ..CmSidrReq::default()
        };
        let r = self
            .ctx
            .conn
            .call::<cmd::CmSidrRequest>("cm_sidr_request", 0, &req)?;
        Ok(CmId(r.id.get()))
    }

    /// Answers a SIDR request with this UD QP (status 0) or a refusal (status non-zero).
    pub fn sidr_reply(
        &self,
        id: CmId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<()> {
        let (pd, len) = pack::<136>("cm_sidr_reply", private_data)?;
        let req = CmSidrReplyReq {
            id: U32::new(id.0),
            status: U32::new(status.into()),
            qpn: U32::new(qpn),
            qkey: U32::new(qkey),
            private_data_len: len,
            private_data: pd,
            ..CmSidrReplyReq::default()
        };
        self.ctx
            .conn
            .call::<cmd::CmSidrReply>("cm_sidr_reply", 0, &req)
    }

    /// What this context holds in the CM.
    pub fn counts(&self) -> Result<CmCounts> {
        let r = self.ctx.conn.call::<cmd::CmCounts>("cm_counts", 0, &())?;
        Ok(CmCounts {
            listeners: r.listeners.get(),
            ids: r.ids.get(),
            events: r.events.get(),
        })
    }

    /// The next event, if one is pending.
    pub fn try_event(&self) -> Result<Option<CmEvent>> {
        let r = match self
            .ctx
            .conn
            .call::<cmd::CmGetEvent>("cm_get_event", 0, &())
        {
            Ok(r) => r,
            Err(e) if e.errno() == errno::EAGAIN => return Ok(None),
            Err(e) => return Err(e),
        };
        let kind = match r.event.get() {
            cm_event::CONNECT_REQUEST => CmEventKind::ConnectRequest,
            cm_event::CONNECT_RESPONSE => CmEventKind::ConnectResponse,
            cm_event::UNREACHABLE => CmEventKind::Unreachable,
            cm_event::REJECTED => CmEventKind::Rejected,
            cm_event::ESTABLISHED => CmEventKind::Established,
            cm_event::DISCONNECTED => CmEventKind::Disconnected,
            _ => return Err(Error::new("cm_get_event", errno::EPROTO)),
        };
        let peer = (r.peer != [0; 16]).then(|| Gid(r.peer).to_ip());
        Ok(Some(CmEvent {
            kind,
            id: CmId(r.id.get()),
            listener: CmId(r.listener.get()),
            status: r.status.get(),
            sidr: r.sidr.get() != 0,
            peer,
            service_id: r.service_id.get(),
            remote_qpn: r.remote_qpn.get(),
            starting_psn: r.starting_psn.get(),
            qkey: r.qkey.get(),
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            path_mtu: r.path_mtu,
            private_data: private(&r.private_data, r.private_data_len).to_vec(),
        }))
    }

    /// Waits up to `timeout` for the next event (`None` if none came).
    pub fn wait_event(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ev) = self.try_event()? {
                return Ok(Some(ev));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            softverbs_ipc::wait_readable(self.fd.as_fd(), Some(ms))
                .map_err(|e| Error::new("cm_wait_event", e.raw_os_error().unwrap_or(errno::EIO)))?;
        }
    }
}
