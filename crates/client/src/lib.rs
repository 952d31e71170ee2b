//! softverbs: the Rust client of the softverbs daemon.
//!
//! A [`Context`] is one connection to the daemon with one device opened on it; every verbs
//! object made through it ([`Pd`], [`Mr`], [`Cq`], [`Srq`], [`Ah`], [`Qp`], [`Xrcd`],
//! [`XrcRecvQp`], [`XrcRegistration`]) borrows it, so the borrow checker makes objects go
//! before the objects they depend on, and dropping an object destroys it in the daemon
//! (errors ignored; call the explicit `destroy`/`close`/`dereg` methods to see them).
//!
//! Every call is one request datagram and one response datagram on the context's
//! `SOCK_SEQPACKET` socket (the `softverbs-abi` crate describes the messages). A refused call
//! is an [`Error`] carrying the errno the daemon answered, the same value a C caller of
//! rdma-core would see.
//!
//! When the daemon dies (or closes the connection) the device is gone, as a NIC that fails
//! is: the context's async events yield one [`EventType::DeviceFatal`], outstanding work on
//! its ring queues completes with [`WcStatus::WrFlushErr`], calls blocked on its events
//! return, later calls fail with [`ErrorKind::DeviceFatal`] (`EIO`), and destroying objects
//! still succeeds; a new [`Context`] works once a daemon serves again (docs/dropin.md, "When
//! the daemon dies").
//!
//! XRC receive QPs are offered in all three faces the daemon implements:
//!
//! - upstream: [`Xrcd::create_recv_qp`], [`Xrcd::open_recv_qp`] → [`XrcRecvQp`] handles;
//! - legacy OFED: [`Xrcd::create_xrc_rcv_qp`], [`Xrcd::reg_xrc_rcv_qp`],
//!   [`Xrcd::modify_xrc_rcv_qp`], [`Xrcd::query_xrc_rcv_qp`], [`Xrcd::destroy_xrc_rcv_qp`];
//! - minimal: [`Xrcd::register_xrc_rcv_qp`].
//!
//! ```no_run
//! use softverbs::{Access, Context};
//!
//! let ctx = Context::open(0)?;
//! let pd = ctx.alloc_pd()?;
//! let buf = vec![0u8; 4096];
//! let mr = pd.reg_mr(buf.as_ptr() as u64, buf.len() as u64, Access::LOCAL_WRITE)?;
//! println!("lkey {:#x}", mr.lkey());
//! # Ok::<(), softverbs::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod conn;
mod context;
mod convert;
mod datapath;
mod error;
mod event;
mod fatal;
mod flush;
mod introspect;
mod objects;
mod rings;
mod xrc;

pub use conn::{connect_socket, connect_socket_with, default_socket_path};
pub use context::{devices, Context, DeviceInfo, PortInfo};
pub use datapath::{CompChannel, SendRequest, UdAddress};
pub use error::{errno, Error, ErrorKind, Result};
pub use event::{AsyncEvent, Element};
pub use introspect::{resources_json, status, Introspect, Status};
pub use objects::{Ah, Cq, Mr, Pd, Qp, QpInit, QpQuery, Srq};
pub use softverbs_core::wr::{
    SendOp, Sge, WcOpcode, WcStatus, WorkCompletion, WC_GRH, WC_WITH_IMM, WC_WITH_INV,
};
pub use xrc::{XrcRecvQp, XrcRegistration, Xrcd};

pub use softverbs_abi::ABI_VERSION;
pub use softverbs_core::attr::{AhAttr, QpAttr, QpCap, QpInitInfo, SrqAttr, SRQ_LIMIT, SRQ_MAX_WR};
pub use softverbs_core::device::{DeviceAttr, Gid, PortState};
pub use softverbs_core::errno::{O_CREAT, O_EXCL};
pub use softverbs_core::types::{Access, AttrMask, EventType, Mtu, QpState, QpType};
