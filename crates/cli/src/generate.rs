//! `softverbs generate man|completions|package DIR`: what the Debian package ships besides the
//! binary (scripts/deb.sh, docs/guide/install.md). The man pages and completions come from
//! the clap definitions in main.rs, so they never drift from `--help`; `package` lays out the
//! whole tree below /usr with the target's multiarch triplet (build.rs), the one place that
//! also tells `softverbs run` where the packaged drop-ins are (dropin.rs).

use std::path::{Path, PathBuf};

use clap::CommandFactory;

/// What to generate.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum What {
    /// softverbs(1) and one page per visible subcommand, softverbs-SUB(1) and
    /// softverbs-SUB-SUBSUB(1) (the git(1) convention), in roff.
    Man,
    /// bash (`softverbs.bash`), zsh (`_softverbs`) and fish (`softverbs.fish`) completions.
    Completions,
    /// The package's tree below DIR: usr/lib/<multiarch>/softverbs/ (the drop-ins),
    /// usr/lib/<multiarch>/pkgconfig/softverbs.pc, usr/share/man/man1/ and the completions
    /// where bash-completion, zsh and fish look for them.
    Package,
}

/// The directory the Debian package keeps the drop-ins in (`/usr/lib/<multiarch>/softverbs`).
pub const PACKAGE_LIB_DIR: &str = concat!("/usr/lib/", env!("SOFTVERBS_MULTIARCH"), "/softverbs");

/// Writes `what` into `dir`, creating it; each file is named as its shell or man(1) expects.
pub fn write(what: What, dir: &Path) -> Result<(), String> {
    mkdir(dir)?;
    match what {
        What::Man => man_pages(dir),
        What::Completions => completions(dir, dir, dir),
        What::Package => package(dir),
    }
}

/// The directory the packager named (scripts/deb.sh: a staging directory in the build tree),
/// made with the project's one directory rule (docs/design/security.md, "Paths"): every
/// component owned by this user or root and writable by no one else, missing ones made with
/// `mkdirat`, so a directory someone else planted is refused rather than written into.
fn mkdir(dir: &Path) -> Result<(), String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", dir.display());
    let abs = std::path::absolute(dir).map_err(|e| at(&e))?;
    softverbs_ipc::private_dir::ensure(&abs, 0o755, softverbs_ipc::private_dir::Owner::MeOrRoot)
        .map(drop)
        .map_err(|e| at(&e))
}

/// One page for the command and, recursively, one for each of its visible subcommands
/// (clap_mangen names them softverbs-SUB.1, softverbs-SUB-SUBSUB.1).
fn man_pages(dir: &Path) -> Result<(), String> {
    mkdir(dir)?;
    clap_mangen::generate_to(crate::Cli::command(), dir)
        .map_err(|e| format!("man pages in {}: {e}", dir.display()))?;
    outln!("wrote the man pages into {}", dir.display());
    Ok(())
}

/// The three shells' completion scripts, each into its own directory.
fn completions(bash: &Path, zsh: &Path, fish: &Path) -> Result<(), String> {
    use clap_complete::Shell;
    for (shell, dir) in [(Shell::Bash, bash), (Shell::Zsh, zsh), (Shell::Fish, fish)] {
        mkdir(dir)?;
        let mut cmd = crate::Cli::command();
        let path = clap_complete::generate_to(shell, &mut cmd, "softverbs", dir)
            .map_err(|e| format!("{shell} completions in {}: {e}", dir.display()))?;
        outln!("wrote {}", path.display());
    }
    Ok(())
}

/// The package's files below `root` (a staging directory; the binary, the header, the units
/// and the config file are listed in crates/cli/Cargo.toml's `[package.metadata.deb]`).
fn package(root: &Path) -> Result<(), String> {
    let at = |p: &str| -> PathBuf { root.join(p.trim_start_matches('/')) };
    let lib_dir = at(PACKAGE_LIB_DIR);
    mkdir(&lib_dir)?;
    let lib = crate::dropin::find_library()?;
    let copy = |from: &Path, name: &str| {
        let to = lib_dir.join(name);
        std::fs::copy(from, &to)
            .map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))?;
        outln!("wrote {}", to.display());
        Ok::<(), String>(())
    };
    copy(&lib, "libibverbs.so.1")?;
    let cm = crate::dropin::find_rdmacm(&lib).ok_or(
        "the drop-in librdmacm.so.1 is not built (cargo build --release -p softverbs-librdmacm)",
    )?;
    copy(&cm, "librdmacm.so.1")?;
    let pc_dir = at(concat!(
        "/usr/lib/",
        env!("SOFTVERBS_MULTIARCH"),
        "/pkgconfig"
    ));
    mkdir(&pc_dir)?;
    let pc = pc_dir.join("softverbs.pc");
    std::fs::write(&pc, pkg_config()).map_err(|e| format!("{}: {e}", pc.display()))?;
    outln!("wrote {}", pc.display());
    man_pages(&at("/usr/share/man/man1"))?;
    completions(
        &at("/usr/share/bash-completion/completions"),
        &at("/usr/share/zsh/vendor-completions"),
        &at("/usr/share/fish/vendor_completions.d"),
    )?;
    // bash-completion loads a command's completion from a file named after the command.
    let bash = at("/usr/share/bash-completion/completions");
    std::fs::rename(bash.join("softverbs.bash"), bash.join("softverbs"))
        .map_err(|e| format!("{}: {e}", bash.display()))
}

/// pkg-config(1)'s description of the legacy XRC API: the header (which includes
/// <infiniband/verbs.h>, from libibverbs-dev) and the drop-in that exports it. The run path
/// makes a program built against it load the drop-in: rdma-core's libibverbs has no legacy
/// XRC symbols, so such a program runs on softverbs only.
fn pkg_config() -> String {
    format!(
        "prefix=/usr\n\
         includedir=${{prefix}}/include\n\
         libdir={PACKAGE_LIB_DIR}\n\
         \n\
         Name: softverbs\n\
         Description: the softverbs drop-in libibverbs.so.1 and the legacy OFED XRC API (softverbs/xrc_legacy.h)\n\
         Version: {}\n\
         Cflags: -I${{includedir}}\n\
         Libs: -L${{libdir}} -Wl,-rpath,${{libdir}} -l:libibverbs.so.1\n",
        env!("CARGO_PKG_VERSION")
    )
}
