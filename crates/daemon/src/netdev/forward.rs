//! Forwarding a net-path QP's packets to the private socket of the context that runs its
//! engine (docs/design/net-path.md, "Receiving"; issue 35, item 1).
//!
//! Peers send every RoCE v2 packet to the device's port (4791, IBA A17.4), which only the
//! daemon's socket holds: no client holds a member of it, so none can receive, steer or
//! filter another QP's packets. The device receives them as any other (ICRC checked, one GRO
//! segment at a time) and hands each to [`Forwarder::forward_to_net_client`] before its
//! engine: a packet whose destination QP is on the net path is checked against the QP's
//! path peer (the source address the engine would require, IBA 9.6.1.1; a packet from
//! anyone else is dropped and counted) and sent on to the context's socket, from the
//! device's port. The library accepts packets only from there (only this daemon can send
//! from it) and leaves the ICRC check to the device, which saw the real headers; the
//! forwarder still rewrites each ICRC for the datagram it sends (`Forwarder::seal`), so what
//! a capture of `lo` shows checks out too (docs/design/roce-wire.md §6).
//!
//! Forwarding never blocks: the device socket is nonblocking, so a client whose socket is
//! full loses the batch (counted in [`ForwardStats::client_full`]) and the requester
//! retransmits, as after loss on a link. Consecutive packets to one QP of one size (the last
//! may be shorter) leave in one `sendmsg` with `UDP_SEGMENT`, so a 64 KiB message costs the
//! daemon one receive and one send, and the library one `recvmsg` with `UDP_GRO`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use softverbs_abi::direct::NS_RAN;
use softverbs_shm::Region;

use softverbs_core::device::Gid;
use softverbs_wire::bth::dest_qp_of as dest_qp;
use softverbs_wire::gso::{self, MAX_BATCH_BYTES, MAX_SEGMENTS};

/// What [`Forwarder::forward_to_net_client`] did with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    /// Its QP is on the net path and it came from the QP's peer: on its way to the library.
    Forwarded,
    /// Its QP is on the net path but it came from another address: dropped, counted.
    ForeignSource,
    /// Its QP is not on the net path: the device's engine takes it.
    NotNet,
    /// Forwarded, and also handed to the daemon: a request for a QP whose library does not
    /// run (`Forwarder::hold`), which the daemon answers for it (docs/design/net-path.md,
    /// "Stalls"); the library, if it runs after all, takes the request too.
    Held,
}

/// Counters of the forwarding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardStats {
    /// Packets sent on to a library.
    pub forwarded: u64,
    /// Packets for a net-path QP from an address that is not its peer, dropped.
    pub foreign_source: u64,
    /// Packets lost because the library's socket was full (or gone).
    pub client_full: u64,
}

/// Where a net-path QP's packets go.
#[derive(Clone, Copy, Debug)]
struct Route {
    /// The QP's path peer (its address vector's destination GID): the only accepted source.
    peer: Gid,
    /// The context's private socket.
    to: SocketAddr,
}

/// The device's routes and the batch being built.
pub(super) struct Forwarder {
    routes: HashMap<u32, Route>,
    buf: Vec<u8>,
    lens: Vec<usize>,
    to: Option<SocketAddr>,
    qpn: u32,
    /// False once the kernel refused a GSO send: batches go datagram by datagram.
    gso: bool,
    pub(super) stats: ForwardStats,
    /// QPs whose library does not run (stopped, or stale: `DataPath::net_watch`): their
    /// peers' requests go to the device's engine side, where the daemon answers for the
    /// library (docs/design/net-path.md, "Stalls"); responses still go on to the library.
    held: std::collections::HashSet<u32>,
    /// Each library socket's net status region, whose last-ran stamp is read for every
    /// request forwarded there: a library that has not run for `STALE` has its requests
    /// handed to the daemon at once ([`Forward::Held`]), not only after the watcher's next
    /// look (docs/design/net-path.md, "Stalls").
    stamps: HashMap<SocketAddr, Arc<Region>>,
    /// `CLOCK_MONOTONIC` ns of the daemon's current round (`NetDev::set_clock`); 0 before.
    now: u64,
    /// The device socket's address, which forwarded datagrams leave from (asked once).
    local: Option<SocketAddr>,
}

