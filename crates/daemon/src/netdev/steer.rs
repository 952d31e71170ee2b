//! Steering a QP's RoCE v2 packets to a socket of the client process that owns the QP, the
//! first piece of the transport engine in the client library (docs/performance.md, "Issue
//! 16: what the engine in the client library would reach").
//!
//! **The group.** With steering on (the default; `SOFTVERBS_NET_STEER=0` turns it off) the
//! device socket is bound with `SO_REUSEPORT`, so further sockets of the same uid may bind the
//! same address and port 4791 and form a reuseport group with it. The daemon makes every
//! member itself ([`Steering::open`]) and hands a client a duplicate of one; the client reads
//! its QPs' packets there. The daemon's socket is the group's index 0 and every pool socket
//! the index it joined at (1, 2, ...). Sockets are never closed while the device lives — the
//! daemon keeps its own descriptor of each, and a freed one goes back to the pool for its uid
//! only (a process of that uid may still hold a duplicate) — so no index ever moves (the
//! kernel fills a closed member's index with the last member).
//!
//! **The program.** A classic BPF program attached to the group with
//! `SO_ATTACH_REUSEPORT_CBPF` picks the member for each datagram. It sees the UDP payload
//! from offset 0, the BTH (docs/roce-wire.md): `ld [4]` loads bytes 4..8 big-endian,
//! `and #0xffffff` leaves the destination QP, then one `jeq` / `ret #slot` pair per steered
//! QP and `ret #0` (the daemon's socket) for the rest. A datagram shorter than 8 bytes makes
//! the load fail, which ends the program with 0: runts go to the daemon, which rejects them.
//! The kernel takes at most 4096 instructions ([`MAX_STEERED`] QPs); past that
//! [`Steering::steer`] refuses with `ENOSPC` and the QP stays on the daemon's path. The
//! program is attached before the first pool socket joins: a group without one spreads
//! datagrams over its members by a hash of the addresses.
//!
//! **No GRO on the daemon's socket once the group has a pool member.** With `UDP_GRO` a
//! driver may coalesce datagrams of one 4-tuple for different destination QPs into one
//! buffer, which the kernel steers by its first datagram only; so the device turns `UDP_GRO`
//! off on its socket when the first pool socket joins and leaves it off, and pool sockets
//! never ask for it. The sending side keeps a GSO batch to one destination QP
//! (`NetDev::fits`) for the same reason: loopback delivers a GSO datagram whole to the one
//! socket its first segment selects.
//!
//! **Why turn it off.** `SO_REUSEPORT` lets any process of the daemon's uid bind the device's
//! address and port too and join the group. It then takes the next index, so the daemon's
//! next pool socket is one further than the slot the daemon counts, and the QPs steered to
//! that slot go to the intruder (and a member that closes moves the last one into its
//! index). A daemon running under a uid that other programs share may prefer
//! `SOFTVERBS_NET_STEER=0`: a plain socket, no group, [`Steering::open`] refused. Another
//! softverbs daemon on the same address still fails with `EADDRINUSE`: the device first
//! binds a plain socket to the address as a probe (`NetDev::bind`); only two daemons
//! binding in the same instant could both pass it.

use std::collections::BTreeMap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;

use nix::libc::{sock_filter, sock_fprog};

/// Most instructions a classic BPF program may have (`BPF_MAXINSNS`, include/uapi/linux/bpf_common.h).
const MAX_INSNS: usize = 4096;

/// Most QPs one device can steer: the program's two fixed instructions before the pairs and
/// one after them leave room for this many `jeq` / `ret` pairs.
pub const MAX_STEERED: usize = (MAX_INSNS - 3) / 2;

