//! Work and completion queues shared by a softverbs client and the daemon.
//!
//! A [`Region`] is a sealed memfd mapped `MAP_SHARED` by both processes (created on one
//! side, its descriptor passed over the socket, [`Region::map`]ped on the other). Inside it,
//! each SQ, RQ, SRQ or CQ is a single-producer/single-consumer ring of fixed-size entries
//! ([`RingLayout`], [`Producer`], [`Consumer`]). Posting and polling are plain loads and
//! stores; a system call happens only when the consumer has gone to sleep and raised the
//! ring's `need_wakeup` flag, in which case the producer rings a [`Doorbell`] (an eventfd).
//! A consumer serving many rings visits only those with work: producers announce an owner's
//! idle → busy transition through its [`WorkFlag`] and a ready ring, which the consumer's
//! [`ReadySet`] turns into the list of owners to visit.
//!
//! Neither side trusts the other: every index read from shared memory is validated, a bad
//! one is a [`Corrupt`] error, and no value the peer writes can make this side access
//! memory outside the ring or panic. See `docs/design/shm-rings.md` for the layout, the
//! memory-ordering argument and measurements.
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[allow(unsafe_code)]
mod bytes;
mod doorbell;
#[cfg(feature = "tokio")]
#[allow(unsafe_code)]
mod reactor;
mod ready;
#[allow(unsafe_code)]
mod region;
mod ring;

pub use bytes::atomic_bytes;
pub use doorbell::Doorbell;
#[cfg(feature = "tokio")]
pub use reactor::register_readable;
pub use ready::{ReadySet, WorkFlag, WORK_FLAG_SIZE};
pub use region::{Atom, Region};
pub use ring::{
    Consumer, Corrupt, Index, LayoutError, Peek, Producer, PushError, RingLayout, SharedConsumer,
    CACHE_LINE, MAX_CAPACITY, MAX_ENTRY_SIZE, RING_MAGIC,
};
