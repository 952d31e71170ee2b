//! The owning API: memory the library allocates as shared memory ([`Pd::alloc_mr`]) or
//! borrows ([`Pd::reg_slice`]), buffers that move into work requests and come back with
//! their completions, and the misuses the library refuses before posting.

mod common;

use std::time::Duration;

use common::{cap, connect, daemon, ALL};
use softverbs::{Context, Op, QpInit, QpType, SendWork, Sge, WcOpcode, WcStatus, WrError};
use softverbs_daemon::TestDaemon;

const T: Duration = Duration::from_secs(20);

/// Is the page at `addr` a memfd mapping (the daemon's no-system-call path)?
fn memfd_backed(addr: u64) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|l| {
        let (range, rest) = l.split_once(' ').unwrap();
        let (lo, hi) = range.split_once('-').unwrap();
        let lo = u64::from_str_radix(lo, 16).unwrap();
        let hi = u64::from_str_radix(hi, 16).unwrap();
        lo <= addr && addr < hi && rest.contains("memfd:softverbs-mr")
    })
}

/// Every RC operation of the data-path test, through owned buffers: the same bytes land in
/// the same places, and each buffer comes back with its completion.
fn rc_operations(da: &TestDaemon, db: &TestDaemon) {
    let a = Context::open_at(&da.socket, 0).unwrap();
    let b = Context::open_at(&db.socket, 0).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    connect(&qa, gb, qb.qpn());
    connect(&qb, ga, qa.qpn());

    let mut ma = pa.alloc_mr(64 << 10, ALL).unwrap();
    let mut mb = pb.alloc_mr(64 << 10, ALL).unwrap();
    assert!(memfd_backed(ma.remote().addr) && memfd_backed(mb.remote().addr));
    let pattern: Vec<u8> = (0..6000).map(|i| (i * 31 % 251) as u8).collect();
    let mut src = ma.take(6000).unwrap();
    src.write(0, &pattern).unwrap();
    let read_into = ma.take(3000).unwrap();
    let fetched = ma.take(8).unwrap();
    let swapped = ma.take(8).unwrap();

    let recv = mb.take(8192).unwrap();
    let written = mb.take(3000).unwrap();
    // 8192 + 3000 bytes in: the word is 8-aligned in the MR, as an atomic's target must be.
    let word = mb.take(8).unwrap();
    word.atomic_u64(0)
        .unwrap()
        .store(40, std::sync::atomic::Ordering::Relaxed);
    let (w_remote, word_remote) = (written.remote(), word.remote());

    let r1 = qb.post_recv_buf(recv).unwrap();
    let (src_head, src_rest) = src.split_at(3000).unwrap();
    let src = src_head.unsplit(src_rest).unwrap();
    let s1 = qa.post(SendWork::new(Op::Send, src)).unwrap();
    let c1 = cqa.wait_bufs(1, T).unwrap().pop().unwrap();
    assert_eq!((c1.wc.wr_id, c1.wc.status), (s1.0, WcStatus::Success));
    let src = c1.buf.expect("the send buffer came back");
    let (src3000, rest) = src.split_at(3000).unwrap();
    let s2 = qa
        .post(SendWork::new(Op::Write(w_remote), src3000))
        .unwrap();
    let s3 = qa
        .post(SendWork::new(Op::Read(w_remote), read_into))
        .unwrap();
    let s4 = qa
        .post(SendWork::new(
            Op::FetchAdd {
                remote: word_remote,
                add: 2,
            },
            fetched,
        ))
        .unwrap();
    let s5 = qa
        .post(SendWork::new(
            Op::CompareSwap {
                remote: word_remote,
                compare: 42,
                swap: 7,
            },
            swapped,
        ))
        .unwrap();
    let done = cqa.wait_bufs(4, T).unwrap();
    assert_eq!(
        done.iter()
            .map(|c| (c.wc.wr_id, c.wc.status, c.wc.opcode))
            .collect::<Vec<_>>(),
        vec![
            (s2.0, WcStatus::Success, WcOpcode::RdmaWrite),
            (s3.0, WcStatus::Success, WcOpcode::RdmaRead),
            (s4.0, WcStatus::Success, WcOpcode::FetchAdd),
            (s5.0, WcStatus::Success, WcOpcode::CompSwap),
        ]
    );
    let mut bufs = done
        .into_iter()
        .map(|c| c.buf.expect("each buffer came back"));
    let (_w, read_back, fetched, swapped) = (
        bufs.next().unwrap(),
        bufs.next().unwrap(),
        bufs.next().unwrap(),
        bufs.next().unwrap(),
    );
    assert_eq!(read_back.to_vec(), pattern[..3000], "READ came back");
    assert_eq!(
        fetched.to_vec(),
        40u64.to_ne_bytes(),
        "FETCH_ADD: old value"
    );
    assert_eq!(
        swapped.to_vec(),
        42u64.to_ne_bytes(),
        "CMP_SWAP saw the add"
    );
    assert_eq!(
        word.atomic_u64(0)
            .unwrap()
            .load(std::sync::atomic::Ordering::Relaxed),
        7,
        "and swapped"
    );
    assert_eq!(written.to_vec(), pattern[..3000], "WRITE landed");
    drop(rest);

    let got = cqb.wait_bufs(1, T).unwrap().pop().unwrap();
    assert_eq!(
        (got.wc.wr_id, got.wc.status, got.wc.byte_len, got.wc.qp_num),
        (r1.0, WcStatus::Success, 6000, qb.qpn())
    );
    let recv = got.buf.expect("the receive buffer came back");
    assert_eq!(recv.to_vec()[..6000], pattern[..], "SEND landed");
}

