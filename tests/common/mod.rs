//! What several test suites share: the fixtures, embedded at build time.
//!
//! `build.rs` writes one constant per fixture directory (`CONFORMANCE`, `ORACLE_REGRESSIONS`,
//! `EXAMPLE_TRACES`, `CLI_CASES`, `FUZZ_CORPUS`, `FUZZ_ARTIFACTS`): every file under it as (path
//! from the package root, bytes), sorted by path. A test executable so carries its fixtures and
//! finds them wherever it runs, also as a staged copy on a machine without the source tree. Each
//! suite includes this module with `mod common;` and uses what it needs.

#![allow(dead_code)]

include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

/// One embedded fixture file.
#[derive(Clone, Copy, Debug)]
pub struct Fixture {
    /// The path from the package root, with `/` separators (`tests/conformance/x.jsonl`).
    pub path: &'static str,
    /// The file's contents.
    pub bytes: &'static [u8],
}

impl Fixture {
    /// The contents as text (panics on a file that is not UTF-8: a broken fixture).
    pub fn text(&self) -> &'static str {
        std::str::from_utf8(self.bytes)
            .unwrap_or_else(|e| panic!("{} is not UTF-8: {e}", self.path))
    }

    /// The file name (the last path component).
    pub fn name(&self) -> &'static str {
        self.path.rsplit('/').next().unwrap_or(self.path)
    }

    /// The extension, without the dot (`""` where there is none).
    pub fn extension(&self) -> &'static str {
        match self.name().rsplit_once('.') {
            Some((stem, ext)) if !stem.is_empty() => ext,
            _ => "",
        }
    }
}

/// The files of `table` (one of the constants above), sorted by path.
pub fn fixtures(table: &'static [(&'static str, &'static [u8])]) -> Vec<Fixture> {
    table
        .iter()
        .map(|&(path, bytes)| Fixture { path, bytes })
        .collect()
}

/// The files of `table` whose extension is `ext`, sorted by path.
pub fn fixtures_with_extension(
    table: &'static [(&'static str, &'static [u8])],
    ext: &str,
) -> Vec<Fixture> {
    fixtures(table)
        .into_iter()
        .filter(|f| f.extension() == ext)
        .collect()
}
