//! Versioned exports.
//!
//! rustc hands the linker an anonymous version script that makes every non-`#[no_mangle]`
//! symbol local; `libibverbs.map` names our nodes. Each export is a private function plus a
//! `.symver` alias in that node (`NAME@@NODE` default, `NAME@NODE` compat), which is the recipe
//! docs/design/abi-compat.md §3 found to work with rust-lld (plain `#[no_mangle]` stays unversioned).
//! Test builds are executables without the version script, so they carry no aliases.

macro_rules! export {
    (default $name:literal, $node:literal, $f:path) => {
        #[cfg(not(test))]
        ::core::arch::global_asm!(
            ".globl {f}",
            concat!(".symver {f}, ", $name, "@@", $node),
            f = sym $f
        );
    };
    (compat $name:literal, $node:literal, $f:path) => {
        #[cfg(not(test))]
        ::core::arch::global_asm!(
            ".globl {f}",
            concat!(".symver {f}, ", $name, "@", $node),
            f = sym $f
        );
    };
}
