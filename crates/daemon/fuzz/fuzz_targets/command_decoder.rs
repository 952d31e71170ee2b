//! Feeds arbitrary byte sequences to the daemon's command dispatcher, as a client would send
//! them: a session that may or may not have said hello, and a sequence of datagrams. The
//! dispatcher must answer every one with a well-formed reply and never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_core::device::Device;
use softverbs_core::types::Mtu;
use softverbs_core::Core;
use softverbs_daemon::dispatch::{Dispatcher, Session};
use softverbs_ipc::PeerCred;

fuzz_target!(|data: &[u8]| {
    let core = Core::new(vec![Device::roce("fuzz0", 1, &["127.0.0.1".parse().unwrap()], Mtu::M4096)]);
    let mut d = Dispatcher::new(core, 2);
    let mut s = Session::new(PeerCred { pid: 1, uid: 0, gid: 0 }, "fuzz".into());
    // A valid hello first (so the context commands are reachable), then the input split into
    // datagrams at 0xFF 0xFE markers.
    let hello = [1u8, 0, 0, 0, 8, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0];
    let _ = d.handle(&mut s, &hello, Vec::new());
    for msg in data.split(|&b| b == 0xff).filter(|m| !m.is_empty()) {
        let out = d.handle(&mut s, msg, Vec::new());
        assert!(out.reply.len() >= 16, "every request gets a reply header");
    }
    if let Some(ctx) = s.ctx() {
        d.core.close_context(ctx).unwrap();
    }
    assert!(d.core.counts().is_empty(), "teardown leaves nothing");
});
