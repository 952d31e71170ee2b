//! Completions as futures (feature `async`): an [`AsyncCq`] waits on its completion
//! channel's fd with tokio's [`AsyncFd`], so a task awaiting a completion sleeps in the
//! reactor instead of polling. [`AsyncCq::post`] posts a request of the owning API and
//! returns a future of its [`Completion`]; the `AsyncCq` itself is a
//! [`Stream`](futures_core::Stream) of the completions no future waits for.
//! [`AsyncEvents`] does the same for the context's async events.
//!
//! How a wait goes (ibv_req_notify_cq(3), ibv_get_cq_event(3)): poll the CQ; if it is
//! empty, arm it and poll once more (a completion may have come between the two); then
//! sleep until the channel's fd is readable, consume the channel's events, and start over.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::task::{Context as TaskCx, Poll, Waker};

use tokio::io::unix::AsyncFd;

use crate::datapath::CompChannel;
use crate::error::{Error, Result};
use crate::event::AsyncEvent;
use crate::objects::{Cq, Qp};
use crate::wr::{Completion, Rejected, SendWork, WrId};
use crate::Buf;

/// A duplicate of `fd` on the current tokio reactor (the duplicate shares the original's
/// readiness: both name one eventfd).
fn on_reactor(op: &'static str, fd: std::os::fd::BorrowedFd<'_>) -> Result<AsyncFd<OwnedFd>> {
    fd.try_clone_to_owned()
        .and_then(softverbs_shm::register_readable)
        .map_err(|e| Error::from_io(op, &e))
}

#[derive(Debug, Default)]
struct Routing {
    /// Completions a future waits for, by `wr_id`.
    done: HashMap<u64, Completion>,
    /// The futures waiting, by `wr_id`, with their wakers.
    awaited: HashMap<u64, Option<Waker>>,
    /// Completions no future waits for: what the stream yields.
    unclaimed: VecDeque<Completion>,
    stream: Option<Waker>,
}

impl Routing {
    fn wake_all(&mut self) {
        for w in self.awaited.values_mut().filter_map(Option::take) {
            w.wake();
        }
        if let Some(w) = self.stream.take() {
            w.wake();
        }
    }
}

/// A CQ whose completions are awaited (needs a tokio runtime with I/O enabled). The CQ
/// must have been created on `channel` ([`Context::create_cq_with_channel`]).
///
/// [`Context::create_cq_with_channel`]: crate::Context::create_cq_with_channel
#[derive(Debug)]
pub struct AsyncCq<'c> {
    cq: &'c Cq<'c>,
    channel: &'c CompChannel<'c>,
    fd: AsyncFd<OwnedFd>,
    /// The CQ is armed and its event not yet consumed.
    armed: AtomicBool,
    routing: Mutex<Routing>,
}

