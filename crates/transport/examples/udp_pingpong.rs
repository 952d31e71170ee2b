//! The floor of "the engine in the client library" between two hosts: two processes, each
//! running this crate's engine for one RC QP over its own UDP socket on a loopback address,
//! ping-pong small SENDs — no daemon, no shared-memory ring, no hand-over between processes
//! on the data path. Each side computes the ICRC over the IP/UDP headers the wire would carry
//! and the receiver checks it, as the daemon's devices do (`crates/daemon/src/netdev.rs`).
//!
//! It answers one question for docs/performance.md ("Issue 16: what the engine in the client
//! library would reach"): would a design where every process sends and receives its own QPs'
//! packets meet the two-daemon rows against UCX tcp, which has the same two processes? It is
//! a measurement, not a data path: no async events, one QP, both sides spin.
//!
//! `cargo run --release -p softverbs-transport --example udp_pingpong [iters] [size]`
//! (`scripts/engine-floor.sh` runs it beside `ucx_perftest` over TCP).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant as Clock};

use softverbs_core::device::Gid;
use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Host};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, WcStatus};
use softverbs_transport::{Instant, Output, RxMeta, MAX_PACKET};
use softverbs_wire::icrc;
use softverbs_wire::ip::{emit_ip_udp, IpRepr, Ipv4Repr, UdpRepr};

/// RoCE v2's port (IBA Annex A17.2.1), on two addresses of their own so that a running
/// softverbs daemon on the same machine is not in the way.
const PORT: u16 = 4791;
const ADDR: [Ipv4Addr; 2] = [Ipv4Addr::new(127, 0, 99, 1), Ipv4Addr::new(127, 0, 99, 2)];
const BUF: u64 = 0x1000;

struct Side {
    host: Host,
    qp: u32,
    key: u32,
    cq: softverbs_transport::CqId,
    sock: UdpSocket,
    me: Ipv4Addr,
    peer: SocketAddr,
    meta: RxMeta,
    start: Clock,
    pkt: Vec<u8>,
    dgram: Vec<u8>,
    size: u32,
    acks_last: bool,
}

impl Side {
    fn new(which: usize, size: u32) -> Side {
        let (me, peer) = (ADDR[which], ADDR[1 - which]);
        let mut host = Host::new(IpAddr::V4(me), Mtu::M4096);
        let c = host.context(1, 1 << 16);
        let pd = host.pd(c);
        let key = host.mr(pd, 0, 1 << 16, Access::LOCAL_WRITE);
        let cq = host.cq(c);
        let qp = host.qp(QpType::Rc, pd, cq, None);
        // Both sides create the same objects in the same order, so the peer's QP has this
        // QP's number: the out-of-band exchange a real program makes is not needed here.
        let pgid = Gid::from_ip(IpAddr::V4(peer));
        let p = ConnParams {
            mtu: Mtu::M4096,
            ..ConnParams::default()
        };
        host.connect(qp, pgid, qp, p);
        let sock = UdpSocket::bind((me, PORT)).expect("bind the side's address");
        sock.set_nonblocking(true).unwrap();
        let meta = RxMeta {
            sgid: pgid,
            dgid: host.gid,
        };
        Side {
            host,
            qp,
            key,
            cq,
            sock,
            me,
            peer: SocketAddr::from((peer, PORT)),
            meta,
            start: Clock::now(),
            pkt: vec![0; MAX_PACKET],
            dgram: vec![0; MAX_PACKET + 64],
            size,
            acks_last: std::env::var_os("ACKS_FIRST").is_none(),
        }
    }

    fn now(&self) -> Instant {
        Instant(self.start.elapsed().as_nanos() as u64)
    }

    fn post_recv(&mut self, id: u64) {
        let wr = RecvWr {
            wr_id: id,
            sges: vec![Sge {
                addr: BUF,
                length: self.size.max(1),
                lkey: self.key,
            }],
        };
        self.host.engine.post_recv(self.qp, wr).unwrap();
    }

    fn post_send(&mut self, id: u64) {
        let mut wr = SendWr::new(
            id,
            SendOp::Send,
            Payload::Sges(vec![Sge {
                addr: 0,
                length: self.size,
                lkey: self.key,
            }]),
        );
        // One signalled send in 64, as perftest and UCX do: the others complete silently.
        wr.signaled = id % 64 == 0;
        self.host.engine.post_send(self.qp, wr).unwrap();
    }

