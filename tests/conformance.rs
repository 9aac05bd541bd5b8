//! Conformance: every rule of the trace format, each with a racy and a fixed variant, as trace
//! files under `tests/conformance/`. Each file states the hazards it must produce in comment
//! lines, `# expect: OP KIND [BUFFER] [[CONFLICT,OPS]]`, or `# expect: clean`; the checker must
//! report exactly those hazards (no more, no fewer), with exactly those conflicting ops.
//!
//! Fixtures: `tests/conformance/*.jsonl`, embedded at build time (`tests/common/mod.rs`), so the
//! test runs wherever its executable is.

mod common;

use common::Fixture;
use streamsan::trace::TraceReader;
use streamsan::Checker;

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Expected {
    op: u64,
    kind: String,
    buffer: Option<String>,
    conflicts: Option<Vec<u64>>,
}

fn parse_expectations(text: &str) -> Vec<Expected> {
    let mut v = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("# expect:") else {
            continue;
        };
        let rest = rest.trim();
        if rest == "clean" {
            continue;
        }
        let (head, conflicts) = match rest.split_once('[') {
            Some((h, c)) => {
                let ops = c
                    .trim_end_matches(']')
                    .split(',')
                    .filter(|s| !s.trim().is_empty())
                    .map(|s| s.trim().parse().expect("conflict op"))
                    .collect();
                (h, Some(ops))
            }
            None => (rest, None),
        };
        let mut words = head.split_whitespace();
        let op = words.next().expect("op").parse().expect("op index");
        let kind = words.next().expect("kind").to_string();
        let buffer = words.next().map(str::to_string);
        v.push(Expected {
            op,
            kind,
            buffer,
            conflicts,
        });
    }
    v.sort();
    v
}

fn check_file(file: &Fixture) -> Result<(), String> {
    let text = file.text();
    assert!(
        text.contains("# expect:"),
        "{} states no expectation",
        file.path
    );
    let expected = parse_expectations(text);
    let mut reader = TraceReader::new(text.as_bytes(), file.path);
    let mut checker = Checker::new();
    while let Some((op, _)) = reader.next_op().map_err(|e| e.to_string())? {
        let index = checker.ops();
        checker.check(&op).map_err(|e| format!("op {index}: {e}"))?;
    }
    let report = checker.finish();
    let mut got: Vec<Expected> = report
        .hazards
        .iter()
        .map(|h| Expected {
            op: h.op,
            kind: h.kind.as_str().to_string(),
            buffer: h.buffer.clone(),
            conflicts: Some(h.conflicts.iter().map(|c| c.op).collect()),
        })
        .collect();
    got.sort();
    // An expectation without a conflict list does not constrain conflicts.
    let matches = got.len() == expected.len()
        && got.iter().zip(&expected).all(|(g, e)| {
            g.op == e.op
                && g.kind == e.kind
                && g.buffer == e.buffer
                && (e.conflicts.is_none() || g.conflicts == e.conflicts)
        });
    if matches {
        Ok(())
    } else {
        Err(format!(
            "expected {expected:#?}\ngot {got:#?}\nreport:\n{}",
            report.to_json()
        ))
    }
}

#[test]
fn conformance_suite() {
    let files = common::fixtures(common::CONFORMANCE);
    assert!(files.len() >= 30, "the suite has {} files", files.len());
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| check_file(f).err().map(|e| format!("== {}\n{e}", f.path)))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}
