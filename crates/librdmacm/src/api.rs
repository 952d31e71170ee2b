//! The rdma_cma.h entry points (rdma_cm(7), the rdma_* man pages). Failures return -1 (or
//! NULL) with `errno` set, as librdmacm's do.

use core::ffi::{c_char, c_int, c_void};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use softverbs::{CmId, CmQp, CmTimers};
use softverbs_wire::cm::{CmaHdr, PortSpace, ServiceId};

use crate::addr;
use crate::cm::{ev, guard, Chan, Ev, Id};
use crate::ffi::*;
use crate::verbs::{self, QPS_ERR, QPS_INIT, QPS_RTR, QPS_RTS};

pub fn set_errno(e: i32) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

pub(crate) fn fail(e: i32) -> c_int {
    set_errno(e);
    -1
}

pub(crate) fn done(r: Result<(), i32>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// The id behind a program's pointer.
///
/// # Safety
/// `id` is NULL or an id of ours not yet destroyed.
pub(crate) unsafe fn id_ref<'a>(id: *mut rdma_cm_id) -> Result<&'a mut Id, i32> {
    if id.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise; `Id` starts with the rdma_cm_id.
    Ok(unsafe { &mut *id.cast::<Id>() })
}

/// Whether this process may bind a port below 1024: euid 0 or `CAP_NET_BIND_SERVICE`
/// (capability 10) in its effective set (capabilities(7), `/proc/self/status` `CapEff`), the
/// rule the daemon applies to its listen.
fn may_bind_privileged() -> bool {
    // SAFETY: geteuid(2) cannot fail and touches no memory of ours.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|c| c & (1 << 10) != 0)
    })
}

/// Ephemeral ports for ids that connect or bind without one.
static NEXT_PORT: AtomicU32 = AtomicU32::new(0);
fn ephemeral() -> u16 {
    let n = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
    (32768 + (std::process::id().wrapping_mul(97).wrapping_add(n) % 28000)) as u16
}

fn port_space(ps: c_int) -> Result<PortSpace, i32> {
    PortSpace::from_u16(ps as u16).ok_or(libc::EINVAL)
}

// ---- channels ---------------------------------------------------------------------------

/// The channels a program holds, by the address it was given, and the ones it destroyed
/// lately. The program's reference to a channel lives here, not in the pointer it holds: a
/// CM thread may come back into `rdma_get_cm_event` after another thread destroyed the
/// channel (rping's does, between the DISCONNECTED event's ack and the main thread's
/// `rdma_destroy_event_channel`), and taking a reference from the pointer itself would then
/// read freed memory and drop the channel's fds a second time.
struct Channels {
    live: HashMap<usize, Arc<Chan>>,
    /// Recently destroyed channels and whether their fd was blocking then; oldest first.
    gone: VecDeque<(usize, bool)>,
}

/// How many destroyed channels are remembered: enough for the threads of a program tearing
/// down; an address reused by a new channel is forgotten at once.
const GONE_KEPT: usize = 256;

static CHANNELS: Mutex<Option<Channels>> = Mutex::new(None);

fn with_channels<R>(f: impl FnOnce(&mut Channels) -> R) -> R {
    let mut g = CHANNELS.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(|| Channels {
        live: HashMap::new(),
        gone: VecDeque::new(),
    }))
}

/// What a program's channel pointer names.
enum ChanRef {
    Live(Arc<Chan>),
    /// Destroyed; its fd was blocking.
    Gone {
        blocking: bool,
    },
    Unknown,
}

fn chan_of(ch: *mut rdma_event_channel) -> ChanRef {
    let key = ch as usize;
    with_channels(|c| {
        if let Some(a) = c.live.get(&key) {
            ChanRef::Live(a.clone())
        } else if let Some(&(_, blocking)) = c.gone.iter().rev().find(|(k, _)| *k == key) {
            ChanRef::Gone { blocking }
        } else {
            ChanRef::Unknown
        }
    })
}

/// A live channel or the errno for a pointer that is not one: EBADF for a destroyed
/// channel (what rdma_cm's closed fd gives), EINVAL for anything else.
fn live_chan(ch: *mut rdma_event_channel) -> Result<Arc<Chan>, i32> {
    match chan_of(ch) {
        ChanRef::Live(c) => Ok(c),
        ChanRef::Gone { .. } => Err(libc::EBADF),
        ChanRef::Unknown => Err(libc::EINVAL),
    }
}

