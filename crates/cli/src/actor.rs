//! The demo's child processes: a creator of an XRC receive QP and workers that join it
//! through one of the three API faces. They talk to the demo over stdin/stdout, one line per
//! step, so the demo can kill them, watch their events and tell them to leave.

use std::fs::File;
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use softverbs::{Context, Element, SrqAttr, WcStatus, XrcRecvQp, XrcRegistration};
use softverbs_core::attr::QpAttr;
use softverbs_core::errno::O_CREAT;
use softverbs_core::types::{Access, AttrMask, QpState};

use crate::stream;

/// Receive slots of each worker's XRC SRQ.
const SLOTS: u32 = 64;
/// How long a worker asked to `REPORT` waits for more messages before it reports what it has.
const REPORT_QUIET: Duration = Duration::from_secs(3);

/// How a worker joins the receive QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Face {
    /// Legacy OFED `ibv_reg_xrc_rcv_qp`.
    Legacy,
    /// The thread's minimal `register(xrcd, qpn)`.
    Minimal,
    /// Upstream `ibv_open_qp`.
    Upstream,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    say(&format!("ERROR {what}: {e}"));
    std::process::exit(1);
}

fn open(socket: &Path) -> Context {
    Context::open_at(socket, 0).unwrap_or_else(|e| fail("open device", e))
}

fn domain_file(path: &Path) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .open(path)
        .unwrap_or_else(|e| fail("open domain file", e))
}

/// Creates the receive QP (legacy `ibv_create_xrc_rcv_qp`), moves it to INIT, reports its
/// number and then waits to be killed.
pub fn creator(socket: &Path, file: &Path) -> ! {
    let ctx = open(socket);
    let f = domain_file(file);
    let xrcd = ctx
        .open_xrcd(Some(&f), O_CREAT)
        .unwrap_or_else(|e| fail("open xrcd", e));
    let reg = xrcd
        .create_xrc_rcv_qp()
        .unwrap_or_else(|e| fail("create_xrc_rcv_qp", e));
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
    xrcd.modify_xrc_rcv_qp(reg.qpn(), &init, mask)
        .unwrap_or_else(|e| fail("modify_xrc_rcv_qp", e));
    say(&format!("QPN {}", reg.qpn()));
    // Hold everything until killed (the demo sends SIGKILL: no cleanup code runs here).
    // Told `CONNECT <gid> <qpn>`, it brings the receive QP to RTR towards that XRC send QP
    // (the demo's sender, on another daemon).
    let mut line = String::new();
    while std::io::stdin().lock().read_line(&mut line).unwrap_or(0) > 0 {
        let a: Vec<&str> = line.split_whitespace().collect();
        if let ["CONNECT", g, q] = a.as_slice() {
            let gid = stream::parse_gid(g).unwrap_or_else(|| fail("CONNECT", "bad gid"));
            let remote: u32 = q.parse().unwrap_or_else(|e| fail("CONNECT", e));
            let (rtr, mask) = stream::recv_rtr(gid, remote);
            xrcd.modify_xrc_rcv_qp(reg.qpn(), &rtr, mask)
                .unwrap_or_else(|e| fail("modify_xrc_rcv_qp RTR", e));
            say("CONNECTED");
        }
        line.clear();
    }
    std::process::exit(0);
}

