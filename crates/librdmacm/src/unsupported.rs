//! Entry points that fail with `ENOSYS` (docs/dropin.md, "librdmacm"):
//! multicast, SRQs on ids, ECE and `rdma_notify`. Each is exported so programs that link
//! them load; the call says it is not there rather than pretending.

use core::ffi::c_int;

use crate::api::set_errno;

macro_rules! enosys {
    ($($name:literal => $f:ident ( $($a:ident),* ) ;)*) => {
        $(
            #[allow(unused_variables)]
            unsafe extern "C" fn $f($($a: usize),*) -> c_int {
                set_errno(libc::ENOSYS);
                -1
            }
            export!($name, "RDMACM_1.0", $f);
        )*
    };
}

enosys! {
    "rdma_join_multicast" => join_multicast(a, b, c);
    "rdma_leave_multicast" => leave_multicast(a, b);
    "rdma_create_srq" => create_srq(a, b, c);
    "rdma_create_srq_ex" => create_srq_ex(a, b);
    "rdma_destroy_srq" => destroy_srq(a);
    "rdma_notify" => notify(a, b);
}

#[allow(unused_variables)]
unsafe extern "C" fn join_multicast_ex(a: usize, b: usize, c: usize) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}
export!("rdma_join_multicast_ex", "RDMACM_1.1", join_multicast_ex);

#[allow(unused_variables)]
unsafe extern "C" fn set_local_ece(a: usize, b: usize) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}
export!("rdma_set_local_ece", "RDMACM_1.3", set_local_ece);

#[allow(unused_variables)]
unsafe extern "C" fn get_remote_ece(a: usize, b: usize) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}
export!("rdma_get_remote_ece", "RDMACM_1.3", get_remote_ece);