pub(crate) unsafe extern "C" fn create_event_channel() -> *mut rdma_event_channel {
    match Chan::new() {
        Ok(c) => {
            let p = Arc::as_ptr(&c) as *mut rdma_event_channel;
            with_channels(|cs| {
                cs.gone.retain(|(k, _)| *k != p as usize);
                cs.live.insert(p as usize, c);
            });
            p
        }
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}
export!(
    "rdma_create_event_channel",
    "RDMACM_1.0",
    create_event_channel
);

pub(crate) unsafe extern "C" fn destroy_event_channel(ch: *mut rdma_event_channel) {
    let key = ch as usize;
    let Some(c) = with_channels(|cs| {
        let c = cs.live.remove(&key)?;
        // SAFETY: fcntl on the channel's own fd, still open (the Arc is held).
        let flags = unsafe { libc::fcntl(c.ch.fd, libc::F_GETFL) };
        if cs.gone.len() == GONE_KEPT {
            cs.gone.pop_front();
        }
        cs.gone
            .push_back((key, flags >= 0 && flags & libc::O_NONBLOCK == 0));
        Some(c)
    }) else {
        return;
    };
    // Ids on it and threads waiting in it hold their own references; the fds close with
    // the last of them, outside the registry's lock.
    drop(c);
}
export!(
    "rdma_destroy_event_channel",
    "RDMACM_1.0",
    destroy_event_channel
);

pub(crate) unsafe extern "C" fn get_cm_event(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    if ch.is_null() || out.is_null() {
        return fail(libc::EINVAL);
    }
    // The call holds a reference of its own: a program may destroy the channel while this
    // thread waits in it (rping's main thread does, its CM thread blocked here), and the
    // wait then goes on, as a `read` on rdma_cm's fd does after another thread closed it.
    // A thread that comes back in just after the destroy (rping's, between acking the
    // DISCONNECTED event and its next call) waits the same way: the program is tearing
    // down, its exit ends the wait, and an error would make rping exit with it.
    let c = match chan_of(ch) {
        ChanRef::Live(c) => c,
        ChanRef::Gone { blocking: true } => loop {
            std::thread::park();
        },
        ChanRef::Gone { blocking: false } => return fail(libc::EBADF),
        ChanRef::Unknown => return fail(libc::EINVAL),
    };
    // SAFETY: fcntl on the channel's fd; a program may have made it non-blocking.
    let flags = unsafe { libc::fcntl(c.ch.fd, libc::F_GETFL) };
    let block = flags >= 0 && flags & libc::O_NONBLOCK == 0;
    match c.next(block, true) {
        Ok(e) => {
            // SAFETY: `out` is the program's pointer slot.
            unsafe { *out = Box::into_raw(e).cast() };
            0
        }
        Err(e) => fail(e),
    }
}
export!("rdma_get_cm_event", "RDMACM_1.0", get_cm_event);

pub(crate) unsafe extern "C" fn ack_cm_event(e: *mut rdma_cm_event) -> c_int {
    if e.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: an event of ours (Box::into_raw in get_cm_event).
    let e = unsafe { Box::from_raw(e.cast::<Ev>()) };
    e.acked();
    drop(e);
    0
}
export!("rdma_ack_cm_event", "RDMACM_1.0", ack_cm_event);

/// For synchronous ids: waits for the event an operation produces and keeps it in
/// `id->event` until the next one (rdma-core's `ucma_complete`): rdma_xclient reads the
/// REP's private data (the server's SRQ number) from `id->event` after `rdma_connect`.
pub(crate) fn wait_sync(id: &mut Id, want: i32) -> Result<(), i32> {
    let e = id.chan.next(true, false)?;
    let (kind, status) = (e.ev.event, e.ev.status);
    let old = std::mem::replace(&mut id.id.event, Box::into_raw(e).cast());
    if !old.is_null() {
        // SAFETY: the event this id kept before (from here or rdma_get_request), which
        // rdma-core acks at this point too.
        drop(unsafe { Box::from_raw(old.cast::<Ev>()) });
    }
    if kind == want {
        Ok(())
    } else if status < 0 {
        Err(-status)
    } else if kind == ev::REJECTED {
        Err(libc::ECONNREFUSED)
    } else {
        Err(libc::EIO)
    }
}

pub(crate) fn is_sync(id: &Id) -> bool {
    id.lock().sync
}

// ---- ids ---------------------------------------------------------------------------------

pub(crate) unsafe extern "C" fn create_id(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    if out.is_null() || port_space(ps).is_err() {
        return fail(libc::EINVAL);
    }
    let (chan, sync) = if ch.is_null() {
        match Chan::new() {
            Ok(c) => (c, true),
            Err(e) => return fail(e),
        }
    } else {
        match live_chan(ch) {
            Ok(c) => (c, false),
            Err(e) => return fail(e),
        }
    };
    let id = Id::new(chan, context, ps, sync);
    // SAFETY: the program's pointer slot.
    unsafe { *out = id.cast() };
    0
}
export!("rdma_create_id", "RDMACM_1.0", create_id);

pub(crate) unsafe extern "C" fn destroy_id(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    let (dev, cm, listeners) = {
        let mut s = i.lock();
        (s.dev, s.cm.take(), std::mem::take(&mut s.listeners))
    };
    for (d, l) in listeners {
        i.chan.unregister(d, l);
        let _ = i.chan.with_cm(d, |c| c.destroy(l).map_err(|e| e.errno()));
    }
    if let (Some(d), Some(c)) = (dev, cm) {
        i.chan.unregister(d, c);
        let _ = i.chan.with_cm(d, |ch| ch.destroy(c).map_err(|e| e.errno()));
    }
    if !i.id.event.is_null() {
        // SAFETY: an event of ours kept by rdma_get_request.
        drop(unsafe { Box::from_raw(i.id.event.cast::<Ev>()) });
    }
    crate::mcast::leave_all(i);
    free_cqs(i);
    // Nothing new reaches the program for this id now (unregistered, its local events
    // dropped); what it already got must be acked before the id goes (rdma_destroy_id(3)).
    i.chan.forget_local(id.cast::<Id>());
    i.unacked.wait_zero();
    // SAFETY: made by Id::new (Box::into_raw); the program no longer uses it.
    drop(unsafe { Box::from_raw(id.cast::<Id>()) });
    0
}
export!("rdma_destroy_id", "RDMACM_1.0", destroy_id);

pub(crate) unsafe extern "C" fn bind_addr(id: *mut rdma_cm_id, sa: *mut libc::sockaddr) -> c_int {
    // SAFETY: an id of ours; `sa` a sockaddr.
    let (Ok(i), Some((ip, port))) = (unsafe { id_ref(id) }, unsafe { addr::parse(sa) }) else {
        return fail(libc::EINVAL);
    };
    // As bind(2) and the kernel's rdma_cm: a port below 1024 needs CAP_NET_BIND_SERVICE.
    // The daemon checks it again where it matters, at rdma_listen (docs/design/security.md).
    if port != 0 && port < 1024 && !may_bind_privileged() {
        return fail(libc::EACCES);
    }
    let port = if port == 0 { ephemeral() } else { port };
    let mut s = guard(&i.st);
    // A loopback address no device owns binds as the wildcard does, no device yet
    // (`id->verbs` NULL), as the kernel's rdma_cm binds it: libfabric's verbs provider binds
    // "localhost" when given no address and then offers every device's own addresses
    // (prov/verbs `vrb_get_rdma_rai`, `vrb_fill_addr`).
    let wildcard = ip.is_unspecified() || (ip.is_loopback() && verbs::device_with(ip).is_none());
    if !wildcard {
        let Some(d) = verbs::device_with(ip) else {
            drop(s);
            return fail(libc::EADDRNOTAVAIL);
        };
        s.dev = Some(d);
        verbs::attach(&mut i.id, d);
    }
    s.port = port;
    i.id.route.addr.src = addr::storage(ip, port);
    0
}
export!("rdma_bind_addr", "RDMACM_1.0", bind_addr);

pub(crate) unsafe extern "C" fn listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    let Ok(ps) = port_space(i.id.ps) else {
        return fail(libc::EINVAL);
    };
    let (dev, port) = {
        let s = i.lock();
        (s.dev, s.port)
    };
    let sid = ServiceId { ps, port }.to_u64();
    let devs: Vec<usize> = match dev {
        Some(d) => vec![d],
        None => (0..verbs::devices().len()).collect(),
    };
    if devs.is_empty() {
        return fail(libc::ENODEV);
    }
    let me = id.cast::<Id>();
    for d in devs {
        match i.chan.make_id(d, me, |c| {
            // A negative backlog asks for the default, as 0 does (listen(2) likewise).
            c.listen_backlog(sid, u32::try_from(backlog).unwrap_or(0))
                .map_err(|e| e.errno())
        }) {
            Ok(l) => {
                i.lock().listeners.push((d, l));
            }
            Err(e) => return fail(e),
        }
    }
    0
}
export!("rdma_listen", "RDMACM_1.0", listen);

