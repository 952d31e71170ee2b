//! Quotas (docs/guide/limits.md): a client over one of its limits — objects of a kind
//! per context or per uid, ring bytes, registered bytes, mappings — gets ENOMEM, and another
//! client (another context, or another uid where the limit is per uid) still creates objects
//! and moves data. The other uid is a child process of this test binary run as `nobody`.
//!
//! Memory is lent to MRs with `reg_slice` (posted through their range-checked SGEs) except
//! where a test is about the raw registrations: shared MRs converted in place counting as
//! mappings (`reg_mr_shared`), and registered bytes, whose test grows an MR's range with
//! `rereg` (a raw range: a borrowed MR cannot grow past what it borrowed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use softverbs::{
    errno, Access, AhAttr, Context, Gid, Introspect, QpCap, QpInit, QpType, SendOp, SendRequest,
    SrqAttr, WcStatus, O_CREAT,
};
use softverbs_daemon::{spawn_daemon_with, Config, TestDaemon};

/// The uid (and gid) of the other user: `nobody`.
const OTHER_UID: u32 = 65534;
/// The child's role: the socket of the daemon to use.
const CHILD_SOCKET: &str = "SV_LIMITS_CHILD_SOCKET";
/// The child's role: join multicast groups instead of moving data (`mcast`), or join them
/// and hold them until its stdin closes (`mcast-hold`).
const CHILD_ROLE: &str = "SV_LIMITS_CHILD_ROLE";

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A daemon on a thread of this process with `limits` (`SCOPE.RESOURCE=N`) on top of the
/// defaults, in a directory every uid can reach.
fn daemon(name: &str, limits: &[&str]) -> (TestDaemon, Dir) {
    let dir = std::env::temp_dir().join(format!("svlim-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut c = Config::new(dir.join("sv.sock"));
    for l in limits {
        c.limits.apply(l).unwrap();
    }
    (spawn_daemon_with(c).unwrap(), Dir(dir))
}

fn open(d: &TestDaemon) -> Context {
    Context::open_at(&d.socket, 0).unwrap()
}

/// The errno of a call that must fail.
fn errno_of<T>(r: softverbs::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.errno(),
    }
}

const ALL: Access = Access(0x0f);

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Creates a PD, a CQ, an MR and two RC QPs connected to each other in `ctx`, sends 4 KiB
/// from one to the other and checks it arrived: what "still works" means for a client.
fn transfer_works(ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let init = QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap());
    let (a, b) = (ctx.create_qp(&init).unwrap(), ctx.create_qp(&init).unwrap());
    let gid = ctx.query_gid(1, 0).unwrap();
    connect(&a, gid, b.qpn());
    connect(&b, gid, a.qpn());
    let mut buf = vec![0u8; 8192];
    for (i, x) in buf[..4096].iter_mut().enumerate() {
        *x = (i * 7 % 253) as u8;
    }
    let mr = pd.reg_slice(&mut buf, ALL).unwrap();
    b.post_recv(1, &[mr.sge(4096, 4096).unwrap()]).unwrap();
    a.post_send(&SendRequest::new(
        2,
        SendOp::Send,
        &[mr.sge(0, 4096).unwrap()],
    ))
    .unwrap();
    let wc = cq.wait(2, Duration::from_secs(20)).unwrap();
    assert_eq!(wc.len(), 2, "both completions arrive");
    assert!(wc.iter().all(|w| w.status == WcStatus::Success), "{wc:?}");
    let got = mr.to_vec();
    assert_eq!(got[..4096], got[4096..], "the data arrived intact");
}

/// Runs this binary's `other_uid_client` as uid `nobody` against the daemon at `socket`,
/// which must succeed (bounded: 30 s).
fn other_uid_client_works(socket: &Path) {
    other_uid_works(socket, "transfer");
}

/// Runs this binary's `other_uid_client` in `role` as uid `nobody` against the daemon at
/// `socket`, which must succeed (bounded: 30 s).
fn other_uid_works(socket: &Path, role: &str) {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        eprintln!("SKIP the other uid's client: only root can run a process as another uid");
        return;
    }
    let mut child = child_client(socket, role)
        .uid(OTHER_UID)
        .gid(OTHER_UID)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "the other uid's client failed: {st}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the other uid's client did not finish in 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

