//! The devices as the drop-in libibverbs shows them (so `id->verbs` is the context a
//! program linked against both uses), their IP addresses (from the GID tables: RoCE v2
//! GIDs are the addresses), and the QP transitions rdma_cm makes for a program.

use core::ffi::c_void;
use std::net::IpAddr;
use std::sync::OnceLock;

use crate::ffi::*;

/// One device: its verbs context (opened once, for the life of the process, as
/// librdmacm's `ucma_init` does) and its addresses.
pub struct Device {
    pub verbs: *mut ibv_context,
    /// The device's protection domain that every id on it shows as `id->pd` from the moment
    /// it is bound to the device (librdmacm allocates one per device and sets it with
    /// `id->verbs`; pyverbs' `PD(cmid)` and programs that create their own QP on `id->pd`
    /// rely on it). NULL if it could not be allocated.
    pub pd: *mut core::ffi::c_void,
    pub ips: Vec<IpAddr>,
}

struct Devices(Vec<Device>);
// SAFETY: the contexts are the drop-in libibverbs' objects, which are thread-safe; the
// list is written once and then only read.
unsafe impl Send for Devices {}
// SAFETY: as above.
unsafe impl Sync for Devices {}

static DEVICES: OnceLock<Devices> = OnceLock::new();

fn gid_ip(gid: [u8; 16]) -> Option<IpAddr> {
    if gid == [0; 16] {
        return None;
    }
    let v6 = std::net::Ipv6Addr::from(gid);
    Some(match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    })
}

/// Every device, opened on first use.
pub fn devices() -> &'static [Device] {
    &DEVICES
        .get_or_init(|| {
            let mut out = Vec::new();
            let mut n = 0;
            // SAFETY: ibv_get_device_list returns NULL or an array of `n` device pointers.
            let list = unsafe { ibv_get_device_list(&mut n) };
            if list.is_null() {
                return Devices(out);
            }
            for i in 0..n.max(0) as usize {
                // SAFETY: `i` < `n`, within the array.
                let dev = unsafe { *list.add(i) };
                // SAFETY: a device of the list.
                let verbs = unsafe { ibv_open_device(dev) };
                if verbs.is_null() {
                    continue;
                }
                let mut ips = Vec::new();
                for index in 0..16 {
                    let mut gid = ibv_gid::default();
                    // SAFETY: an open context; `gid` is a writable, aligned ibv_gid.
                    if unsafe { ibv_query_gid(verbs, 1, index, &mut gid) } != 0 {
                        break;
                    }
                    if let Some(ip) = gid_ip(gid.0) {
                        ips.push(ip);
                    }
                }
                // SAFETY: an open context.
                let pd = unsafe { ibv_alloc_pd(verbs) };
                out.push(Device { verbs, pd, ips });
            }
            Devices(out)
        })
        .0
}

/// The RDMA read depths a program's `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH` (0xFF,
/// rdma_cma.h) stand for on `verbs`: the device's `max_qp_rd_atom` and
/// `max_qp_init_rd_atom` (rdma_connect(3), rdma_accept(3): "the maximum supported by the
/// device" is used), `(1, 1)` if the device cannot be asked.
pub fn rd_limits(verbs: *mut ibv_context) -> (u8, u8) {
    // struct ibv_device_attr (verbs.h) is 232 bytes; `max_qp_rd_atom` is the int at byte
    // 144, `max_qp_init_rd_atom` the one at byte 156.
    let mut attr = [0u64; 32];
    // SAFETY: an open context of the drop-in and a buffer larger than ibv_device_attr.
    if verbs.is_null() || unsafe { ibv_query_device(verbs, attr.as_mut_ptr().cast()) } != 0 {
        return (1, 1);
    }
    let bytes: Vec<u8> = attr.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let int_at =
        |o: usize| i32::from_ne_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    let clamp = |v: i32| v.clamp(1, 255) as u8;
    (clamp(int_at(144)), clamp(int_at(156)))
}

/// Binds `id` to device `d`: its context, and its PD unless the id has one already.
pub fn attach(id: &mut rdma_cm_id, d: usize) {
    let dev = &devices()[d];
    id.verbs = dev.verbs;
    if id.pd.is_null() {
        id.pd = dev.pd;
    }
}

