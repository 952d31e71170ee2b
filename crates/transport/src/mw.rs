//! Memory windows as the device holds them (IBA 10.6.7): each window's binding — MR, range,
//! access and, for type 2, the QP it is bound to — and the rules the send queue (bind,
//! local invalidate) and the responder (access through a window's R_Key, Send with
//! Invalidate) check. The core owns the windows' lifetime ([`softverbs_core::mw`]) and is
//! told how many windows each MR carries through [`Output::WindowBinding`], since an MR with
//! bound windows cannot be deregistered (IBA 10.6.7.2.6).
//!
//! The rules, with the IBA compliance statements rxe cites for them (rxe_mw.c):
//! - bind: the window key names a live window with that R_Key; a type 1 window is valid, a
//!   type 2 one is free (o10-37.2.30) and its PD is the QP's (C10-72); a type 2 bind has a
//!   length (o10-37.2.40); the MR is on the window's PD, was registered with
//!   `IBV_ACCESS_MW_BIND` (C10-73), has local write if the window grants remote write or
//!   atomic (C10-74), and holds the whole range (C10-75); zero-based windows are not offered.
//!   A failed bind completes with `IBV_WC_MW_BIND_ERR` and the QP goes to error.
//! - remote access: the R_Key is the window's current one, the window is valid and bound, its
//!   PD is the responder QP's, a type 2 window is bound to that QP, it grants the access and
//!   holds the range; anything else is a remote access error (NAK, IBA 9.7.5.2.4).
//! - invalidation (local, or remote with Send with Invalidate): only a bound type 2 window
//!   of the QP's PD (o10-37.2.26); a remote one must arrive on the QP it is bound to. An MR's
//!   key is refused too: only fast-register MRs may be invalidated, and softverbs has none.
//! - destroying a QP invalidates the type 2 windows bound to it; deallocating a window
//!   invalidates it.

use std::collections::{HashMap, VecDeque};

use softverbs_core::datapath::MemKeys;
use softverbs_core::datapath::{MemError, MemTarget, PdRef};
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::mw::{is_window_key, MwInfo, MwType};
use softverbs_core::types::Access;
use softverbs_core::wr::BindMw;

/// A window's binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Binding {
    mr_ctx: CtxId,
    mr: Handle,
    mr_lkey: u32,
    addr: u64,
    length: u64,
    access: Access,
    /// Type 2: the QP it is bound to.
    qpn: Option<u32>,
}

#[derive(Clone, Copy, Debug)]
struct Window {
    pd: PdRef,
    mw_type: MwType,
    rkey: u32,
    binding: Option<Binding>,
}

/// Why a bind or an invalidation failed (the completion says which status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refused;

/// A window was bound to (`bound`) or unbound from MR `mr` of `ctx`: the shell tells the
/// core ([`Core::note_window_binding`]) before the next command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowNote {
    /// The MR's owner.
    pub ctx: CtxId,
    /// The MR.
    pub mr: Handle,
    /// Bound or unbound.
    pub bound: bool,
}

/// Every memory window of one device, by R_Key index.
#[derive(Debug, Default)]
pub struct Windows {
    by_index: HashMap<u32, Window>,
    notes: VecDeque<WindowNote>,
}

/// Window access flags a bind may grant (`mw_access_flags`): remote read, write, atomic.
const BINDABLE: Access = Access(
    Access::REMOTE_READ.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_ATOMIC.0
        | Access::LOCAL_WRITE.0,
);

impl Windows {
    /// A window was allocated.
    pub fn add(&mut self, info: &MwInfo) {
        self.by_index.insert(
            info.rkey >> 8,
            Window {
                pd: info.pd,
                mw_type: info.mw_type,
                rkey: info.rkey,
                binding: None,
            },
        );
    }

    /// A window was deallocated: its binding goes with it.
    pub fn remove(&mut self, rkey: u32) {
        if let Some(w) = self.by_index.remove(&(rkey >> 8)) {
            unbind_note(w.binding, &mut self.notes);
        }
    }

    /// The oldest binding change the core has not been told of.
    pub fn poll_note(&mut self) -> Option<WindowNote> {
        self.notes.pop_front()
    }

    /// Windows the engine holds.
    pub fn len(&self) -> usize {
        self.by_index.len()
    }

    /// True when the engine holds no window.
    pub fn is_empty(&self) -> bool {
        self.by_index.is_empty()
    }

