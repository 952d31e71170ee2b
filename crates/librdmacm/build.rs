//! Links the cdylib as `librdmacm.so.1` with rdma-core's symbol versions (the recipe of
//! crates/libibverbs/build.rs, docs/abi-compat.md §3), against `libibverbs.so.1` (the
//! system's at link time; `softverbs run` puts the drop-in first at run time).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=librdmacm.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/librdmacm.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rustc-link-search=native=/usr/lib/x86_64-linux-gnu");
}
