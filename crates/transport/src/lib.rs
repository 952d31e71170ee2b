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
pub mod cq;
pub mod engine;
pub mod memory;
mod requester;
mod responder;
mod sge;
pub mod sim;
pub mod time;
pub mod wr;

pub use engine::{
    CqId, DropStats, Engine, Output, PostError, QpConfig, RxMeta, SrqConfig, SrqKey, Transmit,
    MAX_PACKET,
};
pub use memory::{AtomicOp, Fault, Memory, VecMemory};
pub use time::Instant;