pub(crate) unsafe extern "C" fn resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: an id of ours, sockaddrs.
    let (Ok(i), Some((dip, dport))) = (unsafe { id_ref(id) }, unsafe { addr::parse(dst) }) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: as above.
    let sip = unsafe { addr::parse(src) }
        .map(|(ip, _)| ip)
        .or_else(|| addr::of(&i.id.route.addr.src).map(|(ip, _)| ip));
    let Some((d, local)) = verbs::route(sip, dip) else {
        return fail(libc::EADDRNOTAVAIL);
    };
    {
        let mut s = guard(&i.st);
        if s.port == 0 {
            s.port = ephemeral();
        }
        s.dev = Some(d);
        s.path.dgid = addr::gid(dip);
        s.path.sgid_index = verbs::sgid_index(d, local);
        verbs::attach(&mut i.id, d);
        i.id.route.addr.src = addr::storage(local, s.port);
        i.id.route.addr.dst = addr::storage(dip, dport);
    }
    report_local(i, ev::ADDR_RESOLVED)
}
export!("rdma_resolve_addr", "RDMACM_1.0", resolve_addr);

/// Queues the library's own event `kind` for `i` (address and route resolution report at
/// once, no daemon involved) and, for a synchronous id, waits for it as rdma_cm does.
fn report_local(i: &mut Id, kind: i32) -> c_int {
    let me = (i as *mut Id).cast();
    i.chan
        .push_local(Ev::new(kind, me, std::ptr::null_mut(), 0));
    if is_sync(i) {
        return done(wait_sync(i, kind));
    }
    0
}

pub(crate) unsafe extern "C" fn resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    let (Some((s, _)), Some((d, _))) = (
        addr::of(&i.id.route.addr.src),
        addr::of(&i.id.route.addr.dst),
    ) else {
        return fail(libc::EINVAL);
    };
    i.id.route.addr.ibaddr.sgid = addr::gid(s);
    i.id.route.addr.ibaddr.dgid = addr::gid(d);
    i.id.route.addr.ibaddr.pkey = 0xFFFF;
    i.id.route.num_paths = 1;
    report_local(i, ev::ROUTE_RESOLVED)
}
export!("rdma_resolve_route", "RDMACM_1.0", resolve_route);

/// The QP attributes rdma_cm would set (`rdma_init_qp_attr(3)`): the state asked for in
/// `attr->qp_state`.
unsafe extern "C" fn init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    if attr.is_null() || mask.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's attribute block.
    let state = unsafe { (*attr).qp_state };
    let path = {
        let mut s = i.lock();
        if state == QPS_RTR || state == QPS_RTS {
            s.path.choose_psn(psn);
        }
        s.path
    };
    match verbs::qp_attr(state, i.id.qp_type as u32, &path) {
        Some((a, m)) => {
            // SAFETY: as above.
            unsafe {
                *attr = a;
                *mask = m;
            }
            0
        }
        None => fail(libc::EINVAL),
    }
}
export!("rdma_init_qp_attr", "RDMACM_1.2", init_qp_attr);

/// A connection's starting PSN: random (the operating system's CSPRNG), as the kernel's
/// rdma_cm takes it (`get_random_u32() & 0xffffff`). A PSN a third party could compute would
/// let it forge packets the responder accepts as in sequence (IBA 9.7.1; docs/design/security.md).
fn psn() -> u32 {
    let mut b = [0; 4];
    // getrandom(2) on Linux fails only before the kernel's pool is ready at boot or on
    // EINTR; the crate retries EINTR. Without it, a time-and-address mix still differs per
    // connection, but it is not secret.
    if getrandom::getrandom(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        b = (t ^ NEXT_PORT.fetch_add(1, Ordering::Relaxed).wrapping_mul(7919)).to_le_bytes();
    }
    u32::from_le_bytes(b) & 0x00FF_FFFF
}

