//! The demo's data: messages a sender on a second daemon streams through the shared XRC
//! receive QP into each worker's XRC SRQ, and the checks that prove none was lost,
//! duplicated or corrupted on the way — across the SIGKILL of the receive QP's creator.
//!
//! A message is [`MSG`] bytes: its sequence number (little-endian u64), the SRQ number it was
//! aimed at (u32), a pattern that depends on the sequence number, and an FNV-1a checksum of
//! everything before it. The sender aims message `seq` at the SRQ of worker `seq % workers`.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use softverbs::{Access, AhAttr, AttrMask as M, Buf, Context, Gid, Mtu, Op, Qp, QpAttr};
use softverbs::{QpCap, QpInit, QpState, QpType, SendWork, WcOpcode, WcStatus, WorkCompletion};

/// Bytes per message.
pub const MSG: usize = 256;
const SUM_AT: usize = MSG - 8;
/// Messages the sender keeps in flight.
const DEPTH: u32 = 16;
/// How long the sender waits for a completion before it calls the stream stalled.
const STALL: Duration = Duration::from_secs(10);

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn pattern(seq: u64, i: usize) -> u8 {
    (seq.wrapping_mul(31).wrapping_add(i as u64 * 7) as u8) ^ 0xa5
}

/// Message `seq`, aimed at SRQ `srqn`.
pub fn message(seq: u64, srqn: u32) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[..8].copy_from_slice(&seq.to_le_bytes());
    m[8..12].copy_from_slice(&srqn.to_le_bytes());
    for (i, b) in m[12..SUM_AT].iter_mut().enumerate() {
        *b = pattern(seq, i);
    }
    let sum = fnv(&m[..SUM_AT]);
    m[SUM_AT..].copy_from_slice(&sum.to_le_bytes());
    m
}

/// The sequence number of a message received by the SRQ numbered `srqn`, or what is wrong
/// with it.
pub fn check(m: &[u8], srqn: u32) -> Result<u64, String> {
    if m.len() != MSG {
        return Err(format!("length {}", m.len()));
    }
    let seq = u64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
    let sum = u64::from_le_bytes(m[SUM_AT..].try_into().expect("8 bytes"));
    if fnv(&m[..SUM_AT]) != sum {
        return Err(format!("seq{seq}:checksum"));
    }
    if let Some(i) = (0..SUM_AT - 12).find(|&i| m[12 + i] != pattern(seq, i)) {
        return Err(format!("seq{seq}:corrupt@{}", 12 + i));
    }
    let aimed = u32::from_le_bytes(m[8..12].try_into().expect("4 bytes"));
    if aimed != srqn {
        return Err(format!("seq{seq}:aimed-at-srq-{aimed}"));
    }
    Ok(seq)
}

/// What one worker's SRQ received.
#[derive(Debug, Default)]
pub struct Inbox {
    /// Sequence numbers of the good messages, in arrival order (duplicates kept).
    pub seqs: Vec<u64>,
    /// What was wrong with each bad completion or message.
    pub bad: Vec<String>,
}

impl Inbox {
    /// Takes one receive completion of the SRQ `srqn` behind receive QP `qpn`, with the
    /// message it carried.
    pub fn take(&mut self, w: &WorkCompletion, msg: &[u8], qpn: u32, srqn: u32) {
        if w.status != WcStatus::Success || w.opcode != WcOpcode::Recv || w.qp_num != qpn {
            self.bad.push(format!(
                "wc:status={:?},opcode={:?},qp={:#x}",
                w.status, w.opcode, w.qp_num
            ));
            return;
        }
        match check(&msg[..(w.byte_len as usize).min(msg.len())], srqn) {
            Ok(seq) => self.seqs.push(seq),
            Err(e) => self.bad.push(e),
        }
    }

    /// The `GOT` line a worker reports.
    pub fn line(&self) -> String {
        let seqs: Vec<String> = self.seqs.iter().map(u64::to_string).collect();
        format!(
            "GOT n={} bad={} seqs={} bads={}",
            self.seqs.len(),
            self.bad.len(),
            seqs.join(","),
            self.bad.join(";")
        )
    }
}

/// A worker's `GOT` line, parsed: the sequence numbers and the bad messages.
pub fn parse_got(line: &str) -> Result<(Vec<u64>, Vec<String>), String> {
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .ok_or_else(|| format!("no {k} in {line:?}"))
    };
    let seqs = field("seqs=")?
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("bad seq {s:?}")))
        .collect::<Result<Vec<u64>, String>>()?;
    let bad = field("bads=")?
        .split(';')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    Ok((seqs, bad))
}

