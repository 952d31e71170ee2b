//! A child process to aim at: the test (or bench) binary re-run in a child role.
//!
//! The parent runs its own executable with `SOFTVERBS_MEMACCESS_CHILD=<role>` and the
//! parent's pid in `SOFTVERBS_MEMACCESS_PARENT`. The child allocates a page-aligned buffer
//! filled with [`pattern`], optionally shares it in place, authorises the parent when it is
//! not root, prints `READY <addr> <len> <fd>` and then answers one command per line on
//! stdin:
//!
//! * `get <off> <len>` → `BYTES <hex>` (the child's own view of its buffer);
//! * `set <off> <hex>` → `OK`;
//! * `add <off> <flag>` → `COUNT <n>`: `fetch_add(1)` on the aligned u64 at `off` until the
//!   u64 at `flag` is non-zero, then how many increments it did;
//! * `exit` → exits.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

/// Environment variable naming the child role.
pub const ROLE: &str = "SOFTVERBS_MEMACCESS_CHILD";
const PARENT: &str = "SOFTVERBS_MEMACCESS_PARENT";
const LEN: &str = "SOFTVERBS_MEMACCESS_LEN";

/// Byte `i` of the initial buffer.
pub fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8)) as u8
}

/// A fresh private anonymous mapping (what a large `malloc` gives), accessed through a raw
/// pointer only (another process writes it behind our back).
pub struct PageBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is only accessed through volatile/atomic raw-pointer operations.
unsafe impl Sync for PageBuf {}

impl PageBuf {
    /// `len` (> 0) zero bytes, page-aligned.
    pub fn new(len: usize) -> Self {
        // SAFETY: no address hint, so no existing mapping is replaced.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }
        .unwrap();
        Self {
            ptr: ptr.cast(),
            len,
        }
    }

    /// Address of the first byte.
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Reads byte `i` (volatile: another process may have written it).
    pub fn get(&self, i: usize) -> u8 {
        assert!(i < self.len());
        // SAFETY: `i` is in bounds of our live allocation.
        unsafe { self.ptr.add(i).read_volatile() }
    }

    /// Writes byte `i`.
    pub fn set(&self, i: usize, v: u8) {
        assert!(i < self.len());
        // SAFETY: `i` is in bounds of our live allocation.
        unsafe { self.ptr.add(i).write_volatile(v) }
    }

    /// Maps fresh zeroed private anonymous memory over the whole buffer (`MAP_FIXED`), as a
    /// program reusing the addresses would.
    #[allow(dead_code)] // Used by some of the test binaries that include this module.
    pub fn replace_with_fresh_anonymous(&self) {
        // SAFETY: replaces exactly our own range; nothing holds a reference into it (all
        // access is through raw pointers).
        unsafe {
            rustix::mm::mmap_anonymous(
                self.ptr.cast(),
                self.len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED,
            )
        }
        .unwrap();
    }

