//! A stopped process does not fail its peers (issue 35, item 7; docs/design/net-path.md,
//! "Stalls"): a receiver SIGSTOPped mid-transfer for 3 s (30 s in the ignored variants, run
//! with `cargo test -p softverbs --test stopped_peer -- --ignored`), then SIGCONTed: its
//! sender's requests all complete with success — no `RETRY_EXC_ERR` — and the receiver got
//! every message once, in order, whole. The receiver is on each path in turn: the daemon's
//! engine (`SOFTVERBS_NET=0`), the same-host direct path, and the net path. The sender's
//! retries (ACK timeout 4.096 µs · 2^14 ≈ 67 ms, seven retries, as `ibv_rc_pingpong` sets
//! them) would run out within about half a second of silence.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use softverbs::{BorrowedMr, Context, Gid, Pd, QpInit, QpType, SendOp, SendRequest, Sge, WcStatus};

use common::{cap, connect_with, daemon, RcPath, Reaped, ALL};

const T: Duration = Duration::from_secs(60);
/// Messages per transfer, and the one after whose completion the receiver is stopped.
const N: u64 = 600;
const STOP_AT: u64 = 200;
const LEN: usize = 2048;
const SLOTS: u64 = 64;
const WINDOW: u64 = 32;

fn lend<'a>(pd: &'a Pd<'a>, buf: &'a mut [u8]) -> BorrowedMr<'a> {
    pd.reg_slice(buf, ALL).unwrap()
}

fn path() -> RcPath {
    RcPath {
        timeout: 14,
        ..RcPath::default()
    }
}

/// Message `seq`: its number, then bytes that depend on it.
fn message(seq: u64) -> Vec<u8> {
    let mut m = seq.to_le_bytes().to_vec();
    m.extend((0..LEN - 8).map(|i| (seq as usize * 31 + i) as u8));
    m
}

/// The receiver; this is its body when `SV_STOP_CHILD` names its daemon's socket (does
/// nothing as a test).
#[test]
fn stopped_receiver_process() {
    let Some(socket) = std::env::var_os("SV_STOP_CHILD") else {
        return;
    };
    let b = Context::open_at(std::path::Path::new(&socket), 0).unwrap();
    let pb = b.alloc_pd().unwrap();
    let cqb = b.create_cq(64).unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let g = b.query_gid(1, 0).unwrap();
    println!("qpn {} gid {}", qb.qpn(), g.to_ip());
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let (qpn, ip) = line.trim().split_once(' ').unwrap();
    connect_with(
        &qb,
        Gid::from_ip(ip.parse().unwrap()),
        qpn.parse().unwrap(),
        path(),
    );
    let mut buf = vec![0u8; SLOTS as usize * LEN];
    let mb = lend(&pb, &mut buf);
    for k in 0..SLOTS {
        let s = [mb.sge(k as usize * LEN, LEN).unwrap()];
        qb.post_recv(k, &s).unwrap();
    }
    let on = if qb.is_net() {
        "net"
    } else if qb.is_direct() {
        "direct"
    } else {
        "daemon"
    };
    println!("ready {on}");
    let mut next = 0u64;
    while next < N {
        for w in cqb.poll(16).unwrap() {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            let mut got = vec![0u8; LEN];
            mb.read(w.wr_id as usize * LEN, &mut got).unwrap();
            assert_eq!(w.byte_len as usize, LEN);
            assert!(got == message(next), "message {next} arrived wrong");
            next += 1;
            let s = [mb.sge(w.wr_id as usize * LEN, LEN).unwrap()];
            qb.post_recv(w.wr_id, &s).unwrap();
        }
    }
    println!("done {next}");
    // Stay until the parent has read the line (EOF on stdin).
    let _ = std::io::stdin().lock().read_line(&mut line);
}

/// The receiver's path: its environment, and whether both processes use one daemon.
#[derive(Clone, Copy, Debug, PartialEq)]
enum On {
    Daemon,
    Direct,
    Net,
}

