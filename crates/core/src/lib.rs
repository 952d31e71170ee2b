//! softverbs-core: the verbs object model as a sans-IO library.
//!
//! This crate plays the part of the kernel's uverbs core for softverbs: it owns devices,
//! contexts (one per client), PDs, MRs, CQs, SRQs, address handles, XRC domains and QPs of
//! every type, and does the counting, the event fan-out and the teardown once, in one place.
//! It has no sockets, threads, clocks or `unsafe`; the daemon drives it and turns its typed
//! [`Error`]s into errno values with [`Error::errno`].
//!
//! The XRC receive-QP design it implements — the answer to the questions of the 2010
//! linux-rdma thread "ib_core: implement XRC RCV qp's" — is in `docs/design/xrc-design.md`, and in
//! the module docs of [`xrc_recv`] and [`xrcd`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod attr;
pub mod change;
mod core;
pub mod datapath;
pub mod device;
pub mod errno;
pub mod error;
pub mod event;
pub mod ids;
pub mod limits;
pub mod mcast;
pub mod memory;
pub mod mw;
pub mod objects;
pub mod odp;
pub mod qp;
pub mod qp_state;
pub mod resources;
pub mod types;
pub mod wr;
pub mod xrc_recv;
pub mod xrcd;

pub use crate::change::CoreChange;
pub use crate::core::{ContextInfo, Core, Counts, HolderKind, HolderRef, FIRST_QPN};
pub use error::{Error, ObjectKind, Result};
