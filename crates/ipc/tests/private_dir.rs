//! The directory rule (src/private_dir.rs; docs/design/security.md, "Paths"): what is refused and
//! what is made. Cases needing another uid run as root only.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use softverbs_ipc::private_dir::{ensure, fresh, open_checked, Owner};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory of the test's own (0755) in the system's temporary directory (sticky: an
/// accepted ancestor).
fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("svpd-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    chmod(&d, 0o755);
    Dir(d)
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn refused(r: std::io::Result<impl Sized>, why: &str) {
    match r {
        Ok(_) => panic!("accepted; expected a refusal ({why})"),
        Err(e) => assert!(e.to_string().contains(why), "{e}; expected {why:?}"),
    }
}

#[test]
fn made_directories_are_ours_and_0700() {
    let t = dir("made");
    let p = t.0.join("a/b/c");
    ensure(&p, 0o700, Owner::Me).unwrap();
    for q in [t.0.join("a"), t.0.join("a/b"), p.clone()] {
        let m = std::fs::symlink_metadata(&q).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.uid(), rustix::process::geteuid().as_raw());
        assert_eq!(m.mode() & 0o7777, 0o700, "{}", q.display());
    }
    // Again: the same directory is accepted as it is.
    ensure(&p, 0o700, Owner::Me).unwrap();
}

/// A symlink of our own in a checked directory is followed and its target checked like any
/// directory: to a private directory it is fine, into a shared one it is refused.
#[test]
fn a_symlink_is_followed_only_to_where_the_rule_holds() {
    let t = dir("symlink");
    let real = t.0.join("real");
    std::fs::create_dir(&real).unwrap();
    chmod(&real, 0o700);
    std::os::unix::fs::symlink(&real, t.0.join("link")).unwrap();
    std::os::unix::fs::symlink("real/../real", t.0.join("rel")).unwrap();
    open_checked(&t.0.join("link"), Owner::Me).unwrap();
    ensure(&t.0.join("rel/sub"), 0o700, Owner::Me).unwrap();
    assert!(real.join("sub").is_dir());
    let shared = t.0.join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o777);
    std::os::unix::fs::symlink(&shared, t.0.join("to-shared")).unwrap();
    refused(
        ensure(&t.0.join("to-shared/x"), 0o700, Owner::Me),
        "writable by group or others",
    );
    assert!(!shared.join("x").exists(), "made through the symlink");
    // A loop ends.
    std::os::unix::fs::symlink("loop", t.0.join("loop")).unwrap();
    refused(
        open_checked(&t.0.join("loop"), Owner::Me),
        "too many symlinks",
    );
}

/// In a sticky directory (`/tmp`), another user's symlink is never followed, wherever it
/// points.
#[test]
fn another_users_symlink_in_a_sticky_directory_is_refused() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root to make a symlink of another uid");
        return;
    }
    let t = dir("sticky-link");
    let sticky = t.0.join("tmp");
    std::fs::create_dir(&sticky).unwrap();
    chmod(&sticky, 0o1777);
    let mine = t.0.join("mine");
    std::fs::create_dir(&mine).unwrap();
    chmod(&mine, 0o700);
    let link = sticky.join("planted");
    std::os::unix::fs::symlink(&mine, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
    refused(
        open_checked(&link, Owner::Me),
        "a symlink owned by uid 65534",
    );
    refused(
        ensure(&link.join("x"), 0o700, Owner::Me),
        "a symlink owned by uid 65534",
    );
    assert!(!mine.join("x").exists());
}

#[test]
fn group_or_other_writable_directories_are_refused() {
    let t = dir("shared");
    let gw = t.0.join("gw");
    std::fs::create_dir(&gw).unwrap();
    chmod(&gw, 0o775);
    refused(open_checked(&gw, Owner::Me), "writable by group or others");
    // As an ancestor too, unless sticky (as /tmp is).
    refused(
        ensure(&gw.join("x"), 0o700, Owner::Me),
        "writable by group or others",
    );
    let sticky = t.0.join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    chmod(&sticky, 0o1777);
    ensure(&sticky.join("x"), 0o700, Owner::Me).unwrap();
    // The directory itself may not be shared, sticky or not.
    refused(
        open_checked(&sticky, Owner::Me),
        "writable by group or others",
    );
}

#[test]
fn a_directory_of_another_uid_is_refused_never_adopted() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root to make a directory of another uid");
        return;
    }
    let t = dir("foreign");
    let theirs = t.0.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    chmod(&theirs, 0o755);
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    refused(ensure(&theirs, 0o700, Owner::Me), "owned by uid 65534");
    refused(
        ensure(&theirs, 0o700, Owner::MeOrRoot),
        "owned by uid 65534",
    );
    refused(
        ensure(&theirs.join("mine"), 0o700, Owner::Me),
        "owned by uid 65534",
    );
    assert!(!theirs.join("mine").exists());
}

#[test]
fn fresh_directories_are_new_and_private() {
    let t = dir("fresh");
    let a = fresh(&t.0, "x").unwrap();
    let b = fresh(&t.0, "x").unwrap();
    assert_ne!(a, b);
    for p in [&a, &b] {
        let m = std::fs::symlink_metadata(p).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.mode() & 0o7777, 0o700);
    }
    // Never in a directory that fails the rule.
    chmod(&t.0, 0o777);
    refused(fresh(&t.0, "x"), "writable by group or others");
    chmod(&t.0, 0o755);
}
