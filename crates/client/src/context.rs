//! Contexts: one connection with one device opened on it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;

use softverbs_abi::msg::cmd;
use softverbs_abi::msg::{
    name_str, InjectEventReq, InjectEventResp, QueryDeviceListReq, QueryDeviceListResp,
    QueryDeviceResp, QueryGidReq, QueryGidResp, QueryPortReq, QueryPortResp, NO_DEVICE,
};
use softverbs_core::device::{DeviceAttr, Gid, PortState};
use softverbs_core::types::{EventType, Mtu};
use softverbs_ipc as ipc;
use zerocopy::little_endian::U32;

use crate::conn::{connect_socket, default_socket_path, hello, Conn};
use crate::convert;
use crate::error::{errno, Error, Result};
use crate::event::{AsyncEvent, Element};
use crate::fatal::Fatal;
use crate::xrc::RegTable;

/// One device the daemon offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Index to pass to [`Context::open`].
    pub index: u32,
    /// Name (`ibv_get_device_name`).
    pub name: String,
    /// Node GUID.
    pub node_guid: u64,
}

/// What `ibv_query_port` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Logical port state.
    pub state: PortState,
    /// Largest path MTU the port supports.
    pub max_mtu: Mtu,
    /// Path MTU of the link.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// `IBV_LINK_LAYER_*` (2 = Ethernet).
    pub link_layer: u8,
}

/// The devices of the daemon at the default socket (starting it if needed).
pub fn devices() -> Result<Vec<DeviceInfo>> {
    crate::Introspect::connect()?.devices()
}

/// Lists devices over a connection that opened none.
pub(crate) fn list_devices(conn: &Conn) -> Result<Vec<DeviceInfo>> {
    (0..conn.num_devices)
        .map(|index| {
            let req = QueryDeviceListReq {
                index: U32::new(index),
            };
            let r: QueryDeviceListResp =
                conn.call::<cmd::QueryDeviceList>("query_device_list", 0, &req)?;
            Ok(DeviceInfo {
                index,
                name: name_str(&r.name),
                node_guid: r.node_guid.get(),
            })
        })
        .collect()
}

/// An open device context (`struct ibv_context`): one connection to the daemon. Every
/// object made through it borrows it; dropping the context closes the connection, and the
/// daemon tears down whatever the context still held.
///
/// `Context` is `Send + Sync`; requests from several threads are serialized on the socket.
pub struct Context {
    pub(crate) conn: std::sync::Arc<Conn>,
    async_fd: std::sync::Arc<OwnedFd>,
    /// Whether the device is gone (the daemon died: `crate::fatal`).
    pub(crate) fatal: std::sync::Arc<Fatal>,
    /// QPs whose work queues are rings, by handle: what a flush after the daemon's death
    /// completes (`crate::flush`).
    pub(crate) ring_qps: Mutex<std::collections::BTreeMap<u32, crate::flush::RingQp>>,
    /// CQs armed (`ibv_req_notify_cq`) and not yet reported, with their channel: what a
    /// channel reports when the device goes.
    pub(crate) armed: Mutex<std::collections::BTreeMap<u32, u32>>,
    device: u32,
    /// Legacy/minimal XRC registrations held through [`XrcRegistration`](crate::XrcRegistration)s.
    pub(crate) regs: Mutex<RegTable>,
    /// The daemon's doorbell when work queues live in shared memory (ABI 3).
    pub(crate) doorbell: Option<softverbs_shm::Doorbell>,
    /// The context's ready ring (ABI 6): a QP whose work flag was clear is announced here
    /// after a post, so the daemon visits only QPs with work (crates/shm/src/ready.rs).
    pub(crate) ready: Option<Mutex<softverbs_shm::Producer>>,
    /// Receive requests outstanding per QP number, for QPs whose receive queue is a ring:
    /// posts add, polled receive completions subtract, so a post beyond `max_recv_wr` is
    /// refused with `ENOMEM` (ibv_post_recv(3)) although the ring itself has room.
    pub(crate) rq_outstanding: Mutex<foldhash::HashMap<u32, RqCount>>,
    /// Buffers of work requests posted through the owning API, handed back with their
    /// completions (`crate::wr`).
    pub(crate) in_flight: crate::wr::InFlight,
    /// The same-host direct path, when asked for and offered (`crate::direct`).
    pub(crate) direct: Option<crate::direct::DirectCtx>,
}

