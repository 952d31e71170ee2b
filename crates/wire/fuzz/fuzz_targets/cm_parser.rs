//! Parses arbitrary bytes as a CM MAD and as rdma_cm's private-data address header.
//! Whatever parses must re-emit to a full MAD that parses back to the same message
//! (reserved bits are not kept, so the bytes may differ only there).
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_wire::cm::{CmMad, CmaHdr, MAD_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(mad) = CmMad::parse(data) {
        let bytes = mad.emit().expect("a parsed MAD re-emits");
        assert_eq!(bytes.len(), MAD_LEN);
        assert_eq!(CmMad::parse(&bytes).expect("re-emitted MAD parses"), mad);
    }
    if let Ok(hdr) = CmaHdr::parse(data) {
        let mut buf = [0u8; 36];
        hdr.emit(&mut buf).expect("a parsed header re-emits");
        assert_eq!(CmaHdr::parse(&buf), Ok(hdr));
    }
});
