//! The misuses the owning API rules out at compile time: each case must fail to build, with
//! the error its `.stderr` file records (`TRYBUILD=overwrite` regenerates them after a
//! compiler upgrade). Posting a buffer of another PD's MR is a runtime typed error instead:
//! `tests/owned_api.rs`, `misuse_is_a_typed_error_and_the_buffer_comes_back_untouched`.

#[test]
fn misuses_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
