//! softverbs: RDMA verbs in userspace, the Rust client of the softverbs daemon.
//!
//! A [`Context`] is one connection to the daemon with one device opened on it; every verbs
//! object made through it ([`Pd`], [`OwnedMr`], [`BorrowedMr`], [`Cq`], [`Srq`], [`Ah`],
//! [`Qp`], [`Xrcd`], [`XrcRecvQp`]) borrows it, so the borrow checker makes objects go
//! before the objects they depend on, and dropping an object destroys it in the daemon
//! (errors ignored; call the explicit `destroy`/`close`/`dereg` methods to see them).
//!
//! # Memory and work requests (what makes the API sound)
//!
//! The daemon plays the NIC: it writes registered memory whenever a receive, a READ, an
//! atomic or a peer's RDMA WRITE says so. Safe code therefore registers only memory that
//! cannot be misused:
//!
//! - [`Pd::alloc_mr`]: memory the library allocates as a sealed memfd and hands to the
//!   daemon with the registration (it reaches it with no system call), carved into
//!   [`Buf`]s. A `Buf` moves into the work request that uses it ([`Qp::post`],
//!   [`Qp::post_recv_buf`], [`Srq::post_recv_buf`]) and comes back with its
//!   [`Completion`] ([`Cq::poll_bufs`]), so nobody holds it while the daemon may touch it.
//!   Another PD's buffer, a buffer that does not fit the remote range, a bad atomic operand
//!   are a typed [`WrError`] before anything is posted.
//! - [`Pd::reg_slice`]: the caller's `&mut [u8]`, borrowed for the MR's whole life
//!   ([`BorrowedMr`]); [`Pd::reg_words`]: atomic words, borrowed likewise.
//!
//! Memory a peer may write is only ever seen as atomics (copies in and out, or
//! `&AtomicU64`), never as `&[u8]`. The raw forms ([`Pd::reg_mr`], [`Pd::reg_mr_iova`],
//! [`Pd::reg_mr_shared`], [`Mr::rereg`]) remain for FFI callers: they take a
//! [`RawMemory`], whose constructors are `unsafe fn`s stating the contract, so this crate
//! itself contains no `unsafe`. `tests/compile_fail/` holds the misuses that do not compile.
//!
//! # Completions
//!
//! [`Cq::poll_bufs`] and [`Cq::wait_bufs`] poll; with the `async` feature, `AsyncCq`
//! (tokio's reactor on the completion channel) turns each posted request into a future of
//! its completion and is a `Stream` of the others, and `AsyncEvents` awaits async events.
//!
//! # XRC
//!
//! The upstream face is the one to start from: a domain named by a file
//! ([`Context::open_xrcd`] with [`O_CREAT`]), a receive QP created once
//! ([`Xrcd::create_recv_qp`]) and opened by number in the other processes
//! ([`Xrcd::open_recv_qp`]); each [`XrcRecvQp`] is a handle that closes on drop, and the QP
//! lives while any process holds one (`examples/xrc_shared_recv.rs`). The daemon's other
//! two faces are here for code ported from them: legacy OFED ([`Xrcd::create_xrc_rcv_qp`],
//! [`Xrcd::reg_xrc_rcv_qp`], [`Xrcd::modify_xrc_rcv_qp`], [`Xrcd::query_xrc_rcv_qp`],
//! [`Xrcd::destroy_xrc_rcv_qp`]) and minimal ([`Xrcd::register_xrc_rcv_qp`]), both
//! returning [`XrcRegistration`]s.
//!
//! Every call is one request datagram and one response datagram on the context's
//! `SOCK_SEQPACKET` socket, or an entry in a shared-memory ring for posts and polls. A
//! refused call is an [`Error`] carrying the errno the daemon answered, the same value a C
//! caller of rdma-core would see.
//!
//! When the daemon dies (or closes the connection) the device is gone, as a NIC that fails
//! is: the context's async events yield one [`EventType::DeviceFatal`], outstanding work on
//! its ring queues completes with [`WcStatus::WrFlushErr`], calls blocked on its events
//! return, later calls fail with [`ErrorKind::DeviceFatal`] (`EIO`), and destroying objects
//! still succeeds; a new [`Context`] works once a daemon serves again (docs/guide/dropin.md, "When
//! the daemon dies").
//!
//! ```no_run
//! use softverbs::{Access, Context, Op, QpInit, QpType, SendWork};
//!
//! let ctx = Context::open(0)?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(16)?;
//! let qp = ctx.create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq))?;
//! // ... connect qp (see examples/rc_pingpong.rs) ...
//! let mut mr = pd.alloc_mr(4096, Access::LOCAL_WRITE)?;
//! let mut buf = mr.take(64)?;
//! buf.write(0, b"hello")?;
//! let id = qp.post(SendWork::new(Op::Send, buf)).map_err(|r| r.error)?;
//! let done = cq.wait_bufs(1, std::time::Duration::from_secs(5))?;
//! assert_eq!(done[0].wc.wr_id, id.0);
//! let buf = done[0].buf.as_ref().expect("handed back with the completion");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "async")]
mod asynch;
mod buffer;
mod cm;
mod conn;
mod context;
mod convert;
mod datapath;
mod direct;
mod error;
mod event;
mod fatal;
mod flush;
pub mod idle;
mod introspect;
mod mw;
mod objects;
mod odp;
mod rings;
mod wr;
mod xrc;

#[cfg(feature = "async")]
pub use asynch::{AsyncCq, AsyncEvents, CompletionFuture};
pub use buffer::{BorrowedMr, Buf, OwnedMr, Remote};
pub use cm::{CmChannel, CmCounts, CmEvent, CmEventKind, CmId, CmQp, CmTimers};
pub use conn::{
    autostart_log, connect_socket, connect_socket_starting, connect_socket_with,
    default_socket_path,
};
pub use context::{devices, Context, DeviceInfo, PortInfo};
pub use datapath::{CompChannel, SendRequest, UdAddress};
pub use direct::at_exit::send_held_acks;
pub use error::{errno, Error, ErrorKind, Result};
pub use event::{AsyncEvent, Element};
pub use introspect::{resources_json, status, Introspect, Status};
pub use mw::{inc_rkey, Mw, MwType, WindowTarget};
pub use objects::{Ah, Cq, Mr, Pd, Qp, QpInit, QpQuery, Srq};
pub use softverbs_core::odp::{Advice, OdpCaps, ADVISE_MR_FLAG_FLUSH};
pub use softverbs_core::wr::{
    SendOp, Sge, WcOpcode, WcStatus, WorkCompletion, WC_GRH, WC_WITH_IMM, WC_WITH_INV,
};
pub use wr::{Completion, Op, Rejected, SendWork, WrError, WrId};
pub use xrc::{XrcRecvQp, XrcRegistration, Xrcd};

pub use softverbs_abi::ABI_VERSION;
pub use softverbs_core::attr::{AhAttr, QpAttr, QpCap, QpInitInfo, SrqAttr, SRQ_LIMIT, SRQ_MAX_WR};
pub use softverbs_core::device::{DeviceAttr, Gid, PortState};
pub use softverbs_core::errno::{O_CREAT, O_EXCL};
pub use softverbs_core::types::{Access, AttrMask, EventType, Mtu, QpState, QpType};
pub use softverbs_memaccess::RawMemory;
