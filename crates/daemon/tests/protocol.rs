//! The daemon at the protocol level: real sockets, raw messages. Proves that bad input gets an
//! errno (or, for broken framing, closes only that connection), and that other clients'
//! objects are untouched by anything a misbehaving client sends.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use softverbs_abi::codec::{decode_response, encode_request};
use softverbs_abi::msg::*;
use softverbs_abi::{ABI_VERSION, MAX_MSG};
use softverbs_daemon::{spawn_daemon_with, spawn_test_daemon, Config};
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

struct Raw {
    sock: OwnedFd,
    _events: Option<OwnedFd>,
}

impl Raw {
    fn connect(path: &std::path::Path, device: u32) -> Raw {
        let sock = softverbs_ipc::connect_seqpacket(path).unwrap();
        let mut raw = Raw {
            sock,
            _events: None,
        };
        let (status, _, mut fds) = raw.call_raw(
            Cmd::Hello,
            0,
            HelloReq {
                abi_version: U32::new(ABI_VERSION),
                device: U32::new(device),
            }
            .as_bytes(),
            &[],
        );
        assert_eq!(status, 0);
        raw._events = fds.pop();
        raw
    }

    fn send_bytes(&self, bytes: &[u8]) {
        softverbs_ipc::send(self.sock.as_fd(), bytes, &[]).unwrap();
    }

    fn recv(&self) -> Option<(Vec<u8>, Vec<OwnedFd>)> {
        let mut buf = vec![0u8; MAX_MSG];
        softverbs_ipc::recv(self.sock.as_fd(), &mut buf)
            .unwrap()
            .map(|d| (buf[..d.len].to_vec(), d.fds))
    }

    fn call_raw(
        &self,
        cmd: Cmd,
        comp: u64,
        body: &[u8],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> (i32, Vec<u8>, Vec<OwnedFd>) {
        let msg = encode_request(cmd, comp, body, 512);
        softverbs_ipc::send(self.sock.as_fd(), &msg, fds).unwrap();
        let (reply, fds) = self.recv().expect("daemon answered");
        let (hdr, rest) = RespHeader::read_from_prefix(&reply).unwrap();
        (hdr.status.get(), rest.to_vec(), fds)
    }

    fn call<R: FromBytes + IntoBytes + Immutable + KnownLayout + Default>(
        &self,
        cmd: Cmd,
        body: &[u8],
    ) -> Result<R, i32> {
        let msg = encode_request(cmd, 0, body, std::mem::size_of::<R>());
        softverbs_ipc::send(self.sock.as_fd(), &msg, &[]).unwrap();
        let (reply, _) = self.recv().expect("daemon answered");
        decode_response::<R>(&reply, cmd).unwrap()
    }
}

fn sock_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sv-proto-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("sv.sock")
}

/// Client B's XRC state: a domain on a file, an XRC SRQ and a receive QP it created.
struct XrcState {
    xrcd: u32,
    qpn: u32,
    srq: u32,
}

fn build_xrc_state(b: &Raw, file: &std::fs::File) -> XrcState {
    let o: OpenXrcdResp = {
        let msg = encode_request(
            Cmd::OpenXrcd,
            0,
            OpenXrcdReq {
                oflags: U32::new(0o100),
                has_fd: U32::new(1),
            }
            .as_bytes(),
            64,
        );
        softverbs_ipc::send(b.sock.as_fd(), &msg, &[file.as_fd()]).unwrap();
        decode_response(&b.recv().unwrap().0, Cmd::OpenXrcd)
            .unwrap()
            .unwrap()
    };
    let pd: HandleResp = b.call(Cmd::AllocPd, &[]).unwrap();
    let cq: CreateCqResp = b
        .call(
            Cmd::CreateCq,
            CreateCqReq {
                cqe: U32::new(16),
                comp_vector: U32::new(0),
                ..Default::default()
            }
            .as_bytes(),
        )
        .unwrap();
    let srq: SrqResp = b
        .call(
            Cmd::CreateXrcSrq,
            CreateXrcSrqReq {
                pd: pd.handle,
                xrcd: o.handle,
                cq: cq.handle,
                max_wr: U32::new(8),
                max_sge: U32::new(1),
                present: U32::new(PRESENT_PD | PRESENT_XRCD | PRESENT_CQ),
                ..Default::default()
            }
            .as_bytes(),
        )
        .unwrap();
    let q: QpNumResp = b
        .call(Cmd::CreateXrcRcvQp, XrcdReq { xrcd: o.handle }.as_bytes())
        .unwrap();
    XrcState {
        xrcd: o.handle.get(),
        qpn: q.qpn.get(),
        srq: srq.handle.get(),
    }
}

