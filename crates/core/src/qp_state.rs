//! The QP state machine: which transitions exist and which attribute-mask bits each one
//! requires or allows, per QP type.
//!
//! Source of the table: IBA Vol. 1 §10.3 and §11.2.5.2 (Modify QP) as encoded by Linux's
//! `qp_state_table` / `ib_modify_qp_is_ok` (drivers/infiniband/core/verbs.c), with the XRC
//! columns of docs/design/xrc-semantics.md §1.4. Before the check, uverbs silently drops bits that do not
//! apply to XRC QPs ([`strip_for_uverbs`]); kernel callers get no such stripping.

use crate::error::{Error, Result};
use crate::types::{AttrMask as M, QpState as S, QpType as T};

/// Required and optional attribute bits of one (type, from, to) row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// Bits that must all be present (besides `STATE`).
    pub required: M,
    /// Bits that may be present.
    pub optional: M,
}

const fn m(bits: u32) -> M {
    M(bits)
}

// Bit shorthands for the table below (values of `enum ibv_qp_attr_mask`).
const CUR: u32 = 1 << 1;
const SQD_NOTIFY: u32 = 1 << 2;
const ACC: u32 = 1 << 3;
const PKEY: u32 = 1 << 4;
const PORT: u32 = 1 << 5;
const QKEY: u32 = 1 << 6;
const AV: u32 = 1 << 7;
const MTU: u32 = 1 << 8;
const TIMEOUT: u32 = 1 << 9;
const RETRY: u32 = 1 << 10;
const RNR_RETRY: u32 = 1 << 11;
const RQ_PSN: u32 = 1 << 12;
const MAX_RD: u32 = 1 << 13;
const ALT: u32 = 1 << 14;
const MIN_RNR: u32 = 1 << 15;
const SQ_PSN: u32 = 1 << 16;
const MAX_DEST_RD: u32 = 1 << 17;
const MIG: u32 = 1 << 18;
const DEST_QPN: u32 = 1 << 20;

const fn row(required: u32, optional: u32) -> Option<Row> {
    Some(Row {
        required: m(required),
        optional: m(optional),
    })
}

/// The row for `from -> to` on a QP of type `t`, or `None` if the transition does not exist.
///
/// Transitions to RESET and ERR exist from every state and take only `STATE`.
pub fn row_for(t: T, from: S, to: S) -> Option<Row> {
    use S::*;
    use T::*;
    // RC-like columns: RC and the two XRC types differ only in a few bits.
    match (from, to) {
        // Every state can be reset; every state but RESET can be forced to ERR
        // (IBA 10.3.1: a QP in RESET has no resources that could fail).
        (_, Reset) => row(0, 0),
        (Reset, Err) => None,
        (_, Err) => row(0, 0),
        (Reset, Init) => match t {
            Ud => row(PKEY | PORT | QKEY, 0),
            Uc | Rc | XrcSend | XrcRecv => row(PKEY | PORT | ACC, 0),
        },
        (Init, Init) => match t {
            Ud => row(0, PKEY | PORT | QKEY),
            Uc | Rc | XrcSend | XrcRecv => row(0, PKEY | PORT | ACC),
        },
        (Init, Rtr) => match t {
            Ud => row(0, PKEY | QKEY),
            Uc | XrcSend => row(AV | MTU | DEST_QPN | RQ_PSN, ALT | ACC | PKEY),
            Rc | XrcRecv => row(
                AV | MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD | MIN_RNR,
                ALT | ACC | PKEY,
            ),
        },
        (Rtr, Rts) => match t {
            Ud => row(SQ_PSN, CUR | QKEY),
            Uc => row(SQ_PSN, CUR | ALT | ACC | MIG),
            Rc => row(
                TIMEOUT | RETRY | RNR_RETRY | SQ_PSN | MAX_RD,
                CUR | ALT | ACC | MIN_RNR | MIG,
            ),
            XrcSend => row(
                TIMEOUT | RETRY | RNR_RETRY | SQ_PSN | MAX_RD,
                CUR | ALT | ACC | MIG,
            ),
            XrcRecv => row(TIMEOUT | SQ_PSN, CUR | ALT | ACC | MIN_RNR | MIG),
        },
        (Rts, Rts) => match t {
            Ud => row(0, CUR | QKEY),
            Uc | XrcSend => row(0, CUR | ACC | ALT | MIG),
            Rc | XrcRecv => row(0, CUR | ACC | ALT | MIG | MIN_RNR),
        },
        (Rts, Sqd) => row(0, SQD_NOTIFY),
        (Sqd, Rts) => match t {
            Ud => row(0, CUR | QKEY),
            Uc | XrcSend => row(0, CUR | ALT | ACC | MIG),
            Rc | XrcRecv => row(0, CUR | ALT | ACC | MIN_RNR | MIG),
        },
        (Sqd, Sqd) => match t {
            Ud => row(0, PKEY | QKEY),
            Uc => row(0, AV | ALT | ACC | PKEY | MIG),
            Rc => row(
                0,
                PORT | AV
                    | TIMEOUT
                    | RETRY
                    | RNR_RETRY
                    | MAX_RD
                    | MAX_DEST_RD
                    | ALT
                    | ACC
                    | PKEY
                    | MIN_RNR
                    | MIG,
            ),
            XrcSend => row(
                0,
                PORT | AV | TIMEOUT | RETRY | RNR_RETRY | MAX_RD | ALT | ACC | PKEY | MIG,
            ),
            XrcRecv => row(
                0,
                PORT | AV | TIMEOUT | MAX_DEST_RD | ALT | ACC | PKEY | MIN_RNR | MIG,
            ),
        },
        // SQE is reached only by the unreliable types (IBA 10.3.1.3: a send error on a
        // reliable QP goes straight to ERR). The kernel still lists the transition for every
        // type, with no attributes for the reliable ones, and so do we.
        (Sqe, Rts) => match t {
            Ud => row(0, CUR | QKEY),
            Uc => row(0, CUR | ACC),
            Rc | XrcSend | XrcRecv => row(0, 0),
        },
        _ => None,
    }
}

