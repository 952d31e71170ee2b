//! The transport on a lossy, duplicating, reordering, corrupting network (deterministic,
//! seeded). RC and XRC deliver every message exactly once, in order, byte-identical, with
//! matching completions on both sides; UC and UD lose whole messages only, never deliver a
//! partial one. Corrupted packets are caught by the ICRC check at the receiver.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network, Rng};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus};

const SLOT: u64 = 8192;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Rc,
    Xrc,
    Uc,
    Ud,
}

struct Outcome {
    sent: Vec<Vec<u8>>,
    received: Vec<(u64, Vec<u8>, WcStatus)>,
    sender: Vec<(u64, WcStatus, WcOpcode)>,
    corrupt_accepted: u64,
}

fn run(kind: Kind, seed: u64, faults: Faults, count: usize) -> Outcome {
    let mut rng = Rng::new(seed ^ 0xA5A5);
    let mtu = Mtu::M1024;
    let mut a = Host::new("192.0.2.1".parse().unwrap(), mtu);
    let mut b = Host::new("192.0.2.2".parse().unwrap(), mtu);
    let ca = a.context(1, 1 << 20);
    let cb = b.context(2, 1 << 20);
    let pa = a.pd(ca);
    let pb = b.pd(cb);
    let ka = a.mr(pa, 0, 1 << 20, Access::LOCAL_WRITE);
    let kb = b.mr(pb, 0, 1 << 20, Access::LOCAL_WRITE);
    let cqa = a.cq(ca);
    let cqb = b.cq(cb);
    let max = if matches!(kind, Kind::Ud) {
        1024
    } else {
        3 * 1024 + 100
    };
    let sent: Vec<Vec<u8>> = (0..count)
        .map(|_| {
            (0..1 + rng.below(max) as usize)
                .map(|_| rng.next_u64() as u8)
                .collect()
        })
        .collect();
    for (i, m) in sent.iter().enumerate() {
        a.mem.space_mut(ca)[i * SLOT as usize..][..m.len()].copy_from_slice(m);
    }
    let params = ConnParams {
        timeout: 8,
        ..ConnParams::default()
    };
    let (qa, qb, srqn, recv_on) = match kind {
        Kind::Rc | Kind::Uc => {
            let t = if matches!(kind, Kind::Rc) {
                QpType::Rc
            } else {
                QpType::Uc
            };
            let qa = a.qp(t, pa, cqa, None);
            let qb = b.qp(t, pb, cqb, None);
            (qa, qb, 0, None)
        }
        Kind::Ud => (
            a.qp(QpType::Ud, pa, cqa, None),
            b.qp(QpType::Ud, pb, cqb, None),
            0,
            None,
        ),
        Kind::Xrc => {
            let xrcd = b.xrcd(cb, 7);
            let (srq, srqn) = b.xrc_srq(pb, xrcd, cqb, 4096);
            let (_h, tgt) = b.xrc_recv_qp(cb, xrcd);
            (a.qp(QpType::XrcSend, pa, cqa, None), tgt, srqn, Some(srq))
        }
    };
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, params);
    b.connect(qb, ga, qa, params);
    let ud_extra = if matches!(kind, Kind::Ud) { 40 } else { 0 };
    for i in 0..count {
        let wr = RecvWr {
            wr_id: i as u64,
            sges: vec![Sge {
                addr: 0x80000 + i as u64 * SLOT,
                length: SLOT as u32,
                lkey: kb,
            }],
        };
        match recv_on {
            Some(srq) => b.engine.post_srq_recv(srq, wr).unwrap(),
            None => b.engine.post_recv(qb, wr).unwrap(),
        }
    }
    for (i, m) in sent.iter().enumerate() {
        let mut wr = SendWr::new(
            i as u64,
            SendOp::Send,
            Payload::Sges(vec![Sge {
                addr: i as u64 * SLOT,
                length: m.len() as u32,
                lkey: ka,
            }]),
        );
        wr.remote_srqn = srqn;
        if matches!(kind, Kind::Ud) {
            wr.ud = Some(UdDest {
                dgid: gb,
                dest_qpn: qb,
                qkey: params.qkey,
            });
        }
        a.engine.post_send(qa, wr).unwrap();
    }
    let mut net = Network::new(vec![a, b], faults, seed);
    net.run_until(Duration::from_secs(600), |n| {
        let done = n.hosts[0].completions.len() == count;
        let drained =
            n.hosts[1].completions.len() == count || !matches!(kind, Kind::Rc | Kind::Xrc);
        done && drained && !matches!(kind, Kind::Uc | Kind::Ud)
    });
    let mut hosts = net.hosts.into_iter();
    let (mut a, mut b) = (hosts.next().unwrap(), hosts.next().unwrap());
    let sender = a
        .take_completions(cqa)
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect();
    let received = b
        .take_completions(cqb)
        .iter()
        .map(|w| {
            let at = 0x80000 + w.wr_id as usize * SLOT as usize + ud_extra;
            let len = (w.byte_len as usize).saturating_sub(ud_extra);
            (w.wr_id, b.mem.space(cb)[at..at + len].to_vec(), w.status)
        })
        .collect();
    Outcome {
        sent,
        received,
        sender,
        corrupt_accepted: net.stats.corrupt_accepted,
    }
}