/// How worker `index` of `workers` fared out of `total` messages: `Ok(count)` if it got each
/// of its messages exactly once and nothing else, else what went wrong.
pub fn verdict(
    seqs: &[u64],
    bad: &[String],
    index: usize,
    workers: usize,
    total: u64,
) -> Result<usize, String> {
    let mut problems = Vec::new();
    if !bad.is_empty() {
        problems.push(format!(
            "{} corrupt or misdelivered: {}",
            bad.len(),
            bad.join(" ")
        ));
    }
    let mut sorted = seqs.to_vec();
    sorted.sort_unstable();
    let dups: Vec<u64> = sorted
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    if !dups.is_empty() {
        problems.push(format!("duplicated: {dups:?}"));
    }
    sorted.dedup();
    let want: Vec<u64> = (0..total)
        .filter(|s| (s % workers as u64) as usize == index)
        .collect();
    let lost: Vec<u64> = want
        .iter()
        .copied()
        .filter(|s| sorted.binary_search(s).is_err())
        .collect();
    if !lost.is_empty() {
        problems.push(format!("lost: {lost:?}"));
    }
    let foreign: Vec<u64> = sorted
        .iter()
        .copied()
        .filter(|s| want.binary_search(s).is_err())
        .collect();
    if !foreign.is_empty() {
        problems.push(format!("not its messages: {foreign:?}"));
    }
    if problems.is_empty() {
        Ok(want.len())
    } else {
        Err(problems.join("; "))
    }
}

pub fn gid_hex(g: Gid) -> String {
    g.0.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn parse_gid(s: &str) -> Option<Gid> {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Gid(g))
}

/// The receive side's RTR (IBA 11.2.5.3): towards the sender's XRC send QP `remote_qpn` at
/// `remote`, for the holder that modifies the receive QP.
pub fn recv_rtr(remote: Gid, remote_qpn: u32) -> (QpAttr, M) {
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        port_num: 1,
        qp_access_flags: Access::REMOTE_WRITE,
        ah_attr: av(remote),
        path_mtu: Mtu::M1024,
        dest_qp_num: remote_qpn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    let mask = M::STATE
        | M::AV
        | M::PATH_MTU
        | M::DEST_QPN
        | M::RQ_PSN
        | M::MAX_DEST_RD_ATOMIC
        | M::MIN_RNR_TIMER;
    (attr, mask)
}

fn av(gid: Gid) -> AhAttr {
    AhAttr {
        dgid: gid,
        is_global: true,
        port_num: 1,
        hop_limit: 64,
        ..AhAttr::default()
    }
}

