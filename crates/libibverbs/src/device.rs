//! Devices and contexts: `ibv_get_device_list(3)`, `ibv_open_device(3)`,
//! `ibv_query_device(3)`, `ibv_query_port(3)`, `ibv_query_gid(3)`, `ibv_query_pkey(3)`,
//! `ibv_fork_init(3)` and the sysfs helpers.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU32;
use std::sync::Mutex;

use softverbs::{Context, Introspect, PortState};

use crate::ffi::*;
use crate::objects::{ctx_obj, CtxObj, DevObj, Elements, DEAD, LIVE};
use crate::util::*;

/// `IBV_NODE_CA` and `IBV_TRANSPORT_IB`: a soft RoCE device reports itself as rxe does.
const NODE_CA: c_int = 1;
const TRANSPORT_IB: c_int = 0;
/// `IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS`.
const PORT_CAP_FLAGS: u32 = (1 << 16) | (1 << 26);
/// Timestamps of `ibv_cq_ex` count nanoseconds: a 1 GHz "HCA clock", in kHz.
pub const HCA_CORE_CLOCK_KHZ: u64 = 1_000_000;

/// Every device handed out, for the life of the process (programs keep and compare them).
static DEVICES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn device_for(socket: &std::path::Path, info: &softverbs::DeviceInfo) -> *mut DevObj {
    let mut all = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    for &p in all.iter() {
        // SAFETY: DEVICES holds only DevObjs we leaked; they are never freed.
        let d = unsafe { &*(p as *const DevObj) };
        if d.socket == socket && d.index == info.index && d.guid == info.node_guid {
            return p as *mut DevObj;
        }
    }
    let mut base = ibv_device {
        _ops: [std::ptr::null(); 2],
        node_type: NODE_CA,
        transport_type: TRANSPORT_IB,
        name: [0; 64],
        dev_name: [0; 64],
        dev_path: [0; 256],
        ibdev_path: [0; 256],
    };
    copy_name(&mut base.name, &info.name);
    copy_name(&mut base.dev_name, &format!("uverbs{}", info.index));
    copy_name(
        &mut base.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs{}", info.index),
    );
    copy_name(
        &mut base.ibdev_path,
        &format!("/sys/class/infiniband/{}", info.name),
    );
    let p = into_c(DevObj {
        base,
        index: info.index,
        guid: info.node_guid,
        socket: socket.to_path_buf(),
    });
    all.push(p as usize);
    p
}

unsafe extern "C" fn get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let socket = softverbs::default_socket_path();
    let list = match Introspect::connect_at(&socket).and_then(|i| i.devices()) {
        Ok(l) => l,
        // No daemon and none could be started: what rdma-core says without a kernel driver.
        Err(_) => return null_with(ENOSYS),
    };
    let mut v: Vec<*mut ibv_device> = list
        .iter()
        .map(|d| device_for(&socket, d) as *mut ibv_device)
        .collect();
    if !num.is_null() {
        // SAFETY: the caller passed a writable int (ibv_get_device_list(3)).
        unsafe { *num = v.len() as c_int };
    }
    v.push(std::ptr::null_mut());
    let b = v.into_boxed_slice();
    Box::into_raw(b) as *mut *mut ibv_device
}
export!(default "ibv_get_device_list", "IBVERBS_1.1", get_device_list);

unsafe extern "C" fn free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: the list came from get_device_list: NULL-terminated, boxed with n + 1 slots.
    unsafe {
        while !(*list.add(n)).is_null() {
            n += 1;
        }
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            list,
            n + 1,
        )));
    }
}
export!(default "ibv_free_device_list", "IBVERBS_1.1", free_device_list);

unsafe fn dev<'a>(d: *mut ibv_device) -> Option<&'a DevObj> {
    // SAFETY: devices passed in by C are ours (from ibv_get_device_list) and never freed.
    (!d.is_null()).then(|| unsafe { &*(d as *const DevObj) })
}

unsafe extern "C" fn get_device_name(d: *mut ibv_device) -> *const c_char {
    // SAFETY: see `dev`.
    match unsafe { dev(d) } {
        Some(d) => d.base.name.as_ptr(),
        None => null_with(EINVAL),
    }
}
export!(default "ibv_get_device_name", "IBVERBS_1.1", get_device_name);

