//! `--capture DIR`: where a daemon writes one pcap file per device address, and the writer
//! of each file ([`Capture`]). With `--capture-rejected` ([`Rejected::Marked`]) the files are
//! pcapng and keep the packets the daemon rejected, each with its reason as a packet comment;
//! otherwise those are left out (docs/guide/capture.md, "Rejected packets").
//!
//! A root daemon writing by name into a directory another user can change would truncate or
//! create whatever file a planted symlink names (issue 35, item 9). So the directory must pass
//! `private_dir::open_checked` (it and its ancestors owned by root or the daemon's uid, not
//! writable by group or others; docs/design/security.md, "Paths") and each file is opened relative
//! to that descriptor with `O_NOFOLLOW` (open(2)): a symlink in its place is refused
//! (`ELOOP`), never followed. Either failure stops the daemon with the reason, since a capture
//! asked for and silently not written is worse than none.
//!
//! A capture is meant to be read while the daemon runs (`tail -f`-like readers, `tshark -r`
//! again and again): what is recorded reaches the file within [`FLUSH_AFTER`], on a deadline
//! the daemon's loop keeps (`DataPath::next_timeout`), not only at exit. Which packets are
//! recorded, and which not, is in docs/guide/capture.md.

use std::io::{self, BufWriter};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{openat, Mode, OFlags};
use softverbs_ipc::private_dir::{self, Owner};
use softverbs_transport::Reject;
use softverbs_wire::ip::{emit_ip_udp, IpRepr, UdpRepr};
use softverbs_wire::pcap::{ethernet_frame, PcapWriter};
use softverbs_wire::pcapng::PcapngWriter;

/// How long a recorded packet may wait in the writer's buffer. Well inside the second a
/// reader is promised, and long enough that a busy daemon writes a buffer per 100 ms rather
/// than a syscall per packet.
pub const FLUSH_AFTER: Duration = Duration::from_millis(100);

/// What a capture records besides what the daemon sent and accepted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rejected {
    /// Nothing: a received packet the daemon dropped is left out (classic pcap,
    /// `DEVICE.pcap`).
    #[default]
    Left,
    /// Rejected packets too, each with its reason as a pcapng packet comment,
    /// "softverbs: rejected: REASON" (`--capture-rejected`, `DEVICE.pcapng`).
    Marked,
}

impl Rejected {
    /// The file name of a device address's capture (`DEVICE`, or `DEVICE-K` for its
    /// address K > 0) in this mode.
    pub fn file_name(self, stem: &str) -> String {
        match self {
            Rejected::Left => format!("{stem}.pcap"),
            Rejected::Marked => format!("{stem}.pcapng"),
        }
    }
}

/// The comment a rejected packet carries in a capture.
pub fn comment(r: Reject) -> String {
    format!("softverbs: rejected: {}", r.words())
}

enum Writer {
    /// Classic libpcap format, `LINKTYPE_ETHERNET`: every tool reads it
    /// (softverbs_wire::pcap).
    Pcap(PcapWriter<BufWriter<std::fs::File>>),
    /// pcapng, for its per-packet comments (softverbs_wire::pcapng).
    Pcapng(PcapngWriter<BufWriter<std::fs::File>>),
}

/// A received packet whose fate is not known yet: the engine judges it after the socket
/// handed it over, and it is written (or left out) once [`Capture::verdict`] says, or
/// written as accepted when the next packet comes first (the CM's, the net path's, which
/// get no verdict here).
struct Pending {
    ts: Duration,
    frame: Vec<u8>,
}

/// One capture file being written.
pub struct Capture {
    w: Writer,
    rejected: Rejected,
    pending: Option<Pending>,
    /// When the oldest packet not yet flushed was recorded.
    unflushed_since: Option<Instant>,
    /// A write failed (disk full, ...): said once, not per packet.
    failed: bool,
    name: String,
}

impl Capture {
    /// Starts the file `name` (for messages) with its header, flushed at once: a reader
    /// finds a valid, empty capture as soon as the daemon serves, and a file that cannot be
    /// written fails here, at start.
    pub fn new(file: std::fs::File, name: &str, rejected: Rejected) -> io::Result<Capture> {
        let at = |e: io::Error| io::Error::new(e.kind(), format!("--capture: {name}: {e}"));
        let mut w = match rejected {
            Rejected::Left => Writer::Pcap(PcapWriter::new(BufWriter::new(file)).map_err(at)?),
            Rejected::Marked => {
                Writer::Pcapng(PcapngWriter::new(BufWriter::new(file)).map_err(at)?)
            }
        };
        match &mut w {
            Writer::Pcap(w) => w.flush(),
            Writer::Pcapng(w) => w.flush(),
        }
        .map_err(at)?;
        Ok(Capture {
            w,
            rejected,
            pending: None,
            unflushed_since: None,
            failed: false,
            name: name.to_string(),
        })
    }

    /// Records the RoCE v2 datagram `ip | udp | pkt` (`pkt`: BTH through the ICRC, as on
    /// the wire) in a synthetic Ethernet frame, stamped with the wall clock (pcap
    /// timestamps are UTC).
    pub fn record(&mut self, ip: &IpRepr, udp: &UdpRepr, pkt: &[u8]) {
        self.settle(None);
        if let Some((ts, f)) = frame(ip, udp, pkt) {
            self.write(ts, &f, None);
        }
    }