fn transfer(on: On, tag: &str, net: u8, stop: Duration) {
    use rustix::process::{kill_process, waitpid, Pid, Signal, WaitOptions};
    let (d1, _x) = daemon(&format!("{tag}a"), Some(&format!("127.94.{net}.1")));
    let (d2, _y) = daemon(&format!("{tag}b"), Some(&format!("127.94.{net}.2")));
    let theirs = if on == On::Direct { &d1 } else { &d2 };
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "stopped_receiver_process", "--nocapture"])
        .env("SV_STOP_CHILD", &theirs.socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    if on == On::Daemon {
        cmd.env("SOFTVERBS_NET", "0");
    }
    let mut child = Reaped(cmd.spawn().unwrap());
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    let mut expect = |prefix: &str| -> String {
        loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
            if let Some(rest) = line.trim().strip_prefix(prefix) {
                return rest.to_string();
            }
        }
    };
    let peer = expect("qpn ");
    let (qpn, ip) = peer.split_once(" gid ").unwrap();
    let a = Context::open_at(&d1.socket, 0).unwrap();
    let pa = a.alloc_pd().unwrap();
    let cqa = a.create_cq(64).unwrap();
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    connect_with(
        &qa,
        Gid::from_ip(ip.parse().unwrap()),
        qpn.parse().unwrap(),
        path(),
    );
    let ga = a.query_gid(1, 0).unwrap();
    writeln!(
        child.0.stdin.as_mut().unwrap(),
        "{} {}",
        qa.qpn(),
        ga.to_ip()
    )
    .unwrap();
    let path = expect("ready ");
    let want = match on {
        On::Daemon => "daemon",
        On::Direct => "direct",
        On::Net => "net",
    };
    assert_eq!(path, want, "the receiver's path");
    let mut abuf = vec![0u8; SLOTS as usize * LEN];
    let ma = lend(&pa, &mut abuf);
    let pid = Pid::from_raw(child.0.id() as i32).unwrap();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut stopped_until: Option<Instant> = None;
    let started = Instant::now();
    let mut stopped_at = None;
    let mut resumed_at = None;
    let mut resumed = false;
    let end = Instant::now() + T + stop;
    while done < N {
        assert!(Instant::now() < end, "{done} of {N} completed");
        while posted < N && posted - done < WINDOW {
            let slot = (posted % SLOTS) as usize * LEN;
            ma.write(slot, &message(posted)).unwrap();
            let s: [Sge; 1] = [ma.sge(slot, LEN).unwrap()];
            qa.post_send(&SendRequest::new(posted, SendOp::Send, &s))
                .unwrap();
            posted += 1;
        }
        for w in cqa.poll(16).unwrap() {
            assert_eq!(
                (w.wr_id, w.status),
                (done, WcStatus::Success),
                "at {:?}: stopped at {stopped_at:?}, resumed at {resumed_at:?}",
                started.elapsed()
            );
            done += 1;
        }
        if done >= STOP_AT && stopped_until.is_none() {
            kill_process(pid, Signal::STOP).unwrap();
            // Until the kernel has it stopped (no guess at how long that takes).
            waitpid(Some(pid), WaitOptions::UNTRACED).unwrap();
            stopped_until = Some(Instant::now() + stop);
            stopped_at = Some(started.elapsed());
        }
        match stopped_until {
            Some(t) if !resumed && Instant::now() >= t => {
                kill_process(pid, Signal::CONT).unwrap();
                resumed = true;
                resumed_at = Some(started.elapsed());
            }
            // Stopped: the sender keeps polling (its requests wait), without hogging a CPU.
            Some(_) if !resumed => std::thread::sleep(Duration::from_millis(1)),
            _ => {}
        }
    }
    assert!(resumed, "the receiver was stopped mid-transfer");
    assert_eq!(
        expect("done "),
        N.to_string(),
        "the receiver got everything"
    );
}

#[test]
fn a_receiver_on_the_daemon_path_stopped_3s_fails_nobody() {
    transfer(On::Daemon, "spd", 1, Duration::from_secs(3));
}

#[test]
fn a_receiver_on_the_direct_path_stopped_3s_fails_nobody() {
    transfer(On::Direct, "spc", 2, Duration::from_secs(3));
}

#[test]
fn a_receiver_on_the_net_path_stopped_3s_fails_nobody() {
    transfer(On::Net, "spn", 3, Duration::from_secs(3));
}

#[test]
#[ignore = "30 s: run with --ignored"]
fn a_receiver_on_the_daemon_path_stopped_30s_fails_nobody() {
    transfer(On::Daemon, "sld", 4, Duration::from_secs(30));
}

#[test]
#[ignore = "30 s: run with --ignored"]
fn a_receiver_on_the_direct_path_stopped_30s_fails_nobody() {
    transfer(On::Direct, "slc", 5, Duration::from_secs(30));
}

#[test]
#[ignore = "30 s: run with --ignored"]
fn a_receiver_on_the_net_path_stopped_30s_fails_nobody() {
    transfer(On::Net, "sln", 6, Duration::from_secs(30));
}
