//! `--capture DIR`: where a daemon writes one pcap file per device address, and the writer
//! of each file ([`Capture`]).
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
use softverbs_wire::ip::{emit_ip_udp, IpRepr, UdpRepr};
use softverbs_wire::pcap::{ethernet_frame, PcapWriter};

/// How long a recorded packet may wait in the writer's buffer. Well inside the second a
/// reader is promised, and long enough that a busy daemon writes a buffer per 100 ms rather
/// than a syscall per packet.
pub const FLUSH_AFTER: Duration = Duration::from_millis(100);

/// One pcap file being written (classic libpcap format, `LINKTYPE_ETHERNET`: every tool
/// reads it; softverbs_wire::pcap).
pub struct Capture {
    w: PcapWriter<BufWriter<std::fs::File>>,
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
    pub fn new(file: std::fs::File, name: &str) -> io::Result<Capture> {
        let mut w = PcapWriter::new(BufWriter::new(file))?;
        w.flush()
            .map_err(|e| io::Error::new(e.kind(), format!("--capture: {name}: {e}")))?;
        Ok(Capture {
            w,
            unflushed_since: None,
            failed: false,
            name: name.to_string(),
        })
    }

    /// Records the RoCE v2 datagram `ip | udp | pkt` (`pkt`: BTH through the ICRC, as on
    /// the wire) in a synthetic Ethernet frame, stamped with the wall clock (pcap
    /// timestamps are UTC).
    pub fn record(&mut self, ip: &IpRepr, udp: &UdpRepr, pkt: &[u8]) {
        let mut d = vec![0u8; ip.header_len() + 8 + pkt.len()];
        let Ok(hl) = emit_ip_udp(ip, udp, pkt.len(), &mut d) else {
            return;
        };
        d[hl..].copy_from_slice(pkt);
        let Ok(f) = ethernet_frame(&d) else {
            return;
        };
        let ts = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        match self.w.write_frame(ts, &f) {
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
        if self.unflushed_since.take().is_some() {
            if let Err(e) = self.w.flush() {
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
    pub fn create(&self, name: &str) -> io::Result<Capture> {
        let file = self.create_file(name)?;
        Capture::new(file, &self.path.join(name).display().to_string())
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