impl Forwarder {
    pub(super) fn new(gso: bool) -> Forwarder {
        Forwarder {
            routes: HashMap::new(),
            buf: Vec::with_capacity(MAX_BATCH_BYTES),
            lens: Vec::with_capacity(MAX_SEGMENTS),
            to: None,
            qpn: 0,
            gso,
            stats: ForwardStats::default(),
            held: std::collections::HashSet::new(),
            stamps: HashMap::new(),
            now: 0,
            local: None,
        }
    }

    /// The library behind socket `to` publishes its last-ran stamp in `region`.
    pub(super) fn stamp_from(&mut self, to: SocketAddr, region: Arc<Region>) {
        self.stamps.insert(to, region);
    }

    /// The clock of the daemon's current round, against which stamps are judged.
    pub(super) fn set_clock(&mut self, now: u64) {
        self.now = now;
    }

    /// Whether the library behind `to` has not run for `STALE` by its stamp (one load).
    fn stale(&self, to: SocketAddr) -> bool {
        self.stamps.get(&to).is_some_and(|r| {
            let ran = r.atomic_u64s(NS_RAN, 1)[0].load(Ordering::Acquire);
            crate::datapath::stale(ran, self.now)
        })
    }

    /// QP `qpn`'s packets from `peer` go to `to` from now on.
    pub(super) fn add(&mut self, qpn: u32, peer: Gid, to: SocketAddr) {
        self.routes.insert(qpn, Route { peer, to });
    }

    /// While `on`, the requests for QP `qpn` are also handed to the daemon
    /// ([`Forward::Held`]), which answers for a library that does not run.
    pub(super) fn hold(&mut self, qpn: u32, on: bool) {
        if on {
            self.held.insert(qpn);
        } else {
            self.held.remove(&qpn);
        }
    }

    /// QP `qpn`'s packets go to the device's engine again.
    pub(super) fn remove(&mut self, qpn: u32) {
        self.held.remove(&qpn);
        self.routes.remove(&qpn);
    }

    /// Every route to `to` goes (its context closed).
    pub(super) fn remove_to(&mut self, to: SocketAddr) {
        self.routes.retain(|_, r| r.to != to);
        self.stamps.remove(&to);
    }

    /// QPs forwarded.
    pub(super) fn len(&self) -> usize {
        self.routes.len()
    }

    /// The one decision: packet `pkt` (BTH through ICRC, its ICRC checked) arrived on the
    /// device socket `sock` from `from`. A packet for a net-path QP is queued for the QP's
    /// library if it came from the QP's peer, else dropped; anything else is the engine's.
    /// The queued batch leaves by [`flush`](Self::flush) (or when the next packet cannot
    /// join it).
    pub(super) fn forward_to_net_client(
        &mut self,
        sock: &UdpSocket,
        from: IpAddr,
        pkt: &[u8],
    ) -> Forward {
        let qpn = dest_qp(pkt);
        let Some(&route) = self.routes.get(&qpn) else {
            return Forward::NotNet;
        };
        if Gid::from_ip(from) != route.peer {
            self.stats.foreign_source += 1;
            return Forward::ForeignSource;
        }
        // Held by the watcher, or its library's stamp is stale now: the daemon answers
        // this request in this very round (`DataPath::net_answer`, by the same rule).
        let held = is_request(pkt)
            && ((!self.held.is_empty() && self.held.contains(&qpn)) || self.stale(route.to));
        let joins = self.to == Some(route.to)
            && self.qpn == qpn
            && gso::joins(&self.lens, self.buf.len(), pkt.len());
        if !joins {
            self.flush(sock);
        }
        self.to = Some(route.to);
        self.qpn = qpn;
        self.buf.extend_from_slice(pkt);
        self.lens.push(pkt.len());
        if held {
            Forward::Held
        } else {
            Forward::Forwarded
        }
    }

