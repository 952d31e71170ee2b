//! Enhanced Connection Establishment (`rdma_set_local_ece(3)`, `rdma_get_remote_ece(3)`).
//!
//! ECE lets two vendors' devices agree on options through the CM. softverbs' QPs have no
//! such options (the drop-in's `ibv_query_ece` and `ibv_set_ece` answer `EOPNOTSUPP`) and its
//! CM carries none, so there is never a remote ECE to report nor a local one to send: both
//! calls answer `EOPNOTSUPP` for a valid id (the errno rdma-core's tests take to mean "no ECE
//! here", tests/rdmacm_utils.py), and `EINVAL` for what librdmacm rejects first (no id, no
//! `ece`, or an id that already has a QP).

use core::ffi::{c_int, c_void};

use crate::api::set_errno;
use crate::ffi::rdma_cm_id;

fn answer(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
    // SAFETY: a non-NULL id is one of ours (rdma_cm_id is its first field).
    let valid = !id.is_null() && !ece.is_null() && unsafe { (*id).qp.is_null() };
    set_errno(if valid {
        libc::EOPNOTSUPP
    } else {
        libc::EINVAL
    });
    -1
}

unsafe extern "C" fn set_local_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
    answer(id, ece)
}
export!("rdma_set_local_ece", "RDMACM_1.3", set_local_ece);

unsafe extern "C" fn get_remote_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
    answer(id, ece)
}
export!("rdma_get_remote_ece", "RDMACM_1.3", get_remote_ece);