    /// A bind work request posted on QP `qpn` of PD `qp_pd` (the rules in the module doc).
    pub(crate) fn bind(
        &mut self,
        core: &dyn MemKeys,
        qpn: u32,
        qp_pd: PdRef,
        b: &BindMw,
    ) -> Result<(), Refused> {
        let w = self.by_index.get(&(b.mw_rkey >> 8)).ok_or(Refused)?;
        if w.rkey != b.mw_rkey || b.new_rkey >> 8 != b.mw_rkey >> 8 {
            return Err(Refused);
        }
        if w.mw_type == MwType::Two && (w.binding.is_some() || w.pd != qp_pd || b.length == 0) {
            return Err(Refused);
        }
        if !BINDABLE.contains(b.access) {
            // Zero-based windows (and unknown flags) are not offered.
            return Err(Refused);
        }
        let binding = if b.length == 0 {
            None
        } else {
            let m = core.mr_for_bind(b.mr_lkey).ok_or(Refused)?;
            let needs_local_write = b
                .access
                .intersects(Access(Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0));
            let end = b.addr.checked_add(b.length).ok_or(Refused)?;
            if m.pd != w.pd
                || !m.access.contains(Access::MW_BIND)
                || (needs_local_write && !m.access.contains(Access::LOCAL_WRITE))
                || b.addr < m.iova
                || end > m.iova + m.length
            {
                return Err(Refused);
            }
            Some(Binding {
                mr_ctx: m.ctx,
                mr: m.mr,
                mr_lkey: b.mr_lkey,
                addr: b.addr,
                length: b.length,
                access: b.access,
                qpn: (w.mw_type == MwType::Two).then_some(qpn),
            })
        };
        let w = self
            .by_index
            .get_mut(&(b.mw_rkey >> 8))
            .expect("looked up above");
        unbind_note(w.binding.take(), &mut self.notes);
        if let Some(n) = binding {
            self.notes.push_back(WindowNote {
                ctx: n.mr_ctx,
                mr: n.mr,
                bound: true,
            });
        }
        w.binding = binding;
        w.rkey = b.new_rkey;
        Ok(())
    }

    /// Invalidates the type 2 window `rkey` for QP `qpn` of PD `pd`: from its own send
    /// queue (`IBV_WR_LOCAL_INV`, `remote` false) or a peer's Send with Invalidate arriving
    /// on it (`remote` true, which must be the QP the window is bound to).
    pub(crate) fn invalidate(
        &mut self,
        qpn: u32,
        pd: PdRef,
        rkey: u32,
        remote: bool,
    ) -> Result<(), Refused> {
        if !is_window_key(rkey) {
            // An MR's key: only fast-register MRs are invalidatable, and there are none.
            return Err(Refused);
        }
        let w = self.by_index.get_mut(&(rkey >> 8)).ok_or(Refused)?;
        let Some(b) = w.binding else {
            return Err(Refused);
        };
        if w.rkey != rkey || w.mw_type != MwType::Two || w.pd != pd {
            return Err(Refused);
        }
        if remote && b.qpn != Some(qpn) {
            return Err(Refused);
        }
        unbind_note(w.binding.take(), &mut self.notes);
        Ok(())
    }

    /// QP `qpn` was destroyed: the type 2 windows bound to it are invalidated.
    pub fn qp_destroyed(&mut self, qpn: u32) {
        for w in self.by_index.values_mut() {
            if w.binding.is_some_and(|b| b.qpn == Some(qpn)) {
                unbind_note(w.binding.take(), &mut self.notes);
            }
        }
    }

    /// Checks a remote access to `[va, va+len)` with R_Key `rkey` arriving on QP `qpn` of PD
    /// `pd`: through a window if the key names one, else through the MR (the core's
    /// `check_mem`).
    pub(crate) fn check_remote(
        &self,
        core: &dyn MemKeys,
        qpn: u32,
        pd: PdRef,
        rkey: u32,
        (va, len): (u64, u64),
        need: Access,
    ) -> Result<MemTarget, MemError> {
        if !is_window_key(rkey) {
            return core.check_mem(pd, rkey, va, len, need);
        }
        let w = self
            .by_index
            .get(&(rkey >> 8))
            .ok_or(MemError::UnknownKey)?;
        let b = w.binding.ok_or(MemError::UnknownKey)?;
        if w.rkey != rkey {
            return Err(MemError::UnknownKey);
        }
        if w.pd != pd || b.qpn.is_some_and(|q| q != qpn) {
            return Err(MemError::WrongPd);
        }
        if !b.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        let end = va.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if va < b.addr || end > b.addr + b.length {
            return Err(MemError::OutOfBounds);
        }
        // The MR outlives its bound windows (dereg is refused), and its range held the
        // window's at bind time; a rereg is refused too.
        core.check_mem(w.pd, b.mr_lkey, va, len, Access::EMPTY)
    }
}

fn unbind_note(b: Option<Binding>, notes: &mut VecDeque<WindowNote>) {
    if let Some(b) = b {
        notes.push_back(WindowNote {
            ctx: b.mr_ctx,
            mr: b.mr,
            bound: false,
        });
    }
}