use std::os::unix::process::CommandExt;

/// This binary's `other_uid_client` in `role` against the daemon at `socket`.
fn child_client(socket: &Path, role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "other_uid_client",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_SOCKET, socket)
    .env(CHILD_ROLE, role);
    c
}

mod common;
use common::{connect_with, RcPath};

/// Names a test buffer for the raw registration these tests exercise (the drop-in's path):
/// the buffers outlive their MRs and nothing reads them while the daemon may write.
#[allow(dead_code)]
fn raw(addr: u64, len: u64) -> softverbs::RawMemory {
    // SAFETY: see above.
    unsafe { softverbs::RawMemory::new(addr as usize, len as usize) }
}

/// [`raw`], for the in-place conversion (no other thread touches the buffers meanwhile).
#[allow(dead_code)]
fn raw_shareable(addr: u64, len: u64) -> softverbs::RawMemory {
    // SAFETY: as for `raw`; and nothing else writes the pages during the registration.
    unsafe { softverbs::RawMemory::new_shareable(addr as usize, len as usize) }
}

/// The child clients: as `nobody`, open a context and move data (`transfer`) or join
/// multicast groups (`mcast`); as this test's uid, join groups until refused and hold them
/// until stdin closes (`mcast-hold`). A no-op in a normal test run.
#[test]
fn other_uid_client() {
    let Some(socket) = std::env::var_os(CHILD_SOCKET) else {
        return;
    };
    use std::os::unix::fs::MetadataExt;
    let role = std::env::var(CHILD_ROLE).unwrap_or_default();
    let uid = std::fs::metadata("/proc/self").unwrap().uid();
    assert_eq!(
        uid == OTHER_UID,
        role != "mcast-hold",
        "{role} as uid {uid}"
    );
    let ctx = Context::open_at(Path::new(&socket), 0).unwrap();
    match role.as_str() {
        "mcast" => {
            let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(4).unwrap());
            let qps = ud_qps(&ctx, &pd, &cq);
            for g in [1, 2] {
                qps[0].attach_mcast(group(g)).unwrap();
            }
            qps[1].attach_mcast(group(1)).unwrap();
        }
        "mcast-hold" => {
            let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(4).unwrap());
            let qps = ud_qps(&ctx, &pd, &cq);
            let joined = (1..).take_while(|&g| qps[0].attach_mcast(group(g)).is_ok());
            println!("joined {}", joined.count());
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        _ => transfer_works(&ctx),
    }
}

/// Multicast group `239.0.0.g`.
fn group(g: u8) -> Gid {
    Gid::from(std::net::Ipv4Addr::new(239, 0, 0, g))
}

/// Two UD QPs of a context, to attach to groups.
fn ud_qps<'a>(
    ctx: &'a Context,
    pd: &'a softverbs::Pd<'_>,
    cq: &'a softverbs::Cq<'_>,
) -> Vec<softverbs::Qp<'a>> {
    let init = QpInit::new(QpType::Ud, pd).cqs(cq, cq).cap(cap());
    (0..2).map(|_| ctx.create_qp(&init).unwrap()).collect()
}