#[test]
fn rc_operations_on_owned_shared_memory() {
    let (d, _dir) = daemon("owned", None);
    rc_operations(&d, &d);
}

#[test]
fn rc_operations_on_owned_memory_between_two_daemons_over_udp() {
    let (d1, _x) = daemon("oa", Some("127.92.0.1"));
    let (d2, _y) = daemon("ob", Some("127.92.0.2"));
    rc_operations(&d1, &d2);
}

#[test]
fn misuse_is_a_typed_error_and_the_buffer_comes_back_untouched() {
    let (d, _dir) = daemon("misuse", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let other_pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16).unwrap();
    let qp = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
        .unwrap();
    let g = a.query_gid(1, 0).unwrap();
    connect(&qp, g, qp.qpn());
    let mut mine = pd.alloc_mr(4096, ALL).unwrap();
    let mut theirs = other_pd.alloc_mr(4096, ALL).unwrap();

    // A buffer of another PD's MR: refused locally, not a protection-error completion.
    let mut foreign = theirs.take(64).unwrap();
    foreign.write(0, b"keep me").unwrap();
    let r = qp.post(SendWork::new(Op::Send, foreign)).unwrap_err();
    assert_eq!(r.error, WrError::ForeignPd);
    let foreign = r.buf.expect("handed back");
    assert_eq!(&foreign.to_vec()[..7], b"keep me");
    let r = qp.post_recv_buf(foreign).unwrap_err();
    assert_eq!(r.error, WrError::ForeignPd);

    // A WRITE longer than the remote range, an atomic on a misaligned or short word.
    let target = mine.take(64).unwrap().remote();
    let big = mine.take(128).unwrap();
    let r = qp.post(SendWork::new(Op::Write(target), big)).unwrap_err();
    assert_eq!(r.error, WrError::OutOfRange);
    let big = r.buf.unwrap();
    let r = qp.post(SendWork::new(Op::Read(target), big)).unwrap_err();
    assert_eq!(r.error, WrError::OutOfRange);
    let word = mine.take(8).unwrap();
    let odd = target.slice(1, 8).unwrap();
    let r = qp
        .post(SendWork::new(
            Op::FetchAdd {
                remote: odd,
                add: 1,
            },
            word,
        ))
        .unwrap_err();
    assert_eq!(r.error, WrError::OutOfRange);
    let (w4, _) = r.buf.unwrap().split_at(4).unwrap();
    let r = qp
        .post(SendWork::new(
            Op::FetchAdd {
                remote: target,
                add: 1,
            },
            w4,
        ))
        .unwrap_err();
    assert_eq!(r.error, WrError::OutOfRange);

    // Local ranges: outside the MR or the buffer is EINVAL, never a panic.
    assert!(mine.take(1 << 20).is_err());
    let b = mine.take(16).unwrap();
    assert!(b.read(10, &mut [0u8; 8]).is_err());
    assert!(target.slice(60, 8).is_none());
    assert!(pd.alloc_mr(0, ALL).is_err());

    // Nothing was posted: no completion appears.
    assert!(cq
        .wait_bufs(1, Duration::from_millis(200))
        .unwrap()
        .is_empty());
}

#[test]
fn a_borrowed_buffer_is_written_by_the_daemon_and_read_through_the_mr() {
    let (d, _dir) = daemon("borrowed", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16).unwrap();
    let qp = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
        .unwrap();
    let g = a.query_gid(1, 0).unwrap();
    connect(&qp, g, qp.qpn());
    let mut src = vec![0u8; 256];
    src[..5].copy_from_slice(b"hello");
    let mut dst = vec![0u8; 256];
    {
        let ms = pd.reg_slice(&mut src, ALL).unwrap();
        let md = pd.reg_slice(&mut dst, ALL).unwrap();
        assert!(md.sge(200, 100).is_err(), "past the MR");
        qp.post_recv(1, &[md.sge(16, 64).unwrap()]).unwrap();
        let s: [Sge; 1] = [ms.sge(0, 5).unwrap()];
        qp.post_send(&softverbs::SendRequest::new(2, softverbs::SendOp::Send, &s))
            .unwrap();
        let wcs = cq.wait(2, T).unwrap();
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        let mut got = [0u8; 5];
        md.read(16, &mut got).unwrap();
        assert_eq!(&got, b"hello");
        md.dereg().unwrap();
    }
    // The borrow ended with the registration: the buffer is the caller's again.
    assert_eq!(&dst[16..21], b"hello");
}