pub(crate) unsafe extern "C" fn connect(id: *mut rdma_cm_id, p: *mut rdma_conn_param) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    let (Some((src, sport)), Some((dst, dport))) = (
        addr::of(&i.id.route.addr.src),
        addr::of(&i.id.route.addr.dst),
    ) else {
        return fail(libc::EINVAL);
    };
    let Some(dev) = i.lock().dev else {
        return fail(libc::EINVAL);
    };
    let Ok(ps) = port_space(i.id.ps) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: NULL or the program's parameters.
    let p = unsafe { p.as_ref() };
    let user: &[u8] = match p {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            // SAFETY: the program's private data of the length it gives.
            unsafe { std::slice::from_raw_parts(p.private_data.cast(), p.private_data_len.into()) }
        }
        _ => &[],
    };
    let mut pd = vec![0u8; 36];
    if (CmaHdr {
        src_port: sport,
        src,
        dst,
    })
    .emit(&mut pd)
    .is_err()
    {
        return fail(libc::EINVAL);
    }
    pd.extend_from_slice(user);
    let sid = ServiceId { ps, port: dport }.to_u64();
    if ps.uses_sidr() {
        let r = i.chan.make_id(dev, id.cast(), |c| {
            c.sidr_request(dst, sid, CmTimers::default(), &pd)
                .map_err(|e| e.errno())
        });
        return match r {
            Ok(cm) => {
                i.lock().cm = Some(cm);
                if is_sync(i) {
                    return done(wait_sync(i, ev::ESTABLISHED));
                }
                0
            }
            Err(e) => fail(e),
        };
    }
    // SAFETY: NULL or the drop-in's QP on this id.
    let qpn = match unsafe { i.id.qp.as_ref() } {
        Some(qp) => qp.qp_num,
        None => p.map_or(0, |p| p.qp_num),
    };
    let local_psn = i.lock().path.choose_psn(psn);
    let (max_resp, max_init) = verbs::rd_limits(i.id.verbs);
    let q = CmQp {
        qpn,
        starting_psn: local_psn,
        responder_resources: p.map_or(1, |p| p.responder_resources.min(max_resp)),
        initiator_depth: p.map_or(1, |p| p.initiator_depth.min(max_init)),
        rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count.min(7)),
        retry_count: p.map_or(7, |p| p.retry_count.min(7)),
        srq: p.is_some_and(|p| p.srq != 0) || !i.id.srq.is_null(),
        // An XRC send QP's REQ says XRC (IBA A14.4.1: Transport Service Type 3, Extended
        // Transport Type 1), which the kernel's rdma_cm checks against its listener's type.
        xrc: i.id.qp_type == verbs::QPT_XRC_SEND as c_int,
    };
    {
        let mut s = i.lock();
        s.path.local_psn = local_psn;
        s.path.initiator_depth = q.initiator_depth;
        s.path.responder_resources = q.responder_resources;
        s.path.dgid = addr::gid(dst);
        s.path.sgid_index = verbs::sgid_index(dev, src);
    }
    match i.chan.make_id(dev, id.cast(), |c| {
        c.connect(dst, sid, q, CmTimers::default(), &pd)
            .map_err(|e| e.errno())
    }) {
        Ok(cm) => {
            i.lock().cm = Some(cm);
        }
        Err(e) => return fail(e),
    }
    if is_sync(i) {
        return done(wait_sync(i, ev::ESTABLISHED));
    }
    0
}
export!("rdma_connect", "RDMACM_1.0", connect);

pub(crate) unsafe extern "C" fn accept(id: *mut rdma_cm_id, p: *mut rdma_conn_param) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    let (Some(dev), Some(cm)) = ({
        let s = i.lock();
        (s.dev, s.cm)
    }) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: NULL or the program's parameters.
    let p = unsafe { p.as_ref() };
    let user: &[u8] = match p {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            // SAFETY: the program's private data of the length it gives.
            unsafe { std::slice::from_raw_parts(p.private_data.cast(), p.private_data_len.into()) }
        }
        _ => &[],
    };
    if i.lock().sidr || i.id.qp_type == 4 {
        // A UD id answers the SIDR_REQ with its QP.
        // SAFETY: NULL or the drop-in's QP.
        let qpn = match unsafe { i.id.qp.as_ref() } {
            Some(q) => q.qp_num,
            None => p.map_or(0, |p| p.qp_num),
        };
        let qkey = verbs::RDMA_UDP_QKEY;
        return done(i.chan.with_cm(dev, |c| {
            c.sidr_reply(cm, 0, qpn, qkey, user).map_err(|e| e.errno())
        }));
    }
    let mut path = {
        let mut s = i.lock();
        s.path.choose_psn(psn);
        if let Some(p) = p {
            let (max_resp, max_init) = verbs::rd_limits(i.id.verbs);
            s.path.initiator_depth = p
                .initiator_depth
                .min(max_init)
                .min(s.path.responder_resources.max(1));
            s.path.responder_resources = p.responder_resources.min(max_resp);
        }
        s.path
    };
    // SAFETY: NULL or the drop-in's QP on this id.
    let qpn = match unsafe { i.id.qp.as_ref() } {
        Some(qp) => qp.qp_num,
        None => p.map_or(0, |p| p.qp_num),
    };
    if !i.id.qp.is_null() {
        path.responder_resources = path.responder_resources.max(1);
        if let Err(e) = verbs::modify(i.id.qp, QPS_RTR, &path)
            .and_then(|_| verbs::modify(i.id.qp, QPS_RTS, &path))
        {
            return fail(e);
        }
    }
    let q = CmQp {
        qpn,
        starting_psn: path.local_psn,
        responder_resources: path.responder_resources,
        initiator_depth: path.initiator_depth,
        rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count.min(7)),
        retry_count: 7,
        // An XRC receive QP always receives through an SRQ (IBA A14.4.2; the kernel's ib_cm
        // sets the REP's SRQ bit for it, whatever the id holds).
        srq: !i.id.srq.is_null() || i.id.qp_type == verbs::QPT_XRC_RECV as c_int,
        // Informational here: the daemon's CM formats an XRC REP from the REQ it answers.
        xrc: i.id.qp_type == verbs::QPT_XRC_RECV as c_int,
    };
    if let Err(e) = i
        .chan
        .with_cm(dev, |c| c.accept(cm, q, user).map_err(|e| e.errno()))
    {
        return fail(e);
    }
    if is_sync(i) {
        return done(wait_sync(i, ev::ESTABLISHED));
    }
    0
}
export!("rdma_accept", "RDMACM_1.0", accept);

pub(crate) unsafe extern "C" fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    let (Some(dev), Some(cm)) = ({
        let s = i.lock();
        (s.dev, s.cm)
    }) else {
        return fail(libc::EINVAL);
    };
    let pd: &[u8] = if data.is_null() {
        &[]
    } else {
        // SAFETY: the program's private data of the length it gives.
        unsafe { std::slice::from_raw_parts(data.cast(), len.into()) }
    };
    if i.lock().sidr || i.id.qp_type == 4 {
        return done(i.chan.with_cm(dev, |c| {
            c.sidr_reply(cm, 2, 0, 0, pd).map_err(|e| e.errno())
        }));
    }
    done(
        i.chan
            .with_cm(dev, |c| c.reject(cm, pd).map_err(|e| e.errno())),
    )
}
export!("rdma_reject", "RDMACM_1.0", reject);

