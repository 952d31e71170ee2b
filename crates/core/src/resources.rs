//! A snapshot of everything the core holds, for `softverbs resources` (the `rdma resource`
//! equivalent) — including, for each XRC receive QP, who holds it and how, which no other
//! tool shows, and for each PD the MRs and memory windows on it (what keeps
//! `ibv_dealloc_pd` at `EBUSY`).

use serde::{Deserialize, Serialize};

use crate::core::{Core, QpEntry, SrqKind};
use crate::ids::{CtxId, FileId, Handle, XrcdId};
use crate::types::{QpState, QpType};
use crate::xrc_recv::HolderInfo;

mod devices;
pub use devices::{DeviceRow, McastGroupRow, PortRow};

/// One context.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct ContextRow {
    pub ctx: CtxId,
    pub pid: u32,
    pub uid: u32,
    pub comm: String,
    pub device: String,
    pub pds: usize,
    pub mrs: usize,
    /// Memory windows (docs/design/memory-windows.md); 0 from older daemons.
    #[serde(default)]
    pub mws: usize,
    pub cqs: usize,
    pub srqs: usize,
    pub qps: usize,
    pub xrcd_handles: usize,
    pub registrations: usize,
    pub pending_events: usize,
}

/// One PD and the memory keys on it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct PdRow {
    pub ctx: CtxId,
    pub pid: u32,
    pub handle: Handle,
    pub mrs: usize,
    pub mws: usize,
}

/// One XRC domain.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct XrcdRow {
    pub xrcd: XrcdId,
    pub device: String,
    /// `None` for a private domain (`fd == -1`).
    pub file: Option<FileId>,
    pub opens: u32,
    pub srqs: u32,
    pub xrc_recv_qps: u32,
}

/// One SRQ.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct SrqRow {
    pub ctx: CtxId,
    pub pid: u32,
    pub handle: Handle,
    pub srqn: Option<u32>,
    pub xrcd: Option<XrcdId>,
    pub max_wr: u32,
}

/// One CQ.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct CqRow {
    pub ctx: CtxId,
    pub pid: u32,
    pub handle: Handle,
    pub cqe: u32,
    pub users: u32,
}

/// One owned QP.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct QpRow {
    pub ctx: CtxId,
    pub pid: u32,
    pub handle: Handle,
    pub qpn: u32,
    pub qp_type: QpType,
    pub state: QpState,
    /// The multicast groups a UD QP is attached to (their IP addresses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcast_groups: Vec<std::net::IpAddr>,
    /// Which data path carries it: `daemon`, `direct` or `net` (filled by the daemon, which
    /// runs the paths; absent from older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The peer's QP number (`dest_qp_num`), once connected (RTR).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_qpn: Option<u32>,
    /// The peer's address (its GID as an IP address), once connected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_addr: Option<std::net::IpAddr>,
    /// The send PSN: the next new request packet's (IBA 9.7.4.1.2), where the daemon's
    /// engine runs the QP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sq_psn: Option<u32>,
    /// The receive PSN: the one the responder expects next (IBA 9.7.5.1.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rq_psn: Option<u32>,
}

/// One shared XRC receive QP and its holders.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct XrcRecvRow {
    pub qpn: u32,
    pub xrcd: XrcdId,
    pub state: QpState,
    pub holders: Vec<HolderInfo>,
}

/// Everything, sorted for stable output.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Resources {
    pub contexts: Vec<ContextRow>,
    /// Empty from older daemons.
    #[serde(default)]
    pub pds: Vec<PdRow>,
    pub xrcds: Vec<XrcdRow>,
    pub srqs: Vec<SrqRow>,
    pub cqs: Vec<CqRow>,
    pub qps: Vec<QpRow>,
    pub xrc_recv_qps: Vec<XrcRecvRow>,
    /// Every resource's limits and use (docs/guide/limits.md); empty from older daemons.
    #[serde(default)]
    pub limits: Vec<crate::limits::LimitRow>,
    /// Every device's ports and multicast groups; empty from older daemons.
    #[serde(default)]
    pub devices: Vec<DeviceRow>,
    /// The daemon's version (`softverbs --version` of the binary it runs from); `None` from
    /// daemons older than the Debian package (issue 36), which did not say. The core does
    /// not know it: the daemon fills it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_version: Option<String>,
}

