//! Versioned exports, as crates/libibverbs/src/export.rs makes them: a private
//! `extern "C"` function plus a `.symver` alias into a node of `librdmacm.map`
//! (docs/design/abi-compat.md §3). Test builds carry no aliases.

macro_rules! export {
    ($name:literal, $node:literal, $f:path) => {
        #[cfg(not(test))]
        ::core::arch::global_asm!(
            ".globl {f}",
            concat!(".symver {f}, ", $name, "@@", $node),
            f = sym $f
        );
    };
}
