//! A softverbs device's network side: RoCE v2 over a UDP socket bound to the device's IP
//! address and port 4791 (Annex A17), with the ICRC computed and checked over the IP and UDP
//! headers the kernel puts on the wire, optional fault injection (this machine has no netem)
//! and an optional pcap capture.
//!
//! Multicast (`crate::mcast`, `docs/design/roce-wire.md` §8): a device sends a datagram for a
//! multicast GID to the group's address from its unicast socket, out of its own interface
//! (`IP_MULTICAST_IF` / `IPV6_MULTICAST_IF`) and looped back to this host
//! (`IP_MULTICAST_LOOP`), so another daemon on the same host sees it as a NIC on the same
//! segment would. It receives a group on a socket of its own per group, bound to the
//! group's address and port 4791 with `SO_REUSEADDR` (every daemon of the host may bind it),
//! joined on the device's interface (`IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP`) and taking
//! only the groups it joined itself (`IP_MULTICAST_ALL` off): [`NetDev::join`] when the
//! device's first QP attaches, [`NetDev::leave`] (the socket closes) when its last detaches.
//!
//! **The net path (`forward.rs`, docs/design/net-path.md).** The device socket is a plain socket
//! (no `SO_REUSEPORT`, no `SO_REUSEADDR`): no other socket of any uid can bind the device's
//! address and port while the daemon holds it, so nothing but the daemon receives, steers or
//! filters what peers send there (issue 35, item 1). A context whose QP runs its engine in
//! the library gets a private socket of its own ([`NetDev::open_net_socket`]: the device's
//! address, an ephemeral port), which it sends from; the packets peers send its QPs arrive
//! here and are forwarded to it ([`NetDev::forward_qp`], `forward.rs`) after their ICRC and
//! their source are checked.
//!
//! The kernel builds the IP/UDP headers, so the ICRC must be computed over what it will
//! emit. With an unconnected socket and `IP_PMTUDISC_DO`, Linux sends IPv4 with DF set and
//! identification 0 (`ip_select_ident_segs`); TOS, TTL and the checksums are masked out of
//! the ICRC, the identification is not (docs/design/roce-wire.md). The UDP source port is the bound
//! port (4791) for every QP: one socket cannot vary it, so there is no per-QP ECMP entropy.
//!
//! **Batching (docs/performance.md "UDP batching").** Packets to one peer and one destination
//! QP (a receiving host's forwarder looks at each packet, but a batch per QP keeps what it
//! forwards one batch too) queue up and leave in one `sendmsg` with `UDP_SEGMENT` (GSO): up to 64 segments of one size (the
//! last may be shorter) and at most 64 KiB. The kernel gives segment *i* of such a send the IPv4
//! identification *i* (base 0: DF on an unconnected socket; `inet_gso_segment` counts up),
//! so each segment's ICRC is computed with identification *i* — what any receiver that sees
//! the wire (tshark, a NIC, rxe) checks. Where GSO is refused the batch goes by `sendmmsg`,
//! every datagram with identification 0. The receive side asks for `UDP_GRO` and splits what arrives by the segment size the kernel
//! reports, or takes each datagram whole where it reports none. A UDP socket never shows the
//! identification, so the receiver solves the ICRC for it (`icrc::check_received`) and takes
//! the packet if it is one a softverbs sender uses (0..64; the same 64 ICRC values as trying
//! each, 2^-26 of undetected corruption instead of 2^-32), or any from a peer in
//! `[icrc] solve_ip_id_peers` (kernel rxe, NICs: a 16-bit check). **Where the daemon may,
//! an IPv4 device receives on a raw socket instead** (`raw.rs`): the header is seen and every
//! ICRC checked exactly (docs/design/roce-wire.md §6).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use softverbs_core::device::Gid;
use softverbs_transport::faults::{FaultInjector, Faults, NetStats};
use softverbs_transport::{Reject, RxMeta, Transmit};
use softverbs_wire::bth::dest_qp_of as dest_qp;
use softverbs_wire::icrc;
use softverbs_wire::ip::{emit_ip_udp, IpRepr, UdpRepr};

use crate::capture::Capture;

mod forward;
pub use forward::{Forward, ForwardStats};
mod policy;
pub use policy::{Cidr, IcrcPolicy, IpHeader};
mod raw;

pub use softverbs_wire::gso::MAX_SEGMENTS;
use softverbs_wire::gso::{self, MAX_BATCH_BYTES};

/// Datagrams one `recvmmsg` may take.
const RX_DATAGRAMS: usize = 8;

/// Room for one received datagram: a GRO one is at most 64 KiB.
const RX_DATAGRAM: usize = 1 << 16;

/// What the batching did, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// `sendmsg` calls with `UDP_SEGMENT`.
    pub gso_sends: u64,
    /// Datagrams they carried.
    pub gso_segments: u64,
    /// `sendmmsg` calls (GSO refused, or unavailable).
    pub mmsg_sends: u64,
    /// Datagrams received coalesced by GRO, more than one per `recvmsg` (on the raw path:
    /// segments of GSO sends that arrived whole, raw.rs).
    pub gro_segments: u64,
    /// `recvmsg` calls that returned more than one segment (on the raw path: datagrams).
    pub gro_recvs: u64,
    /// Received packets whose ICRC matched only with another identification than their
    /// index in what arrived (segmented before the receiver, or coalesced differently).
    pub id_searches: u64,
}

/// Packets queued for one destination, back to back, ICRC slots not yet written.
struct TxBatch {
    /// `buf[..used]` is the batch; behind it, room for one more packet
    /// ([`NetDev::stage`]), so the buffer is never reallocated nor zeroed while sending.
    buf: Vec<u8>,
    used: usize,
    /// Each packet's length (all equal but the last).
    lens: Vec<usize>,
    to: Option<SocketAddr>,
    /// The first packet's destination QP: every packet of a batch has it, so the receiving
    /// host's forwarder (forward.rs) passes a batch on whole.
    qpn: u32,
}

/// A coalesced datagram being handed out segment by segment.
struct RxBatch {
    /// [`RX_DATAGRAMS`] slots of [`RX_DATAGRAM`] bytes, one per datagram of a `recvmmsg`.
    buf: Vec<u8>,
    /// The datagrams of the last `recvmmsg` not yet handed out: (offset, length, segment
    /// size, sender, IP + UDP header length). The raw path (raw.rs) leaves the header in
    /// front of the offset and the segment size 0, found at the first segment.
    queued: std::collections::VecDeque<(usize, usize, usize, SocketAddr, usize)>,
    /// The last `recvmmsg` returned fewer datagrams than it had room for: the socket was
    /// empty then, so once `queued` is used up the next receive reports none without a call.
    drained: bool,
    /// The datagram being handed out is `buf[off..len]`.
    len: usize,
    seg: usize,
    off: usize,
    index: u16,
    from: SocketAddr,
    /// The raw path's IP + UDP header length (at `start - hdr`), 0 on the UDP path.
    hdr: usize,
    /// Where the datagram's payload starts (the raw path's header is right before it).
    start: usize,
    /// The raw path found the first segment's ICRC good while finding the segment size.
    first_ok: bool,
}