#[test]
fn a_context_over_its_limit_of_each_object_kind_gets_enomem_and_another_context_still_works() {
    let limits = [
        "context.pds=3",
        "context.cqs=3",
        "context.mrs=3",
        "context.srqs=3",
        "context.qps=3",
        "context.ahs=3",
        "context.xrcds=3",
        "context.channels=3",
    ];
    let (d, _dir) = daemon("objects", &limits);
    let greedy = open(&d);
    let mut buf = vec![0u8; 4096];
    let mut chunks = buf.chunks_mut(64);
    let gid = greedy.query_gid(1, 0).unwrap();
    let ah = AhAttr {
        dgid: gid,
        is_global: true,
        port_num: 1,
        hop_limit: 64,
        ..AhAttr::default()
    };
    let srq_attr = SrqAttr {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
    };
    let pds: Vec<_> = (0..3).map(|_| greedy.alloc_pd().unwrap()).collect();
    assert_eq!(errno_of(greedy.alloc_pd()), errno::ENOMEM, "a 4th PD");
    let pd = &pds[0];
    let cqs: Vec<_> = (0..3).map(|_| greedy.create_cq(4).unwrap()).collect();
    assert_eq!(errno_of(greedy.create_cq(4)), errno::ENOMEM, "a 4th CQ");
    let mrs: Vec<_> = (0..3)
        .map(|_| pd.reg_slice(chunks.next().unwrap(), ALL).unwrap())
        .collect();
    assert_eq!(
        errno_of(pd.reg_slice(chunks.next().unwrap(), ALL)),
        errno::ENOMEM,
        "a 4th MR"
    );
    let srqs: Vec<_> = (0..3).map(|_| pd.create_srq(srq_attr).unwrap()).collect();
    assert_eq!(
        errno_of(pd.create_srq(srq_attr)),
        errno::ENOMEM,
        "a 4th SRQ"
    );
    let init = QpInit::new(QpType::Rc, pd).cqs(&cqs[0], &cqs[0]).cap(cap());
    let qps: Vec<_> = (0..3).map(|_| greedy.create_qp(&init).unwrap()).collect();
    assert_eq!(errno_of(greedy.create_qp(&init)), errno::ENOMEM, "a 4th QP");
    let ahs: Vec<_> = (0..3).map(|_| pd.create_ah(&ah).unwrap()).collect();
    assert_eq!(errno_of(pd.create_ah(&ah)), errno::ENOMEM, "a 4th AH");
    let xrcds: Vec<_> = (0..3)
        .map(|_| greedy.open_xrcd(None, O_CREAT).unwrap())
        .collect();
    assert_eq!(
        errno_of(greedy.open_xrcd(None, O_CREAT)),
        errno::ENOMEM,
        "a 4th XRC domain"
    );
    let channels: Vec<_> = (0..3)
        .map(|_| greedy.create_comp_channel().unwrap())
        .collect();
    assert_eq!(
        errno_of(greedy.create_comp_channel()),
        errno::ENOMEM,
        "a 4th completion channel"
    );

    // Another context of the same uid is not charged with the first one's objects.
    transfer_works(&open(&d));

    // A destroyed object gives its place back.
    drop(ahs);
    assert!(pd.create_ah(&ah).is_ok(), "an AH after the others went");
    drop((qps, srqs, mrs, xrcds, channels));
    drop(cqs);
    assert!(greedy.create_cq(4).is_ok(), "a CQ after the others went");
}

#[test]
fn a_uid_over_its_limit_across_its_contexts_gets_enomem_and_another_uid_still_works() {
    let (d, _dir) = daemon("uid", &["uid.cqs=4", "uid.qps=4", "uid.contexts=3"]);
    let (c1, c2) = (open(&d), open(&d));
    let cqs1: Vec<_> = (0..2).map(|_| c1.create_cq(4).unwrap()).collect();
    let cqs2: Vec<_> = (0..2).map(|_| c2.create_cq(4).unwrap()).collect();
    assert_eq!(
        errno_of(c2.create_cq(4)),
        errno::ENOMEM,
        "a 5th CQ of the uid, in its second context"
    );
    assert_eq!(errno_of(c1.create_cq(4)), errno::ENOMEM, "nor in its first");
    let c3 = open(&d);
    assert_eq!(
        errno_of(Context::open_at(&d.socket, 0)),
        errno::ENOMEM,
        "a 4th context of the uid"
    );

    // Another uid has its own share: it creates and moves data.
    other_uid_client_works(&d.socket);

    // A context's charges go with it.
    drop(cqs1);
    drop(c1);
    assert!(
        c3.create_cq(4).is_ok(),
        "the uid has room again once a context closed"
    );
    drop(cqs2);
}

