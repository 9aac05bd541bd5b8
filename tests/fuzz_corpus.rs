//! Replays the fuzz corpora and crash files through the fuzz targets' own checks, so that a plain
//! `cargo test` covers them without cargo-fuzz.
//!
//! Every file under `fuzz/corpus/<target>/` and `fuzz/artifacts/<target>/` goes through the check
//! of `<target>` (`fuzz/common.rs`, which the fuzz targets include too). A few thousand decoded
//! random programs add to the `checker_oracle` seeds. The seeds themselves are written by the
//! ignored test `write_seeds` (see `docs/fuzzing.md`).
//!
//! Fixtures: `fuzz/corpus/` and `fuzz/artifacts/`, embedded at build time (`tests/common/mod.rs`),
//! so the replay runs wherever the test executable is. `write_seeds` writes into the source
//! tree's `fuzz/corpus/` where the source tree is here, and into a temporary directory
//! elsewhere.

#[path = "../fuzz/common.rs"]
#[allow(dead_code)]
mod common;
#[path = "common/mod.rs"]
mod fixtures;

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use fixtures::Fixture;

use streamsan::fuzz::gen::{generate, GenConfig};
use streamsan::workload::SplitMix;

/// The check of one fuzz target.
type Check = fn(&[u8]);

/// The fuzz targets and their checks.
const TARGETS: [(&str, Check); 5] = [
    ("parse_line", common::check_parse_line),
    ("trace_reader", common::check_trace_reader),
    ("checker_oracle", common::check_checker_oracle),
    ("fix", common::check_fix),
    ("syncs", common::check_syncs),
];

/// The embedded files of `fuzz/<kind>/` (`corpus` or `artifacts`).
fn embedded(kind: &str) -> Vec<Fixture> {
    match kind {
        "corpus" => fixtures::fixtures(fixtures::FUZZ_CORPUS),
        "artifacts" => fixtures::fixtures(fixtures::FUZZ_ARTIFACTS),
        other => panic!("no fuzz directory {other}"),
    }
}

/// The files of `fuzz/<kind>/<target>/`, sorted.
fn files(kind: &str, target: &str) -> Vec<Fixture> {
    let prefix = format!("fuzz/{kind}/{target}/");
    embedded(kind)
        .into_iter()
        .filter(|f| f.path.starts_with(&prefix))
        .collect()
}

/// Hostile shapes for the reader's seeds: lines longer than the fuzz checks' line limits (8 to
/// 71 bytes), control characters and escapes in ids, huge numbers, a byte-order mark before a
/// long line, CRLF at the limit, NUL bytes, invalid UTF-8 far into a line, deep nesting.
fn hostile() -> Vec<(String, Vec<u8>)> {
    let long_id = "x".repeat(300);
    let digits = "9".repeat(200);
    let mut v: Vec<(&str, Vec<u8>)> = vec![
        (
            "hostile-long-lines",
            format!(
                "{{\"op\":\"device_sync\"}}\n{{\"op\":\"stream_sync\",\"stream\":\"{long_id}\"}}\n{{\"op\":\"device_sync\"}}\n"
            )
            .into_bytes(),
        ),
        (
            "hostile-control-ids",
            "{\"op\":\"alloc\",\"buffer\":\"b\\u001b[2J\",\"bytes\":8,\"stream\":\"s\\nstreamsan: no hazards\"}\n{\"op\":\"launch\",\"stream\":\"t\\u009b31m\",\"name\":\"k\\u001b]0;x\\u0007\",\"reads\":[\"b\\u001b[2J\"],\"site\":\"a\\u202e.py:1\"}\n{\"op\":\"\\u001b[2J\"}\n"
                .as_bytes()
                .to_vec(),
        ),
        (
            "hostile-huge-numbers",
            format!(
                "{{\"op\":\"device_sync\",\"device\":{digits}}}\n{{\"op\":\"alloc\",\"buffer\":\"b\",\"bytes\":18446744073709551615,\"addr\":18446744073709551615}}\n{{\"op\":\"device_sync\",\"device\":1e999}}\n{{\"op\":\"device_sync\",\"device\":-{digits}}}\n"
            )
            .into_bytes(),
        ),
        (
            "hostile-bom-long-line",
            format!("\u{feff}{{\"op\":\"stream_sync\",\"stream\":\"{long_id}\"}}\r\n{{\"op\":\"device_sync\"}}").into_bytes(),
        ),
        (
            "hostile-crlf-at-limit",
            b"{\"op\":\"device_sync\"    }\r\n{\"op\":\"device_sync\"     }\r\n{\"op\":\"device_sync\"}\r\n"
                .to_vec(),
        ),
        (
            "hostile-nul-and-invalid-utf8",
            [
                &b"{\"op\":\"device_sync\"}\n"[..],
                &[0u8; 100][..],
                b"\n{\"op\":\"stream_sync\",\"stream\":\"",
                &b"y".repeat(50),
                b"\xff\xfe\"}\n",
            ]
            .concat(),
        ),
        (
            "hostile-deep-nesting",
            format!(
                "{{\"op\":\"launch\",\"stream\":\"s\",\"reads\":{}{}}}\n",
                "[".repeat(500),
                "]".repeat(500)
            )
            .into_bytes(),
        ),
    ];
    // A line of every length around the limits, without a final newline.
    v.push((
        "hostile-no-final-newline",
        format!(
            "{{\"op\":\"stream_sync\",\"stream\":\"{}\"}}",
            "z".repeat(60)
        )
        .into_bytes(),
    ));
    v.into_iter().map(|(n, b)| (n.to_string(), b)).collect()
}

