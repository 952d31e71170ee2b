//! softverbs-cm: a sans-IO InfiniBand connection manager (IBA chapter 12, docs/design/cm.md §3).
//!
//! One [`Cm`] serves one port's GSI (QP1). It owns every connection in progress or
//! established through that port: the consumer (the daemon, on behalf of its clients)
//! calls commands ([`Cm::listen`], [`Cm::connect`], [`Cm::accept`], [`Cm::reject`],
//! [`Cm::establish`], [`Cm::disconnect`], [`Cm::sidr_request`], [`Cm::sidr_reply`],
//! [`Cm::destroy`], [`Cm::destroy_owner`]), feeds it the MADs that arrive
//! ([`Cm::handle_mad`]) and the time ([`Cm::handle_timeout`]), and drains the MADs to send
//! ([`Cm::poll_transmit`]) and the events for its owners ([`Cm::poll_event`]).
//!
//! No sockets, threads or clocks: time is a [`softverbs_transport::Instant`] passed in.
//! Duplicated, reordered and lost MADs end in exactly one connection or one clean failure
//! on each side: retransmissions share their first transmission's TransactionID and are
//! recognised by the communication IDs (IBA 12.6.1, 12.9), answers to duplicates are sent
//! again from a cache, and an ended connection stays as a time-wait tombstone (no owner)
//! for [`Config::time_wait`] so that a late duplicate cannot start a second one.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod engine;
pub mod rate;
mod timeout;
mod types;

pub use engine::{Cm, Counts};
pub use softverbs_transport::Instant;
pub use timeout::cm_timeout;
pub use types::{
    AcceptParams, CmError, CmId, Config, ConnectParams, Event, Owner, Peer, QpKind, SidrParams,
    SidrReplyParams, State, Transmit,
};