#[test]
fn ring_bytes_and_mappings_over_the_limit_get_enomem_and_others_still_work() {
    // A CQ of 1,000 entries has a ring of about 48 KiB (1,024 completions of 48 bytes), one
    // of 4 entries a 4 KiB ring: each ring is one mapping.
    let (d, _dir) = daemon(
        "rings",
        &[
            "context.ring-bytes=64K",
            "uid.mappings=6",
            "context.mappings=5",
        ],
    );
    let a = open(&d);
    let big = a.create_cq(1000).unwrap();
    assert_eq!(
        errno_of(a.create_cq(1000)),
        errno::ENOMEM,
        "a CQ whose ring passes the context's ring bytes"
    );
    let small: Vec<_> = (0..3).map(|_| a.create_cq(4).unwrap()).collect();
    let r = Introspect::connect_at(&d.socket)
        .unwrap()
        .resources()
        .unwrap();
    let row = |name: &str| {
        r["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["resource"] == name)
            .unwrap()
            .clone()
    };
    let ring_bytes = row("ring-bytes")["used"].as_u64().unwrap();
    assert!(
        ((48 << 10) + 3 * 4096..=64 << 10).contains(&ring_bytes),
        "{ring_bytes} ring bytes"
    );
    assert_eq!(row("ring-bytes")["context"], 64 << 10);
    assert_eq!(row("mappings")["used"], 4);
    assert_eq!(
        row("cqs")["used"],
        4,
        "the refused CQ was destroyed, not left behind"
    );

    // Shared MRs are mappings too: the context has one left, the uid two.
    // Buffers above malloc's largest mmap threshold (32 MiB): pages of their own, which
    // turn into shared memory in place.
    let pd = a.alloc_pd().unwrap();
    let (buf1, mut buf2) = (vec![0u8; 33 << 20], vec![0u8; 33 << 20]);
    let m1 = pd
        .reg_mr_shared(raw_shareable(buf1.as_ptr() as u64, 1 << 20), ALL)
        .expect("a 5th mapping");
    assert_eq!(
        mappings_used(&d.socket),
        5,
        "the shared MR is mapped (not a silent fallback)"
    );
    // Past the context's mappings the daemon refuses the memfd (ENOMEM) and the library
    // registers the same memory without sharing: an unmodified program's ibv_reg_mr must not
    // fail for a budget of softverbs' own making (docs/design/registered-memory.md).
    let m2 = pd
        .reg_mr_shared(raw_shareable(buf2.as_ptr() as u64, 1 << 20), ALL)
        .expect("past the context's mappings, an MR without sharing");
    assert_eq!(mappings_used(&d.socket), 5, "the second MR took no mapping");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let at = buf2.as_ptr() as usize;
    let line = maps
        .lines()
        .find(|l| {
            let (lo, hi) = l.split_once(' ').unwrap().0.split_once('-').unwrap();
            let (lo, hi) = (
                usize::from_str_radix(lo, 16).unwrap(),
                usize::from_str_radix(hi, 16).unwrap(),
            );
            lo <= at && at < hi
        })
        .unwrap();
    assert!(
        !line.contains("memfd:"),
        "the refused conversion was undone: {line}"
    );
    drop(m2);
    assert!(
        pd.reg_slice(&mut buf2[..1 << 20], ALL).is_ok(),
        "an ordinary MR needs no mapping"
    );

    // The uid has one mapping left: a second context of it gets one CQ ring, not two.
    let b = open(&d);
    let cq_b = b.create_cq(4).unwrap();
    assert_eq!(
        errno_of(b.create_cq(4)),
        errno::ENOMEM,
        "a ring past the uid's mappings"
    );
    drop(cq_b);

    // Another uid still gets rings and moves data.
    other_uid_client_works(&d.socket);
    drop((m1, small, big));
}

/// The `mappings` the daemon's introspection counts as used.
fn mappings_used(socket: &Path) -> serde_json::Value {
    let r = Introspect::connect_at(socket).unwrap().resources().unwrap();
    r["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["resource"] == "mappings")
        .unwrap()["used"]
        .clone()
}

#[test]
fn registered_bytes_over_the_limit_get_enomem_and_others_still_work() {
    let (d, _dir) = daemon("registered", &["context.registered-bytes=1M"]);
    let a = open(&d);
    let pd = a.alloc_pd().unwrap();
    let buf = vec![0u8; 2 << 20];
    let at = buf.as_ptr() as u64;
    let m1 = pd.reg_mr(raw(at, 512 << 10), ALL).unwrap();
    assert_eq!(
        errno_of(pd.reg_mr(raw(at + (512 << 10), 600 << 10), ALL)),
        errno::ENOMEM,
        "600 KiB more than the 1 MiB left room for"
    );
    let mut m2 = pd.reg_mr(raw(at + (512 << 10), 512 << 10), ALL).unwrap();
    assert_eq!(
        errno_of(m2.rereg(None, None, Some((raw(at, 600 << 10), at)))),
        errno::ENOMEM,
        "growing an MR past the limit"
    );
    drop(m1);
    assert!(
        pd.reg_mr(raw(at + (1 << 20), 512 << 10), ALL).is_ok(),
        "deregistering gives the bytes back"
    );
    // Another context still registers and moves data.
    transfer_works(&open(&d));
}

/// RESET->INIT->RTR->RTS towards `remote_qpn` on `gid` (this file's path: common::RcPath).
fn connect(qp: &softverbs::Qp<'_>, gid: softverbs::Gid, remote_qpn: u32) {
    connect_with(
        qp,
        gid,
        remote_qpn,
        RcPath {
            rd_atomic: 1,
            ..RcPath::default()
        },
    );
}

#[test]
fn connections_that_never_open_a_device_count_against_their_uid_only() {
    // Each connection is a descriptor of the daemon's, charged to its uid from accept to
    // close: idle ones too (docs/guide/limits.md, "descriptors").
    let (d, _dir) = daemon("conns", &["uid.descriptors=12"]);
    let idle: Vec<_> = (0..12)
        .map(|_| softverbs_ipc::connect_seqpacket(&d.socket).unwrap())
        .collect();
    // The daemon accepts in connection order, so this one comes after the twelve.
    assert_eq!(
        errno_of(Context::open_at(&d.socket, 0)),
        errno::ENOMEM,
        "a context of a uid whose idle connections hold its share"
    );
    other_uid_client_works(&d.socket);
    drop(idle);
    // Closed connections give their share back once the daemon sees them go.
    let deadline = Instant::now() + Duration::from_secs(30);
    let ctx = loop {
        match Context::open_at(&d.socket, 0) {
            Ok(c) => break c,
            Err(e) => assert!(
                e.errno() == errno::ENOMEM && Instant::now() < deadline,
                "{e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    transfer_works(&ctx);
}

#[test]
fn a_uid_over_its_multicast_share_gets_enomem_and_another_uid_still_joins() {
    let (d, _dir) = daemon("mcast", &["uid.mcast-groups=2", "uid.mcast-attachments=3"]);
    let a = open(&d);
    let (pd, cq) = (a.alloc_pd().unwrap(), a.create_cq(4).unwrap());
    let qps = ud_qps(&a, &pd, &cq);
    let (q1, q2) = (&qps[0], &qps[1]);
    q1.attach_mcast(group(1)).unwrap();
    q1.attach_mcast(group(2)).unwrap();
    assert_eq!(
        errno_of(q1.attach_mcast(group(3))),
        errno::ENOMEM,
        "a third group of the uid"
    );
    q2.attach_mcast(group(1)).unwrap();
    assert_eq!(
        errno_of(q2.attach_mcast(group(2))),
        errno::ENOMEM,
        "a fourth attachment of the uid"
    );
    // Another uid joins new groups and the uid's own, in a table the uid cannot fill.
    other_uid_works(&d.socket, "mcast");
    // Detaching gives back: the group once its context's last QP leaves it.
    q1.detach_mcast(group(2)).unwrap();
    q1.attach_mcast(group(3)).unwrap();
    drop(qps);
    drop((cq, pd));
    drop(a);

    // A process of the uid holds its whole share and dies without detaching (kill -9):
    // the share comes back with it.
    let mut holder = child_client(&d.socket, "mcast-hold")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The harness prints "test other_uid_client ... " on the same line.
    use std::io::BufRead;
    let said = std::io::BufReader::new(holder.stdout.take().unwrap())
        .lines()
        .map(Result::unwrap)
        .find_map(|l| Some(l.split_once("joined ")?.1.to_string()));
    assert_eq!(said.as_deref(), Some("2"), "the holder joins its share");
    let b = open(&d);
    let (pd, cq) = (b.alloc_pd().unwrap(), b.create_cq(4).unwrap());
    let qps = ud_qps(&b, &pd, &cq);
    assert_eq!(
        errno_of(qps[0].attach_mcast(group(9))),
        errno::ENOMEM,
        "the uid's share is held by its other process"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = qps[0].attach_mcast(group(9)) {
        assert!(
            e.errno() == errno::ENOMEM && Instant::now() < deadline,
            "{e}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    qps[0].attach_mcast(group(10)).unwrap();
}
