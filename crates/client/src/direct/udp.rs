//! The net path's socket (docs/design/net-path.md, "Batching"): the context's private socket, bound
//! to the device's address and an ephemeral port. Packets to one destination QP leave in one
//! `sendmsg` with `UDP_SEGMENT` (GSO) to the peer's device port, and what the daemon
//! forwards arrives coalesced (`UDP_GRO`), as the daemon's devices do
//! (`crates/daemon/src/netdev.rs`), so a 64 KiB message is a few system calls on each side
//! instead of one per packet.
//!
//! The ICRC rule is the devices': the kernel gives segment *i* of a GSO send the IPv4
//! identification *i* (an unconnected socket with DF), which the ICRC covers, so each
//! packet's ICRC is computed for its index (and this socket's port) when the batch leaves; a
//! lone datagram has identification 0. A batch holds packets of one destination QP only, so
//! the receiving daemon forwards it as one batch (`crates/daemon/src/netdev/forward.rs`).

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use softverbs_transport::MAX_PACKET;
use softverbs_wire::icrc;
use softverbs_wire::ip::{emit_ip_udp, IpRepr, UdpRepr};

pub(super) use softverbs_wire::gso::MAX_SEGMENTS;
use softverbs_wire::gso::{self, MAX_BATCH_BYTES};

/// The IP header of a packet from `src` to `dst`, if both are of one family.
pub(super) fn ip_repr(src: IpAddr, dst: IpAddr) -> Option<IpRepr> {
    IpRepr::between(src, dst)
}

pub(super) use softverbs_wire::bth::dest_qp_of as dest_qp;

/// Writes the ICRC of `pkt` as sent from `local`:`port` to `to` with IPv4 identification
/// `id`.
fn seal(local: IpAddr, port: u16, to: SocketAddr, id: u16, pkt: &mut [u8]) -> bool {
    let Some(mut ip) = ip_repr(local, to.ip()) else {
        return false;
    };
    if let IpRepr::V4(v4) = &mut ip {
        v4.identification = id;
    }
    let udp = UdpRepr {
        src_port: port,
        dst_port: to.port(),
    };
    let mut hdr = [0u8; 64];
    let Ok(hl) = emit_ip_udp(&ip, &udp, pkt.len(), &mut hdr) else {
        return false;
    };
    icrc::write(&hdr[..hl], pkt).is_ok()
}

/// The socket with its send batch and its receive buffers.
pub(super) struct Udp {
    pub(super) sock: UdpSocket,
    pub(super) local: IpAddr,
    pub(super) port: u16,
    /// The device's port (4791 outside tests): peers' devices listen on it, and forwarded
    /// packets come from it (`DirectAttachResp::net_port`).
    pub(super) dev_port: u16,
    /// False once the kernel refused a GSO send: batches go one datagram at a time.
    gso: bool,
    /// `tx[..used]` is the batch; behind it, room for the packet being built
    /// ([`Udp::stage`]).
    tx: Vec<u8>,
    used: usize,
    lens: Vec<usize>,
    to: Option<SocketAddr>,
    qpn: u32,
    /// One received datagram (a GRO one is at most 64 KiB).
    rx: Vec<u8>,
    /// Room for its control message (the GRO segment size).
    cmsg: Vec<u8>,
}

impl Udp {
    /// Takes `sock` over (nonblocking, coalesced receives unless `SOFTVERBS_NET_GRO=0`);
    /// `dev_port` is the device's port.
    pub(super) fn new(sock: UdpSocket, dev_port: u16) -> io::Result<Udp> {
        sock.set_nonblocking(true)?;
        let at = sock.local_addr()?;
        if std::env::var_os("SOFTVERBS_NET_GRO").is_none_or(|v| v != "0") {
            // Without it every packet is a `recvmsg` of its own; the answer is advisory.
            let _ = nix::sys::socket::setsockopt(
                &sock,
                nix::sys::socket::sockopt::UdpGroSegment,
                &true,
            );
        }
        Ok(Udp {
            sock,
            local: at.ip(),
            port: at.port(),
            dev_port,
            gso: std::env::var_os("SOFTVERBS_GSO").is_none_or(|v| v != "0"),
            tx: vec![0; MAX_BATCH_BYTES + MAX_PACKET],
            used: 0,
            lens: Vec::with_capacity(MAX_SEGMENTS),
            to: None,
            qpn: 0,
            rx: vec![0; 1 << 16],
            cmsg: nix::cmsg_space!(i32),
        })
    }

    /// Room for the next packet, right behind the batch: the engine writes it here.
    pub(super) fn stage(&mut self) -> &mut [u8] {
        &mut self.tx[self.used..self.used + MAX_PACKET]
    }

    /// The staged packet's first `len` bytes.
    pub(super) fn staged(&mut self, len: usize) -> &mut [u8] {
        &mut self.tx[self.used..self.used + len]
    }

    fn fits(&self, to: SocketAddr, qpn: u32, len: usize) -> bool {
        self.to == Some(to) && self.qpn == qpn && gso::joins(&self.lens, self.used, len)
    }