unsafe extern "C" fn reject_ece(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: forwarded as given.
    unsafe { reject(id, data, len) }
}
export!("rdma_reject_ece", "RDMACM_1.3", reject_ece);

unsafe extern "C" fn establish(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    let (Some(dev), Some(cm)) = ({
        let s = i.lock();
        (s.dev, s.cm)
    }) else {
        return fail(libc::EINVAL);
    };
    done(
        i.chan
            .with_cm(dev, |c| c.establish(cm).map_err(|e| e.errno())),
    )
}
export!("rdma_establish", "RDMACM_1.2", establish);

pub(crate) unsafe extern "C" fn disconnect(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    let (dev, cm, path) = {
        let s = i.lock();
        (s.dev, s.cm, s.path)
    };
    let _ = verbs::modify(i.id.qp, QPS_ERR, &path);
    let (Some(dev), Some(cm)) = (dev, cm) else {
        return fail(libc::EINVAL);
    };
    done(
        i.chan
            .with_cm(dev, |c| c.disconnect(cm, &[]).map_err(|e| e.errno())),
    )
}
export!("rdma_disconnect", "RDMACM_1.0", disconnect);

unsafe extern "C" fn migrate_id(id: *mut rdma_cm_id, ch: *mut rdma_event_channel) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    let target = if ch.is_null() {
        match Chan::new() {
            Ok(c) => c,
            Err(e) => return fail(e),
        }
    } else {
        match live_chan(ch) {
            Ok(c) => c,
            Err(e) => return fail(e),
        }
    };
    if Arc::ptr_eq(&target, &i.chan) {
        return 0;
    }
    // rdma_migrate_id(3): blocks while events the program got for the id on its current
    // channel are unacknowledged (a CONNECT_REQUEST counts against its listener).
    i.unacked.wait_zero();
    // The daemon's CM ids belong to the channel's daemon connection: those the id has move
    // to the target channel's connection (the daemon checks both are this process's).
    let cms: Vec<(usize, CmId)> = {
        let s = i.lock();
        let own = s.dev.zip(s.cm);
        s.listeners.iter().copied().chain(own).collect()
    };
    let from = i.chan.clone();
    if !cms.is_empty() {
        if let Err(e) = from.migrate_to(&target, (i as *mut Id).cast(), &cms) {
            return fail(e);
        }
    }
    i.lock().sync = ch.is_null();
    i.id.channel = Arc::as_ptr(&target) as *mut rdma_event_channel;
    i.chan = target;
    0
}
export!("rdma_migrate_id", "RDMACM_1.0", migrate_id);

unsafe extern "C" fn get_request(listen: *mut rdma_cm_id, out: *mut *mut rdma_cm_id) -> c_int {
    // SAFETY: an id of ours.
    let Ok(l) = (unsafe { id_ref(listen) }) else {
        return fail(libc::EINVAL);
    };
    if out.is_null() {
        return fail(libc::EINVAL);
    }
    loop {
        let e = match l.chan.next(true, false) {
            Ok(e) => e,
            Err(e) => return fail(e),
        };
        if e.ev.event == ev::CONNECT_REQUEST {
            let child = e.ev.id;
            let ep = guard(&l.st).ep_qp;
            if let Some((mut attr, pd)) = ep {
                // SAFETY: the child id the event made, not yet the program's.
                let c = unsafe { &mut *child.cast::<Id>() };
                if let Err(err) = create_qp_inner(c, pd as *mut c_void, &mut attr) {
                    // SAFETY: our own entry point on the child id, which is still alive.
                    let _ = unsafe { reject(child, std::ptr::null(), 0) };
                    drop(e);
                    // SAFETY: as above.
                    unsafe { destroy_id(child) };
                    return fail(err);
                }
            }
            // SAFETY: the child id the event made; it keeps the event (rdma_get_request(3):
            // `id->event`) until destroyed.
            unsafe {
                (*child).event = Box::into_raw(e).cast();
                *out = child;
            }
            return 0;
        }
    }
}
export!("rdma_get_request", "RDMACM_1.0", get_request);

// ---- QPs -----------------------------------------------------------------------------

/// A CQ of at least `depth` entries on the id's context with a completion channel of its own
/// (rdma_create_qp(3) and rdma_create_srq(3) make such CQs for an id given none): both, or
/// neither and ENOMEM.
fn new_cq(i: &mut Id, depth: u32) -> Result<(*mut c_void, *mut c_void), c_int> {
    // SAFETY: the id's (drop-in) context, alive while the id is; the CQ's context pointer is
    // the id, which outlives the CQ (free_cqs destroys it first).
    unsafe {
        let ch = ibv_create_comp_channel(i.id.verbs);
        if ch.is_null() {
            return Err(libc::ENOMEM);
        }
        let cq = ibv_create_cq(
            i.id.verbs,
            depth.max(1) as c_int,
            (i as *mut Id).cast(),
            ch,
            0,
        );
        if cq.is_null() {
            ibv_destroy_comp_channel(ch);
            return Err(libc::ENOMEM);
        }
        Ok((ch, cq))
    }
}

/// Undoes [`new_cq`] for a CQ nothing uses yet.
fn drop_cq(ch: *mut c_void, cq: *mut c_void) {
    // SAFETY: both just made by new_cq and handed to no one.
    unsafe {
        ibv_destroy_cq(cq);
        ibv_destroy_comp_channel(ch);
    }
}

fn free_cqs(i: &mut Id) {
    let (own_cqs, own_pd) = {
        let s = i.lock();
        (s.own_cqs, s.own_pd)
    };
    if own_cqs {
        // SAFETY: CQs and channels this library made for the id (ucma_create_cqs), no QP
        // uses them any more.
        unsafe {
            for cq in [i.id.send_cq, i.id.recv_cq] {
                if !cq.is_null() {
                    ibv_destroy_cq(cq);
                }
            }
            for ch in [i.id.send_cq_channel, i.id.recv_cq_channel] {
                if !ch.is_null() {
                    ibv_destroy_comp_channel(ch);
                }
            }
        }
        i.id.send_cq = std::ptr::null_mut();
        i.id.recv_cq = std::ptr::null_mut();
        i.id.send_cq_channel = std::ptr::null_mut();
        i.id.recv_cq_channel = std::ptr::null_mut();
        i.lock().own_cqs = false;
    }
    let _ = own_pd;
}

