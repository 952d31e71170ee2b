//! A client's pid reused by an unrelated process gives no access to that process's memory
//! (issue 10, item 1; docs/design/registered-memory.md, "Which process").
//!
//! The client (this test binary re-run in the `client_role`) registers a plain (not shared)
//! MR, connects two RC QPs to the test's own QPs, forks a child that keeps the connection
//! (so the context and its MR live on) and exits. The test reaps it and creates a victim
//! with exactly the client's pid (`clone3` with `set_tid`, root only), holding other bytes
//! at the MR's address. An RDMA WRITE and an RDMA READ on the dead client's MR must then end
//! in error completions, the victim's memory must be unchanged, and nothing of it may come
//! back. The forked child's own `reg_mr` on the inherited context is refused (`EPERM`).
//!
//! Stays on the raw API (`RawMemory`, `reg_mr`, raw SGEs): the test is about the plain,
//! address-based registration (the drop-in's path, reached with `process_vm_*` by pid) and
//! what happens when that address later belongs to another process, which the owning API
//! rules out by construction.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use softverbs::{Access, Context, QpCap, QpInit, QpType};
use softverbs::{SendOp, SendRequest, Sge, WcStatus};
use softverbs_daemon::{spawn_daemon_with, Config};

mod common;
use common::connect;

/// Names a test buffer (or a deliberately foreign address) for the raw registration these
/// tests exercise: the drop-in's path, whose promise (`RawMemory::new`) the tests keep by
/// reading their buffers only after the completions of the requests that write them, or
/// bend on purpose where they probe what the daemon does with memory that is not theirs.
#[allow(dead_code)]
fn raw(addr: u64, len: u64) -> softverbs::RawMemory {
    // SAFETY: see above; test buffers outlive their MRs.
    unsafe { softverbs::RawMemory::new(addr as usize, len as usize) }
}

/// [`raw`], for the in-place conversion (no other thread touches the test's buffers while
/// they are registered).
#[allow(dead_code)]
fn raw_shareable(addr: u64, len: u64) -> softverbs::RawMemory {
    // SAFETY: as for `raw`; and nothing else writes the pages during the registration.
    unsafe { softverbs::RawMemory::new_shareable(addr as usize, len as usize) }
}

const ROLE: &str = "SOFTVERBS_PID_REUSE_ROLE";
const SOCKET: &str = "SOFTVERBS_PID_REUSE_SOCKET";
/// Where the client's buffer and the victim's bytes live (both map it with
/// `MAP_FIXED_NOREPLACE`, so nothing else is ever replaced).
const ADDR: usize = 0x5e5e_0000_0000;
const LEN: usize = 4 * 4096;
/// The client's bytes, the victim's, and what the attacker writes.
const CLIENT_BYTE: u8 = 0x50;
const VICTIM_BYTE: u8 = 0x56;
const ATTACK_BYTE: u8 = 0x57;
const ALL: Access = Access(0x0f);
const WAIT: Duration = Duration::from_secs(20);

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// `LEN` bytes of `byte` at `ADDR`, mapped fresh (never over an existing mapping).
fn map_fixed(byte: u8) -> *mut u8 {
    // SAFETY: MAP_FIXED_NOREPLACE fails instead of replacing anything mapped at ADDR.
    let p = unsafe {
        rustix::mm::mmap_anonymous(
            ADDR as *mut _,
            LEN,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED_NOREPLACE,
        )
    }
    .expect("map the buffer at its fixed address");
    assert_eq!(p as usize, ADDR);
    // SAFETY: the fresh mapping of LEN bytes just created.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), byte, LEN) };
    p.cast()
}

