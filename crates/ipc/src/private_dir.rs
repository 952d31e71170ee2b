//! The one rule for directories softverbs creates or writes into by name (docs/security.md,
//! "Paths"): a directory is trusted only if no other user can change what its path names.
//!
//! A path is walked from `/` one component at a time with `openat(O_PATH | O_NOFOLLOW |
//! O_DIRECTORY)` and each directory is checked on the descriptor (`fstat`), so a symlink
//! anywhere on the way is refused (open(2): `O_NOFOLLOW`) and the check and the use are of
//! the same directory:
//!
//! - every ancestor is owned by root or by this process's effective uid, and is not writable
//!   by group or others unless it is sticky (`/tmp`: inode(7), "S_ISVTX" — only an entry's
//!   owner may rename or remove it there);
//! - the directory itself is owned by this euid (or, where the caller allows it, root) and is
//!   not writable by group or others, sticky or not.
//!
//! A path that passes cannot be redirected by anyone but this uid and root, so its name may be
//! handed on (`LD_LIBRARY_PATH`, `bind(2)` of a Unix socket) without a check-then-use window.
//! Missing components are made with `mkdirat` (which never follows a symlink and fails on an
//! existing entry), then opened and checked like the others: a directory another user planted
//! first is refused, never adopted.

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{fstat, mkdirat, openat, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;
use rustix::process::geteuid;

/// Whose directory the last component may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// This process's effective uid only (a directory of the user's own).
    Me,
    /// This euid or root (e.g. a daemon's socket directory made by root for everyone).
    MeOrRoot,
}

const DIR_FLAGS: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Group or other write permission.
const SHARED_WRITE: u32 = 0o022;
/// S_ISVTX.
const STICKY: u32 = 0o1000;

fn refuse(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "refusing {}: {why} (docs/security.md, \"Paths\")",
            path.display()
        ),
    )
}

/// Checks the directory open at `fd` (reached as `path`): see the module comment.
fn check(fd: &OwnedFd, path: &Path, last: Option<Owner>) -> io::Result<()> {
    let st = fstat(fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(refuse(path, "not a directory"));
    }
    let me = geteuid().as_raw();
    let uid = st.st_uid;
    let mode = st.st_mode;
    let owner_ok = match last {
        Some(Owner::Me) => uid == me,
        Some(Owner::MeOrRoot) | None => uid == me || uid == 0,
    };
    if !owner_ok {
        return Err(refuse(
            path,
            format_args!("owned by uid {uid}, not by uid {me}"),
        ));
    }
    let shared = mode & SHARED_WRITE != 0;
    if shared && (last.is_some() || mode & STICKY == 0) {
        return Err(refuse(
            path,
            format_args!("writable by group or others (mode {:o})", mode & 0o7777),
        ));
    }
    Ok(())
}

/// The components of `path` (made absolute against the working directory); `..` is refused,
/// since it would leave a directory already checked.
fn components(path: &Path) -> io::Result<Vec<PathBuf>> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut out = Vec::new();
    for c in abs.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(PathBuf::from(n)),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: `..` in a checked path", path.display()),
                ))
            }
        }
    }
    Ok(out)
}

fn walk(path: &Path, create: Option<u32>, owner: Owner) -> io::Result<OwnedFd> {
    let parts = components(path)?;
    let mut cur = openat(CWD, "/", DIR_FLAGS, Mode::empty())?;
    let mut at = PathBuf::from("/");
    check(&cur, &at, parts.is_empty().then_some(owner))?;
    for (i, name) in parts.iter().enumerate() {
        at.push(name);
        let last = i + 1 == parts.len();
        let open = |cur: &OwnedFd| openat(cur, name.as_path(), DIR_FLAGS, Mode::empty());
        let opened = match (open(&cur), create) {
            (Err(Errno::NOENT), Some(mode)) => {
                match mkdirat(&cur, name.as_path(), Mode::from_raw_mode(mode)) {
                    // EEXIST: made meanwhile by someone else; checked below like any other.
                    Ok(()) | Err(Errno::EXIST) => open(&cur),
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("mkdir {}: {e}", at.display()),
                        ))
                    }
                }
            }
            (r, _) => r,
        };
        let next = opened.map_err(|e| match e {
            // O_NOFOLLOW | O_DIRECTORY on a symlink: ENOTDIR (or ELOOP).
            Errno::NOTDIR | Errno::LOOP => refuse(&at, "a symlink or not a directory"),
            e => io::Error::new(e.kind(), format!("{}: {e}", at.display())),
        })?;
        check(&next, &at, last.then_some(owner))?;
        cur = next;
    }
    Ok(cur)
}

