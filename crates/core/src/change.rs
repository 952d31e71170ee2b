//! Changes the data path mirrors, queued as the core makes them (quinn-proto's endpoint
//! events: the protocol state queues what its owner must apply, the owner drains the queue).
//!
//! The core is the one authority on objects; the daemon's engines hold copies of the few
//! facts they need per packet (QPs, SRQs, CQs, MR mappings). Every operation that changes one
//! of those facts queues a [`CoreChange`] carrying everything needed to apply it, including
//! the effects a caller cannot see from its own request: an XRC receive QP leaving with its
//! last holder, or every QP of a closed context. The owner calls [`Core::poll_change`] after
//! each operation, so nothing re-reads a request or a reply to find out what happened.
//!
//! A failed operation queues nothing (IBA 11.2.5.2: a failed verb leaves the object as it
//! was), and changes come out in the order they were made.

use crate::attr::QpAttr;
use crate::core::Core;
use crate::datapath::{OwnedQpInfo, SrqInfo};
use crate::device::Gid;
use crate::ids::{CtxId, Handle};

/// One change to a mirrored object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreChange {
    /// A context was torn down. Its QPs come first as [`CoreChange::QpDestroyed`]; its CQs,
    /// SRQs, MRs and rings go with this change.
    ContextClosed {
        /// The closed context.
        ctx: CtxId,
    },
    /// A CQ was created with room for `cqe` completions.
    CqCreated {
        /// Owner.
        ctx: CtxId,
        /// The CQ handle.
        cq: Handle,
        /// Granted size.
        cqe: u32,
    },
    /// A CQ was resized.
    CqResized {
        /// Owner.
        ctx: CtxId,
        /// The CQ handle.
        cq: Handle,
        /// New size.
        cqe: u32,
    },
    /// A CQ was destroyed.
    CqDestroyed {
        /// Owner.
        ctx: CtxId,
        /// The CQ handle.
        cq: Handle,
    },
    /// A QP owned by a context was created on device `device`.
    QpCreated {
        /// Owner.
        ctx: CtxId,
        /// The owner's handle.
        qp: Handle,
        /// Index of the device (as in [`Core::devices`]).
        device: usize,
        /// What the engine needs of it.
        info: OwnedQpInfo,
    },
    /// A shared XRC receive QP was created on device `device` (by any of the three faces).
    XrcRecvQpCreated {
        /// Index of the device.
        device: usize,
        /// Its QP number.
        qpn: u32,
    },
    /// QP `qpn` (owned or XRC receive) was modified; `attr` is what it holds now.
    QpModified {
        /// The QP number.
        qpn: u32,
        /// The attributes after the modify.
        attr: QpAttr,
    },
    /// QP `qpn` no longer exists: an owned QP was destroyed, or an XRC receive QP lost its
    /// last holder. Its number may be handed out again after this.
    QpDestroyed {
        /// The QP number.
        qpn: u32,
    },
    /// An SRQ (basic or XRC) was created on device `device`.
    SrqCreated {
        /// Owner.
        ctx: CtxId,
        /// The SRQ handle.
        srq: Handle,
        /// Index of the device.
        device: usize,
        /// What the engine needs of it.
        info: SrqInfo,
    },
    /// An SRQ's limit was (re)armed (`ibv_modify_srq` with `IBV_SRQ_LIMIT`; IBA 10.2.9.3).
    SrqLimitArmed {
        /// Owner.
        ctx: CtxId,
        /// The SRQ handle.
        srq: Handle,
        /// The limit.
        limit: u32,
    },
    /// An SRQ was destroyed.
    SrqDestroyed {
        /// Owner.
        ctx: CtxId,
        /// The SRQ handle.
        srq: Handle,
    },
    /// An MR was deregistered: nothing may touch its memory any more.
    MrDeregistered {
        /// Owner.
        ctx: CtxId,
        /// The MR handle.
        mr: Handle,
    },
    /// UD QP `qpn` of device `device` was attached to multicast group `mgid`; `first`: no
    /// other QP of the device was (the device joins the IP group).
    McastAttached {
        /// Index of the device.
        device: usize,
        /// The group.
        mgid: Gid,
        /// The QP number.
        qpn: u32,
        /// The device's first QP in the group.
        first: bool,
    },
    /// QP `qpn` left group `mgid` (detached, or destroyed: then before its `QpDestroyed`);
    /// `last`: no QP of the device is left in it (the device leaves the IP group).
    McastDetached {
        /// Index of the device.
        device: usize,
        /// The group.
        mgid: Gid,
        /// The QP number.
        qpn: u32,
        /// The device's last QP in the group.
        last: bool,
    },
    /// An MR was given a new range (`ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_TRANSLATION`): a
    /// mapping of the old range no longer backs it, and the core no longer counts one.
    MrRangeChanged {
        /// Owner.
        ctx: CtxId,
        /// The MR handle.
        mr: Handle,
    },
    /// A memory window was allocated on `device` (unbound; docs/design/memory-windows.md).
    MwAllocated {
        /// Owner.
        ctx: CtxId,
        /// The window handle.
        mw: Handle,
        /// Device index.
        device: usize,
        /// What the transport mirrors.
        info: crate::mw::MwInfo,
    },
    /// A memory window was deallocated: its key resolves to nothing from now on.
    MwDeallocated {
        /// Owner.
        ctx: CtxId,
        /// The window handle.
        mw: Handle,
        /// Device index.
        device: usize,
        /// Its R_Key at allocation (the index part names it).
        rkey: u32,
    },
}

impl Core {
    /// The oldest change not yet taken, if any. The owner drains this after every operation
    /// (the daemon after every command and context teardown); changes are not dropped, so an
    /// owner that never drains keeps them all.
    pub fn poll_change(&mut self) -> Option<CoreChange> {
        self.changes.pop_front()
    }

    pub(crate) fn push_change(&mut self, c: CoreChange) {
        self.changes.push_back(c);
    }
}