/// Not a test: the client's entry point (does nothing in a normal run). Protocol on
/// stdin/stdout: `READY <rkey> <qpn1> <qpn2>`, ← `CONNECT <qpn1> <qpn2>`, `CONNECTED`,
/// ← `FORK`, then the forked child prints `CHILD <pid> <errno of its reg_mr>` and the client
/// exits without tearing anything down.
#[test]
fn client_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    assert_eq!(role, "client");
    let socket = std::env::var(SOCKET).unwrap();
    let ctx = Context::open_at(socket.as_ref(), 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qps = [0, 1].map(|_| {
        ctx.create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
            .unwrap()
    });
    map_fixed(CLIENT_BYTE);
    let mr = pd.reg_mr(raw(ADDR as u64, LEN as u64), ALL).unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {} {} {}", mr.rkey(), qps[0].qpn(), qps[1].qpn()).unwrap();
    out.flush().unwrap();
    let mut lines = BufReader::new(std::io::stdin()).lines();
    let line = lines.next().unwrap().unwrap();
    let w: Vec<u32> = line
        .strip_prefix("CONNECT ")
        .unwrap()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let gid = ctx.query_gid(1, 0).unwrap();
    connect(&qps[0], gid, w[0]);
    connect(&qps[1], gid, w[1]);
    writeln!(out, "CONNECTED").unwrap();
    out.flush().unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "FORK");
    drop(out);
    // SAFETY: the child only registers memory on the inherited context, prints, and waits
    // for the end of its input; the other thread of this process (the test harness's main
    // thread) is blocked waiting for this test, holding no lock the child needs.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let own = vec![0u8; 2 * LEN];
        let errno = match pd.reg_mr(raw(own.as_ptr() as u64, own.len() as u64), ALL) {
            Ok(_) => 0,
            Err(e) => e.errno(),
        };
        println!("CHILD {} {errno}", std::process::id());
        // Holds the connection (and so the context and its MR) until the test closes its
        // end of our stdin (or dies). No one ever kills it by pid: pids get reused here.
        let mut rest = String::new();
        while std::io::stdin().read_line(&mut rest).is_ok_and(|n| n > 0) {}
        // SAFETY: ends the child without running the parent's destructors or exit hooks.
        unsafe { libc::_exit(0) };
    }
    // The client goes away without closing anything (as a crash would): its objects live
    // on in the context the child holds.
    std::process::exit(0);
}

/// `struct clone_args` (linux/sched.h, clone3(2)), the fields up to `set_tid_size`.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
}

/// A victim process with pid `pid` holding `VICTIM_BYTE`s at `ADDR`: it signals `ready`
/// once mapped, waits for a byte on the returned pipe, and exits with 0 if its bytes are
/// intact, 3 if any changed.
fn spawn_victim(pid: i32) -> std::io::Result<(i32, OwnedFd)> {
    let (ready_r, ready_w) = rustix::pipe::pipe()?;
    let (go_r, go_w) = rustix::pipe::pipe()?;
    let tid = [pid];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tid.as_ptr() as u64,
        set_tid_size: 1,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM is a fork: the child runs on a copy of this thread's
    // stack and address space. It makes only raw system calls (mmap, write, read, _exit) and
    // touches only its own copy of memory, so no lock another thread held can stall it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if r == 0 {
        // SAFETY: raw calls on this process's own descriptors and a fresh mapping.
        unsafe {
            let p = libc::mmap(
                ADDR as *mut _,
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            );
            if p as usize != ADDR {
                libc::_exit(2);
            }
            let b = p.cast::<u8>();
            for i in 0..LEN {
                b.add(i).write_volatile(VICTIM_BYTE);
            }
            libc::write(ready_w.as_raw_fd(), b"r".as_ptr().cast(), 1);
            let mut c = 0u8;
            libc::read(go_r.as_raw_fd(), (&mut c as *mut u8).cast(), 1);
            let intact = (0..LEN).all(|i| b.add(i).read_volatile() == VICTIM_BYTE);
            libc::_exit(if intact { 0 } else { 3 });
        }
    }
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop((ready_w, go_r));
    let mut c = [0u8; 1];
    assert_eq!(
        rustix::io::read(&ready_r, &mut c).unwrap(),
        1,
        "victim ready"
    );
    Ok((r as i32, go_w))
}