    /// Sends what the engine has ready, each packet with its ICRC. Acknowledgements leave
    /// after the requests queued with them: an ACK only retires the peer's send, while the
    /// request is what the peer waits for (the two travel in opposite directions, so no
    /// packet overtakes another of its own flow).
    fn transmit(&mut self) {
        let now = self.now();
        let h = &mut self.host;
        let mut acks: Vec<Vec<u8>> = Vec::new();
        while let Some(tx) = h
            .engine
            .poll_transmit(now, &h.core, &mut h.mem, &mut self.pkt)
        {
            let ip = IpRepr::V4(Ipv4Repr::new(self.me, *ip4(&self.peer)));
            // The ICRC covers the UDP header as sent, and this socket sends from its bound
            // port, not the engine's per-QP entropy port (`Transmit::udp_sport`).
            let udp = UdpRepr {
                src_port: PORT,
                dst_port: PORT,
            };
            let hl = emit_ip_udp(&ip, &udp, tx.len, &mut self.dgram).unwrap();
            let (hdr, _) = self.dgram.split_at(hl);
            icrc::write(hdr, &mut self.pkt[..tx.len]).unwrap();
            // BTH opcode 0x11: RC Acknowledge (IBA table 38).
            if self.acks_last && self.pkt[0] == 0x11 {
                acks.push(self.pkt[..tx.len].to_vec());
                continue;
            }
            send(&self.sock, &self.pkt[..tx.len], self.peer);
        }
        for a in acks {
            send(&self.sock, &a, self.peer);
        }
    }

    /// Takes every datagram waiting, checks its ICRC and hands it to the engine.
    fn receive(&mut self) -> bool {
        let mut any = false;
        loop {
            let (n, from) = match self.sock.recv_from(&mut self.pkt) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return any,
                Err(e) => panic!("receive: {e}"),
            };
            any = true;
            let ip = IpRepr::V4(Ipv4Repr::new(*ip4(&from), self.me));
            let udp = UdpRepr {
                src_port: from.port(),
                dst_port: PORT,
            };
            let hl = emit_ip_udp(&ip, &udp, n, &mut self.dgram).unwrap();
            if icrc::verify(&self.dgram[..hl], &self.pkt[..n]).is_err() {
                continue;
            }
            let now = self.now();
            let h = &mut self.host;
            h.engine
                .handle_packet(now, &h.core, &mut h.mem, self.meta, &self.pkt[..n]);
        }
    }

    /// Runs the engine until a receive completes; returns how many sends completed.
    fn until_received(&mut self) -> u32 {
        let mut sends = 0;
        loop {
            self.receive();
            if let Some(t) = self.host.engine.poll_timeout() {
                if t <= self.now() {
                    let now = self.now();
                    self.host.engine.handle_timeout(now);
                }
            }
            let mut got = false;
            while let Some(o) = self.host.engine.poll_output() {
                match o {
                    Output::Completion { cq, wc } if cq == self.cq => {
                        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                        if wc.opcode == softverbs_transport::wr::WcOpcode::Recv {
                            got = true;
                        } else {
                            sends += 1;
                        }
                    }
                    o => panic!("unexpected {o:?}"),
                }
            }
            if got {
                return sends;
            }
            self.transmit();
            std::hint::spin_loop();
        }
    }
}

/// A full socket buffer on loopback is the peer not keeping up: wait for room, as the
/// daemon's device does (the engine would retransmit a lost packet).
fn send(sock: &UdpSocket, p: &[u8], to: SocketAddr) {
    while let Err(e) = sock.send_to(p, to) {
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "send: {e}");
        std::hint::spin_loop();
    }
}

fn ip4(a: &SocketAddr) -> &Ipv4Addr {
    match a {
        SocketAddr::V4(v) => v.ip(),
        SocketAddr::V6(_) => unreachable!("IPv4 only"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--responder") {
        let (iters, size): (u64, u32) = (args[2].parse().unwrap(), args[3].parse().unwrap());
        let mut b = Side::new(1, size);
        b.post_recv(0);
        println!("ready");
        for i in 0..iters {
            b.until_received();
            b.post_recv(i + 1);
            b.post_send(i);
            b.transmit();
        }
        // Let the last ACKs leave and arrive before the socket closes.
        let end = Clock::now() + Duration::from_millis(50);
        while Clock::now() < end {
            b.receive();
            b.transmit();
        }
        return;
    }
    let iters: u64 = args.get(1).map_or(100_000, |s| s.parse().unwrap());
    let size: u32 = args.get(2).map_or(8, |s| s.parse().unwrap());
    let mut child = Command::new(&args[0])
        .args(["--responder", &iters.to_string(), &size.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the responder");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let mut a = Side::new(0, size);
    let warm = iters / 10;
    let mut t0 = Clock::now();
    let mut lat = Vec::with_capacity(iters as usize);
    for i in 0..iters {
        if i == warm {
            t0 = Clock::now();
        }
        let t = Clock::now();
        a.post_recv(i);
        a.post_send(i);
        a.transmit();
        a.until_received();
        lat.push(t.elapsed());
    }
    let total = t0.elapsed();
    child.wait().unwrap();
    let mut l = lat[warm as usize..].to_vec();
    l.sort();
    let half = |d: Duration| d.as_secs_f64() * 1e6 / 2.0;
    println!(
        "RC SEND {size} B over UDP, engine in each process: one-way median {:.2} µs, mean {:.2} µs, p99 {:.2} µs ({} round trips)",
        half(l[l.len() / 2]),
        total.as_secs_f64() * 1e6 / 2.0 / (iters - warm) as f64,
        half(l[l.len() * 99 / 100]),
        iters - warm
    );
}
