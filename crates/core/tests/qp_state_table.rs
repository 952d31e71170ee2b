//! Independent check of the QP state machine (`softverbs_core::qp_state`) against the
//! primary sources, not against the implementation's own table.
//!
//! Expected values come from:
//! - Linux `drivers/infiniband/core/verbs.c`: `qp_state_table` and `ib_modify_qp_is_ok`
//!   (RC, UC, UD, XRC_INI and XRC_TGT columns; identical in the v4.5-era and the current
//!   xarray-era versions for these five types);
//! - docs/design/xrc-semantics.md §1.4 (XRC_TGT / XRC_INI table, the uverbs `modify_qp_mask` stripping
//!   and the CUR_STATE rule), which agrees with the kernel table for the XRC columns.
//!
//! Every check collects its mismatches and fails once, listing each failing
//! (type, from, to, mask), so one run shows every disagreement.

use softverbs_core::qp_state::{check_transition, row_for, strip_for_uverbs};
use softverbs_core::types::{AttrMask, QpState, QpType};
use softverbs_core::{errno, Error};

// ibv_qp_attr_mask / ib_qp_attr_mask bit numbers (verbs.h, ib_verbs.h), written out here
// so the expectations do not depend on the crate's constants (checked against them below).
const STATE: u32 = 1 << 0;
const CUR_STATE: u32 = 1 << 1;
const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
const ACCESS_FLAGS: u32 = 1 << 3;
const PKEY_INDEX: u32 = 1 << 4;
const PORT: u32 = 1 << 5;
const QKEY: u32 = 1 << 6;
const AV: u32 = 1 << 7;
const PATH_MTU: u32 = 1 << 8;
const TIMEOUT: u32 = 1 << 9;
const RETRY_CNT: u32 = 1 << 10;
const RNR_RETRY: u32 = 1 << 11;
const RQ_PSN: u32 = 1 << 12;
const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
const ALT_PATH: u32 = 1 << 14;
const MIN_RNR_TIMER: u32 = 1 << 15;
const SQ_PSN: u32 = 1 << 16;
const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
const PATH_MIG_STATE: u32 = 1 << 18;
const CAP: u32 = 1 << 19;
const DEST_QPN: u32 = 1 << 20;

/// Number of standard mask bits (0..=20).
const STANDARD_BITS: u32 = 21;

const BIT_NAMES: [&str; STANDARD_BITS as usize] = [
    "STATE",
    "CUR_STATE",
    "EN_SQD_ASYNC_NOTIFY",
    "ACCESS_FLAGS",
    "PKEY_INDEX",
    "PORT",
    "QKEY",
    "AV",
    "PATH_MTU",
    "TIMEOUT",
    "RETRY_CNT",
    "RNR_RETRY",
    "RQ_PSN",
    "MAX_QP_RD_ATOMIC",
    "ALT_PATH",
    "MIN_RNR_TIMER",
    "SQ_PSN",
    "MAX_DEST_RD_ATOMIC",
    "PATH_MIG_STATE",
    "CAP",
    "DEST_QPN",
];

/// Human-readable mask, e.g. `STATE|PKEY_INDEX|0x2000000`.
fn mask_name(mask: u32) -> String {
    if mask == 0 {
        return "0".to_string();
    }
    let mut parts: Vec<String> = (0..STANDARD_BITS)
        .filter(|b| mask & (1 << b) != 0)
        .map(|b| BIT_NAMES[b as usize].to_string())
        .collect();
    let rest = mask & !((1u32 << STANDARD_BITS) - 1);
    if rest != 0 {
        parts.push(format!("{rest:#x}"));
    }
    parts.join("|")
}

/// The single bits set in `mask`.
fn bits(mask: u32) -> impl Iterator<Item = u32> {
    (0..32)
        .map(|b| 1u32 << b)
        .filter(move |bit| mask & bit != 0)
}

/// Every standard bit (0..=20).
fn standard_bits() -> impl Iterator<Item = u32> {
    (0..STANDARD_BITS).map(|b| 1u32 << b)
}

