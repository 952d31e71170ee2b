//! Which QPs go on the net path (docs/design/net-path.md, "Who goes on the net path"), decided at
//! `DirectAttach` after the same-host direct path has said no, and the errors a library's
//! engine reports (`NetQpError`).

use std::os::fd::OwnedFd;

use softverbs_abi::direct::{
    ABLE_NET, ABLE_NET_COUNTERS, ABLE_NET_FORWARDED, ABLE_NET_STATUS, NO_EVENT, NS_LEN,
    NS_LEN_COUNTERS, PATH_DAEMON, PATH_NET,
};
use softverbs_abi::msg::{DirectAttachReq, DirectAttachResp};
use softverbs_core::attr::QpAttr;
use softverbs_core::device::Gid;
use softverbs_core::errno::EINVAL;
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::types::{AttrMask, EventType, QpState, QpType};
use zerocopy::little_endian::U32;

use crate::dispatch::Dispatcher;

impl Dispatcher {
    /// `DirectAttach`'s answer once the direct path decided: a QP it left to the daemon goes
    /// on the net path if its library can run it and it is an RC QP on its own receive queue,
    /// connected (RTR or RTS) to a GID of no device of this daemon, on a device that neither
    /// injects faults nor captures. Any other answer takes the QP off the net path.
    pub(crate) fn net_path(
        &mut self,
        ctx: CtxId,
        pid: u32,
        r: &DirectAttachReq,
        resp: DirectAttachResp,
        fds: Vec<OwnedFd>,
    ) -> (DirectAttachResp, Vec<OwnedFd>) {
        let qp = Handle(r.qp.get());
        let Ok(qpn) = self.core.qp_num(ctx, qp) else {
            return (resp, fds);
        };
        // A library that does not take forwarded packets (ABI 17–19) expected a socket of
        // the device's reuseport group, which is no longer handed out (issue 35, item 1).
        let able = ABLE_NET | ABLE_NET_FORWARDED;
        let wanted = resp.path.get() == PATH_DAEMON && r.able.get() & able == able;
        let peer = match self.net_eligible(ctx, qp, qpn) {
            Some(peer) if wanted => peer,
            _ => {
                self.dp.net_detach(qpn);
                return (resp, fds);
            }
        };
        let srq = self.core.owned_qp_info(ctx, qp).and_then(|i| i.srq);
        let share = srq.and_then(|h| self.dp.fed_srq_share(ctx, h));
        if srq.is_some() && share.is_none() {
            self.dp.net_detach(qpn);
            return (resp, fds);
        }
        match self.dp.net_attach(ctx, qpn, peer) {
            Ok(sock) => {
                let pd = self.core.qp_pd(ctx, qp);
                // Receive buffers are checked in their SRQ's PD (IBA 10.2.9), else the QP's.
                let recv_pd = srq
                    .and_then(|h| self.core.srq_info(ctx, h))
                    .map(|i| i.pd)
                    .or(pd)
                    .map_or(0, |p| p.pd.0);
                let mut resp = DirectAttachResp {
                    path: U32::new(PATH_NET),
                    own_pd: U32::new(pd.map_or(0, |p| p.pd.0)),
                    // Whether the context's socket comes with this answer (the first time).
                    side: U32::new(u32::from(sock.is_some())),
                    net_port: U32::new(self.dp.net_port(qpn).map_or(0, u32::from)),
                    ..Default::default()
                };
                resp.recv_pd[0] = U32::new(recv_pd);
                let mut out = Vec::new();
                if let Some(share) = share {
                    resp.srq_len = zerocopy::little_endian::U64::new(share.len);
                    resp.srq_capacity = U32::new(share.layout.capacity());
                    resp.srq_entry = U32::new(share.layout.entry_size() as u32);
                    resp.srq_limit = U32::new(share.limit_at);
                    out.push(share.fd);
                }
                // With the socket, for a library that publishes its state, the net status
                // region, last (docs/design/net-path.md, "Stalls"); without it the daemon cannot
                // answer for the library, and the QP works as before.
                // A library that publishes its counters too gets the longer region.
                let len = if r.able.get() & ABLE_NET_COUNTERS != 0 {
                    NS_LEN_COUNTERS
                } else {
                    NS_LEN
                };
                let status = (sock.is_some() && r.able.get() & ABLE_NET_STATUS != 0)
                    .then(|| self.dp.net_status_open(ctx, pid, len).ok())
                    .flatten();
                out.extend(sock);
                if let Some(fd) = status {
                    resp.status_len = U32::new(len as u32);
                    out.push(fd);
                }
                tracing::debug!(qpn, srq = srq.is_some(), "QP on the net path");
                (resp, out)
            }
            Err(e) => {
                tracing::debug!(qpn, errno = e, "QP stays on the daemon's engine");
                (resp, fds)
            }
        }
    }

    /// The QP's path peer if it may go on the net path.
    fn net_eligible(&self, ctx: CtxId, qp: Handle, qpn: u32) -> Option<Gid> {
        let info = self.core.owned_qp_info(ctx, qp)?;
        let q = self.core.query_qp(ctx, qp).ok()?;
        // The library checks keys in the context's MR table: it must hold them all.
        if info.qp_type != QpType::Rc || !self.direct.table_complete(ctx) {
            return None;
        }
        // A basic SRQ whose receives live in its shared ring (ABI 16, docs/design/direct-path.md
        // "SRQs") is reachable by the library's engine as by the daemon's; one the daemon
        // alone holds is not.
        if info
            .srq
            .is_some_and(|h| !self.direct.takes_srqs(ctx) || !self.dp.is_fed_srq(ctx, h))
        {
            return None;
        }
        if !matches!(q.attr.qp_state, QpState::Rtr | QpState::Rts) {
            return None;
        }
        if self
            .core
            .qp_pd(ctx, qp)
            .is_none_or(|pd| self.core.pd_uses_windows(pd))
        {
            return None;
        }
        // The first address of the device: the one its net-path sockets are bound to.
        if q.attr.ah_attr.sgid_index != 0 {
            return None;
        }
        let dgid = q.attr.ah_attr.dgid;
        if dgid == Gid::default() {
            return None;
        }
        let local = self
            .core
            .devices()
            .iter()
            .any(|d| d.ports.iter().any(|p| p.gids.contains(&dgid)));
        (!local && self.dp.net_capable(qpn)).then_some(dgid)
    }

    /// `NetQpError`: the library's engine moved QP `qp` to ERR; the core follows (and the
    /// daemon's engine with it), and `event` is raised on the QP.
    pub(crate) fn net_qp_error(
        &mut self,
        ctx: CtxId,
        qp: Handle,
        event: u32,
    ) -> Result<Vec<CtxId>, i32> {
        let qpn = self.core.qp_num(ctx, qp).map_err(|e| e.errno())?;
        if !self.dp.on_net_path(qpn) {
            return Err(EINVAL);
        }
        let event = match event {
            NO_EVENT => None,
            e => Some(EventType::from_raw(e).ok_or(EINVAL)?),
        };
        if !matches!(
            event,
            None | Some(EventType::QpAccessErr | EventType::QpReqErr | EventType::QpFatal)
        ) {
            return Err(EINVAL);
        }
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = self.core.modify_qp(ctx, qp, &attr, AttrMask::STATE);
        self.apply_changes();
        Ok(event.map_or_else(Vec::new, |e| self.core.raise_qp_event(qpn, e)))
    }
}
