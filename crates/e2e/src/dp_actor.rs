//! Data-path actors: client processes that move data through the daemon, for the
//! real-process integration tests (`tests/datapath_processes.rs`).
//!
//! Each actor opens its own context, builds its objects, prints a `READY ...` line, and then
//! follows one command per line on stdin, answering each with one line that starts with `OK`,
//! `ERR` or `BAD`. Every byte that moves is checked by the processes themselves: buffers are
//! filled with a pattern that depends only on a seed and the byte's index, so both ends can
//! compute what must have arrived.

use std::io::{BufRead, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use softverbs::{
    Access, AhAttr, AttrMask as M, Context, Cq, Gid, Mtu, Op, Qp, QpAttr, QpCap, QpInit, QpState,
    QpType, SendOp, SendRequest, SendWork, Sge, SrqAttr, WcOpcode, WcStatus, WorkCompletion,
    O_CREAT,
};
use softverbs_abi::codec::{decode_response, encode_request};
use softverbs_abi::msg::{
    send_flags, wr_opcode, Cmd, CreateCqReq, CreateCqResp, CreateQpReq, CreateQpResp, HandleResp,
    HelloReq, HelloResp, ModifyQpReq, PollCqReq, PollCqResp, PostRecvReq, PostSendReq, QpAttrWire,
    SendWrWire, SgeWire, CREATE_QP_CREATE_FLAGS, MAX_WIRE_SGE, PRESENT_PD, PRESENT_RECV_CQ,
    PRESENT_SEND_CQ,
};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Names a plain `Vec` of this actor for the raw registration, where an actor probes the
/// raw path on purpose; everything else uses the owning API (`Pd::alloc_mr`, `Buf`,
/// `SendWork`, `post_recv_buf`, `poll_bufs`: the streams of `dp-rc` and both XRC roles).
/// What stays raw, and why:
///
/// * `dp-rc`'s main buffer (the `addr`/`rkey` of its `READY` line): `FREE` gives it back to
///   the system while its MR lives, to show that RDMA into freed private memory completes
///   with an error and harms nobody else — memory only `RawMemory` can register (an owned
///   MR cannot be freed under its registration, a borrowed one cannot be dropped). The
///   same buffer is the target peers address in `OPS`/`WRITE`/`READ`, and the commands over
///   it need what owned `Buf`s do not offer: `POSTRECV n` posts n receives of one region at
///   peer-chosen offsets, `OPS` READs into two SGEs, and `WRITE`/`READ` after `FREE` stand
///   a spare `Vec` in under the freed MR's lkey.
/// * `dp-garbage`'s buffers: it is a raw protocol client on purpose (keys and SGEs the
///   typed API would refuse).
///
/// Those buffers are read and written while registered (after the completions the actor
/// waits for): they bend the contract of `RawMemory::new` knowingly, in a test process.
#[allow(unsafe_code)]
fn raw_memory(addr: u64, len: usize) -> softverbs::RawMemory {
    // SAFETY: not upheld in full, on purpose (see above): the daemon may write these
    // buffers while the actor holds plain references to them, which only a test actor that
    // checks bytes after completions may accept.
    unsafe { softverbs::RawMemory::new(addr as usize, len) }
}

/// The data-path roles (`softverbs-test-actor` subcommands).
#[derive(clap::Subcommand)]
pub enum DpRole {
    /// One RC QP over one registered buffer, driven by commands on stdin.
    #[command(name = "dp-rc")]
    Rc {
        /// Bytes of the registered buffer.
        #[arg(long, default_value_t = 1 << 20)]
        buf_len: usize,
        /// Send and receive queue depth (and the stream window).
        #[arg(long, default_value_t = 64)]
        depth: u32,
        /// Local ACK timeout exponent (4.096 us * 2^timeout); 14 (67 ms) as perftest uses,
        /// so a loaded 2-core machine does not time out acknowledgements still in flight.
        #[arg(long, default_value_t = 14)]
        timeout: u8,
        /// Transport retries before RETRY_EXC_ERR.
        #[arg(long, default_value_t = 7)]
        retry: u8,
    },
    /// Creates an XRC receive QP in the domain of `file`, connects it on command, and holds it
    /// until killed.
    #[command(name = "dp-xrc-creator")]
    XrcCreator {
        #[arg(long)]
        file: PathBuf,
        #[arg(long, value_enum, default_value = "upstream")]
        face: crate::Face,
    },
    /// Joins receive QP `qpn` through `face`, owns one XRC SRQ behind it, and receives and
    /// checks messages until told `DONE`.
    #[command(name = "dp-xrc-owner")]
    XrcOwner {
        #[arg(long)]
        file: PathBuf,
        #[arg(long)]
        qpn: u32,
        #[arg(long, value_enum)]
        face: crate::Face,
        /// Receive buffers kept posted.
        #[arg(long, default_value_t = 32)]
        slots: u32,
        /// Bytes of every message.
        #[arg(long, default_value_t = 512)]
        size: u32,
    },
    /// An XRC send QP that spreads a numbered message stream over SRQ numbers.
    #[command(name = "dp-xrc-sender")]
    XrcSender {
        /// Messages in flight at most.
        #[arg(long, default_value_t = 32)]
        depth: u32,
    },
    /// Posts garbage work requests and reports what each one got (`CASE name result`).
    #[command(name = "dp-garbage")]
    Garbage,
}

/// Runs `role`.
pub fn run(socket: &Path, role: &DpRole) -> ! {
    match role {
        DpRole::Rc {
            buf_len,
            depth,
            timeout,
            retry,
        } => rc(socket, *buf_len, *depth, *timeout, *retry),
        DpRole::XrcCreator { file, face } => xrc_creator(socket, file, *face),
        DpRole::XrcOwner {
            file,
            qpn,
            face,
            slots,
            size,
        } => xrc_owner(socket, file, *qpn, *face, *slots, *size),
        DpRole::XrcSender { depth } => xrc_sender(socket, *depth),
        DpRole::Garbage => garbage(socket),
    }
}

// ---- plumbing ------------------------------------------------------------------------------

pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    say(&format!("ERR {what}: {e}"));
    std::process::exit(1);
}

pub(crate) trait OrFail<T> {
    fn or_fail(self, what: &str) -> T;
}

impl<T, E: std::fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, what: &str) -> T {
        self.unwrap_or_else(|e| fail(what, e))
    }
}

/// Lines of stdin, read by a thread so loops can look for commands without blocking.
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

/// The byte at index `i` of a region filled from `seed`.
pub fn pattern(seed: u64, i: u64) -> u8 {
    let mut x = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x >> 56) as u8
}

fn fill(buf: &mut [u8], seed: u64, from: u64) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = pattern(seed, from + k as u64);
    }
}

/// The first index where `buf` differs from the pattern, if any.
fn mismatch(buf: &[u8], seed: u64, from: u64) -> Option<usize> {
    buf.iter()
        .enumerate()
        .position(|(k, &b)| b != pattern(seed, from + k as u64))
}

/// FNV-1a over `bytes`, continuing from `h`.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

fn gid_hex(g: Gid) -> String {
    g.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_gid(s: &str) -> Gid {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2).unwrap_or("zz"), 16).or_fail("gid");
    }
    Gid(g)
}

fn num<T: std::str::FromStr>(args: &[&str], i: usize) -> T
where
    T::Err: std::fmt::Display,
{
    let s = args
        .get(i)
        .unwrap_or_else(|| fail("command", format!("argument {i} missing")));
    let r = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16)
            .map_err(|e| e.to_string())
            .map(|v| v.to_string()),
        None => Ok(s.to_string()),
    }
    .or_fail("number");
    r.parse().or_fail("number")
}