fn check_xrc_state(b: &Raw, s: &XrcState) {
    let q: QueryQpResp = b
        .call(
            Cmd::QueryXrcRcvQp,
            XrcRcvQpReq {
                xrcd: U32::new(s.xrcd),
                qp_num: U32::new(s.qpn),
            }
            .as_bytes(),
        )
        .expect("B's receive QP is intact");
    assert_eq!(q.qp_type.get(), 10);
    let n: SrqNumResp = b
        .call(
            Cmd::GetSrqNum,
            HandleReq {
                handle: U32::new(s.srq),
            }
            .as_bytes(),
        )
        .expect("B's SRQ is intact");
    assert!(n.srqn.get() > 0);
}

#[test]
fn a_hundred_thousand_bad_messages_get_errors_and_harm_no_one() {
    let path = sock_path("fuzz");
    let _d = spawn_test_daemon(&path).unwrap();
    let file = tempfile_in(&path);
    let b = Raw::connect(&path, 0);
    let state = build_xrc_state(&b, &file);

    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed);
    // Valid requests of every command, to mutate.
    let seeds: Vec<Vec<u8>> = Cmd::ALL
        .iter()
        .map(|&c| {
            let mut body = vec![0u8; request_size(c)];
            rng.fill(&mut body[..]);
            encode_request(c, 0, &body, 256)
        })
        .collect();
    let mut a = Raw::connect(&path, 0);
    let mut answered = 0u32;
    let mut reconnects = 0u32;
    for i in 0..100_000u32 {
        let msg: Vec<u8> = match i % 4 {
            // Random bytes of random length (including empty and oversized).
            0 => {
                let len = rng.gen_range(0..MAX_MSG + 64);
                (0..len).map(|_| rng.gen()).collect()
            }
            // A valid header with a random body.
            1 => {
                let c = Cmd::ALL[rng.gen_range(0..Cmd::ALL.len())];
                let len = rng.gen_range(0..200);
                let body: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                encode_request(c, rng.gen::<u64>() & 0x3, &body, rng.gen_range(0..600))
            }
            // A valid request with bit flips.
            2 => {
                let mut m = seeds[rng.gen_range(0..seeds.len())].clone();
                for _ in 0..rng.gen_range(1..4) {
                    let at = rng.gen_range(0..m.len());
                    m[at] ^= 1 << rng.gen_range(0..8);
                }
                m
            }
            // A valid request truncated or extended.
            _ => {
                let mut m = seeds[rng.gen_range(0..seeds.len())].clone();
                if rng.gen() {
                    m.truncate(rng.gen_range(0..m.len()));
                } else {
                    m.extend((0..rng.gen_range(1..32)).map(|_| rng.gen::<u8>()));
                }
                m
            }
        };
        // Empty datagrams are end-of-stream on SOCK_SEQPACKET: skip them.
        if msg.is_empty() {
            continue;
        }
        a.send_bytes(&msg);
        match a.recv() {
            Some((reply, _fds)) => {
                let (hdr, _) = RespHeader::read_from_prefix(&reply).expect("a well-formed reply");
                assert!(hdr.status.get() >= 0);
                answered += 1;
            }
            None => {
                // Broken framing (oversized) closes only this connection.
                assert!(
                    msg.len() > MAX_MSG,
                    "connection closed after a {}-byte message",
                    msg.len()
                );
                reconnects += 1;
                a = Raw::connect(&path, 0);
            }
        }
    }
    assert!(answered > 90_000, "answered {answered}");
    assert!(reconnects > 0);
    check_xrc_state(&b, &state);
    // The misbehaving client's own objects are torn down with it; B keeps its own.
    drop(a);
    check_xrc_state(&b, &state);
}