    /// The staged packet (`len` bytes, ICRC slot unwritten) joins the batch for `to`; a
    /// batch it cannot join leaves first.
    pub(super) fn send_staged(&mut self, len: usize, to: SocketAddr) {
        let qpn = dest_qp(&self.tx[self.used..self.used + len]);
        if !self.fits(to, qpn, len) && !self.lens.is_empty() {
            let at = self.used;
            self.flush();
            // `flush` sent `tx[..at]` and left the staged bytes behind it alone.
            self.tx.copy_within(at..at + len, 0);
        }
        self.to = Some(to);
        self.qpn = qpn;
        self.lens.push(len);
        self.used += len;
    }

    /// Sends the batch: one GSO `sendmsg`, or datagram by datagram where GSO is refused.
    /// A full socket buffer loses it, as a congested link would; the engine retransmits.
    pub(super) fn flush(&mut self) {
        let Some(to) = self.to.take() else {
            return;
        };
        let n = self.lens.len();
        if n > 1 && self.gso {
            self.seal_all(to, true);
            match self.gso_send(to) {
                Ok(()) => return self.clear(),
                Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::ECONNREFUSED) => {
                    return self.clear()
                }
                // EIO (no checksum offload on the route), EINVAL, ENOPROTOOPT: stop trying.
                Err(_) => self.gso = false,
            }
        }
        self.seal_all(to, false);
        let mut off = 0;
        for &l in &self.lens {
            let _ = self.sock.send_to(&self.tx[off..off + l], to);
            off += l;
        }
        self.clear();
    }

    fn clear(&mut self) {
        self.used = 0;
        self.lens.clear();
        self.to = None;
    }

    fn seal_all(&mut self, to: SocketAddr, ids_count_up: bool) {
        let mut off = 0;
        for (i, &l) in self.lens.iter().enumerate() {
            let id = if ids_count_up { i as u16 } else { 0 };
            seal(self.local, self.port, to, id, &mut self.tx[off..off + l]);
            off += l;
        }
    }

    fn gso_send(&self, to: SocketAddr) -> Result<(), nix::errno::Errno> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrStorage};
        let seg = self.lens[0] as u16;
        let addr = SockaddrStorage::from(to);
        let iov = [io::IoSlice::new(&self.tx[..self.used])];
        let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
        sendmsg(
            self.sock.as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::empty(),
            Some(&addr),
        )
        .map(|_| ())
    }

    /// Sends one packet alone, its ICRC written here (identification 0).
    pub(super) fn send_one(&self, pkt: &mut [u8], to: SocketAddr) {
        if seal(self.local, self.port, to, 0, pkt) {
            let _ = self.sock.send_to(pkt, to);
        }
    }

    /// Hands the packets of the datagrams waiting to `f` (packet, sender, index in its
    /// coalesced datagram, which is the identification to try first); true if any came.
    /// With `stop`, ends after a datagram for which `f` said true. One `recvmsg` per
    /// datagram, into buffers kept here: an empty poll allocates nothing.
    pub(super) fn receive(
        &mut self,
        stop: bool,
        mut f: impl FnMut(&[u8], SocketAddr, u16) -> bool,
    ) -> bool {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrStorage};
        let mut any = false;
        let mut done = false;
        while !done {
            let (len, seg, from) = {
                let mut iov = [io::IoSliceMut::new(&mut self.rx)];
                let msg = match recvmsg::<SockaddrStorage>(
                    self.sock.as_raw_fd(),
                    &mut iov,
                    Some(&mut self.cmsg),
                    MsgFlags::MSG_DONTWAIT,
                ) {
                    Ok(m) => m,
                    // An ICMP unreachable for an earlier send, or a signal: ask again.
                    Err(nix::errno::Errno::ECONNREFUSED) | Err(nix::errno::Errno::EINTR) => {
                        continue
                    }
                    Err(_) => return any,
                };
                let len = msg.bytes;
                let mut seg = len;
                if let Ok(cmsgs) = msg.cmsgs() {
                    for c in cmsgs {
                        if let ControlMessageOwned::UdpGroSegments(s) = c {
                            seg = usize::try_from(s).unwrap_or(len).clamp(1, len.max(1));
                        }
                    }
                }
                let from = msg.address.and_then(|a| {
                    a.as_sockaddr_in()
                        .map(|v4| SocketAddr::from(std::net::SocketAddrV4::from(*v4)))
                        .or_else(|| {
                            a.as_sockaddr_in6()
                                .map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6)))
                        })
                });
                (len, seg, from)
            };
            any = true;
            let Some(from) = from.filter(|_| len > 0) else {
                continue;
            };
            for (i, p) in self.rx[..len].chunks(seg.max(1)).enumerate() {
                done |= f(p, from, i as u16) && stop;
            }
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_wire::ip::{IpRepr, Ipv4Repr};

    /// A RoCE-shaped packet: BTH with destination QP `qpn`, `len` bytes with the ICRC slot.
    fn packet(qpn: u32, len: usize, fill: u8) -> Vec<u8> {
        let mut p = vec![fill; len];
        p[0] = 0x04; // RC SEND Only
        p[4] = 0;
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p
    }

    /// What the wire carries is what a receiver that knows each packet's identification
    /// checks: a GSO batch's packet *i* has an ICRC for identification *i* exactly (no
    /// search), a lone packet for 0; and a batch ends where the destination QP changes.
    #[test]
    fn each_segment_carries_the_icrc_of_its_identification() {
        let rx = UdpSocket::bind("127.0.77.2:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let to = rx.local_addr().unwrap();
        let tx = UdpSocket::bind("127.0.77.1:0").unwrap();
        let mut u = Udp::new(tx, to.port()).unwrap();
        // Three of QP 7 (one GSO send), then one of QP 8 (a batch of its own).
        let sent = [
            packet(7, 1000, 1),
            packet(7, 1000, 2),
            packet(7, 600, 3),
            packet(8, 1000, 4),
        ];
        for p in &sent {
            u.stage()[..p.len()].copy_from_slice(p);
            u.send_staged(p.len(), to);
        }
        u.flush();
        let mut buf = vec![0u8; 2048];
        let mut got = Vec::new();
        for _ in 0..sent.len() {
            let (n, from) = rx.recv_from(&mut buf).unwrap();
            got.push((buf[..n].to_vec(), from));
        }
        let ids = [0u16, 1, 2, 0];
        for (i, ((p, from), id)) in got.iter().zip(ids).enumerate() {
            assert_eq!(
                &p[..p.len() - 4],
                &sent[i][..sent[i].len() - 4],
                "packet {i}"
            );
            let (IpAddr::V4(s), IpAddr::V4(d)) = (from.ip(), to.ip()) else {
                unreachable!()
            };
            let mut v4 = Ipv4Repr::new(s, d);
            v4.identification = id;
            let udp = UdpRepr {
                src_port: from.port(),
                dst_port: to.port(),
            };
            let mut hdr = [0u8; 64];
            let hl = emit_ip_udp(&IpRepr::V4(v4), &udp, p.len(), &mut hdr).unwrap();
            assert!(
                icrc::verify(&hdr[..hl], p).is_ok(),
                "packet {i}: ICRC for identification {id}"
            );
        }
    }

    /// What the net path's socket sends, read on a raw socket with the IP header it had on
    /// the wire: every datagram's ICRC checks out exactly over that header (no window, no
    /// solving), whatever identification the kernel gave it. In a network namespace of the
    /// test's own with `lo`'s UDP segmentation offload off, so GSO sends reach the raw
    /// socket cut into their datagrams, as on a NIC without it. Needs root and ethtool.
    #[test]
    fn the_wire_carries_the_icrc_of_the_header_it_has() {
        use nix::sys::socket as ns;
        use std::os::fd::AsRawFd;
        let root = rustix::process::geteuid().is_root();
        let tools = ["ip", "ethtool"].iter().all(|t| {
            std::process::Command::new(t)
                .arg("-V")
                .output()
                .is_ok_and(|o| o.status.success())
        });
        if !root || !tools {
            eprintln!("skipped: needs root, ip and ethtool");
            return;
        }
        let sh = |cmd: &str, args: &[&str]| {
            let st = std::process::Command::new(cmd).args(args).status().unwrap();
            assert!(st.success(), "{cmd} {args:?}");
        };
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            sh("ip", &["link", "set", "lo", "up"]);
            sh("ethtool", &["-K", "lo", "tx-udp-segmentation", "off"]);
            let raw = ns::socket(
                ns::AddressFamily::Inet,
                ns::SockType::Raw,
                ns::SockFlag::empty(),
                ns::SockProtocol::Udp,
            )
            .unwrap();
            ns::bind(raw.as_raw_fd(), &ns::SockaddrIn::new(127, 0, 77, 2, 0)).unwrap();
            let raw = UdpSocket::from(raw);
            raw.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            let rx = UdpSocket::bind("127.0.77.2:0").unwrap();
            let to = rx.local_addr().unwrap();
            let tx = UdpSocket::bind("127.0.77.1:0").unwrap();
            let mut u = Udp::new(tx, to.port()).unwrap();
            let sent = [
                packet(7, 1000, 1),
                packet(7, 1000, 2),
                packet(7, 600, 3),
                packet(8, 1000, 4),
            ];
            for p in &sent {
                u.stage()[..p.len()].copy_from_slice(p);
                u.send_staged(p.len(), to);
            }
            u.flush();
            // A lone datagram by itself (GSO unused): identification 0 too.
            u.gso = false;
            let p = packet(9, 300, 5);
            u.stage()[..p.len()].copy_from_slice(&p);
            u.send_staged(p.len(), to);
            u.flush();
            let mut buf = vec![0u8; 4096];
            let mut ids = Vec::new();
            while ids.len() < sent.len() + 1 {
                let n = raw.recv(&mut buf).unwrap();
                let d = &buf[..n];
                let dport = u16::from_be_bytes([d[22], d[23]]);
                if dport != to.port() {
                    continue;
                }
                icrc::verify_datagram(d).unwrap();
                ids.push(u16::from_be_bytes([d[4], d[5]]));
            }
            assert_eq!(ids, [0, 1, 2, 0, 0]);
        })
        .join()
        .unwrap();
    }
}