    /// The aligned u64 at `off` as an atomic.
    pub fn atomic(&self, off: usize) -> &AtomicU64 {
        assert!(off % 8 == 0 && off + 8 <= self.len());
        // SAFETY: in bounds, 8-aligned (the buffer is page-aligned), lives as long as `self`,
        // and only accessed atomically or through raw pointers.
        unsafe { AtomicU64::from_ptr(self.ptr.add(off).cast()) }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: the range mapped in `new` (possibly converted in place since, which keeps
        // it one range of ours).
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}

/// If this process was started in a child role, runs it and exits.
pub fn run_child_if_requested() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let len: usize = std::env::var(LEN).unwrap().parse().unwrap();
    let parent: i32 = std::env::var(PARENT).unwrap().parse().unwrap();
    let buf = PageBuf::new(len);
    for i in 0..len {
        buf.set(i, pattern(i));
    }
    if !rustix::process::geteuid().is_root() {
        softverbs_memaccess::authorize_daemon(parent).expect("authorize the parent");
    }
    let fd = match role.as_str() {
        "plain" => None,
        "shared" => Some(softverbs_memaccess::share_in_place(buf.addr(), len).unwrap()),
        other => panic!("unknown child role {other}"),
    };
    let raw = fd.as_ref().map_or(-1, std::os::fd::AsRawFd::as_raw_fd);
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {:#x} {len} {raw}", buf.addr()).unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["get", off, n] => {
                let (off, n): (usize, usize) = (off.parse().unwrap(), n.parse().unwrap());
                let hex: String = (off..off + n)
                    .map(|i| format!("{:02x}", buf.get(i)))
                    .collect();
                writeln!(out, "BYTES {hex}").unwrap();
            }
            ["set", off, hex] => {
                let off: usize = off.parse().unwrap();
                for (k, b) in unhex(hex).into_iter().enumerate() {
                    buf.set(off + k, b);
                }
                writeln!(out, "OK").unwrap();
            }
            ["add", off, flag] => {
                let a = buf.atomic(off.parse().unwrap());
                let flag = buf.atomic(flag.parse().unwrap());
                let mut n = 0u64;
                while flag.load(Ordering::SeqCst) == 0 {
                    a.fetch_add(1, Ordering::SeqCst);
                    n += 1;
                }
                writeln!(out, "COUNT {n}").unwrap();
            }
            ["exit"] => break,
            _ => panic!("bad command {line}"),
        }
        out.flush().unwrap();
    }
    drop(fd);
    std::process::exit(0);
}

/// Hex string → bytes.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Bytes → hex string.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// A running child in some role.
pub struct ChildProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Pid.
    pub pid: i32,
    /// Address of its buffer.
    pub addr: u64,
    /// Length of its buffer.
    pub len: usize,
    /// Its memfd number (for `/proc/<pid>/fd/<n>`), `-1` if not shared.
    pub fd: i32,
}

impl ChildProc {
    /// Starts this executable as a child in `role` with a buffer of `len` bytes; `args` are
    /// passed through (for a test binary: the name of the test that runs
    /// [`run_child_if_requested`]).
    pub fn spawn(role: &str, len: usize, args: &[&str]) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(args)
            .env(ROLE, role)
            .env(LEN, len.to_string())
            .env(PARENT, std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let pid = child.id() as i32;
        let mut line = String::new();
        let (addr, len, fd) = loop {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "child exited early"
            );
            // libtest may have printed `test child_role ... ` on the same line.
            if let Some((_, rest)) = line.trim().split_once("READY ") {
                let w: Vec<&str> = rest.split(' ').collect();
                break (
                    u64::from_str_radix(w[0].trim_start_matches("0x"), 16).unwrap(),
                    w[1].parse().unwrap(),
                    w[2].parse().unwrap(),
                );
            }
        };
        Self {
            child,
            stdin,
            stdout,
            pid,
            addr,
            len,
            fd,
        }
    }

    fn ask(&mut self, cmd: &str, prefix: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "child died");
            if let Some(rest) = line.trim().strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
        }
    }

    /// The child's own view of `n` bytes at offset `off` of its buffer.
    pub fn get(&mut self, off: usize, n: usize) -> Vec<u8> {
        unhex(&self.ask(&format!("get {off} {n}"), "BYTES"))
    }

    /// The child writes `data` at offset `off` itself.
    pub fn set(&mut self, off: usize, data: &[u8]) {
        self.ask(&format!("set {off} {}", hex(data)), "OK");
    }

    /// Makes the child increment the u64 at `off` atomically until the u64 at `flag` is
    /// non-zero, without waiting for the answer.
    pub fn start_add(&mut self, off: usize, flag: usize) {
        writeln!(self.stdin, "add {off} {flag}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for the answer to [`start_add`](Self::start_add): the child's increments.
    pub fn finish_add(&mut self) -> u64 {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "child died");
            if let Some(n) = line.trim().strip_prefix("COUNT ") {
                return n.parse().unwrap();
            }
        }
    }

    /// Opens the child's memfd (`/proc/<pid>/fd/<n>`), as the daemon would receive it over
    /// the socket.
    pub fn open_memfd(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{}/fd/{}", self.pid, self.fd))
            .unwrap()
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}