unsafe extern "C" fn get_device_guid(d: *mut ibv_device) -> u64 {
    // SAFETY: see `dev`. The GUID is returned in network byte order (__be64).
    unsafe { dev(d) }.map_or(0, |d| d.guid.to_be())
}
export!(default "ibv_get_device_guid", "IBVERBS_1.1", get_device_guid);

unsafe extern "C" fn get_device_index(d: *mut ibv_device) -> c_int {
    // SAFETY: see `dev`.
    unsafe { dev(d) }.map_or(-1, |d| d.index as c_int)
}
export!(default "ibv_get_device_index", "IBVERBS_1.9", get_device_index);

fn fill_slots(v: &mut verbs_context) {
    let i = int_slot();
    let p = ptr_slot();
    v.query_port = crate::device::slot_query_port as *const c_void;
    v.advise_mr = crate::odp::slot_advise_mr as *const c_void;
    v.alloc_null_mr = p;
    v.read_counters = i;
    v.attach_counters_point_flow = i;
    v.create_counters = p;
    v.destroy_counters = i;
    v.reg_dm_mr = p;
    v.alloc_dm = p;
    v.free_dm = i;
    v.modify_flow_action_esp = i;
    v.destroy_flow_action = i;
    v.create_flow_action_esp = p;
    v.modify_qp_rate_limit = i;
    v.alloc_parent_domain = p;
    v.dealloc_td = i;
    v.alloc_td = p;
    v.modify_cq = i;
    v.post_srq_ops = i;
    v.destroy_rwq_ind_table = i;
    v.create_rwq_ind_table = p;
    v.destroy_wq = i;
    v.modify_wq = i;
    v.create_wq = p;
    v.query_rt_values = crate::cq::slot_query_rt_values as *const c_void;
    v.create_cq_ex = crate::cq::slot_create_cq_ex as *const c_void;
    v.priv_ = std::ptr::null_mut();
    v.query_device_ex = slot_query_device_ex as *const c_void;
    v.ibv_destroy_flow = i;
    v.abi_placeholder2 = i;
    v.ibv_create_flow = p;
    v.abi_placeholder1 = p;
    v.open_qp = crate::xrcd::slot_open_qp as *const c_void;
    v.create_qp_ex = crate::qp::slot_create_qp_ex as *const c_void;
    v.get_srq_num = crate::srq::slot_get_srq_num as *const c_void;
    v.create_srq_ex = crate::srq::slot_create_srq_ex as *const c_void;
    v.open_xrcd = crate::xrcd::slot_open_xrcd as *const c_void;
    v.close_xrcd = crate::xrcd::slot_close_xrcd as *const c_void;
    v.abi_placeholder3 = 0;
    v.sz = std::mem::size_of::<verbs_context>();
    let o = &mut v.context.ops;
    o.compat_query_device = query_device as *const c_void;
    o.compat_query_port = query_port as *const c_void;
    o.compat_5 = [i; 5];
    o.alloc_mw = crate::mw::op_alloc_mw as *const c_void;
    o.bind_mw = crate::mw::op_bind_mw as *const c_void;
    o.dealloc_mw = crate::mw::op_dealloc_mw as *const c_void;
    o.compat_create_cq = i;
    o.poll_cq = crate::cq::op_poll_cq as *const c_void;
    o.req_notify_cq = crate::cq::op_req_notify_cq as *const c_void;
    o.compat_7 = [i; 7];
    o.post_srq_recv = crate::srq::op_post_srq_recv as *const c_void;
    o.compat_4 = [i; 4];
    o.post_send = crate::qp::op_post_send as *const c_void;
    o.post_recv = crate::qp::op_post_recv as *const c_void;
    o.compat_tail = [i; 5];
}

/// `atexit(3)`: the ACKs the library holds for a program's next round leave before a
/// program that never destroys its QPs is gone (`softverbs::send_held_acks`).
extern "C" fn send_held_acks_at_exit() {
    // Nothing may unwind into libc's exit.
    let _ = std::panic::catch_unwind(softverbs::send_held_acks);
}

