//! The `async` feature: a future per work request that resolves to its completion (with the
//! buffer), a stream of the others, and async events, all waiting in tokio's reactor on the
//! completion channel's and the context's fds.
#![cfg(feature = "async")]

mod common;

use std::time::Duration;

use common::{cap, connect, daemon, ALL};
use softverbs::{AsyncCq, AsyncEvents, Context, EventType, Op, QpInit, QpType, SendWork, WcStatus};

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "current_thread")]
async fn a_posted_request_is_a_future_of_its_completion() {
    let (d, _dir) = daemon("async", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let ch = a.create_comp_channel().unwrap();
    let cq = a.create_cq_with_channel(64, &ch).unwrap();
    let init = QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap());
    let (qa, qb) = (a.create_qp(&init).unwrap(), a.create_qp(&init).unwrap());
    let g = a.query_gid(1, 0).unwrap();
    connect(&qa, g, qb.qpn());
    connect(&qb, g, qa.qpn());
    let acq = AsyncCq::new(&cq, &ch).unwrap();
    let mut mr = pd.alloc_mr(8192, ALL).unwrap();

    // Receive first, then send: the receive's future resolves after the send's, with the
    // message in its buffer; no thread polls meanwhile (the task sleeps on the channel fd).
    let recv = acq.post_recv(&qb, mr.take(4096).unwrap()).unwrap();
    let mut msg = mr.take(16).unwrap();
    msg.write(0, b"async ping-pong!").unwrap();
    let send = acq.post(&qa, SendWork::new(Op::Send, msg)).unwrap();
    let (got, sent) = tokio::time::timeout(T, async { (recv.await, send.await) })
        .await
        .expect("both completions within the timeout");
    let (got, sent) = (got.unwrap(), sent.unwrap());
    assert_eq!((got.wc.status, got.wc.byte_len), (WcStatus::Success, 16));
    assert_eq!(&got.buf.unwrap().to_vec()[..16], b"async ping-pong!");
    assert_eq!(sent.wc.status, WcStatus::Success);
    let msg = sent.buf.expect("the send buffer came back");

    // A completion no future waits for comes out of the stream (twice, to cross a re-arm).
    let target = mr.take(16).unwrap().remote();
    let mut msg = Some(msg);
    for _ in 0..2 {
        let id = qa
            .post(SendWork::new(Op::Write(target), msg.take().unwrap()))
            .unwrap();
        let c = tokio::time::timeout(T, acq.next()).await.unwrap().unwrap();
        assert_eq!((c.wc.wr_id, c.wc.status), (id.0, WcStatus::Success));
        msg = c.buf;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn async_events_wake_the_task() {
    let (d, _dir) = daemon("asyncev", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(8).unwrap();
    let qp = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
        .unwrap();
    let events = AsyncEvents::new(&a).unwrap();
    let inject = async {
        tokio::task::yield_now().await;
        a.inject_event(qp.qpn(), EventType::PathMig).unwrap();
    };
    let (ev, ()) = tokio::time::timeout(T, async { tokio::join!(events.next(), inject) })
        .await
        .unwrap();
    assert_eq!(ev.unwrap().event_type, Some(EventType::PathMig));
}
