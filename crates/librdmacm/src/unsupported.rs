//! Entry points that fail with `ENOSYS` (docs/guide/dropin.md, "librdmacm"):
//! `rdma_notify`. Each is exported so programs that link
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
    "rdma_notify" => notify(a, b);
}
