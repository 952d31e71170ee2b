//! Drives one CM (listening, with a connection of its own in progress) with arbitrary MADs
//! from two peers and arbitrary time steps. The input is split at the marker `0xFF 0xFE`;
//! each piece's first byte chooses the peer and how far time moves, and the rest, laid over
//! a valid CM MAD header of the attribute its second byte names, is handed to the CM.
//! The events are answered as the attribute byte's high part says (establish; accept or
//! disconnect; SIDR reply or reject; destroy), whatever state the id is in.
//! Checks: no panic, every transmit is a MAD that parses, and once the owner is gone and
//! time-wait has passed the CM holds nothing.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use softverbs_cm::{
    AcceptParams, Cm, Config, ConnectParams, Counts, Event, Instant, Owner, QpKind,
    SidrReplyParams,
};
use softverbs_wire::cm::{CmMad, SidrStatus, MAD_LEN};

fuzz_target!(|data: &[u8]| {
    let peers = [
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)),
    ];
    let owner = Owner(1);
    let mut cm = Cm::new(Config::default());
    let mut now = Instant(0);
    cm.listen(owner, 0x0106_1C06).unwrap();
    let params = ConnectParams {
        peer: peers[0],
        service_id: 0x0106_1C06,
        local_gid: [0; 16],
        remote_gid: [0; 16],
        qp_kind: QpKind::Rc,
        qpn: 5,
        starting_psn: 1,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        path_mtu: 3,
        hop_limit: 64,
        local_ack_timeout: 14,
        response_timeout: 10,
        max_cm_retries: 3,
        private_data: vec![],
    };
    cm.connect(now, owner, &params).unwrap();
    let accept = AcceptParams {
        qpn: 6,
        starting_psn: 2,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        private_data: vec![],
    };
    let sidr = SidrReplyParams {
        status: SidrStatus::SUCCESS,
        qpn: 7,
        qkey: 0x1111,
        private_data: vec![],
    };
    let mut start = 0;
    let mut pieces = Vec::new();
    for i in 0..data.len().saturating_sub(1) {
        if data[i] == 0xFF && data[i + 1] == 0xFE {
            pieces.push(&data[start..i]);
            start = i + 2;
        }
    }
    pieces.push(&data[start..]);
    for piece in pieces {
        let Some((&ctl, rest)) = piece.split_first() else {
            continue;
        };
        now = now.after(Duration::from_micros(u64::from(ctl >> 1) * 997));
        cm.handle_timeout(now);
        let mut mad = [0u8; MAD_LEN];
        mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        if let Some((&attr, body)) = rest.split_first() {
            mad[17] = 0x10 + attr % 10;
            let n = body.len().min(MAD_LEN - 24);
            mad[24..24 + n].copy_from_slice(&body[..n]);
        }
        let _ = cm.handle_mad(now, peers[usize::from(ctl & 1)], &mad);
        // How the consumer answers this piece's events: the attribute byte's high part.
        let action = rest.first().map_or(0, |a| a / 10 % 4);
        while let Some((_, id, ev)) = cm.poll_event() {
            // Answer what can be answered, so the accept, reject, establish, disconnect and
            // SIDR reply paths are reached too, in any state the MADs left the id in.
            let _ = match (action, ev) {
                (0, _) => cm.establish(now, owner, id),
                (1, Event::ConnectRequest { .. }) => cm.accept(now, owner, id, &accept),
                (1, _) => cm.disconnect(now, owner, id, b"bye"),
                (2, Event::SidrRequest { .. }) => cm.sidr_reply(now, owner, id, &sidr),
                (2, _) => cm.reject(now, owner, id, b"no"),
                _ => cm.destroy(now, owner, id),
            };
        }
        while let Some(t) = cm.poll_transmit() {
            CmMad::parse(&t.mad).expect("the CM sends well-formed MADs");
        }
    }
    cm.destroy_owner(now, owner);
    for _ in 0..40 {
        now = now.after(Duration::from_secs(10));
        cm.handle_timeout(now);
    }
    while cm.poll_transmit().is_some() {}
    assert_eq!(cm.counts(), Counts::default());
});
