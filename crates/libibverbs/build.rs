//! Links the cdylib as `libibverbs.so.1` with rdma-core's symbol versions: rustc's own
//! anonymous version script hides everything not `#[no_mangle]`, and ours names the nodes the
//! `.symver` aliases in `src/export.rs` point into (see docs/design/abi-compat.md §3).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
