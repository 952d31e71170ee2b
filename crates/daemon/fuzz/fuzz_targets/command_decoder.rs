//! Feeds arbitrary byte sequences to the daemon's command dispatcher, as a client would send
//! them: a session that may or may not have said hello, and a sequence of datagrams. The
//! dispatcher must answer every one with a well-formed reply and never panic, and closing
//! the context must leave neither core objects nor CM ids or listeners it owned.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_core::device::Device;
use softverbs_core::types::Mtu;
use softverbs_core::Core;
use softverbs_daemon::dispatch::{Dispatcher, Session};
use softverbs_ipc::PeerCred;

fuzz_target!(|data: &[u8]| {
    let core = Core::new(vec![Device::roce("fuzz0", 1, &["127.0.0.1".parse().unwrap()], Mtu::M4096)]);
    let mut d = Dispatcher::new(core, softverbs_abi::ABI_VERSION, &Default::default())
        .expect("no network, nothing to bind");
    let mut s = Session::new(PeerCred { pid: 1, uid: 0, gid: 0 }, "fuzz".into());
    // The first input byte decides whether a valid hello opens a context first (so the
    // context commands are reachable) or the session starts raw (so the pre-hello and
    // introspection paths are). The rest is split into datagrams at the two-byte marker
    // 0xFF 0xFE, so datagrams may still contain 0xFF bytes (e.g. CREATE_NEW_QP).
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode & 1 == 0 {
        let hello = [1u8, 0, 0, 0, 8, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0];
        let _ = d.handle(&mut s, &hello, Vec::new());
    }
    let mut msgs = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i + 1 < rest.len() {
        if rest[i] == 0xff && rest[i + 1] == 0xfe {
            msgs.push(&rest[start..i]);
            start = i + 2;
            i += 2;
        } else {
            i += 1;
        }
    }
    msgs.push(&rest[start..]);
    for msg in msgs.into_iter().filter(|m| !m.is_empty()) {
        let out = d.handle(&mut s, msg, Vec::new());
        assert!(out.reply.len() >= 16, "every request gets a reply header");
    }
    if let Some(ctx) = s.ctx() {
        d.close_context(ctx).1.unwrap();
    }
    assert!(d.core.counts().is_empty(), "teardown leaves nothing");
    // The CM ids and listeners of the context (commands 100-111) went with it; what is
    // left is ownerless (time-wait tombstones, DREQs being retried), docs/design/cm.md §4.
    let cm = d.dp.cm.counts();
    assert_eq!((cm.owned, cm.listeners), (0, 0), "the context's CM state went: {cm:?}");
});