/// The GID index of `ip` on device `d` (0 if it is not one of the device's addresses).
pub fn sgid_index(d: usize, ip: IpAddr) -> u8 {
    devices()
        .get(d)
        .and_then(|dev| dev.ips.iter().position(|x| *x == ip))
        .map_or(0, |i| i as u8)
}

/// The device that owns `ip`.
pub fn device_with(ip: IpAddr) -> Option<usize> {
    devices().iter().position(|d| d.ips.contains(&ip))
}

/// The device to reach `dst` from: one that owns it, else one that owns `src`, else the
/// first with an address of `dst`'s family (softverbs has no routing table: every device
/// reaches every address of its family).
pub fn route(src: Option<IpAddr>, dst: IpAddr) -> Option<(usize, IpAddr)> {
    let devs = devices();
    let fam = |ip: &IpAddr| ip.is_ipv4() == dst.is_ipv4();
    if let Some(d) = device_with(dst) {
        return Some((d, dst));
    }
    if let Some(src) = src.filter(|s| !s.is_unspecified()) {
        return device_with(src).map(|d| (d, src));
    }
    devs.iter()
        .enumerate()
        .find_map(|(i, d)| d.ips.iter().find(|ip| fam(ip)).map(|ip| (i, *ip)))
}

pub const QPS_INIT: u32 = 1;
pub const QPS_RTR: u32 = 2;
pub const QPS_RTS: u32 = 3;
pub const QPS_ERR: u32 = 6;
const MASK_STATE: i32 = 1;
const MASK_ACCESS: i32 = 8;
const MASK_PKEY: i32 = 16;
const MASK_PORT: i32 = 32;
const MASK_QKEY: i32 = 64;
const MASK_AV: i32 = 128;
const MASK_PATH_MTU: i32 = 256;
const MASK_TIMEOUT: i32 = 512;
const MASK_RETRY: i32 = 1024;
const MASK_RNR_RETRY: i32 = 2048;
const MASK_RQ_PSN: i32 = 4096;
const MASK_MAX_RD: i32 = 8192;
const MASK_MIN_RNR: i32 = 32768;
const MASK_SQ_PSN: i32 = 65536;
const MASK_MAX_DEST_RD: i32 = 131072;
const MASK_DEST_QPN: i32 = 1 << 20;
/// The Q_Key rdma_cm gives UD ids (`RDMA_UDP_QKEY`, rdma_cma.h).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// `IBV_QPT_UD`.
pub const QPT_UD: u32 = 4;
/// `IBV_QPT_XRC_SEND`.
pub const QPT_XRC_SEND: u32 = 9;
/// `IBV_QPT_XRC_RECV`.
pub const QPT_XRC_RECV: u32 = 10;

/// `ibv_create_qp_ex(3)`, which verbs.h inlines: the `create_qp_ex` entry of the context's
/// `struct verbs_context`, the word 56 bytes before the public `ibv_context` (verbs.h
/// layout: `create_qp_ex`, `get_srq_num`, `create_srq_ex`, `open_xrcd`, `close_xrcd`,
/// `_ABI_placeholder3`, `sz`, then `context`).
pub fn create_qp_ex(
    verbs: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> Result<*mut ibv_qp, i32> {
    type CreateQpEx =
        unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
    // SAFETY: `verbs` is a context of the drop-in libibverbs, which is always a
    // `verbs_context` (its `abi_compat` says so); the slot is a function of that signature
    // or NULL.
    let f: Option<CreateQpEx> = unsafe {
        let slot = verbs.cast::<u8>().sub(56).cast::<Option<CreateQpEx>>();
        slot.read()
    };
    let f = f.ok_or(libc::EOPNOTSUPP)?;
    // SAFETY: the context and the program's attribute block.
    let qp = unsafe { f(verbs, attr) };
    if qp.is_null() {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOMEM));
    }
    Ok(qp)
}

/// `ibv_create_srq_ex(3)`, inlined by verbs.h: the `create_srq_ex` slot of the context's
/// `struct verbs_context`, 40 bytes before the public `ibv_context` (layout as for
/// [`create_qp_ex`]).
pub fn create_srq_ex(
    verbs: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> Result<*mut c_void, i32> {
    type CreateSrqEx =
        unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut c_void;
    // SAFETY: as in `create_qp_ex`: a drop-in context is a `verbs_context`; the slot is a
    // function of that signature or NULL.
    let f: Option<CreateSrqEx> = unsafe {
        let slot = verbs.cast::<u8>().sub(40).cast::<Option<CreateSrqEx>>();
        slot.read()
    };
    let f = f.ok_or(libc::EOPNOTSUPP)?;
    // SAFETY: the context and a complete attribute block.
    let srq = unsafe { f(verbs, attr) };
    if srq.is_null() {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOMEM));
    }
    Ok(srq)
}