const ALL: Access = Access(0x0f);

fn av(gid: Gid) -> AhAttr {
    AhAttr {
        dgid: gid,
        is_global: true,
        port_num: 1,
        hop_limit: 64,
        ..AhAttr::default()
    }
}

fn init_attr() -> QpAttr {
    QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ALL,
        ..QpAttr::default()
    }
}

const INIT_MASK: M = M(M::STATE.0 | M::PKEY_INDEX.0 | M::PORT.0 | M::ACCESS_FLAGS.0);

/// RESET→INIT→RTR→RTS of an RC or XRC send QP towards `remote`.
fn connect_qp(
    qp: &Qp<'_>,
    remote: Gid,
    remote_qpn: u32,
    timeout: u8,
    retry: u8,
) -> softverbs::Result<()> {
    let xrc = qp.qp_type() == QpType::XrcSend;
    qp.modify(&init_attr(), INIT_MASK)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: av(remote),
        path_mtu: Mtu::M1024,
        dest_qp_num: remote_qpn,
        max_dest_rd_atomic: 8,
        min_rnr_timer: 1,
        ..init_attr()
    };
    let mut mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    if !xrc {
        mask = mask | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    }
    qp.modify(&rtr, mask)?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout,
        retry_cnt: retry,
        rnr_retry: 7,
        max_rd_atomic: 8,
        ..rtr
    };
    qp.modify(
        &rts,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
}

/// Polls `cq` for one completion, at most `timeout`.
fn wait_one(cq: &Cq<'_>, timeout: Duration) -> Option<WorkCompletion> {
    cq.wait(1, timeout).or_fail("poll_cq").pop()
}

fn wc_line(w: &WorkCompletion) -> String {
    format!(
        "wr_id={} status={:?} opcode={:?} len={} imm={:#x} qpn={}",
        w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.qp_num
    )
}

fn is_unmapped(addr: u64, len: u64) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    !maps.lines().any(|l| {
        let range = l.split(' ').next().unwrap_or("");
        let Some((a, b)) = range.split_once('-') else {
            return false;
        };
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap_or(0),
            u64::from_str_radix(b, 16).unwrap_or(0),
        );
        a < addr + len && addr < b
    })
}

// ---- RC ------------------------------------------------------------------------------------

fn rc(socket: &Path, buf_len: usize, depth: u32, timeout: u8, retry: u8) -> ! {
    let ctx = Context::open_at(socket, 0).or_fail("open device");
    let pd = ctx.alloc_pd().or_fail("alloc_pd");
    let cq = ctx.create_cq(4 * depth + 64).or_fail("create_cq");
    let cap = QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let new_qp = || {
        ctx.create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap))
            .or_fail("create_qp")
    };
    let mut qp = new_qp();
    // Big enough that malloc maps it on its own, so dropping it unmaps it (FREE).
    let mut buf = Some(vec![0u8; buf_len]);
    let base = buf.as_ref().map_or(0, |b| b.as_ptr() as u64);
    let mr = pd.reg_mr(raw_memory(base, buf_len), ALL).or_fail("reg_mr");
    let gid = ctx.query_gid(1, 0).or_fail("query_gid");
    say(&format!(
        "READY qpn={} gid={} addr={base} rkey={} len={buf_len} pid={}",
        qp.qpn(),
        gid_hex(gid),
        mr.rkey(),
        std::process::id()
    ));
    let input = stdin_lines();
    let mut stream_mrs = Vec::new();
    let lkey = mr.lkey();
    let sge = |off: u64, len: u32| {
        [Sge {
            addr: base + off,
            length: len,
            lkey,
        }]
    };
    while let Ok(line) = input.recv() {
        let a: Vec<&str> = line.split_whitespace().collect();
        let Some(&cmd) = a.first() else { continue };
        let need_buf = !matches!(
            cmd,
            "CONNECT" | "NEWQP" | "FREE" | "WRITE" | "READ" | "QUIT"
        );
        if need_buf && buf.is_none() {
            say("ERR the buffer was freed");
            continue;
        }
        match cmd {
            "CONNECT" => {
                let r = connect_qp(&qp, parse_gid(a[1]), num(&a, 2), timeout, retry);
                say(&r.map_or_else(|e| format!("ERR connect: {e}"), |()| "OK".into()));
            }
            "NEWQP" => {
                qp = new_qp();
                say(&format!("OK qpn={}", qp.qpn()));
            }
            "FILL" => {
                let (off, len, seed): (usize, usize, u64) = (num(&a, 1), num(&a, 2), num(&a, 3));
                let b = buf.as_mut().expect("checked");
                fill(&mut b[off..off + len], seed, 0);
                say("OK");
            }
            "SETU64" => {
                let (off, v): (usize, u64) = (num(&a, 1), num(&a, 2));
                buf.as_mut().expect("checked")[off..off + 8].copy_from_slice(&v.to_ne_bytes());
                say("OK");
            }
            "GETU64" => {
                let off: usize = num(&a, 1);
                let b = buf.as_ref().expect("checked");
                let v = u64::from_ne_bytes(b[off..off + 8].try_into().expect("8 bytes"));
                say(&format!("OK {v}"));
            }
            // CHECK off len seed pattern_off: the bytes equal the pattern from pattern_off.
            "CHECK" => {
                let (off, len, seed, poff): (usize, usize, u64, u64) =
                    (num(&a, 1), num(&a, 2), num(&a, 3), num(&a, 4));
                let b = &buf.as_ref().expect("checked")[off..off + len];
                match mismatch(b, seed, poff) {
                    None => say(&format!("OK fnv={:016x}", fnv(FNV0, b))),
                    Some(i) => say(&format!(
                        "BAD at {} got {:#04x} want {:#04x}",
                        off + i,
                        b[i],
                        pattern(seed, poff + i as u64)
                    )),
                }
            }
            // POSTRECV n off len: n receives at off, off+len, ...
            "POSTRECV" => {
                let (n, off, len): (u64, u64, u32) = (num(&a, 1), num(&a, 2), num(&a, 3));
                let r =
                    (0..n).try_for_each(|i| qp.post_recv(i, &sge(off + i * u64::from(len), len)));
                say(&r.map_or_else(|e| format!("ERR post_recv: {e}"), |()| "OK".into()));
            }
            // WAITRECV n: the next n completions, one line each, then OK.
            "WAITRECV" => {
                let n: usize = num(&a, 1);
                let got = cq.wait(n, Duration::from_secs(30)).or_fail("poll_cq");
                for w in &got {
                    say(&format!("WC {}", wc_line(w)));
                }
                say(&format!("OK got={}", got.len()));
            }
            // OPS raddr rkey seed_local seed_remote: every RC operation against a peer
            // whose buffer at raddr holds the pattern of seed_remote in [0, 64K), a u64 40
            // at +0x20000, receives posted at +0x10000 and +0x12000; checks what comes back.
            "OPS" => ops(&qp, &cq, buf.as_mut().expect("checked"), base, lkey, &a),
            // STREAM-SEND n size seed: n messages, RC in order; at most `depth` in flight.
            "STREAM-SEND" => {
                let (n, size, seed): (u64, u32, u64) = (num(&a, 1), num(&a, 2), num(&a, 3));
                stream_send(&qp, &cq, &pd, buf_len, depth, n, size, seed);
            }
            // STREAM-RECV n size seed [progress_at]: receives and checks n messages.
            "STREAM-RECV" => {
                let (n, size, seed): (u64, u32, u64) = (num(&a, 1), num(&a, 2), num(&a, 3));
                let progress_at: u64 = if a.len() > 4 { num(&a, 4) } else { u64::MAX };
                // Its last receive may stay posted: its memory stays registered.
                let mr = stream_recv(&qp, &cq, &pd, buf_len, depth, n, size, seed, progress_at);
                stream_mrs.push(mr);
            }
            // WRITE/READ raddr rkey off len: one RDMA op, its completion.
            "WRITE" | "READ" => {
                let (raddr, rkey, off, len): (u64, u32, u64, u32) =
                    (num(&a, 1), num(&a, 2), num(&a, 3), num(&a, 4));
                let op = if cmd == "WRITE" {
                    SendOp::Write {
                        remote_addr: raddr,
                        rkey,
                    }
                } else {
                    SendOp::Read {
                        remote_addr: raddr,
                        rkey,
                    }
                };
                // Once the local buffer is gone, a spare one stands in.
                let spare = vec![0u8; len as usize + 8];
                let s = match &buf {
                    Some(_) => sge(off, len),
                    None => [Sge {
                        addr: spare.as_ptr() as u64,
                        length: len,
                        lkey,
                    }],
                };
                match qp.post_send(&SendRequest::new(77, op, &s)) {
                    Err(e) => say(&format!("ERR post_send: {e}")),
                    Ok(()) => match wait_one(&cq, Duration::from_secs(30)) {
                        Some(w) => say(&format!("OK {}", wc_line(&w))),
                        None => say("ERR no completion"),
                    },
                }
            }
            // FREE: gives the registered buffer back to the system (the MR stays).
            "FREE" => {
                drop(buf.take());
                say(&format!(
                    "OK unmapped={}",
                    is_unmapped(base, buf_len as u64)
                ));
            }
            "QUIT" => break,
            other => say(&format!("ERR unknown command {other}")),
        }
    }
    drop(qp);
    std::process::exit(0);
}

