//! ProcessMem against real child processes: reads and writes through a `/proc/<pid>/mem`
//! descriptor, what [`ProcessMemory::validate`] refuses, and that the descriptor reaches
//! nothing once its process has exited or `execve`d.

mod common;

use std::io::Write;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{pattern, ChildProc};
use softverbs_core::ids::CtxId;
use softverbs_core::memory::{AtomicOp, Memory};
use softverbs_memaccess::{open_own_memory, page_size, MemFdError, ProcessMem, ProcessMemory};

const CTX: CtxId = CtxId(9);

/// Not a test: the entry point of the child role (does nothing in a normal run).
#[test]
fn child_role() {
    common::run_child_if_requested();
}

fn spawn(len: usize) -> ChildProc {
    ChildProc::spawn(
        "plain",
        len,
        &["child_role", "--exact", "--nocapture", "--test-threads=1"],
    )
}

/// `/proc/<pid>/mem` opened read-write by this process (the same kind of descriptor a
/// client opens on itself and passes).
fn mem_of(pid: i32) -> OwnedFd {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .unwrap()
        .into()
}

#[test]
fn process_mem_reads_and_writes_a_child() {
    let len = 3 * page_size() + 100;
    let mut child = spawn(len);
    let mem = ProcessMemory::validate(mem_of(child.pid), child.pid as u32).unwrap();
    let mut pm = ProcessMem::new();
    pm.register_process(CTX, mem);
    assert_eq!(pm.pid(CTX), Some(child.pid as u32));

    let mut all = vec![0; len];
    pm.read(CTX, child.addr, &mut all).unwrap();
    assert_eq!(all, (0..len).map(pattern).collect::<Vec<_>>());
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    pm.write(CTX, child.addr + 1000, &data).unwrap();
    // Held back until flushed (the daemon flushes before completions and ACKs leave).
    pm.flush().unwrap();
    assert_eq!(child.get(1000, data.len()), data);
    child.set(64, &40u64.to_ne_bytes());
    let old = pm
        .atomic(CTX, child.addr + 64, AtomicOp::FetchAdd { add: 2 })
        .unwrap();
    assert_eq!((old, child.get(64, 8)), (40, 42u64.to_ne_bytes().to_vec()));

    // Unmapped addresses, addresses past the signed file offsets, unknown contexts: faults.
    let mut b = [0u8; 16];
    assert!(pm.read(CTX, 8, &mut b).is_err());
    assert!(pm.write(CTX, 8, &b).and_then(|()| pm.flush()).is_err());
    assert!(pm.read(CTX, u64::MAX - 3, &mut b).is_err());
    assert!(pm.read(CtxId(1), child.addr, &mut b).is_err());
    pm.read(CTX, child.addr, &mut []).unwrap();

    // Once the process has exited, its descriptor reaches nothing.
    let (pid, addr) = (child.pid as u32, child.addr);
    drop(child);
    assert!(pm.read(CTX, addr, &mut b).is_err());
    assert!(pm.write(CTX, addr, &b).and_then(|()| pm.flush()).is_err());
    assert_eq!(pm.unregister_process(CTX), Some(pid));
}

#[test]
fn validate_takes_only_the_senders_own_mem_opened_read_write() {
    let me = std::process::id();
    assert_eq!(
        me,
        ProcessMemory::validate(open_own_memory().unwrap(), me)
            .unwrap()
            .pid()
    );

    let refused = |fd: OwnedFd, pid: u32| ProcessMemory::validate(fd, pid).unwrap_err();
    let einval = libc_errno::EINVAL;
    let ebadf = libc_errno::EBADF;

    // Not open for writing (read-only, O_PATH): EBADF, as uverbs answers for such a file.
    let ro: OwnedFd = std::fs::File::open("/proc/self/mem").unwrap().into();
    let e = refused(ro, me);
    assert!(matches!(e, MemFdError::NotReadWrite), "{e}");
    assert_eq!(e.errno(), ebadf);
    let path = rustix::fs::open(
        "/proc/self/mem",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    assert_eq!(refused(path, me).errno(), ebadf);

    // A writable file that is not a process's memory: EINVAL.
    let dir = std::env::temp_dir().join(format!("svmem-{me}"));
    std::fs::create_dir_all(&dir).unwrap();
    let file: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("mem"))
        .unwrap()
        .into();
    let e = refused(file, me);
    assert!(matches!(e, MemFdError::NotPeerMem { .. }), "{e}");
    assert_eq!(e.errno(), einval);
    let _ = std::fs::remove_dir_all(&dir);
    let memfd = rustix::fs::memfd_create("mem", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    assert_eq!(refused(memfd, me).errno(), einval);
    // Another procfs file of the sender.
    let environ: OwnedFd = std::fs::File::open("/proc/self/environ").unwrap().into();
    assert_eq!(refused(environ, me).errno(), einval);

    // Another process's memory offered as the sender's: EINVAL.
    let child = spawn(page_size());
    assert_eq!(refused(mem_of(child.pid), me).errno(), einval);
    assert_eq!(
        refused(open_own_memory().unwrap(), child.pid as u32).errno(),
        einval
    );
}

#[test]
fn after_execve_the_descriptor_reaches_neither_image() {
    // A shell that execs `sleep` when told to: the same pid, a new address space.
    let mut sh = Command::new("/bin/sh")
        .args(["-c", "read x; exec sleep 30"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = sh.id() as i32;
    let first_readable = || -> u64 {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let line = maps.lines().find(|l| l.contains(" r")).unwrap();
        u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap()
    };
    let addr = first_readable();
    let mut pm = ProcessMem::new();
    pm.register_process(
        CTX,
        ProcessMemory::validate(mem_of(pid), pid as u32).unwrap(),
    );
    let mut b = [0u8; 8];
    pm.read(CTX, addr, &mut b).unwrap();

    let exe_before = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    writeln!(sh.stdin.as_mut().unwrap()).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while std::fs::read_link(format!("/proc/{pid}/exe")).unwrap() == exe_before {
        assert!(Instant::now() < end, "the shell did not exec within 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Wait until the new image has mapped itself (its first mapping is readable).
    let new_addr = first_readable();
    assert!(pm.read(CTX, addr, &mut b).is_err(), "the old image is gone");
    assert!(
        pm.read(CTX, new_addr, &mut b).is_err(),
        "the new image is not reached"
    );
    assert!(pm
        .write(CTX, new_addr, &b)
        .and_then(|()| pm.flush())
        .is_err());
    sh.kill().unwrap();
    sh.wait().unwrap();
}

/// Linux errno values the daemon answers with.
mod libc_errno {
    pub use softverbs_core::errno::{EBADF, EINVAL};
}