// Classic BPF opcodes (include/uapi/linux/bpf_common.h): class | size | mode | op | source.
/// `BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)`: load the 32-bit word at an absolute offset,
/// big-endian.
const LD_W_ABS: u16 = 0x20;
/// `BPF_ALU (0x04) | BPF_AND (0x50) | BPF_K (0)`.
const AND_K: u16 = 0x54;
/// `BPF_JMP (0x05) | BPF_JEQ (0x10) | BPF_K (0)`.
const JEQ_K: u16 = 0x15;
/// `BPF_RET (0x06) | BPF_K (0)`.
const RET_K: u16 = 0x06;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The program that sends each QP of `map` to its slot and everything else to slot 0.
pub(super) fn program(map: &BTreeMap<u32, u32>) -> io::Result<Vec<sock_filter>> {
    if map.len() > MAX_STEERED {
        return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC));
    }
    let mut p = Vec::with_capacity(3 + 2 * map.len());
    // The BTH's second word: OpCode-independent bytes 4..8, the destination QP in the low 24 bits.
    p.push(insn(LD_W_ABS, 0, 0, 4));
    p.push(insn(AND_K, 0, 0, 0x00ff_ffff));
    for (&qpn, &slot) in map {
        // Equal: fall through to the `ret`; else skip it.
        p.push(insn(JEQ_K, 0, 1, qpn));
        p.push(insn(RET_K, 0, 0, slot));
    }
    p.push(insn(RET_K, 0, 0, 0));
    Ok(p)
}

/// A socket of the group, made by the daemon.
struct PoolSocket {
    sock: UdpSocket,
    uid: u32,
    /// Given back ([`Steering::close`]): may go to `uid` again, never to anyone else.
    free: bool,
}

/// A device's steering state: the pool of group sockets and which QP goes to which.
pub(super) struct Steering {
    /// `SO_REUSEPORT` is on the device socket.
    pub(super) enabled: bool,
    /// Slot `i + 1` is `pool[i]`.
    pool: Vec<PoolSocket>,
    /// Destination QP to slot.
    qpns: BTreeMap<u32, u32>,
}

/// Creates a UDP socket for `addr`, with `SO_REUSEPORT` when `reuse_port`, bound, nonblocking.
pub(super) fn bound_socket(addr: SocketAddr, reuse_port: bool) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Discards every datagram queued on `sock`. `MSG_DONTWAIT`: a client holding a duplicate
/// shares the file's `O_NONBLOCK` and may have cleared it.
fn drain(sock: &UdpSocket) {
    let mut buf = [0u8; 64];
    loop {
        match rustix::net::recv(sock, &mut buf[..], rustix::net::RecvFlags::DONTWAIT) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) | Err(rustix::io::Errno::CONNREFUSED) => {}
            Err(_) => return,
        }
    }
}

fn attach(dev: &UdpSocket, map: &BTreeMap<u32, u32>) -> io::Result<()> {
    let mut prog = program(map)?;
    let fprog = sock_fprog {
        // At most MAX_INSNS (program checks), so it fits a u16.
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // The kernel copies the program during the call; `prog` outlives it.
    nix::sys::socket::setsockopt(dev, nix::sys::socket::sockopt::AttachReusePortCbpf, &fprog)?;
    Ok(())
}

fn no_slot(slot: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("no steered socket in slot {slot}"),
    )
}

impl Steering {
    pub(super) fn new(enabled: bool) -> Steering {
        Steering {
            enabled,
            pool: Vec::new(),
            qpns: BTreeMap::new(),
        }
    }

    /// Slots made so far (in use or free).
    pub(super) fn pool_len(&self) -> usize {
        self.pool.len()
    }

    /// QPs steered to a slot.
    pub(super) fn steered_qps(&self) -> usize {
        self.qpns.len()
    }

    fn in_use(&self, slot: u32) -> Option<&PoolSocket> {
        let i = (slot as usize).checked_sub(1)?;
        self.pool.get(i).filter(|p| !p.free)
    }