/// The XRC domain this library opens once per device context for ids whose program gives
/// none, as rdma-core's librdmacm does (`ibv_open_xrcd` with fd -1 and `O_CREAT`: a domain of
/// this process alone), kept until the process ends. `ibv_open_xrcd(3)` is inlined by
/// verbs.h: the `open_xrcd` slot, 32 bytes before the public `ibv_context`.
pub fn xrcd_of(verbs: *mut ibv_context) -> Result<*mut c_void, i32> {
    static XRCDS: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
    let mut g = XRCDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, x)) = g.iter().find(|(c, _)| *c == verbs as usize) {
        return Ok(x as *mut c_void);
    }
    type OpenXrcd = unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut c_void;
    // SAFETY: as in `create_qp_ex`.
    let f: Option<OpenXrcd> = unsafe {
        let slot = verbs.cast::<u8>().sub(32).cast::<Option<OpenXrcd>>();
        slot.read()
    };
    let f = f.ok_or(libc::EOPNOTSUPP)?;
    let mut a = ibv_xrcd_init_attr {
        comp_mask: XRCD_INIT_ATTR_FD | XRCD_INIT_ATTR_OFLAGS,
        fd: -1,
        oflags: libc::O_CREAT,
    };
    // SAFETY: the context and a complete attribute block.
    let x = unsafe { f(verbs, &mut a) };
    if x.is_null() {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOMEM));
    }
    g.push((verbs as usize, x as usize));
    Ok(x)
}