fn create_qp_inner(i: &mut Id, pd: *mut c_void, attr: *mut ibv_qp_init_attr) -> Result<(), i32> {
    if i.id.verbs.is_null() || attr.is_null() {
        return Err(libc::EINVAL);
    }
    let pd = if !pd.is_null() {
        pd
    } else if !i.id.pd.is_null() {
        i.id.pd
    } else {
        // SAFETY: the id's (drop-in) context.
        let p = unsafe { ibv_alloc_pd(i.id.verbs) };
        if p.is_null() {
            return Err(libc::ENOMEM);
        }
        i.lock().own_pd = true;
        p
    };
    i.id.pd = pd;
    // SAFETY: the program's attributes.
    let a = unsafe { &mut *attr };
    if a.srq.is_null() {
        // rdma_create_qp(3) as rdma-core's: a QP made after rdma_create_srq receives
        // through the id's SRQ.
        a.srq = i.id.srq;
    }
    if a.qp_type == verbs::QPT_XRC_SEND || a.qp_type == verbs::QPT_XRC_RECV {
        // rdma_create_qp(3) on an XRC id (rdma_create_ep with an XRC address info, and each
        // request rdma_get_request returns on such a listener): the extended call, which is
        // how rdma-core's librdmacm makes every QP.
        let mut ex = ibv_qp_init_attr_ex {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
            comp_mask: QP_INIT_ATTR_PD,
            pd,
            xrcd: std::ptr::null_mut(),
        };
        let r = create_xrc_qp(i, &mut ex);
        a.send_cq = ex.send_cq;
        a.cap = ex.cap;
        return r;
    }
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        // rdma_create_qp(3): without CQs, the id gets its own, with completion channels.
        let (sch, scq) = new_cq(i, a.cap.max_send_wr)?;
        let (rch, rcq) = match new_cq(i, a.cap.max_recv_wr) {
            Ok(r) => r,
            Err(e) => {
                drop_cq(sch, scq);
                return Err(e);
            }
        };
        i.id.send_cq_channel = sch;
        i.id.recv_cq_channel = rch;
        i.id.send_cq = scq;
        i.id.recv_cq = rcq;
        i.lock().own_cqs = true;
        a.send_cq = i.id.send_cq;
        a.recv_cq = i.id.recv_cq;
    }
    // SAFETY: a PD of the drop-in and the program's attributes.
    let qp = unsafe { ibv_create_qp(pd, a) };
    if qp.is_null() {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOMEM));
    }
    let path = i.lock().path;
    if let Err(e) = verbs::modify(qp, QPS_INIT, &path) {
        // SAFETY: just created.
        unsafe { ibv_destroy_qp(qp) };
        return Err(e);
    }
    if a.qp_type == verbs::QPT_UD {
        let _ = verbs::modify(qp, QPS_RTR, &path).and_then(|_| verbs::modify(qp, QPS_RTS, &path));
    }
    i.id.qp = qp;
    i.id.srq = a.srq;
    i.id.qp_type = a.qp_type as c_int;
    Ok(())
}

pub(crate) unsafe extern "C" fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut c_void,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    done(create_qp_inner(i, pd, attr))
}
export!("rdma_create_qp", "RDMACM_1.0", create_qp);

unsafe extern "C" fn create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's attributes.
    let a = unsafe { &mut *attr };
    if a.qp_type == verbs::QPT_XRC_SEND || a.qp_type == verbs::QPT_XRC_RECV {
        return done(create_xrc_qp(i, attr));
    }
    let pd = if a.comp_mask & QP_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        std::ptr::null_mut()
    };
    let mut base = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    let r = create_qp_inner(i, pd, &mut base);
    a.send_cq = base.send_cq;
    a.recv_cq = base.recv_cq;
    a.cap = base.cap;
    done(r)
}
export!("rdma_create_qp_ex", "RDMACM_1.0", create_qp_ex);

/// `rdma_create_qp_ex(3)` for XRC: an XRC send (INI) QP on the id's PD, or an XRC receive
/// (TGT) QP in the caller's XRC domain, made with the drop-in's `ibv_create_qp_ex` (the
/// program's own attribute block, so every field it set is seen) and moved to INIT; the
/// connection brings it to RTR/RTS as for RC. An INI QP without a send CQ gets one of the
/// id's own, as `rdma_create_qp` gives RC QPs; neither type has a receive queue of its own
/// (IBA 11.2.4.4: an XRC TGT QP receives into the SRQ a message names).
fn create_xrc_qp(i: &mut Id, attr: *mut ibv_qp_init_attr_ex) -> Result<(), i32> {
    if i.id.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the program's attribute block (checked non-NULL by the caller).
    let a = unsafe { &mut *attr };
    if a.qp_type == verbs::QPT_XRC_SEND {
        if a.comp_mask & QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            if i.id.pd.is_null() {
                // SAFETY: the id's (drop-in) context.
                let p = unsafe { ibv_alloc_pd(i.id.verbs) };
                if p.is_null() {
                    return Err(libc::ENOMEM);
                }
                i.id.pd = p;
                i.lock().own_pd = true;
            }
            a.pd = i.id.pd;
            a.comp_mask |= QP_INIT_ATTR_PD;
        }
        if a.send_cq.is_null() {
            let (ch, cq) = new_cq(i, a.cap.max_send_wr)?;
            i.id.send_cq_channel = ch;
            i.id.send_cq = cq;
            i.lock().own_cqs = true;
            a.send_cq = i.id.send_cq;
        }
    }
    if a.qp_type == verbs::QPT_XRC_RECV
        && (a.comp_mask & QP_INIT_ATTR_XRCD == 0 || a.xrcd.is_null())
    {
        // rdma_create_qp_ex(3) as rdma-core's: a receive QP without a domain goes into the
        // library's own domain for the device, where rdma_create_srq puts the SRQs too.
        a.xrcd = verbs::xrcd_of(i.id.verbs)?;
        a.comp_mask |= QP_INIT_ATTR_XRCD;
    }
    let qp = verbs::create_qp_ex(i.id.verbs, attr)?;
    let path = i.lock().path;
    if let Err(e) = verbs::modify(qp, QPS_INIT, &path) {
        // SAFETY: just created, nobody else has it.
        unsafe { ibv_destroy_qp(qp) };
        return Err(e);
    }
    if a.comp_mask & QP_INIT_ATTR_PD != 0 && i.id.pd.is_null() {
        i.id.pd = a.pd;
    }
    i.id.qp = qp;
    i.id.qp_type = a.qp_type as c_int;
    Ok(())
}

