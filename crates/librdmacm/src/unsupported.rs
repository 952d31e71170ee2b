//! Entry points that fail with `ENOSYS` (docs/dropin.md, "librdmacm"): rsockets,
//! SRQs on ids and `rdma_notify`. Each is exported so programs that link
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
    "rsocket" => rsocket(a, b, c);
    "rbind" => rbind(a, b, c);
    "rlisten" => rlisten(a, b);
    "raccept" => raccept(a, b, c);
    "rconnect" => rconnect(a, b, c);
    "rshutdown" => rshutdown(a, b);
    "rclose" => rclose(a);
    "rrecv" => rrecv(a, b, c, d);
    "rrecvfrom" => rrecvfrom(a, b, c, d, e, f);
    "rrecvmsg" => rrecvmsg(a, b, c);
    "rsend" => rsend(a, b, c, d);
    "rsendto" => rsendto(a, b, c, d, e, f);
    "rsendmsg" => rsendmsg(a, b, c);
    "rread" => rread(a, b, c);
    "rreadv" => rreadv(a, b, c);
    "rwrite" => rwrite(a, b, c);
    "rwritev" => rwritev(a, b, c);
    "rpoll" => rpoll(a, b, c);
    "rselect" => rselect(a, b, c, d, e);
    "rgetpeername" => rgetpeername(a, b, c);
    "rgetsockname" => rgetsockname(a, b, c);
    "rsetsockopt" => rsetsockopt(a, b, c, d, e);
    "rgetsockopt" => rgetsockopt(a, b, c, d, e);
    "rfcntl" => rfcntl(a, b, c);
    "riomap" => riomap(a, b, c, d, e, f);
    "riounmap" => riounmap(a, b, c);
    "riowrite" => riowrite(a, b, c, d, e);
    "rdma_create_srq" => create_srq(a, b, c);
    "rdma_create_srq_ex" => create_srq_ex(a, b);
    "rdma_destroy_srq" => destroy_srq(a);
    "rdma_notify" => notify(a, b);
}
