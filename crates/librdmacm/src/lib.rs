//! The drop-in `librdmacm.so.1`: rdma-core 44's librdmacm ABI (`RDMACM_1.0` … `1.3`, the
//! layouts of rdma_cma.h) over the softverbs connection manager (docs/design/cm.md,
//! docs/guide/dropin.md "librdmacm"). Ids' `verbs` are the drop-in libibverbs' contexts, so a
//! program linked against both uses softverbs' devices; CM ids live in the daemon, whose CM
//! speaks IB CM MADs on the device's QP1.
//!
//! `unsafe` is the C boundary: every block has its `// SAFETY:` comment.
#![cfg_attr(test, allow(dead_code))]
#![allow(clippy::missing_safety_doc, non_camel_case_types)]

#[macro_use]
mod export;
mod addr;
mod addrinfo;
mod api;
mod cm;
mod ece;
pub mod ffi;
mod mcast;
mod rsocket;
mod unsupported;
mod verbs;