    /// A slot for `uid` and a duplicate of its socket: one `uid` gave back, else a new member
    /// of the group bound to `addr` (the device's address and actual port). `dev` is the
    /// device's socket: before the first member joins, its `UDP_GRO` goes off and the program
    /// is attached.
    pub(super) fn open(
        &mut self,
        dev: &UdpSocket,
        addr: SocketAddr,
        uid: u32,
    ) -> io::Result<(u32, OwnedFd)> {
        if !self.enabled {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "steering is off (SOFTVERBS_NET_STEER=0)",
            ));
        }
        if let Some(i) = self.pool.iter().position(|p| p.free && p.uid == uid) {
            let p = &mut self.pool[i];
            // Whatever arrived between close and now (a datagram the old program had
            // already steered here) is not the new owner's.
            drain(&p.sock);
            let fd = OwnedFd::from(p.sock.try_clone()?);
            p.free = false;
            return Ok((i as u32 + 1, fd));
        }
        if self.pool.is_empty() {
            nix::sys::socket::setsockopt(dev, nix::sys::socket::sockopt::UdpGroSegment, &false)?;
            attach(dev, &self.qpns)?;
        }
        let sock = bound_socket(addr, true)?;
        super::socket_options(&sock, addr.ip())?;
        let fd = OwnedFd::from(sock.try_clone()?);
        self.pool.push(PoolSocket {
            sock,
            uid,
            free: false,
        });
        Ok((self.pool.len() as u32, fd))
    }

    /// Sends destination QP `qpn` to `slot` (in use); `ENOSPC` past [`MAX_STEERED`] QPs.
    pub(super) fn steer(&mut self, dev: &UdpSocket, qpn: u32, slot: u32) -> io::Result<()> {
        if self.in_use(slot).is_none() {
            return Err(no_slot(slot));
        }
        if qpn > 0x00ff_ffff {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a QP number has 24 bits",
            ));
        }
        let old = self.qpns.insert(qpn, slot);
        if old == Some(slot) {
            return Ok(());
        }
        if let Err(e) = attach(dev, &self.qpns) {
            // The kernel kept the program before: so does the map.
            match old {
                Some(s) => self.qpns.insert(qpn, s),
                None => self.qpns.remove(&qpn),
            };
            return Err(e);
        }
        Ok(())
    }

    /// Sends `qpn` to the daemon's socket again.
    pub(super) fn unsteer(&mut self, dev: &UdpSocket, qpn: u32) {
        if self.qpns.remove(&qpn).is_some() {
            self.reattach(dev);
        }
    }

    /// Unsteers every QP of `slot`, discards what is queued on it and keeps it for its uid.
    pub(super) fn close(&mut self, dev: &UdpSocket, slot: u32) {
        if self.in_use(slot).is_none() {
            return;
        }
        let before = self.qpns.len();
        self.qpns.retain(|_, s| *s != slot);
        if self.qpns.len() != before {
            self.reattach(dev);
        }
        let p = &mut self.pool[slot as usize - 1];
        drain(&p.sock);
        p.free = true;
    }

    /// Attaches the program for the map after a removal (a shorter program than the one
    /// attached, so only a failing kernel refuses it; then the old one stays, logged).
    fn reattach(&self, dev: &UdpSocket) {
        if let Err(e) = attach(dev, &self.qpns) {
            tracing::warn!("reattaching the steering program: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `prog` on `payload` as the kernel's reuseport hook does (out-of-bounds load: 0).
    fn run(prog: &[sock_filter], payload: &[u8]) -> u32 {
        let mut a = 0u32;
        let mut pc = 0;
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    let at = i.k as usize;
                    let Some(w) = payload.get(at..at + 4) else {
                        return 0;
                    };
                    a = u32::from_be_bytes(w.try_into().unwrap());
                }
                AND_K => a &= i.k,
                JEQ_K => pc += if a == i.k { i.jt } else { i.jf } as usize,
                RET_K => return i.k,
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    fn bth(dqpn: u32) -> Vec<u8> {
        let mut b = vec![0u8; 12];
        b[0] = 0x04;
        // The byte above the QP (FECN/BECN/reserved) must not matter.
        b[4] = 0xc0;
        b[5..8].copy_from_slice(&dqpn.to_be_bytes()[1..]);
        b
    }

    #[test]
    fn the_program_picks_each_steered_qps_slot_and_zero_for_the_rest() {
        let map = BTreeMap::from([(17, 1), (0x00ab_cdef, 2), (5, 1)]);
        let p = program(&map).unwrap();
        assert_eq!(p.len(), 3 + 2 * 3);
        assert_eq!(run(&p, &bth(17)), 1);
        assert_eq!(run(&p, &bth(5)), 1);
        assert_eq!(run(&p, &bth(0x00ab_cdef)), 2);
        assert_eq!(run(&p, &bth(18)), 0);
        assert_eq!(run(&p, &[0x04, 0]), 0, "a runt goes to the daemon");
        assert_eq!(run(&program(&BTreeMap::new()).unwrap(), &bth(17)), 0);
    }

    #[test]
    fn the_program_is_refused_past_the_instruction_limit() {
        let mut map: BTreeMap<u32, u32> = (0..MAX_STEERED as u32).map(|q| (q, 1)).collect();
        assert_eq!(program(&map).unwrap().len(), MAX_INSNS - 1);
        map.insert(1 << 20, 1);
        let e = program(&map).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::ENOSPC));
    }
}
