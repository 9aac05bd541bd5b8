//! Reading traces: JSON Lines into [`TraceOp`]s, with located errors.
//!
//! [`TraceReader`] streams a trace line by line; [`parse_line`] (and [`parse_line_bytes`]) parse
//! one line. Every op comes with its [`Spans`]: the line and the byte column of each field's value,
//! so that errors found later (a region past the end of its buffer, a host access to device
//! memory, …) point at the offending value. Bad input is a [`ParseError`] that reads
//! `FILE:LINE:COL: MESSAGE; expected EXPECTED`.
//!
//! # Lines and columns
//!
//! Lines are 1-based and count every line of the file, blank and comment lines included. Columns
//! are 1-based **byte** columns of the line as it is in the file, with two exceptions: a UTF-8
//! byte-order mark at the very start of the file is removed before counting (so the first `{` of
//! line 1 is column 1 with or without a BOM), and the `\r` of a CRLF line end is removed.
//!
//! Blank lines (JSON whitespace only: space, tab, CR) and lines whose first non-blank character is
//! `#` are not ops.
//!
//! # Which error is reported
//!
//! A line can be wrong in several ways at once; the first of these is reported:
//!
//! 1. invalid UTF-8 anywhere in the line, at the first invalid byte;
//! 2. malformed JSON anywhere in the line, at the column and with the message of `serde_json`
//!    (nesting of any depth gives an error, never a stack overflow);
//! 3. a top-level value that is not an object, at that value;
//! 4. `"op"` missing (at the object's `{`), not a string or not an op name (at its value);
//! 5. the first problem in line order among: a field unknown to the op or a duplicate key (at the
//!    key's opening quote), and a value of the wrong type or out of range, `"host"` as a stream id,
//!    a region whose `offset + bytes` overflows (at that value, or at the region's `{`);
//! 6. a missing required field, at the object's `{`, in the order the format lists the fields;
//! 7. an `alloc` whose `addr + bytes` overflows, at the value of `addr`.
//!
//! # How it is fast
//!
//! Lines in the form [`write_op`](super::write_op) writes them (`"op"` first, the other fields in
//! the format's order, no whitespace, no escapes) take a fast path that matches each expected
//! `,"key":` as a whole and scans strings eight bytes at a time; from line 2 on it reads them
//! where they lie in the `BufRead`'s buffer, without copying. Any other line, or any surprise on
//! the fast path, goes to a general scanner written for the trace format, which accepts any
//! valid JSON spelling. Both allocate nothing beyond the op's own strings and vectors, and the
//! tests check that they agree. Only when a line is bad does `serde_json` parse it as well, so
//! that syntax errors read exactly as `serde_json` reports them; a line whose `"op"` is not its
//! first key is read once by `serde_json` to find the op first.
//!
//! # Where things are
//!
//! | file | holds |
//! |---|---|
//! | `lines.rs` | [`TraceReader`]: lines from a `BufRead`, canonical ones read in place |
//! | `limit.rs` | the line limit ([`MAX_LINE_BYTES`], [`check_line_length`]) and line ends |
//! | `fast.rs` | the fast path: the canonical form, field by field in the schema's order |
//! | `general.rs` | the general path: an op object in any JSON spelling |
//! | `scan.rs` | the scanner both paths share: strings, integers, ids, regions, sites |
//! | `fields.rs` | keys and op names as the scanner compares them; the op built from its fields |
//! | `spans.rs` | [`Spans`]: where each field's value is |
//! | `error.rs` | [`ParseError`], [`LineError`] and the pieces of their messages |
//!
//! Which fields each op has, in which order, and which it requires is the schema of
//! `trace/schema.rs`, which the writer follows too.

mod error;
mod fast;
mod fields;
mod general;
mod limit;
mod lines;
mod scan;
mod spans;
#[cfg(test)]
mod tests;

use serde::de::IgnoredAny;

pub use error::{LineError, ParseError};
pub use limit::{check_line_length, MAX_LINE_BYTES, MIN_LINE_LIMIT};
pub use lines::TraceReader;
pub use spans::Spans;

use crate::trace::TraceOp;
use error::from_serde;
use scan::Scanner;

/// Parses one line of a trace.
///
/// Returns `Ok(None)` for a blank or comment line, else the op and its [`Spans`] (whose line is 1).
/// The line may end in `\n` or `\r\n`. Never panics, whatever the input.
pub fn parse_line(line: &str) -> Result<Option<(TraceOp, Spans)>, LineError> {
    let mut spans = Spans {
        line: 1,
        ..Spans::default()
    };
    Ok(parse_into(line, &mut spans, true)?.map(|op| (op, spans)))
}

/// Parses one line of a trace given as bytes: [`parse_line`] after checking that it is UTF-8.
pub fn parse_line_bytes(line: &[u8]) -> Result<Option<(TraceOp, Spans)>, LineError> {
    parse_line(utf8(line)?)
}

/// The line as a `str`, or the error at its first invalid byte.
fn utf8(line: &[u8]) -> Result<&str, LineError> {
    std::str::from_utf8(line).map_err(|e| {
        let at = e.valid_up_to();
        LineError {
            column: at as u64 + 1,
            message: format!(
                "invalid UTF-8 (byte 0x{:02x})",
                line.get(at).copied().unwrap_or(0)
            ),
            expected: Some("UTF-8 text".to_owned()),
        }
    })
}

/// Parses `line` into an op, recording its columns in `spans` (whose line the caller sets).
///
/// `canonical` tries the fast path first; without it the general scanner reads every line (the
/// tests compare the two).
fn parse_into(
    line: &str,
    spans: &mut Spans,
    canonical: bool,
) -> Result<Option<TraceOp>, LineError> {
    let mut p = Scanner {
        b: line.as_bytes(),
        pos: 0,
    };
    match p.peek_ws() {
        None | Some(b'#') => return Ok(None),
        Some(_) => {}
    }
    spans.clear();
    let start = p.pos;
    if canonical {
        if let Some(op) = p.canonical_line(spans) {
            if p.peek_ws().is_none() {
                return Ok(Some(op));
            }
        }
    }
    p.pos = start;
    spans.clear();
    match p.op_line(spans) {
        Ok(op) => Ok(Some(op)),
        // Syntax errors anywhere in the line come first, as serde_json reports them.
        Err(e) => Err(syntax_error(line).unwrap_or(*e)),
    }
}

/// serde_json's error for `line`, if it is not one valid JSON value.
fn syntax_error(line: &str) -> Option<LineError> {
    serde_json::from_str::<IgnoredAny>(line)
        .err()
        .map(|e| from_serde(&e, 0, "invalid JSON"))
}