const TYPES: [QpType; 5] = [
    QpType::Rc,
    QpType::Uc,
    QpType::Ud,
    QpType::XrcSend,
    QpType::XrcRecv,
];

const STATES: [QpState; 7] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Sqe,
    QpState::Err,
];

/// Expected (required, optional) bits for one transition, or `None` if the kernel table
/// marks the (from, to) pair as not valid. `required` and `optional` exclude `STATE`.
///
/// Written from `qp_state_table` in Linux verbs.c. Note that the `.valid` flag there is per
/// (from, to) pair, not per type: a pair that is valid but has no entry for a type has
/// required = optional = 0 for that type (e.g. SQE->RTS for RC and the XRC types).
fn expected(t: QpType, from: QpState, to: QpState) -> Option<(u32, u32)> {
    use QpState::*;
    use QpType::*;

    // Shared building blocks of the kernel table.
    let connected_init = PKEY_INDEX | PORT | ACCESS_FLAGS;
    let ud_init = PKEY_INDEX | PORT | QKEY;
    let uc_rtr_req = AV | PATH_MTU | DEST_QPN | RQ_PSN;
    let rc_rtr_req = uc_rtr_req | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER;
    let connected_rtr_opt = ALT_PATH | ACCESS_FLAGS | PKEY_INDEX;
    let rc_rts_req = TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC;
    // Optional set of RTR->RTS, RTS->RTS and SQD->RTS (identical in the kernel).
    let uc_to_rts_opt = CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE;
    let rc_to_rts_opt = uc_to_rts_opt | MIN_RNR_TIMER;
    let ud_to_rts_opt = CUR_STATE | QKEY;

    let row = match (from, to) {
        // Any -> RESET; INIT/RTR/RTS/SQD/SQE/ERR -> ERR. RESET -> ERR is NOT valid: the
        // kernel's RESET row lists only RESET and INIT (falls through to `None` below).
        (_, Reset) => (0, 0),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Err) => (0, 0),

        (Reset, Init) => match t {
            Ud => (ud_init, 0),
            Rc | Uc | XrcSend | XrcRecv => (connected_init, 0),
        },
        (Init, Init) => match t {
            Ud => (0, ud_init),
            Rc | Uc | XrcSend | XrcRecv => (0, connected_init),
        },
        (Init, Rtr) => match t {
            Ud => (0, PKEY_INDEX | QKEY),
            Uc | XrcSend => (uc_rtr_req, connected_rtr_opt),
            Rc | XrcRecv => (rc_rtr_req, connected_rtr_opt),
        },
        (Rtr, Rts) => match t {
            Ud => (SQ_PSN, ud_to_rts_opt),
            Uc => (SQ_PSN, uc_to_rts_opt),
            Rc => (rc_rts_req, rc_to_rts_opt),
            XrcSend => (rc_rts_req, uc_to_rts_opt),
            XrcRecv => (TIMEOUT | SQ_PSN, rc_to_rts_opt),
        },
        (Rts | Sqd, Rts) => match t {
            Ud => (0, ud_to_rts_opt),
            Uc | XrcSend => (0, uc_to_rts_opt),
            Rc | XrcRecv => (0, rc_to_rts_opt),
        },
        (Rts, Sqd) => (0, EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match t {
            Ud => (0, PKEY_INDEX | QKEY),
            Uc => (
                0,
                AV | ALT_PATH | ACCESS_FLAGS | PKEY_INDEX | PATH_MIG_STATE,
            ),
            Rc => (
                0,
                PORT | AV
                    | TIMEOUT
                    | RETRY_CNT
                    | RNR_RETRY
                    | MAX_QP_RD_ATOMIC
                    | MAX_DEST_RD_ATOMIC
                    | ALT_PATH
                    | ACCESS_FLAGS
                    | PKEY_INDEX
                    | MIN_RNR_TIMER
                    | PATH_MIG_STATE,
            ),
            XrcSend => (
                0,
                PORT | AV
                    | TIMEOUT
                    | RETRY_CNT
                    | RNR_RETRY
                    | MAX_QP_RD_ATOMIC
                    | ALT_PATH
                    | ACCESS_FLAGS
                    | PKEY_INDEX
                    | PATH_MIG_STATE,
            ),
            XrcRecv => (
                0,
                PORT | AV
                    | TIMEOUT
                    | MAX_DEST_RD_ATOMIC
                    | ALT_PATH
                    | ACCESS_FLAGS
                    | PKEY_INDEX
                    | MIN_RNR_TIMER
                    | PATH_MIG_STATE,
            ),
        },
        // `.valid = 1` for the pair; the kernel lists only UD, UC (and SMI/GSI) masks, so
        // RC/XRC_INI/XRC_TGT accept SQE->RTS with STATE alone and refuse every other bit.
        (Sqe, Rts) => match t {
            Ud => (0, CUR_STATE | QKEY),
            Uc => (0, CUR_STATE | ACCESS_FLAGS),
            Rc | XrcSend | XrcRecv => (0, 0),
        },
        _ => return None,
    };
    Some(row)
}

