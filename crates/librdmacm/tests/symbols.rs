//! The drop-in's dynamic symbol table is rdma-core 44's librdmacm.so.1: the 68 versioned
//! symbols of Debian bookworm's librdmacm1 44.0-2 (`abi/rdma-core-44.symbols`, taken with
//! `nm -D --with-symbol-versions`), nodes `RDMACM_1.0` … `1.3`, and nothing else; its SONAME
//! is `librdmacm.so.1`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.join("librdmacm.so"), deps.join("../librdmacm.so")]
        .into_iter()
        .find(|p| p.is_file())
        .expect("librdmacm.so was not built next to the tests (cargo test builds it)")
}

fn readelf(args: &[&str]) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(library())
        .output()
        .expect("readelf (binutils) is needed");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn dynamic_symbols_are_rdma_core_44s() {
    let expected: BTreeSet<String> = include_str!("../abi/rdma-core-44.symbols")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    assert_eq!(expected.len(), 68, "the reference list itself");
    let ours: BTreeSet<String> = readelf(&["--dyn-syms", "-W"])
        .lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (c.len() >= 8 && c[6] != "UND" && c[7].contains('@') && c[3] == "FUNC")
                .then(|| c[7].to_string())
        })
        .collect();
    let missing: Vec<_> = expected.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, extra {extra:?}"
    );
}

#[test]
fn soname_and_needed_libibverbs() {
    let d = readelf(&["-d"]);
    assert!(d.contains("Library soname: [librdmacm.so.1]"), "{d}");
    assert!(d.contains("Shared library: [libibverbs.so.1]"), "{d}");
}

/// Every `ibv_*` the drop-in calls is bound to rdma-core 44's default version of it
/// (`ibv_create_qp@IBVERBS_1.1`, as rdma-core's own librdmacm binds it), whichever library the
/// link saw: build.rs links against a stub made from our libibverbs.map, not the system's.
#[test]
fn ibv_references_carry_rdma_core_44s_default_versions() {
    let defaults: BTreeSet<String> = include_str!("../../libibverbs/abi/rdma-core-44.symbols")
        .lines()
        .filter_map(|l| l.split_once("@@"))
        .map(|(name, node)| format!("{name}@{node}"))
        .collect();
    let refs: Vec<String> = readelf(&["--dyn-syms", "-W"])
        .lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (c.len() >= 8 && c[6] == "UND" && c[7].starts_with("ibv_")).then(|| c[7].to_string())
        })
        .collect();
    assert!(refs.len() >= 10, "the drop-in calls libibverbs: {refs:?}");
    // readelf prints a reference as NAME@NODE (one `@`, possibly followed by ` (N)`).
    let wrong: Vec<&String> = refs
        .iter()
        .filter(|r| !defaults.contains(r.split(' ').next().unwrap_or(r)))
        .collect();
    assert!(
        wrong.is_empty(),
        "not rdma-core 44's default versions: {wrong:?}"
    );
}
