//! Asynchronous events as a context reads them.

use softverbs_core::types::EventType;

/// What an async event is about, named the way this context knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Element {
    /// A QP handle of this context ([`Qp::handle`](crate::Qp::handle) or
    /// [`XrcRecvQp::handle`](crate::XrcRecvQp::handle)).
    Qp(u32),
    /// An XRC receive QP this context holds through a legacy or minimal registration,
    /// named by its QP number.
    XrcRecvQpNum(u32),
    /// A CQ handle of this context.
    Cq(u32),
    /// An SRQ handle of this context.
    Srq(u32),
    /// A port of the device.
    Port(u8),
    /// The device.
    Device,
    /// An element kind this client does not know (a newer daemon).
    Unknown {
        /// The wire `element_kind`.
        kind: u32,
        /// The wire `element`.
        value: u32,
    },
}

/// One asynchronous event (`struct ibv_async_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The event type, if this client knows it.
    pub event_type: Option<EventType>,
    /// `enum ibv_event_type` as sent.
    pub raw_event_type: u32,
    /// What the event is about.
    pub element: Element,
    /// `event_type` as the legacy OFED API reports it: with `IBV_XRC_QP_EVENT_FLAG`
    /// (0x80000000) set when the element is an XRC receive QP number.
    pub legacy_event_type: u32,
}