unsafe extern "C" fn open_device(d: *mut ibv_device) -> *mut ibv_context {
    // SAFETY: see `dev`.
    let Some(d) = (unsafe { dev(d) }) else {
        return null_with(EINVAL);
    };
    let ctx = match Context::open_at(&d.socket, d.index) {
        Ok(c) => c,
        Err(e) => return null_with(errno_of(&e)),
    };
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a handler that takes no arguments and never unwinds. glibc's
        // `atexit` is linked in from libc_nonshared as `__cxa_atexit` with this object's
        // `__dso_handle` (`nm -D` shows `__cxa_atexit`), so a `dlclose` that unloads the
        // library runs and removes the handler first: it is never called after unload.
        let _ = unsafe { libc::atexit(send_held_acks_at_exit) };
    });
    let inner: &'static Context = Box::leak(Box::new(ctx));
    // SAFETY: verbs_context is plain C data (pointers, ints, a pthread mutex) for which all
    // zero bytes is a valid value; every slot is filled right below.
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    fill_slots(&mut vctx);
    vctx.context.device = d as *const DevObj as *mut ibv_device;
    // Programs treat cmd_fd as "the device file" (pyverbs dups it for ibv_import_device); a
    // private duplicate of the async eventfd is a real descriptor that nothing reads.
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor the context owns.
    vctx.context.cmd_fd =
        unsafe { libc::fcntl(inner.async_fd().as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    vctx.context.async_fd = inner.async_fd().as_raw_fd();
    make_blocking(vctx.context.async_fd);
    vctx.context.num_comp_vectors = 1;
    vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED;
    let o = into_c(CtxObj {
        vctx,
        magic: LIVE,
        inner,
        dev: d as *const DevObj as *mut DevObj,
        elements: Mutex::new(Elements::default()),
        users: AtomicU32::new(0),
    });
    // SAFETY: `o` is a fresh allocation; the mutex lives in it from now on.
    unsafe { libc::pthread_mutex_init(&mut (*o).vctx.context.mutex, std::ptr::null()) };
    // SAFETY: as above.
    unsafe { (*o).ibv() }
}
export!(default "ibv_open_device", "IBVERBS_1.1", open_device);

unsafe extern "C" fn close_device(c: *mut ibv_context) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return EINVAL;
    };
    let o = o as *const CtxObj as *mut CtxObj;
    // SAFETY: a live CtxObj of ours. Closing drops the connection, and the daemon tears down
    // whatever the context still holds (as closing the uverbs fd does). The shell stays so a
    // late call on this context sees DEAD instead of freed memory.
    unsafe {
        (*o).magic = DEAD;
        if (*o).vctx.context.cmd_fd >= 0 {
            libc::close((*o).vctx.context.cmd_fd);
        }
        drop(Box::from_raw((*o).inner as *const Context as *mut Context));
    }
    0
}
export!(default "ibv_close_device", "IBVERBS_1.1", close_device);

// ---- queries ---------------------------------------------------------------------------------

fn device_attr(o: &CtxObj) -> Result<ibv_device_attr, c_int> {
    let a = o.inner.query_device().map_err(|e| errno_of(&e))?;
    // SAFETY: ibv_device_attr is plain C data; all zero is valid.
    let mut r: ibv_device_attr = unsafe { std::mem::zeroed() };
    copy_name(&mut r.fw_ver, &a.fw_ver);
    r.node_guid = a.node_guid.to_be();
    r.sys_image_guid = a.sys_image_guid.to_be();
    r.max_mr_size = a.max_mr_size;
    r.page_size_cap = a.page_size_cap;
    r.vendor_id = a.vendor_id;
    r.vendor_part_id = a.vendor_part_id;
    r.hw_ver = a.hw_ver;
    r.max_qp = a.max_qp as c_int;
    r.max_qp_wr = a.max_qp_wr as c_int;
    r.device_cap_flags = a.device_cap_flags as u32;
    r.max_sge = a.max_sge as c_int;
    r.max_sge_rd = a.max_sge_rd as c_int;
    r.max_cq = a.max_cq as c_int;
    r.max_cqe = a.max_cqe as c_int;
    r.max_mr = a.max_mr as c_int;
    r.max_mw = a.max_mw as c_int;
    r.max_pd = a.max_pd as c_int;
    r.max_qp_rd_atom = a.max_qp_rd_atom as c_int;
    r.max_ee_rd_atom = a.max_ee_rd_atom as c_int;
    r.max_res_rd_atom = a.max_res_rd_atom as c_int;
    r.max_qp_init_rd_atom = a.max_qp_init_rd_atom as c_int;
    r.max_ee_init_rd_atom = a.max_ee_init_rd_atom as c_int;
    r.atomic_cap = a.atomic_cap as c_int;
    r.max_ah = a.max_ah as c_int;
    r.max_srq = a.max_srq as c_int;
    r.max_srq_wr = a.max_srq_wr as c_int;
    r.max_srq_sge = a.max_srq_sge as c_int;
    r.max_pkeys = a.max_pkeys;
    r.local_ca_ack_delay = a.local_ca_ack_delay;
    r.phys_port_cnt = a.phys_port_cnt;
    r.max_mcast_grp = a.max_mcast_grp as c_int;
    r.max_mcast_qp_attach = a.max_mcast_qp_attach as c_int;
    r.max_total_mcast_qp_attach = a.max_total_mcast_qp_attach as c_int;
    Ok(r)
}

