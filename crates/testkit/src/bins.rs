//! Where the workspace's binaries are. Cargo hands a test only its own package's binaries
//! (`CARGO_BIN_EXE_<name>`); the others are found next to the test executable, in
//! `target/<profile>`, built by the same `cargo build`/`cargo test` of the workspace.

use std::path::PathBuf;

/// `target/<profile>`: a test executable runs from its `deps/` directory.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("test executable has a directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("deps has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The `softverbs` binary of this profile; panics, saying how to build it, if it is missing.
pub fn softverbs_bin() -> PathBuf {
    let profile = profile_dir();
    let bin = profile.join("softverbs");
    assert!(
        bin.is_file(),
        "{} is missing: build the CLI in the same profile first (`cargo build{} -p softverbs-cli`)",
        bin.display(),
        if profile.ends_with("release") {
            " --release"
        } else {
            ""
        }
    );
    bin
}

/// Copies the executable `from` to `to` (mode 0755) by a child `install` process, never by
/// this one: the tests of one executable run on threads of one process, and a child that
/// another test forks while this process holds `to` open for writing keeps that descriptor
/// until it execs, so exec'ing `to` in that window fails with ETXTBSY.
pub fn copy_executable(from: &std::path::Path, to: &std::path::Path) {
    let st = std::process::Command::new("install")
        .arg("-m")
        .arg("0755")
        .arg(from)
        .arg(to)
        .status()
        .expect("run install");
    assert!(
        st.success(),
        "install {} {}: {st}",
        from.display(),
        to.display()
    );
}
