//! Typed errors of the object model, and the one place that turns them into errno values
//! (docs/design/xrc-semantics.md §6, which follows uverbs and libibverbs).

use crate::errno;
use crate::types::{AttrMask, QpState, QpType};

/// The kind of object a handle was supposed to name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[allow(missing_docs)]
pub enum ObjectKind {
    Context,
    Device,
    Port,
    Pd,
    Mr,
    /// A memory window.
    Mw,
    Cq,
    Srq,
    Qp,
    Ah,
    Xrcd,
    XrcRecvQp,
}

/// Everything that can go wrong in a verbs call, by cause.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[allow(missing_docs)] // struct-variant fields are named for what they hold
pub enum Error {
    /// The handle given to a destroy/close names nothing this context owns
    /// (uverbs `lookup_get_idr_uobject`: `ENOENT`).
    #[error("no {0:?} with that handle in this context")]
    UnknownHandle(ObjectKind),
    /// A handle used as an argument (not as the object destroyed) names nothing this context
    /// owns; uverbs answers `EINVAL` for these.
    #[error("invalid {0:?} handle")]
    InvalidHandle(ObjectKind),
    /// A malformed argument; the text says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The object still has dependants (`EBUSY`).
    #[error("{0:?} is busy: {1}")]
    Busy(ObjectKind, &'static str),
    /// open_xrcd on a file that has no domain yet, without `O_CREAT` (`EAGAIN`).
    #[error("no XRC domain for that file and O_CREAT not given")]
    XrcdNeedsCreate,
    /// open_xrcd with `O_EXCL` on a file that already has a domain (`EINVAL`, not `EEXIST`,
    /// as upstream uverbs answers).
    #[error("XRC domain exists and O_EXCL was given")]
    XrcdExists,
    /// The file descriptor passed for an XRC domain is not usable (`EBADF`).
    #[error("bad file descriptor")]
    BadFd,
    /// The QP number is not an XRC receive QP of that domain (`EINVAL`: open_qp, legacy
    /// reg/unreg/modify/query).
    #[error("QP {0:#x} is not an XRC receive QP of this domain")]
    QpNotInXrcd(u32),
    /// The context holds no registration on that receive QP (legacy unreg/destroy, `EINVAL`).
    #[error("this context is not registered with XRC receive QP {0:#x}")]
    NotRegistered(u32),
    /// modify_qp asked for a transition the QP state machine does not have (`EINVAL`).
    #[error("{qp_type:?} QP cannot go from {from:?} to {to:?}")]
    InvalidTransition {
        qp_type: QpType,
        from: QpState,
        to: QpState,
    },
    /// modify_qp lacks attributes the transition requires (`EINVAL`).
    #[error("transition {from:?}->{to:?} requires attribute mask bits {missing:#x}")]
    MissingAttributes {
        from: QpState,
        to: QpState,
        missing: u32,
    },
    /// modify_qp names attributes the transition does not allow (`EINVAL`).
    #[error("transition {from:?}->{to:?} does not allow attribute mask bits {extra:#x}")]
    ForbiddenAttributes {
        from: QpState,
        to: QpState,
        extra: u32,
    },
    /// Attribute mask bits that no verbs version defines (`EOPNOTSUPP`).
    #[error("unknown attribute mask bits {0:#x}")]
    UnknownAttributes(u32),
    /// The request carries `comp_mask` bits this version does not know (`EOPNOTSUPP`).
    #[error("unsupported comp_mask bits {0:#x}")]
    UnsupportedCompMask(u64),
    /// A feature this device does not offer (`EOPNOTSUPP`).
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    /// A device limit was reached (`ENOMEM`, as drivers answer when a table is full).
    #[error("out of resources: {0}")]
    NoResources(&'static str),
    /// The request would take the context, its uid or the daemon past a limit
    /// (`ENOMEM`, as `ibv_reg_mr` past `RLIMIT_MEMLOCK`; docs/guide/limits.md).
    #[error("{} limit of {} {} reached", scope.name(), limit, resource.name())]
    OverLimit {
        resource: crate::limits::Resource,
        scope: crate::limits::Scope,
        limit: u64,
    },
}

impl Error {
    /// The errno value a C caller of rdma-core sees for this error
    /// (docs/design/xrc-semantics.md §6; uverbs_cmd.c and libibverbs cmd*.c).
    pub fn errno(&self) -> i32 {
        match self {
            Error::UnknownHandle(_) => errno::ENOENT,
            Error::InvalidHandle(_)
            | Error::InvalidArgument(_)
            | Error::XrcdExists
            | Error::QpNotInXrcd(_)
            | Error::NotRegistered(_)
            | Error::InvalidTransition { .. }
            | Error::MissingAttributes { .. }
            | Error::ForbiddenAttributes { .. } => errno::EINVAL,
            Error::Busy(..) => errno::EBUSY,
            Error::XrcdNeedsCreate => errno::EAGAIN,
            Error::BadFd => errno::EBADF,
            Error::UnknownAttributes(_)
            | Error::UnsupportedCompMask(_)
            | Error::NotSupported(_) => errno::EOPNOTSUPP,
            Error::NoResources(_) | Error::OverLimit { .. } => errno::ENOMEM,
        }
    }
}

/// Result of a core call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<AttrMask> for u32 {
    fn from(m: AttrMask) -> u32 {
        m.0
    }
}