/// States in which `CUR_STATE` may be given (`ib_modify_qp_is_ok`).
fn cur_state_allowed_in(s: QpState) -> bool {
    matches!(s, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
}

fn call(t: QpType, from: QpState, mask: u32, to: QpState) -> Result<QpState, Error> {
    check_transition(t, from, AttrMask(mask), to, from)
}

fn ctx(t: QpType, from: QpState, to: QpState, mask: u32) -> String {
    format!("({t:?}, {from:?} -> {to:?}, mask {})", mask_name(mask))
}

/// Every valid (type, from, to) row with its expected (required, optional).
fn valid_rows() -> Vec<(QpType, QpState, QpState, u32, u32)> {
    let mut v = Vec::new();
    for t in TYPES {
        for from in STATES {
            for to in STATES {
                if let Some((req, opt)) = expected(t, from, to) {
                    v.push((t, from, to, req, opt));
                }
            }
        }
    }
    v
}

fn invalid_pairs() -> Vec<(QpType, QpState, QpState)> {
    let mut v = Vec::new();
    for t in TYPES {
        for from in STATES {
            for to in STATES {
                if expected(t, from, to).is_none() {
                    v.push((t, from, to));
                }
            }
        }
    }
    v
}

fn report(what: &str, checked: usize, failures: Vec<String>) {
    eprintln!("{what}: {checked} checks, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{what}: {} of {checked} checks failed:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// Every rejection must surface as EINVAL to a C caller.
fn expect_einval(failures: &mut Vec<String>, c: &str, e: &Error) {
    if e.errno() != errno::EINVAL {
        failures.push(format!("{c}: {e:?} maps to errno {} not EINVAL", e.errno()));
    }
}

#[test]
fn own_bit_constants_match_crate() {
    let pairs = [
        (STATE, AttrMask::STATE),
        (CUR_STATE, AttrMask::CUR_STATE),
        (EN_SQD_ASYNC_NOTIFY, AttrMask::EN_SQD_ASYNC_NOTIFY),
        (ACCESS_FLAGS, AttrMask::ACCESS_FLAGS),
        (PKEY_INDEX, AttrMask::PKEY_INDEX),
        (PORT, AttrMask::PORT),
        (QKEY, AttrMask::QKEY),
        (AV, AttrMask::AV),
        (PATH_MTU, AttrMask::PATH_MTU),
        (TIMEOUT, AttrMask::TIMEOUT),
        (RETRY_CNT, AttrMask::RETRY_CNT),
        (RNR_RETRY, AttrMask::RNR_RETRY),
        (RQ_PSN, AttrMask::RQ_PSN),
        (MAX_QP_RD_ATOMIC, AttrMask::MAX_QP_RD_ATOMIC),
        (ALT_PATH, AttrMask::ALT_PATH),
        (MIN_RNR_TIMER, AttrMask::MIN_RNR_TIMER),
        (SQ_PSN, AttrMask::SQ_PSN),
        (MAX_DEST_RD_ATOMIC, AttrMask::MAX_DEST_RD_ATOMIC),
        (PATH_MIG_STATE, AttrMask::PATH_MIG_STATE),
        (CAP, AttrMask::CAP),
        (DEST_QPN, AttrMask::DEST_QPN),
    ];
    for (i, (mine, theirs)) in pairs.iter().enumerate() {
        assert_eq!(*mine, theirs.0, "bit {} ({})", i, BIT_NAMES[i]);
        assert_eq!(*mine, 1 << i, "bit {} ({})", i, BIT_NAMES[i]);
    }
}

#[test]
fn table_shape() {
    // 22 valid (from, to) pairs per type in the kernel table, 27 invalid.
    assert_eq!(valid_rows().len(), 22 * TYPES.len());
    assert_eq!(invalid_pairs().len(), 27 * TYPES.len());
}

#[test]
fn row_for_matches_kernel_table() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for t in TYPES {
        for from in STATES {
            for to in STATES {
                checked += 1;
                let want = expected(t, from, to);
                let got = row_for(t, from, to).map(|r| (r.required.0, r.optional.0));
                if want != got {
                    let show = |x: Option<(u32, u32)>| match x {
                        None => "None (invalid)".to_string(),
                        Some((r, o)) => {
                            format!("required {} / optional {}", mask_name(r), mask_name(o))
                        }
                    };
                    failures.push(format!(
                        "({t:?}, {from:?} -> {to:?}): kernel {}, implementation {}",
                        show(want),
                        show(got)
                    ));
                }
            }
        }
    }
    report("row_for vs kernel qp_state_table", checked, failures);
}

/// (a) exactly the required bits plus STATE is accepted and returns `to`.
#[test]
fn required_only_is_accepted() {
    let mut failures = Vec::new();
    let rows = valid_rows();
    for &(t, from, to, req, _) in &rows {
        let mask = req | STATE;
        match call(t, from, mask, to) {
            Ok(s) if s == to => {}
            other => failures.push(format!(
                "{}: expected Ok({to:?}), got {other:?}",
                ctx(t, from, to, mask)
            )),
        }
    }
    report("required bits + STATE", rows.len(), failures);
}

/// (b) required + each single optional bit is accepted; also required + all optional bits.
#[test]
fn each_optional_bit_is_accepted() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (t, from, to, req, opt) in valid_rows() {
        let extras = bits(opt).chain(std::iter::once(opt));
        for extra in extras {
            if extra == 0 {
                continue;
            }
            checked += 1;
            let mask = req | STATE | extra;
            match call(t, from, mask, to) {
                Ok(s) if s == to => {}
                other => failures.push(format!(
                    "{}: optional {} should be accepted, got {other:?}",
                    ctx(t, from, to, mask),
                    mask_name(extra)
                )),
            }
        }
    }
    report("required + optional", checked, failures);
}

/// (c) required minus each single required bit is rejected with MissingAttributes.
#[test]
fn each_missing_required_bit_is_rejected() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (t, from, to, req, _) in valid_rows() {
        for bit in bits(req) {
            checked += 1;
            let mask = (req & !bit) | STATE;
            let c = ctx(t, from, to, mask);
            match call(t, from, mask, to) {
                Err(
                    ref e @ Error::MissingAttributes {
                        from: f,
                        to: tt,
                        missing,
                    },
                ) => {
                    if f != from || tt != to || missing != bit {
                        failures.push(format!(
                            "{c}: MissingAttributes carries ({f:?} -> {tt:?}, missing {}), \
                             expected missing {}",
                            mask_name(missing),
                            mask_name(bit)
                        ));
                    }
                    expect_einval(&mut failures, &c, e);
                }
                other => failures.push(format!(
                    "{c}: without required {} expected MissingAttributes, got {other:?}",
                    mask_name(bit)
                )),
            }
        }
    }
    report("required minus one bit", checked, failures);
}

