//! `<infiniband/verbs.h>` (rdma-core 44) layouts the drop-in shares with programs.
//!
//! Programs compiled against verbs.h read these structs directly and reach the data path
//! through inline functions that call slots at fixed offsets, so every offset here is ABI.
//! The `const` blocks at the end pin the offsets docs/design/abi-compat.md §2.1 lists, and
//! `tests/layout.rs` compares every size against the installed header with a C compiler.
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type Slot = *const c_void;

/// `union ibv_gid`: its `global` member (two `__be64`) makes it 8-aligned, which
/// `ibv_qp_attr` (144 bytes, not 140) inherits through `ibv_ah_attr`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[repr(C)]
pub struct ibv_device {
    pub _ops: [Slot; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

/// `struct ibv_context_ops`: 32 slots; the live ones are named.
#[repr(C)]
pub struct ibv_context_ops {
    pub compat_query_device: Slot,
    pub compat_query_port: Slot,
    pub compat_5: [Slot; 5],
    pub alloc_mw: Slot,
    pub bind_mw: Slot,
    pub dealloc_mw: Slot,
    pub compat_create_cq: Slot,
    pub poll_cq: Slot,
    pub req_notify_cq: Slot,
    pub compat_7: [Slot; 7],
    pub post_srq_recv: Slot,
    pub compat_4: [Slot; 4],
    pub post_send: Slot,
    pub post_recv: Slot,
    pub compat_tail: [Slot; 5],
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context`: grows downwards; the public context is its last field.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Slot,
    pub advise_mr: Slot,
    pub alloc_null_mr: Slot,
    pub read_counters: Slot,
    pub attach_counters_point_flow: Slot,
    pub create_counters: Slot,
    pub destroy_counters: Slot,
    pub reg_dm_mr: Slot,
    pub alloc_dm: Slot,
    pub free_dm: Slot,
    pub modify_flow_action_esp: Slot,
    pub destroy_flow_action: Slot,
    pub create_flow_action_esp: Slot,
    pub modify_qp_rate_limit: Slot,
    pub alloc_parent_domain: Slot,
    pub dealloc_td: Slot,
    pub alloc_td: Slot,
    pub modify_cq: Slot,
    pub post_srq_ops: Slot,
    pub destroy_rwq_ind_table: Slot,
    pub create_rwq_ind_table: Slot,
    pub destroy_wq: Slot,
    pub modify_wq: Slot,
    pub create_wq: Slot,
    pub query_rt_values: Slot,
    pub create_cq_ex: Slot,
    pub priv_: *mut c_void,
    pub query_device_ex: Slot,
    pub ibv_destroy_flow: Slot,
    pub abi_placeholder2: Slot,
    pub ibv_create_flow: Slot,
    pub abi_placeholder1: Slot,
    pub open_qp: Slot,
    pub create_qp_ex: Slot,
    pub get_srq_num: Slot,
    pub create_srq_ex: Slot,
    pub open_xrcd: Slot,
    pub close_xrcd: Slot,
    pub abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

/// verbs.h `__VERBS_ABI_IS_EXTENDED`: what `verbs_get_ctx` looks for in `abi_compat`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

#[repr(C)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_general_caps: u64,
    pub odp_per_transport: [u32; 3],
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: [u32; 2],
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: [u32; 3],
    pub raw_packet_caps: u32,
    pub tm_caps: [u32; 5],
    pub cq_mod_caps: [u16; 2],
    pub max_dm_size: u64,
    pub pci_atomic_caps: [u16; 3],
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

#[repr(C)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

#[repr(C)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// The first 48 bytes of `ibv_port_attr` (`struct _compat_ibv_port_attr`): what the exported
/// `ibv_query_port` may write.
pub const COMPAT_PORT_ATTR_LEN: usize = 48;

#[repr(C)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_xrcd {
    pub context: *mut ibv_context,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_cq_ex {
    pub cq: ibv_cq,
    pub comp_mask: u32,
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Slot,
    pub next_poll: Slot,
    pub end_poll: Slot,
    pub read_opcode: Slot,
    pub read_vendor_err: Slot,
    pub read_byte_len: Slot,
    pub read_imm_data: Slot,
    pub read_qp_num: Slot,
    pub read_src_qp: Slot,
    pub read_wc_flags: Slot,
    pub read_slid: Slot,
    pub read_sl: Slot,
    pub read_dlid_path_bits: Slot,
    pub read_completion_ts: Slot,
    pub read_cvlan: Slot,
    pub read_flow_tag: Slot,
    pub read_tm_info: Slot,
    pub read_completion_wallclock_ns: Slot,
}

#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: c_int,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub cq: *mut ibv_cq,
    pub tm_cap: [u32; 2],
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Slot,
    pub wr_atomic_fetch_add: Slot,
    pub wr_bind_mw: Slot,
    pub wr_local_inv: Slot,
    pub wr_rdma_read: Slot,
    pub wr_rdma_write: Slot,
    pub wr_rdma_write_imm: Slot,
    pub wr_send: Slot,
    pub wr_send_imm: Slot,
    pub wr_send_inv: Slot,
    pub wr_send_tso: Slot,
    pub wr_set_ud_addr: Slot,
    pub wr_set_xrc_srqn: Slot,
    pub wr_set_inline_data: Slot,
    pub wr_set_inline_data_list: Slot,
    pub wr_set_sge: Slot,
    pub wr_set_sge_list: Slot,
    pub wr_start: Slot,
    pub wr_complete: Slot,
    pub wr_abort: Slot,
    pub wr_atomic_write: Slot,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

#[repr(C)]
pub struct ibv_qp_open_attr {
    pub comp_mask: u32,
    pub qp_num: u32,
    pub xrcd: *mut ibv_xrcd,
    pub qp_context: *mut c_void,
    pub qp_type: c_int,
}

#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_send_wr` with its unions flattened to the widest member (`wr.atomic`,
/// `bind_mw`); `wr_u`/`tail` are read through the accessors in `qp.rs`.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// `imm_data` (big-endian as the app wrote it) or `invalidate_rkey`.
    pub imm_data: u32,
    /// `wr.rdma {remote_addr, rkey}`, `wr.atomic {remote_addr, compare_add, swap, rkey}`
    /// or `wr.ud {ah, remote_qpn, remote_qkey}`.
    pub wr_u: [u64; 4],
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    /// `bind_mw` / `tso`.
    pub tail: [u64; 6],
}

#[repr(C)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
pub struct ibv_async_event {
    /// `element`: a `cq`/`qp`/`srq`/`wq` pointer or an `int port_num`.
    pub element: *mut c_void,
    pub event_type: c_int,
}

#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

#[repr(C)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

// ---- offsets docs/design/abi-compat.md §2.1 measured against verbs.h 44.0 ----------------------------

// Measured on x86_64: elsewhere `pthread_mutex_t` and `pthread_cond_t` (libc's, per target)
// have other sizes, so the numbers below do not hold there; tests/layout.rs compares every
// size with the installed header on whatever machine runs it.
#[cfg(target_arch = "x86_64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ibv_device>() == 664);
    assert!(offset_of!(ibv_device, transport_type) == 20);
    assert!(offset_of!(ibv_device, name) == 24);
    assert!(offset_of!(ibv_device, ibdev_path) == 408);
    assert!(size_of::<ibv_context>() == 328);
    assert!(offset_of!(ibv_context, ops) == 8);
    assert!(size_of::<ibv_context_ops>() == 256);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, alloc_mw) == 64);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, dealloc_mw) == 80);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq) == 96);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq) == 104);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_srq_recv) == 168);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send) == 208);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv) == 216);
    assert!(offset_of!(ibv_context, cmd_fd) == 264);
    assert!(offset_of!(ibv_context, num_comp_vectors) == 272);
    assert!(offset_of!(ibv_context, mutex) == 280);
    assert!(offset_of!(ibv_context, abi_compat) == 320);
    assert!(size_of::<verbs_context>() == 648);
    assert!(offset_of!(verbs_context, create_cq_ex) == 200);
    assert!(offset_of!(verbs_context, query_device_ex) == 216);
    assert!(offset_of!(verbs_context, open_qp) == 256);
    assert!(offset_of!(verbs_context, close_xrcd) == 296);
    assert!(offset_of!(verbs_context, sz) == 312);
    assert!(offset_of!(verbs_context, context) == 320);
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(size_of::<ibv_device_attr_ex>() == 400);
    assert!(offset_of!(ibv_device_attr_ex, phys_port_cnt_ex) == 396);
    assert!(size_of::<ibv_port_attr>() == 52);
    assert!(offset_of!(ibv_port_attr, port_cap_flags2) == 48);
    assert!(size_of::<ibv_gid_entry>() == 32);
    assert!(size_of::<ibv_comp_channel>() == 16);
    assert!(offset_of!(ibv_mr, addr) == 16);
    assert!(offset_of!(ibv_mr, length) == 24);
    assert!(offset_of!(ibv_mr, lkey) == 36);
    assert!(offset_of!(ibv_mr, rkey) == 40);
    assert!(size_of::<ibv_cq>() == 128);
    assert!(offset_of!(ibv_cq, comp_events_completed) == 120);
    assert!(offset_of!(ibv_cq, async_events_completed) == 124);
    assert!(size_of::<ibv_cq_ex>() == 288);
    assert!(offset_of!(ibv_cq_ex, status) == 132);
    assert!(offset_of!(ibv_cq_ex, wr_id) == 136);
    assert!(offset_of!(ibv_cq_ex, start_poll) == 144);
    assert!(offset_of!(ibv_cq_ex, read_completion_ts) == 248);
    assert!(offset_of!(ibv_cq_ex, read_completion_wallclock_ns) == 280);
    assert!(offset_of!(ibv_srq, events_completed) == 120);
    assert!(size_of::<ibv_qp>() == 160);
    assert!(offset_of!(ibv_qp, qp_num) == 52);
    assert!(offset_of!(ibv_qp, events_completed) == 152);
    assert!(size_of::<ibv_qp_ex>() == 352);
    assert!(offset_of!(ibv_qp_ex, wr_id) == 168);
    assert!(offset_of!(ibv_qp_ex, wr_flags) == 176);
    assert!(offset_of!(ibv_qp_ex, wr_atomic_cmp_swp) == 184);
    assert!(offset_of!(ibv_qp_ex, wr_send) == 240);
    assert!(offset_of!(ibv_qp_ex, wr_set_xrc_srqn) == 280);
    assert!(offset_of!(ibv_qp_ex, wr_set_sge) == 304);
    assert!(offset_of!(ibv_qp_ex, wr_start) == 320);
    assert!(offset_of!(ibv_qp_ex, wr_atomic_write) == 344);
    assert!(size_of::<ibv_wc>() == 48);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_send_wr, remote_srqn) == 72);
    assert!(offset_of!(ibv_send_wr, tail) == 80);
    assert!(offset_of!(ibv_device_attr_ex, max_wq_type_rq) == 328);
    assert!(offset_of!(ibv_device_attr_ex, max_dm_size) == 376);
    assert!(offset_of!(ibv_port_attr, link_layer) == 46);
    assert!(size_of::<ibv_srq>() == 128);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(size_of::<ibv_qp_init_attr_ex>() == 136);
    assert!(offset_of!(ibv_qp_init_attr_ex, send_ops_flags) == 128);
    assert!(size_of::<ibv_qp_attr>() == 144);
    assert!(offset_of!(ibv_qp_attr, ah_attr) == 56);
    assert!(offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(size_of::<ibv_ah_attr>() == 32);
    assert!(size_of::<ibv_srq_init_attr_ex>() == 64);
    assert!(offset_of!(ibv_srq_init_attr_ex, cq) == 48);
    assert!(size_of::<ibv_cq_init_attr_ex>() == 56);
    assert!(size_of::<ibv_qp_open_attr>() == 32);
    assert!(size_of::<ibv_xrcd_init_attr>() == 12);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_sge>() == 16);
    assert!(size_of::<ibv_async_event>() == 16);
};
