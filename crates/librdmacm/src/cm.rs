//! Event channels and CM ids: the C objects programs hold, each a Rust struct whose first
//! field is the public rdma_cma.h struct (so the pointer a program gets is both).
//!
//! A channel is a connection of its own to the daemon per device it uses (the daemon's CM
//! ids belong to that connection: the process's death ends them, docs/design/cm.md §4), plus a
//! queue of local events (address and route resolution). `channel->fd` is an epoll fd
//! watching the daemon's CM eventfds and the local queue's eventfd, so it is readable
//! exactly when `rdma_get_cm_event` has something.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};

use softverbs::{CmChannel, CmEvent, CmEventKind, CmId, Context};

use crate::ffi::*;
use crate::verbs::{self, Path};

/// `enum rdma_cm_event_type` values used here.
pub mod ev {
    pub const ADDR_RESOLVED: i32 = 0;
    pub const ROUTE_RESOLVED: i32 = 2;
    pub const CONNECT_REQUEST: i32 = 4;
    pub const CONNECT_RESPONSE: i32 = 5;
    pub const UNREACHABLE: i32 = 7;
    pub const REJECTED: i32 = 8;
    pub const ESTABLISHED: i32 = 9;
    pub const DISCONNECTED: i32 = 10;
    pub const MULTICAST_JOIN: i32 = 12;
}

/// An event a program holds until `rdma_ack_cm_event`, with the private data it points to.
#[repr(C)]
pub struct Ev {
    pub ev: rdma_cm_event,
    pd: Vec<u8>,
    /// The id this event was counted against when the program got it ([`Id::unacked`]),
    /// null for events the library consumed itself.
    counted: *const Id,
}

impl Ev {
    pub fn new(kind: i32, id: *mut Id, listen: *mut Id, status: i32) -> Box<Ev> {
        // SAFETY: every field of rdma_cm_event is an integer, a pointer or a union of them:
        // all-zero is valid.
        let mut ev: rdma_cm_event = unsafe { std::mem::zeroed() };
        ev.event = kind;
        ev.status = status;
        ev.id = id.cast();
        ev.listen_id = listen.cast();
        Box::new(Ev {
            ev,
            pd: Vec::new(),
            counted: std::ptr::null(),
        })
    }

    /// The id rdma_cm counts this event against until it is acked: a CONNECT_REQUEST's
    /// listener (the new id has reported nothing yet), otherwise the event's own id
    /// (rdma-core's librdmacm likewise, `rdma_ack_cm_event`).
    fn accounted_id(&self) -> *const Id {
        if self.ev.event == ev::CONNECT_REQUEST && !self.ev.listen_id.is_null() {
            self.ev.listen_id.cast()
        } else {
            self.ev.id.cast()
        }
    }

    /// The program acknowledged the event (`rdma_ack_cm_event`, which frees it next): its
    /// id's count of events not yet acked goes down, which may let a `rdma_destroy_id`
    /// waiting for it go on.
    pub fn acked(&self) {
        if !self.counted.is_null() {
            // SAFETY: an id this event was counted against is not freed before the count
            // is back to zero (`Id::wait_acked` in rdma_destroy_id).
            unsafe { &*self.counted }.unacked.release();
        }
    }

    fn set_conn(&mut self, pd: &[u8], e: &CmEvent) {
        self.pd = pd[..pd.len().min(255)].to_vec();
        let conn = rdma_conn_param {
            private_data: if self.pd.is_empty() {
                std::ptr::null()
            } else {
                self.pd.as_ptr().cast()
            },
            private_data_len: self.pd.len() as u8,
            responder_resources: e.responder_resources,
            initiator_depth: e.initiator_depth,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: e.remote_qpn,
        };
        self.ev.param.conn = conn;
    }
}

/// A channel's connection to the daemon for one device: the context (leaked to `'static`
/// so the CM channel can borrow it) and its CM channel.
struct DevCm {
    cm: std::mem::ManuallyDrop<CmChannel<'static>>,
    ctx: *const Context,
}

impl Drop for DevCm {
    fn drop(&mut self) {
        // SAFETY: the CM channel borrows the context, so it goes first, once; `ctx` came
        // from Box::leak in `Chan::with_cm` and nothing else refers to it.
        unsafe {
            std::mem::ManuallyDrop::drop(&mut self.cm);
            drop(Box::from_raw(self.ctx as *mut Context));
        }
    }
}

#[derive(Default)]
struct ChanState {
    local: VecDeque<Box<Ev>>,
    devs: HashMap<usize, DevCm>,
    ids: HashMap<(usize, u32), *mut Id>,
}