/// The daemon writes registered memory behind the compiler's back (that is what RDMA is):
/// after a completion, make the compiler forget what it knew of `buf`, or an optimised build
/// may reuse values this process stored before the transfer instead of reading the memory.
fn dma_settled(buf: &mut [u8]) {
    std::hint::black_box(buf);
}

fn expect_wc(cq: &Cq<'_>, wr_id: u64, opcode: WcOpcode) -> Result<WorkCompletion, String> {
    let w = wait_one(cq, Duration::from_secs(30)).ok_or(format!("no completion for {wr_id}"))?;
    if w.wr_id != wr_id || w.status != WcStatus::Success || w.opcode != opcode {
        return Err(format!(
            "wanted {wr_id} {opcode:?} Success, got {}",
            wc_line(&w)
        ));
    }
    Ok(w)
}

fn ops(qp: &Qp<'_>, cq: &Cq<'_>, buf: &mut [u8], base: u64, lkey: u32, a: &[&str]) {
    let (raddr, rkey, seed_l, seed_r): (u64, u32, u64, u64) =
        (num(a, 1), num(a, 2), num(a, 3), num(a, 4));
    let mut run = || -> Result<String, String> {
        let sge = |off: u64, len: u32| {
            [Sge {
                addr: base + off,
                length: len,
                lkey,
            }]
        };
        let post = |wr_id, op, s: &[Sge]| {
            qp.post_send(&SendRequest::new(wr_id, op, s))
                .map_err(|e| e.to_string())
        };
        // SEND of 6000 bytes (six packets) and a SEND with immediate.
        post(1, SendOp::Send, &sge(0, 6000))?;
        expect_wc(cq, 1, WcOpcode::Send)?;
        dma_settled(buf);
        post(2, SendOp::SendWithImm(0xabcd), &sge(0x1000, 100))?;
        expect_wc(cq, 2, WcOpcode::Send)?;
        dma_settled(buf);
        // WRITE of 20000 bytes to +0x30000.
        post(
            3,
            SendOp::Write {
                remote_addr: raddr + 0x30000,
                rkey,
            },
            &sge(0, 20000),
        )?;
        expect_wc(cq, 3, WcOpcode::RdmaWrite)?;
        dma_settled(buf);
        // READ of the peer's first 30000 bytes, over two SGEs.
        let s = [
            Sge {
                addr: base + 0x40000,
                length: 10000,
                lkey,
            },
            Sge {
                addr: base + 0x50000,
                length: 20000,
                lkey,
            },
        ];
        post(
            4,
            SendOp::Read {
                remote_addr: raddr,
                rkey,
            },
            &s,
        )?;
        let w = expect_wc(cq, 4, WcOpcode::RdmaRead)?;
        dma_settled(buf);
        if w.byte_len != 30000 {
            return Err(format!("READ byte_len {}", w.byte_len));
        }
        if let Some(i) = mismatch(&buf[0x40000..0x40000 + 10000], seed_r, 0) {
            return Err(format!("READ data differs at {i}"));
        }
        if let Some(i) = mismatch(&buf[0x50000..0x50000 + 20000], seed_r, 10000) {
            return Err(format!("READ data differs at {}", 10000 + i));
        }
        // Atomics on the u64 at +0x20000 (40): +2 returns 40; 42 -> 7 returns 42.
        buf[0x60000..0x60010].fill(0xee);
        post(
            5,
            SendOp::FetchAdd {
                remote_addr: raddr + 0x20000,
                rkey,
                add: 2,
            },
            &sge(0x60000, 8),
        )?;
        expect_wc(cq, 5, WcOpcode::FetchAdd)?;
        dma_settled(buf);
        let swap = SendOp::CompareSwap {
            remote_addr: raddr + 0x20000,
            rkey,
            compare: 42,
            swap: 7,
        };
        post(6, swap, &sge(0x60008, 8))?;
        expect_wc(cq, 6, WcOpcode::CompSwap)?;
        dma_settled(buf);
        // A compare that fails leaves the value and returns it.
        let miss = SendOp::CompareSwap {
            remote_addr: raddr + 0x20000,
            rkey,
            compare: 1,
            swap: 99,
        };
        post(7, miss, &sge(0x60010, 8))?;
        expect_wc(cq, 7, WcOpcode::CompSwap)?;
        dma_settled(buf);
        let got = |o: usize| u64::from_ne_bytes(buf[o..o + 8].try_into().expect("8"));
        let atomics = (got(0x60000), got(0x60008), got(0x60010));
        if atomics != (40, 42, 7) {
            return Err(format!("atomics returned {atomics:?}, want (40, 42, 7)"));
        }
        // The local source stayed what it was.
        if let Some(i) = mismatch(&buf[..0x10000], seed_l, 0) {
            return Err(format!("local source changed at {i}"));
        }
        Ok(format!(
            "OK ops read_fnv={:016x}",
            fnv(FNV0, &buf[0x40000..0x40000 + 10000])
        ))
    };
    say(&run().unwrap_or_else(|e| format!("BAD {e}")));
}

/// What every stream message starts with. Without it the first payload bytes would be the
/// little-endian message number, `xx yy 00 00`, which Wireshark's InfiniBand dissector takes
/// for an EtherType header (its "identify payload" heuristic) and then reports as malformed.
const MAGIC: &[u8; 4] = b"SVDP";

/// The `size` bytes of message `seq`: the magic, its number, then the pattern of `seed ^ seq`.
fn message(slot: &mut [u8], seed: u64, seq: u64) {
    slot[..4].copy_from_slice(MAGIC);
    slot[4..12].copy_from_slice(&seq.to_le_bytes());
    fill(&mut slot[12..], seed ^ seq, 12);
}