unsafe extern "C" fn query_device(c: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return EINVAL;
    };
    if attr.is_null() {
        return EINVAL;
    }
    match device_attr(o) {
        // SAFETY: the caller passed a writable ibv_device_attr.
        Ok(a) => unsafe {
            attr.write(a);
            0
        },
        Err(e) => e,
    }
}
export!(default "ibv_query_device", "IBVERBS_1.1", query_device);

/// `verbs_context.query_device_ex`: fills `attr_size` bytes (older programs pass a shorter
/// struct, whose missing tail is never written; newer ones a longer one, whose tail we do not
/// know is zeroed).
unsafe extern "C" fn slot_query_device_ex(
    c: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return EINVAL;
    };
    // SAFETY: `input` is NULL or a readable struct (ibv_query_device_ex(3)).
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return EINVAL;
    }
    if attr.is_null() || attr_size < std::mem::size_of::<ibv_device_attr>() {
        return EINVAL;
    }
    let orig = match device_attr(o) {
        Ok(a) => a,
        Err(e) => return e,
    };
    // SAFETY: plain C data; all zero is valid.
    let mut x: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    x.phys_port_cnt_ex = u32::from(orig.phys_port_cnt);
    x.orig_attr = orig;
    x.completion_timestamp_mask = u64::MAX;
    x.hca_core_clock = HCA_CORE_CLOCK_KHZ;
    x.device_cap_flags_ex = u64::from(x.orig_attr.device_cap_flags);
    if let Err(e) = crate::odp::fill_odp_caps(o, &mut x) {
        return e;
    }
    let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
    // SAFETY: the caller's buffer holds attr_size >= n bytes. A newer program's longer struct
    // gets zeros in the fields this library does not know, as rdma-core clears all
    // attr_size bytes first (libibverbs/cmd_device.c ibv_cmd_query_device_any).
    unsafe {
        std::ptr::copy_nonoverlapping(
            &x as *const ibv_device_attr_ex as *const u8,
            attr as *mut u8,
            n,
        );
        std::ptr::write_bytes((attr as *mut u8).add(n), 0, attr_size - n);
    };
    0
}

fn port_attr(o: &CtxObj, port: u8) -> Result<ibv_port_attr, c_int> {
    let p = o.inner.query_port(port).map_err(|e| errno_of(&e))?;
    Ok(ibv_port_attr {
        state: match p.state {
            PortState::Down => 1,
            PortState::Init => 2,
            PortState::Armed => 3,
            PortState::Active => 4,
        },
        max_mtu: p.max_mtu as c_int,
        active_mtu: p.active_mtu as c_int,
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: PORT_CAP_FLAGS,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        // 4X at 25 Gb/s (EDR encoding), as a 100 Gb/s RoCE port would say.
        active_width: 2,
        active_speed: 32,
        // LinkUp.
        phys_state: 5,
        link_layer: p.link_layer,
        flags: 0,
        port_cap_flags2: 0,
    })
}

/// The exported `ibv_query_port`: programs reach it only when the inline wrapper does not
/// find the slot, with the 48-byte `_compat_ibv_port_attr` (docs/design/abi-compat.md §5).
unsafe extern "C" fn query_port(c: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return EINVAL;
    };
    if attr.is_null() {
        return EINVAL;
    }
    match port_attr(o, port) {
        Ok(a) => {
            // SAFETY: the caller's struct holds at least the 48 compat bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    &a as *const ibv_port_attr as *const u8,
                    attr as *mut u8,
                    COMPAT_PORT_ATTR_LEN,
                )
            };
            0
        }
        Err(e) => e,
    }
}
export!(default "ibv_query_port", "IBVERBS_1.1", query_port);