fn faults(loss: f64, duplicate: f64, reorder: f64, corrupt: f64) -> Faults {
    Faults {
        loss,
        duplicate,
        reorder,
        corrupt,
        delay: Duration::from_micros(5),
    }
}

/// How a reliable run ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// Every message delivered and completed.
    Complete,
    /// The retry budget ran out on message `k` (RETRY_EXC_ERR).
    RetriesExhausted { k: usize },
}

/// Checks what RC and XRC promise on a faulty wire: every message completes at the sender
/// once, in order, and arrives once, in order, byte-identical, unless a request's retry budget
/// runs out (IBA 9.7.6.1.3: `retry_cnt` + 1 transmissions without progress end in
/// RETRY_EXC_ERR). Then the messages before it completed successfully, it reports
/// RETRY_EXC_ERR, the rest are flushed, and the receiver still holds a gap-free, duplicate-free
/// prefix of at least the completed ones. The callers bound when exhaustion may happen at all.
fn check_reliable(o: &Outcome) -> Result<Ended, TestCaseError> {
    let n = o.sent.len();
    let k = o
        .sender
        .iter()
        .position(|s| s.1 == WcStatus::RetryExcErr)
        .unwrap_or(n);
    let want: Vec<_> = (0..n as u64)
        .map(|i| {
            let st = match (i as usize).cmp(&k) {
                std::cmp::Ordering::Less => WcStatus::Success,
                std::cmp::Ordering::Equal => WcStatus::RetryExcErr,
                std::cmp::Ordering::Greater => WcStatus::WrFlushErr,
            };
            (i, st, WcOpcode::Send)
        })
        .collect();
    prop_assert_eq!(
        &o.sender,
        &want,
        "every send completes once, in order, successfully (or the retries ran out)"
    );
    if k == n {
        prop_assert_eq!(o.received.len(), n, "every message is received once");
    } else {
        prop_assert!(
            o.received.len() >= k && o.received.len() <= n,
            "what completed was received, once ({} of {k})",
            o.received.len()
        );
    }
    for (i, (wr_id, data, status)) in o.received.iter().enumerate() {
        prop_assert_eq!(*wr_id, i as u64, "in order");
        prop_assert_eq!(*status, WcStatus::Success);
        prop_assert!(data == &o.sent[i], "message {} is byte-identical", i);
    }
    prop_assert_eq!(o.corrupt_accepted, 0, "the ICRC catches every corruption");
    Ok(if k == n {
        Ended::Complete
    } else {
        Ended::RetriesExhausted { k }
    })
}

/// Below this loss rate a run must complete: running out of retries takes one PSN (or every
/// ACK covering it) lost on 8 transmissions in a row, about 0.2^8 ≈ 3·10^-6 per PSN here, so
/// an exhausted budget at low loss is a transport bug, not bad luck.
const EXHAUSTION_POSSIBLE_FROM: f64 = 0.2;

fn check_reliable_at(o: &Outcome, loss: f64) -> Result<(), TestCaseError> {
    let ended = check_reliable(o)?;
    prop_assert!(
        ended == Ended::Complete || loss >= EXHAUSTION_POSSIBLE_FROM,
        "retries ran out at {loss:.3} loss: {ended:?}"
    );
    Ok(())
}

