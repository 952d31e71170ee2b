//! Parses arbitrary bytes as a CM MAD and as rdma_cm's private-data address header.
//! Whatever parses must re-emit to a full MAD that parses back to the same message
//! (reserved bits are not kept, so the bytes may differ only there).
//!
//! The input is parsed as it is (the common-header checks), and again laid over a valid
//! CM header: its first byte picks the AttributeID (the nine messages and the refused LAP,
//! APR and ClassPortInfo) and the rest fills the TransactionID and the message, so every
//! message's own parser is reached from the first run (an empty corpus rarely finds the
//! four header bytes and the AttributeID by itself).
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_wire::cm::{CmMad, CmaHdr, MAD_LEN};

fn round_trip(data: &[u8]) {
    if let Ok(mad) = CmMad::parse(data) {
        let bytes = mad.emit().expect("a parsed MAD re-emits");
        assert_eq!(bytes.len(), MAD_LEN);
        assert_eq!(CmMad::parse(&bytes).expect("re-emitted MAD parses"), mad);
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip(data);
    if let Some((&sel, rest)) = data.split_first() {
        let mut mad = [0u8; MAD_LEN];
        mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        // 0x10-0x18 the messages, 0x19/0x1A LAP/APR, 0x01 ClassPortInfo.
        let attr = match sel % 12 {
            11 => 0x01,
            n => 0x10 + u16::from(n),
        };
        mad[16..18].copy_from_slice(&attr.to_be_bytes());
        let (tid, body) = rest.split_at(rest.len().min(8));
        mad[8..8 + tid.len()].copy_from_slice(tid);
        let n = body.len().min(MAD_LEN - 24);
        mad[24..24 + n].copy_from_slice(&body[..n]);
        round_trip(&mad);
    }
    if let Ok(hdr) = CmaHdr::parse(data) {
        let mut buf = [0u8; 36];
        hdr.emit(&mut buf).expect("a parsed header re-emits");
        assert_eq!(CmaHdr::parse(&buf), Ok(hdr));
    }
});