/// An event channel.
#[repr(C)]
pub struct Chan {
    pub ch: rdma_event_channel,
    epoll: OwnedFd,
    local_efd: OwnedFd,
    st: Mutex<ChanState>,
}

// SAFETY: the raw pointers inside are ids and contexts this library owns; every access
// goes through the mutex.
unsafe impl Send for Chan {}
// SAFETY: as above.
unsafe impl Sync for Chan {}

fn os_err() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

impl Chan {
    pub fn new() -> Result<Arc<Chan>, i32> {
        // SAFETY: plain system calls; the fds are owned right away.
        let (ep, efd) = unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if ep < 0 {
                return Err(os_err());
            }
            let ep = OwnedFd::from_raw_fd(ep);
            let efd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            if efd < 0 {
                return Err(os_err());
            }
            (ep, OwnedFd::from_raw_fd(efd))
        };
        watch(&ep, efd.as_raw_fd())?;
        Ok(Arc::new(Chan {
            ch: rdma_event_channel { fd: ep.as_raw_fd() },
            epoll: ep,
            local_efd: efd,
            st: Mutex::new(ChanState::default()),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ChanState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on this channel's daemon CM for device `dev`, opening it first if needed.
    pub fn with_cm<R>(
        &self,
        dev: usize,
        f: impl FnOnce(&CmChannel<'static>) -> Result<R, i32>,
    ) -> Result<R, i32> {
        let mut st = self.lock();
        #[allow(clippy::map_entry)] // the entry would borrow `st` across the epoll call
        if !st.devs.contains_key(&dev) {
            let ctx = Context::open(dev as u32).map_err(|e| e.errno())?;
            let ctx: &'static Context = Box::leak(Box::new(ctx));
            let cm = match ctx.cm_channel() {
                Ok(cm) => cm,
                Err(e) => {
                    // SAFETY: just leaked above, not shared.
                    drop(unsafe { Box::from_raw(ctx as *const Context as *mut Context) });
                    return Err(e.errno());
                }
            };
            watch(&self.epoll, cm.fd().as_raw_fd())?;
            st.devs.insert(
                dev,
                DevCm {
                    cm: std::mem::ManuallyDrop::new(cm),
                    ctx,
                },
            );
        }
        f(&st.devs[&dev].cm)
    }

    /// Runs `f` (which makes a daemon CM id) and registers its result for `id` under the
    /// same lock, so that an event for it fetched by another thread is never missed.
    pub fn make_id(
        &self,
        dev: usize,
        id: *mut Id,
        f: impl FnOnce(&CmChannel<'static>) -> Result<CmId, i32>,
    ) -> Result<CmId, i32> {
        self.with_cm(dev, |_| Ok(()))?;
        let mut st = self.lock();
        let cm = f(&st.devs[&dev].cm)?;
        st.ids.insert((dev, cm.0), id);
        Ok(cm)
    }

    /// `rdma_migrate_id(3)` of an id with daemon CM state: each of its CM ids (`cms`: device
    /// and id) moves to `to`'s daemon connection for that device (`CmAdopt`: the daemon
    /// moves the events it holds for them too), and so do the local events queued here for
    /// `id`. This channel's lock is held throughout, so no event for the id is fetched here
    /// meanwhile; `to`'s is taken inside it (never the other way round).
    pub fn migrate_to(&self, to: &Chan, id: *mut Id, cms: &[(usize, CmId)]) -> Result<(), i32> {
        for &(dev, _) in cms {
            to.with_cm(dev, |_| Ok(()))?;
        }
        let mut st = self.lock();
        for &(dev, cm) in cms {
            to.with_cm(dev, |c| c.adopt(cm).map_err(|e| e.errno()))?;
            st.ids.remove(&(dev, cm.0));
            to.lock().ids.insert((dev, cm.0), id);
        }
        let me = id.cast::<rdma_cm_id>();
        let (mine, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut st.local)
            .into_iter()
            .partition(|e| e.ev.id == me);
        st.local = rest;
        if st.local.is_empty() {
            let mut b = [0u8; 8];
            // SAFETY: reading our non-blocking eventfd (nothing is left to report).
            unsafe { libc::read(self.local_efd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        }
        drop(st);
        for e in mine {
            to.push_local(e);
        }
        Ok(())
    }

    pub fn unregister(&self, dev: usize, cm: CmId) {
        self.lock().ids.remove(&(dev, cm.0));
    }

    pub fn push_local(&self, e: Box<Ev>) {
        self.lock().local.push_back(e);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.local_efd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// The next event; `EAGAIN` without one if `block` is false (or the fd is non-blocking).
    /// `for_program`: the event goes to the program (`rdma_get_cm_event`), so its id counts
    /// it until `rdma_ack_cm_event` ([`Id::unacked`]); the library's own waits pass `false`.
    pub fn next(&self, block: bool, for_program: bool) -> Result<Box<Ev>, i32> {
        loop {
            if let Some(e) = self.try_next(for_program)? {
                return Ok(e);
            }
            if !block {
                return Err(libc::EAGAIN);
            }
            let mut pfd = libc::pollfd {
                fd: self.epoll.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, -1) };
            if r < 0 && os_err() != libc::EINTR {
                return Err(os_err());
            }
        }
    }

    fn try_next(&self, for_program: bool) -> Result<Option<Box<Ev>>, i32> {
        let mut st = self.lock();
        let mut found = st.local.pop_front();
        if found.is_some() {
            if st.local.is_empty() {
                let mut b = [0u8; 8];
                // SAFETY: reading our non-blocking eventfd.
                unsafe { libc::read(self.local_efd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
            }
        } else {
            let devs: Vec<usize> = st.devs.keys().copied().collect();
            'devs: for dev in devs {
                loop {
                    let got = st.devs[&dev].cm.try_event().map_err(|e| e.errno())?;
                    let Some(e) = got else {
                        break;
                    };
                    if let Some(out) = self.convert(&mut st, dev, e) {
                        found = Some(out);
                        break 'devs;
                    }
                }
            }
        }
        if let (Some(e), true) = (found.as_mut(), for_program) {
            // Counted under the channel's lock: the id is registered here (or its local
            // events are queued here), and rdma_destroy_id takes this lock to unregister it
            // before it waits for the count.
            let counted = e.accounted_id();
            if !counted.is_null() {
                // SAFETY: as just said, the id is alive while this lock is held.
                unsafe { &*counted }.unacked.hold();
                e.counted = counted;
            }
        }
        Ok(found)
    }

    /// Drops the local events queued for `id` (rdma_destroy_id: nobody may get them now).
    pub fn forget_local(&self, id: *mut Id) {
        let me = id.cast::<rdma_cm_id>();
        let mut st = self.lock();
        st.local.retain(|e| e.ev.id != me);
        if st.local.is_empty() {
            let mut b = [0u8; 8];
            // SAFETY: reading our non-blocking eventfd (nothing is left to report).
            unsafe { libc::read(self.local_efd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        }
    }

    /// A daemon CM event as rdma_cm shows it, doing on the way what librdmacm does for a
    /// program whose id owns a QP (RTR/RTS and the RTU on a connect response).
    fn convert(&self, st: &mut ChanState, dev: usize, e: CmEvent) -> Option<Box<Ev>> {
        if e.kind == CmEventKind::ConnectRequest {
            let &listener = st.ids.get(&(dev, e.listener.0))?;
            let child = Id::child(listener, dev, &e);
            st.ids.insert((dev, e.id.0), child);
            let mut out = Ev::new(ev::CONNECT_REQUEST, child, listener, 0);
            // The application's private data follows rdma_cm's 36-byte address header in
            // a SIDR_REQ as in a REQ (docs/design/cm.md §2.3): the kernel's rdma_cm hands the
            // listener only what follows it, for UD ids too (libfabric's XRC connection
            // data rides in SIDR_REQs on RDMA_PS_UDP).
            let user = e.private_data.get(36..).unwrap_or(&[]);
            out.set_conn(user, &e);
            return Some(out);
        }
        let &id = st.ids.get(&(dev, e.id.0))?;
        // SAFETY: registered ids stay alive until rdma_destroy_id unregisters them, which
        // takes this channel's lock first.
        let idr = unsafe { &*id };
        let mut s = idr.lock();
        let qp = idr.id.qp;
        match e.kind {
            CmEventKind::ConnectResponse => {
                s.path.remote_qpn = e.remote_qpn;
                s.path.remote_psn = e.starting_psn;
                s.rep = Some(e.clone());
                if qp.is_null() {
                    // The program establishes (rdma_establish): rdma_cm then reports no
                    // ESTABLISHED on this side, the CONNECT_RESPONSE was its event.
                    s.quiet_establish = true;
                    let mut out = Ev::new(ev::CONNECT_RESPONSE, id, std::ptr::null_mut(), 0);
                    out.set_conn(&e.private_data, &e);
                    return Some(out);
                }
                let path = s.path;
                drop(s);
                let up = verbs::modify(qp, verbs::QPS_RTR, &path)
                    .and_then(|_| verbs::modify(qp, verbs::QPS_RTS, &path));
                let cm = &st.devs[&dev].cm;
                if up.is_err() {
                    let _ = cm.reject(e.id, &[]);
                    return Some(Ev::new(
                        ev::CONNECT_RESPONSE + 1,
                        id,
                        std::ptr::null_mut(),
                        -libc::EINVAL,
                    ));
                }
                let _ = cm.establish(e.id);
                None
            }
            CmEventKind::Established if !e.sidr && std::mem::take(&mut s.quiet_establish) => None,
            CmEventKind::Established => {
                let mut out = Ev::new(ev::ESTABLISHED, id, std::ptr::null_mut(), 0);
                if e.sidr {
                    // The SIDR_REP's private data comes with the event, as rdma_cm hands it
                    // (`param.ud.private_data`): libfabric's XRC tells an initiator's
                    // ESTABLISHED (the peer's SRQ number in that data) from a target's (none).
                    out.pd = e.private_data[..e.private_data.len().min(255)].to_vec();
                    {
                        out.ev.param.ud = rdma_ud_param {
                            private_data: if out.pd.is_empty() {
                                std::ptr::null()
                            } else {
                                out.pd.as_ptr().cast()
                            },
                            private_data_len: out.pd.len() as u8,
                            ah_attr: ibv_ah_attr {
                                grh: ibv_global_route {
                                    dgid: s.path.dgid,
                                    sgid_index: s.path.sgid_index,
                                    hop_limit: 64,
                                    ..Default::default()
                                },
                                is_global: 1,
                                port_num: 1,
                                ..Default::default()
                            },
                            qp_num: e.remote_qpn,
                            qkey: e.qkey,
                        };
                    }
                } else {
                    // The active side's ESTABLISHED carries the REP's parameters, as rdma_cm's
                    // does (rdma_get_cm_event(3): `param.conn`): the peer's QPN among them,
                    // which libfabric's XRC keeps as the target QP later connections share.
                    match s.rep.take() {
                        Some(rep) => out.set_conn(&rep.private_data, &rep),
                        None => out.set_conn(&[], &e),
                    }
                }
                Some(out)
            }
            CmEventKind::Rejected => {
                let mut out = Ev::new(ev::REJECTED, id, std::ptr::null_mut(), e.status as i32);
                out.set_conn(&e.private_data, &e);
                Some(out)
            }
            CmEventKind::Unreachable => Some(Ev::new(
                ev::UNREACHABLE,
                id,
                std::ptr::null_mut(),
                -libc::ETIMEDOUT,
            )),
            // The QP is left alone, as rdma-core's librdmacm leaves it (rdma_get_cm_event(3):
            // the program moves it, usually by rdma_disconnect): touching it here would race
            // the program's rdma_destroy_qp on another thread (rping's cm thread gets this
            // event while its main thread frees the QP: a use after free that hung rping).
            CmEventKind::Disconnected => {
                drop(s);
                Some(Ev::new(ev::DISCONNECTED, id, std::ptr::null_mut(), 0))
            }
            CmEventKind::ConnectRequest => None,
        }
    }
}

fn watch(ep: &OwnedFd, fd: i32) -> Result<(), i32> {
    let mut e = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: adding a live fd to our epoll set.
    if unsafe { libc::epoll_ctl(ep.as_fd().as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut e) } < 0 {
        return Err(os_err());
    }
    Ok(())
}

/// What librdmacm keeps behind a `rdma_cm_id`.
#[derive(Default)]
pub struct IdState {
    pub dev: Option<usize>,
    pub port: u16,
    pub cm: Option<CmId>,
    pub listeners: Vec<(usize, CmId)>,
    pub path: Path,
    /// The REP this active id received, reported again with its ESTABLISHED.
    pub rep: Option<CmEvent>,
    pub sync: bool,
    /// A passive id made by a SIDR_REQ: accept and reject answer with a SIDR_REP, whatever
    /// QP the program gave the id (libfabric puts XRC receive QPs on such ids).
    pub sidr: bool,
    pub own_pd: bool,
    pub own_cqs: bool,
    /// `id.srq` is one rdma_create_srq(_ex) made, which rdma_destroy_srq and rdma_destroy_ep
    /// destroy; an SRQ the program handed rdma_create_qp stays the program's (libfabric's
    /// verbs provider destroys its own SRX SRQ after the endpoint).
    pub own_srq: bool,
    /// A passive endpoint's QP attributes (rdma_create_ep): each request rdma_get_request
    /// returns gets a QP made with them.
    pub ep_qp: Option<(ibv_qp_init_attr, usize)>,
    /// The CONNECT_RESPONSE went to the program (an id without a QP): the ESTABLISHED its
    /// rdma_establish causes is not reported.
    pub quiet_establish: bool,
    /// The multicast groups the id has joined (crate::mcast).
    pub mcast: Vec<crate::mcast::Join>,
}

// SAFETY: the raw pointers in `ep_qp` are the program's PD and CQs, used only under the
// id's lock from whichever thread the program calls on.
unsafe impl Send for IdState {}

/// A CM id.
#[repr(C)]
pub struct Id {
    pub id: rdma_cm_id,
    pub chan: Arc<Chan>,
    pub st: Mutex<IdState>,
    /// Events the program got for this id and has not acked yet.
    pub unacked: Unacked,
}

/// A count of events handed out and not yet acked, and a way to wait for it to reach zero.
/// rdma_destroy_id(3): the program acks every event of an id before destroying it, and the
/// call blocks until it has (rdma-core's librdmacm waits likewise), so an event a program
/// still holds never points to a freed id, and a thread handling it may still read
/// `event->id->context` while another thread destroys the id.
#[derive(Default)]
pub struct Unacked {
    n: Mutex<u32>,
    zero: Condvar,
}

impl Unacked {
    fn hold(&self) {
        *self.n.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }

    fn release(&self) {
        let mut n = self.n.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.zero.notify_all();
        }
    }

    /// Returns once every event counted so far has been acked.
    pub fn wait_zero(&self) {
        let mut n = self.n.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            n = self.zero.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// An id's state, locked through the field (so the public struct stays writable meanwhile).
pub fn guard(m: &Mutex<IdState>) -> std::sync::MutexGuard<'_, IdState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Id {
    pub fn new(chan: Arc<Chan>, context: *mut core::ffi::c_void, ps: i32, sync: bool) -> *mut Id {
        // SAFETY: rdma_cm_id is integers and pointers: all-zero is valid.
        let mut id: rdma_cm_id = unsafe { std::mem::zeroed() };
        id.channel = Arc::as_ptr(&chan) as *mut rdma_event_channel;
        id.context = context;
        id.ps = ps;
        id.port_num = 1;
        // RDMA_PS_UDP / RDMA_PS_IPOIB use UD QPs, the others RC.
        id.qp_type = if ps == 0x0111 || ps == 0x0002 { 4 } else { 2 };
        Box::into_raw(Box::new(Id {
            id,
            chan,
            st: Mutex::new(IdState {
                sync,
                ..IdState::default()
            }),
            unacked: Unacked::default(),
        }))
    }

    fn child(listener: *mut Id, dev: usize, e: &CmEvent) -> *mut Id {
        // SAFETY: a registered listener (see `convert`).
        let l = unsafe { &*listener };
        let child = Id::new(l.chan.clone(), l.id.context, l.id.ps, l.lock().sync);
        // SAFETY: just made.
        let c = unsafe { &mut *child };
        // rdma-core's ucma_process_conn_req: the new id is of the listener's QP type (an XRC
        // receive listener's requests are for XRC receive QPs).
        c.id.qp_type = l.id.qp_type;
        verbs::attach(&mut c.id, dev);
        let local = verbs::devices()[dev].ips.first().copied();
        let port = l.lock().port;
        let hdr = softverbs_wire::cm::CmaHdr::parse(&e.private_data).ok();
        let peer_ip = hdr.map(|h| h.src).or(e.peer);
        let local_ip = hdr.map(|h| h.dst).or(local);
        if let Some(ip) = local_ip {
            c.id.route.addr.src = crate::addr::storage(ip, port);
        }
        if let Some(ip) = peer_ip {
            c.id.route.addr.dst = crate::addr::storage(ip, hdr.map_or(0, |h| h.src_port));
        }
        let mut s = guard(&c.st);
        s.dev = Some(dev);
        s.port = port;
        s.cm = Some(e.id);
        s.sidr = e.sidr;
        s.path = Path {
            dgid: e.peer.map(crate::addr::gid).unwrap_or_default(),
            sgid_index: local_ip.map_or(0, |ip| verbs::sgid_index(dev, ip)),
            remote_qpn: e.remote_qpn,
            remote_psn: e.starting_psn,
            local_psn: 0,
            responder_resources: e.responder_resources,
            initiator_depth: e.initiator_depth,
            ack_timeout: None,
            psn_chosen: false,
            path_mtu: e.path_mtu,
        };
        if let (Some(a), Some(b)) = (local_ip, peer_ip) {
            c.id.route.addr.ibaddr.sgid = crate::addr::gid(a);
            c.id.route.addr.ibaddr.dgid = crate::addr::gid(b);
        }
        c.id.route.num_paths = 1;
        drop(s);
        child
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}
