//! CLI snapshot tests: each `tests/cmd/*.toml` runs `streamsan` and compares its exit status,
//! stdout and stderr with the checked-in `.stdout` / `.stderr` files (`TRYCMD=overwrite` updates
//! them after a deliberate change).
//!
//! Fixtures: `tests/cmd/`, read in place where the source tree is here (`CARGO_MANIFEST_DIR`
//! holds its `Cargo.toml`; so that `TRYCMD=overwrite` can update it), and otherwise written out from the copy
//! embedded at build time (`tests/common/mod.rs`) into a temporary directory. The binary: the one
//! cargo built (`CARGO_BIN_EXE_streamsan`) where it exists, otherwise `bin/streamsan` next to the
//! directory of this executable (`.device/bin/streamsan` for `.device/tests/cli`, as
//! `device-stage` stages them). No binary, or no case, is a failure.

mod common;

use std::path::{Path, PathBuf};

/// The `streamsan` binary to run.
fn binary() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_streamsan"));
    if built.is_file() {
        return built;
    }
    let exe = std::env::current_exe().expect("the path of this test executable");
    let name = format!("streamsan{}", std::env::consts::EXE_SUFFIX);
    let staged = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("bin").join(name));
    match staged {
        Some(p) if p.is_file() => p,
        _ => panic!(
            "no streamsan binary: neither {} nor {} exists",
            built.display(),
            staged.map_or_else(|| "bin/streamsan".into(), |p| p.display().to_string())
        ),
    }
}

/// A directory removed (best effort) when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The directory of the cases: the source tree's `tests/cmd`, or the embedded copy written out
/// (with the guard that removes it).
fn case_dir() -> (PathBuf, Option<TempDir>) {
    if let Some(root) = common::source_tree() {
        let dir = root.join("tests/cmd");
        assert!(dir.is_dir(), "{} is missing", dir.display());
        return (dir, None);
    }
    let tmp = std::env::temp_dir().join(format!("streamsan-cli-{}", std::process::id()));
    let guard = TempDir(tmp.clone());
    for file in common::fixtures(common::CLI_CASES) {
        let rel = file
            .path
            .strip_prefix("tests/cmd/")
            .expect("a file under tests/cmd");
        let path = tmp.join(rel);
        std::fs::create_dir_all(path.parent().expect("a parent directory"))
            .expect("create the case directory");
        std::fs::write(&path, file.bytes).expect("write a case file");
    }
    (tmp, Some(guard))
}

#[test]
fn cli_snapshots() {
    let bin = binary();
    let (dir, _guard) = case_dir();
    let cases = std::fs::read_dir(&dir)
        .expect("the case directory")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "toml"))
        })
        .count();
    let embedded = common::fixtures_with_extension(common::CLI_CASES, "toml").len();
    assert!(cases > 0, "no case in {}", dir.display());
    assert!(
        cases >= embedded,
        "{} has {cases} cases, the build embedded {embedded}",
        dir.display()
    );
    println!(
        "{cases} cases in {}, binary {}",
        dir.display(),
        bin.display()
    );
    // Each case is killed, and fails, past the deadline: no case hangs the suite.
    trycmd::TestCases::new()
        .register_bin("streamsan", &bin)
        .timeout(std::time::Duration::from_secs(300))
        .case(dir.join("*.toml"))
        .run();
}
