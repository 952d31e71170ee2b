//! Requests to the daemon's CM that cannot go anywhere are refused with `EINVAL` at the call,
//! rather than accepted and left to retry into nothing: a connect or a SIDR request to the
//! unspecified address or to an address of the other family than the device's. The context
//! keeps working afterwards and no CM state is left.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use common::daemon;
use softverbs::{CmEventKind, CmQp, CmTimers, Context};

const FAST: CmTimers = CmTimers {
    response_timeout: 14,
    max_retries: 3,
};
const UDP_SID: u64 = 0x0111_1C07;

#[test]
fn sidr_and_connect_to_no_address_or_the_wrong_family_are_einval() {
    let (d, _dir) = daemon("cm-badaddr", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let ca = a.cm_channel().unwrap();
    let ip = a.query_gid(1, 0).unwrap().to_ip();
    let other_family = match ip {
        IpAddr::V4(_) => IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
        IpAddr::V6(_) => IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
    };
    let unspecified = match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    for dst in [unspecified, other_family] {
        let e = ca.sidr_request(dst, UDP_SID, FAST, &[]).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "SIDR_REQ to {dst}: {e}");
        let e = ca
            .connect(dst, UDP_SID, CmQp::new(7, 0), FAST, &[])
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "REQ to {dst}: {e}");
    }
    // The channel still works: a SIDR to the device itself, for a service nobody serves,
    // is answered (status 1).
    let id = ca.sidr_request(ip, UDP_SID, FAST, &[]).unwrap();
    let ev = ca
        .wait_event(Duration::from_secs(20))
        .unwrap()
        .expect("a SIDR_REP");
    assert_eq!((ev.kind, ev.id, ev.status), (CmEventKind::Rejected, id, 1));
    let _ = ca.destroy(id);
    let counts = ca.counts().unwrap();
    assert_eq!(counts.ids, 0, "{counts:?}");
}