/// The number of a stream message, if it starts with the magic.
fn message_seq(m: &[u8]) -> Option<u64> {
    (m.get(..4)? == MAGIC).then(|| u64::from_le_bytes(m[4..12].try_into().expect("8")))
}

/// Library-owned buffers for a stream: as many `size`-byte slots as the actor's registered
/// buffer would hold, at most `depth`. Streams only SEND and RECV, so their slots need not
/// be the buffer peers address; each slot is handed to the QP and comes back with its
/// completion before this process touches it again.
fn stream_bufs<'p>(
    pd: &'p softverbs::Pd<'_>,
    buf_len: usize,
    depth: u32,
    size: u32,
) -> (softverbs::OwnedMr<'p>, Vec<softverbs::Buf>) {
    let slots = u64::from(depth).min(buf_len as u64 / u64::from(size)) as usize;
    let mut mr = pd
        .alloc_mr((slots * size as usize).max(1), Access::LOCAL_WRITE)
        .or_fail("alloc_mr");
    let bufs = (0..slots)
        .map(|_| mr.take(size as usize).or_fail("take"))
        .collect();
    (mr, bufs)
}

#[allow(clippy::too_many_arguments)]
fn stream_send(
    qp: &Qp<'_>,
    cq: &Cq<'_>,
    pd: &softverbs::Pd<'_>,
    buf_len: usize,
    depth: u32,
    n: u64,
    size: u32,
    seed: u64,
) {
    let (_mr, mut free) = stream_bufs(pd, buf_len, depth, size);
    let slots = free.len() as u64;
    // (library wr_id, message number) of the messages in flight, in posting order.
    let mut in_flight = std::collections::VecDeque::new();
    let mut msg = vec![0u8; size as usize];
    let (mut posted, mut done, mut digest) = (0u64, 0u64, FNV0);
    let mut first_err: Option<(u64, WcStatus)> = None;
    let (mut flushed, mut after_err_ok) = (0u64, 0u64);
    let mut last_progress = Instant::now();
    while done < posted || (posted < n && first_err.is_none()) {
        while first_err.is_none() && posted < n && posted - done < slots {
            message(&mut msg, seed, posted);
            digest = fnv(digest, &msg);
            let mut b = free
                .pop()
                .unwrap_or_else(|| fail("post_send", "no free buffer"));
            b.write(0, &msg).or_fail("write");
            match qp.post(SendWork::new(Op::Send, b)) {
                Ok(id) => in_flight.push_back((id.0, posted)),
                Err(r) => {
                    say(&format!("ERR post_send {posted}: {}", r.error));
                    std::process::exit(1);
                }
            }
            posted += 1;
        }
        let got = cq.poll_bufs(32).or_fail("poll_cq");
        if got.is_empty() {
            if last_progress.elapsed() > Duration::from_secs(60) {
                say(&format!("ERR stalled sent={done} posted={posted}"));
                return;
            }
            std::thread::yield_now();
            continue;
        }
        last_progress = Instant::now();
        for c in got {
            let w = &c.wc;
            let Some((_, seq)) = in_flight.pop_front().filter(|&(id, _)| id == w.wr_id) else {
                say(&format!(
                    "BAD completion out of order: {} want {done}",
                    wc_line(w)
                ));
                return;
            };
            free.extend(c.buf);
            done += 1;
            match (w.status, first_err) {
                (WcStatus::Success, None) => {}
                (WcStatus::Success, Some(_)) => after_err_ok += 1,
                (s, None) => first_err = Some((seq, s)),
                (WcStatus::WrFlushErr, Some(_)) => flushed += 1,
                (s, Some(_)) => {
                    say(&format!("BAD second error {s:?} at {seq}"));
                    return;
                }
            }
        }
    }
    match first_err {
        None => say(&format!("OK sent={done} digest={digest:016x}")),
        Some((at, s)) => say(&format!(
            "ERR first={s:?} at={at} flushed={flushed} success_after={after_err_ok} posted={posted}"
        )),
    }
}

#[allow(clippy::too_many_arguments)]
fn stream_recv<'p>(
    qp: &Qp<'_>,
    cq: &Cq<'_>,
    pd: &'p softverbs::Pd<'_>,
    buf_len: usize,
    depth: u32,
    n: u64,
    size: u32,
    seed: u64,
    progress_at: u64,
) -> softverbs::OwnedMr<'p> {
    let (mr, mut spare) = stream_bufs(pd, buf_len, depth, size);
    let post = |b: softverbs::Buf| {
        qp.post_recv_buf(b)
            .map_err(|r| r.error)
            .or_fail("post_recv");
    };
    let mut posted = 0u64;
    while posted < n {
        let Some(b) = spare.pop() else { break };
        post(b);
        posted += 1;
    }
    let (mut got, mut digest) = (0u64, FNV0);
    let mut m = vec![0u8; size as usize];
    let mut last_progress = Instant::now();
    while got < n {
        let wcs = cq.poll_bufs(32).or_fail("poll_cq");
        if wcs.is_empty() {
            if last_progress.elapsed() > Duration::from_secs(60) {
                say(&format!("ERR stalled received={got}"));
                return mr;
            }
            std::thread::yield_now();
            continue;
        }
        last_progress = Instant::now();
        for c in wcs {
            let w = &c.wc;
            let b = match c.buf {
                Some(b)
                    if w.status == WcStatus::Success
                        && w.opcode == WcOpcode::Recv
                        && w.byte_len == size =>
                {
                    b
                }
                _ => {
                    say(&format!("BAD receive {got}: {}", wc_line(w)));
                    return mr;
                }
            };
            b.read(0, &mut m).or_fail("read");
            let Some(seq) = message_seq(&m) else {
                say(&format!("BAD message number {got} has no magic"));
                return mr;
            };
            if seq != got {
                say(&format!("BAD message {seq} arrived as number {got}"));
                return mr;
            }
            if let Some(i) = mismatch(&m[12..], seed ^ seq, 12) {
                say(&format!("BAD message {seq} corrupt at byte {}", 12 + i));
                return mr;
            }
            digest = fnv(digest, &m);
            got += 1;
            if got == progress_at {
                say(&format!("PROGRESS {got}"));
            }
            if posted < n {
                post(b);
                posted += 1;
            } else {
                spare.push(b);
            }
        }
    }
    // Nothing more may arrive (no duplicates): a short quiet period with a spare receive.
    if let Some(b) = spare.pop() {
        post(b);
    }
    if let Some(w) = wait_one(cq, Duration::from_millis(200)) {
        say(&format!("BAD extra completion after {n}: {}", wc_line(&w)));
        return mr;
    }
    say(&format!("OK received={got} digest={digest:016x}"));
    mr
}

// ---- XRC -----------------------------------------------------------------------------------

pub(crate) fn domain_file(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .open(path)
        .or_fail("open domain file")
}