impl<'c> AsyncCq<'c> {
    /// Waits on `cq` through `channel`, whose fd joins the current tokio reactor.
    pub fn new(cq: &'c Cq<'c>, channel: &'c CompChannel<'c>) -> Result<AsyncCq<'c>> {
        let fd = on_reactor("async_cq", channel.fd())?;
        Ok(AsyncCq {
            cq,
            channel,
            fd,
            armed: AtomicBool::new(false),
            routing: Mutex::new(Routing::default()),
        })
    }

    /// The CQ.
    pub fn cq(&self) -> &'c Cq<'c> {
        self.cq
    }

    fn routing(&self) -> std::sync::MutexGuard<'_, Routing> {
        self.routing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts `wr` on `qp` (whose completions go to this CQ) and returns the future of its
    /// completion, which hands the buffer back.
    pub fn post<'a>(
        &'a self,
        qp: &Qp<'_>,
        wr: SendWork<'_>,
    ) -> Result<CompletionFuture<'a, 'c>, Rejected> {
        let id = qp.post(wr)?;
        Ok(self.completion(id))
    }

    /// Posts a receive of `buf` on `qp` (whose receive completions go to this CQ) and returns
    /// the future of its completion.
    pub fn post_recv<'a>(
        &'a self,
        qp: &Qp<'_>,
        buf: Buf,
    ) -> Result<CompletionFuture<'a, 'c>, Rejected> {
        let id = qp.post_recv_buf(buf)?;
        Ok(self.completion(id))
    }

    /// The future of the completion of `id` (posted with the owning API on a queue that
    /// completes to this CQ).
    pub fn completion<'a>(&'a self, id: WrId) -> CompletionFuture<'a, 'c> {
        self.routing().awaited.insert(id.0, None);
        CompletionFuture {
            acq: self,
            id: id.0,
        }
    }

    /// The next completion no future waits for.
    pub async fn next(&self) -> Result<Completion> {
        std::future::poll_fn(|cx| self.poll_unclaimed(cx)).await
    }

    fn poll_unclaimed(&self, cx: &mut TaskCx<'_>) -> Poll<Result<Completion>> {
        loop {
            {
                let mut r = self.routing();
                if let Some(c) = r.unclaimed.pop_front() {
                    return Poll::Ready(Ok(c));
                }
                r.stream = Some(cx.waker().clone());
            }
            match self.drive(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Moves at least one completion from the CQ to where it is awaited, or registers `cx`
    /// with the reactor and returns `Pending`.
    fn drive(&self, cx: &mut TaskCx<'_>) -> Poll<Result<()>> {
        loop {
            let got = self.cq.poll_bufs(32)?;
            if !got.is_empty() {
                self.route(got);
                return Poll::Ready(Ok(()));
            }
            if !self.armed.swap(true, Ordering::AcqRel) {
                if let Err(e) = self.cq.req_notify(false) {
                    self.armed.store(false, Ordering::Release);
                    return Poll::Ready(Err(e));
                }
                continue;
            }
            let mut guard = match self.fd.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Error::from_io("get_cq_event", &e))),
                Poll::Ready(Ok(g)) => g,
            };
            softverbs_ipc::drain_eventfd(self.channel.fd().as_fd());
            while self.channel.try_get_event()?.is_some() {
                self.armed.store(false, Ordering::Release);
            }
            guard.clear_ready();
        }
    }

    fn route(&self, got: Vec<Completion>) {
        let mut r = self.routing();
        for c in got {
            match r.awaited.get_mut(&c.wc.wr_id) {
                Some(w) => {
                    if let Some(w) = w.take() {
                        w.wake();
                    }
                    r.done.insert(c.wc.wr_id, c);
                }
                None => {
                    r.unclaimed.push_back(c);
                    if let Some(w) = r.stream.take() {
                        w.wake();
                    }
                }
            }
        }
    }
}

impl futures_core::Stream for AsyncCq<'_> {
    type Item = Result<Completion>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<Option<Self::Item>> {
        self.poll_unclaimed(cx).map(Some)
    }
}

/// The completion of one work request ([`AsyncCq::post`]).
#[derive(Debug)]
pub struct CompletionFuture<'a, 'c> {
    acq: &'a AsyncCq<'c>,
    id: u64,
}

impl Future for CompletionFuture<'_, '_> {
    type Output = Result<Completion>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskCx<'_>) -> Poll<Result<Completion>> {
        let acq = self.acq;
        loop {
            {
                let mut r = acq.routing();
                if let Some(c) = r.done.remove(&self.id) {
                    r.awaited.remove(&self.id);
                    return Poll::Ready(Ok(c));
                }
                // Routed before this future was registered (another task drove the CQ
                // between the post and `completion`).
                if let Some(i) = r.unclaimed.iter().position(|c| c.wc.wr_id == self.id) {
                    r.awaited.remove(&self.id);
                    let c = r.unclaimed.remove(i).expect("found");
                    return Poll::Ready(Ok(c));
                }
                r.awaited.insert(self.id, Some(cx.waker().clone()));
            }
            match acq.drive(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for CompletionFuture<'_, '_> {
    fn drop(&mut self) {
        let mut r = self.acq.routing();
        if r.awaited.remove(&self.id).is_some() {
            // Only the last task to wait on the fd is woken by the reactor: if that was this
            // one, another waiter must take over. A completion that arrives later goes to
            // the stream, with its buffer.
            if let Some(c) = r.done.remove(&self.id) {
                r.unclaimed.push_back(c);
            }
            r.wake_all();
        }
    }
}

/// The context's async events (`ibv_get_async_event(3)`) as futures, on tokio's reactor.
#[derive(Debug)]
pub struct AsyncEvents<'c> {
    ctx: &'c crate::Context,
    fd: AsyncFd<OwnedFd>,
}

impl<'c> AsyncEvents<'c> {
    /// Waits on `ctx`'s async-event fd, which joins the current tokio reactor.
    pub fn new(ctx: &'c crate::Context) -> Result<AsyncEvents<'c>> {
        let fd = on_reactor("async_events", ctx.async_fd())?;
        Ok(AsyncEvents { ctx, fd })
    }

    /// The next async event.
    pub async fn next(&self) -> Result<AsyncEvent> {
        loop {
            if let Some(e) = self.ctx.try_get_async_event()? {
                return Ok(e);
            }
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|e| Error::from_io("get_async_event", &e))?;
            softverbs_ipc::drain_eventfd(self.ctx.async_fd());
            guard.clear_ready();
        }
    }
}
