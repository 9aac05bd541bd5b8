//! Bad input and its located messages: [`ParseError`] (file, line, column), [`LineError`] (a
//! column of one line), and what the scanner builds them from: the path of a value
//! (`reads[1].offset`) and what a value found was.

use std::fmt;

use crate::trace::schema::Key;

/// Bad input in a trace: where it is and what was wrong.
///
/// Displays as `FILE:LINE:COL: MESSAGE; expected EXPECTED`, or `FILE:LINE:COL: MESSAGE` when
/// nothing in particular was expected. Line and column are 1-based; the column counts bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}{}", expected_suffix(.expected))]
pub struct ParseError {
    /// The trace file, as given to the reader.
    pub file: String,
    /// The 1-based line.
    pub line: u64,
    /// The 1-based byte column of the offending value (or key).
    pub column: u64,
    /// What was wrong.
    pub message: String,
    /// What was expected instead, if anything in particular.
    pub expected: Option<String>,
}

impl ParseError {
    /// An error at `(line, column)` of `file`, for example at [`Spans::locate`](super::Spans::locate) of a field that a
    /// later stage found wrong.
    pub fn at(
        file: impl Into<String>,
        (line, column): (u64, u64),
        message: impl Into<String>,
        expected: Option<&str>,
    ) -> Self {
        ParseError {
            file: file.into(),
            line,
            column,
            message: message.into(),
            expected: expected.map(str::to_owned),
        }
    }
}

/// Bad input in one line: [`ParseError`] without the file and the line.
///
/// Displays as `COL: MESSAGE; expected EXPECTED`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{column}: {message}{}", expected_suffix(.expected))]
pub struct LineError {
    /// The 1-based byte column of the offending value (or key).
    pub column: u64,
    /// What was wrong.
    pub message: String,
    /// What was expected instead, if anything in particular.
    pub expected: Option<String>,
}

impl LineError {
    /// This error, located in line `line` of `file`.
    pub fn at_line(self, file: impl Into<String>, line: u64) -> ParseError {
        ParseError {
            file: file.into(),
            line,
            column: self.column,
            message: self.message,
            expected: self.expected,
        }
    }
}

pub(super) fn expected_suffix(expected: &Option<String>) -> String {
    match expected {
        Some(e) => format!("; expected {e}"),
        None => String::new(),
    }
}

/// A located error while scanning; boxed so that results stay small on the fast path.
pub(super) type Bad = Box<LineError>;
pub(super) type Scan<T> = Result<T, Bad>;

#[cold]
pub(super) fn bad(pos: usize, message: String, expected: Option<&str>) -> Bad {
    Box::new(LineError {
        column: pos as u64 + 1,
        message,
        expected: expected.map(str::to_owned),
    })
}

/// What a value starting with `b` is, for "wrong type" messages.
pub(super) fn found(b: Option<u8>) -> &'static str {
    match b {
        Some(b'"') => "a string",
        Some(b'-' | b'0'..=b'9') => "a number",
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "not a JSON value",
    }
}

/// A serde_json error of the text starting at byte `offset` of the line.
pub(super) fn from_serde(e: &serde_json::Error, offset: usize, what: &str) -> LineError {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = full.strip_suffix(&suffix).unwrap_or(&full);
    LineError {
        column: (offset + e.column().max(1)) as u64,
        message: format!("{what}: {message}"),
        expected: None,
    }
}

/// A key of a region object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RegionKey {
    Buffer,
    Offset,
    Bytes,
}

impl RegionKey {
    pub(super) fn name(self) -> &'static str {
        match self {
            RegionKey::Buffer => "buffer",
            RegionKey::Offset => "offset",
            RegionKey::Bytes => "bytes",
        }
    }
}

/// Where a value is, for messages: `stream`, `reads[1]`, `reads[1].offset`, `site[0]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Path {
    key: Key,
    index: Option<u32>,
    sub: Option<RegionKey>,
}

impl Path {
    pub(super) fn key(key: Key) -> Self {
        Path {
            key,
            index: None,
            sub: None,
        }
    }

    pub(super) fn at(self, index: usize) -> Self {
        Path {
            index: Some(index as u32),
            ..self
        }
    }

    pub(super) fn sub(self, sub: RegionKey) -> Self {
        Path {
            sub: Some(sub),
            ..self
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key.name())?;
        if let Some(i) = self.index {
            write!(f, "[{i}]")?;
        }
        if let Some(sub) = self.sub {
            write!(f, ".{}", sub.name())?;
        }
        Ok(())
    }
}