/// RESET→INIT→RTR→RTS of the sender's XRC send QP towards receive QP `remote_qpn`; RNR
/// retries are unlimited (7), so a worker whose SRQ is momentarily empty only slows the
/// stream down.
fn connect_send(qp: &Qp<'_>, remote: Gid, remote_qpn: u32) -> softverbs::Result<()> {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: av(remote),
        path_mtu: Mtu::M1024,
        dest_qp_num: remote_qpn,
        ..init
    };
    qp.modify(
        &rtr,
        M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
    )?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 12,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..rtr
    };
    qp.modify(
        &rts,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
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

fn stdin_lines() -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The sender on its own daemon: an XRC send QP, then, told
/// `CONNECT <gid> <qpn>`, connected to the receive QP, and told
/// `STREAM <first> <srqn,srqn,...>`, it streams: messages `0..first` as fast as the window
/// allows, `MID` once they are all acknowledged, then one message every 200 µs until told
/// `FINISH`, then `first` more at full speed, and `DONE sent=<n> after_finish=<first>` once
/// every message is acknowledged. Any failed completion ends it with `ERROR`.
pub fn sender(socket: &Path) -> ! {
    // The daemon was just started by the demo: give it a moment to listen.
    let deadline = Instant::now() + Duration::from_secs(5);
    let ctx = loop {
        match Context::open_at(socket, 0) {
            Ok(c) => break c,
            Err(e) if Instant::now() > deadline => fail("open device", e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let pd = ctx.alloc_pd().unwrap_or_else(|e| fail("alloc_pd", e));
    let cq = ctx
        .create_cq(2 * DEPTH + 16)
        .unwrap_or_else(|e| fail("create_cq", e));
    let cap = QpCap {
        max_send_wr: DEPTH,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let qp = ctx
        .create_qp(&QpInit::new(QpType::XrcSend, &pd).send_cq(&cq).cap(cap))
        .unwrap_or_else(|e| fail("create_qp", e));
    let gid = ctx.query_gid(1, 0).unwrap_or_else(|e| fail("query_gid", e));
    say(&format!("READY qpn={} gid={}", qp.qpn(), gid_hex(gid)));
    let input = stdin_lines();
    let mut mr = pd
        .alloc_mr(DEPTH as usize * MSG, Access::LOCAL_WRITE)
        .unwrap_or_else(|e| fail("alloc_mr", e));
    let mut free: Vec<Buf> = (0..DEPTH)
        .map(|_| mr.take(MSG).unwrap_or_else(|e| fail("take", e)))
        .collect();
    let mut s = Stream {
        qp: &qp,
        cq: &cq,
        free: &mut free,
        in_flight: VecDeque::new(),
        posted: 0,
        srqns: Vec::new(),
    };
    while let Ok(line) = input.recv() {
        let a: Vec<&str> = line.split_whitespace().collect();
        match a.as_slice() {
            ["CONNECT", g, q] => {
                let g = parse_gid(g).unwrap_or_else(|| fail("CONNECT", "bad gid"));
                let q: u32 = q.parse().unwrap_or_else(|e| fail("CONNECT", e));
                connect_send(&qp, g, q).unwrap_or_else(|e| fail("connect", e));
                say("CONNECTED");
            }
            ["STREAM", first, srqns] => {
                let first: u64 = first.parse().unwrap_or_else(|e| fail("STREAM", e));
                s.srqns = srqns
                    .split(',')
                    .map(|x| x.parse().unwrap_or_else(|e| fail("STREAM srqn", e)))
                    .collect();
                s.send_until(first);
                s.drain();
                say(&format!("MID sent={first}"));
                // Paced until FINISH, so messages are in flight while the creator dies.
                loop {
                    match input.try_recv() {
                        Ok(l) if l.trim() == "FINISH" => break,
                        Ok(l) => fail("STREAM", format!("unexpected {l:?}")),
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                            fail("STREAM", "stdin closed")
                        }
                        Err(std::sync::mpsc::TryRecvError::Empty) => {}
                    }
                    s.send_until(s.posted + 1);
                    s.reap();
                    std::thread::sleep(Duration::from_micros(200));
                }
                let end = s.posted + first;
                s.send_until(end);
                s.drain();
                say(&format!("DONE sent={} after_finish={first}", s.posted));
            }
            ["QUIT"] => break,
            _ => fail("command", format!("unknown {line:?}")),
        }
    }
    std::process::exit(0);
}

struct Stream<'q, 'c> {
    qp: &'q Qp<'c>,
    cq: &'q softverbs::Cq<'c>,
    free: &'q mut Vec<Buf>,
    in_flight: VecDeque<u64>,
    posted: u64,
    srqns: Vec<u32>,
}

impl Stream<'_, '_> {
    /// Posts messages until `end` have been posted, reaping completions as the window needs.
    fn send_until(&mut self, end: u64) {
        while self.posted < end {
            if self.free.is_empty() {
                self.reap_one();
                continue;
            }
            let seq = self.posted;
            let srqn = self.srqns[(seq % self.srqns.len() as u64) as usize];
            let mut b = self.free.pop().expect("checked");
            b.write(0, &message(seq, srqn))
                .unwrap_or_else(|e| fail("write", e));
            let id = self
                .qp
                .post(SendWork::new(Op::Send, b).remote_srqn(srqn))
                .map_err(|r| r.error)
                .unwrap_or_else(|e| fail("post_send", e));
            self.in_flight.push_back(id.0);
            self.posted += 1;
        }
    }

    /// Takes whatever completions are there.
    fn reap(&mut self) {
        let wcs = self.cq.poll_bufs(32).unwrap_or_else(|e| fail("poll_cq", e));
        for c in wcs {
            let w = &c.wc;
            let want = self.in_flight.pop_front();
            if w.status != WcStatus::Success || want != Some(w.wr_id) {
                fail(
                    "completion",
                    format!("{:?} of wr {} (want {want:?})", w.status, w.wr_id),
                );
            }
            self.free.extend(c.buf);
        }
    }

    fn reap_one(&mut self) {
        let start = Instant::now();
        let before = self.in_flight.len();
        while self.in_flight.len() == before {
            self.reap();
            if start.elapsed() > STALL {
                fail("stream", format!("stalled with {before} in flight"));
            }
            std::thread::yield_now();
        }
    }

    /// Waits until every posted message is acknowledged.
    fn drain(&mut self) {
        while !self.in_flight.is_empty() {
            self.reap_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_check_and_damage_is_found() {
        let m = message(41, 7);
        assert_eq!(check(&m, 7), Ok(41));
        assert!(check(&m, 8).unwrap_err().contains("aimed-at"));
        let mut c = m;
        c[100] ^= 1;
        assert!(check(&c, 7).unwrap_err().contains("checksum"));
        assert!(check(&m[..MSG - 1], 7).is_err());
    }

    #[test]
    fn the_verdict_names_lost_duplicated_and_foreign_messages() {
        // Worker 1 of 3, 9 messages: 1, 4, 7.
        assert_eq!(verdict(&[7, 1, 4], &[], 1, 3, 9), Ok(3));
        assert!(verdict(&[1, 4], &[], 1, 3, 9)
            .unwrap_err()
            .contains("lost: [7]"));
        assert!(verdict(&[1, 4, 4, 7], &[], 1, 3, 9)
            .unwrap_err()
            .contains("duplicated: [4]"));
        assert!(verdict(&[1, 2, 4, 7], &[], 1, 3, 9)
            .unwrap_err()
            .contains("not its messages: [2]"));
        assert!(verdict(&[1, 4, 7], &["seq3:checksum".into()], 1, 3, 9).is_err());
        let (s, b) = parse_got("GOT n=2 bad=1 seqs=4,1 bads=seq7:checksum").unwrap();
        assert_eq!((s, b), (vec![4, 1], vec!["seq7:checksum".to_string()]));
        let (s, b) = parse_got("GOT n=0 bad=0 seqs= bads=").unwrap();
        assert!(s.is_empty() && b.is_empty());
    }
}