fn check_unreliable(o: &Outcome, duplicates_possible: bool) -> Result<(), TestCaseError> {
    // Sender: every send completes (sent is done), in order.
    prop_assert_eq!(o.sender.len(), o.sent.len());
    let mut last = None;
    for (wr_id, data, status) in &o.received {
        prop_assert_eq!(*status, WcStatus::Success);
        // Whole messages only: what arrived is exactly one of the messages sent.
        let matches: Vec<usize> = (0..o.sent.len()).filter(|&i| &o.sent[i] == data).collect();
        prop_assert!(
            !matches.is_empty(),
            "receive {} holds a partial or foreign message ({} bytes)",
            wr_id,
            data.len()
        );
        if !duplicates_possible {
            prop_assert!(
                last.is_none_or(|l| l < matches[0]),
                "no duplicates, in order"
            );
            last = Some(matches[0]);
        }
    }
    prop_assert_eq!(o.corrupt_accepted, 0, "the ICRC catches every corruption");
    Ok(())
}

fn config(cases: u32) -> Config {
    // Fixed seeds: every run checks the same cases, so a result is reproducible.
    Config {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(0x50F7_7E4B),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(24))]

    #[test]
    fn rc_delivers_exactly_once_in_order_under_faults(
        seed in any::<u64>(), loss in 0.0..=0.3f64, dup in 0.0..=0.2f64, reorder in 0.0..=0.3f64, corrupt in 0.0..=0.05f64
    ) {
        check_reliable_at(&run(Kind::Rc, seed, faults(loss, dup, reorder, corrupt), 40), loss)?;
    }

    #[test]
    fn xrc_delivers_exactly_once_in_order_under_faults(
        seed in any::<u64>(), loss in 0.0..=0.3f64, dup in 0.0..=0.2f64, reorder in 0.0..=0.3f64, corrupt in 0.0..=0.05f64
    ) {
        check_reliable_at(&run(Kind::Xrc, seed, faults(loss, dup, reorder, corrupt), 40), loss)?;
    }

    #[test]
    fn uc_loses_whole_messages_only(
        seed in any::<u64>(), loss in 0.0..=0.3f64, dup in 0.0..=0.2f64, corrupt in 0.0..=0.05f64
    ) {
        // No reordering: UC cannot tell a late packet from a lost one and drops it.
        check_unreliable(&run(Kind::Uc, seed, faults(loss, dup, 0.0, corrupt), 40), false)?;
    }

    #[test]
    fn ud_loses_whole_datagrams_only(
        seed in any::<u64>(), loss in 0.0..=0.3f64, dup in 0.0..=0.2f64, reorder in 0.0..=0.3f64, corrupt in 0.0..=0.05f64
    ) {
        // UD has no sequence check: the network's duplicates and reordering show through.
        check_unreliable(&run(Kind::Ud, seed, faults(loss, dup, reorder, corrupt), 40), true)?;
    }
}

/// At 30% loss each way a PSN is lost on all 8 transmissions IBA allows (retry_cnt 7) with
/// probability 0.3^8 ≈ 7·10^-5, and a run of 60 messages has ~150 PSNs and their ACKs: about
/// 3% of runs end in RETRY_EXC_ERR whichever PSN a retry resumes at (measured over 2,000 seeded
/// runs: 58 with retries from the message's first PSN, 52 from the oldest unacknowledged).
/// So the property is per run the one of `check_reliable`, and most runs must complete.
#[test]
fn thirty_percent_loss_each_way_is_survived_by_rc_and_xrc() {
    let mut complete = 0;
    for seed in 0..8 {
        for kind in [Kind::Rc, Kind::Xrc] {
            let o = run(kind, seed, faults(0.3, 0.0, 0.0, 0.0), 60);
            let ended = check_reliable(&o).unwrap_or_else(|e| panic!("{kind:?} seed {seed}: {e}"));
            complete += usize::from(ended == Ended::Complete);
        }
    }
    assert!(complete >= 12, "only {complete} of 16 runs completed");
}
