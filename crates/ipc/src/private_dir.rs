//! The one rule for directories softverbs creates or writes into by name (docs/design/security.md,
//! "Paths"): a directory is trusted only if no other user can change what its path names.
//!
//! A path is walked from `/` one component at a time with `openat(O_PATH | O_NOFOLLOW |
//! O_DIRECTORY)` and each directory is checked on the descriptor (`fstat`), so the check and
//! the use are of the same directory. The kernel never follows a symlink for us (open(2):
//! `O_NOFOLLOW`); the walk follows one itself only when root or this uid owns it (it lies in a
//! directory already checked, so only they could have put it there, except in a sticky
//! directory, where another user's symlink is refused), and then checks the target's
//! directories like any others (`/var/run` → `/run` works, a planted link does not):
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

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{
    fstat, mkdirat, openat, readlinkat, statat, AtFlags, FileType, Mode, OFlags, CWD,
};
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
            "refusing {}: {why} (docs/design/security.md, \"Paths\")",
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

/// The components of `path`, made absolute against the working directory (getcwd(3) gives
/// the physical path). `.` is dropped; `..` is kept and taken back on the directories walked.
fn components(path: &Path) -> io::Result<VecDeque<OsString>> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    Ok(relative_components(&abs))
}

fn relative_components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// Most symlinks one walk follows (path_resolution(7): Linux's limit is 40).
const MAX_LINKS: usize = 40;

fn walk(path: &Path, create: Option<u32>, owner: Owner) -> io::Result<OwnedFd> {
    let me = geteuid().as_raw();
    let mut todo = components(path)?;
    let root = || -> io::Result<OwnedFd> {
        let fd = openat(CWD, "/", DIR_FLAGS, Mode::empty())?;
        check(&fd, Path::new("/"), None)?;
        Ok(fd)
    };
    // The directories walked so far, each checked: `..` goes back to the one before.
    let mut stack = vec![root()?];
    let mut at = PathBuf::from("/");
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            if stack.len() > 1 {
                stack.pop();
                at.pop();
            }
            continue;
        }
        let cur = stack.last().expect("the root stays");
        let here = at.join(&name);
        let open = |cur: &OwnedFd| openat(cur, name.as_os_str(), DIR_FLAGS, Mode::empty());
        let opened = match (open(cur), create) {
            (Err(Errno::NOENT), Some(mode)) => {
                match mkdirat(cur, name.as_os_str(), Mode::from_raw_mode(mode)) {
                    // EEXIST: made meanwhile by someone else (or a dangling symlink);
                    // checked below like any other entry.
                    Ok(()) | Err(Errno::EXIST) => open(cur),
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("mkdir {}: {e}", here.display()),
                        ))
                    }
                }
            }
            (r, _) => r,
        };
        match opened {
            Ok(fd) => {
                check(&fd, &here, None)?;
                stack.push(fd);
                at = here;
            }
            // O_NOFOLLOW | O_DIRECTORY on a symlink: ENOTDIR (or ELOOP). A symlink is
            // followed only if its owner is root or us: it sits in a directory already
            // checked, so only they could have made it there unless that directory is sticky
            // (`/tmp`), where another user's symlink is refused (as fs.protected_symlinks
            // refuses it to the kernel's own lookups).
            Err(Errno::NOTDIR | Errno::LOOP) => {
                let st = statat(cur, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)?;
                if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
                    return Err(refuse(&here, "not a directory"));
                }
                if st.st_uid != me && st.st_uid != 0 {
                    return Err(refuse(
                        &here,
                        format_args!("a symlink owned by uid {}", st.st_uid),
                    ));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(refuse(path, "too many symlinks"));
                }
                let target = PathBuf::from(OsString::from_vec(
                    readlinkat(cur, name.as_os_str(), Vec::new())?.into_bytes(),
                ));
                if target.is_absolute() {
                    stack.truncate(1);
                    at = PathBuf::from("/");
                }
                for c in relative_components(&target).into_iter().rev() {
                    todo.push_front(c);
                }
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", here.display()))),
        }
    }
    let last = stack.pop().expect("the root stays");
    check(&last, &at, Some(owner))?;
    Ok(last)
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