/// `verbs_context.query_port`, called by verbs.h's inline `ibv_query_port` with the size of
/// the caller's struct.
pub unsafe extern "C" fn slot_query_port(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return EINVAL;
    };
    if attr.is_null() {
        return EINVAL;
    }
    match port_attr(o, port) {
        Ok(a) => {
            let n = len.min(std::mem::size_of::<ibv_port_attr>());
            // SAFETY: the caller's struct holds `len` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    &a as *const ibv_port_attr as *const u8,
                    attr as *mut u8,
                    n,
                )
            };
            0
        }
        Err(e) => e,
    }
}

unsafe extern "C" fn query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return minus_one(EINVAL);
    };
    if gid.is_null() || index < 0 {
        return minus_one(EINVAL);
    }
    match o.inner.query_gid(port, index as u32) {
        Ok(g) => {
            // SAFETY: the caller passed a writable union ibv_gid.
            unsafe { (*gid).raw = g.0 };
            0
        }
        Err(e) => minus_one(errno_of(&e)),
    }
}
export!(default "ibv_query_gid", "IBVERBS_1.1", query_gid);

/// `enum ibv_gid_type` (verbs.h): what `ibv_gid_entry.gid_type` holds.
const GID_TYPE_ROCE_V2: u32 = 2;

fn gid_entry(o: &CtxObj, port: u8, index: u32) -> Result<ibv_gid_entry, c_int> {
    let g = o.inner.query_gid(port, index).map_err(|e| errno_of(&e))?;
    if g.0 == [0; 16] {
        return Err(ENODATA);
    }
    Ok(ibv_gid_entry {
        gid: ibv_gid { raw: g.0 },
        gid_index: index,
        port_num: u32::from(port),
        gid_type: GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    })
}

/// `ibv_query_gid_ex(3)`: a positive errno, `ENODATA` for an empty entry.
unsafe extern "C" fn query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return EINVAL;
    };
    if flags != 0 || entry.is_null() || entry_size < std::mem::size_of::<ibv_gid_entry>() {
        return EINVAL;
    }
    let Ok(port) = u8::try_from(port) else {
        return EINVAL;
    };
    match gid_entry(o, port, index) {
        Ok(e) => {
            // SAFETY: the caller's entry holds entry_size >= 32 bytes.
            unsafe { entry.write(e) };
            0
        }
        Err(e) => e,
    }
}
export!(default "_ibv_query_gid_ex", "IBVERBS_1.11", query_gid_ex);

/// `ibv_query_gid_table(3)`: the valid entries of every port; a count or `-errno`.
unsafe extern "C" fn query_gid_table(
    c: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let Some(o) = ctx_obj(c) else {
        return -(EINVAL as isize);
    };
    if flags != 0 || max_entries == 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
        return -(EINVAL as isize);
    }
    if entries.is_null() {
        return -(EINVAL as isize);
    }
    let ports = match o.inner.query_device() {
        Ok(a) => a.phys_port_cnt,
        Err(e) => return -(errno_of(&e) as isize),
    };
    let mut n = 0usize;
    for port in 1..=ports {
        let len = match o.inner.query_port(port) {
            Ok(p) => p.gid_tbl_len,
            Err(e) => return -(errno_of(&e) as isize),
        };
        for i in 0..len {
            match gid_entry(o, port, i) {
                Ok(e) => {
                    if n == max_entries {
                        return -(EINVAL as isize);
                    }
                    // SAFETY: entries holds max_entries records of entry_size bytes.
                    unsafe {
                        (entries as *mut u8)
                            .add(n * entry_size)
                            .cast::<ibv_gid_entry>()
                            .write_unaligned(e)
                    };
                    n += 1;
                }
                Err(e) if e == ENODATA => {}
                Err(e) => return -(e as isize),
            }
        }
    }
    n as isize
}
export!(default "_ibv_query_gid_table", "IBVERBS_1.11", query_gid_table);

