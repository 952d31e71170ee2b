//! Asynchronous events (IBA 11.6.3) and the per-context queue they wait in until the client
//! reads them (`ibv_get_async_event`).

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

use crate::ids::Handle;
use crate::types::{EventType, XRC_QP_EVENT_FLAG};

/// What an event is about, as the receiving context names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventElement {
    /// A QP handle of this context: an owned QP, or an XRC receive QP handle from
    /// `create_qp`/`open_qp`.
    Qp(Handle),
    /// An XRC receive QP this context holds through the legacy or minimal registration API,
    /// named by its QP number (legacy OFED sets [`XRC_QP_EVENT_FLAG`] in `event_type`).
    XrcRecvQpNum(u32),
    /// A CQ of this context.
    Cq(Handle),
    /// An SRQ of this context.
    Srq(Handle),
    /// A port of the context's device.
    Port(u8),
    /// The device itself.
    Device,
}

/// One event as a context reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AsyncEvent {
    /// `enum ibv_event_type`.
    pub event_type: EventType,
    /// What the event is about.
    pub element: EventElement,
}

impl AsyncEvent {
    /// `event_type` as the legacy OFED API reports it: with [`XRC_QP_EVENT_FLAG`] set when
    /// the element is an XRC receive QP number.
    pub fn legacy_event_type(&self) -> u32 {
        let t = self.event_type as u32;
        match self.element {
            EventElement::XrcRecvQpNum(_) => t | XRC_QP_EVENT_FLAG,
            _ => t,
        }
    }
}

/// Events waiting to be read per context. The queue is bounded: a client that never reads
/// its async fd must not make the daemon grow without limit (uverbs' queue is unbounded; this
/// is a deliberate difference). Events beyond the bound are counted and dropped.
pub const MAX_PENDING_EVENTS: usize = 1 << 16;

#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    queue: VecDeque<AsyncEvent>,
    pub(crate) dropped: u64,
}

impl EventQueue {
    pub(crate) fn push(&mut self, ev: AsyncEvent) -> bool {
        if self.queue.len() >= MAX_PENDING_EVENTS {
            self.dropped += 1;
            return false;
        }
        self.queue.push_back(ev);
        true
    }

    pub(crate) fn pop(&mut self) -> Option<AsyncEvent> {
        self.queue.pop_front()
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Drops the unread events about `element` (uverbs `ib_uverbs_release_uevent`): once a
    /// holder leaves, nothing about the object may reach it any more.
    pub(crate) fn purge(&mut self, element: EventElement) {
        if !self.queue.is_empty() {
            self.queue.retain(|e| e.element != element);
        }
    }
}
