//! Build facts the `softverbs` binary reports or relies on: the git revision it was built from
//! (`softverbs --version`) and the Debian multiarch triplet of the target (`softverbs run` finds
//! the packaged drop-ins in /usr/lib/<triplet>/softverbs/, docs/guide/install.md).

use std::process::Command;

fn main() {
    println!("cargo:rustc-env=SOFTVERBS_GIT_REVISION={}", git_revision());
    println!("cargo:rustc-env=SOFTVERBS_MULTIARCH={}", multiarch());
    println!("cargo:rerun-if-env-changed=SOFTVERBS_GIT_REVISION");
    println!("cargo:rerun-if-env-changed=DEB_HOST_MULTIARCH");
}

/// The 12-digit hash of the commit checked out (local changes are not marked: telling them
/// would mean rebuilding on every change to git's index), `$SOFTVERBS_GIT_REVISION` when set (a source tarball's builder knows it), else "unknown": a
/// build without git or outside a checkout still works.
fn git_revision() -> String {
    if let Ok(r) = std::env::var("SOFTVERBS_GIT_REVISION") {
        return r;
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
    };
    let Some(hash) = git(&["rev-parse", "--short=12", "HEAD"]).filter(|h| !h.is_empty()) else {
        return "unknown".into();
    };
    // Rebuild when HEAD moves (a commit, a checkout, a pack of the refs).
    // `--git-path` finds each where it is, in a worktree too (refs live in the common
    // directory); a file that does not exist is not named, or cargo would rerun every build.
    let mut watch = vec!["HEAD".to_string(), "packed-refs".into()];
    watch.extend(git(&["symbolic-ref", "-q", "HEAD"]).filter(|h| !h.is_empty()));
    for name in watch {
        let path = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]);
        if let Some(p) = path.filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    hash
}

/// The Debian multiarch triplet (the `DEB_HOST_MULTIARCH` of dpkg-architecture(1)) of the
/// target: `$DEB_HOST_MULTIARCH` when a Debian build sets it, else derived from the target's
/// arch, environment and ABI (x86_64-linux-gnu, aarch64-linux-gnu, arm-linux-gnueabihf,
/// i386-linux-gnu, powerpc64le-linux-gnu, mips64el-linux-gnuabi64, ...).
fn multiarch() -> String {
    if let Ok(m) = std::env::var("DEB_HOST_MULTIARCH") {
        return m;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let arch = match var("CARGO_CFG_TARGET_ARCH").as_str() {
        "x86" => "i386".to_string(),
        "powerpc64" if var("CARGO_CFG_TARGET_ENDIAN") == "little" => "powerpc64le".into(),
        "mips64" if var("CARGO_CFG_TARGET_ENDIAN") == "little" => "mips64el".into(),
        "mips" if var("CARGO_CFG_TARGET_ENDIAN") == "little" => "mipsel".into(),
        a => a.to_string(),
    };
    let env = match var("CARGO_CFG_TARGET_ENV").as_str() {
        "" => "gnu".to_string(),
        e => e.to_string(),
    };
    format!(
        "{arch}-{}-{env}{}",
        var("CARGO_CFG_TARGET_OS"),
        var("CARGO_CFG_TARGET_ABI")
    )
}
