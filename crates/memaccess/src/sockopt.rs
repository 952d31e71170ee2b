//! The one socket option the daemon needs that neither rustix nor nix wraps. It lives here
//! because this is the daemon's crate for system calls that need `unsafe` (the daemon itself
//! forbids it).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `UDP_NO_CHECK6_RX` (Linux `include/uapi/linux/udp.h`): an IPv6 UDP socket with it set
/// accepts datagrams whose UDP checksum is 0, which a plain socket drops (RFC 8200 8.1
/// forbids them; RFC 6935/6936 allow them to tunnel endpoints that ask). rxe sends every
/// RoCE v2 datagram with checksum 0 (`prepare_udp_hdr`), over IPv6 too, and its own
/// receive socket accepts zero checksums; a softverbs device must as well, or nothing an
/// rxe peer sends over IPv6 arrives (docs/design/roce-wire.md §9, "UDP checksum"). The ICRC
/// still covers the whole transport packet.
pub fn accept_zero_udp6_checksums(sock: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `sock` is an open descriptor for the borrow's length; `on` is a live c_int and
    // the length passed is its size, which is what the kernel reads for this option.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_NO_CHECK6_RX,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
