//! The softverbs drop-in `libibverbs.so.1`: rdma-core 44's ABI over the softverbs client.
//!
//! Unmodified programs linked against rdma-core (ibverbs-utils, perftest, pyverbs, MPI
//! libraries) load this library instead of rdma-core's when `softverbs run` puts it first on
//! `LD_LIBRARY_PATH`. Every object a program sees is the verbs.h struct at the start of a
//! Rust object (`objects.rs`) that owns the matching [`softverbs`] client object; the data path
//! (`ibv_post_send`, `ibv_poll_cq`, …) reaches us through the `ibv_context.ops` and
//! `verbs_context` slots that verbs.h's inline functions call.
//!
//! Exports carry rdma-core's symbol versions (`export.rs`, `libibverbs.map`); what softverbs
//! cannot do answers the way rdma-core answers for a device without the feature
//! (`EOPNOTSUPP`, or NULL with `errno`), see `unsupported.rs`.
//!
//! `unsafe` is the point of this crate: every entry point takes C pointers. Each public entry
//! checks for NULL where rdma-core tolerates it; the rest is the C caller's contract, exactly
//! as with rdma-core.
#![cfg_attr(test, allow(dead_code))]
#![allow(clippy::missing_safety_doc)]

#[macro_use]
mod export;
mod cq;
mod device;
mod events;
pub mod ffi;
mod legacy_xrc;
mod mcast;
mod mw;
mod objects;
mod odp;
mod pd;
mod qp;
mod qp_ex;
mod srq;
mod strings;
mod unsupported;
mod util;
mod xrcd;

/// Runs when the dynamic loader maps this library, before the program's own constructors
/// and `main` (the loader runs a library's `.init_array` before those of the objects that
/// depend on it): installs the child handler that gives a `fork()`ed child its own copy of
/// the memory registration shared (`softverbs_memaccess::install_fork_handler`). Child
/// handlers run in the order they were registered (pthread_atfork(3)), so ours runs before
/// any the program registers itself, and a program's handler that writes a registered buffer
/// writes the child's copy (docs/design/registered-memory.md, "What registration must not change").
/// Installing it at the first registration, as before, put it after such a handler.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INSTALL_FORK_HANDLER: extern "C" fn() = install_fork_handler;

#[cfg(not(test))]
extern "C" fn install_fork_handler() {
    softverbs_memaccess::install_fork_handler();
}
