//! Conformance: every rule of the trace format, each with a racy and a fixed variant, as trace
//! files under `tests/conformance/`. Each file states the hazards it must produce in comment
//! lines, `# expect: OP KIND [BUFFER] [[CONFLICT,OPS]]`, or `# expect: clean`; the checker must
//! report exactly those hazards (no more, no fewer), with exactly those conflicting ops. An op
//! written `N@M` is a graph replay's: op N (the `graph_launch`) replaying captured op M (the
//! report's `captured`). A bad-input trace says `# expect-error: OP FIELD`: the checker rejects
//! op OP, locating the error at FIELD (`Graph`, `Stream`, `Event`, `Op`, …).
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
    captured: Option<u64>,
    kind: String,
    buffer: Option<String>,
    conflicts: Option<Vec<(u64, Option<u64>)>>,
}

/// `N` or `N@M`.
fn op_at(word: &str) -> (u64, Option<u64>) {
    match word.trim().split_once('@') {
        Some((n, m)) => (
            n.parse().expect("op index"),
            Some(m.parse().expect("captured op index")),
        ),
        None => (word.trim().parse().expect("op index"), None),
    }
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
                    .map(op_at)
                    .collect();
                (h, Some(ops))
            }
            None => (rest, None),
        };
        let mut words = head.split_whitespace();
        let (op, captured) = op_at(words.next().expect("op"));
        let kind = words.next().expect("kind").to_string();
        let buffer = words.next().map(str::to_string);
        v.push(Expected {
            op,
            captured,
            kind,
            buffer,
            conflicts,
        });
    }
    v.sort();
    v
}

/// The `# expect-error: OP FIELD` line of a bad-input trace.
fn expected_error(text: &str) -> Option<(u64, String)> {
    text.lines().find_map(|l| {
        let e = l.trim().strip_prefix("# expect-error:")?;
        let mut w = e.split_whitespace();
        let op = w.next()?.parse().expect("op index");
        Some((op, w.next().expect("field").to_string()))
    })
}

fn check_file(file: &Fixture) -> Result<(), String> {
    let text = file.text();
    assert!(
        text.contains("# expect:") || text.contains("# expect-error:"),
        "{} states no expectation",
        file.path
    );
    let expected = parse_expectations(text);
    let bad = expected_error(text);
    let mut reader = TraceReader::new(text.as_bytes(), file.path);
    let mut checker = Checker::new();
    while let Some((op, spans)) = reader.next_op().map_err(|e| e.to_string())? {
        let index = checker.ops();
        match (checker.check(&op), &bad) {
            (Ok(_), Some((at, _))) if *at == index => {
                return Err(format!(
                    "op {index} is bad input, but the checker accepts it"
                ))
            }
            (Ok(_), _) => {}
            (Err(e), Some((at, field))) if *at == index => {
                let got = format!("{:?}", e.field);
                if &got != field {
                    return Err(format!(
                        "op {index}: the error is at {got}, not {field}: {e}"
                    ));
                }
                // The error is located in the line, at the field's value.
                let (line, column) = spans.locate(e.field);
                if line == 0 || column == 0 {
                    return Err(format!("op {index}: {e} is not located"));
                }
                return Ok(());
            }
            (Err(e), _) => return Err(format!("op {index}: {e}")),
        }
    }
    if let Some((at, _)) = bad {
        return Err(format!("the trace ends before its bad op {at}"));
    }
    let report = checker.finish();
    let mut got: Vec<Expected> = report
        .hazards
        .iter()
        .map(|h| Expected {
            op: h.op,
            captured: h.access.as_ref().and_then(|a| a.captured),
            kind: h.kind.as_str().to_string(),
            buffer: h.buffer.clone(),
            conflicts: Some(h.conflicts.iter().map(|c| (c.op, c.captured)).collect()),
        })
        .collect();
    got.sort();
    // An expectation without a conflict list does not constrain conflicts.
    let matches = got.len() == expected.len()
        && got.iter().zip(&expected).all(|(g, e)| {
            g.op == e.op
                && g.captured == e.captured
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