enum Held<'a> {
    Registration(XrcRegistration<'a>),
    Handle(XrcRecvQp<'a>),
}

/// Joins receive QP `qpn` through `face`, reports every async event it receives, and leaves
/// when told `LEAVE` on stdin.
pub fn worker(socket: &Path, file: &Path, qpn: u32, face: Face) -> ! {
    let ctx = open(socket);
    work(&ctx, file, qpn, face);
    // Closing the connection ends the context; the daemon frees whatever is left.
    drop(ctx);
    std::process::exit(0);
}

fn work(ctx: &Context, file: &Path, qpn: u32, face: Face) {
    let f = domain_file(file);
    let xrcd = ctx
        .open_xrcd(Some(&f), 0)
        .unwrap_or_else(|e| fail("open xrcd", e));
    let held = match face {
        Face::Legacy => Held::Registration(
            xrcd.reg_xrc_rcv_qp(qpn)
                .unwrap_or_else(|e| fail("reg_xrc_rcv_qp", e)),
        ),
        Face::Minimal => Held::Registration(
            xrcd.register_xrc_rcv_qp(Some(qpn))
                .unwrap_or_else(|e| fail("register_xrc_rcv_qp", e)),
        ),
        Face::Upstream => Held::Handle(
            xrcd.open_recv_qp(qpn)
                .unwrap_or_else(|e| fail("open_qp", e)),
        ),
    };
    let q = match &held {
        Held::Registration(_) => xrcd.query_xrc_rcv_qp(qpn),
        Held::Handle(h) => h.query(),
    }
    .unwrap_or_else(|e| fail("query", e));
    // Its own XRC SRQ in the domain, fed by the shared receive QP (docs/design/xrc-semantics.md):
    // one library-owned buffer per slot, handed back with the completion that filled it.
    let pd = ctx.alloc_pd().unwrap_or_else(|e| fail("alloc_pd", e));
    let cq = ctx
        .create_cq(2 * SLOTS + 16)
        .unwrap_or_else(|e| fail("create_cq", e));
    let srq = xrcd
        .create_xrc_srq(
            &pd,
            &cq,
            SrqAttr {
                max_wr: SLOTS,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap_or_else(|e| fail("create_xrc_srq", e));
    let srqn = srq.srq_num().unwrap_or_else(|e| fail("get_srq_num", e));
    let mut mr = pd
        .alloc_mr(SLOTS as usize * stream::MSG, Access::LOCAL_WRITE)
        .unwrap_or_else(|e| fail("alloc_mr", e));
    let post = |b: softverbs::Buf| {
        srq.post_recv_buf(b)
            .map_err(|r| r.error)
            .unwrap_or_else(|e| fail("post_srq_recv", e));
    };
    for _ in 0..SLOTS {
        post(mr.take(stream::MSG).unwrap_or_else(|e| fail("take", e)));
    }
    match &held {
        Held::Registration(_) => say(&format!(
            "JOINED registration state={:?} srqn={srqn}",
            q.attr.qp_state
        )),
        Held::Handle(h) => say(&format!(
            "JOINED handle={} state={:?} srqn={srqn}",
            h.handle(),
            q.attr.qp_state
        )),
    }
    let mut inbox = stream::Inbox::default();
    // `REPORT <n>`: the demo's request for the GOT line once n messages are in (or nothing
    // more arrived for a while).
    let mut report: Option<(usize, Instant)> = None;
    let stdin = std::io::stdin();
    let async_fd = ctx.async_fd();
    loop {
        let got = cq.poll_bufs(32).unwrap_or_else(|e| fail("poll_cq", e));
        let progressed = !got.is_empty();
        for c in got {
            let Some(b) = c.buf else {
                inbox
                    .bad
                    .push(format!("wc-without-buffer:{:?}", c.wc.status));
                continue;
            };
            inbox.take(&c.wc, &b.to_vec(), qpn, srqn);
            if c.wc.status == WcStatus::Success {
                post(b);
            }
        }
        if let Some((want, since)) = report.as_mut() {
            if progressed {
                *since = Instant::now();
            }
            if inbox.seqs.len() + inbox.bad.len() >= *want || since.elapsed() > REPORT_QUIET {
                say(&inbox.line());
                report = None;
            }
        }
        let mut fds = [
            PollFd::new(&stdin, PollFlags::IN),
            PollFd::new(&async_fd, PollFlags::IN),
        ];
        // Completions have no descriptor here: the CQ is polled every millisecond.
        let tick = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        match poll(&mut fds, Some(&tick)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => fail("poll", e),
        }
        let (stdin_ready, events_ready) =
            (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if events_ready {
            // Reset the eventfd first, then read everything queued: an event queued after
            // the reset signals it again.
            softverbs_ipc::drain_eventfd(async_fd);
            while let Some(ev) = ctx
                .try_get_async_event()
                .unwrap_or_else(|e| fail("get_async_event", e))
            {
                let element = match ev.element {
                    Element::Qp(h) => format!("qp-handle={h}"),
                    Element::XrcRecvQpNum(n) => format!("xrc-qpn={n}"),
                    other => format!("{other:?}"),
                };
                let name = ev.event_type.map_or_else(
                    || format!("event-{}", ev.raw_event_type),
                    |t| format!("{t:?}"),
                );
                say(&format!(
                    "EVENT {name} {element} legacy_type={:#x}",
                    ev.legacy_event_type
                ));
            }
        }
        if stdin_ready {
            let mut line = String::new();
            if stdin.lock().read_line(&mut line).unwrap_or(0) == 0 || line.trim() == "LEAVE" {
                break;
            }
            if let Some(n) = line.trim().strip_prefix("REPORT ") {
                let n = n.parse().unwrap_or_else(|e| fail("REPORT", e));
                report = Some((n, Instant::now()));
            }
        }
    }
    let reported = match held {
        Held::Registration(r) => r.unregister(),
        Held::Handle(h) => h.destroy(),
    }
    .unwrap_or_else(|e| fail("leave", e));
    // The domain handle is closed when `xrcd` drops at the end of this function.
    say(&format!("LEFT events_reported={reported}"));
}