/// Runs every file of `fuzz/<kind>/<target>/` through its target's check; returns the number of
/// files and the failures. A file in a directory of no target is a failure too: it would
/// otherwise never be replayed.
fn replay(kind: &str) -> (usize, Vec<String>) {
    let mut count = 0;
    let mut failures = Vec::new();
    for file in embedded(kind) {
        let rest = &file.path[format!("fuzz/{kind}/").len()..];
        let known = TARGETS
            .iter()
            .any(|(t, _)| rest.strip_prefix(t).is_some_and(|r| r.starts_with('/')));
        if !known && rest.contains('/') {
            failures.push(format!(
                "{}: not in the directory of a fuzz target",
                file.path
            ));
        }
    }
    for (target, check) in TARGETS {
        for file in files(kind, target) {
            let data = file.bytes;
            let path = file.path;
            count += 1;
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| check(data))) {
                let msg = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{path}: {msg}"));
            }
        }
    }
    (count, failures)
}

#[test]
fn corpora_pass_their_checks() {
    let (count, failures) = replay("corpus");
    println!("replayed {count} corpus files");
    for (target, _) in TARGETS {
        assert!(
            !files("corpus", target).is_empty(),
            "the seed corpus of {target} is missing"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn crash_files_pass_their_checks() {
    let (count, failures) = replay("artifacts");
    println!("replayed {count} crash files");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Random bytes decode to programs the checker and the oracle agree on, and that `fix` fixes (a
/// small, deterministic taste of the `checker_oracle` and `fix` fuzzers).
#[test]
fn random_decoded_programs_agree() {
    let mut rng = SplitMix::new(0x5eed_f022);
    let mut ops = 0;
    for _ in 0..1500 {
        let len = 3 + rng.below(120) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let program = common::decode_program(&data);
        ops += program.len();
        common::check_checker_oracle(&data);
        common::check_fix(&data);
    }
    println!("1500 decoded programs, {ops} ops");
}

/// The decoder reaches every hazard kind and every op (so the fuzzer can too), and the hazards
/// of graph replays; only graph programs of its loose mode are ever bad input.
#[test]
fn decoder_reaches_every_hazard_kind() {
    let mut rng = SplitMix::new(7);
    let mut kinds = BTreeSet::new();
    let mut names = BTreeSet::new();
    let (mut replays, mut rejected) = (0, 0);
    for _ in 0..3000 {
        let data: Vec<u8> = (0..100).map(|_| rng.next_u64() as u8).collect();
        let program = common::decode_program(&data);
        assert!(program.len() <= common::MAX_OPS);
        names.extend(program.iter().map(|op| op.op.name()));
        let keys = match common::checker_keys(&program) {
            Ok(keys) => keys,
            Err(e) => {
                let loose = data[0] >> 4 & 1 == 1 && data[0] >> 5 & 3 == 3;
                assert!(loose, "a decoded program is bad input: {e}");
                rejected += 1;
                continue;
            }
        };
        replays += usize::from(keys.iter().any(|k| k.4.is_some()));
        kinds.extend(keys.into_iter().map(|k| k.1));
    }
    assert_eq!(kinds.len(), streamsan::HazardKind::ALL.len(), "{kinds:?}");
    assert_eq!(names.len(), streamsan::trace::Op::NAMES.len(), "{names:?}");
    assert!(replays >= 30, "{replays} programs with a replay's hazard");
    assert!(rejected >= 10, "{rejected} bad graph programs");
}

/// Writes the seed corpora: the conformance traces and a few generated programs (whole files for
/// `trace_reader`, one line per file for `parse_line`) and random bytes for `checker_oracle`.
/// Run with `cargo test --test fuzz_corpus -- --ignored write_seeds`. It writes into the source
/// tree's `fuzz/corpus/`; where there is no source tree (a staged test executable) it writes into
/// a temporary directory instead, and checks what it wrote.
#[test]
#[ignore = "writes fuzz/corpus; run by hand"]
fn write_seeds() {
    let corpus = match fixtures::source_tree() {
        Some(root) => root.join("fuzz/corpus"),
        None => {
            let dir = std::env::temp_dir().join(format!("streamsan-seeds-{}", std::process::id()));
            println!(
                "no source tree at {}: writing to {}",
                env!("CARGO_MANIFEST_DIR"),
                dir.display()
            );
            dir
        }
    };
    for (target, _) in TARGETS {
        std::fs::create_dir_all(corpus.join(target)).expect("corpus directory");
    }
    let mut traces: Vec<(String, Vec<u8>)> = Vec::new();
    for table in [fixtures::CONFORMANCE, fixtures::ORACLE_REGRESSIONS] {
        for file in fixtures::fixtures(table) {
            let name = file.name();
            let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
            traces.push((stem.to_owned(), file.bytes.to_vec()));
        }
    }
    assert!(traces.len() >= 40, "the conformance traces are missing");
    for seed in 0..4u64 {
        let cfg = GenConfig {
            ops: 24,
            use_after_free: seed == 3,
            missing_sync: if seed == 3 { 0.7 } else { 0.3 },
            ..GenConfig::default()
        };
        let program = generate(&cfg, &mut SplitMix::new(seed));
        traces.push((format!("generated-{seed}"), program.to_jsonl().into_bytes()));
    }
    let mut lines = BTreeSet::new();
    for (name, text) in &traces {
        std::fs::write(
            corpus.join("trace_reader").join(format!("{name}.jsonl")),
            text,
        )
        .expect("write seed");
        for line in text.split(|&b| b == b'\n') {
            if !line.is_empty() && !line.starts_with(b"# expect") {
                lines.insert(line.to_vec());
            }
        }
    }
    for (i, line) in lines.iter().enumerate() {
        std::fs::write(corpus.join("parse_line").join(format!("line-{i:03}")), line)
            .expect("write seed");
    }
    // The hostile shapes: whole files for `trace_reader`, their lines for `parse_line`.
    let mut hostile_lines = BTreeSet::new();
    for (name, text) in hostile() {
        std::fs::write(
            corpus.join("trace_reader").join(format!("{name}.jsonl")),
            &text,
        )
        .expect("write seed");
        hostile_lines.extend(text.split(|&b| b == b'\n').map(<[u8]>::to_vec));
    }
    for (i, line) in hostile_lines.difference(&lines).enumerate() {
        std::fs::write(
            corpus.join("parse_line").join(format!("hostile-{i:02}")),
            line,
        )
        .expect("write seed");
    }
    let mut rng = SplitMix::new(0xc0ffee);
    for i in 0..24 {
        let len = 16 + rng.below(160) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        std::fs::write(
            corpus.join("checker_oracle").join(format!("random-{i:02}")),
            data,
        )
        .expect("write seed");
    }
    // The synchronization analysis: random bytes, most of whose programs have syncs that are
    // needed and syncs that are not.
    let mut rng = SplitMix::new(0x5_1c5);
    for i in 0..24 {
        let len = 40 + rng.below(200) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        std::fs::write(corpus.join("syncs").join(format!("random-{i:02}")), data)
            .expect("write seed");
    }
    // Graph programs: the decoder's graph mode (captures, pools, replays), 8 well-formed and 4
    // loose (now and then bad input, which both sides must reject at the same op).
    let mut rng = SplitMix::new(0x9a9f);
    for i in 0..12 {
        let len = 64 + rng.below(160) as usize;
        let mut data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        // Three streams, no addr, graph mode, loose for the last four.
        data[0] = if i < 8 { 0x14 } else { 0x74 };
        std::fs::write(
            corpus.join("checker_oracle").join(format!("graph-{i:02}")),
            data,
        )
        .expect("write seed");
    }
    // The synchronization analysis on graph programs (well-formed, the decoder's graph mode):
    // captured waits, replays whose entry a host sync orders, pool buffers.
    let mut rng = SplitMix::new(0x5_9a9f);
    for i in 0..12 {
        let len = 96 + rng.below(200) as usize;
        let mut data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        data[0] = 0x14;
        std::fs::write(corpus.join("syncs").join(format!("graph-{i:02}")), data)
            .expect("write seed");
    }
    // Every file now in the corpus passes its target's check.
    let mut written = 0;
    for (target, check) in TARGETS {
        for entry in std::fs::read_dir(corpus.join(target)).expect("corpus directory") {
            let path = entry.expect("directory entry").path();
            if path.is_file()
                && !path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            {
                check(&std::fs::read(&path).expect("readable seed"));
                written += 1;
            }
        }
    }
    println!("{written} seed files in {}", corpus.display());
    assert!(written > traces.len(), "the seeds were not written");
}
