//! softverbs-transport: the RoCE v2 transport as a sans-IO engine.
//!
//! Inputs are posted work requests, received packets and the current time; outputs are
//! packets to send, work completions, QP events and the next deadline. Memory is reached
//! through the [`Memory`](memory::Memory) trait after the core has checked the key, so the
//! daemon can plug in shared mappings while tests use plain vectors. There are no sockets,
//! threads or clocks here, and no `unsafe`.
//!
//! See [`engine`] for the API and [`sim`] for the deterministic network simulator the tests
//! run it on.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod completer;
pub mod counters;
pub mod cq;
pub mod engine;
pub mod faults;
mod mcast;
pub mod mw;
mod qp;
mod requester;
mod responder;
mod sge;
pub mod sim;
pub mod time;

pub use counters::{Counters, Reject, Rejects};
pub use engine::{
    cq_id, CqId, DropStats, Engine, Output, PostError, QpConfig, RxMeta, SrqConfig, SrqKey,
    Transmit, MAX_PACKET,
};
pub use faults::{FaultInjector, Faults, NetStats};
pub use memory::{AtomicOp, Fault, Memory, VecMemory};
pub use qp::{NoFeed, SrqFeed};
/// Work requests and completions, and the memory interface, live in the core so the client
/// can use them without linking the engine; re-exported under their old paths.
pub use softverbs_core::{memory, wr};
pub use time::Instant;