    /// Records a received datagram whose fate the engine has yet to decide: it is written
    /// when [`verdict`](Self::verdict) says it was taken, or rejected in the mode that
    /// keeps rejected packets, and left out if rejected otherwise.
    pub fn record_received(&mut self, ip: &IpRepr, udp: &UdpRepr, pkt: &[u8]) {
        self.settle(None);
        if let Some((ts, frame)) = frame(ip, udp, pkt) {
            self.pending = Some(Pending { ts, frame });
            self.unflushed_since.get_or_insert_with(Instant::now);
        }
    }

    /// Records a datagram rejected before any engine saw it (`why`): written with its
    /// reason in the mode that keeps rejected packets, left out otherwise.
    pub fn record_rejected(&mut self, ip: &IpRepr, udp: &UdpRepr, pkt: &[u8], why: Reject) {
        self.settle(None);
        if self.rejected == Rejected::Left {
            return;
        }
        if let Some((ts, f)) = frame(ip, udp, pkt) {
            self.write(ts, &f, Some(why));
        }
    }

    /// The engine's verdict on the datagram last given to
    /// [`record_received`](Self::record_received): `None` taken, `Some` rejected.
    pub fn verdict(&mut self, why: Option<Reject>) {
        self.settle(why);
    }

    /// Writes the pending packet, if any, as `why` says.
    fn settle(&mut self, why: Option<Reject>) {
        let Some(p) = self.pending.take() else {
            return;
        };
        if why.is_some() && self.rejected == Rejected::Left {
            return;
        }
        self.write(p.ts, &p.frame, why);
    }

    fn write(&mut self, ts: Duration, f: &[u8], why: Option<Reject>) {
        let r = match &mut self.w {
            Writer::Pcap(w) => w.write_frame(ts, f),
            Writer::Pcapng(w) => w.write_frame(ts, f, why.map(comment).as_deref()),
        };
        match r {
            Ok(()) => {
                self.unflushed_since.get_or_insert_with(Instant::now);
            }
            Err(e) => self.failed(&e),
        }
    }

    /// When the packets waiting in the buffer must be flushed, if any wait.
    pub fn due(&self) -> Option<Instant> {
        self.unflushed_since.map(|t| t + FLUSH_AFTER)
    }

    /// Flushes if a packet has waited [`FLUSH_AFTER`] by `now`.
    pub fn flush_if_due(&mut self, now: Instant) {
        if self.due().is_some_and(|d| d <= now) {
            self.flush();
        }
    }

    /// Writes out everything recorded.
    pub fn flush(&mut self) {
        // A packet still waiting for its verdict is as old as its deadline says: the
        // engine judged it in the round it arrived, so no verdict now means none comes
        // (the CM's, the net path's packets), and it is written as taken.
        self.settle(None);
        if self.unflushed_since.take().is_some() {
            let r = match &mut self.w {
                Writer::Pcap(w) => w.flush(),
                Writer::Pcapng(w) => w.flush(),
            };
            if let Err(e) = r {
                self.failed(&e);
            }
        }
    }

    fn failed(&mut self, e: &io::Error) {
        if !self.failed {
            self.failed = true;
            tracing::error!("capture {}: {e}: packets are missing from it", self.name);
        }
    }
}

/// `ip | udp | pkt` in a synthetic Ethernet frame, and the wall clock now (capture
/// timestamps are UTC).
fn frame(ip: &IpRepr, udp: &UdpRepr, pkt: &[u8]) -> Option<(Duration, Vec<u8>)> {
    let mut d = vec![0u8; ip.header_len() + 8 + pkt.len()];
    let hl = emit_ip_udp(ip, udp, pkt.len(), &mut d).ok()?;
    d[hl..].copy_from_slice(pkt);
    let f = ethernet_frame(&d).ok()?;
    let ts = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    Some((ts, f))
}

/// A checked capture directory.
pub struct CaptureDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl CaptureDir {
    /// Opens and checks `path`, or says why it will not be written to.
    pub fn open(path: &Path) -> io::Result<CaptureDir> {
        let fd = private_dir::open_checked(path, Owner::MeOrRoot)
            .map_err(|e| io::Error::new(e.kind(), format!("--capture: {e}")))?;
        Ok(CaptureDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Creates (or truncates) the capture file `name` in it, never through a symlink, and
    /// writes its header. Mode 0600: a capture holds every user's traffic.
    pub fn create(&self, name: &str, rejected: Rejected) -> io::Result<Capture> {
        let file = self.create_file(name)?;
        Capture::new(file, &self.path.join(name).display().to_string(), rejected)
    }

    fn create_file(&self, name: &str) -> io::Result<std::fs::File> {
        let flags = OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::TRUNC
            | OFlags::NOFOLLOW
            | OFlags::NOCTTY
            | OFlags::CLOEXEC;
        openat(&self.fd, name, flags, Mode::from_raw_mode(0o600))
            .map(std::fs::File::from)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "--capture: {}: {e}{}",
                        self.path.join(name).display(),
                        if e == rustix::io::Errno::LOOP {
                            " (a symlink: refused, not followed)"
                        } else {
                            ""
                        }
                    ),
                )
            })
    }
}