fn tempfile_in(sock: &std::path::Path) -> std::fs::File {
    let p = sock.with_file_name("xrc-domain");
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(p)
        .unwrap()
}

#[test]
fn handles_of_another_context_are_refused() {
    let path = sock_path("iso");
    let _d = spawn_test_daemon(&path).unwrap();
    let file = tempfile_in(&path);
    let b = Raw::connect(&path, 0);
    let state = build_xrc_state(&b, &file);
    let a = Raw::connect(&path, 0);
    for h in 0..64u32 {
        let r: Result<EventsResp, i32> = a.call(
            Cmd::DestroyQp,
            HandleReq {
                handle: U32::new(h),
            }
            .as_bytes(),
        );
        assert_eq!(r.unwrap_err(), 2, "ENOENT for handle {h}");
        let r: Result<EventsResp, i32> = a.call(
            Cmd::DestroySrq,
            HandleReq {
                handle: U32::new(h),
            }
            .as_bytes(),
        );
        assert_eq!(r.unwrap_err(), 2);
        let r: Result<(), i32> = a
            .call::<EventsResp>(
                Cmd::CloseXrcd,
                HandleReq {
                    handle: U32::new(h),
                }
                .as_bytes(),
            )
            .map(|_| ());
        assert_eq!(r.unwrap_err(), 2);
        let r: Result<QpNumResp, i32> = a.call(
            Cmd::RegXrcRcvQp,
            XrcRcvQpReq {
                xrcd: U32::new(h),
                qp_num: U32::new(state.qpn),
            }
            .as_bytes(),
        );
        assert_eq!(
            r.unwrap_err(),
            22,
            "EINVAL: not a domain handle of this context"
        );
    }
    check_xrc_state(&b, &state);
}

#[test]
fn commands_before_hello_and_stray_fds_are_einval() {
    let path = sock_path("hello");
    let _d = spawn_test_daemon(&path).unwrap();
    let sock = softverbs_ipc::connect_seqpacket(&path).unwrap();
    let raw = Raw {
        sock,
        _events: None,
    };
    let (status, _, _) = raw.call_raw(Cmd::AllocPd, 0, &[], &[]);
    assert_eq!(status, 22);
    let raw = Raw::connect(&path, 0);
    let file = tempfile_in(&path);
    let (status, _, _) = raw.call_raw(Cmd::AllocPd, 0, &[], &[file.as_fd()]);
    assert_eq!(status, 22, "a descriptor with a command that takes none");
    let (status, _, _) = raw.call_raw(
        Cmd::OpenXrcd,
        0,
        OpenXrcdReq {
            oflags: U32::new(0o100),
            has_fd: U32::new(1),
        }
        .as_bytes(),
        &[],
    );
    assert_eq!(status, 9, "EBADF: has_fd without a descriptor");
    let (status, _, _) = raw.call_raw(
        Cmd::Hello,
        0,
        HelloReq {
            abi_version: U32::new(2),
            device: U32::new(0),
        }
        .as_bytes(),
        &[],
    );
    assert_eq!(status, 22, "a second hello");
    let (status, _, _) = raw.call_raw(
        Cmd::OpenXrcd,
        0,
        OpenXrcdReq {
            oflags: U32::new(0),
            has_fd: U32::new(1),
        }
        .as_bytes(),
        &[file.as_fd()],
    );
    assert_eq!(status, 11, "EAGAIN: no domain for the file and no O_CREAT");
}

