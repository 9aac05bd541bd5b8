//! What several test suites share: the fixtures, embedded at build time.
//!
//! `build.rs` writes one constant per fixture directory (`CONFORMANCE`, `ORACLE_REGRESSIONS`,
//! `EXAMPLE_TRACES`, `CLI_CASES`, `FUZZ_CORPUS`, `FUZZ_ARTIFACTS`): every file under it as (path
//! from the package root, bytes), sorted by path. A test executable so carries its fixtures and
//! finds them wherever it runs, also as a staged copy on a machine without the source tree. Each
//! suite includes this module with `mod common;` and uses what it needs.

#![allow(dead_code)]

include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

/// The source tree this executable was built from (`CARGO_MANIFEST_DIR`), where it is still
/// here (its `Cargo.toml` exists); `None` for an executable copied away from it.
pub fn source_tree() -> Option<&'static std::path::Path> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    root.join("Cargo.toml").is_file().then_some(root)
}

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

/// proptest's failure persistence with a regression file embedded (`include_str!` of
/// `tests/<suite>.proptest-regressions`): its seeds are replayed wherever the test executable
/// runs, where proptest would look for the file next to a source file that may not be there. A
/// new failure is saved as proptest saves it, next to the source file where that is found.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddedRegressions {
    seeds: Vec<proptest::test_runner::PersistedSeed>,
    save: proptest::test_runner::FileFailurePersistence,
}

impl EmbeddedRegressions {
    /// The seeds of a regression file's text. Panics on a line that is neither blank, a comment,
    /// nor a seed: a broken regression file must not be skipped silently.
    pub fn new(text: &str) -> Self {
        let seeds = text
            .lines()
            .enumerate()
            .filter_map(|(i, line)| {
                let line = line.split('#').next().unwrap_or("").trim();
                (!line.is_empty()).then(|| {
                    line.parse()
                        .unwrap_or_else(|()| panic!("regression file, line {}: not a seed", i + 1))
                })
            })
            .collect();
        EmbeddedRegressions {
            seeds,
            save: proptest::test_runner::FileFailurePersistence::default(),
        }
    }

    /// Whether the file holds no seed.
    pub fn is_empty(&self) -> bool {
        self.seeds.is_empty()
    }

    /// For `ProptestConfig::failure_persistence`.
    pub fn boxed(text: &str) -> Option<Box<dyn proptest::test_runner::FailurePersistence>> {
        Some(Box::new(EmbeddedRegressions::new(text)))
    }
}

impl proptest::test_runner::FailurePersistence for EmbeddedRegressions {
    fn load_persisted_failures2(
        &self,
        _source_file: Option<&'static str>,
    ) -> Vec<proptest::test_runner::PersistedSeed> {
        self.seeds.clone()
    }

    fn save_persisted_failure2(
        &mut self,
        source_file: Option<&'static str>,
        seed: proptest::test_runner::PersistedSeed,
        shrunken_value: &dyn std::fmt::Debug,
    ) {
        self.save
            .save_persisted_failure2(source_file, seed, shrunken_value);
    }

    fn box_clone(&self) -> Box<dyn proptest::test_runner::FailurePersistence> {
        Box::new(self.clone())
    }

    fn eq(&self, other: &dyn proptest::test_runner::FailurePersistence) -> bool {
        other
            .as_any()
            .downcast_ref::<EmbeddedRegressions>()
            .is_some_and(|o| o == self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