/// (d) required + each standard bit outside required ∪ optional ∪ STATE is rejected:
/// ForbiddenAttributes, except CUR_STATE in a state where it is never legal, which is the
/// "bad CUR_STATE" InvalidArgument (the kernel fails both with EINVAL).
#[test]
fn each_forbidden_bit_is_rejected() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (t, from, to, req, opt) in valid_rows() {
        for bit in standard_bits().filter(|b| (req | opt | STATE) & b == 0) {
            checked += 1;
            let mask = req | STATE | bit;
            let c = ctx(t, from, to, mask);
            let bad_cur_state = bit == CUR_STATE && !cur_state_allowed_in(from);
            match call(t, from, mask, to) {
                Err(e @ Error::InvalidArgument(_)) if bad_cur_state => {
                    expect_einval(&mut failures, &c, &e);
                }
                Err(
                    ref e @ Error::ForbiddenAttributes {
                        from: f,
                        to: tt,
                        extra,
                    },
                ) if !bad_cur_state => {
                    expect_einval(&mut failures, &c, e);
                    if f != from || tt != to || extra != bit {
                        failures.push(format!(
                            "{c}: ForbiddenAttributes carries ({f:?} -> {tt:?}, extra {}), \
                             expected extra {}",
                            mask_name(extra),
                            mask_name(bit)
                        ));
                    }
                }
                other => failures.push(format!(
                    "{c}: {} not allowed by the kernel table, expected {}, got {other:?}",
                    mask_name(bit),
                    if bad_cur_state {
                        "InvalidArgument (CUR_STATE outside RTR/RTS/SQD/SQE)"
                    } else {
                        "ForbiddenAttributes"
                    }
                )),
            }
        }
    }
    report("required + one forbidden bit", checked, failures);
}