#[test]
fn create_flags_abi_extension_works_in_both_directions() {
    // Newer daemon (ABI 2), older client (ABI 1 struct, no comp_mask): works, flags read as 0.
    let path = sock_path("abi-new");
    let _d = spawn_test_daemon(&path).unwrap();
    let file = tempfile_in(&path);
    let c = Raw::connect(&path, 0);
    let st = build_xrc_state(&c, &file);
    let req = CreateQpReq {
        qp_type: U32::new(10),
        present: U32::new(PRESENT_XRCD),
        xrcd: U32::new(st.xrcd),
        create_flags: U32::new(1 << 1),
        ..Default::default()
    };
    let (v1_len, _) = request_layout(Cmd::CreateQp, 1);
    let (status, _, _) = c.call_raw(Cmd::CreateQp, 0, &req.as_bytes()[..v1_len], &[]);
    assert_eq!(status, 0, "an ABI-1 client's shorter struct is accepted");
    // Current client asking for create flags on the current daemon: the daemon understands
    // the field and refuses the flag value it does not implement.
    let (status, _, _) = c.call_raw(Cmd::CreateQp, CREATE_QP_CREATE_FLAGS, req.as_bytes(), &[]);
    assert_eq!(status, 95);
    drop(_d);

    // Older daemon (ABI 1), newer client announcing create_flags: EOPNOTSUPP.
    let path = sock_path("abi-old");
    let mut cfg = Config::new(path.clone());
    cfg.abi_version = 1;
    let _d = spawn_daemon_with(cfg).unwrap();
    let file = tempfile_in(&path);
    let c = Raw::connect(&path, 0);
    let st = build_xrc_state(&c, &file);
    let req = CreateQpReq {
        xrcd: U32::new(st.xrcd),
        ..req
    };
    let (status, _, _) = c.call_raw(Cmd::CreateQp, CREATE_QP_CREATE_FLAGS, req.as_bytes(), &[]);
    assert_eq!(
        status, 95,
        "an older daemon refuses the unknown comp_mask bit"
    );
    let plain = CreateQpReq {
        create_flags: U32::new(0),
        ..req
    };
    let (status, _, _) = c.call_raw(Cmd::CreateQp, 0, plain.as_bytes(), &[]);
    assert_eq!(
        status, 0,
        "a newer client that leaves the new field zero still works"
    );
}

/// Sends `OpenXrcd` with `fd` and returns the status the daemon answered.
fn open_xrcd_status(raw: &Raw, fd: std::os::fd::BorrowedFd<'_>) -> i32 {
    let (status, _, _) = raw.call_raw(
        Cmd::OpenXrcd,
        0,
        OpenXrcdReq {
            oflags: U32::new(0),
            has_fd: U32::new(1),
        }
        .as_bytes(),
        &[fd],
    );
    status
}

fn open_o_path(p: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_PATH.bits())
        .open(p)
}

/// An `O_PATH` descriptor needs no permission on the file, so it must not open the file's XRC
/// domain: `EBADF`, as uverbs answers (`fdget` ignores `O_PATH` files; docs/design/xrc-semantics.md,
/// open rules). As root the test also plays the attack: a user who may not read a 0600 domain
/// file (uid 65534) opens it `O_PATH` and asks to join the domain another process created.
#[test]
fn an_o_path_descriptor_does_not_join_a_domain() {
    use softverbs_core::errno::EBADF;
    let path = sock_path("opath");
    let _d = spawn_test_daemon(&path).unwrap();
    let owner = Raw::connect(&path, 0);
    let domain = tempfile_in(&path);
    let file = path.with_file_name("xrc-domain");
    let state = build_xrc_state(&owner, &domain);

    // Any uid: an O_PATH descriptor of the very file that names the domain is refused, and a
    // descriptor opened for reading still joins it.
    let joiner = Raw::connect(&path, 0);
    let opath = open_o_path(&file).unwrap();
    assert_eq!(open_xrcd_status(&joiner, opath.as_fd()), EBADF);
    let readable = std::fs::File::open(&file).unwrap();
    assert_eq!(open_xrcd_status(&joiner, readable.as_fd()), 0);

    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipping the other-uid half: needs root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(
        file.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    // The child reports with its exit code: 0 refused with EBADF; 1 could read the file (the
    // setup is wrong); 2 could not open it O_PATH; 3 the daemon let it join; 4 other.
    // SAFETY: the child only makes system calls and plain allocations (glibc's fork leaves
    // malloc usable in the child) and leaves with `exit` without printing, so no lock another test thread held
    // at fork time is ever waited for.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let nobody = nix::unistd::Uid::from_raw(65534);
            let nogroup = nix::unistd::Gid::from_raw(65534);
            let code = if nix::unistd::setgroups(&[]).is_err()
                || nix::unistd::setresgid(nogroup, nogroup, nogroup).is_err()
                || nix::unistd::setresuid(nobody, nobody, nobody).is_err()
            {
                4
            } else if std::fs::File::open(&file).is_ok() {
                1
            } else {
                match open_o_path(&file) {
                    Err(_) => 2,
                    Ok(fd) => {
                        let raw = Raw::connect(&path, 0);
                        match open_xrcd_status(&raw, fd.as_fd()) {
                            s if s == EBADF => 0,
                            0 => 3,
                            _ => 4,
                        }
                    }
                }
            };
            std::process::exit(code);
        }
        nix::unistd::ForkResult::Parent { child } => {
            let status = nix::sys::wait::waitpid(child, None).unwrap();
            assert_eq!(
                status,
                nix::sys::wait::WaitStatus::Exited(child, 0),
                "the other uid's O_PATH descriptor was not refused with EBADF (see the codes)"
            );
        }
    }
    // The domain and its receive QP are untouched.
    check_xrc_state(&owner, &state);
}