pub(crate) unsafe extern "C" fn destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: an id of ours.
    if let Ok(i) = unsafe { id_ref(id) } {
        if !i.id.qp.is_null() {
            // The CM attached it to the id's groups; a QP with attachments cannot go.
            crate::mcast::detach_qp(i);
            // SAFETY: the QP this id made.
            unsafe { ibv_destroy_qp(i.id.qp) };
            i.id.qp = std::ptr::null_mut();
        }
    }
}
export!("rdma_destroy_qp", "RDMACM_1.0", destroy_qp);

// ---- SRQs ------------------------------------------------------------------------------

/// `rdma_create_srq_ex(3)`: an SRQ on the id (`id->srq`, which the id's QPs then use). As
/// rdma-core's: the PD defaults to the id's; an XRC SRQ (`IBV_SRQT_XRC`) without a domain goes
/// into the library's domain for the device (where the id's XRC receive QPs are), and one
/// without a CQ completes on a CQ of the id's own (`id->recv_cq`, with a completion channel,
/// so `rdma_get_recv_comp` reads its completions).
unsafe extern "C" fn create_srq_ex(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    if attr.is_null() || i.id.verbs.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's attribute block.
    done(unsafe { create_srq_inner(i, &mut *attr) })
}
export!("rdma_create_srq_ex", "RDMACM_1.0", create_srq_ex);

fn create_srq_inner(i: &mut Id, a: &mut ibv_srq_init_attr_ex) -> Result<(), i32> {
    if a.comp_mask & SRQ_INIT_ATTR_TYPE == 0 {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = i.id.pd;
        a.comp_mask |= SRQ_INIT_ATTR_PD;
    }
    let mut made_cq = false;
    if a.srq_type == SRQT_XRC {
        if a.comp_mask & SRQ_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
            a.xrcd = verbs::xrcd_of(i.id.verbs)?;
        }
        if a.comp_mask & SRQ_INIT_ATTR_CQ == 0 || a.cq.is_null() {
            if i.id.recv_cq.is_null() {
                // Sized from the SRQ's depth.
                let (ch, cq) = new_cq(i, a.attr.max_wr)?;
                i.id.recv_cq_channel = ch;
                i.id.recv_cq = cq;
                i.lock().own_cqs = true;
                made_cq = true;
            }
            a.cq = i.id.recv_cq;
        }
        a.comp_mask |= SRQ_INIT_ATTR_XRCD | SRQ_INIT_ATTR_CQ;
    }
    match verbs::create_srq_ex(i.id.verbs, a) {
        Ok(srq) => {
            if i.id.pd.is_null() {
                i.id.pd = a.pd;
            }
            i.id.srq = srq;
            i.lock().own_srq = true;
            Ok(())
        }
        Err(e) => {
            if made_cq {
                free_cqs(i);
            }
            Err(e)
        }
    }
}

/// `rdma_create_srq(3)`: `rdma_create_srq_ex` of the id's kind, XRC on an XRC receive id
/// (rdma_xserver's way to get the SRQ whose number it hands to the client).
unsafe extern "C" fn create_srq(
    id: *mut rdma_cm_id,
    pd: *mut c_void,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    if attr.is_null() || i.id.verbs.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's attribute block.
    let a = unsafe { &mut *attr };
    let mut ex = ibv_srq_init_attr_ex {
        srq_context: a.srq_context,
        attr: a.attr,
        comp_mask: SRQ_INIT_ATTR_TYPE | SRQ_INIT_ATTR_PD,
        srq_type: if i.id.qp_type == verbs::QPT_XRC_RECV as c_int {
            SRQT_XRC
        } else {
            SRQT_BASIC
        },
        pd,
        xrcd: std::ptr::null_mut(),
        cq: std::ptr::null_mut(),
        tm_cap: [0; 2],
    };
    let r = create_srq_inner(i, &mut ex);
    a.attr = ex.attr;
    done(r)
}
export!("rdma_create_srq", "RDMACM_1.0", create_srq);

/// `rdma_destroy_srq(3)`: the id's SRQ, then the CQs the library made for the id.
unsafe extern "C" fn destroy_srq(id: *mut rdma_cm_id) {
    // SAFETY: an id of ours.
    if let Ok(i) = unsafe { id_ref(id) } {
        let own = std::mem::take(&mut i.lock().own_srq);
        if own && !i.id.srq.is_null() {
            // SAFETY: the SRQ rdma_create_srq made for this id; its QPs are gone.
            unsafe { ibv_destroy_srq(i.id.srq) };
        }
        if own {
            i.id.srq = std::ptr::null_mut();
        }
        free_cqs(i);
    }
}
export!("rdma_destroy_srq", "RDMACM_1.0", destroy_srq);

// ---- endpoints (synchronous ids from rdma_getaddrinfo) ---------------------------------