/// Every (type, from, to) pair the kernel marks invalid is rejected with InvalidTransition,
/// both with a bare STATE mask and with every standard bit except CUR_STATE set (the kernel
/// tests `.valid` before looking at the mask).
#[test]
fn invalid_transitions_are_rejected() {
    let mut failures = Vec::new();
    let mut checked = 0;
    let all_but_cur = ((1u32 << STANDARD_BITS) - 1) & !CUR_STATE;
    for (t, from, to) in invalid_pairs() {
        for mask in [STATE, all_but_cur] {
            checked += 1;
            let c = ctx(t, from, to, mask);
            match call(t, from, mask, to) {
                Err(
                    e @ Error::InvalidTransition {
                        qp_type,
                        from: f,
                        to: tt,
                    },
                ) => {
                    if qp_type != t || f != from || tt != to {
                        failures.push(format!("{c}: error names the wrong transition: {e:?}"));
                    }
                    expect_einval(&mut failures, &c, &e);
                }
                other => failures.push(format!("{c}: expected InvalidTransition, got {other:?}")),
            }
        }
    }
    report("invalid transitions", checked, failures);
}

/// Without STATE the QP stays put and the current -> current row applies; `target` is
/// ignored.
#[test]
fn mask_without_state_applies_current_row() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for t in TYPES {
        for from in STATES {
            // A target that differs from `from`, to show it is ignored without STATE.
            let decoy = if from == QpState::Err {
                QpState::Reset
            } else {
                QpState::Err
            };
            match expected(t, from, from) {
                Some((req, opt)) => {
                    let masks = std::iter::once(req).chain(bits(opt).map(|b| req | b));
                    for mask in masks {
                        checked += 1;
                        match call(t, from, mask, decoy) {
                            Ok(s) if s == from => {}
                            other => failures.push(format!(
                                "{} (no STATE, target {decoy:?} ignored): expected Ok({from:?}), \
                                 got {other:?}",
                                ctx(t, from, from, mask)
                            )),
                        }
                    }
                    for bit in standard_bits().filter(|b| (req | opt | STATE) & b == 0) {
                        checked += 1;
                        let mask = req | bit;
                        if let Ok(s) = call(t, from, mask, decoy) {
                            failures.push(format!(
                                "{} (no STATE): {} is not allowed on {from:?}->{from:?}, got Ok({s:?})",
                                ctx(t, from, from, mask),
                                mask_name(bit)
                            ));
                        }
                    }
                }
                None => {
                    checked += 1;
                    match call(t, from, 0, decoy) {
                        Err(Error::InvalidTransition {
                            from: f, to: tt, ..
                        }) if f == from && tt == from => {}
                        other => failures.push(format!(
                            "{} (no STATE): {from:?}->{from:?} is not a valid row, expected \
                             InvalidTransition, got {other:?}",
                            ctx(t, from, from, 0)
                        )),
                    }
                }
            }
        }
    }
    report("mask without STATE", checked, failures);
}