/// A process that is not dumpable cannot open its own `mem`; it sends a pidfd of itself and a
/// root daemon opens the file for it (docs/design/registered-memory.md, "A process that is not
/// dumpable"). A pidfd of any other process is `EINVAL`: the daemon opens memory only of the
/// process that sent the message.
#[test]
fn hello_takes_a_pidfd_only_of_the_sender() {
    let path = sock_path("hello-pidfd");
    let _d = spawn_test_daemon(&path).unwrap();
    let hello = |fds: &[std::os::fd::BorrowedFd<'_>]| {
        let raw = Raw {
            sock: softverbs_ipc::connect_seqpacket(&path).unwrap(),
            _events: None,
        };
        let body = HelloReq {
            abi_version: U32::new(ABI_VERSION),
            device: U32::new(0),
        };
        raw.call_raw(Cmd::Hello, HELLO_MEM_FD, body.as_bytes(), fds)
            .0
    };
    let mut other = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = |p: u32| rustix::process::Pid::from_raw(p as i32).unwrap();
    let theirs =
        rustix::process::pidfd_open(pid(other.id()), rustix::process::PidfdFlags::empty()).unwrap();
    assert_eq!(
        hello(&[theirs.as_fd()]),
        22,
        "EINVAL: another process's pidfd"
    );
    other.kill().unwrap();
    other.wait().unwrap();
    assert_eq!(
        hello(&[theirs.as_fd()]),
        22,
        "EINVAL: a dead process's pidfd"
    );
    let own = softverbs_memaccess::own_pidfd().unwrap();
    if rustix::process::geteuid().is_root() {
        assert_eq!(hello(&[own.as_fd()]), 0, "the sender's own pidfd");
    }
}

