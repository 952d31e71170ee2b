//! Text rendering of the daemon's resources (`softverbs resources`).

use std::fmt::Write;

use softverbs_core::resources::Resources;
use softverbs_core::{HolderKind, HolderRef};

fn kind(k: HolderKind, via: HolderRef) -> String {
    let how = match via {
        HolderRef::Registration => "registration".to_string(),
        HolderRef::Handle(h) => format!("handle {}", h.0),
    };
    let k = match k {
        HolderKind::Creator => "creator",
        HolderKind::Registration => "registered",
        HolderKind::Opened => "opened",
    };
    format!("{k} ({how})")
}

/// Renders every section that has rows.
pub fn render(r: &Resources) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "contexts: {}", r.contexts.len());
    for c in &r.contexts {
        let _ = writeln!(
            out,
            "  ctx {:<4} pid {:<7} {:<16} {}  pds {} mrs {} mws {} cqs {} srqs {} qps {} xrcds {} regs {} events {}",
            c.ctx.0, c.pid, c.comm, c.device, c.pds, c.mrs, c.mws, c.cqs, c.srqs, c.qps, c.xrcd_handles, c.registrations, c.pending_events
        );
    }
    if !r.pds.is_empty() {
        let _ = writeln!(out, "pds: {}", r.pds.len());
        for p in &r.pds {
            let _ = writeln!(
                out,
                "  pid {:<7} handle {:<6} mrs {} mws {}",
                p.pid, p.handle.0, p.mrs, p.mws
            );
        }
    }
    let _ = writeln!(out, "xrc domains: {}", r.xrcds.len());
    for x in &r.xrcds {
        let file = x.file.map_or("private".to_string(), |f| {
            format!("inode {} (dev {})", f.ino, f.dev)
        });
        let _ = writeln!(
            out,
            "  xrcd {:<4} {:<28} opens {} srqs {} recv-qps {}",
            x.xrcd.0, file, x.opens, x.srqs, x.xrc_recv_qps
        );
    }
    if !r.srqs.is_empty() {
        let _ = writeln!(out, "srqs: {}", r.srqs.len());
        for s in &r.srqs {
            let n = s
                .srqn
                .map_or("basic".to_string(), |n| format!("srqn {n:#08x}"));
            let _ = writeln!(
                out,
                "  pid {:<7} handle {:<6} {n} max_wr {}",
                s.pid, s.handle.0, s.max_wr
            );
        }
    }
    if !r.cqs.is_empty() {
        let _ = writeln!(out, "cqs: {}", r.cqs.len());
        for c in &r.cqs {
            let _ = writeln!(
                out,
                "  pid {:<7} handle {:<6} cqe {} users {}",
                c.pid, c.handle.0, c.cqe, c.users
            );
        }
    }
    if !r.qps.is_empty() {
        let _ = writeln!(out, "qps: {}", r.qps.len());
        for q in &r.qps {
            let _ = write!(
                out,
                "  pid {:<7} qpn {:#08x} {:?} {:?}",
                q.pid, q.qpn, q.qp_type, q.state
            );
            // Which path carries it, its peer and its PSNs (docs/guide/counters.md), as far
            // as the daemon knows them.
            if let Some(p) = &q.path {
                let _ = write!(out, " path {p}");
            }
            if let (Some(n), Some(a)) = (q.remote_qpn, q.remote_addr) {
                let _ = write!(out, " remote {a} qpn {n:#08x}");
            }
            if let Some(p) = q.sq_psn {
                let _ = write!(out, " sq_psn {p:#08x}");
            }
            if let Some(p) = q.rq_psn {
                let _ = write!(out, " rq_psn {p:#08x}");
            }
            out.push('\n');
        }
    }
    let _ = writeln!(out, "xrc receive qps: {}", r.xrc_recv_qps.len());
    for t in &r.xrc_recv_qps {
        let _ = writeln!(
            out,
            "  qpn {:#08x} xrcd {} {:?}, {} holder(s):",
            t.qpn,
            t.xrcd.0,
            t.state,
            t.holders.len()
        );
        for h in &t.holders {
            let _ = writeln!(out, "    pid {:<7} {}", h.pid, kind(h.kind, h.via));
        }
    }
    out
}