/// Opens the existing directory `path` (an `O_PATH` descriptor for the `*at` calls) after
/// checking it and every ancestor (module comment).
pub fn open_checked(path: &Path, owner: Owner) -> io::Result<OwnedFd> {
    walk(path, None, owner)
}

/// [`open_checked`], making missing components with `mode` first (`mkdirat`; the umask
/// applies). An existing component is accepted only if it passes the checks.
pub fn ensure(path: &Path, mode: u32, owner: Owner) -> io::Result<OwnedFd> {
    walk(path, Some(mode), owner)
}

/// A new directory `prefix-RANDOM` (mode 0700) in `parent`, which is checked first: a name
/// nobody can predict, made with `mkdirat`, so a leftover or a planted entry never blocks or
/// redirects it (mkdtemp(3) semantics).
pub fn fresh(parent: &Path, prefix: &str) -> io::Result<PathBuf> {
    let fd = open_checked(parent, Owner::MeOrRoot)?;
    for _ in 0..16 {
        let mut r = [0u8; 8];
        getrandom::getrandom(&mut r).map_err(|e| io::Error::other(e.to_string()))?;
        let name = format!("{prefix}-{:016x}", u64::from_ne_bytes(r));
        match mkdirat(&fd, name.as_str(), Mode::from_raw_mode(0o700)) {
            Ok(()) => return Ok(parent.join(name)),
            Err(Errno::EXIST) => continue,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("mkdir in {}: {e}", parent.display()),
                ))
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no fresh directory name in {}", parent.display()),
    ))
}

/// The directory of this user's own softverbs files (loader directories, staging mount
/// points, demo and bench files), made if missing. Never a shared temporary directory:
///
/// 1. `$XDG_RUNTIME_DIR/softverbs`, when `$XDG_RUNTIME_DIR` is a directory of this euid that
///    passes [`open_checked`] (systemd makes it 0700; under `sudo`/`su` it is often the
///    invoking user's, and then not taken);
/// 2. for root, `/run/softverbs` (0755: it is also the default daemon socket's directory,
///    which every user must reach; what root keeps there is in 0700 subdirectories);
/// 3. otherwise `$HOME/.cache/softverbs` (0700), when `$HOME` is this user's;
/// 4. else an error that says to set `XDG_RUNTIME_DIR`.
pub fn user_dir() -> io::Result<PathBuf> {
    let abs = |v: Option<std::ffi::OsString>| {
        v.map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.as_os_str() != OsStr::from_bytes(b"/"))
    };
    if let Some(x) = abs(std::env::var_os("XDG_RUNTIME_DIR")) {
        if open_checked(&x, Owner::Me).is_ok() {
            let d = x.join("softverbs");
            ensure(&d, 0o700, Owner::Me)?;
            return Ok(d);
        }
    }
    if geteuid().is_root() {
        let d = PathBuf::from("/run/softverbs");
        ensure(&d, 0o755, Owner::Me)?;
        return Ok(d);
    }
    if let Some(home) = abs(std::env::var_os("HOME")) {
        if open_checked(&home, Owner::Me).is_ok() {
            let d = home.join(".cache").join("softverbs");
            ensure(&d, 0o700, Owner::Me)?;
            return Ok(d);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "no private directory for softverbs' files: set XDG_RUNTIME_DIR to a directory of yours \
         that only you can write (mode 0700)",
    ))
}

/// Opens the file `name` in the directory open at `dir` for appending, creating it with
/// `mode` if missing, never through a symlink (`O_NOFOLLOW`: `ELOOP`).
pub fn append_in(dir: &OwnedFd, name: &str, mode: u32) -> io::Result<std::fs::File> {
    let flags = OFlags::WRONLY
        | OFlags::APPEND
        | OFlags::CREATE
        | OFlags::NOFOLLOW
        | OFlags::NOCTTY
        | OFlags::CLOEXEC;
    Ok(openat(dir, name, flags, Mode::from_raw_mode(mode))?.into())
}
