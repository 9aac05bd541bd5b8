//! CLI snapshot tests: each `tests/cmd/*.toml` runs `streamsan` and compares its exit status,
//! stdout and stderr with the checked-in `.stdout` / `.stderr` files (`TRYCMD=overwrite` updates
//! them after a deliberate change).

#[test]
fn cli_snapshots() {
    // The binary cargo built for this test; absent where only the test executable was copied.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_streamsan"));
    if !bin.exists() || !std::path::Path::new("tests/cmd").exists() {
        println!("skipped: the streamsan binary or tests/cmd is not here");
        return;
    }
    trycmd::TestCases::new()
        .register_bin("streamsan", bin)
        .case("tests/cmd/*.toml");
}