unsafe extern "C" fn create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut c_void,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    if out.is_null() || res.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's address info.
    let r = unsafe { &*res };
    let mut id: *mut rdma_cm_id = std::ptr::null_mut();
    // SAFETY: our own entry points with valid arguments.
    unsafe {
        if create_id(
            std::ptr::null_mut(),
            &mut id,
            std::ptr::null_mut(),
            r.ai_port_space,
        ) != 0
        {
            return -1;
        }
        // rdma_create_ep(3): the id is of the address info's QP type (rdma-core's
        // rdma_create_id2 with ai_qp_type): an XRC listener's requests are for XRC receive
        // QPs, an XRC active id's REQ is for XRC.
        if r.ai_qp_type != 0 {
            (*id).qp_type = r.ai_qp_type;
        }
        let ok = if r.ai_flags & 1 != 0 {
            bind_addr(id, r.ai_src_addr)
        } else {
            let x = resolve_addr(id, r.ai_src_addr, r.ai_dst_addr, 2000);
            if x == 0 {
                resolve_route(id, 2000)
            } else {
                x
            }
        };
        if ok != 0 {
            let e = *libc::__errno_location();
            destroy_id(id);
            return fail(e);
        }
        if !pd.is_null() {
            (*id).pd = pd;
        }
        if !attr.is_null() {
            // rdma_create_ep(3): the QP is of the address info's type.
            (*attr).qp_type = r.ai_qp_type as u32;
        }
        if !attr.is_null() && r.ai_flags & 1 != 0 {
            guard(&(*id.cast::<Id>()).st).ep_qp = Some((*attr, pd as usize));
        }
        if !attr.is_null() && r.ai_flags & 1 == 0 && create_qp(id, pd, attr) != 0 {
            let e = *libc::__errno_location();
            destroy_id(id);
            return fail(e);
        }
        *out = id;
    }
    0
}
export!("rdma_create_ep", "RDMACM_1.0", create_ep);

unsafe extern "C" fn destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: an id of ours.
    unsafe {
        destroy_qp(id);
        // rdma_destroy_ep(3): the SRQ rdma_create_srq gave the id goes with it (after the
        // QP, which may use it; before the CQs, which it uses).
        if !id.is_null() && !(*id).srq.is_null() {
            destroy_srq(id);
        }
        destroy_id(id);
    }
}
export!("rdma_destroy_ep", "RDMACM_1.0", destroy_ep);

// ---- small queries -------------------------------------------------------------------

unsafe extern "C" fn get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: an id of ours.
    unsafe { id_ref(id) }
        .ok()
        .and_then(|i| addr::of(&i.id.route.addr.src))
        .map_or(0, |(_, p)| p.to_be())
}
export!("rdma_get_src_port", "RDMACM_1.0", get_src_port);

unsafe extern "C" fn get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: an id of ours.
    unsafe { id_ref(id) }
        .ok()
        .and_then(|i| addr::of(&i.id.route.addr.dst))
        .map_or(0, |(_, p)| p.to_be())
}
export!("rdma_get_dst_port", "RDMACM_1.0", get_dst_port);

unsafe extern "C" fn get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    let devs = verbs::devices();
    // SAFETY: an array of n + 1 pointers, freed by rdma_free_devices.
    let arr = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<*mut ibv_context>()) }
        .cast::<*mut ibv_context>();
    if arr.is_null() {
        set_errno(libc::ENOMEM);
        return arr;
    }
    for (k, d) in devs.iter().enumerate() {
        // SAFETY: within the array.
        unsafe { *arr.add(k) = d.verbs };
    }
    if !num.is_null() {
        // SAFETY: the program's counter.
        unsafe { *num = devs.len() as c_int };
    }
    arr
}
export!("rdma_get_devices", "RDMACM_1.0", get_devices);

unsafe extern "C" fn free_devices(list: *mut *mut ibv_context) {
    // SAFETY: an array from rdma_get_devices (the contexts stay open, as librdmacm's do).
    unsafe { libc::free(list.cast()) };
}
export!("rdma_free_devices", "RDMACM_1.0", free_devices);

unsafe extern "C" fn event_str(e: c_int) -> *const c_char {
    let s: &'static [u8] = match e {
        0 => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        1 => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        2 => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        3 => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        4 => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        5 => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        6 => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        7 => b"RDMA_CM_EVENT_UNREACHABLE\0",
        8 => b"RDMA_CM_EVENT_REJECTED\0",
        9 => b"RDMA_CM_EVENT_ESTABLISHED\0",
        10 => b"RDMA_CM_EVENT_DISCONNECTED\0",
        11 => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        12 => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        13 => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        14 => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        15 => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr().cast()
}
export!("rdma_event_str", "RDMACM_1.0", event_str);

/// `rdma_set_option(3)`: the id-level options TOS, REUSEADDR and AFONLY are accepted
/// (softverbs has one traffic class, no port reuse rules and no dual-stack binding to
/// restrict); ACK_TIMEOUT (a `u8`, IBA 9.7.6.1.3's exponent, at most 31) becomes the RC QP's
/// timeout at RTS, as rdma_init_qp_attr reports it; path records (`RDMA_OPTION_IB_PATH`)
/// are not.
unsafe extern "C" fn set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    // SAFETY: an id of ours.
    let Ok(i) = (unsafe { id_ref(id) }) else {
        return fail(libc::EINVAL);
    };
    if val.is_null() || len == 0 {
        return fail(libc::EINVAL);
    }
    match (level, name) {
        (0, 3) => {
            // SAFETY: the caller's buffer of `len` >= 1 bytes.
            let t = unsafe { *val.cast::<u8>() };
            if len != 1 || t > 31 {
                return fail(libc::EINVAL);
            }
            i.lock().path.ack_timeout = Some(t);
            0
        }
        (0, 0..=2) => 0,
        _ => fail(libc::ENOSYS),
    }
}
export!("rdma_set_option", "RDMACM_1.0", set_option);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starting_psns_are_random_not_a_function_of_the_pid() {
        // Before: `(pid * 0x9E37 ^ n * 7919) & 0xFFFFFF` with n this counter, which anyone
        // who saw the pid (`softverbs resources`) could compute.
        let predicted =
            |n: u32| (std::process::id().wrapping_mul(0x9E37) ^ n.wrapping_mul(7919)) & 0x00FF_FFFF;
        let mut hits = 0;
        let mut seen = Vec::new();
        for _ in 0..64 {
            let n = NEXT_PORT.load(Ordering::Relaxed);
            let p = psn();
            assert!(p <= 0x00FF_FFFF);
            hits += usize::from(p == predicted(n));
            seen.push(p);
        }
        assert!(hits < 2, "{hits} of 64 PSNs were the predicted ones");
        seen.sort_unstable();
        seen.dedup();
        assert!(seen.len() > 60, "{} distinct of 64", seen.len());
    }
}
