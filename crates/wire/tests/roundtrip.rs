//! Property tests: emit -> parse is the identity for random valid packets of every opcode,
//! and parsing arbitrary bytes never panics.

use proptest::prelude::*;
use softverbs_wire::{
    emit_packet, packet_len, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr,
    HeaderKind, Headers, IethRepr, ImmDtRepr, NakCode, Opcode, Packet, RethRepr, Syndrome,
    XrcethRepr,
};

fn valid_opcodes() -> Vec<Opcode> {
    Opcode::all_valid().collect()
}

fn u24() -> impl Strategy<Value = u32> {
    0u32..=0x00FF_FFFF
}

fn syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credits| Syndrome::Ack { credits }),
        (0u8..32).prop_map(|timer| Syndrome::RnrNak { timer }),
        (0u8..32).prop_map(|v| Syndrome::Nak {
            code: match v {
                0 => NakCode::PsnSeqErr,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccessError,
                3 => NakCode::RemoteOperationalError,
                4 => NakCode::InvalidRdRequest,
                v => NakCode::Reserved(v),
            }
        }),
    ]
}

/// Every extension header filled with random values; [`for_opcode`] keeps the right ones.
#[derive(Debug, Clone)]
struct AllExtensions {
    xrceth: XrcethRepr,
    deth: DethRepr,
    reth: RethRepr,
    atomic_eth: AtomicEthRepr,
    aeth: AethRepr,
    atomic_ack_eth: AtomicAckEthRepr,
    imm_dt: ImmDtRepr,
    ieth: IethRepr,
}

fn all_extensions() -> impl Strategy<Value = AllExtensions> {
    (
        u24(),
        (any::<u32>(), u24()),
        (any::<u64>(), any::<u32>(), any::<u32>()),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
        (syndrome(), u24()),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(
            |(
                srq,
                (qkey, src_qp),
                (va, rkey, dma_len),
                (ava, arkey, swap_add, compare),
                (syn, msn),
                orig,
                imm,
                irkey,
            )| {
                AllExtensions {
                    xrceth: XrcethRepr { xrc_srq: srq },
                    deth: DethRepr { qkey, src_qp },
                    reth: RethRepr { va, rkey, dma_len },
                    atomic_eth: AtomicEthRepr {
                        va: ava,
                        rkey: arkey,
                        swap_add,
                        compare,
                    },
                    aeth: AethRepr { syndrome: syn, msn },
                    atomic_ack_eth: AtomicAckEthRepr { orig },
                    imm_dt: ImmDtRepr { imm },
                    ieth: IethRepr { rkey: irkey },
                }
            },
        )
}

fn bth(opcode: Opcode) -> impl Strategy<Value = BthRepr> {
    (any::<[bool; 6]>(), any::<u16>(), u24(), u24()).prop_map(move |(f, pkey, dest_qp, psn)| {
        BthRepr {
            opcode,
            solicited: f[0],
            mig_req: f[1],
            pad_count: 0,
            tver: 0,
            pkey,
            fecn: f[2],
            becn: f[3],
            dest_qp,
            ack_req: f[4],
            psn,
        }
    })
}

fn for_opcode(bth: BthRepr, all: &AllExtensions) -> Headers {
    let set = bth.opcode.info().unwrap().headers;
    let mut h = Headers::new(bth);
    let on = |k| set.contains(k);
    h.xrceth = on(HeaderKind::Xrceth).then_some(all.xrceth);
    h.deth = on(HeaderKind::Deth).then_some(all.deth);
    h.reth = on(HeaderKind::Reth).then_some(all.reth);
    h.atomic_eth = on(HeaderKind::AtomicEth).then_some(all.atomic_eth);
    h.aeth = on(HeaderKind::Aeth).then_some(all.aeth);
    h.atomic_ack_eth = on(HeaderKind::AtomicAckEth).then_some(all.atomic_ack_eth);
    h.imm_dt = on(HeaderKind::ImmDt).then_some(all.imm_dt);
    h.ieth = on(HeaderKind::Ieth).then_some(all.ieth);
    h
}

/// (headers, payload) for a random valid packet of `opcode`.
fn packet_of(opcode: Opcode) -> impl Strategy<Value = (Headers, Vec<u8>)> {
    let carries_payload = opcode.info().unwrap().payload;
    let max = if carries_payload { 70 } else { 0 };
    (
        bth(opcode),
        all_extensions(),
        proptest::collection::vec(any::<u8>(), 0..=max),
    )
        .prop_map(|(bth, all, payload)| (for_opcode(bth, &all), payload))
}

fn any_packet() -> impl Strategy<Value = (Headers, Vec<u8>)> {
    proptest::sample::select(valid_opcodes()).prop_flat_map(packet_of)
}

fn assert_round_trip(headers: &Headers, payload: &[u8]) -> Result<(), TestCaseError> {
    let len = packet_len(headers, payload.len());
    let mut buf = vec![0xA5u8; len + 7];
    let n =
        emit_packet(headers, payload, &mut buf).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(n, len);
    prop_assert_eq!(n % 4, 0);
    prop_assert!(buf[n..].iter().all(|&b| b == 0xA5), "wrote past the packet");
    let pkt = Packet::parse(&buf[..n]).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut expected = *headers;
    expected.bth.pad_count = (payload.len().wrapping_neg() & 3) as u8;
    prop_assert_eq!(pkt.headers, expected);
    prop_assert_eq!(pkt.payload, payload);
    prop_assert_eq!(pkt.icrc, 0);
    prop_assert_eq!(pkt.as_bytes().len(), n);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn emit_then_parse_is_identity((headers, payload) in any_packet()) {
        assert_round_trip(&headers, &payload)?;
    }

    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
        let _ = Packet::parse(&bytes);
        let _ = softverbs_wire::parse_roce_v2(&bytes);
    }

    /// Arbitrary bytes behind a valid opcode reach deeper into the parser than fully
    /// random ones, which mostly stop at the opcode check.
    #[test]
    fn parse_never_panics_behind_valid_opcodes(
        op in proptest::sample::select(valid_opcodes()),
        mut bytes in proptest::collection::vec(any::<u8>(), 1..160),
    ) {
        bytes[0] = op.0;
        if bytes.len() > 1 {
            bytes[1] &= 0xF0; // TVer 0
        }
        if let Ok(pkt) = Packet::parse(&bytes) {
            // Whatever parses re-emits to a packet that parses to the same thing.
            let mut buf = vec![0u8; bytes.len()];
            let n = emit_packet(&pkt.headers, pkt.payload, &mut buf).unwrap();
            prop_assert_eq!(n, bytes.len());
            let again = Packet::parse(&buf[..n]).unwrap();
            prop_assert_eq!(again.headers, pkt.headers);
            prop_assert_eq!(again.payload, pkt.payload);
        }
    }
}

/// Proptest samples opcodes at random; this makes sure none is skipped.
#[test]
fn every_valid_opcode_round_trips() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    for op in valid_opcodes() {
        for _ in 0..32 {
            let (headers, payload) = packet_of(op).new_tree(&mut runner).unwrap().current();
            assert_round_trip(&headers, &payload).unwrap();
        }
    }
}