impl Core {
    /// A snapshot of all objects. Linear in everything: for introspection, not the data path.
    pub fn resources(&self) -> Resources {
        let mut r = Resources {
            contexts: Vec::new(),
            pds: Vec::new(),
            xrcds: Vec::new(),
            srqs: Vec::new(),
            cqs: Vec::new(),
            qps: Vec::new(),
            xrc_recv_qps: Vec::new(),
            limits: self.limit_rows(),
            devices: self.device_rows(),
            daemon_version: None,
        };
        for (&ctx, c) in &self.contexts {
            let pid = c.info.pid;
            r.contexts.push(ContextRow {
                ctx,
                pid,
                uid: c.info.uid,
                comm: c.info.comm.clone(),
                device: self.devices[c.device].name.clone(),
                pds: c.pds.len(),
                mrs: c.mrs.len(),
                mws: c.mws.len(),
                cqs: c.cqs.len(),
                srqs: c.srqs.len(),
                qps: c.qps.len(),
                xrcd_handles: c.xrcds.len(),
                registrations: c.xrc_regs.len(),
                pending_events: c.events.len(),
            });
            for &handle in c.pds.keys() {
                r.pds.push(PdRow {
                    ctx,
                    pid,
                    handle,
                    mrs: c.mrs.values().filter(|m| m.pd == handle).count(),
                    mws: c.mws.values().filter(|w| w.pd == handle).count(),
                });
            }
            for (&handle, s) in &c.srqs {
                let (srqn, xrcd) = match s.kind {
                    SrqKind::Xrc { srqn, xrcd, .. } => (Some(srqn), Some(xrcd)),
                    SrqKind::Basic => (None, None),
                };
                r.srqs.push(SrqRow {
                    ctx,
                    pid,
                    handle,
                    srqn,
                    xrcd,
                    max_wr: s.attr.max_wr,
                });
            }
            for (&handle, q) in &c.cqs {
                r.cqs.push(CqRow {
                    ctx,
                    pid,
                    handle,
                    cqe: q.cqe,
                    users: q.usecnt,
                });
            }
            for (&handle, q) in &c.qps {
                if let QpEntry::Owned(q) = q {
                    r.qps.push(QpRow {
                        ctx,
                        pid,
                        handle,
                        qpn: q.qpn,
                        qp_type: q.init.qp_type,
                        state: q.attr.qp_state,
                        mcast_groups: self
                            .qp_mcast_groups(ctx, handle)
                            .unwrap_or_default()
                            .into_iter()
                            .map(|g| g.to_ip())
                            .collect(),
                        path: None,
                        remote_qpn: None,
                        remote_addr: None,
                        sq_psn: None,
                        rq_psn: None,
                    });
                }
            }
        }
        for (&xrcd, x) in &self.xrcds {
            r.xrcds.push(XrcdRow {
                xrcd,
                device: self.devices[x.device].name.clone(),
                file: x.file,
                opens: x.opens,
                srqs: x.srqs,
                xrc_recv_qps: x.tgt_qps,
            });
        }
        for (&qpn, t) in &self.tgt_qps {
            r.xrc_recv_qps.push(XrcRecvRow {
                qpn,
                xrcd: t.xrcd,
                state: t.attr.qp_state,
                holders: self.xrc_rcv_qp_holders(qpn),
            });
        }
        r.contexts.sort_by_key(|c| c.ctx);
        r.pds.sort_by_key(|p| (p.ctx, p.handle));
        r.xrcds.sort_by_key(|x| x.xrcd);
        r.srqs.sort_by_key(|s| (s.ctx, s.handle));
        r.cqs.sort_by_key(|s| (s.ctx, s.handle));
        r.qps.sort_by_key(|s| (s.ctx, s.handle));
        r.xrc_recv_qps.sort_by_key(|t| t.qpn);
        r
    }
}