#[test]
fn a_reused_pid_reaches_nothing_of_the_new_process() {
    if !rustix::process::geteuid().is_root() {
        println!("skipped: creating a process with a chosen pid (clone3 set_tid) needs root");
        return;
    }
    let dir = std::env::temp_dir().join(format!("svpidreuse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("sv.sock");
    let daemon = spawn_daemon_with(Config::new(socket.clone())).unwrap();

    let mut client = Command::new(std::env::current_exe().unwrap())
        .args(["client_role", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, "client")
        .env(SOCKET, &socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let client_pid = client.id() as i32;
    let mut to_client = client.stdin.take().unwrap();
    let mut from_client = BufReader::new(client.stdout.take().unwrap()).lines();
    // The harness prints its own words too ("test client_role ... " before our first line):
    // ours start at a keyword.
    let mut expect = |word: &str| -> Vec<u32> {
        loop {
            let line = from_client.next().expect("client output").unwrap();
            if let Some(at) = line.find(word) {
                let rest = &line[at + word.len()..];
                return rest
                    .split_whitespace()
                    .map(|x| x.parse().unwrap())
                    .collect();
            }
        }
    };
    let ready = expect("READY");
    let (rkey, client_qpns) = (ready[0], [ready[1], ready[2]]);

    let ctx = Context::open_at(&socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qps = [0, 1].map(|_| {
        ctx.create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
            .unwrap()
    });
    let gid = ctx.query_gid(1, 0).unwrap();
    connect(&qps[0], gid, client_qpns[0]);
    connect(&qps[1], gid, client_qpns[1]);
    writeln!(to_client, "CONNECT {} {}", qps[0].qpn(), qps[1].qpn()).unwrap();
    expect("CONNECTED");

    let local = vec![0u8; 2 * LEN];
    let lmr = pd
        .reg_mr(raw(local.as_ptr() as u64, local.len() as u64), ALL)
        .unwrap();
    let read = |wr_id: u64, at: usize| {
        let sge = [Sge {
            addr: local.as_ptr() as u64 + at as u64,
            length: LEN as u32,
            lkey: lmr.lkey(),
        }];
        qps[0]
            .post_send(&SendRequest::new(
                wr_id,
                SendOp::Read {
                    remote_addr: ADDR as u64,
                    rkey,
                },
                &sge,
            ))
            .unwrap();
        let wc = cq.wait(1, WAIT).unwrap();
        assert_eq!(wc.len(), 1, "one completion within {WAIT:?}");
        wc[0].status
    };
    // While the client lives, its MR works: the READ brings its bytes.
    assert_eq!(read(1, 0), WcStatus::Success);
    assert!(local[..LEN].iter().all(|&b| b == CLIENT_BYTE));

    writeln!(to_client, "FORK").unwrap();
    let child_reg_errno = expect("CHILD")[1] as i32;
    assert!(client.wait().unwrap().success(), "the client exits cleanly");
    // Reaped: its pid is free. Give it to a victim.
    let (victim, go) = match spawn_victim(client_pid) {
        Ok(v) => v,
        Err(e) => panic!("clone3 with set_tid {client_pid}: {e}"),
    };
    assert_eq!(victim, client_pid, "the victim has the client's pid");

    // The attacker (this test) reads and then writes the dead client's MR.
    let read_status = read(2, LEN);
    let attack = vec![ATTACK_BYTE; LEN];
    let amr = pd
        .reg_mr(raw(attack.as_ptr() as u64, attack.len() as u64), ALL)
        .unwrap();
    let sge = [Sge {
        addr: attack.as_ptr() as u64,
        length: LEN as u32,
        lkey: amr.lkey(),
    }];
    qps[1]
        .post_send(&SendRequest::new(
            3,
            SendOp::Write {
                remote_addr: ADDR as u64,
                rkey,
            },
            &sge,
        ))
        .unwrap();
    let write_wc = cq.wait(1, WAIT).unwrap();

    rustix::io::write(&go, b"g").unwrap();
    let mut status = 0;
    // SAFETY: waitpid(2) on the victim, this test's own child.
    let waited = unsafe { libc::waitpid(victim, &mut status, 0) };
    assert_eq!(waited, victim);
    assert!(libc::WIFEXITED(status), "victim status {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the victim's memory was overwritten through the dead client's MR"
    );
    assert!(
        !local[LEN..].contains(&VICTIM_BYTE),
        "the victim's bytes came back in an RDMA READ of the dead client's MR"
    );
    assert_eq!(write_wc.len(), 1, "the WRITE completes within {WAIT:?}");
    assert_ne!(write_wc[0].status, WcStatus::Success, "RDMA WRITE");
    assert_ne!(read_status, WcStatus::Success, "RDMA READ");
    assert_eq!(
        child_reg_errno,
        libc::EPERM,
        "a forked child registering memory on the inherited context"
    );

    // The forked child (and the victim, already gone) end with our end of their stdin.
    drop(to_client);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
