//! Two processes: this test binary re-runs itself as the child (`--exact child`), with the
//! memfd and the doorbells inherited as plain descriptors whose numbers travel in
//! environment variables, exactly as the daemon and a client would share them after
//! passing them over the socket.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::process::{Child, Command};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::io::{fcntl_dupfd_cloexec, fcntl_setfd, FdFlags};
use softverbs_shm::{Consumer, Doorbell, Producer, PushError, Region, RingLayout};

const ROLE: &str = "SOFTVERBS_SHM_TEST_ROLE";
const FDS: &str = "SOFTVERBS_SHM_TEST_FDS";
const ENTRY: u32 = 32;
const CAP: u32 = 64;
const N: u64 = 100_000;
const STOP: u64 = u64::MAX;

fn layout() -> RingLayout {
    RingLayout::new(CAP, ENTRY).unwrap()
}

/// Ring `a` (parent → child) at 0, ring `b` (child → parent) after it.
fn offsets() -> (usize, usize) {
    (0, layout().size())
}

fn region_len() -> usize {
    2 * layout().size()
}

fn entry(seq: u64, value: u64) -> [u8; ENTRY as usize] {
    let mut e = [0u8; ENTRY as usize];
    e[..8].copy_from_slice(&seq.to_le_bytes());
    e[8..16].copy_from_slice(&value.to_le_bytes());
    e[16..24].copy_from_slice(&(!seq).to_le_bytes());
    e
}

fn fields(e: &[u8]) -> (u64, u64, u64) {
    let w = |i: usize| u64::from_le_bytes(e[i * 8..i * 8 + 8].try_into().unwrap());
    (w(0), w(1), w(2))
}

/// Starts this binary as the child in `role`, handing it `fds` (in this order).
fn spawn_child(role: &str, fds: &[BorrowedFd<'_>]) -> Child {
    // Inheritable duplicates: the originals stay close-on-exec; only these cross `exec`.
    let dups: Vec<OwnedFd> = fds
        .iter()
        .map(|fd| {
            let d = fcntl_dupfd_cloexec(fd, 3).unwrap();
            fcntl_setfd(&d, FdFlags::empty()).unwrap();
            d
        })
        .collect();
    let numbers: Vec<String> = dups.iter().map(|d| d.as_raw_fd().to_string()).collect();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(FDS, numbers.join(","))
        .spawn()
        .unwrap();
    drop(dups); // the child has its own copies now
    child
}

fn wait_child(mut child: Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "child failed: {status}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child did not finish in {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The child's entry point; a no-op in a normal test run.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let fds: Vec<OwnedFd> = std::env::var(FDS)
        .unwrap()
        .split(',')
        .map(|n| {
            let n: i32 = n.parse().unwrap();
            // SAFETY: the parent passed these descriptor numbers for us to own; nothing
            // else in this process uses them.
            unsafe { OwnedFd::from_raw_fd(n) }
        })
        .collect();
    let mut fds = fds.into_iter();
    let region = Arc::new(Region::map(fds.next().unwrap(), region_len()).unwrap());
    match role.as_str() {
        "echo" => {
            let to_child = Doorbell::from_fd(fds.next().unwrap()).unwrap();
            let to_parent = Doorbell::from_fd(fds.next().unwrap()).unwrap();
            echo(region, &to_child, &to_parent);
        }
        "scribble" => scribble(&region),
        other => panic!("unknown role {other}"),
    }
}

/// Child: pops from ring `a`, checks the sequence, pushes `value * 3 + 1` back on `b`.
fn echo(region: Arc<Region>, bell: &Doorbell, parent: &Doorbell) {
    let (a, b) = offsets();
    let mut rx = Consumer::attach(region.clone(), a, layout()).unwrap();
    let mut tx = Producer::attach(region, b, layout()).unwrap();
    let mut buf = [0u8; ENTRY as usize];
    let mut expect = 0u64;
    let mut rings = 0u64;
    loop {
        if !rx.pop(&mut buf).unwrap() {
            // Adaptive: a few yielding polls, then sleep on the doorbell.
            assert!(
                rx.wait(bell, 50, Some(Duration::from_secs(20))).unwrap(),
                "parent went quiet"
            );
            continue;
        }
        let (seq, value, check) = fields(&buf);
        if seq == STOP {
            break;
        }
        assert_eq!(
            (seq, check),
            (expect, !expect),
            "child saw a gap, duplicate or torn entry"
        );
        expect += 1;
        // The parent keeps at most CAP entries in flight, so `b` always has room.
        if tx.push(&entry(seq, value * 3 + 1)).unwrap() {
            parent.ring();
            rings += 1;
        }
    }
    assert_eq!(expect, N);
    eprintln!(
        "child {}: echoed {N} entries, rang the parent {rings} times",
        std::process::id()
    );
}

/// Child: a hostile peer writing pseudo-random values over both ring headers.
fn scribble(region: &Region) {
    let (a, b) = offsets();
    let header = softverbs_shm::CACHE_LINE * 4;
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        for base in [a, b] {
            for off in (base..base + header).step_by(4) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                region.atomic_u32(off).store(x as u32, Ordering::Relaxed);
            }
        }
    }
}