#[test]
fn no_state_examples_from_brief() {
    // RTS with ACCESS_FLAGS only: RTS->RTS allows ACCESS_FLAGS for RC.
    assert_eq!(
        check_transition(
            QpType::Rc,
            QpState::Rts,
            AttrMask::ACCESS_FLAGS,
            QpState::Rts,
            QpState::Rts
        ),
        Ok(QpState::Rts)
    );
    // RESET with PKEY_INDEX only: RESET->RESET allows nothing.
    let e = check_transition(
        QpType::Rc,
        QpState::Reset,
        AttrMask::PKEY_INDEX,
        QpState::Reset,
        QpState::Reset,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::ForbiddenAttributes {
                from: QpState::Reset,
                to: QpState::Reset,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.errno(), errno::EINVAL);
}

/// CUR_STATE is accepted only when the QP is in RTR/RTS/SQD/SQE, the row allows it, and the
/// claimed state matches the QP's state.
#[test]
fn cur_state_rules() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (t, from, to, req, opt) in valid_rows() {
        let mask = req | STATE | CUR_STATE;
        for claimed in STATES {
            checked += 1;
            let c = format!("{} claimed {claimed:?}", ctx(t, from, to, mask));
            let got = check_transition(t, from, AttrMask(mask), to, claimed);
            let may_pass = opt & CUR_STATE != 0 && cur_state_allowed_in(from);
            if may_pass {
                // The table allows CUR_STATE here; only a matching claim may pass.
                if claimed == from {
                    if got != Ok(to) {
                        failures.push(format!("{c}: expected Ok({to:?}), got {got:?}"));
                    }
                } else {
                    match got {
                        Err(ref e @ Error::InvalidArgument(_)) => {
                            expect_einval(&mut failures, &c, e)
                        }
                        other => failures.push(format!(
                            "{c}: stale CUR_STATE expected InvalidArgument, got {other:?}"
                        )),
                    }
                }
            } else {
                match got {
                    Err(ref e) => expect_einval(&mut failures, &c, e),
                    Ok(s) => {
                        failures.push(format!("{c}: CUR_STATE must be refused, got Ok({s:?})"))
                    }
                }
                if !cur_state_allowed_in(from) && !matches!(got, Err(Error::InvalidArgument(_))) {
                    failures.push(format!(
                        "{c}: CUR_STATE in {from:?} expected InvalidArgument, got {got:?}"
                    ));
                }
            }
        }
    }
    // The rows whose optional set holds CUR_STATE are exactly the ->RTS rows out of
    // RTR/RTS/SQD (all five types) and SQE->RTS for UD and UC.
    let with_cur: Vec<_> = valid_rows()
        .into_iter()
        .filter(|r| r.4 & CUR_STATE != 0)
        .map(|r| (r.0, r.1, r.2))
        .collect();
    assert_eq!(with_cur.len(), 3 * 5 + 2, "{with_cur:?}");
    report("CUR_STATE", checked, failures);
}

#[test]
fn strip_for_uverbs_drops_exactly_the_xrc_bits() {
    let dropped = |t: QpType| match t {
        QpType::XrcRecv => MAX_QP_RD_ATOMIC | RETRY_CNT | RNR_RETRY,
        QpType::XrcSend => MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
        QpType::Rc | QpType::Uc | QpType::Ud => 0,
    };
    let mut failures = Vec::new();
    let mut checked = 0;
    let all = (1u32 << STANDARD_BITS) - 1;
    for t in TYPES {
        let masks = standard_bits()
            .chain([0, all, all | AttrMask::RATE_LIMIT.0])
            .collect::<Vec<_>>();
        for mask in masks {
            checked += 1;
            let want = mask & !dropped(t);
            let got = strip_for_uverbs(t, AttrMask(mask)).0;
            if got != want {
                failures.push(format!(
                    "strip_for_uverbs({t:?}, {}): expected {}, got {}",
                    mask_name(mask),
                    mask_name(want),
                    mask_name(got)
                ));
            }
        }
    }
    report("strip_for_uverbs", checked, failures);
}

