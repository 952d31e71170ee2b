//! Running `tshark` on a capture with the project's Wireshark plugin
//! (`tools/wireshark/softverbs.lua`), the way a user would.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The plugin shipped in the repository.
pub fn plugin_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/wireshark/softverbs.lua")
}

/// `Some(version line)` if tshark runs; `None` (after saying why on stderr) if a test should
/// be skipped. Panics when tshark is missing under CI, where the test command installs it.
pub fn tshark_available() -> Option<String> {
    match Command::new("tshark").arg("--version").output() {
        Ok(out) if out.status.success() => Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned(),
        ),
        other => {
            let why = match other {
                Ok(out) => format!("`tshark --version` exited with {}", out.status),
                Err(e) => format!("cannot run tshark: {e}"),
            };
            if std::env::var_os("CI").is_some() {
                panic!("tshark is required under CI ({why}); install the Debian package `tshark`");
            }
            // Straight to the stderr handle: libtest would swallow `eprintln!` of a passing test.
            let _ = writeln!(
                std::io::stderr(),
                "skipped: tshark not installed ({why}); install the Debian package `tshark`"
            );
            None
        }
    }
}

/// Runs tshark on `pcap` with the plugin and a clean profile (`home` becomes `$HOME`), plus
/// `extra` arguments; returns stdout. Panics on failure or on any stderr output other than
/// the warning about running as root.
pub fn tshark(pcap: &Path, home: &Path, extra: &[&str]) -> String {
    let out = Command::new("tshark")
        // A fresh HOME keeps personal preferences and plugins (e.g. an installed copy of
        // softverbs.lua, which would register its fields twice) out of the test.
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .arg("-n")
        // Wireshark 4.0's RPC-over-RDMA heuristic claims SEND payloads shorter than its
        // header (< 16 bytes) and throws "Malformed Packet: RPCoRDMA" on them; these are
        // not RPC messages, so keep it out.
        .args(["--disable-protocol", "rpcordma"])
        .arg("-r")
        .arg(pcap)
        .arg("-X")
        .arg(format!("lua_script:{}", plugin_path().display()))
        .args(extra)
        .output()
        .expect("run tshark");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tshark {extra:?} failed ({}):\n{stderr}",
        out.status
    );
    for line in stderr.lines() {
        assert!(
            line.starts_with("Running as user \"root\""),
            "unexpected tshark stderr: {stderr}"
        );
    }
    String::from_utf8(out.stdout).expect("tshark prints UTF-8")
}

/// Frame numbers, one per non-empty line of `-T fields -e frame.number` output.
pub fn frame_numbers(stdout: &str) -> Vec<usize> {
    stdout
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.trim().parse().expect("a frame number"))
        .collect()
}