#[test]
fn child_process_echoes_entries() {
    let (region, memfd) = Region::create("two-process", region_len()).unwrap();
    let region = Arc::new(region);
    let (a, b) = offsets();
    layout().init(&region, a).unwrap();
    layout().init(&region, b).unwrap();
    let to_child = Doorbell::new().unwrap();
    let to_parent = Doorbell::new().unwrap();
    let child = spawn_child(
        "echo",
        &[memfd.as_fd(), to_child.as_fd(), to_parent.as_fd()],
    );
    drop(memfd); // the mapping keeps the memory alive

    let mut tx = Producer::attach(region.clone(), a, layout()).unwrap();
    let mut rx = Consumer::attach(region, b, layout()).unwrap();
    let (mut sent, mut received, mut rings) = (0u64, 0u64, 0u64);
    let mut buf = [0u8; ENTRY as usize];
    while received < N {
        // Post while the window allows, then reap everything there is.
        let mut progressed = false;
        while sent < N && sent - received < u64::from(CAP) {
            match tx.stage(&entry(sent, sent + 7)) {
                Ok(()) => sent += 1,
                Err(PushError::Full) => break,
                Err(e) => panic!("{e}"),
            }
            progressed = true;
        }
        if tx.publish() {
            to_child.ring();
            rings += 1;
        }
        while rx.pop(&mut buf).unwrap() {
            let (seq, value, check) = fields(&buf);
            assert_eq!(
                (seq, value, check),
                (received, (received + 7) * 3 + 1, !received)
            );
            received += 1;
            progressed = true;
        }
        if !progressed {
            assert!(
                rx.wait(&to_parent, 50, Some(Duration::from_secs(20)))
                    .unwrap(),
                "child went quiet"
            );
        }
    }
    if tx.push(&entry(STOP, 0)).unwrap() {
        to_child.ring();
    }
    wait_child(child, Duration::from_secs(60));
    assert!(!rx.pop(&mut buf).unwrap(), "nothing beyond the echoes");
    eprintln!("parent: {N} round trips, rang the child {rings} times");
}

#[test]
fn hostile_child_scribbling_headers_is_detected() {
    let (region, memfd) = Region::create("hostile", region_len()).unwrap();
    let region = Arc::new(region);
    let (a, b) = offsets();
    layout().init(&region, a).unwrap();
    layout().init(&region, b).unwrap();
    let mut tx = Producer::attach(region.clone(), a, layout()).unwrap();
    let mut rx = Consumer::attach(region, b, layout()).unwrap();
    let child = spawn_child("scribble", &[memfd.as_fd()]);
    let mut buf = [0u8; ENTRY as usize];
    let (mut tx_err, mut rx_err) = (None, None);
    let mut seq = 0u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while (tx_err.is_none() || rx_err.is_none()) && Instant::now() < deadline {
        if tx_err.is_none() {
            match tx.push(&entry(seq, 0)) {
                Ok(_) | Err(PushError::Full) => seq += 1,
                Err(PushError::Corrupt(c)) => tx_err = Some(c),
            }
        }
        if rx_err.is_none() {
            // Garbage entries may come out; what matters is that nothing outside the ring is
            // touched and an impossible index is reported.
            if let Err(c) = rx.pop(&mut buf) {
                rx_err = Some(c);
            }
        }
    }
    wait_child(child, Duration::from_secs(30));
    let (tx_err, rx_err) = (
        tx_err.expect("producer never noticed"),
        rx_err.expect("consumer never noticed"),
    );
    eprintln!("producer saw: {tx_err}\nconsumer saw: {rx_err}");
    assert_eq!(tx.push(&entry(0, 0)), Err(PushError::Corrupt(tx_err)));
    assert_eq!(rx.pop(&mut buf), Err(rx_err));
}