/// One QP's count of outstanding receive requests.
pub(crate) type RqCount = std::sync::Arc<std::sync::atomic::AtomicU32>;

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device)
            .field("ctx_id", &self.conn.ctx_id)
            .field("abi_version", &self.conn.abi)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Opens device `index` on the daemon at the default socket (starting it if needed).
    pub fn open(index: u32) -> Result<Context> {
        Context::open_at(&default_socket_path(), index)
    }

    /// Opens the device named `name` on the daemon at the default socket (`ENODEV` if no
    /// device has that name).
    pub fn open_by_name(name: &str) -> Result<Context> {
        Context::open_by_name_at(&default_socket_path(), name)
    }

    /// Opens the device named `name` on the daemon at `path`.
    pub fn open_by_name_at(path: &Path, name: &str) -> Result<Context> {
        let index = {
            let list = crate::Introspect::connect_at(path)?.devices()?;
            list.into_iter()
                .find(|d| d.name == name)
                .ok_or(Error::new("open_device", errno::ENODEV))?
                .index
        };
        Context::open_at(path, index)
    }

    /// Opens device `index` on the daemon at `path`.
    pub fn open_at(path: &Path, index: u32) -> Result<Context> {
        Context::open_at_direct(path, index, crate::direct::wanted())
    }

    /// [`Context::open_at`], asking for the same-host direct path (docs/design/direct-path.md) or
    /// not, whatever `SOFTVERBS_DIRECT` says (for tests comparing the two paths).
    #[doc(hidden)]
    pub fn open_at_direct(path: &Path, index: u32, direct: bool) -> Result<Context> {
        if index == NO_DEVICE {
            return Err(Error::new("open_device", errno::EINVAL));
        }
        let sock = connect_socket(path)?;
        let (conn, mut fds) = hello(sock, index)?;
        if fds.len() != 1 {
            return Err(Error::proto("hello"));
        }
        let async_fd = std::sync::Arc::new(fds.pop().expect("one fd"));
        let fatal = Fatal::new(async_fd.clone());
        let mut conn = conn;
        conn.watch(fatal.clone());
        let mut ctx = Context {
            conn: std::sync::Arc::new(conn),
            async_fd,
            fatal,
            ring_qps: Mutex::new(std::collections::BTreeMap::new()),
            armed: Mutex::new(std::collections::BTreeMap::new()),
            device: index,
            regs: Mutex::new(RegTable::default()),
            doorbell: None,
            ready: None,
            rq_outstanding: Mutex::new(foldhash::HashMap::default()),
            in_flight: crate::wr::InFlight::default(),
            direct: None,
        };
        ctx.doorbell = crate::rings::map_doorbell(&ctx);
        ctx.ready = crate::rings::map_ready(&ctx);
        if direct {
            ctx.direct = crate::direct::DirectCtx::open(&ctx);
        }
        Ok(ctx)
    }

    /// The device index this context opened.
    pub fn device_index(&self) -> u32 {
        self.device
    }

    /// The daemon's id of this context (as its introspection shows it).
    pub fn ctx_id(&self) -> u64 {
        self.conn.ctx_id
    }

    /// The ABI version the daemon speaks. The client uses no feature newer than it.
    pub fn abi_version(&self) -> u32 {
        self.conn.abi
    }

    /// Number of devices the daemon has.
    pub fn num_devices(&self) -> u32 {
        self.conn.num_devices
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let r: QueryDeviceResp = self.conn.call::<cmd::QueryDevice>("query_device", 0, &())?;
        Ok(convert::device_attr(&r))
    }

    /// `ibv_query_port` (ports are numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<PortInfo> {
        let req = QueryPortReq {
            port: U32::new(u32::from(port)),
        };
        let r: QueryPortResp = self.conn.call::<cmd::QueryPort>("query_port", 0, &req)?;
        convert::port_info("query_port", &r)
    }

    /// `ibv_query_gid`.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let req = QueryGidReq {
            port: U32::new(u32::from(port)),
            index: U32::new(index),
        };
        let r: QueryGidResp = self.conn.call::<cmd::QueryGid>("query_gid", 0, &req)?;
        Ok(Gid(r.gid))
    }

    /// The async-event eventfd: readable when events may be pending. Poll it, then call
    /// [`try_get_async_event`](Self::try_get_async_event) until it returns `None`.
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        self.async_fd.as_fd()
    }

    /// Whether the device is gone: the daemon died or closed the connection. The async fd
    /// then yields one [`EventType::DeviceFatal`] event (element [`Element::Device`]), calls
    /// fail with [`ErrorKind::DeviceFatal`](crate::ErrorKind::DeviceFatal) (`EIO`), destroying
    /// objects still works, and outstanding work completes with `WR_FLUSH_ERR`.
    pub fn device_fatal(&self) -> bool {
        self.fatal.is_dead()
    }

    /// The next pending async event, or `None` (`ibv_get_async_event` on a non-blocking fd).
    pub fn try_get_async_event(&self) -> Result<Option<AsyncEvent>> {
        if self.fatal.is_dead() {
            return self.fatal_event();
        }
        match self
            .conn
            .call::<cmd::GetAsyncEvent>("get_async_event", 0, &())
        {
            Ok(r) => Ok(Some(convert::async_event(&r))),
            Err(e) if e.errno == errno::EAGAIN => Ok(None),
            Err(e) if e.is_device_fatal() => self.fatal_event(),
            Err(e) => Err(e),
        }
    }

    /// After the device went: `IBV_EVENT_DEVICE_FATAL` once, then `EIO`, as the kernel's
    /// async event file does after a device is disassociated. The fd stays readable (the
    /// kernel's stays ready too), so a program that polls it again does not sleep forever.
    fn fatal_event(&self) -> Result<Option<AsyncEvent>> {
        ipc::signal_eventfd(self.async_fd.as_fd());
        if !self.fatal.take_event() {
            return Err(Error::device_fatal("get_async_event"));
        }
        Ok(Some(AsyncEvent {
            event_type: Some(EventType::DeviceFatal),
            raw_event_type: EventType::DeviceFatal as u32,
            element: Element::Device,
            legacy_event_type: EventType::DeviceFatal as u32,
        }))
    }

    /// The next async event, waiting for one (`ibv_get_async_event`).
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        loop {
            if let Some(e) = self.get_async_event_within(None)? {
                return Ok(e);
            }
        }
    }

    /// The next async event, waiting up to `timeout` (`None`: forever; zero: only a look, as
    /// `ibv_get_async_event` on a non-blocking fd). The eventfd is reset before the second
    /// look, so an event queued after this call signals it again.
    pub fn get_async_event_within(
        &self,
        timeout: Option<std::time::Duration>,
    ) -> Result<Option<AsyncEvent>> {
        let end = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(e) = self.try_get_async_event()? {
                return Ok(Some(e));
            }
            // Reset the eventfd, then look once more: an event queued before the reset is
            // found now, one queued after it signals the fd again.
            ipc::drain_eventfd(self.async_fd.as_fd());
            if let Some(e) = self.try_get_async_event()? {
                return Ok(Some(e));
            }
            let left = end.map(|e| e.saturating_duration_since(std::time::Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Ok(None);
            }
            let ms = left.map(|l| l.as_millis().min(i32::MAX as u128) as i32);
            ipc::wait_readable(self.async_fd.as_fd(), ms)
                .map_err(|e| Error::from_io("get_async_event", &e))?;
        }
    }

    /// Administrative: raises `event_type` on QP `qpn` as the NIC would (only the daemon's
    /// own uid or root may). Returns how many contexts received it.
    pub fn inject_event(&self, qpn: u32, event_type: EventType) -> Result<u32> {
        let req = InjectEventReq {
            qpn: U32::new(qpn),
            event_type: U32::new(event_type as u32),
            port: U32::new(0),
            device: U32::new(0),
        };
        let r: InjectEventResp = self
            .conn
            .call::<cmd::InjectEvent>("inject_event", 0, &req)?;
        Ok(r.contexts.get())
    }

    /// Administrative: raises port event `event_type` (`PortActive`, `PortErr`, ...) on port
    /// `port` of device `device`, as a link change would: every context of the device hears
    /// it. Returns how many contexts received it.
    pub fn inject_port_event(&self, device: u32, port: u8, event_type: EventType) -> Result<u32> {
        let req = InjectEventReq {
            qpn: U32::new(0),
            event_type: U32::new(event_type as u32),
            port: U32::new(u32::from(port)),
            device: U32::new(device),
        };
        let r: InjectEventResp = self
            .conn
            .call::<cmd::InjectEvent>("inject_event", 0, &req)?;
        Ok(r.contexts.get())
    }
}
