//! Exports softverbs does not implement, answering as rdma-core does for a device without
//! the feature.
//!
//! - `ibv_cmd_*`, `execute_ioctl`, `verbs_*` and the other `IBVERBS_PRIVATE_34` symbols are
//!   rdma-core's provider interface. They must exist because libmlx5 and libefa (which
//!   perftest and pyverbs load) import them and everything is bound at load time; no
//!   provider is ever driven through them here. `verbs_register_driver_34` is called by
//!   those libraries' constructors and must be a harmless no-op.
//! - Import/unimport of shared objects (no
//!   `ibv_import_device`), dma-buf MRs and ECE: `EOPNOTSUPP`, or NULL with that errno.
//! - The `@IBVERBS_1.0` compat entries take libibverbs 1.0's structs; no program built in
//!   the last fifteen years references them: `ENOSYS`.
//! - The kernel-struct copy helpers (`ibv_copy_*_kern`) serve the kernel's rdma_cm, which
//!   does not exist here; they copy nothing.

use std::ffi::{c_int, c_uint, c_void};

use crate::util::{null_with, ENOSYS, EOPNOTSUPP};

/// `verbs_allow_disassociate_destroy` (PRIVATE_34): a 1-byte data object libmlx5 reads.
#[used]
static ALLOW_DISASSOCIATE_DESTROY: u8 = 0;
#[cfg(not(test))]
::core::arch::global_asm!(
    ".globl {s}",
    ".symver {s}, verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34",
    s = sym ALLOW_DISASSOCIATE_DESTROY
);

extern "C" fn unsupported_int() -> c_int {
    EOPNOTSUPP
}

extern "C" fn unsupported_ptr() -> *mut c_void {
    null_with(EOPNOTSUPP)
}

extern "C" fn nothing() {}

extern "C" fn final_num_attrs(num_attrs: c_uint) -> c_uint {
    num_attrs
}
export!(default "__ioctl_final_num_attrs", "IBVERBS_PRIVATE_34", final_num_attrs);

extern "C" fn compat_int() -> c_int {
    ENOSYS
}

extern "C" fn compat_ptr() -> *mut c_void {
    null_with(ENOSYS)
}

extern "C" fn compat_guid() -> u64 {
    0
}