/// open-mpi/ompi#1839: Open MPI moved its XRC receive QP to RTS with the RC-style mask.
/// The kernel table rejects that (RETRY_CNT, RNR_RETRY, MAX_QP_RD_ATOMIC are not in the
/// XRC_TGT RTR->RTS row); uverbs' stripping makes it pass for user callers.
#[test]
fn ompi_1839_xrc_recv_rtr_to_rts_with_rc_mask() {
    let rc_style = STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC;
    let t = QpType::XrcRecv;

    let unstripped = call(t, QpState::Rtr, rc_style, QpState::Rts);
    match unstripped {
        Err(ref e @ Error::ForbiddenAttributes { extra, .. }) => {
            assert_eq!(extra, RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC, "{e:?}");
            assert_eq!(e.errno(), errno::EINVAL);
        }
        other => panic!("unstripped RC-style mask on XRC_RECV RTR->RTS: {other:?}"),
    }

    let stripped = strip_for_uverbs(t, AttrMask(rc_style));
    assert_eq!(stripped.0, STATE | TIMEOUT | SQ_PSN);
    assert_eq!(
        check_transition(t, QpState::Rtr, stripped, QpState::Rts, QpState::Rtr),
        Ok(QpState::Rts)
    );

    // The same RC-style mask is exactly right for RC and XRC_SEND, stripped or not.
    for t in [QpType::Rc, QpType::XrcSend] {
        assert_eq!(
            call(t, QpState::Rtr, rc_style, QpState::Rts),
            Ok(QpState::Rts)
        );
        let s = strip_for_uverbs(t, AttrMask(rc_style));
        assert_eq!(
            check_transition(t, QpState::Rtr, s, QpState::Rts, QpState::Rtr),
            Ok(QpState::Rts),
            "{t:?}"
        );
    }
}

/// The mirror case on the send side: an RC-style INIT->RTR mask on XRC_SEND carries the
/// responder bits MAX_DEST_RD_ATOMIC|MIN_RNR_TIMER, which the INI row forbids; stripping
/// removes them. The TGT QP keeps them (they are required there).
#[test]
fn xrc_init_to_rtr_with_rc_mask() {
    let rc_style = STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER;

    let t = QpType::XrcSend;
    match call(t, QpState::Init, rc_style, QpState::Rtr) {
        Err(Error::ForbiddenAttributes { extra, .. }) => {
            assert_eq!(extra, MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER)
        }
        other => panic!("unstripped RC-style INIT->RTR on XRC_SEND: {other:?}"),
    }
    let s = strip_for_uverbs(t, AttrMask(rc_style));
    assert_eq!(
        check_transition(t, QpState::Init, s, QpState::Rtr, QpState::Init),
        Ok(QpState::Rtr)
    );

    let t = QpType::XrcRecv;
    assert_eq!(
        call(t, QpState::Init, rc_style, QpState::Rtr),
        Ok(QpState::Rtr)
    );
    let s = strip_for_uverbs(t, AttrMask(rc_style));
    assert_eq!(s.0, rc_style);
    assert_eq!(
        check_transition(t, QpState::Init, s, QpState::Rtr, QpState::Init),
        Ok(QpState::Rtr)
    );
}

/// A user's full walk RESET->INIT->RTR->RTS->SQD->RTS->ERR->RESET through each type, with
/// the masks rdma-core's examples use (stripped as uverbs does).
#[test]
fn full_walk_per_type() {
    use QpState::*;
    for t in TYPES {
        let walk = [Reset, Init, Rtr, Rts, Sqd, Rts, Err, Reset];
        let mut cur = Reset;
        for &to in &walk[1..] {
            let (req, _) = expected(t, cur, to).expect("walk uses valid rows");
            let mask = strip_for_uverbs(t, AttrMask(req | STATE));
            let got = check_transition(t, cur, mask, to, cur);
            assert_eq!(got, Ok(to), "{}", ctx(t, cur, to, mask.0));
            cur = to;
        }
    }
}