/// `ibv_query_gid_type` (PRIVATE): the sysfs enum, 1 = RoCE v2, 0 = IB/RoCE v1 (also for
/// empty entries, as rdma-core reports them).
unsafe extern "C" fn query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return minus_one(EINVAL);
    };
    if ty.is_null() {
        return minus_one(EINVAL);
    }
    match o.inner.query_gid(port, index) {
        Ok(g) => {
            // SAFETY: the caller passed a writable enum.
            unsafe { *ty = c_int::from(g.0 != [0; 16]) };
            0
        }
        Err(e) => minus_one(errno_of(&e)),
    }
}
export!(default "ibv_query_gid_type", "IBVERBS_PRIVATE_34", query_gid_type);

/// The one P_Key of a RoCE port: the default full-membership key.
const DEFAULT_PKEY: u16 = 0xffff;

unsafe extern "C" fn query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return minus_one(EINVAL);
    };
    if pkey.is_null() {
        return minus_one(EINVAL);
    }
    match o.inner.query_port(port) {
        Ok(p) if index >= 0 && (index as u32) < u32::from(p.pkey_tbl_len) => {
            // SAFETY: the caller passed a writable __be16.
            unsafe { *pkey = DEFAULT_PKEY.to_be() };
            0
        }
        Ok(_) => minus_one(EINVAL),
        Err(e) => minus_one(errno_of(&e)),
    }
}
export!(default "ibv_query_pkey", "IBVERBS_1.1", query_pkey);

unsafe extern "C" fn get_pkey_index(c: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return minus_one(EINVAL);
    };
    match o.inner.query_port(port) {
        Ok(_) if u16::from_be(pkey) == DEFAULT_PKEY => 0,
        Ok(_) => minus_one(ENOENT),
        Err(e) => minus_one(errno_of(&e)),
    }
}
export!(default "ibv_get_pkey_index", "IBVERBS_1.5", get_pkey_index);

// ---- fork (ibv_fork_init(3)) -----------------------------------------------------------------

/// `IBV_FORK_UNNEEDED`: registered memory is the client's own pages, which the daemon reaches
/// through shared mappings or `/proc/<pid>/mem`; a child gets its own copy of them, pages
/// shared in place included (the fork child handler of softverbs-memaccess), as Linux ≥ 5.8
/// copies a NIC's pinned pages.
const FORK_UNNEEDED: c_int = 2;

extern "C" fn fork_init() -> c_int {
    0
}
export!(default "ibv_fork_init", "IBVERBS_1.1", fork_init);

extern "C" fn is_fork_initialized() -> c_int {
    FORK_UNNEEDED
}
export!(default "ibv_is_fork_initialized", "IBVERBS_1.13", is_fork_initialized);

extern "C" fn dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
export!(default "ibv_dontfork_range", "IBVERBS_1.1", dontfork_range);

extern "C" fn dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
export!(default "ibv_dofork_range", "IBVERBS_1.1", dofork_range);

// ---- sysfs -----------------------------------------------------------------------------------

/// Answers the few sysfs files programs read through the library (`ibv_devinfo -v` reads
/// `board_id`); there is no kernel device, so the values are softverbs' own.
fn virtual_sysfs(dir: &str, file: &str) -> Option<String> {
    let name = dir.strip_prefix("/sys/class/infiniband/")?;
    match file {
        "board_id" => Some("SOFTVERBS".into()),
        "node_desc" => Some(format!("softverbs {name}")),
        _ => None,
    }
}

unsafe extern "C" fn read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        return -1;
    }
    // SAFETY: NUL-terminated strings from the caller.
    let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let Some(v) = virtual_sysfs(&d.to_string_lossy(), &f.to_string_lossy()) else {
        return -1;
    };
    let n = v.len().min(size - 1);
    // SAFETY: `buf` holds `size` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(v.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    n as c_int
}
export!(default "ibv_read_sysfs_file", "IBVERBS_1.0", read_sysfs_file);

unsafe extern "C" fn read_ibdev_sysfs_file(
    buf: *mut c_char,
    size: usize,
    _dev: *mut c_void,
    _fmt: *const c_char,
) -> c_int {
    if !buf.is_null() && size > 0 {
        // SAFETY: `buf` holds `size` bytes.
        unsafe { *buf = 0 };
    }
    -1
}
export!(default "ibv_read_ibdev_sysfs_file", "IBVERBS_PRIVATE_34", read_ibdev_sysfs_file);

unsafe extern "C" fn get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}
export!(default "ibv_get_sysfs_path", "IBVERBS_1.0", get_sysfs_path);
