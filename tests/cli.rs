//! CLI snapshot tests: each `tests/cmd/*.toml` runs `streamsan` and compares its exit status,
//! stdout and stderr with the checked-in `.stdout` / `.stderr` files (`TRYCMD=overwrite` updates
//! them after a deliberate change).

#[test]
fn cli_snapshots() {
    trycmd::TestCases::new().case("tests/cmd/*.toml");
}