#[test]
fn hello_takes_only_the_senders_own_mem_opened_read_write() {
    let path = sock_path("hello-mem");
    let _d = spawn_test_daemon(&path).unwrap();
    let hello = |fds: &[std::os::fd::BorrowedFd<'_>], device: u32| {
        let raw = Raw {
            sock: softverbs_ipc::connect_seqpacket(&path).unwrap(),
            _events: None,
        };
        let body = HelloReq {
            abi_version: U32::new(ABI_VERSION),
            device: U32::new(device),
        };
        raw.call_raw(Cmd::Hello, HELLO_MEM_FD, body.as_bytes(), fds)
            .0
    };
    let rw = |p: &str| -> OwnedFd {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap()
            .into()
    };
    let own = rw("/proc/self/mem");
    assert_eq!(
        hello(&[own.as_fd()], 0),
        0,
        "the sender's own mem, read-write"
    );
    let ro: OwnedFd = std::fs::File::open("/proc/self/mem").unwrap().into();
    assert_eq!(hello(&[ro.as_fd()], 0), 9, "EBADF: not open for writing");
    let file = tempfile_in(&path);
    assert_eq!(
        hello(&[file.as_fd()], 0),
        22,
        "EINVAL: a writable file that is not mem"
    );
    let mut other = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let theirs = rw(&format!("/proc/{}/mem", other.id()));
    assert_eq!(
        hello(&[theirs.as_fd()], 0),
        22,
        "EINVAL: another process's mem"
    );
    other.kill().unwrap();
    other.wait().unwrap();
    assert_eq!(hello(&[], 0), 22, "EINVAL: the bit without a descriptor");
    assert_eq!(
        hello(&[own.as_fd(), own.as_fd()], 0),
        22,
        "EINVAL: two descriptors"
    );
    assert_eq!(
        hello(&[own.as_fd()], NO_DEVICE),
        22,
        "EINVAL: memory for a connection that opens no context"
    );
    // A daemon started at ABI 4 does not know the bit (the client then greets without it).
    drop(_d);
    let path = sock_path("hello-mem-old");
    let mut cfg = Config::new(path.clone());
    cfg.abi_version = 4;
    let _d = spawn_daemon_with(cfg).unwrap();
    let raw = Raw {
        sock: softverbs_ipc::connect_seqpacket(&path).unwrap(),
        _events: None,
    };
    let body = HelloReq {
        abi_version: U32::new(ABI_VERSION),
        device: U32::new(0),
    };
    let (status, _, _) = raw.call_raw(Cmd::Hello, HELLO_MEM_FD, body.as_bytes(), &[own.as_fd()]);
    assert_eq!(status, 95, "EOPNOTSUPP from an ABI 4 daemon");
    let (status, _, _) = raw.call_raw(Cmd::Hello, 0, body.as_bytes(), &[]);
    assert_eq!(
        status, 0,
        "and the plain greeting works on the same connection"
    );
}

/// ABI 7: `HELLO_MAPS_FD` adds the sender's own `/proc/self/maps` after its `mem`; anything
/// else in that place, or the bit without `mem`, is refused. An ABI 6 daemon refuses the bit.
#[test]
fn hello_takes_the_senders_own_maps_only_with_its_mem() {
    let path = sock_path("hello-maps");
    let d = spawn_test_daemon(&path).unwrap();
    let hello = |path: &std::path::Path, mask: u64, fds: &[std::os::fd::BorrowedFd<'_>]| {
        let raw = Raw {
            sock: softverbs_ipc::connect_seqpacket(path).unwrap(),
            _events: None,
        };
        let body = HelloReq {
            abi_version: U32::new(ABI_VERSION),
            device: U32::new(0),
        };
        raw.call_raw(Cmd::Hello, mask, body.as_bytes(), fds).0
    };
    let open = |p: &str, write: bool| -> OwnedFd {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(p)
            .unwrap()
            .into()
    };
    let mem = open("/proc/self/mem", true);
    let maps = open("/proc/self/maps", false);
    let status = open("/proc/self/status", false);
    let both = HELLO_MEM_FD | HELLO_MAPS_FD;
    assert_eq!(
        hello(&path, both, &[mem.as_fd(), maps.as_fd()]),
        0,
        "mem and maps"
    );
    assert_eq!(
        hello(&path, both, &[mem.as_fd(), status.as_fd()]),
        22,
        "EINVAL: another procfs file in the place of maps"
    );
    assert_eq!(
        hello(&path, both, &[mem.as_fd()]),
        22,
        "EINVAL: the bit without its descriptor"
    );
    assert_eq!(
        hello(&path, HELLO_MAPS_FD, &[maps.as_fd()]),
        22,
        "EINVAL: maps without mem"
    );
    drop(d);
    let path = sock_path("hello-maps-old");
    let mut cfg = Config::new(path.clone());
    cfg.abi_version = 6;
    let _d = spawn_daemon_with(cfg).unwrap();
    assert_eq!(
        hello(&path, both, &[mem.as_fd(), maps.as_fd()]),
        95,
        "EOPNOTSUPP from an ABI 6 daemon"
    );
    assert_eq!(
        hello(&path, HELLO_MEM_FD, &[mem.as_fd()]),
        0,
        "which takes mem alone"
    );
}