/// What the peer told us (REQ or REP) and what we told it, for the QP's RTR and RTS.
#[derive(Clone, Copy, Debug, Default)]
pub struct Path {
    pub dgid: [u8; 16],
    /// The GID index of the local address the connection uses (RoCE v2 GIDs are the
    /// device's addresses, so an IPv6 connection on a device whose first address is IPv4
    /// sends from a later slot).
    pub sgid_index: u8,
    pub remote_qpn: u32,
    /// The Starting PSN of the peer's REQ or REP: the PSN the peer's receive queue expects
    /// first, so the one our QP sends from (RTS `sq_psn`). IBA 12.6.5/12.6.8 as the
    /// kernel's ib_cm reads them (docs/design/cm.md, "Starting PSN").
    pub remote_psn: u32,
    /// The Starting PSN of our REQ or REP: the PSN our QP's receive queue expects first
    /// (RTR `rq_psn`).
    pub local_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT` (rdma_set_option(3)): the RC QP's local ACK timeout
    /// exponent for RTS, instead of the default.
    pub ack_timeout: Option<u8>,
    /// Whether `local_psn` has been chosen (see [`Path::choose_psn`]).
    pub psn_chosen: bool,
    /// The path MTU of the peer's REQ (IBA enum, 1 = 256 … 5 = 4096) on the passive side;
    /// 0 on the active side, whose REQ advertises 1024 (`softverbs::cm` `connect`).
    pub path_mtu: u8,
}

impl Path {
    /// Our starting PSN, chosen once by whichever comes first of rdma_init_qp_attr(RTR or
    /// RTS), rdma_connect and rdma_accept: a program that brings its own QP to RTR before it
    /// accepts (rdma_init_qp_attr, then rdma_accept) must expect the PSN its REP carries.
    pub fn choose_psn(&mut self, fresh: impl FnOnce() -> u32) -> u32 {
        if !self.psn_chosen {
            self.local_psn = fresh();
            self.psn_chosen = true;
        }
        self.local_psn
    }
}

/// The attributes and mask `rdma_init_qp_attr` gives for `state` (INIT, RTR or RTS).
pub fn qp_attr(state: u32, qp_type: u32, p: &Path) -> Option<(ibv_qp_attr, i32)> {
    let mut a = ibv_qp_attr {
        qp_state: state,
        ..ibv_qp_attr::default()
    };
    let mask = match state {
        QPS_INIT if qp_type == QPT_UD => {
            a.port_num = 1;
            a.qkey = RDMA_UDP_QKEY;
            MASK_STATE | MASK_PKEY | MASK_PORT | MASK_QKEY
        }
        QPS_INIT => {
            a.port_num = 1;
            // Local write and remote read/write/atomic: rdma_cm grants remote access on the
            // QP and leaves the MRs to decide.
            a.qp_access_flags = 0x0f;
            MASK_STATE | MASK_PKEY | MASK_PORT | MASK_ACCESS
        }
        QPS_RTR if qp_type == QPT_UD => MASK_STATE,
        QPS_RTR => {
            // The REQ's path MTU on the passive side, as the kernel's ib_cm gives the QP
            // (cm_format_paths_from_req): a kernel or NIC active side sends packets of that
            // size, and a QP left at 1024 NAKs a 4096-byte one as an invalid request
            // (docs/guide/rxe-interop.md). The active side's REQ advertises 1024.
            a.path_mtu = match p.path_mtu {
                1..=5 => u32::from(p.path_mtu),
                _ => 3, // IBV_MTU_1024
            };
            a.dest_qp_num = p.remote_qpn;
            // The PSN we advertised: the peer sends from it (as the kernel's
            // cm_init_qp_rtr_attr gives the rq_psn of the id's own REQ/REP).
            a.rq_psn = p.local_psn;
            a.max_dest_rd_atomic = p.responder_resources.max(1);
            a.min_rnr_timer = 12;
            a.ah_attr = ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: p.dgid,
                    sgid_index: p.sgid_index,
                    hop_limit: 64,
                    ..ibv_global_route::default()
                },
                is_global: 1,
                port_num: 1,
                ..ibv_ah_attr::default()
            };
            MASK_STATE
                | MASK_AV
                | MASK_PATH_MTU
                | MASK_DEST_QPN
                | MASK_RQ_PSN
                | MASK_MAX_DEST_RD
                | MASK_MIN_RNR
        }
        QPS_RTS if qp_type == QPT_UD => {
            a.sq_psn = p.local_psn;
            MASK_STATE | MASK_SQ_PSN
        }
        QPS_RTS => {
            // The PSN the peer advertised, which its receive queue expects (the kernel's
            // cm_init_qp_rts_attr: sq_psn from the peer's REQ/REP).
            a.sq_psn = p.remote_psn;
            a.timeout = p.ack_timeout.unwrap_or(14);
            a.retry_cnt = 7;
            a.rnr_retry = 7;
            a.max_rd_atomic = p.initiator_depth.max(1);
            MASK_STATE | MASK_TIMEOUT | MASK_RETRY | MASK_RNR_RETRY | MASK_SQ_PSN | MASK_MAX_RD
        }
        QPS_ERR => MASK_STATE,
        _ => return None,
    };
    Some((a, mask))
}

/// Moves `qp` to `state`; the errno on failure.
pub fn modify(qp: *mut ibv_qp, state: u32, p: &Path) -> Result<(), i32> {
    if qp.is_null() {
        return Ok(());
    }
    // SAFETY: a QP of the drop-in libibverbs (the program's, on this id).
    let qp_type = unsafe { (*qp).qp_type };
    let (mut a, mask) = qp_attr(state, qp_type, p).ok_or(libc::EINVAL)?;
    // SAFETY: as above; `a` is a valid attribute block.
    match unsafe { ibv_modify_qp(qp, &mut a, mask) } {
        0 => Ok(()),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel active side (rxe on a 9000-byte link) asks for 4096 in its REQ and sends
    /// 4096-byte packets: the passive QP must take that MTU, not 1024 (issue 37; found by
    /// scripts/rxe-interop.sh, `ib_send_bw-R:sv:4096:v4`).
    #[test]
    fn rtr_path_mtu_is_the_reqs() {
        let p = Path {
            path_mtu: 5,
            ..Path::default()
        };
        let (a, mask) = qp_attr(QPS_RTR, 2 /* IBV_QPT_RC */, &p).unwrap();
        assert_eq!(a.path_mtu, 5);
        assert_ne!(mask & MASK_PATH_MTU, 0);
        // the active side (no REQ received) keeps the 1024 its REQ advertised
        let (a, _) = qp_attr(QPS_RTR, 2 /* IBV_QPT_RC */, &Path::default()).unwrap();
        assert_eq!(a.path_mtu, 3);
    }
}