export!(default "__verbs_log", "IBVERBS_PRIVATE_34", nothing);
export!(default "_verbs_init_and_alloc_context", "IBVERBS_PRIVATE_34", unsupported_ptr);
export!(default "execute_ioctl", "IBVERBS_PRIVATE_34", unsupported_int);
export!(compat "ibv_ack_async_event", "IBVERBS_1.0", nothing);
export!(compat "ibv_ack_cq_events", "IBVERBS_1.0", nothing);
export!(compat "ibv_alloc_pd", "IBVERBS_1.0", compat_ptr);
export!(compat "ibv_attach_mcast", "IBVERBS_1.0", compat_int);
export!(compat "ibv_close_device", "IBVERBS_1.0", compat_int);
export!(default "ibv_cmd_advise_mr", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_alloc_dm", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_alloc_mw", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_alloc_pd", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_attach_mcast", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_close_xrcd", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_ah", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_counters", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_cq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_cq_ex", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_flow", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_flow_action_esp", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_qp", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_qp_ex2", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_qp_ex", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_rwq_ind_table", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_srq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_srq_ex", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_create_wq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_dealloc_mw", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_dealloc_pd", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_dereg_mr", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_destroy_ah", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_destroy_counters", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_destroy_cq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_destroy_flow", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_destroy_flow_action", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_destroy_qp", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_destroy_rwq_ind_table", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_destroy_srq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_destroy_wq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_detach_mcast", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_free_dm", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_get_context", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_modify_cq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_modify_flow_action_esp", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_modify_qp", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_modify_qp_ex", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_modify_srq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_modify_wq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_open_qp", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_open_xrcd", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_poll_cq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_post_recv", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_post_send", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_post_srq_recv", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_query_context", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_query_device_any", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_query_mr", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_query_port", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_query_qp", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_query_srq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_read_counters", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_reg_dm_mr", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_reg_dmabuf_mr", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_reg_mr", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_req_notify_cq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_rereg_mr", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_cmd_resize_cq", "IBVERBS_PRIVATE_34", unsupported_int);
export!(default "ibv_copy_ah_attr_from_kern", "IBVERBS_1.1", nothing);
export!(default "ibv_copy_path_rec_from_kern", "IBVERBS_1.0", nothing);
export!(default "ibv_copy_path_rec_to_kern", "IBVERBS_1.0", nothing);
export!(default "ibv_copy_qp_attr_from_kern", "IBVERBS_1.0", nothing);
export!(compat "ibv_create_ah", "IBVERBS_1.0", compat_ptr);
export!(compat "ibv_create_cq", "IBVERBS_1.0", compat_ptr);
export!(compat "ibv_create_qp", "IBVERBS_1.0", compat_ptr);
export!(compat "ibv_create_srq", "IBVERBS_1.0", compat_ptr);
export!(compat "ibv_dealloc_pd", "IBVERBS_1.0", compat_int);
export!(compat "ibv_dereg_mr", "IBVERBS_1.0", compat_int);
export!(compat "ibv_destroy_ah", "IBVERBS_1.0", compat_int);
export!(compat "ibv_destroy_cq", "IBVERBS_1.0", compat_int);
export!(compat "ibv_destroy_qp", "IBVERBS_1.0", compat_int);
export!(compat "ibv_destroy_srq", "IBVERBS_1.0", compat_int);
export!(compat "ibv_detach_mcast", "IBVERBS_1.0", compat_int);
export!(compat "ibv_free_device_list", "IBVERBS_1.0", nothing);
export!(compat "ibv_get_async_event", "IBVERBS_1.0", compat_int);
export!(compat "ibv_get_cq_event", "IBVERBS_1.0", compat_int);
export!(compat "ibv_get_device_guid", "IBVERBS_1.0", compat_guid);
export!(compat "ibv_get_device_list", "IBVERBS_1.0", compat_ptr);
export!(compat "ibv_get_device_name", "IBVERBS_1.0", compat_ptr);
export!(default "ibv_import_device", "IBVERBS_1.10", unsupported_ptr);
export!(default "ibv_import_dm", "IBVERBS_1.13", unsupported_ptr);
export!(default "ibv_import_mr", "IBVERBS_1.10", unsupported_ptr);
export!(default "ibv_import_pd", "IBVERBS_1.10", unsupported_ptr);
export!(compat "ibv_modify_qp", "IBVERBS_1.0", compat_int);
export!(compat "ibv_modify_srq", "IBVERBS_1.0", compat_int);
export!(compat "ibv_open_device", "IBVERBS_1.0", compat_ptr);
export!(compat "ibv_query_device", "IBVERBS_1.0", compat_int);
export!(default "ibv_query_ece", "IBVERBS_1.10", unsupported_int);
export!(compat "ibv_query_gid", "IBVERBS_1.0", compat_int);
export!(compat "ibv_query_pkey", "IBVERBS_1.0", compat_int);
export!(compat "ibv_query_port", "IBVERBS_1.0", compat_int);
export!(compat "ibv_query_qp", "IBVERBS_1.0", compat_int);
export!(compat "ibv_query_srq", "IBVERBS_1.0", compat_int);
export!(default "ibv_reg_dmabuf_mr", "IBVERBS_1.12", unsupported_ptr);
export!(compat "ibv_reg_mr", "IBVERBS_1.0", compat_ptr);
export!(compat "ibv_register_driver", "IBVERBS_1.1", nothing);
export!(compat "ibv_resize_cq", "IBVERBS_1.0", compat_int);
export!(default "ibv_resolve_eth_l2_from_gid", "IBVERBS_1.1", unsupported_int);
export!(default "ibv_set_ece", "IBVERBS_1.10", unsupported_int);
export!(default "ibv_unimport_dm", "IBVERBS_1.13", nothing);
export!(default "ibv_unimport_mr", "IBVERBS_1.10", nothing);
export!(default "ibv_unimport_pd", "IBVERBS_1.10", nothing);
export!(default "verbs_init_cq", "IBVERBS_PRIVATE_34", nothing);
export!(default "verbs_open_device", "IBVERBS_PRIVATE_34", unsupported_ptr);
export!(default "verbs_register_driver_34", "IBVERBS_PRIVATE_34", nothing);
export!(default "verbs_set_ops", "IBVERBS_PRIVATE_34", nothing);
export!(default "verbs_uninit_context", "IBVERBS_PRIVATE_34", nothing);