/// Where [`NetDev::recv_any`] left a packet: in the receive batch (offset, length) or in the
/// caller's buffer (a group socket's).
enum Rx {
    Batch(usize, usize),
    Buf(usize),
}

/// The UDP side of one device.
pub struct NetDev {
    sock: UdpSocket,
    /// The raw receive socket (raw.rs), when the device reads IP headers.
    raw: Option<UdpSocket>,
    local: IpAddr,
    port: u16,
    faults: Option<FaultInjector>,
    held: Option<(Vec<u8>, SocketAddr)>,
    capture: Option<Capture>,
    /// Counters (`sent`, `delivered`, `rejected` and the injector's).
    pub stats: NetStats,
    /// Datagrams whose ICRC did not check out (part of `stats.rejected`): the port's
    /// `rx_icrc_errors` (docs/guide/counters.md).
    pub icrc_errors: u64,
    /// Datagrams rejected (part of `icrc_errors`) whose ICRC would check out with an IPv4
    /// identification outside the window a softverbs sender uses: most likely a kernel rxe
    /// or NIC peer's good packets, which `[icrc] solve_ip_id_peers` would accept.
    pub icrc_id_unseen: u64,
    /// Datagrams accepted from a `solve_ip_id_peers` peer with an identification outside
    /// that window, solved for (docs/design/roce-wire.md §6).
    pub icrc_solved: u64,
    /// What this socket rejected before any engine (a bad ICRC, a datagram that cannot be
    /// a RoCE v2 packet) and what the daemon rejected for it ([`reject`](Self::reject)):
    /// part of the port's `rx_drop_*` counters (docs/guide/counters.md).
    pub rejects: softverbs_transport::Rejects,
    /// What the batching did.
    pub batch: BatchStats,
    /// The ICRC settings (`[icrc]`).
    policy: IcrcPolicy,
    /// When the `icrc_id_unseen` hint was last logged, per peer (bounded).
    hinted: HashMap<IpAddr, Instant>,
    hdr: [u8; 48],
    /// One socket per multicast group the device joined, by group address.
    groups: HashMap<IpAddr, UdpSocket>,
    /// Group sockets made since the event loop last asked ([`NetDev::take_new_fds`]).
    new_fds: Vec<RawFd>,
    tx: TxBatch,
    /// False once the kernel refused a GSO send: batches go by `sendmmsg` from then on.
    gso: bool,
    rx: RxBatch,
    /// False once a [`recv`](Self::recv) found every socket of the device empty, until the
    /// event loop reports it readable again ([`mark_readable`](Self::mark_readable)).
    readable: bool,
    /// The net path's QPs and where their packets go (forward.rs).
    forward: forward::Forwarder,
}

/// The index of the interface that holds IPv6 address `ip`, from `/proc/net/if_inet6`
/// (IPv6 multicast options name interfaces by index, not by address).
fn ipv6_ifindex(ip: Ipv6Addr) -> io::Result<u32> {
    let want: String = ip.octets().iter().map(|b| format!("{b:02x}")).collect();
    let table = std::fs::read_to_string("/proc/net/if_inet6")?;
    table
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?, f.next()?))
        })
        .find(|(addr, _)| *addr == want)
        .and_then(|(_, idx)| u32::from_str_radix(idx, 16).ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface has {ip}")))
}

/// Sends multicast out of the device's own interface and back to this host's other sockets.
fn set_multicast_send(sock: &UdpSocket, ip: IpAddr) -> io::Result<()> {
    let s = socket2::SockRef::from(sock);
    match ip {
        IpAddr::V4(v4) => {
            s.set_multicast_if_v4(&v4)?;
            s.set_multicast_loop_v4(true)
        }
        IpAddr::V6(v6) => {
            s.set_multicast_if_v6(ipv6_ifindex(v6)?)?;
            s.set_multicast_loop_v6(true)
        }
    }
}

/// A socket receiving group `group` on the interface of `local`, port `port`.
fn group_socket(group: IpAddr, local: IpAddr, port: u16) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if group.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    match (group, local) {
        (IpAddr::V4(g), IpAddr::V4(l)) => {
            s.join_multicast_v4(&g, &l)?;
            s.set_multicast_all_v4(false)?;
        }
        (IpAddr::V6(g), IpAddr::V6(l)) => {
            s.set_only_v6(true)?;
            s.join_multicast_v6(&g, ipv6_ifindex(l)?)?;
            s.set_multicast_all_v6(false)?;
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "group and device address of different families",
            ))
        }
    }
    s.bind(&SocketAddr::new(group, port).into())?;
    s.set_nonblocking(true)?;
    let sock: UdpSocket = s.into();
    size_socket_buffers(&sock);
    Ok(sock)
}

/// A UDP socket bound to `addr`, nonblocking; no `SO_REUSEPORT` or `SO_REUSEADDR`, so no
/// other socket can share its address and port.
fn bound_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// The IP header the kernel puts on a datagram from `src` to `dst`.
fn ip_repr(src: IpAddr, dst: IpAddr) -> Option<IpRepr> {
    IpRepr::between(src, dst)
}

/// Socket buffer the device asks for: a full window of a few QPs (64 WQEs of 64 KiB is
/// 4 MiB) must fit, or a burst overflows the default ~200 KiB and every packet past it is
/// lost, which RC then has to recover by timeout.
const SOCKET_BUFFER: usize = 8 << 20;

/// What the device socket and the net path's sockets share: `IP_PMTUDISC_DO` on IPv4 (DF set and
/// identification 0, which the ICRC covers), on IPv6 accepting datagrams with UDP checksum 0
/// (what rxe sends; docs/design/roce-wire.md §9), and large buffers.
fn socket_options(sock: &UdpSocket, ip: IpAddr) -> io::Result<()> {
    use std::os::fd::AsFd;
    if ip.is_ipv4() {
        rustix::net::sockopt::set_ip_mtu_discover(
            sock,
            rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
        )?;
    } else {
        softverbs_memaccess::accept_zero_udp6_checksums(sock.as_fd())?;
    }
    size_socket_buffers(sock);
    Ok(())
}

