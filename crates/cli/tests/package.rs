//! What the Debian package is made of (issue 36 item 2; docs/guide/install.md), as a user
//! checks it: `softverbs --version` names the git revision, `status` the daemon's version; the
//! man pages cover the command and every subcommand `--help` lists; the completions exist for
//! bash, zsh and fish; `generate package` lays out the drop-ins under
//! /usr/lib/<multiarch>/softverbs/ with a pkg-config file naming them. The package itself is
//! built, installed, run and purged by scripts/deb-test.sh.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use softverbs_testkit::Daemon;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("svpkg-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    Dir(d)
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(out.status.success(), "softverbs {args:?}: {out:?}");
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// `softverbs 0.1.0 (git 0123456789ab)`: the revision is the checked-out commit's when the
/// test runs in the checkout the binary was built from.
#[test]
fn version_names_the_git_revision() {
    let v = stdout(&run(&["--version"]));
    let rest = v
        .trim()
        .strip_prefix(concat!("softverbs ", env!("CARGO_PKG_VERSION"), " (git "))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{v:?}"));
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success());
    match head {
        Some(h) => assert_eq!(rest, String::from_utf8(h.stdout).unwrap().trim(), "{v}"),
        None => assert_eq!(rest, "unknown", "{v}"),
    }
}

/// `status` names the running daemon's version, the one its binary's `--version` shows.
#[test]
fn status_shows_the_daemon_version() {
    let version = stdout(&run(&["--version"]));
    let version = version.trim().strip_prefix("softverbs ").unwrap();
    let d = Daemon::start("pkg-status");
    let sock = d.socket.to_str().unwrap();
    let text = stdout(&run(&["--socket", sock, "status"]));
    let first = text.lines().next().unwrap();
    assert!(
        first.contains(&format!("(softverbs {version}, ABI ")),
        "{first}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&run(&["--socket", sock, "status", "--json"]))).unwrap();
    assert_eq!(json["version"], version, "{json}");
}

/// The subcommands `softverbs --help` (or `softverbs SUB --help`) lists, without `help`.
fn listed_subcommands(args: &[&str]) -> Vec<String> {
    let mut a = args.to_vec();
    a.push("--help");
    let help = stdout(&run(&a));
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

/// One roff page for the command and each subcommand at every level `--help` lists, named as
/// git names its own (softverbs-cluster-up.1); none for the hidden helpers.
#[test]
fn man_pages_cover_every_listed_subcommand() {
    let d = dir("man");
    let out = d.0.to_str().unwrap();
    run(&["generate", "man", out]);
    let mut want = vec!["softverbs".to_string()];
    for sub in listed_subcommands(&[]) {
        want.push(format!("softverbs-{sub}"));
        for subsub in listed_subcommands(&[&sub]) {
            want.push(format!("softverbs-{sub}-{subsub}"));
        }
    }
    assert!(
        want.contains(&"softverbs-cluster-up".to_string()),
        "{want:?}"
    );
    for page in &want {
        let text = std::fs::read_to_string(d.0.join(format!("{page}.1")))
            .unwrap_or_else(|e| panic!("{page}.1: {e}"));
        assert!(
            text.lines()
                .any(|l| l.starts_with(".TH") && l.to_lowercase().contains(page)),
            "{page}.1 has no title line"
        );
    }
    // The run page carries the subcommand's help text.
    let run_page = std::fs::read_to_string(d.0.join("softverbs-run.1")).unwrap();
    assert!(run_page.contains("LD_LIBRARY_PATH"), "{run_page}");
    for hidden in ["demo-actor", "with-device-nodes", "generate", "bench-peer"] {
        assert!(
            !d.0.join(format!("softverbs-{hidden}.1")).exists(),
            "{hidden}"
        );
    }
}

/// bash, zsh and fish completions, each knowing the subcommands.
#[test]
fn completions_for_bash_zsh_and_fish() {
    let d = dir("completions");
    run(&["generate", "completions", d.0.to_str().unwrap()]);
    for file in ["softverbs.bash", "_softverbs", "softverbs.fish"] {
        let text =
            std::fs::read_to_string(d.0.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        for sub in ["daemon", "resources", "cluster"] {
            assert!(text.contains(sub), "{file} does not complete {sub}");
        }
    }
}

/// The package's tree: both drop-ins (this build's) in /usr/lib/<triplet>/softverbs/ with the
/// triplet the system's own libraries use, a pkg-config file naming that directory, the man
/// pages and the completions where the shells look.
#[test]
fn package_tree_has_the_drop_ins_under_the_multiarch_directory() {
    let d = dir("package");
    run(&["generate", "package", d.0.to_str().unwrap()]);
    let lib = d.0.join("usr/lib");
    let triplets: Vec<String> = std::fs::read_dir(&lib)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(triplets.len(), 1, "{triplets:?}");
    let ma = &triplets[0];
    assert!(ma.contains("-linux-"), "{ma}");
    // The triplet is the one this system's C library lives under, on Debian and Ubuntu.
    if Path::new("/etc/debian_version").exists() {
        assert!(
            Path::new("/usr/lib").join(ma).is_dir(),
            "/usr/lib/{ma} does not exist here"
        );
    }
    let dropins = lib.join(ma).join("softverbs");
    for so in ["libibverbs.so.1", "librdmacm.so.1"] {
        let bytes = std::fs::read(dropins.join(so)).unwrap_or_else(|e| panic!("{so}: {e}"));
        assert_eq!(&bytes[..4], b"\x7fELF", "{so}");
    }
    let pc = std::fs::read_to_string(lib.join(ma).join("pkgconfig/softverbs.pc")).unwrap();
    assert!(
        pc.contains(&format!("libdir=/usr/lib/{ma}/softverbs\n")),
        "{pc}"
    );
    for f in [
        "usr/share/man/man1/softverbs.1",
        "usr/share/man/man1/softverbs-daemon.1",
        "usr/share/bash-completion/completions/softverbs",
        "usr/share/zsh/vendor-completions/_softverbs",
        "usr/share/fish/vendor_completions.d/softverbs.fish",
    ] {
        assert!(d.0.join(f).is_file(), "{f}");
    }
}