fn xrc_creator(socket: &Path, file: &Path, face: crate::Face) -> ! {
    use crate::Face;
    let ctx = Context::open_at(socket, 0).or_fail("open device");
    let f = domain_file(file);
    let xrcd = ctx.open_xrcd(Some(&f), O_CREAT).or_fail("open_xrcd");
    let (handle, reg) = match face {
        Face::Upstream => (Some(xrcd.create_recv_qp().or_fail("create_recv_qp")), None),
        Face::Legacy => (
            None,
            Some(xrcd.create_xrc_rcv_qp().or_fail("create_xrc_rcv_qp")),
        ),
        Face::Minimal => (
            None,
            Some(xrcd.register_xrc_rcv_qp(None).or_fail("register")),
        ),
    };
    let qpn = handle
        .as_ref()
        .map_or_else(|| reg.as_ref().map_or(0, |r| r.qpn()), |h| h.qpn());
    let modify = |attr: &QpAttr, mask: M| match &handle {
        Some(h) => h.modify(attr, mask),
        None => xrcd.modify_xrc_rcv_qp(qpn, attr, mask),
    };
    modify(&init_attr(), INIT_MASK).or_fail("modify INIT");
    say(&format!("QPN {qpn}"));
    let input = stdin_lines();
    while let Ok(line) = input.recv() {
        let a: Vec<&str> = line.split_whitespace().collect();
        if a.first() == Some(&"CONNECT") {
            let rtr = QpAttr {
                qp_state: QpState::Rtr,
                ah_attr: av(parse_gid(a[1])),
                path_mtu: Mtu::M1024,
                dest_qp_num: num(&a, 2),
                max_dest_rd_atomic: 8,
                min_rnr_timer: 1,
                ..init_attr()
            };
            let mask = M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER;
            say(&modify(&rtr, mask)
                .map_or_else(|e| format!("ERR modify RTR: {e}"), |()| "OK".into()));
        }
    }
    std::process::exit(0);
}

/// An XRC message: the magic, its number, the SRQ it was aimed at, then the pattern of
/// `seed ^ seq`.
fn xrc_message(slot: &mut [u8], seed: u64, seq: u64, srqn: u32) {
    slot[..4].copy_from_slice(MAGIC);
    slot[4..12].copy_from_slice(&seq.to_le_bytes());
    slot[12..16].copy_from_slice(&srqn.to_le_bytes());
    fill(&mut slot[16..], seed ^ seq, 16);
}