    /// Sends the queued batch: one GSO `sendmsg`, or datagram by datagram where GSO is
    /// refused. Never waits: what does not fit the library's socket is lost, counted.
    pub(super) fn flush(&mut self, sock: &UdpSocket) {
        let Some(to) = self.to.take() else {
            return;
        };
        let n = self.lens.len() as u64;
        let sent = if self.lens.len() > 1 && self.gso {
            self.seal(sock, to, true);
            match self.gso_send(sock, to) {
                Ok(()) => true,
                Err(nix::errno::Errno::EAGAIN)
                | Err(nix::errno::Errno::ECONNREFUSED)
                | Err(nix::errno::Errno::ENOBUFS) => false,
                Err(e) => {
                    // EIO (no checksum offload on the route), EINVAL, ENOPROTOOPT: GSO can
                    // fail even where it is supported; stop trying.
                    tracing::info!("UDP GSO refused forwarding ({e}); sending datagrams");
                    self.gso = false;
                    self.seal(sock, to, false);
                    self.send_each(sock, to)
                }
            }
        } else {
            self.seal(sock, to, false);
            self.send_each(sock, to)
        };
        if sent {
            self.stats.forwarded += n;
        } else {
            self.stats.client_full += n;
        }
        self.buf.clear();
        self.lens.clear();
    }

    /// Rewrites each queued packet's ICRC for the datagram it leaves as: from the device
    /// socket to `to`, IPv4 identification = its index in a GSO send, 0 alone (the rule of
    /// docs/design/roce-wire.md §6). The library does not check it (the device did, over
    /// the peer's headers), but every datagram softverbs puts on a wire, `lo` included,
    /// carries an ICRC right for its header, as a capture or tshark checks.
    fn seal(&mut self, sock: &UdpSocket, to: SocketAddr, gso: bool) {
        use softverbs_wire::icrc;
        use softverbs_wire::ip::{emit_ip_udp, IpRepr, UdpRepr};
        let Some(local) = self.local.or_else(|| sock.local_addr().ok()) else {
            return;
        };
        self.local = Some(local);
        let Some(mut ip) = IpRepr::between(local.ip(), to.ip()) else {
            return;
        };
        let udp = UdpRepr {
            src_port: local.port(),
            dst_port: to.port(),
        };
        let mut hdr = [0u8; 48];
        let mut off = 0;
        for (i, &l) in self.lens.iter().enumerate() {
            if let IpRepr::V4(v4) = &mut ip {
                v4.identification = if gso { i as u16 } else { 0 };
            }
            if let Ok(hl) = emit_ip_udp(&ip, &udp, l, &mut hdr) {
                let _ = icrc::write(&hdr[..hl], &mut self.buf[off..off + l]);
            }
            off += l;
        }
    }

    fn gso_send(&self, sock: &UdpSocket, to: SocketAddr) -> Result<(), nix::errno::Errno> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrStorage};
        let seg = self.lens[0] as u16;
        let addr = SockaddrStorage::from(to);
        let iov = [io::IoSlice::new(&self.buf)];
        let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
        sendmsg(
            sock.as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::MSG_DONTWAIT,
            Some(&addr),
        )
        .map(|_| ())
    }

    /// Each datagram alone; false if any was lost.
    fn send_each(&self, sock: &UdpSocket, to: SocketAddr) -> bool {
        let mut off = 0;
        let mut all = true;
        for &l in &self.lens {
            all &= sock.send_to(&self.buf[off..off + l], to).is_ok();
            off += l;
        }
        all
    }
}

/// Whether `pkt` (BTH first) is a request (IBA table 38), which a responder answers.
fn is_request(pkt: &[u8]) -> bool {
    pkt.first()
        .and_then(|&op| softverbs_wire::opcode::Opcode(op).info().ok())
        .is_some_and(|i| i.direction == softverbs_wire::Direction::Request)
}
