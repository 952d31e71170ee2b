//! softverbs-core: the verbs object model as a sans-IO library.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod errno;
pub mod error;
pub mod qp_state;
pub mod types;

pub use error::{Error, ObjectKind, Result};