/// Grows the socket's buffers; as root the `_FORCE` variants pass `net.core.rmem_max`.
/// Failure only costs throughput, so it is logged, not returned.
fn size_socket_buffers(sock: &UdpSocket) {
    use rustix::net::sockopt as so;
    if so::set_socket_recv_buffer_size_force(sock, SOCKET_BUFFER).is_err() {
        let _ = so::set_socket_recv_buffer_size(sock, SOCKET_BUFFER);
    }
    if so::set_socket_send_buffer_size_force(sock, SOCKET_BUFFER).is_err() {
        let _ = so::set_socket_send_buffer_size(sock, SOCKET_BUFFER);
    }
    tracing::debug!(
        recv = so::socket_recv_buffer_size(sock).unwrap_or(0),
        send = so::socket_send_buffer_size(sock).unwrap_or(0),
        "udp socket buffers"
    );
}

impl NetDev {
    /// Binds `ip`:`port` (port is 4791 outside tests; 0 picks one), a plain socket: while
    /// the daemon holds it no other socket binds the address and port (`EADDRINUSE`), so
    /// the device alone receives what peers send it (issue 35, item 1).
    pub fn bind(ip: IpAddr, port: u16) -> io::Result<NetDev> {
        let sock = bound_socket(SocketAddr::new(ip, port))?;
        socket_options(&sock, ip)?;
        if let Err(e) = set_multicast_send(&sock, ip) {
            // Unicast is unaffected; multicast then leaves by the routing table's choice.
            tracing::warn!(addr = %ip, "multicast send options: {e}");
        }
        // Coalesced receives; without them every datagram is one recvmsg, as before.
        let _ =
            nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::UdpGroSegment, &true);
        let port = sock.local_addr()?.port();
        let gso = std::env::var_os("SOFTVERBS_GSO").is_none_or(|v| v != "0");
        Ok(NetDev {
            sock,
            raw: None,
            local: ip,
            port,
            faults: None,
            held: None,
            capture: None,
            stats: NetStats::default(),
            icrc_errors: 0,
            icrc_id_unseen: 0,
            icrc_solved: 0,
            rejects: Default::default(),
            batch: BatchStats::default(),
            policy: IcrcPolicy::default(),
            hinted: HashMap::new(),
            hdr: [0; 48],
            tx: TxBatch {
                buf: vec![0; MAX_BATCH_BYTES + softverbs_transport::MAX_PACKET],
                used: 0,
                lens: Vec::with_capacity(MAX_SEGMENTS),
                to: None,
                qpn: 0,
            },
            gso,
            rx: RxBatch {
                buf: vec![0; RX_DATAGRAMS * RX_DATAGRAM],
                queued: std::collections::VecDeque::with_capacity(RX_DATAGRAMS),
                drained: false,
                len: 0,
                seg: 0,
                off: 0,
                index: 0,
                from: SocketAddr::new(ip, 0),
                hdr: 0,
                start: 0,
                first_ok: false,
            },
            groups: HashMap::new(),
            new_fds: Vec::new(),
            readable: true,
            forward: forward::Forwarder::new(gso),
        })
    }

    /// Sets how received ICRCs are checked: which peers' packets may carry any IPv4
    /// identification, and whether an IPv4 device reads the real IP header on a raw socket
    /// (raw.rs; `Auto` does when it may, `Raw` fails when it may not). An IPv6 device has
    /// no identification to read and stays on its UDP socket. Call before receiving.
    pub fn set_icrc_policy(&mut self, policy: IcrcPolicy) -> io::Result<()> {
        let want = match (policy.ip_header, self.local) {
            (IpHeader::Udp, _) | (_, IpAddr::V6(_)) => false,
            (IpHeader::Raw | IpHeader::Auto, IpAddr::V4(_)) => true,
        };
        self.policy = policy;
        if !want || self.raw.is_some() {
            return Ok(());
        }
        let IpAddr::V4(v4) = self.local else {
            return Ok(());
        };
        match raw::open(v4, self.port).and_then(|r| {
            raw::drop_all(&self.sock)?;
            Ok(r)
        }) {
            Ok(r) => {
                // GRO would coalesce datagrams under one IP header before the raw socket
                // sees them: off, on a socket that no longer reads anyway.
                let _ = nix::sys::socket::setsockopt(
                    &self.sock,
                    nix::sys::socket::sockopt::UdpGroSegment,
                    &false,
                );
                self.raw = Some(r);
                Ok(())
            }
            Err(e) if self.policy.ip_header == IpHeader::Auto => {
                tracing::info!(
                    addr = %self.local,
                    "no raw socket ({e}): receiving on the UDP socket, IPv4 identifications unseen"
                );
                Ok(())
            }
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("ip_header = \"raw\": raw socket for {}: {e}", self.local),
            )),
        }
    }

    /// Where the device reads what it receives: `"raw"` (IP headers seen, every ICRC
    /// checked exactly) or `"udp"` (`softverbs status`).
    pub fn rx_mode(&self) -> &'static str {
        if self.raw.is_some() {
            "raw"
        } else {
            "udp"
        }
    }

    /// Whether a [`recv`](Self::recv) may find a packet: false from the receive that found
    /// the device's sockets empty until [`mark_readable`](Self::mark_readable). An event loop
    /// that watches the sockets edge-triggered (epoll(7) `EPOLLET`: every datagram queued
    /// raises an event) skips the empty `recvmsg` of every round that way.
    pub fn may_have_packets(&self) -> bool {
        self.readable || self.rx.off < self.rx.len || !self.rx.queued.is_empty()
    }

    /// The event loop saw one of the device's sockets (its own or a group's) readable. That
    /// may be a datagram that came after the last `recvmmsg` found the socket empty, while its
    /// datagrams were still being handed out: the next receive after them asks the kernel.
    pub fn mark_readable(&mut self) {
        self.readable = true;
        self.rx.drained = false;
    }

    /// Joins multicast group `mgid` on the device's interface (its first QP attached).
    pub fn join(&mut self, mgid: Gid) -> io::Result<()> {
        let group = mgid.to_ip();
        if self.groups.contains_key(&group) {
            return Ok(());
        }
        let sock = group_socket(group, self.local, self.port)?;
        self.new_fds.push(sock.as_raw_fd());
        self.groups.insert(group, sock);
        Ok(())
    }

    /// Leaves group `mgid` (its last QP detached): closing the socket drops the membership.
    pub fn leave(&mut self, mgid: Gid) {
        self.groups.remove(&mgid.to_ip());
    }

    /// Whether this device has joined group `mgid`.
    pub fn has_joined(&self, mgid: Gid) -> bool {
        self.groups.contains_key(&mgid.to_ip())
    }

    /// Sockets made by [`join`](Self::join) since the last call, for the event loop to
    /// watch (a closed socket leaves the loop's epoll set by itself).
    pub fn take_new_fds(&mut self) -> Vec<RawFd> {
        std::mem::take(&mut self.new_fds)
    }

    /// Sends batches by `sendmmsg` only, as when the kernel refuses GSO (`SOFTVERBS_GSO=0`
    /// does the same for a daemon).
    pub fn disable_gso(&mut self) {
        self.gso = false;
    }

    /// Injects `faults` into what this device sends, seeded.
    pub fn inject(&mut self, faults: Faults, seed: u64) {
        self.faults = Some(FaultInjector::new(faults, seed));
    }

    /// Records every datagram this socket sends and receives in `capture` (a received one
    /// the daemon rejects only in the capture's mode that keeps them, marked:
    /// [`verdict`](Self::verdict)), and what [`record_local`](Self::record_local) is given.
    pub fn capture_to(&mut self, capture: Capture) {
        self.capture = Some(capture);
    }

    /// The capture, if the device records one.
    pub fn capture(&mut self) -> Option<&mut Capture> {
        self.capture.as_mut()
    }

    /// Records the engine's packet `pkt` (BTH through the ICRC slot) from this device's
    /// address to `dst`, an address of this daemon, as the RoCE v2 datagram it would have
    /// been on a wire: the headers [`send`](Self::send) would put around it, the ICRC
    /// computed over them (IBA 7.8.1 as the RoCE v2 Annex A17 adapts it; no socket carries
    /// it, so the engine's slot was never written).
    pub fn record_local(&mut self, dst: IpAddr, pkt: &[u8]) {
        self.record_sealed(self.local, dst, pkt);
    }

    /// [`record_local`](Self::record_local) for a packet from `src`, another address of
    /// this daemon, to this device's address.
    pub fn record_local_received(&mut self, src: IpAddr, pkt: &[u8]) {
        self.record_sealed(src, self.local, pkt);
    }

    /// The engine's verdict on the packet this socket last handed out (`None`: taken), for
    /// the capture: a rejected packet is written with its reason, or left out, as the
    /// capture's mode says (docs/guide/capture.md). The engine counted it already.
    pub fn verdict(&mut self, why: Option<Reject>) {
        if let Some(c) = &mut self.capture {
            c.verdict(why);
        }
    }

    /// The daemon rejected the packet this socket last handed out, for `why`: counted
    /// (the engine never saw it) and judged so in the capture.
    pub fn reject(&mut self, why: Reject) {
        self.rejects.count(why);
        self.verdict(Some(why));
    }

    /// Whether this socket's traffic is recorded.
    pub fn captures(&self) -> bool {
        self.capture.is_some()
    }

    /// When the capture must be flushed, if it holds packets not yet written.
    pub fn capture_due(&self) -> Option<Instant> {
        self.capture.as_ref().and_then(Capture::due)
    }

    fn record_sealed(&mut self, src: IpAddr, dst: IpAddr, pkt: &[u8]) {
        if self.capture.is_none() {
            return;
        }
        let Some(ip) = ip_repr(src, dst) else {
            return;
        };
        // Every device of a deployment sends from and to the same port.
        let udp = self.udp_out();
        let Ok(hl) = emit_ip_udp(&ip, &udp, pkt.len(), &mut self.hdr) else {
            return;
        };
        let mut sealed = pkt.to_vec();
        if icrc::write(&self.hdr[..hl], &mut sealed).is_ok() {
            self.record(&ip, &udp, &sealed);
        }
    }

    /// The device's address.
    pub fn local(&self) -> IpAddr {
        self.local
    }

    /// The device's UDP port (the one bound, where [`bind`](Self::bind) was given 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket it receives on, to register with an event loop (the raw one, when the
    /// device has it: the UDP socket then takes nothing).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.raw.as_ref().unwrap_or(&self.sock).as_fd()
    }

    /// A private socket for a context that runs net-path QPs (docs/design/net-path.md): bound to
    /// the device's address and an ephemeral port, nonblocking, no member of any group, with
    /// the device socket's options. The daemon keeps the first (so the port stays the
    /// context's until the context closes, even after its process died) and gives the
    /// second, a duplicate, to the library; the address is where
    /// [`forward_qp`](Self::forward_qp) sends the QPs' packets.
    pub fn open_net_socket(&self) -> io::Result<(UdpSocket, OwnedFd, SocketAddr)> {
        let sock = bound_socket(SocketAddr::new(self.local, 0))?;
        socket_options(&sock, self.local)?;
        let addr = sock.local_addr()?;
        let fd = OwnedFd::from(sock.try_clone()?);
        Ok((sock, fd, addr))
    }

    /// QP `qpn`'s packets go to `to` (a socket of [`open_net_socket`](Self::open_net_socket))
    /// from now on, those from its path peer `peer` only; others are dropped.
    pub fn forward_qp(&mut self, qpn: u32, peer: Gid, to: SocketAddr) {
        self.forward.add(qpn, peer, to);
    }

    /// While `on`, requests for net-path QP `qpn` come out of [`NetDev::recv_ref`] as well as
    /// going on to its library (which does not run: `DataPath::net_watch`).
    pub fn hold_qp(&mut self, qpn: u32, on: bool) {
        self.forward.hold(qpn, on);
    }

    /// The library behind socket `to` publishes when it last ran in `region` (its net
    /// status region): a request forwarded there while that stamp is older than `STALE` at
    /// the clock of [`set_clock`](Self::set_clock) comes out of [`NetDev::recv_ref`] as
    /// well, as if held (docs/design/net-path.md, "Stalls").
    pub fn stamp_from(&mut self, to: SocketAddr, region: std::sync::Arc<softverbs_shm::Region>) {
        self.forward.stamp_from(to, region);
    }

    /// `CLOCK_MONOTONIC` ns of the caller's current round, for [`stamp_from`](Self::stamp_from).
    pub fn set_clock(&mut self, now: u64) {
        self.forward.set_clock(now);
    }

    /// QP `qpn`'s packets reach the device's engine again.
    pub fn unforward_qp(&mut self, qpn: u32) {
        self.forward.remove(qpn);
    }

    /// No QP's packets go to `to` any more (its context closed).
    pub fn unforward_to(&mut self, to: SocketAddr) {
        self.forward.remove_to(to);
    }

    /// QPs whose packets are forwarded.
    pub fn forwarded_qps(&self) -> usize {
        self.forward.len()
    }

    /// What the forwarding did.
    pub fn forward_stats(&self) -> ForwardStats {
        self.forward.stats
    }

    /// Whether the device injects faults or captures: both see only what its own socket
    /// carries, so none of its QPs is handed to a library (docs/design/net-path.md).
    pub fn taps(&self) -> bool {
        self.faults.is_some() || self.capture.is_some()
    }

    fn record(&mut self, ip: &IpRepr, udp: &UdpRepr, pkt: &[u8]) {
        // (`ip` carries the identification the packet has on the wire.)
        if let Some(c) = &mut self.capture {
            c.record(ip, udp, pkt);
        }
    }

    /// Sends the engine's packet `pkt` (BTH through the ICRC slot) as described by `tx`:
    /// queued into the batch for its destination (call [`flush`](Self::flush) when the
    /// engine has nothing more to send), or with fault injection on, at once with its ICRC.
    /// Packets to an address of another family are dropped.
    pub fn send(&mut self, tx: &Transmit, pkt: &mut [u8]) -> io::Result<()> {
        let dst_ip = tx.dgid.to_ip();
        let Some(ip) = ip_repr(self.local, dst_ip) else {
            return Ok(());
        };
        // Every device of a deployment listens on the same port (4791 outside tests).
        let to = SocketAddr::new(dst_ip, self.port);
        if self.faults.is_none() {
            if pkt.len() > softverbs_transport::MAX_PACKET {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "packet longer than MAX_PACKET",
                ));
            }
            let qpn = dest_qp(pkt);
            if !self.fits(to, pkt.len(), qpn) {
                self.flush()?;
            }
            let at = self.tx.used;
            self.tx.buf[at..at + pkt.len()].copy_from_slice(pkt);
            self.queue(to, pkt.len(), qpn);
            return Ok(());
        }
        let udp = self.udp_out();
        let hl = emit_ip_udp(&ip, &udp, pkt.len(), &mut self.hdr).map_err(io::Error::other)?;
        icrc::write(&self.hdr[..hl], pkt).map_err(io::Error::other)?;
        self.record(&ip, &udp, pkt);
        let Some(faults) = &mut self.faults else {
            return Ok(());
        };
        // Decide every copy first (the injector's order: copies, then damage and hold per
        // copy), then send. One packet at most is held back; it goes after the next one.
        let mut copies = Vec::with_capacity(2);
        for _ in 0..faults.copies(&mut self.stats) {
            let mut out = pkt.to_vec();
            faults.damage(&mut out, &mut self.stats);
            let can_hold = self.held.is_none() && copies.iter().all(|(_, held)| !held);
            let hold = can_hold && faults.hold(&mut self.stats).is_some();
            copies.push((out, hold));
        }
        for (out, hold) in copies {
            if hold {
                self.held = Some((out, to));
                continue;
            }
            self.raw_send(&out, to)?;
            if let Some((late, to)) = self.held.take() {
                self.raw_send(&late, to)?;
            }
        }
        Ok(())
    }

    /// Whether a packet of `len` bytes for `to` and destination QP `qpn` joins the batch
    /// queued. A batch is for one destination QP, so a receiving forwarder (forward.rs)
    /// passes it on as one batch.
    fn fits(&self, to: SocketAddr, len: usize, qpn: u32) -> bool {
        let b = &self.tx;
        b.to == Some(to) && b.qpn == qpn && gso::joins(&b.lens, b.used, len)
    }

    /// Counts the `len` bytes at `buf[used..]` (destination QP `qpn`) into the batch for `to`.
    fn queue(&mut self, to: SocketAddr, len: usize, qpn: u32) {
        if self.tx.lens.is_empty() {
            self.tx.qpn = qpn;
        }
        self.tx.to = Some(to);
        self.tx.lens.push(len);
        self.tx.used += len;
    }

    /// Whether the engine may write packets straight into the batch ([`stage`](Self::stage)):
    /// not with fault injection on, which sends each packet alone.
    pub fn can_stage(&self) -> bool {
        self.faults.is_none()
    }

    /// Room for the next packet (a full [`MAX_PACKET`](softverbs_transport::MAX_PACKET)),
    /// right behind the batch queued: the engine writes its packet here and
    /// [`send_staged`](Self::send_staged) queues it where it lies. That saves the copy of
    /// every payload byte that [`send`](Self::send) makes from the engine's buffer.
    pub fn stage(&mut self) -> &mut [u8] {
        let at = self.tx.used;
        &mut self.tx.buf[at..at + softverbs_transport::MAX_PACKET]
    }

    /// The packet [`stage`](Self::stage)d (its first `len` bytes).
    pub fn staged(&self, len: usize) -> &[u8] {
        &self.tx.buf[self.tx.used..self.tx.used + len]
    }

    /// [`send`](Self::send) for the packet the engine wrote into [`stage`](Self::stage):
    /// it joins the batch; if it cannot, the batch before it leaves first and the packet
    /// moves to the front (one copy per batch, not per packet).
    pub fn send_staged(&mut self, tx: &Transmit) -> io::Result<()> {
        if !self.can_stage() {
            let mut pkt = self.staged(tx.len).to_vec();
            return self.send(tx, &mut pkt);
        }
        let dst_ip = tx.dgid.to_ip();
        if ip_repr(self.local, dst_ip).is_none() {
            return Ok(());
        }
        let to = SocketAddr::new(dst_ip, self.port);
        let qpn = dest_qp(self.staged(tx.len));
        if !self.fits(to, tx.len, qpn) {
            let at = self.tx.used;
            // `flush` sends `buf[..used]` and leaves the bytes behind it alone.
            self.flush()?;
            self.tx.buf.copy_within(at..at + tx.len, 0);
        }
        self.queue(to, tx.len, qpn);
        Ok(())
    }

    /// The UDP header of what the device sends: every datagram goes to the device's own port
    /// at the peer (4791 outside tests), so that is the destination port the ICRC covers.
    fn udp_out(&self) -> UdpRepr {
        UdpRepr {
            src_port: self.port,
            dst_port: self.port,
        }
    }

    /// Writes the ICRC of every queued packet, packet `i` as if its IPv4 identification were
    /// `first_id + i` (IPv6 has none), and records them in the capture.
    fn seal(&mut self, to: SocketAddr, ids_count_up: bool) -> io::Result<()> {
        let Some(mut ip) = ip_repr(self.local, to.ip()) else {
            return Ok(());
        };
        let udp = self.udp_out();
        let mut off = 0;
        let lens = std::mem::take(&mut self.tx.lens);
        let mut buf = std::mem::take(&mut self.tx.buf);
        let mut sealed = Ok(());
        for (i, &len) in lens.iter().enumerate() {
            if let IpRepr::V4(v4) = &mut ip {
                v4.identification = if ids_count_up { i as u16 } else { 0 };
            }
            let pkt = &mut buf[off..off + len];
            let hl = match emit_ip_udp(&ip, &udp, len, &mut self.hdr) {
                Ok(hl) => hl,
                Err(e) => {
                    sealed = Err(io::Error::other(e));
                    break;
                }
            };
            if let Err(e) = icrc::write(&self.hdr[..hl], pkt) {
                sealed = Err(io::Error::other(e));
                break;
            }
            if self.capture.is_some() {
                let copy = pkt.to_vec();
                self.record(&ip, &udp, &copy);
            }
            off += len;
        }
        // Put back even on failure: the batch buffer keeps its size (`stage` relies on it).
        self.tx.lens = lens;
        self.tx.buf = buf;
        sealed
    }

    /// Sends what is queued: one GSO send, or `sendmmsg` where GSO is refused.
    pub fn flush(&mut self) -> io::Result<()> {
        let Some(to) = self.tx.to else {
            return Ok(());
        };
        let n = self.tx.lens.len();
        let result = if n == 0 {
            Ok(())
        } else if n == 1 {
            self.seal(to, false).and_then(|()| {
                let bytes = std::mem::take(&mut self.tx.buf);
                let r = self.raw_send(&bytes[..self.tx.used], to);
                self.tx.buf = bytes;
                r
            })
        } else {
            match self.gso_send(to) {
                Ok(true) => Ok(()),
                Ok(false) => self.mmsg_send(to),
                Err(e) => Err(e),
            }
        };
        // A batch that could not be sealed or sent is lost, as on a congested link.
        self.tx.used = 0;
        self.tx.lens.clear();
        self.tx.to = None;
        result
    }

    /// One `sendmsg` with `UDP_SEGMENT`; false (nothing sent, ICRCs to be redone) if the
    /// kernel refuses GSO on this socket or route.
    fn gso_send(&mut self, to: SocketAddr) -> io::Result<bool> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrStorage};
        if !self.gso {
            return Ok(false);
        }
        self.seal(to, true)?;
        let seg = self.tx.lens[0] as u16;
        let addr = SockaddrStorage::from(to);
        let iov = [io::IoSlice::new(&self.tx.buf[..self.tx.used])];
        let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
        match sendmsg(
            self.sock.as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::empty(),
            Some(&addr),
        ) {
            Ok(_) => {
                self.stats.sent += self.tx.lens.len() as u64;
                self.batch.gso_sends += 1;
                self.batch.gso_segments += self.tx.lens.len() as u64;
                Ok(true)
            }
            // A full buffer or an unreachable peer loses the batch, as a congested link would.
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::ECONNREFUSED) => Ok(true),
            Err(e) => {
                // EIO (no checksum offload on the route), EINVAL, ENOPROTOOPT, EOPNOTSUPP: GSO
                // can fail even where it is supported (microsoft/msquic#1360); stop trying.
                tracing::info!("UDP GSO refused ({e}); sending batches with sendmmsg");
                self.gso = false;
                Ok(false)
            }
        }
    }

    /// The queued packets by `sendmmsg`, each with identification 0.
    fn mmsg_send(&mut self, to: SocketAddr) -> io::Result<()> {
        use rustix::net::addr::SocketAddrArg;
        use rustix::net::{sendmmsg, MMsgHdr, SendAncillaryBuffer, SendFlags};
        self.seal(to, false)?;
        let addr = to.as_any();
        let mut slices = Vec::with_capacity(self.tx.lens.len());
        let mut off = 0;
        for &len in &self.tx.lens {
            slices.push([io::IoSlice::new(&self.tx.buf[off..off + len])]);
            off += len;
        }
        let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = (0..slices.len())
            .map(|_| SendAncillaryBuffer::default())
            .collect();
        let mut msgs: Vec<MMsgHdr<'_>> = slices
            .iter()
            .zip(controls.iter_mut())
            .map(|(iov, c)| MMsgHdr::new_with_addr(&addr, iov, c))
            .collect();
        let mut done = 0;
        while done < msgs.len() {
            match sendmmsg(&self.sock, &mut msgs[done..], SendFlags::empty()) {
                Ok(k) => {
                    self.batch.mmsg_sends += 1;
                    self.stats.sent += k as u64;
                    done += k.max(1);
                }
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::CONNREFUSED) => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn raw_send(&mut self, bytes: &[u8], to: SocketAddr) -> io::Result<()> {
        match self.sock.send_to(bytes, to) {
            Ok(_) => {
                self.stats.sent += 1;
                Ok(())
            }
            // A full socket buffer drops the packet, as a congested link would; the transport
            // retransmits.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            // An unreachable peer (ICMP) is loss too.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Sends a packet held back by reordering, if any (call when idle).
    pub fn release_held(&mut self) -> io::Result<()> {
        if let Some((late, to)) = self.held.take() {
            self.raw_send(&late, to)?;
        }
        Ok(())
    }

    /// Receives one packet into `buf`: `Some((meta, len))` with `buf[..len]` the IB packet
    /// (BTH through ICRC) whose ICRC checked out, from the device's own socket or one of its
    /// group sockets (then `meta.dgid` is the group); `None` when nothing is waiting. Bad
    /// datagrams are counted and skipped. A datagram the kernel coalesced (GRO) is handed out
    /// one segment per call.
    pub fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<(RxMeta, usize)>> {
        Ok(match self.recv_any(buf)? {
            Some((meta, Rx::Batch(at, len))) => {
                buf[..len].copy_from_slice(&self.rx.buf[at..at + len]);
                Some((meta, len))
            }
            Some((meta, Rx::Buf(len))) => Some((meta, len)),
            None => None,
        })
    }

    /// [`recv`](Self::recv) without copying a packet of the device's own socket out of the
    /// datagram it arrived in (`buf` holds only a group socket's): the packet as a slice.
    pub fn recv_ref<'a>(&'a mut self, buf: &'a mut [u8]) -> io::Result<Option<(RxMeta, &'a [u8])>> {
        Ok(match self.recv_any(buf)? {
            Some((meta, Rx::Batch(at, len))) => Some((meta, &self.rx.buf[at..at + len])),
            Some((meta, Rx::Buf(len))) => Some((meta, &buf[..len])),
            None => None,
        })
    }

    fn recv_any(&mut self, buf: &mut [u8]) -> io::Result<Option<(RxMeta, Rx)>> {
        let got = self.recv_from_socket(None, buf);
        // What the round forwarded leaves before the caller sees anything (forward.rs).
        self.forward.flush(&self.sock);
        if let Some(r) = got? {
            return Ok(Some(r));
        }
        let groups: Vec<IpAddr> = self.groups.keys().copied().collect();
        for g in groups {
            if let Some(r) = self.recv_from_socket(Some(g), buf)? {
                return Ok(Some(r));
            }
        }
        self.readable = false;
        Ok(None)
    }

    fn recv_from_socket(
        &mut self,
        group: Option<IpAddr>,
        buf: &mut [u8],
    ) -> io::Result<Option<(RxMeta, Rx)>> {
        let dst = group.unwrap_or(self.local);
        loop {
            let (at, len, from, index) = match group {
                None => {
                    if self.rx.off >= self.rx.len && !self.fill()? {
                        return Ok(None);
                    }
                    if self.rx.seg == 0 {
                        // A raw datagram: one packet, or a GSO batch that arrived whole.
                        let rx = &self.rx;
                        let hdr = &rx.buf[rx.start - rx.hdr..rx.start];
                        (self.rx.seg, self.rx.first_ok) = raw::segment_size(
                            hdr,
                            &rx.buf[rx.start..rx.len],
                            softverbs_transport::MAX_PACKET,
                        );
                        let len = self.rx.len - self.rx.start;
                        if self.rx.seg < len {
                            self.batch.gro_recvs += 1;
                            self.batch.gro_segments += len.div_ceil(self.rx.seg) as u64;
                        }
                    }
                    let rx = &mut self.rx;
                    let len = rx.seg.min(rx.len - rx.off);
                    let (from, index) = (rx.from, rx.index);
                    rx.index = rx.index.wrapping_add(1);
                    let at = rx.off;
                    rx.off += len;
                    if len > buf.len() {
                        self.stats.rejected += 1;
                        self.rejects.count(Reject::Malformed);
                        continue;
                    }
                    (Some(at), len, from, index)
                }
                // Group sockets do not ask for GRO: one datagram per call. A GSO batch sent to
                // a group arrives as separate datagrams, so no index is known (the ICRC check
                // then tries every identification a sender uses).
                Some(g) => {
                    let Some(sock) = self.groups.get(&g) else {
                        return Ok(None);
                    };
                    match sock.recv_from(buf) {
                        Ok((len, from)) => (None, len, from, 0),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                        Err(e) => return Err(e),
                    }
                }
            };
            let Some(ip) = ip_repr(from.ip(), dst) else {
                self.stats.rejected += 1;
                self.rejects.count(Reject::Malformed);
                continue;
            };
            let udp = UdpRepr {
                src_port: from.port(),
                dst_port: self.port,
            };
            // The batch's bytes are checked where they lie (taken out of `self` meanwhile).
            let rxbuf = std::mem::take(&mut self.rx.buf);
            let pkt = match at {
                Some(at) => &rxbuf[at..at + len],
                None => &buf[..len],
            };
            let checked = match at.filter(|_| self.rx.hdr > 0) {
                Some(_) => {
                    let hdr = &rxbuf[self.rx.start - self.rx.hdr..self.rx.start];
                    check_raw(hdr, pkt, self.rx.first_ok, index)
                }
                None => self.check_icrc(ip, &udp, pkt, index, from.ip()),
            };
            // A net-path QP's packet goes on to its library (or is dropped) here, before
            // the engine; only unicast to the device's own socket is forwarded.
            let fwd = match (checked, group) {
                (Some(_), None) => self
                    .forward
                    .forward_to_net_client(&self.sock, from.ip(), pkt),
                _ => forward::Forward::NotNet,
            };
            if let Some(c) = &mut self.capture {
                match (checked, fwd) {
                    // Recorded as it arrived, its bad ICRC kept, with the reason where the
                    // capture keeps rejected packets (docs/guide/capture.md). Its IPv4
                    // identification, never seen, is the one its place in the batch gives.
                    (None, _) => {
                        let mut ip = ip;
                        if let IpRepr::V4(v4) = &mut ip {
                            v4.identification = index;
                        }
                        c.record_rejected(&ip, &udp, pkt, Reject::BadIcrc);
                    }
                    (Some(ip), forward::Forward::ForeignSource) => {
                        c.record_rejected(&ip, &udp, pkt, Reject::ForeignSource);
                    }
                    (Some(ip), forward::Forward::Forwarded) => c.record(&ip, &udp, pkt),
                    // The engine (or the daemon) judges it next: `verdict`.
                    (Some(ip), _) => c.record_received(&ip, &udp, pkt),
                }
            }
            self.rx.buf = rxbuf;
            if checked.is_none() {
                // The one place the ICRC check fails (a hook for a receive path that
                // checks it otherwise, too).
                self.stats.rejected += 1;
                self.icrc_errors += 1;
                self.rejects.count(Reject::BadIcrc);
                continue;
            }
            if !matches!(fwd, forward::Forward::NotNet | forward::Forward::Held) {
                continue;
            }
            self.stats.delivered += 1;
            let meta = RxMeta {
                sgid: Gid::from_ip(from.ip()),
                dgid: Gid::from_ip(dst),
            };
            return Ok(Some((
                meta,
                at.map_or(Rx::Buf(len), |at| Rx::Batch(at, len)),
            )));
        }
    }

    /// Makes the next datagram (maybe coalesced) the one handed out; false if none. Takes up
    /// to [`RX_DATAGRAMS`] at a time with one `recvmmsg`, and when that found the socket
    /// empty, answers "none" once its datagrams are used up without another call: every
    /// arrival after it raises a new readiness event (docs/performance.md "Issue 16: two
    /// daemons"), and a caller that polls regardless makes the call next time.
    fn fill(&mut self) -> io::Result<bool> {
        use nix::sys::socket::{
            recvmmsg, ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrStorage,
        };
        loop {
            if let Some((start, len, seg, from, hdr)) = self.rx.queued.pop_front() {
                self.rx.off = start;
                self.rx.len = start + len;
                self.rx.seg = seg;
                self.rx.index = 0;
                self.rx.from = from;
                self.rx.hdr = hdr;
                self.rx.start = start;
                return Ok(true);
            }
            if std::mem::take(&mut self.rx.drained) {
                return Ok(false);
            }
            let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(
                RX_DATAGRAMS,
                Some(nix::cmsg_space!(i32)),
            );
            let mut slots: Vec<[io::IoSliceMut<'_>; 1]> = self
                .rx
                .buf
                .chunks_mut(RX_DATAGRAM)
                .map(|c| [io::IoSliceMut::new(c)])
                .collect();
            let fd = self.raw.as_ref().unwrap_or(&self.sock).as_raw_fd();
            let got = match recvmmsg(
                fd,
                &mut headers,
                slots.iter_mut(),
                MsgFlags::MSG_DONTWAIT,
                None,
            ) {
                Ok(r) => r,
                Err(nix::errno::Errno::EAGAIN) => return Ok(false),
                Err(nix::errno::Errno::ECONNREFUSED) | Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            let mut n = 0;
            for (i, msg) in got.enumerate() {
                n += 1;
                let len = msg.bytes;
                let mut seg = len;
                if let Ok(cmsgs) = msg.cmsgs() {
                    for c in cmsgs {
                        if let ControlMessageOwned::UdpGroSegments(s) = c {
                            seg = usize::try_from(s).unwrap_or(len).clamp(1, len.max(1));
                        }
                    }
                }
                let from = msg.address.and_then(|a: SockaddrStorage| {
                    a.as_sockaddr_in()
                        .map(|v4| SocketAddr::from(std::net::SocketAddrV4::from(*v4)))
                        .or_else(|| {
                            a.as_sockaddr_in6()
                                .map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6)))
                        })
                });
                let Some(from) = from.filter(|_| len > 0) else {
                    self.stats.rejected += 1;
                    self.rejects.count(Reject::Malformed);
                    continue;
                };
                if seg < len {
                    self.batch.gro_recvs += 1;
                    self.batch.gro_segments += len.div_ceil(seg) as u64;
                }
                self.rx
                    .queued
                    .push_back((i * RX_DATAGRAM, len, seg, from, 0));
            }
            if self.raw.is_some() {
                self.raw_headers();
            }
            // Fewer than asked for: the kernel met an empty queue (recvmmsg(2) returns what
            // it has when the next datagram would block).
            self.rx.drained = n < RX_DATAGRAMS;
        }
    }

    /// Turns what a raw `recvmmsg` queued (whole IPv4 datagrams) into payloads behind their
    /// headers (raw.rs), the sender's port taken from the UDP header (a raw socket reports
    /// port 0); drops another port's datagram, which came before the filter was attached.
    fn raw_headers(&mut self) {
        let port = self.port;
        let buf = &self.rx.buf;
        self.rx.queued.retain_mut(|(start, len, seg, from, hdr)| {
            if *hdr > 0 {
                return true;
            }
            let Some(hl) = raw::header_len(&buf[*start..*start + *len], port) else {
                return false;
            };
            let sport = u16::from_be_bytes([buf[*start + hl - 8], buf[*start + hl - 7]]);
            *from = SocketAddr::new(from.ip(), sport);
            *start += hl;
            *len -= hl;
            *seg = 0;
            *hdr = hl;
            true
        });
    }

    /// The IP header (its identification as found) under which `pkt`'s ICRC checks out, or
    /// `None`: the one place a packet is found to have a bad ICRC. A UDP socket hides the
    /// identification: a softverbs peer's must be one a softverbs sender uses (0..64,
    /// `index` expected first, full 32-bit check); a `solve_ip_id_peers` peer's may be any
    /// (docs/design/roce-wire.md §6).
    fn check_icrc(
        &mut self,
        ip: IpRepr,
        udp: &UdpRepr,
        pkt: &[u8],
        index: u16,
        peer: IpAddr,
    ) -> Option<IpRepr> {
        use icrc::Received;
        let solve = self.policy.solves(peer);
        let ids = MAX_SEGMENTS as u16;
        match icrc::check_received(ip, udp, pkt, index, ids, solve, &mut self.hdr) {
            Received::Window { ip, searched } => {
                if searched {
                    self.batch.id_searches += 1;
                }
                Some(ip)
            }
            Received::Solved { ip } => {
                self.icrc_solved += 1;
                Some(ip)
            }
            Received::Unseen { id } => {
                self.icrc_id_unseen += 1;
                self.hint_unseen(peer, id);
                None
            }
            Received::Bad => None,
        }
    }

    /// Says, at most every ten minutes per peer, that `peer`'s packets would check out
    /// with an identification no softverbs sender uses, and names the setting that accepts
    /// them. Bounded: past 1024 peers, only the counter says it.
    fn hint_unseen(&mut self, peer: IpAddr, id: u16) {
        const EVERY: Duration = Duration::from_secs(600);
        let now = Instant::now();
        match self.hinted.get(&peer) {
            Some(&last) if now.duration_since(last) < EVERY => return,
            None if self.hinted.len() >= 1024 => return,
            _ => {}
        }
        self.hinted.insert(peer, now);
        tracing::warn!(
            device = %self.local,
            %peer,
            identification = id,
            "dropping packets whose ICRC checks out only with an IPv4 identification no \
             softverbs sender uses: a kernel rxe or RoCE NIC peer? Accept them with \
             `[icrc] solve_ip_id_peers = [\"{peer}\"]` or `--solve-ip-id {peer}`, or give \
             the daemon CAP_NET_RAW to read the real header (`[icrc] ip_header`; \
             docs/guide/troubleshooting.md)"
        );
    }
}

/// The raw path's ICRC check: exact, over the header segment `index` of the datagram had
/// on the wire (the datagram's own for a single packet; for a GSO batch that arrived whole,
/// the one the kernel would have cut, raw.rs). The first segment was checked already when
/// its size was found (`checked_first`). Returns the header as found, `None` for a bad ICRC.
fn check_raw(hdr: &[u8], pkt: &[u8], checked_first: bool, index: u16) -> Option<IpRepr> {
    let mut h = [0u8; 68];
    let hl = raw::segment_header(hdr, pkt.len(), index, &mut h);
    let h = &h[..hl];
    if !(checked_first && index == 0) {
        icrc::verify(h, pkt).ok()?;
    }
    let addr = |at: usize| std::net::Ipv4Addr::new(h[at], h[at + 1], h[at + 2], h[at + 3]);
    Some(IpRepr::V4(softverbs_wire::ip::Ipv4Repr {
        src: addr(12),
        dst: addr(16),
        tos: h[1],
        identification: u16::from_be_bytes([h[4], h[5]]),
        dont_fragment: h[6] & 0x40 != 0,
        ttl: h[8],
    }))
}

/// Converts a wall-clock instant to the engine's time (nanoseconds since `epoch`).
pub fn engine_time(epoch: Instant, now: Instant) -> softverbs_transport::Instant {
    softverbs_transport::Instant(now.duration_since(epoch).as_nanos() as u64)
}

/// How long until an engine deadline, for an event loop's poll timeout.
pub fn until(epoch: Instant, deadline: softverbs_transport::Instant) -> Duration {
    let at = epoch + Duration::from_nanos(deadline.0);
    at.saturating_duration_since(Instant::now())
}