fn xrc_owner(socket: &Path, file: &Path, qpn: u32, face: crate::Face, slots: u32, size: u32) -> ! {
    use crate::Face;
    let ctx = Context::open_at(socket, 0).or_fail("open device");
    let f = domain_file(file);
    let xrcd = ctx.open_xrcd(Some(&f), O_CREAT).or_fail("open_xrcd");
    let mut handle = None;
    let mut reg = None;
    match face {
        Face::Upstream => handle = Some(xrcd.open_recv_qp(qpn).or_fail("open_qp")),
        Face::Legacy => reg = Some(xrcd.reg_xrc_rcv_qp(qpn).or_fail("reg_xrc_rcv_qp")),
        Face::Minimal => reg = Some(xrcd.register_xrc_rcv_qp(Some(qpn)).or_fail("register")),
    }
    let pd = ctx.alloc_pd().or_fail("alloc_pd");
    let cq = ctx.create_cq(2 * slots + 32).or_fail("create_cq");
    let srq = xrcd
        .create_xrc_srq(
            &pd,
            &cq,
            SrqAttr {
                max_wr: slots,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .or_fail("create_xrc_srq");
    let srqn = srq.srq_num().or_fail("get_srq_num");
    // Library-owned shared memory, one Buf per receive slot: each is handed to the SRQ and
    // comes back with the completion that filled it, so nothing reads a slot the daemon may
    // still write.
    let mut mr = pd
        .alloc_mr((slots * size) as usize, Access::LOCAL_WRITE)
        .or_fail("alloc_mr");
    let post = |b: softverbs::Buf| {
        srq.post_recv_buf(b)
            .map_err(|r| r.error)
            .or_fail("post_srq_recv");
    };
    for _ in 0..slots {
        post(mr.take(size as usize).or_fail("take"));
    }
    say(&format!("READY srqn={srqn}"));
    let input = stdin_lines();
    let mut seqs = Vec::new();
    let mut bad = Vec::new();
    let mut digest = 0u64;
    let mut done_at: Option<Instant> = None;
    let mut last = Instant::now();
    loop {
        let wcs = cq.poll_bufs(32).or_fail("poll_cq");
        let idle = wcs.is_empty();
        if !idle {
            last = Instant::now();
        }
        for c in wcs {
            let w = &c.wc;
            let Some(b) = c.buf else {
                bad.push(format!(
                    "wc-without-buffer:{}",
                    wc_line(w).replace(' ', ",")
                ));
                continue;
            };
            let msg = b.to_vec();
            let m = &msg[..];
            let seq = message_seq(m).unwrap_or(u64::MAX);
            let aimed = u32::from_le_bytes(m[12..16].try_into().expect("4"));
            if w.status != WcStatus::Success
                || w.opcode != WcOpcode::Recv
                || w.byte_len != size
                || w.qp_num != qpn
            {
                bad.push(format!("wc:{}", wc_line(w).replace(' ', ",")));
            } else if seq == u64::MAX {
                bad.push(format!("slot{}:no-magic", w.wr_id));
            } else if aimed != srqn {
                bad.push(format!("seq{seq}:aimed-at-{aimed}"));
            } else if let Some(i) = mismatch(&m[16..], 0x5eed ^ seq, 16) {
                bad.push(format!("seq{seq}:corrupt@{}", 16 + i));
            } else {
                // Order-independent digest: the merge of all owners can be compared.
                digest = digest.wrapping_add(fnv(FNV0, m));
                seqs.push(seq);
            }
            if w.status == WcStatus::Success {
                post(b);
            }
        }
        if let Ok(l) = input.try_recv() {
            if l.trim() == "DONE" {
                done_at = Some(Instant::now());
            }
        }
        if let Some(t) = done_at {
            // Drain: stop once nothing arrived for 300 ms.
            if last.elapsed() > Duration::from_millis(300)
                && t.elapsed() > Duration::from_millis(300)
            {
                break;
            }
        }
        if idle {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let list: Vec<String> = seqs.iter().map(u64::to_string).collect();
    say(&format!(
        "GOT n={} bad={} digest={digest:016x} seqs={} bads={}",
        seqs.len(),
        bad.len(),
        list.join(","),
        bad.join(";")
    ));
    // Wait for LEAVE, then let go of the receive QP explicitly.
    while let Ok(line) = input.recv_timeout(Duration::from_secs(60)) {
        if line.trim() == "LEAVE" {
            break;
        }
    }
    drop(mr);
    drop(srq);
    let left = match (handle, reg) {
        (Some(h), _) => h.destroy(),
        (_, Some(r)) => r.unregister(),
        _ => Ok(0),
    };
    say(&left.map_or_else(
        |e| format!("ERR leave: {e}"),
        |n| format!("LEFT events_reported={n}"),
    ));
    drop(cq);
    drop(pd);
    drop(xrcd);
    drop(ctx);
    std::process::exit(0);
}

fn xrc_sender(socket: &Path, depth: u32) -> ! {
    let ctx = Context::open_at(socket, 0).or_fail("open device");
    let pd = ctx.alloc_pd().or_fail("alloc_pd");
    let cq = ctx.create_cq(2 * depth + 32).or_fail("create_cq");
    let cap = QpCap {
        max_send_wr: depth,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let qp = ctx
        .create_qp(&QpInit::new(QpType::XrcSend, &pd).send_cq(&cq).cap(cap))
        .or_fail("create_qp");
    let gid = ctx.query_gid(1, 0).or_fail("query_gid");
    const MAX_SIZE: usize = 4096;
    say(&format!("READY qpn={} gid={}", qp.qpn(), gid_hex(gid)));
    let input = stdin_lines();
    while let Ok(line) = input.recv() {
        let a: Vec<&str> = line.split_whitespace().collect();
        match a.first().copied() {
            Some("CONNECT") => {
                let r = connect_qp(&qp, parse_gid(a[1]), num(&a, 2), 12, 7);
                say(&r.map_or_else(|e| format!("ERR connect: {e}"), |()| "OK".into()));
            }
            // STREAM n size srqn,srqn,... mid pace_us: message i goes to srqns[i % k]; MID is
            // said once message `mid` is posted; after it, one message every pace_us.
            Some("STREAM") => {
                let (n, size): (u64, usize) = (num(&a, 1), num(&a, 2));
                let srqns: Vec<u32> = a[3].split(',').map(|s| s.parse().or_fail("srqn")).collect();
                let (mid, pace): (u64, u64) = (num(&a, 4), num(&a, 5));
                let size = size.min(MAX_SIZE);
                // One owned buffer per message in flight, of this stream's size: each is
                // handed to the QP and comes back with its completion before it is refilled.
                let mut mr = pd
                    .alloc_mr(depth as usize * size, Access::LOCAL_WRITE)
                    .or_fail("alloc_mr");
                let mut free: Vec<softverbs::Buf> =
                    (0..depth).map(|_| mr.take(size).or_fail("take")).collect();
                // The library's wr_ids of the messages in flight, in posting order.
                let mut in_flight = std::collections::VecDeque::new();
                let mut msg = vec![0u8; size];
                let (mut posted, mut done) = (0u64, 0u64);
                let mut result = None;
                let mut last = Instant::now();
                while done < n && result.is_none() {
                    while posted < n && posted - done < u64::from(depth) {
                        let srqn = srqns[(posted % srqns.len() as u64) as usize];
                        xrc_message(&mut msg, 0x5eed, posted, srqn);
                        let mut b = free
                            .pop()
                            .unwrap_or_else(|| fail("post_send", "no free buffer"));
                        b.write(0, &msg).or_fail("write");
                        let wr = SendWork::new(Op::Send, b).remote_srqn(srqn);
                        let id = qp.post(wr).map_err(|r| r.error).or_fail("post_send");
                        in_flight.push_back(id);
                        posted += 1;
                        if posted == mid + 1 {
                            say(&format!("MID {posted}"));
                        }
                        if posted > mid && pace > 0 {
                            std::thread::sleep(Duration::from_micros(pace));
                            break;
                        }
                    }
                    let wcs = cq.poll_bufs(32).or_fail("poll_cq");
                    if wcs.is_empty() {
                        if last.elapsed() > Duration::from_secs(60) {
                            result = Some(format!("ERR stalled done={done} posted={posted}"));
                        }
                        std::thread::yield_now();
                    } else {
                        last = Instant::now();
                    }
                    for c in wcs {
                        let w = &c.wc;
                        let next = in_flight.pop_front();
                        if w.status != WcStatus::Success || next.map(|i| i.0) != Some(w.wr_id) {
                            result = Some(format!(
                                "ERR completion {} (want {done} Success)",
                                wc_line(w)
                            ));
                            break;
                        }
                        free.extend(c.buf);
                        done += 1;
                    }
                }
                say(&result.unwrap_or_else(|| format!("OK sent={done}")));
            }
            Some("QUIT") => break,
            _ => say("ERR unknown command"),
        }
    }
    std::process::exit(0);
}

// ---- garbage ------------------------------------------------------------------------------

/// A second connection speaking the command protocol directly, so it can send what the
/// typed client refuses to build.
struct Raw {
    sock: OwnedFd,
    _fds: Vec<OwnedFd>,
}

impl Raw {
    fn open(socket: &Path) -> Raw {
        let sock = softverbs::connect_socket_with(socket, false).or_fail("raw connect");
        let mut raw = Raw {
            sock,
            _fds: Vec::new(),
        };
        let req = HelloReq {
            abi_version: U32::new(softverbs::ABI_VERSION),
            device: U32::new(0),
        };
        // The daemon reaches this process's memory through its own /proc/self/mem (ABI 5).
        let mem: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .or_fail("open /proc/self/mem")
            .into();
        let (_, fds) = raw
            .call_with::<HelloResp>(
                Cmd::Hello,
                softverbs_abi::msg::HELLO_MEM_FD,
                req.as_bytes(),
                &[mem.as_fd()],
            )
            .or_fail("raw hello");
        raw._fds = fds;
        raw
    }

    fn call_fds<R>(&self, cmd: Cmd, comp_mask: u64, body: &[u8]) -> Result<(R, Vec<OwnedFd>), i32>
    where
        R: FromBytes + IntoBytes + Immutable + KnownLayout + Default,
    {
        self.call_with(cmd, comp_mask, body, &[])
    }

    fn call_with<R>(
        &self,
        cmd: Cmd,
        comp_mask: u64,
        body: &[u8],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(R, Vec<OwnedFd>), i32>
    where
        R: FromBytes + IntoBytes + Immutable + KnownLayout + Default,
    {
        let msg = encode_request(cmd, comp_mask, body, std::mem::size_of::<R>());
        softverbs_ipc::send(self.sock.as_fd(), &msg, fds).map_err(|e| e.raw_os_error())?;
        let mut buf = vec![0u8; softverbs_abi::MAX_MSG];
        let d = loop {
            match softverbs_ipc::recv(self.sock.as_fd(), &mut buf) {
                Ok(Some(d)) => break d,
                Ok(None) => return Err(104),
                Err(e) if e == softverbs_ipc::IpcErrno::INTR => continue,
                Err(e) => return Err(e.raw_os_error()),
            }
        };
        match decode_response::<R>(&buf[..d.len], cmd) {
            Ok(Ok(r)) => Ok((r, d.fds)),
            Ok(Err(status)) => Err(status),
            Err(e) => Err(e.errno()),
        }
    }

    fn call<R>(&self, cmd: Cmd, body: &[u8]) -> Result<R, i32>
    where
        R: FromBytes + IntoBytes + Immutable + KnownLayout + Default,
    {
        let mask = if cmd == Cmd::CreateQp {
            CREATE_QP_CREATE_FLAGS
        } else {
            0
        };
        self.call_fds(cmd, mask, body).map(|(r, _)| r)
    }

    fn post_send(&self, qp: u32, wr: SendWrWire) -> Result<(), i32> {
        let req = PostSendReq {
            qp: U32::new(qp),
            reserved: U32::new(0),
            wr,
        };
        self.call::<()>(Cmd::PostSend, req.as_bytes())
    }
}

fn errno_or_ok<T>(r: Result<T, i32>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("errno={e}"),
    }
}

fn garbage(socket: &Path) -> ! {
    let ctx = Context::open_at(socket, 0).or_fail("open device");
    let pd = ctx.alloc_pd().or_fail("alloc_pd");
    let cq = ctx.create_cq(256).or_fail("create_cq");
    let gid = ctx.query_gid(1, 0).or_fail("query_gid");
    let buf = vec![0u8; 1 << 16];
    let base = buf.as_ptr() as u64;
    let mr = pd
        .reg_mr(raw_memory(base, buf.len()), ALL)
        .or_fail("reg_mr");
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    let bad_key = |k: u32| k ^ 0x00ab_cd00;
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let new_qp = || {
        ctx.create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap))
            .or_fail("create_qp")
    };
    // Two QPs of this context connected to each other.
    let pair = || {
        let (a, b) = (new_qp(), new_qp());
        connect_qp(&a, gid, b.qpn(), 12, 7).or_fail("connect");
        connect_qp(&b, gid, a.qpn(), 12, 7).or_fail("connect");
        (a, b)
    };
    let case = |name: &str, result: String| say(&format!("CASE {name} {result}"));
    // What a send got: the post's errno, or the status of its completion.
    let outcome = |r: softverbs::Result<()>| -> String {
        match r {
            Err(e) => format!("errno={}", e.errno),
            Ok(()) => match wait_one(&cq, Duration::from_secs(10)) {
                Some(w) => format!("wc={:?}", w.status),
                None => "no-completion".into(),
            },
        }
    };
    let drain = || while !cq.poll(32).or_fail("poll_cq").is_empty() {};
    let s1 = |off: u64, len: u32, key: u32| {
        [Sge {
            addr: base + off,
            length: len,
            lkey: key,
        }]
    };

    // The raw connection's first act: another context's handles are not its own.
    let raw = Raw::open(socket);
    {
        let (a, b) = pair();
        b.post_recv(1, &s1(0x8000, 256, lkey)).or_fail("post_recv");
        let mut wr = SendWrWire {
            wr_id: U64::new(5),
            opcode: U32::new(wr_opcode::SEND),
            num_sge: U32::new(1),
            ..SendWrWire::default()
        };
        wr.send_flags = U32::new(send_flags::SIGNALED);
        wr.sg_list[0] = SgeWire {
            addr: U64::new(base),
            length: U32::new(64),
            lkey: U32::new(lkey),
        };
        case(
            "foreign-qp-send",
            errno_or_ok(raw.post_send(a.handle(), wr)),
        );
        let rr = PostRecvReq {
            handle: U32::new(b.handle()),
            num_sge: U32::new(0),
            wr_id: U64::new(9),
            ..PostRecvReq::default()
        };
        case(
            "foreign-qp-recv",
            errno_or_ok(raw.call::<()>(Cmd::PostRecv, rr.as_bytes())),
        );
        let pc = PollCqReq {
            cq: U32::new(cq.handle()),
            max: U32::new(32),
        };
        case(
            "foreign-cq-poll",
            errno_or_ok(raw.call::<PollCqResp>(Cmd::PollCq, pc.as_bytes())),
        );
        // Nothing moved on the victim's QPs.
        let stray = cq.wait(1, Duration::from_millis(300)).or_fail("poll_cq");
        case("foreign-effects", format!("completions={}", stray.len()));
        drop((a, b));
        drain();
    }

    // The raw context's own RC QP, connected to itself, for what only raw requests can say.
    let rpd: HandleResp = raw.call(Cmd::AllocPd, &[]).or_fail("raw alloc_pd");
    let rcq: CreateCqResp = raw
        .call(
            Cmd::CreateCq,
            CreateCqReq {
                cqe: U32::new(64),
                ..CreateCqReq::default()
            }
            .as_bytes(),
        )
        .or_fail("raw create_cq");
    let creq = CreateQpReq {
        qp_type: U32::new(QpType::Rc as u32),
        present: U32::new(PRESENT_PD | PRESENT_SEND_CQ | PRESENT_RECV_CQ),
        pd: rpd.handle,
        send_cq: rcq.handle,
        recv_cq: rcq.handle,
        cap: (&cap).into(),
        ..CreateQpReq::default()
    };
    let rqp: CreateQpResp = raw
        .call(Cmd::CreateQp, creq.as_bytes())
        .or_fail("raw create_qp");
    let rmr = {
        let req = softverbs_abi::msg::RegMrReq {
            pd: rpd.handle,
            access: U32::new(ALL.0),
            addr: U64::new(base),
            length: U64::new(buf.len() as u64),
            iova: U64::new(base),
        };
        raw.call::<softverbs_abi::msg::RegMrResp>(Cmd::RegMr, req.as_bytes())
            .or_fail("raw reg_mr")
    };
    let rmodify = |attr: &QpAttr, mask: M| {
        let req = ModifyQpReq {
            handle: rqp.handle,
            attr_mask: U32::new(mask.0),
            attr: QpAttrWire::from(attr),
        };
        raw.call::<()>(Cmd::ModifyQp, req.as_bytes())
    };
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: av(gid),
        path_mtu: Mtu::M1024,
        dest_qp_num: rqp.qpn.get(),
        max_dest_rd_atomic: 8,
        min_rnr_timer: 1,
        ..init_attr()
    };
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 8,
        retry_cnt: 2,
        rnr_retry: 7,
        max_rd_atomic: 8,
        ..rtr
    };
    rmodify(&init_attr(), INIT_MASK).or_fail("raw INIT");
    rmodify(
        &rtr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .or_fail("raw RTR");
    rmodify(
        &rts,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
    .or_fail("raw RTS");
    let good_wr = |wr_id: u64| {
        let mut wr = SendWrWire {
            wr_id: U64::new(wr_id),
            opcode: U32::new(wr_opcode::SEND),
            send_flags: U32::new(send_flags::SIGNALED),
            num_sge: U32::new(1),
            ..SendWrWire::default()
        };
        wr.sg_list[0] = SgeWire {
            addr: U64::new(base + 0x100),
            length: U32::new(64),
            lkey: rmr.lkey,
        };
        wr
    };
    let rq = rqp.handle.get();
    for (name, opcode) in [
        ("opcode-0x55", 0x55u32),
        ("opcode-local-inv", 7),
        ("opcode-bind-mw", 8),
        ("opcode-tso", 10),
        ("opcode-huge", u32::MAX),
    ] {
        let mut wr = good_wr(100);
        wr.opcode = U32::new(opcode);
        case(name, errno_or_ok(raw.post_send(rq, wr)));
    }
    let mut wr = good_wr(101);
    wr.num_sge = U32::new(MAX_WIRE_SGE as u32 + 1);
    case("num-sge-17", errno_or_ok(raw.post_send(rq, wr)));
    let mut wr = good_wr(102);
    wr.num_sge = U32::new(u32::MAX);
    case("num-sge-max", errno_or_ok(raw.post_send(rq, wr)));
    let mut wr = good_wr(103);
    wr.num_sge = U32::new(cap.max_send_sge + 1);
    case("num-sge-over-cap", errno_or_ok(raw.post_send(rq, wr)));
    let mut wr = good_wr(104);
    wr.send_flags = U32::new(send_flags::SIGNALED | send_flags::INLINE);
    wr.inline_len = U32::new(100_000);
    case("inline-len-huge", errno_or_ok(raw.post_send(rq, wr)));
    let mut wr = good_wr(105);
    wr.send_flags = U32::new(send_flags::SIGNALED | send_flags::INLINE);
    wr.inline_len = U32::new(200);
    case("inline-over-cap", errno_or_ok(raw.post_send(rq, wr)));
    let rr = PostRecvReq {
        handle: U32::new(rq),
        num_sge: U32::new(u32::MAX),
        wr_id: U64::new(1),
        ..PostRecvReq::default()
    };
    case(
        "recv-num-sge-max",
        errno_or_ok(raw.call::<()>(Cmd::PostRecv, rr.as_bytes())),
    );
    case(
        "unknown-qp-handle",
        errno_or_ok(raw.post_send(0x7fff_fff0, good_wr(106))),
    );
    // Control: the raw QP still works after all that (a SEND to itself).
    let mut rr = PostRecvReq {
        handle: U32::new(rq),
        num_sge: U32::new(1),
        wr_id: U64::new(7),
        ..PostRecvReq::default()
    };
    rr.sg_list[0] = SgeWire {
        addr: U64::new(base + 0x1000),
        length: U32::new(64),
        lkey: rmr.lkey,
    };
    raw.call::<()>(Cmd::PostRecv, rr.as_bytes())
        .or_fail("raw post_recv");
    raw.post_send(rq, good_wr(108)).or_fail("raw good send");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut statuses = Vec::new();
    while statuses.len() < 2 && Instant::now() < deadline {
        let pc = PollCqReq {
            cq: rcq.handle,
            max: U32::new(32),
        };
        let r: PollCqResp = raw.call(Cmd::PollCq, pc.as_bytes()).or_fail("raw poll_cq");
        for w in &r.wc[..r.count.get() as usize] {
            statuses.push(format!("{}:{}", w.wr_id.get(), w.status.get()));
        }
        std::thread::yield_now();
    }
    statuses.sort();
    case("raw-control", statuses.join(","));
    // A destroyed QP's handle is no QP.
    raw.call::<softverbs_abi::msg::EventsResp>(
        Cmd::DestroyQp,
        softverbs_abi::msg::HandleReq {
            handle: U32::new(rq),
        }
        .as_bytes(),
    )
    .or_fail("raw destroy_qp");
    case(
        "destroyed-qp-handle",
        errno_or_ok(raw.post_send(rq, good_wr(109))),
    );
    drop(raw);

    // Through the typed client: keys and SGE counts the engine must refuse.
    {
        let q = new_qp();
        case(
            "post-in-reset",
            outcome(q.post_send(&SendRequest::new(1, SendOp::Send, &s1(0, 8, lkey)))),
        );
    }
    let sges3 = [
        Sge {
            addr: base,
            length: 8,
            lkey,
        },
        Sge {
            addr: base + 8,
            length: 8,
            lkey,
        },
        Sge {
            addr: base + 16,
            length: 8,
            lkey,
        },
    ];
    {
        let (a, b) = pair();
        let n = a.cap().max_send_sge as usize + 1;
        let many: Vec<Sge> = (0..n)
            .map(|i| Sge {
                addr: base + 8 * i as u64,
                length: 8,
                lkey,
            })
            .collect();
        case(
            "send-sges-over-cap",
            outcome(a.post_send(&SendRequest::new(
                1,
                SendOp::Send,
                if n <= 16 { &many } else { &sges3 },
            ))),
        );
        let n = b.cap().max_recv_sge as usize + 1;
        let many: Vec<Sge> = (0..n)
            .map(|i| Sge {
                addr: base + 8 * i as u64,
                length: 8,
                lkey,
            })
            .collect();
        case("recv-sges-over-cap", outcome(b.post_recv(1, &many)));
        let r = a.post_send(&SendRequest::new(
            2,
            SendOp::FetchAdd {
                remote_addr: base + 0x100,
                rkey,
                add: 1,
            },
            &s1(0x200, 4, lkey),
        ));
        case("atomic-len-4", outcome(r));
        drain();
    }
    {
        // A 2 GiB gather entry over a 64 KiB region, towards a 256-byte receive.
        let (a, b) = pair();
        b.post_recv(1, &s1(0x8000, 256, lkey)).or_fail("post_recv");
        let r = a.post_send(&SendRequest::new(
            3,
            SendOp::Send,
            &[Sge {
                addr: base,
                length: 0x8000_0000,
                lkey,
            }],
        ));
        case("send-2gib", outcome(r));
        drain();
    }
    {
        let (a, b) = pair();
        b.post_recv(1, &s1(0x8000, 256, lkey)).or_fail("post_recv");
        let r = a.post_send(&SendRequest::new(
            10,
            SendOp::Send,
            &s1(0, 64, bad_key(lkey)),
        ));
        case("send-bad-lkey", outcome(r));
        drain();
    }
    {
        let (a, b) = pair();
        b.post_recv(1, &s1(0x8000, 256, lkey)).or_fail("post_recv");
        let r = a.post_send(&SendRequest::new(10, SendOp::Send, &s1(0xfff0, 64, lkey)));
        case("send-sge-past-mr", outcome(r));
        drain();
    }
    {
        let (a, _b) = pair();
        let r = a.post_send(&SendRequest::new(
            11,
            SendOp::Read {
                remote_addr: base,
                rkey,
            },
            &s1(0x100, 64, bad_key(lkey)),
        ));
        case("read-bad-local-lkey", outcome(r));
        drain();
    }
    {
        let (a, _b) = pair();
        let r = a.post_send(&SendRequest::new(
            12,
            SendOp::Write {
                remote_addr: base + 0x100,
                rkey: bad_key(rkey),
            },
            &s1(0, 64, lkey),
        ));
        case("write-bad-rkey", outcome(r));
        drain();
    }
    {
        let (a, _b) = pair();
        let r = a.post_send(&SendRequest::new(
            13,
            SendOp::Write {
                remote_addr: base + 0xffc0,
                rkey,
            },
            &s1(0, 256, lkey),
        ));
        case("write-past-mr", outcome(r));
        drain();
    }
    {
        let (a, _b) = pair();
        let r = a.post_send(&SendRequest::new(
            14,
            SendOp::Read {
                remote_addr: base.wrapping_sub(4096),
                rkey,
            },
            &s1(0, 64, lkey),
        ));
        case("read-before-mr", outcome(r));
        drain();
    }
    {
        let (a, _b) = pair();
        let op = SendOp::FetchAdd {
            remote_addr: base + 0x103,
            rkey,
            add: 1,
        };
        case(
            "atomic-unaligned",
            outcome(a.post_send(&SendRequest::new(15, op, &s1(0x200, 8, lkey)))),
        );
        drain();
    }
    {
        let (a, _b) = pair();
        // The receiver posted nothing and RNR retries are infinite: no completion, no crash.
        let r = a.post_send(&SendRequest::new(16, SendOp::Send, &s1(0, 64, lkey)));
        let got = cq.wait(1, Duration::from_millis(500)).or_fail("poll_cq");
        let st: Vec<String> = got.iter().map(|w| format!("{:?}", w.status)).collect();
        case(
            "send-no-recv",
            format!(
                "{} completions=[{}]",
                errno_or_ok(r.map_err(|e| e.errno)),
                st.join(",")
            ),
        );
    }
    {
        let (a, b) = pair();
        b.post_recv(1, &s1(0x8000, 256, bad_key(lkey)))
            .or_fail("post_recv");
        let r = a.post_send(&SendRequest::new(17, SendOp::Send, &s1(0, 64, lkey)));
        let sender = outcome(r);
        let all = cq.wait(1, Duration::from_secs(2)).or_fail("poll_cq");
        let rest: Vec<String> = all
            .iter()
            .map(|w| format!("{}:{:?}", w.wr_id, w.status))
            .collect();
        case(
            "recv-bad-lkey",
            format!("{sender} other={}", rest.join(",")),
        );
        drain();
    }
    // Control: a clean pair still moves data.
    {
        let (a, b) = pair();
        let mut data = vec![0u8; 4096];
        fill(&mut data, 99, 0);
        let dpd = &pd;
        let dmr = dpd
            .reg_mr(raw_memory(data.as_ptr() as u64, 4096), ALL)
            .or_fail("reg_mr");
        b.post_recv(1, &s1(0x4000, 4096, lkey)).or_fail("post_recv");
        let s = [Sge {
            addr: data.as_ptr() as u64,
            length: 4096,
            lkey: dmr.lkey(),
        }];
        a.post_send(&SendRequest::new(2, SendOp::Send, &s))
            .or_fail("post_send");
        let w = cq.wait(2, Duration::from_secs(10)).or_fail("poll_cq");
        let ok = w.len() == 2
            && w.iter().all(|w| w.status == WcStatus::Success)
            && mismatch(&buf[0x4000..0x5000], 99, 0).is_none();
        case("control", if ok { "ok".into() } else { format!("{w:?}") });
    }
    say("DONE");
    std::process::exit(0);
}