/// Drops the bits uverbs ignores for XRC QPs before it validates a user's modify
/// (uverbs_cmd.c `modify_qp_mask`): the send-side limits on a receive QP and the
/// responder-side limits on a send QP.
pub fn strip_for_uverbs(t: T, mask: M) -> M {
    match t {
        T::XrcSend => mask.without(M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER),
        T::XrcRecv => mask.without(M::MAX_QP_RD_ATOMIC | M::RETRY_CNT | M::RNR_RETRY),
        T::Rc | T::Uc | T::Ud => mask,
    }
}

/// Checks a modify request against the table (`ib_modify_qp_is_ok`) and returns the state
/// the QP moves to.
///
/// `mask` must already be stripped (if the caller is a user) and free of unknown bits.
/// `target` is the requested state; it is only read when `mask` has `STATE`, otherwise the
/// QP stays in `current` and the `current -> current` row applies. `claimed_current` is
/// the `cur_qp_state` attribute, read only when `mask` has `CUR_STATE`.
pub fn check_transition(t: T, current: S, mask: M, target: S, claimed_current: S) -> Result<S> {
    let to = if mask.contains(M::STATE) {
        target
    } else {
        current
    };
    if mask.contains(M::CUR_STATE) {
        // IBA 11.2.5.2: the current-state hint is only meaningful in RTR, RTS, SQD and SQE,
        // and it must agree with the QP (we keep the real state; a stale hint is refused).
        if !matches!(current, S::Rtr | S::Rts | S::Sqd | S::Sqe) || claimed_current != current {
            return Err(Error::InvalidArgument(
                "cur_qp_state does not match the QP state",
            ));
        }
    }
    let Some(r) = row_for(t, current, to) else {
        return Err(Error::InvalidTransition {
            qp_type: t,
            from: current,
            to,
        });
    };
    let given = mask.without(M::STATE);
    let missing = r.required.without(given);
    if !missing.is_empty() {
        return Err(Error::MissingAttributes {
            from: current,
            to,
            missing: missing.0,
        });
    }
    let extra = given.without(r.required | r.optional);
    if !extra.is_empty() {
        return Err(Error::ForbiddenAttributes {
            from: current,
            to,
            extra: extra.0,
        });
    }
    Ok(to)
}
