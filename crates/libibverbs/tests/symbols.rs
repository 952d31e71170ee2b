//! The drop-in's dynamic symbol table is rdma-core 44's (docs/design/abi-compat.md §0): every versioned
//! symbol of Debian bookworm's libibverbs.so.1 (`abi/rdma-core-44.symbols`, taken with
//! `readelf --dyn-syms` from libibverbs1 44.0-2), default (`@@`) and compat (`@`) versions
//! alike, plus softverbs' own `SOFTVERBS_XRC_1.0` node and nothing else. Programs are linked
//! BIND_NOW, so one missing symbol or node stops them before `main`; with several codegen
//! units rust-lld once dropped symbols silently, hence this check.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

/// The built library: next to this test executable (target/<profile>/deps/).
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.join("libibverbs.so"), deps.join("../libibverbs.so")]
        .into_iter()
        .find(|p| p.is_file())
        .expect("libibverbs.so was not built next to the tests (cargo test builds it)")
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

/// `NAME@NODE` / `NAME@@NODE` of every symbol the library defines.
fn defined_versioned() -> BTreeSet<String> {
    readelf(&["--dyn-syms", "-W"])
        .lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            (c.len() >= 8 && c[6] != "UND" && c[7].contains('@')).then(|| c[7].to_string())
        })
        .collect()
}

const OWN_NODE: &str = "SOFTVERBS_XRC_1.0";

#[test]
fn dynamic_symbols_are_rdma_core_44s_plus_the_legacy_xrc_node() {
    let expected: BTreeSet<String> = include_str!("../abi/rdma-core-44.symbols")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    assert_eq!(expected.len(), 180, "the reference list itself");
    let ours = defined_versioned();
    let (own, rdma): (BTreeSet<String>, BTreeSet<String>) =
        ours.into_iter().partition(|s| s.ends_with(OWN_NODE));
    let missing: Vec<_> = expected.difference(&rdma).collect();
    let extra: Vec<_> = rdma.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}\nextra {extra:?}"
    );
    let legacy: BTreeSet<String> = [
        "ibv_open_xrc_domain",
        "ibv_close_xrc_domain",
        "ibv_create_xrc_srq",
        "ibv_create_xrc_rcv_qp",
        "ibv_modify_xrc_rcv_qp",
        "ibv_query_xrc_rcv_qp",
        "ibv_reg_xrc_rcv_qp",
        "ibv_unreg_xrc_rcv_qp",
        "ibv_xrc_rcv_qp_register",
        "ibv_xrc_rcv_qp_unregister",
    ]
    .iter()
    .map(|n| format!("{n}@@{OWN_NODE}"))
    .collect();
    assert_eq!(own, legacy);
}

#[test]
fn soname_bind_now_and_every_version_node() {
    let d = readelf(&["-d"]);
    assert!(d.contains("Library soname: [libibverbs.so.1]"), "{d}");
    assert!(d.contains("BIND_NOW"), "{d}");
    let v = readelf(&["-V"]);
    for node in [
        "IBVERBS_1.0",
        "IBVERBS_1.1",
        "IBVERBS_1.5",
        "IBVERBS_1.6",
        "IBVERBS_1.7",
        "IBVERBS_1.8",
        "IBVERBS_1.9",
        "IBVERBS_1.10",
        "IBVERBS_1.11",
        "IBVERBS_1.12",
        "IBVERBS_1.13",
        "IBVERBS_1.14",
        "IBVERBS_PRIVATE_34",
        OWN_NODE,
    ] {
        assert!(
            v.contains(&format!("Name: {node}\n")) || v.contains(&format!("Name: {node} ")),
            "version node {node} is not defined:\n{v}"
        );
    }
}
