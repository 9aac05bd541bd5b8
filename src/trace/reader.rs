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

use std::borrow::Cow;
use std::fmt;
use std::io::BufRead;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::schema::{Key, Kind, Type, ID, INTEGER, REGION};
use super::{Field, Id, MemoryKind, Op, Region, Site, TraceOp, HOST};
use crate::text::{clip, ECHO_CHARS};

/// The longest line a [`TraceReader`] accepts: 16 MiB, counting every byte before the line's
/// `\n` (a `\r` and, on line 1, a byte-order mark included).
///
/// A longer line is bad input, reported at the column of its first byte past the limit as soon
/// as the reader has seen it, without reading the rest of the line: memory stays bounded on any
/// input (`streamsan check /dev/zero` ends at once). The limit is far above any real op: a
/// launch that names 100,000 regions in the long form is about 4.5 MB.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// The smallest line limit [`TraceReader::with_line_limit`] sets.
pub const MIN_LINE_LIMIT: usize = 8;

/// A UTF-8 byte-order mark.
const BOM: &[u8; 3] = b"\xEF\xBB\xBF";

/// Whether the bytes `head` then `more` start with a byte-order mark.
fn starts_with_bom(head: &[u8], more: &[u8]) -> bool {
    head.iter().chain(more).take(3).copied().eq(*BOM)
}

/// The error of a line longer than `limit` bytes, at the column of its first byte past the
/// limit (columns of line 1 do not count a byte-order mark, `bom`).
#[cold]
fn line_too_long(limit: usize, bom: bool) -> LineError {
    let column = limit as u64 + 1 - if bom { 3 } else { 0 };
    LineError {
        column,
        message: format!("the line is longer than {limit} bytes"),
        expected: Some(format!(
            "a line of at most {limit} bytes (the trace format's line limit)"
        )),
    }
}

/// The error [`TraceReader`] reports for line `bytes` (as read from the file, without its
/// `\n`; `first` when it is line 1) when it is longer than `limit`, else `None`. For tests
/// that hold the reader against [`parse_line_bytes`].
pub fn check_line_length(bytes: &[u8], first: bool, limit: usize) -> Option<LineError> {
    let limit = limit.max(MIN_LINE_LIMIT);
    (bytes.len() > limit).then(|| line_too_long(limit, first && bytes.starts_with(BOM)))
}

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
    /// An error at `(line, column)` of `file`, for example at [`Spans::locate`] of a field that a
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

fn expected_suffix(expected: &Option<String>) -> String {
    match expected {
        Some(e) => format!("; expected {e}"),
        None => String::new(),
    }
}

/// Where the fields of one op are in its line: the line, and the 1-based byte column where each
/// present field's value starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spans {
    line: u64,
    /// Columns of the object and of the single-valued fields (0: absent), indexed by [`slot`].
    columns: [u64; SLOTS],
    /// Columns of the entries of `reads`.
    reads: Vec<u64>,
    /// Columns of the entries of `writes`.
    writes: Vec<u64>,
}

const SLOTS: usize = 11;

/// The index of a single-valued field in [`Spans::columns`].
#[inline(always)]
fn slot(field: Field) -> Option<usize> {
    Some(match field {
        Field::Op => 0,
        Field::Stream => 1,
        Field::Event => 2,
        Field::Buffer => 3,
        Field::Bytes => 4,
        Field::Addr => 5,
        Field::Memory => 6,
        Field::Device => 7,
        Field::Blocking => 8,
        Field::Src => 9,
        Field::Dst => 10,
        Field::Read(_) | Field::Write(_) => return None,
    })
}

impl Spans {
    /// The 1-based line of the op (1 for [`parse_line`]).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// The 1-based byte column where `field`'s value starts, if the op has it. [`Field::Op`] is the
    /// column of the object's opening `{`; [`Field::Read`]`(i)` that of the i-th entry of `reads`.
    pub fn column(&self, field: Field) -> Option<u64> {
        let column = match field {
            Field::Read(i) => self.reads.get(i as usize).copied(),
            Field::Write(i) => self.writes.get(i as usize).copied(),
            _ => slot(field).map(|s| self.columns[s]),
        };
        column.filter(|&c| c != 0)
    }

    /// `(line, column)` of `field`'s value, or of the op's object when the field is absent.
    pub fn locate(&self, field: Field) -> (u64, u64) {
        let column = self.column(field).unwrap_or(self.columns[0]);
        (self.line, column)
    }

    fn clear(&mut self) {
        self.columns = [0; SLOTS];
        self.reads.clear();
        self.writes.clear();
    }
}

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

/// A serde_json error of the text starting at byte `offset` of the line.
fn from_serde(e: &serde_json::Error, offset: usize, what: &str) -> LineError {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = full.strip_suffix(&suffix).unwrap_or(&full);
    LineError {
        column: (offset + e.column().max(1)) as u64,
        message: format!("{what}: {message}"),
        expected: None,
    }
}

/// The position of the first `\n` of `bytes`, eight bytes at a time.
#[inline]
fn line_end(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut i = 0;
    while let Some(chunk) = bytes.get(i..).and_then(|rest| rest.first_chunk::<8>()) {
        let x = u64::from_le_bytes(*chunk) ^ (ONES * u64::from(b'\n'));
        let newline = x.wrapping_sub(ONES) & !x & HIGH;
        if newline != 0 {
            return Some(i + (newline.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    bytes
        .get(i..)?
        .iter()
        .position(|&b| b == b'\n')
        .map(|n| i + n)
}

/// Parses line number `line` as read from the file: without its `\n`, but with its `\r` and, on
/// line 1, a byte-order mark.
fn parse_raw(mut bytes: &[u8], line: u64, spans: &mut Spans) -> Result<Option<TraceOp>, LineError> {
    if let Some(rest) = bytes.strip_suffix(b"\r") {
        bytes = rest;
    }
    if line == 1 {
        if let Some(rest) = bytes.strip_prefix(BOM) {
            bytes = rest;
        }
    }
    parse_into(utf8(bytes)?, spans, true)
}

/// Reads a trace as a stream of ops, one line at a time.
///
/// Memory does not grow with the number of lines: one line buffer and one [`Spans`] are reused.
/// After an error the reader can go on with the next line.
///
/// ```
/// use streamsan::trace::TraceReader;
/// let text = "# a comment\n{\"op\":\"stream_sync\",\"stream\":\"s1\"}\n";
/// let mut reader = TraceReader::new(text.as_bytes(), "trace.jsonl");
/// let (op, spans) = reader.next_op()?.expect("one op");
/// assert_eq!(op.op.name(), "stream_sync");
/// assert_eq!(spans.line(), 2);
/// assert_eq!(reader.ops_read(), 1);
/// assert!(reader.next_op()?.is_none());
/// # Ok::<(), streamsan::trace::ParseError>(())
/// ```
pub struct TraceReader<R: BufRead> {
    reader: R,
    file: String,
    buf: Vec<u8>,
    line: u64,
    ops: u64,
    spans: Spans,
    /// The longest line accepted, in bytes ([`MAX_LINE_BYTES`] unless set for tests).
    limit: usize,
    /// Set after an over-long line was reported: the rest of that line is skipped, unread, by
    /// the next call.
    skipping: bool,
    /// Whether a line may be read in place: past line 1 (whose byte-order mark the general path
    /// removes) and not skipping.
    fast: bool,
}

impl<R: BufRead> TraceReader<R> {
    /// A reader of `reader`, whose errors name `file`.
    pub fn new(reader: R, file: impl Into<String>) -> Self {
        TraceReader {
            reader,
            file: file.into(),
            buf: Vec::new(),
            line: 0,
            ops: 0,
            spans: Spans::default(),
            limit: MAX_LINE_BYTES,
            skipping: false,
            fast: false,
        }
    }

    /// This reader with another line limit than [`MAX_LINE_BYTES`] (at least [`MIN_LINE_LIMIT`]
    /// bytes; smaller values are raised to it). For tests and fuzzing, which exercise the limit
    /// with small lines.
    pub fn with_line_limit(mut self, bytes: usize) -> Self {
        self.limit = bytes.max(MIN_LINE_LIMIT);
        self
    }

    /// The error for line `self.line + 1`, which is longer than the limit (`bom`: it is line 1
    /// and starts with a byte-order mark). The line's bytes kept so far are dropped, and the
    /// next call skips the rest of it.
    #[cold]
    fn too_long(&mut self, bom: bool) -> ParseError {
        self.line += 1;
        self.buf.clear();
        self.skipping = true;
        self.fast = false;
        line_too_long(self.limit, bom).at_line(&*self.file, self.line)
    }

    /// The next op and where its fields are, or `None` at the end of the trace.
    ///
    /// Blank and comment lines are skipped. The op's index is `ops_read() - 1` after the call. A
    /// read error is reported as a [`ParseError`] at column 1 of the line being read.
    #[inline(always)]
    pub fn next_op(&mut self) -> Result<Option<(TraceOp, &Spans)>, ParseError> {
        loop {
            let available = match self.reader.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let message = format!("cannot read: {e}");
                    return Err(ParseError::at(
                        &*self.file,
                        (self.line + 1, 1),
                        message,
                        None,
                    ));
                }
            };
            if self.fast && self.buf.is_empty() {
                // The common case: a canonical line, read where it is in the reader's buffer.
                // (Line 1 takes the general path, which removes a byte-order mark.) A line
                // longer than the limit has no `\n` in the window, and goes the general way.
                let window = available.get(..=self.limit).unwrap_or(available);
                if let Some((op, len)) = Scanner::canonical_in_place(window, &mut self.spans) {
                    self.reader.consume(len);
                    self.line += 1;
                    self.ops += 1;
                    self.spans.line = self.line;
                    return Ok(Some((op, &self.spans)));
                }
            }
            if self.skipping {
                // The rest of an over-long line, up to and with its `\n`, dropped unread.
                let (n, end) = match line_end(available) {
                    Some(end) => (end + 1, true),
                    None => (available.len(), available.is_empty()),
                };
                self.reader.consume(n);
                if end {
                    self.skipping = false;
                    self.fast = true;
                }
                continue;
            }
            let parsed = if available.is_empty() {
                // The end: a last line without a newline, or nothing.
                if self.buf.is_empty() {
                    return Ok(None);
                }
                self.line += 1;
                let parsed = parse_raw(&self.buf, self.line, &mut self.spans);
                self.buf.clear();
                parsed
            } else if let Some(end) = line_end(available) {
                if self.buf.len() + end > self.limit {
                    let bom = self.line == 0 && starts_with_bom(&self.buf, &available[..end]);
                    let e = self.too_long(bom);
                    self.reader.consume(end + 1);
                    self.skipping = false;
                    self.fast = true;
                    return Err(e);
                }
                self.line += 1;
                let parsed = if self.buf.is_empty() {
                    // The whole line is in the reader's buffer.
                    parse_raw(&available[..end], self.line, &mut self.spans)
                } else {
                    self.buf.extend_from_slice(&available[..end]);
                    let parsed = parse_raw(&self.buf, self.line, &mut self.spans);
                    self.buf.clear();
                    parsed
                };
                self.reader.consume(end + 1);
                parsed
            } else {
                // Part of a line: keep it and read on, up to the limit.
                let n = available.len();
                if self.buf.len() + n > self.limit {
                    let bom = self.line == 0 && starts_with_bom(&self.buf, available);
                    let e = self.too_long(bom);
                    self.reader.consume(n);
                    return Err(e);
                }
                self.buf.extend_from_slice(available);
                self.reader.consume(n);
                continue;
            };
            self.fast = true;
            match parsed {
                Ok(Some(op)) => {
                    self.ops += 1;
                    self.spans.line = self.line;
                    return Ok(Some((op, &self.spans)));
                }
                Ok(None) => {}
                Err(e) => return Err(e.at_line(&*self.file, self.line)),
            }
        }
    }

    /// How many ops have been read so far.
    pub fn ops_read(&self) -> u64 {
        self.ops
    }

    /// The 1-based number of the last line read (0 before the first).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// The file name that errors carry.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The underlying reader.
    pub fn into_inner(self) -> R {
        self.reader
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<(TraceOp, Spans), ParseError>;

    /// The next op with a copy of its spans (use [`TraceReader::next_op`] to avoid the copy).
    fn next(&mut self) -> Option<Self::Item> {
        self.next_op()
            .map(|o| o.map(|(op, spans)| (op, spans.clone())))
            .transpose()
    }
}

// ---------------------------------------------------------------------------------------------
// Keys and op names as the scanner finds them (the fields of each op are in `super::schema`).

/// The key whose name is `name` in its [`short`] form.
fn key_from_name(name: u64) -> Option<Key> {
    const OP: u64 = short(b"op");
    const STREAM: u64 = short(b"stream");
    const EVENT: u64 = short(b"event");
    const BUFFER: u64 = short(b"buffer");
    const BYTES: u64 = short(b"bytes");
    const ADDR: u64 = short(b"addr");
    const MEMORY: u64 = short(b"memory");
    const DEVICE: u64 = short(b"device");
    const BLOCKING: u64 = short(b"blocking");
    const COMPLETE: u64 = short(b"complete");
    const NAME: u64 = short(b"name");
    const READS: u64 = short(b"reads");
    const WRITES: u64 = short(b"writes");
    const SRC: u64 = short(b"src");
    const DST: u64 = short(b"dst");
    const SITE: u64 = short(b"site");
    Some(match name {
        OP => Key::Op,
        STREAM => Key::Stream,
        EVENT => Key::Event,
        BUFFER => Key::Buffer,
        BYTES => Key::Bytes,
        ADDR => Key::Addr,
        MEMORY => Key::Memory,
        DEVICE => Key::Device,
        BLOCKING => Key::Blocking,
        COMPLETE => Key::Complete,
        NAME => Key::Name,
        READS => Key::Reads,
        WRITES => Key::Writes,
        SRC => Key::Src,
        DST => Key::Dst,
        SITE => Key::Site,
        _ => return None,
    })
}

/// The index in [`Spans`] of the column of `key`'s value, if it keeps one.
#[inline(always)]
fn key_slot(key: Key) -> Option<usize> {
    key.field().and_then(slot)
}

/// The op whose name is `word` in its [`pack`]ed form.
fn kind_from_word(word: u128) -> Option<Kind> {
    const STREAM_CREATE: u128 = pack(b"stream_create");
    const ALLOC: u128 = pack(b"alloc");
    const FREE: u128 = pack(b"free");
    const RECORD_STREAM: u128 = pack(b"record_stream");
    const LAUNCH: u128 = pack(b"launch");
    const COPY: u128 = pack(b"copy");
    const MEMSET: u128 = pack(b"memset");
    const HOST_READ: u128 = pack(b"host_read");
    const HOST_WRITE: u128 = pack(b"host_write");
    const EVENT_CREATE: u128 = pack(b"event_create");
    const EVENT_DESTROY: u128 = pack(b"event_destroy");
    const EVENT_RECORD: u128 = pack(b"event_record");
    const EVENT_WAIT: u128 = pack(b"event_wait");
    const EVENT_SYNC: u128 = pack(b"event_sync");
    const EVENT_QUERY: u128 = pack(b"event_query");
    const STREAM_SYNC: u128 = pack(b"stream_sync");
    const STREAM_QUERY: u128 = pack(b"stream_query");
    const DEVICE_SYNC: u128 = pack(b"device_sync");
    Some(match word {
        STREAM_CREATE => Kind::StreamCreate,
        ALLOC => Kind::Alloc,
        FREE => Kind::Free,
        RECORD_STREAM => Kind::RecordStream,
        LAUNCH => Kind::Launch,
        COPY => Kind::Copy,
        MEMSET => Kind::Memset,
        HOST_READ => Kind::HostRead,
        HOST_WRITE => Kind::HostWrite,
        EVENT_CREATE => Kind::EventCreate,
        EVENT_DESTROY => Kind::EventDestroy,
        EVENT_RECORD => Kind::EventRecord,
        EVENT_WAIT => Kind::EventWait,
        EVENT_SYNC => Kind::EventSync,
        EVENT_QUERY => Kind::EventQuery,
        STREAM_SYNC => Kind::StreamSync,
        STREAM_QUERY => Kind::StreamQuery,
        DEVICE_SYNC => Kind::DeviceSync,
        _ => return None,
    })
}

/// The message of a missing required field `key` of op `kind`, at the object's position `obj`.
#[cold]
fn missing(kind: Kind, key: Key, obj: usize) -> Bad {
    let message = format!(
        "missing field \"{}\" for op \"{}\"",
        key.name(),
        kind.name()
    );
    let expected = kind.field(key).map_or("a value", |f| f.ty.describe());
    bad(obj, message, Some(expected))
}

/// A key of a region object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RegionKey {
    Buffer,
    Offset,
    Bytes,
}

impl RegionKey {
    fn name(self) -> &'static str {
        match self {
            RegionKey::Buffer => "buffer",
            RegionKey::Offset => "offset",
            RegionKey::Bytes => "bytes",
        }
    }
}

/// Where a value is, for messages: `stream`, `reads[1]`, `reads[1].offset`, `site[0]`.
#[derive(Clone, Copy, Debug)]
struct Path {
    key: Key,
    index: Option<u32>,
    sub: Option<RegionKey>,
}

impl Path {
    fn key(key: Key) -> Self {
        Path {
            key,
            index: None,
            sub: None,
        }
    }

    fn at(self, index: usize) -> Self {
        Path {
            index: Some(index as u32),
            ..self
        }
    }

    fn sub(self, sub: RegionKey) -> Self {
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

/// The values of an op object, as found.
#[derive(Default)]
struct Fields {
    stream: Option<Id>,
    event: Option<Id>,
    buffer: Option<Id>,
    region: Option<Region>,
    bytes: Option<u64>,
    addr: Option<u64>,
    addr_pos: usize,
    memory: Option<MemoryKind>,
    device: Option<u64>,
    blocking: Option<bool>,
    complete: Option<bool>,
    name: Option<String>,
    reads: Vec<Region>,
    writes: Vec<Region>,
    src: Option<Region>,
    dst: Option<Region>,
    site: Option<Site>,
}

// ---------------------------------------------------------------------------------------------
// The scanner.

/// A located error while scanning; boxed so that results stay small on the fast path.
type Bad = Box<LineError>;
type Scan<T> = Result<T, Bad>;

/// The bytes that end the plain part of a JSON string: the quote, the backslash, control characters.
static SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        table[c] = true;
        c += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// The high bit of each byte of `w` (little-endian) that is a quote, a backslash or a control
/// character. Above the first such byte the bits may be wrong; the lowest one is always right.
#[inline(always)]
fn special_bytes(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let quote = w ^ (ONES * b'"' as u64);
    let backslash = w ^ (ONES * b'\\' as u64);
    let zero_quote = quote.wrapping_sub(ONES) & !quote;
    let zero_backslash = backslash.wrapping_sub(ONES) & !backslash;
    let control = w.wrapping_sub(ONES * 0x20) & !w;
    (zero_quote | zero_backslash | control) & HIGH
}

/// Up to 8 bytes as one integer, little-endian, to compare short names fast.
const fn short(bytes: &[u8]) -> u64 {
    let mut word = 0;
    let mut i = 0;
    while i < bytes.len() && i < 8 {
        word |= (bytes[i] as u64) << (8 * i);
        i += 1;
    }
    word
}

/// Up to 15 bytes and their length as one integer, to compare names fast; 0 for longer texts.
const fn pack(bytes: &[u8]) -> u128 {
    if bytes.len() >= 16 {
        return 0;
    }
    let mut word = (bytes.len() as u128) << 120;
    let mut i = 0;
    while i < bytes.len() {
        word |= (bytes[i] as u128) << (8 * i);
        i += 1;
    }
    word
}

/// A one-pass scanner of one line. Positions are byte offsets; columns are positions + 1.
struct Scanner<'a> {
    b: &'a [u8],
    pos: usize,
}

#[cold]
fn bad(pos: usize, message: String, expected: Option<&str>) -> Bad {
    Box::new(LineError {
        column: pos as u64 + 1,
        message,
        expected: expected.map(str::to_owned),
    })
}

/// What a value starting with `b` is, for "wrong type" messages.
fn found(b: Option<u8>) -> &'static str {
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

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl<'a> Scanner<'a> {
    /// The bytes from `at` on (none past the end).
    fn rest_at(&self, at: usize) -> &'a [u8] {
        self.b.get(at..).unwrap_or_default()
    }

    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    #[inline(always)]
    fn ws(&mut self) {
        if matches!(self.b.get(self.pos), Some(&b) if b <= b' ') {
            self.skip_ws();
        }
    }

    fn skip_ws(&mut self) {
        while let Some(&b) = self.b.get(self.pos) {
            if !is_ws(b) {
                break;
            }
            self.pos += 1;
        }
    }

    #[inline(always)]
    fn peek_ws(&mut self) -> Option<u8> {
        match self.b.get(self.pos) {
            Some(&c) if c > b' ' => Some(c),
            _ => {
                self.skip_ws();
                self.peek()
            }
        }
    }

    #[cold]
    fn syntax(&self) -> Bad {
        bad(self.pos, "invalid JSON".to_owned(), None)
    }

    /// Skips whitespace and `c`.
    #[inline(always)]
    fn eat(&mut self, c: u8) -> Scan<()> {
        if self.b.get(self.pos) == Some(&c) {
            self.pos += 1;
            return Ok(());
        }
        if self.peek_ws() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.syntax())
        }
    }

    /// The text of bytes `from..to` (UTF-8 in the lines that the general scanner reads).
    #[inline(always)]
    fn slice(&self, from: usize, to: usize) -> Scan<&'a str> {
        match self.b.get(from..to).map(std::str::from_utf8) {
            Some(Ok(s)) => Ok(s),
            _ => Err(bad(from, "invalid JSON".to_owned(), None)),
        }
    }

    #[cold]
    fn wrong_type(&self, path: Path, expected: &str) -> Bad {
        let what = found(self.peek());
        bad(
            self.pos,
            format!("field \"{path}\" is {what}"),
            Some(expected),
        )
    }

    /// The content of a string with no escapes at the current position (its opening quote), as
    /// positions; the position moves past the closing quote. `None` (the position unchanged) when
    /// the string has an escape or is not valid JSON.
    #[inline(always)]
    fn plain_string(&mut self) -> Option<(usize, usize)> {
        let from = self.pos + 1;
        // Most strings of a trace end within eight bytes.
        if let Some(chunk) = self.b.get(from..).and_then(|rest| rest.first_chunk::<8>()) {
            let w = u64::from_le_bytes(*chunk);
            let special = special_bytes(w);
            if special != 0 {
                let n = special.trailing_zeros() / 8;
                if (w >> (8 * n)) as u8 == b'"' {
                    let to = from + n as usize;
                    self.pos = to + 1;
                    return Some((from, to));
                }
                return None;
            }
        }
        self.long_plain_string(from)
    }

    /// [`Scanner::plain_string`] past its first eight bytes.
    fn long_plain_string(&mut self, from: usize) -> Option<(usize, usize)> {
        let mut i = from;
        while let Some(chunk) = self.b.get(i..).and_then(|rest| rest.first_chunk::<8>()) {
            let special = special_bytes(u64::from_le_bytes(*chunk));
            if special != 0 {
                i += (special.trailing_zeros() / 8) as usize;
                return self.close_string(from, i);
            }
            i += 8;
        }
        while let Some(&c) = self.b.get(i) {
            if SPECIAL[usize::from(c)] {
                return self.close_string(from, i);
            }
            i += 1;
        }
        None
    }

    /// Ends a plain string whose first special byte is at `at`.
    #[inline]
    fn close_string(&mut self, from: usize, at: usize) -> Option<(usize, usize)> {
        if self.b.get(at) == Some(&b'"') {
            self.pos = at + 1;
            Some((from, at))
        } else {
            None
        }
    }

    /// A string at the current position (which holds its opening quote).
    #[inline(always)]
    fn string(&mut self) -> Scan<Cow<'a, str>> {
        match self.plain_string() {
            Some((from, to)) => self.slice(from, to).map(Cow::Borrowed),
            None => self.escaped_string(),
        }
    }

    /// A string whose text is only compared with names of at most 8 bytes: its [`short`] form
    /// (`u64::MAX` for other texts).
    #[inline(always)]
    fn name(&mut self) -> Scan<u64> {
        let from = self.pos + 1;
        // Most names are at most seven bytes: then the closing quote is in the first eight.
        if let Some(chunk) = self.b.get(from..).and_then(|rest| rest.first_chunk::<8>()) {
            let w = u64::from_le_bytes(*chunk);
            let special = special_bytes(w);
            if special != 0 {
                let n = special.trailing_zeros() / 8;
                if (w >> (8 * n)) as u8 == b'"' {
                    self.pos = from + n as usize + 1;
                    return Ok(w & ((1u64 << (8 * n)) - 1));
                }
            }
        }
        self.long_name()
    }

    /// [`Scanner::name`] of a longer string, or of one with escapes.
    fn long_name(&mut self) -> Scan<u64> {
        let short_name = |bytes: &[u8]| match bytes.len() <= 8 && !bytes.contains(&0) {
            true => short(bytes),
            false => u64::MAX,
        };
        match self.plain_string() {
            Some((from, to)) => Ok(short_name(self.b.get(from..to).unwrap_or_default())),
            None => Ok(short_name(self.escaped_string()?.as_bytes())),
        }
    }

    /// A string whose text is only compared with names: its [`pack`]ed word (0 when too long).
    fn word(&mut self) -> Scan<u128> {
        match self.plain_string() {
            Some((from, to)) => Ok(self.pack_at(from, to)),
            None => Ok(pack(self.escaped_string()?.as_bytes())),
        }
    }

    /// [`pack`] of the bytes `from..to` of the line.
    #[inline]
    fn pack_at(&self, from: usize, to: usize) -> u128 {
        let len = to - from;
        if len >= 16 {
            return 0;
        }
        match self.b.get(from..).and_then(|rest| rest.first_chunk::<16>()) {
            Some(chunk) => {
                let word = u128::from_le_bytes(*chunk) & ((1u128 << (8 * len)) - 1);
                word | (len as u128) << 120
            }
            None => pack(self.b.get(from..to).unwrap_or_default()),
        }
    }

    /// A string with escapes (or not valid JSON), decoded by serde_json.
    #[cold]
    fn escaped_string(&mut self) -> Scan<Cow<'a, str>> {
        let start = self.pos;
        let mut i = start + 1;
        loop {
            match self.b.get(i) {
                Some(b'"') => break,
                Some(b'\\') => i += 2,
                Some(&c) if c >= 0x20 => i += 1,
                _ => {
                    self.pos = i.min(self.b.len());
                    return Err(self.syntax());
                }
            }
        }
        let raw = self.slice(start, i + 1)?;
        match serde_json::from_str::<String>(raw) {
            Ok(s) => {
                self.pos = i + 1;
                Ok(Cow::Owned(s))
            }
            Err(e) => Err(Box::new(from_serde(&e, start, "invalid string"))),
        }
    }

    /// The text of the string at `at`, for messages: cut to [`ECHO_CHARS`] characters.
    #[cold]
    fn text_at(&self, at: usize) -> String {
        let mut p = Scanner { b: self.b, pos: at };
        let text = p.string().unwrap_or_default();
        clip(&text, ECHO_CHARS).into_owned()
    }

    /// The raw text of the number at `start`, for messages.
    fn number_text(&self, start: usize) -> &'a str {
        let len = self
            .rest_at(start)
            .iter()
            .take_while(|&&c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
            .count();
        self.slice(start, start + len).unwrap_or("")
    }

    /// An integer from 0 to 2^64 − 1 at the current position (a digit or `-`).
    #[inline(always)]
    fn integer(&mut self, path: Path, expected: &str) -> Scan<u64> {
        let start = self.pos;
        let mut i = start;
        let mut n: u64 = 0;
        while let Some(&c) = self.b.get(i) {
            let digit = c.wrapping_sub(b'0');
            if digit > 9 || i - start >= 19 {
                break;
            }
            n = n * 10 + u64::from(digit);
            i += 1;
        }
        let leading_zero = i > start + 1 && self.b.get(start) == Some(&b'0');
        match self.b.get(i) {
            Some(b'0'..=b'9' | b'.' | b'e' | b'E') => {}
            _ if i == start || leading_zero => {}
            _ => {
                self.pos = i;
                return Ok(n);
            }
        }
        self.long_integer(path, expected, n, i)
    }

    /// The rest of [`Scanner::integer`]: a twentieth digit, or bad input.
    #[cold]
    fn long_integer(&mut self, path: Path, expected: &str, n: u64, mut i: usize) -> Scan<u64> {
        let start = self.pos;
        let mut n = Some(n);
        while let Some(&c) = self.b.get(i) {
            if !c.is_ascii_digit() {
                break;
            }
            n = n.and_then(|n| n.checked_mul(10)?.checked_add(u64::from(c - b'0')));
            i += 1;
        }
        let problem = match self.b.get(i) {
            _ if i == start && self.b.get(start) == Some(&b'-') => "is negative",
            _ if i == start => return Err(self.wrong_type(path, expected)),
            _ if i > start + 1 && self.b.get(start) == Some(&b'0') => {
                self.pos = start + 1;
                return Err(self.syntax());
            }
            Some(b'.') => "has a fraction",
            Some(b'e' | b'E') => "has an exponent",
            _ => match n {
                None => "is too large",
                Some(n) => {
                    self.pos = i;
                    return Ok(n);
                }
            },
        };
        let text = clip(self.number_text(start), ECHO_CHARS);
        Err(bad(
            start,
            format!("field \"{path}\" {problem} ({text})"),
            Some(expected),
        ))
    }

    fn u64_value(&mut self, path: Path) -> Scan<u64> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.integer(path, INTEGER),
            _ => Err(self.wrong_type(path, INTEGER)),
        }
    }

    fn bool_value(&mut self, path: Path) -> Scan<bool> {
        let rest = self.rest_at(self.pos);
        if rest.starts_with(b"true") {
            self.pos += 4;
            Ok(true)
        } else if rest.starts_with(b"false") {
            self.pos += 5;
            Ok(false)
        } else {
            Err(self.wrong_type(path, "true or false"))
        }
    }

    fn string_value(&mut self, path: Path, expected: &str) -> Scan<String> {
        match self.peek() {
            Some(b'"') => Ok(self.string()?.into_owned()),
            _ => Err(self.wrong_type(path, expected)),
        }
    }

    /// An id: a string, or an integer kept as its decimal text.
    #[inline(always)]
    fn id(&mut self, path: Path) -> Scan<Id> {
        match self.peek() {
            Some(b'"') => Ok(Id::from(self.string()?.into_owned())),
            Some(b'-' | b'0'..=b'9') => {
                let start = self.pos;
                self.integer(path, ID)?;
                Ok(Id::from(self.slice(start, self.pos)?.to_owned()))
            }
            _ => Err(self.wrong_type(path, ID)),
        }
    }

    /// A stream id, which must not be `"host"`.
    fn stream_id(&mut self, path: Path) -> Scan<Id> {
        let start = self.pos;
        let id = self.id(path)?;
        if id.as_str() == HOST {
            return Err(bad(
                start,
                format!("field \"{path}\" is \"host\", the reserved name of the CPU thread"),
                Some("a stream id other than \"host\""),
            ));
        }
        Ok(id)
    }

    fn memory(&mut self, path: Path) -> Scan<MemoryKind> {
        const EXPECTED: &str = "one of device, pinned, managed";
        let start = self.pos;
        let s = self.string_value(path, EXPECTED)?;
        match s.as_str() {
            "device" => Ok(MemoryKind::Device),
            "pinned" => Ok(MemoryKind::Pinned),
            "managed" => Ok(MemoryKind::Managed),
            other => Err(bad(
                start,
                format!("field \"{path}\" is {:?}", clip(other, ECHO_CHARS)),
                Some(EXPECTED),
            )),
        }
    }

    /// A region: an id, or `{"buffer": B, "offset": O, "bytes": N}`.
    fn region(&mut self, path: Path) -> Scan<Region> {
        match self.peek() {
            Some(b'{') => self.region_object(path),
            Some(b'"' | b'-' | b'0'..=b'9') => Ok(Region::whole(self.id(path)?)),
            _ => Err(self.wrong_type(path, REGION)),
        }
    }

    fn region_object(&mut self, path: Path) -> Scan<Region> {
        let start = self.pos;
        self.pos += 1;
        let (mut buffer, mut offset, mut bytes) = (None, None, None);
        if self.peek_ws() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                if self.peek_ws() != Some(b'"') {
                    return Err(self.syntax());
                }
                let key_pos = self.pos;
                const BUFFER: u64 = short(b"buffer");
                const OFFSET: u64 = short(b"offset");
                const BYTES: u64 = short(b"bytes");
                let key = match self.name()? {
                    BUFFER => RegionKey::Buffer,
                    OFFSET => RegionKey::Offset,
                    BYTES => RegionKey::Bytes,
                    _ => {
                        let text = self.text_at(key_pos);
                        return Err(bad(
                            key_pos,
                            format!("unknown field {text:?} in region \"{path}\""),
                            Some("one of buffer, offset, bytes"),
                        ));
                    }
                };
                let present = match key {
                    RegionKey::Buffer => buffer.is_some(),
                    RegionKey::Offset => offset.is_some(),
                    RegionKey::Bytes => bytes.is_some(),
                };
                if present {
                    let message =
                        format!("duplicate field \"{}\" in region \"{path}\"", key.name());
                    return Err(bad(key_pos, message, Some("each field at most once")));
                }
                self.eat(b':')?;
                self.ws();
                match key {
                    RegionKey::Buffer => buffer = Some(self.id(path.sub(key))?),
                    RegionKey::Offset => offset = Some(self.u64_value(path.sub(key))?),
                    RegionKey::Bytes => bytes = Some(self.u64_value(path.sub(key))?),
                }
                match self.peek_ws() {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(self.syntax()),
                }
            }
        }
        let Some(buffer) = buffer else {
            let message = format!("missing field \"buffer\" in region \"{path}\"");
            return Err(bad(start, message, Some("a buffer id")));
        };
        let offset = offset.unwrap_or(0);
        if let Some(n) = bytes {
            if offset.checked_add(n).is_none() {
                let message =
                    format!("region \"{path}\" ends past 2^64 - 1 (offset {offset} + bytes {n})");
                return Err(bad(
                    start,
                    message,
                    Some("offset + bytes at most 18446744073709551615"),
                ));
            }
        }
        Ok(Region {
            buffer,
            offset,
            bytes,
        })
    }

    /// A list of regions, recording the column of each entry.
    fn regions(&mut self, key: Key, columns: &mut Vec<u64>) -> Scan<Vec<Region>> {
        let path = Path::key(key);
        if self.peek() != Some(b'[') {
            return Err(self.wrong_type(path, "an array of regions"));
        }
        self.pos += 1;
        if self.peek_ws() == Some(b']') {
            self.pos += 1;
            return Ok(Vec::new());
        }
        let mut regions = Vec::with_capacity(4);
        loop {
            self.ws();
            columns.push(self.pos as u64 + 1);
            regions.push(self.region(path.at(regions.len()))?);
            match self.peek_ws() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(regions);
                }
                _ => return Err(self.syntax()),
            }
        }
    }

    /// A site: a string, or an array of strings.
    fn site(&mut self) -> Scan<Site> {
        let path = Path::key(Key::Site);
        match self.peek() {
            Some(b'"') => Ok(Site::Label(self.string()?.into_owned())),
            Some(b'[') => {
                self.pos += 1;
                let mut frames = Vec::new();
                if self.peek_ws() == Some(b']') {
                    self.pos += 1;
                    return Ok(Site::Stack(frames));
                }
                loop {
                    self.ws();
                    frames.push(self.string_value(path.at(frames.len()), "a string")?);
                    match self.peek_ws() {
                        Some(b',') => self.pos += 1,
                        Some(b']') => {
                            self.pos += 1;
                            return Ok(Site::Stack(frames));
                        }
                        _ => return Err(self.syntax()),
                    }
                }
            }
            _ => Err(self.wrong_type(path, "a string or an array of strings")),
        }
    }

    /// The op name at the current position.
    fn op_name(&mut self) -> Scan<Kind> {
        let start = self.pos;
        if self.peek() != Some(b'"') {
            let what = found(self.peek());
            let message = format!("field \"op\" is {what}");
            return Err(bad(start, message, Some(&op_names())));
        }
        match kind_from_word(self.word()?) {
            Some(kind) => Ok(kind),
            None => {
                let message = format!("unknown op {:?}", self.text_at(start));
                Err(bad(start, message, Some(&op_names())))
            }
        }
    }

    /// The op object that starts at the current (non-blank) position, up to the end of the line.
    fn op_line(&mut self, spans: &mut Spans) -> Scan<TraceOp> {
        let obj = self.pos;
        if self.peek() != Some(b'{') {
            let what = found(self.peek());
            return Err(bad(
                obj,
                format!("the line is {what}"),
                Some("a JSON object"),
            ));
        }
        spans.columns[0] = obj as u64 + 1;
        self.pos += 1;
        self.ws();

        // The op first: from the first key, or from a search when it is not first.
        let mut seen = 0u16;
        let kind = if self.rest_at(self.pos).starts_with(b"\"op\"") {
            self.pos += 4;
            self.eat(b':')?;
            self.ws();
            seen |= Key::Op.bit();
            self.op_name()?
        } else {
            let Some(at) = find_op(self.slice(0, self.b.len())?)? else {
                let message = "missing field \"op\"".to_owned();
                return Err(bad(obj, message, Some(&op_names())));
            };
            let resume = self.pos;
            self.pos = at;
            let kind = self.op_name()?;
            self.pos = resume;
            kind
        };

        let allowed = kind.allowed();
        let mut f = Fields::default();
        let mut after_value = seen != 0;
        loop {
            if after_value {
                match self.peek_ws() {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(self.syntax()),
                }
            }
            after_value = true;
            if self.peek_ws() != Some(b'"') {
                return Err(self.syntax());
            }
            let key_pos = self.pos;
            let key = match key_from_name(self.name()?) {
                Some(key) if allowed & key.bit() != 0 => key,
                _ => {
                    let text = self.text_at(key_pos);
                    let message = format!("unknown field {text:?} for op \"{}\"", kind.name());
                    return Err(bad(key_pos, message, Some(&kind.expected_keys())));
                }
            };
            if seen & key.bit() != 0 {
                let message = format!("duplicate field \"{}\"", key.name());
                return Err(bad(key_pos, message, Some("each field at most once")));
            }
            seen |= key.bit();
            self.eat(b':')?;
            self.ws();
            let at = self.pos;
            if let Some(s) = key_slot(key) {
                spans.columns[s] = at as u64 + 1;
            }
            let path = Path::key(key);
            match key {
                // The first "op" of a line whose op is not its first key: already read.
                Key::Op => {
                    self.string()?;
                }
                Key::Stream => f.stream = Some(self.stream_id(path)?),
                Key::Event => f.event = Some(self.id(path)?),
                Key::Buffer if kind.field(key).is_some_and(|f| f.ty == Type::Region) => {
                    f.region = Some(self.region(path)?);
                }
                Key::Buffer => f.buffer = Some(self.id(path)?),
                Key::Bytes => f.bytes = Some(self.u64_value(path)?),
                Key::Addr => {
                    f.addr_pos = at;
                    f.addr = Some(self.u64_value(path)?);
                }
                Key::Memory => f.memory = Some(self.memory(path)?),
                Key::Device => f.device = Some(self.u64_value(path)?),
                Key::Blocking => f.blocking = Some(self.bool_value(path)?),
                Key::Complete => f.complete = Some(self.bool_value(path)?),
                Key::Name => f.name = Some(self.string_value(path, "a string")?),
                Key::Reads => f.reads = self.regions(key, &mut spans.reads)?,
                Key::Writes => f.writes = self.regions(key, &mut spans.writes)?,
                Key::Src => f.src = Some(self.region(path)?),
                Key::Dst => f.dst = Some(self.region(path)?),
                Key::Site => f.site = Some(self.site()?),
            }
        }
        if self.peek_ws().is_some() {
            return Err(self.syntax());
        }
        if let Some(field) = kind.first_missing(seen) {
            return Err(missing(kind, field.key, obj));
        }
        build(kind, &mut f, obj)
    }
}

// ---------------------------------------------------------------------------------------------
// The fast path: lines as `write_op` writes them.

/// `bytes` as text, if they are UTF-8; `ascii` says that they are all below 0x80.
#[inline(always)]
fn text(bytes: &[u8], ascii: bool) -> Option<&str> {
    if ascii {
        debug_assert!(bytes.is_ascii());
        // SAFETY: every byte is below 0x80, and ASCII text is valid UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes).ok()
    }
}

/// `,"key":` for each key, as [`Scanner::canonical_line`] expects it.
const KEY_LITERALS: [&[u8]; 16] = [
    b",\"op\":",
    b",\"stream\":",
    b",\"event\":",
    b",\"buffer\":",
    b",\"bytes\":",
    b",\"addr\":",
    b",\"memory\":",
    b",\"device\":",
    b",\"blocking\":",
    b",\"complete\":",
    b",\"name\":",
    b",\"reads\":",
    b",\"writes\":",
    b",\"src\":",
    b",\"dst\":",
    b",\"site\":",
];

/// The canonical form: `{"op":"NAME"` and then some of the op's fields, each as `,"key":value`
/// with no whitespace, in the order the format lists them, with values of the right type and no
/// escapes in strings (`site` last), then `}` and nothing but whitespace.
///
/// These functions return `None` as soon as the line is not in that form, whatever the reason:
/// the general scanner then reads the line again and reports the error if there is one. For a
/// line in the form, they give the same op and spans as the general scanner.
impl<'a> Scanner<'a> {
    fn canonical_line(&mut self, spans: &mut Spans) -> Option<TraceOp> {
        let obj = self.pos;
        if !self.literal(b"{\"op\":\"") {
            return None;
        }
        spans.columns[0] = obj as u64 + 1;
        self.pos -= 1;
        let kind = kind_from_word(self.word().ok()?)?;
        let op = match kind {
            Kind::StreamCreate => Op::StreamCreate {
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
                device: self.field(Key::Device, spans, Self::fast_u64)?.unwrap_or(0),
                blocking: self
                    .field(Key::Blocking, spans, Self::fast_bool)?
                    .unwrap_or(false),
            },
            Kind::Alloc => {
                let buffer = self.field(Key::Buffer, spans, Self::fast_id)??;
                let bytes = self.field(Key::Bytes, spans, Self::fast_u64)??;
                let stream = self.field(Key::Stream, spans, Self::fast_stream)?;
                let memory = self
                    .field(Key::Memory, spans, Self::fast_memory)?
                    .unwrap_or_default();
                let addr = self.field(Key::Addr, spans, Self::fast_u64)?;
                if let Some(addr) = addr {
                    addr.checked_add(bytes)?;
                }
                Op::Alloc {
                    buffer,
                    bytes,
                    stream,
                    memory,
                    addr,
                }
            }
            Kind::Free => Op::Free {
                buffer: self.field(Key::Buffer, spans, Self::fast_id)??,
                stream: self.field(Key::Stream, spans, Self::fast_stream)?,
            },
            Kind::RecordStream => Op::RecordStream {
                buffer: self.field(Key::Buffer, spans, Self::fast_id)??,
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
            },
            Kind::Launch => Op::Launch {
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
                name: self.field(Key::Name, spans, |s: &mut Self| {
                    s.fast_str().map(smol_str::SmolStr::new)
                })?,
                reads: match self.literal(KEY_LITERALS[Key::Reads as usize]) {
                    true => self.fast_regions(&mut spans.reads)?,
                    false => Vec::new(),
                },
                writes: match self.literal(KEY_LITERALS[Key::Writes as usize]) {
                    true => self.fast_regions(&mut spans.writes)?,
                    false => Vec::new(),
                },
            },
            Kind::Copy => Op::Copy {
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
                src: self.field(Key::Src, spans, Self::fast_region)??,
                dst: self.field(Key::Dst, spans, Self::fast_region)??,
            },
            Kind::Memset => Op::Memset {
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
                dst: self.field(Key::Dst, spans, Self::fast_region)??,
            },
            Kind::HostRead => Op::HostRead {
                buffer: self.field(Key::Buffer, spans, Self::fast_region)??,
            },
            Kind::HostWrite => Op::HostWrite {
                buffer: self.field(Key::Buffer, spans, Self::fast_region)??,
            },
            Kind::EventCreate => Op::EventCreate {
                event: self.field(Key::Event, spans, Self::fast_id)??,
            },
            Kind::EventDestroy => Op::EventDestroy {
                event: self.field(Key::Event, spans, Self::fast_id)??,
            },
            Kind::EventRecord => Op::EventRecord {
                event: self.field(Key::Event, spans, Self::fast_id)??,
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
            },
            Kind::EventWait => Op::EventWait {
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
                event: self.field(Key::Event, spans, Self::fast_id)??,
            },
            Kind::EventSync => Op::EventSync {
                event: self.field(Key::Event, spans, Self::fast_id)??,
            },
            Kind::EventQuery => Op::EventQuery {
                event: self.field(Key::Event, spans, Self::fast_id)??,
                complete: self.field(Key::Complete, spans, Self::fast_bool)??,
            },
            Kind::StreamSync => Op::StreamSync {
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
            },
            Kind::StreamQuery => Op::StreamQuery {
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
                complete: self.field(Key::Complete, spans, Self::fast_bool)??,
            },
            Kind::DeviceSync => Op::DeviceSync {
                device: self.field(Key::Device, spans, Self::fast_u64)?.unwrap_or(0),
            },
        };
        let site = self.field(Key::Site, spans, Self::fast_site)?;
        match self.literal(b"}") {
            true => Some(TraceOp { op, site }),
            false => None,
        }
    }

    /// A canonical line at the start of `bytes`, which hold it and what follows it in the file:
    /// the op, and the length of the line with its `\n`.
    #[inline]
    fn canonical_in_place(bytes: &[u8], spans: &mut Spans) -> Option<(TraceOp, usize)> {
        let mut p = Scanner { b: bytes, pos: 0 };
        spans.clear();
        let op = p.canonical_line(spans)?;
        loop {
            match p.peek()? {
                b'\n' => return Some((op, p.pos + 1)),
                b' ' | b'\t' | b'\r' => p.pos += 1,
                _ => return None,
            }
        }
    }

    /// The bytes `literal` at the current position, then skipped.
    #[inline(always)]
    fn literal(&mut self, literal: &[u8]) -> bool {
        match self.b.get(self.pos..) {
            Some(rest) if rest.starts_with(literal) => {
                self.pos += literal.len();
                true
            }
            _ => false,
        }
    }

    /// `Some(None)` when the next key is not `key`; `Some(value)` when it is and its value is in
    /// the canonical form; `None` when it is not.
    #[inline(always)]
    fn field<T>(
        &mut self,
        key: Key,
        spans: &mut Spans,
        value: impl FnOnce(&mut Self) -> Option<T>,
    ) -> Option<Option<T>> {
        if !self.literal(KEY_LITERALS[key as usize]) {
            return Some(None);
        }
        if let Some(slot) = key_slot(key) {
            spans.columns[slot] = self.pos as u64 + 1;
        }
        value(self).map(Some)
    }

    /// A string with no escapes.
    #[inline(always)]
    fn fast_str(&mut self) -> Option<&'a str> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let from = self.pos + 1;
        let chunk = self.b.get(from..).and_then(|rest| rest.first_chunk::<8>());
        if let Some(chunk) = chunk {
            // Most strings of a trace end within eight bytes.
            let w = u64::from_le_bytes(*chunk);
            let special = special_bytes(w);
            if special != 0 {
                let n = special.trailing_zeros() / 8;
                if (w >> (8 * n)) as u8 != b'"' {
                    return None;
                }
                let to = from + n as usize;
                self.pos = to + 1;
                let ascii = w & ((1u64 << (8 * n)) - 1) & 0x8080_8080_8080_8080 == 0;
                return text(self.b.get(from..to)?, ascii);
            }
        }
        let (from, to) = self.plain_string()?;
        let bytes = self.b.get(from..to)?;
        text(bytes, bytes.is_ascii())
    }

    fn fast_string(&mut self) -> Option<String> {
        self.fast_str().map(str::to_owned)
    }

    /// An integer of at most 19 digits.
    #[inline(always)]
    fn fast_u64(&mut self) -> Option<u64> {
        let start = self.pos;
        let mut n: u64 = 0;
        while let Some(&c) = self.b.get(self.pos) {
            let digit = c.wrapping_sub(b'0');
            if digit > 9 {
                break;
            }
            n = n.wrapping_mul(10).wrapping_add(u64::from(digit));
            self.pos += 1;
        }
        let len = self.pos - start;
        let leading_zero = len > 1 && self.b.get(start) == Some(&b'0');
        match (1..=19).contains(&len) && !leading_zero {
            true => Some(n),
            false => None,
        }
    }

    #[inline(always)]
    fn fast_id(&mut self) -> Option<Id> {
        match self.peek()? {
            b'"' => self.fast_str().map(Id::from),
            b'0'..=b'9' => {
                let start = self.pos;
                self.fast_u64()?;
                let digits = self.b.get(start..self.pos)?;
                text(digits, true).map(|digits| Id::from(digits.to_owned()))
            }
            _ => None,
        }
    }

    fn fast_stream(&mut self) -> Option<Id> {
        self.fast_id().filter(|id| id.as_str() != HOST)
    }

    fn fast_bool(&mut self) -> Option<bool> {
        if self.literal(b"true") {
            Some(true)
        } else if self.literal(b"false") {
            Some(false)
        } else {
            None
        }
    }

    fn fast_memory(&mut self) -> Option<MemoryKind> {
        if self.literal(b"\"device\"") {
            Some(MemoryKind::Device)
        } else if self.literal(b"\"pinned\"") {
            Some(MemoryKind::Pinned)
        } else if self.literal(b"\"managed\"") {
            Some(MemoryKind::Managed)
        } else {
            None
        }
    }

    #[inline(always)]
    fn fast_region(&mut self) -> Option<Region> {
        if !self.literal(b"{\"buffer\":") {
            return self.fast_id().map(Region::whole);
        }
        let buffer = self.fast_id()?;
        let offset = match self.literal(b",\"offset\":") {
            true => self.fast_u64()?,
            false => 0,
        };
        let bytes = match self.literal(b",\"bytes\":") {
            true => Some(self.fast_u64()?),
            false => None,
        };
        if !self.literal(b"}") {
            return None;
        }
        if let Some(bytes) = bytes {
            offset.checked_add(bytes)?;
        }
        Some(Region {
            buffer,
            offset,
            bytes,
        })
    }

    fn fast_regions(&mut self, columns: &mut Vec<u64>) -> Option<Vec<Region>> {
        if !self.literal(b"[") {
            return None;
        }
        if self.literal(b"]") {
            return Some(Vec::new());
        }
        let mut regions = Vec::with_capacity(4);
        loop {
            columns.push(self.pos as u64 + 1);
            regions.push(self.fast_region()?);
            match self.peek()? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    return Some(regions);
                }
                _ => return None,
            }
        }
    }

    fn fast_site(&mut self) -> Option<Site> {
        if !self.literal(b"[") {
            return self.fast_string().map(Site::Label);
        }
        let mut frames = Vec::new();
        if self.literal(b"]") {
            return Some(Site::Stack(frames));
        }
        loop {
            frames.push(self.fast_string()?);
            match self.peek()? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    return Some(Site::Stack(frames));
                }
                _ => return None,
            }
        }
    }
}

/// `one of stream_create, alloc, …` with every op name.
fn op_names() -> String {
    format!("one of {}", Op::NAMES.join(", "))
}

/// The op of `kind` from its fields; `obj` is the position of the object, for missing fields
/// (which the caller has checked against the schema already).
fn build(kind: Kind, f: &mut Fields, obj: usize) -> Scan<TraceOp> {
    let missing = |key: Key| missing(kind, key, obj);
    let op = match kind {
        Kind::StreamCreate => Op::StreamCreate {
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
            device: f.device.unwrap_or(0),
            blocking: f.blocking.unwrap_or(false),
        },
        Kind::Alloc => {
            let buffer = f.buffer.take().ok_or_else(|| missing(Key::Buffer))?;
            let bytes = f.bytes.ok_or_else(|| missing(Key::Bytes))?;
            if let Some(addr) = f.addr {
                if addr.checked_add(bytes).is_none() {
                    let message = format!("alloc ends past 2^64 - 1 (addr {addr} + bytes {bytes})");
                    let expected = "addr + bytes at most 18446744073709551615";
                    return Err(bad(f.addr_pos, message, Some(expected)));
                }
            }
            Op::Alloc {
                buffer,
                bytes,
                stream: f.stream.take(),
                memory: f.memory.unwrap_or_default(),
                addr: f.addr,
            }
        }
        Kind::Free => Op::Free {
            buffer: f.buffer.take().ok_or_else(|| missing(Key::Buffer))?,
            stream: f.stream.take(),
        },
        Kind::RecordStream => Op::RecordStream {
            buffer: f.buffer.take().ok_or_else(|| missing(Key::Buffer))?,
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
        },
        Kind::Launch => Op::Launch {
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
            name: f.name.take().map(Into::into),
            reads: std::mem::take(&mut f.reads),
            writes: std::mem::take(&mut f.writes),
        },
        Kind::Copy => Op::Copy {
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
            src: f.src.take().ok_or_else(|| missing(Key::Src))?,
            dst: f.dst.take().ok_or_else(|| missing(Key::Dst))?,
        },
        Kind::Memset => Op::Memset {
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
            dst: f.dst.take().ok_or_else(|| missing(Key::Dst))?,
        },
        Kind::HostRead => Op::HostRead {
            buffer: f.region.take().ok_or_else(|| missing(Key::Buffer))?,
        },
        Kind::HostWrite => Op::HostWrite {
            buffer: f.region.take().ok_or_else(|| missing(Key::Buffer))?,
        },
        Kind::EventCreate => Op::EventCreate {
            event: f.event.take().ok_or_else(|| missing(Key::Event))?,
        },
        Kind::EventDestroy => Op::EventDestroy {
            event: f.event.take().ok_or_else(|| missing(Key::Event))?,
        },
        Kind::EventRecord => Op::EventRecord {
            event: f.event.take().ok_or_else(|| missing(Key::Event))?,
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
        },
        Kind::EventWait => Op::EventWait {
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
            event: f.event.take().ok_or_else(|| missing(Key::Event))?,
        },
        Kind::EventSync => Op::EventSync {
            event: f.event.take().ok_or_else(|| missing(Key::Event))?,
        },
        Kind::EventQuery => Op::EventQuery {
            event: f.event.take().ok_or_else(|| missing(Key::Event))?,
            complete: f.complete.ok_or_else(|| missing(Key::Complete))?,
        },
        Kind::StreamSync => Op::StreamSync {
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
        },
        Kind::StreamQuery => Op::StreamQuery {
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
            complete: f.complete.ok_or_else(|| missing(Key::Complete))?,
        },
        Kind::DeviceSync => Op::DeviceSync {
            device: f.device.unwrap_or(0),
        },
    };
    Ok(TraceOp {
        op,
        site: f.site.take(),
    })
}

// ---------------------------------------------------------------------------------------------
// Finding "op" when it is not the first key (rare): serde_json reads the whole line.

/// The position of the value of the first `"op"` key of the object `line`, if it has one.
fn find_op(line: &str) -> Scan<Option<usize>> {
    let mut de = serde_json::Deserializer::from_str(line);
    let found = serde::Deserializer::deserialize_map(&mut de, FindOp)
        .and_then(|found| de.end().map(|()| found))
        .map_err(|e| Box::new(from_serde(&e, 0, "invalid JSON")))?;
    Ok(found.map(|raw| raw.get().as_ptr() as usize - line.as_ptr() as usize))
}

struct FindOp;

impl<'de> Visitor<'de> for FindOp {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(is_op) = map.next_key_seed(IsOp)? {
            if is_op && found.is_none() {
                found = Some(map.next_value::<&RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// Deserializes a key into whether it is `"op"`.
struct IsOp;

impl<'de> DeserializeSeed<'de> for IsOp {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for IsOp {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == "op")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::arbitrary::arb_trace_op;
    use crate::trace::write_op;
    use proptest::prelude::*;
    use std::io::BufReader;

    const OPS: &str = "one of stream_create, alloc, free, record_stream, launch, copy, memset, \
                       host_read, host_write, event_create, event_destroy, event_record, \
                       event_wait, event_sync, event_query, stream_sync, stream_query, device_sync";
    const INT: &str = "expected an integer from 0 to 18446744073709551615";

    fn op(line: &str) -> TraceOp {
        match parse_line(line) {
            Ok(Some((op, _))) => op,
            other => panic!("{line}: {other:?}"),
        }
    }

    fn spans(line: &str) -> Spans {
        match parse_line(line) {
            Ok(Some((_, spans))) => spans,
            other => panic!("{line}: {other:?}"),
        }
    }

    /// The error of `line` as `COL: MESSAGE; expected …`.
    fn err(line: &str) -> String {
        match parse_line(line) {
            Err(e) => e.to_string(),
            Ok(ok) => panic!("{line}: parsed as {ok:?}"),
        }
    }

    /// The general scanner alone, without the fast path.
    fn general(line: &str) -> Result<Option<(TraceOp, Spans)>, LineError> {
        let mut spans = Spans {
            line: 1,
            ..Spans::default()
        };
        Ok(parse_into(line, &mut spans, false)?.map(|op| (op, spans)))
    }

    fn read_all(text: &[u8]) -> (Vec<(u64, TraceOp)>, Option<String>) {
        let mut reader = TraceReader::new(text, "t.jsonl");
        let mut ops = Vec::new();
        loop {
            match reader.next_op() {
                Ok(Some((op, spans))) => ops.push((spans.line(), op)),
                Ok(None) => return (ops, None),
                Err(e) => return (ops, Some(e.to_string())),
            }
        }
    }

    #[test]
    fn a_typical_launch() {
        let line = r#"{"op":"launch","stream":"s3","name":"k","reads":["b12",{"buffer":"t5","offset":0,"bytes":4096}],"writes":["b13"]}"#;
        let expected = Op::Launch {
            stream: Id::from("s3"),
            name: Some("k".into()),
            reads: vec![Region::whole("b12"), Region::range("t5", 0, 4096)],
            writes: vec![Region::whole("b13")],
        };
        assert_eq!(op(line), TraceOp::from(expected));
        let s = spans(line);
        assert_eq!(s.locate(Field::Op), (1, 1));
        assert_eq!(s.locate(Field::Stream), (1, 25));
        assert_eq!(s.locate(Field::Read(0)), (1, 50));
        assert_eq!(s.locate(Field::Read(1)), (1, 56));
        assert_eq!(s.locate(Field::Write(0)), (1, 107));
        // Absent fields fall back to the object.
        assert_eq!(s.column(Field::Event), None);
        assert_eq!(s.locate(Field::Event), (1, 1));
        assert_eq!(s.locate(Field::Read(2)), (1, 1));
        assert_eq!(general(line), parse_line(line));
    }

    #[test]
    fn every_op_with_every_field() {
        let lines = [
            r#"{"op":"stream_create","stream":"s","device":1,"blocking":true,"site":"a.rs:1"}"#,
            r#"{"op":"alloc","buffer":"a","bytes":16,"stream":"s","memory":"pinned","addr":4096}"#,
            r#"{"op":"free","buffer":"a","stream":"s"}"#,
            r#"{"op":"record_stream","buffer":"a","stream":"s"}"#,
            r#"{"op":"copy","stream":"s","src":"a","dst":{"buffer":"b","offset":8}}"#,
            r#"{"op":"memset","stream":"s","dst":{"buffer":"b","bytes":8}}"#,
            r#"{"op":"host_read","buffer":{"buffer":"p","offset":1,"bytes":2}}"#,
            r#"{"op":"host_write","buffer":"p"}"#,
            r#"{"op":"event_create","event":"e"}"#,
            r#"{"op":"event_destroy","event":"e"}"#,
            r#"{"op":"event_record","event":"e","stream":"s"}"#,
            r#"{"op":"event_wait","stream":"s","event":"e"}"#,
            r#"{"op":"event_sync","event":"e"}"#,
            r#"{"op":"event_query","event":"e","complete":false}"#,
            r#"{"op":"stream_sync","stream":"s"}"#,
            r#"{"op":"stream_query","stream":"s","complete":true}"#,
            r#"{"op":"device_sync","device":2,"site":["f","g"]}"#,
        ];
        for line in lines {
            let parsed = parse_line(line);
            assert!(matches!(parsed, Ok(Some(_))), "{line}: {parsed:?}");
            assert_eq!(general(line), parsed, "{line}");
            let mut written = String::new();
            write_op(&op(line), &mut written);
            assert_eq!(written, line);
        }
        assert_eq!(
            op(r#"{"op":"alloc","buffer":"a","bytes":16}"#).op,
            Op::Alloc {
                buffer: Id::from("a"),
                bytes: 16,
                stream: None,
                memory: MemoryKind::Device,
                addr: None
            }
        );
        assert_eq!(
            op(r#"{"op":"device_sync"}"#).op,
            Op::DeviceSync { device: 0 }
        );
        assert_eq!(
            op(r#"{"op":"stream_create","stream":"s"}"#).op,
            Op::StreamCreate {
                stream: Id::from("s"),
                device: 0,
                blocking: false
            }
        );
        assert_eq!(
            op(r#"{"op":"launch","stream":"s"}"#).op,
            Op::Launch {
                stream: Id::from("s"),
                name: None,
                reads: vec![],
                writes: vec![]
            }
        );
    }

    #[test]
    fn whitespace_order_and_escapes() {
        let compact = op(r#"{"op":"copy","stream":"s","src":"a","dst":{"buffer":"b","offset":8}}"#);
        let spaced = " { \"dst\" : { \"offset\" : 8 , \"buffer\" : \"b\" } ,\t\"src\":\"a\", \
                      \"op\" : \"copy\" , \"stream\" : \"s\" } \r\n";
        assert_eq!(op(spaced), compact);
        let s = spans(spaced);
        assert_eq!(s.locate(Field::Op), (1, 2));
        assert_eq!(s.locate(Field::Dst), (1, 12));
        assert_eq!(s.locate(Field::Stream), (1, 86));
        let escaped = op(r#"{"\u006fp":"stream_sync","stream":"a\"b\\c\u00e9\n"}"#);
        assert_eq!(
            escaped.op,
            Op::StreamSync {
                stream: Id::from("a\"b\\cé\n")
            }
        );
        assert_eq!(
            op(r#"{"op":"event_sync","event":"été"}"#).op,
            Op::EventSync {
                event: Id::from("été")
            }
        );
    }

    #[test]
    fn integer_and_string_ids_are_the_same() {
        assert_eq!(
            op(r#"{"op":"event_record","event":7,"stream":0}"#),
            op(r#"{"op":"event_record","event":"7","stream":"0"}"#)
        );
        let max = op(r#"{"op":"memset","stream":18446744073709551615,"dst":12}"#);
        assert_eq!(
            max.op,
            Op::Memset {
                stream: Id::from(u64::MAX),
                dst: Region::whole("12")
            }
        );
    }

    #[test]
    fn integer_edges() {
        let device = |text: &str| format!(r#"{{"op":"device_sync","device":{text}}}"#);
        assert_eq!(op(&device("0")).op, Op::DeviceSync { device: 0 });
        let max = op(&device("18446744073709551615"));
        assert_eq!(max.op, Op::DeviceSync { device: u64::MAX });
        assert_eq!(
            err(&device("18446744073709551616")),
            format!("30: field \"device\" is too large (18446744073709551616); {INT}")
        );
        assert_eq!(
            err(&device("99999999999999999999999")),
            format!("30: field \"device\" is too large (99999999999999999999999); {INT}")
        );
        assert_eq!(
            err(&device("-1")),
            format!("30: field \"device\" is negative (-1); {INT}")
        );
        assert_eq!(
            err(&device("1.0")),
            format!("30: field \"device\" has a fraction (1.0); {INT}")
        );
        assert_eq!(
            err(&device("1e3")),
            format!("30: field \"device\" has an exponent (1e3); {INT}")
        );
        assert_eq!(
            err(&device("1E+3")),
            format!("30: field \"device\" has an exponent (1E+3); {INT}")
        );
        // Not JSON at all: serde_json's word.
        assert_eq!(err(&device("01")), "31: invalid JSON: invalid number");
        assert_eq!(err(&device("-")), "31: invalid JSON: invalid number");
        // Ids follow the same rule.
        assert_eq!(
            err(r#"{"op":"event_sync","event":-3}"#),
            "28: field \"event\" is negative (-3); expected a string or an integer from 0 to \
             18446744073709551615"
        );
        assert_eq!(
            err(r#"{"op":"event_sync","event":1.5}"#),
            "28: field \"event\" has a fraction (1.5); expected a string or an integer from 0 \
             to 18446744073709551615"
        );
    }

    #[test]
    fn sums_that_overflow() {
        let ok = r#"{"op":"memset","stream":"s","dst":{"buffer":"a","offset":0,"bytes":18446744073709551615}}"#;
        assert_eq!(
            op(ok).op,
            Op::Memset {
                stream: Id::from("s"),
                dst: Region::range("a", 0, u64::MAX)
            }
        );
        let line = r#"{"op":"memset","stream":"s","dst":{"buffer":"a","offset":1,"bytes":18446744073709551615}}"#;
        assert_eq!(
            err(line),
            "35: region \"dst\" ends past 2^64 - 1 (offset 1 + bytes 18446744073709551615); \
             expected offset + bytes at most 18446744073709551615"
        );
        let line = r#"{"op":"launch","stream":"s","writes":["a",{"buffer":"b","offset":18446744073709551615,"bytes":1}]}"#;
        assert_eq!(
            err(line),
            "43: region \"writes[1]\" ends past 2^64 - 1 (offset 18446744073709551615 + bytes 1); \
             expected offset + bytes at most 18446744073709551615"
        );
        let line = r#"{"op":"alloc","buffer":"a","bytes":2,"addr":18446744073709551615}"#;
        assert_eq!(
            err(line),
            "45: alloc ends past 2^64 - 1 (addr 18446744073709551615 + bytes 2); expected addr \
             + bytes at most 18446744073709551615"
        );
        let line = r#"{"op":"alloc","buffer":"a","bytes":0,"addr":18446744073709551615}"#;
        assert!(matches!(
            op(line).op,
            Op::Alloc {
                addr: Some(u64::MAX),
                ..
            }
        ));
    }

    #[test]
    fn op_errors() {
        assert_eq!(
            err(r#"{"op":"lanch","stream":"s"}"#),
            format!("7: unknown op \"lanch\"; expected {OPS}")
        );
        assert_eq!(
            err(r#"{"stream":"s"}"#),
            format!("1: missing field \"op\"; expected {OPS}")
        );
        assert_eq!(
            err("  {}"),
            format!("3: missing field \"op\"; expected {OPS}")
        );
        assert_eq!(
            err(r#"{"op":5}"#),
            format!("7: field \"op\" is a number; expected {OPS}")
        );
        // The op need not come first.
        assert_eq!(
            op(r#"{"stream":"s","op":"stream_sync"}"#).op,
            Op::StreamSync {
                stream: Id::from("s")
            }
        );
        assert_eq!(
            err(r#"{"stream":"s","op":"lanch"}"#),
            format!("20: unknown op \"lanch\"; expected {OPS}")
        );
        assert_eq!(
            err(r#"{"stream":"host","op":"stream_sync"}"#),
            "11: field \"stream\" is \"host\", the reserved name of the CPU thread; expected a \
             stream id other than \"host\""
        );
        assert_eq!(
            err("[1,2]"),
            "1: the line is an array; expected a JSON object"
        );
        assert_eq!(
            err("  42"),
            "3: the line is a number; expected a JSON object"
        );
        assert_eq!(
            err(r#""op""#),
            "1: the line is a string; expected a JSON object"
        );
    }

    #[test]
    fn field_errors() {
        assert_eq!(
            err(r#"{"op":"stream_sync","stream":"s","bogus":1}"#),
            "34: unknown field \"bogus\" for op \"stream_sync\"; expected one of stream, site"
        );
        assert_eq!(
            err(r#"{"op":"launch","stream":"s","event":"e"}"#),
            "29: unknown field \"event\" for op \"launch\"; expected one of stream, name, reads, \
             writes, site"
        );
        assert_eq!(
            err(r#"{"op":"stream_sync","stream":"a","stream":"b"}"#),
            "34: duplicate field \"stream\"; expected each field at most once"
        );
        assert_eq!(
            err(r#"{"op":"stream_sync","op":"stream_sync","stream":"a"}"#),
            "21: duplicate field \"op\"; expected each field at most once"
        );
        assert_eq!(
            err(r#"{"op":"launch"}"#),
            "1: missing field \"stream\" for op \"launch\"; expected a stream id"
        );
        assert_eq!(
            err(r#"{"op":"copy","stream":"s","dst":"a"}"#),
            format!("1: missing field \"src\" for op \"copy\"; expected {REGION}")
        );
        assert_eq!(
            err(r#"{"op":"event_query","event":"e"}"#),
            "1: missing field \"complete\" for op \"event_query\"; expected a boolean"
        );
        assert_eq!(
            err(r#"{"op":"alloc","buffer":"a","bytes":"4"}"#),
            format!("36: field \"bytes\" is a string; {INT}")
        );
        assert_eq!(
            err(r#"{"op":"alloc","buffer":{"buffer":"a"},"bytes":4}"#),
            "24: field \"buffer\" is an object; expected a string or an integer from 0 to \
             18446744073709551615"
        );
        assert_eq!(
            err(r#"{"op":"alloc","buffer":"a","bytes":1,"memory":"gpu"}"#),
            "47: field \"memory\" is \"gpu\"; expected one of device, pinned, managed"
        );
        assert_eq!(
            err(r#"{"op":"alloc","buffer":"a","bytes":1,"memory":null}"#),
            "47: field \"memory\" is null; expected one of device, pinned, managed"
        );
        assert_eq!(
            err(r#"{"op":"device_sync","site":5}"#),
            "28: field \"site\" is a number; expected a string or an array of strings"
        );
        assert_eq!(
            err(r#"{"op":"device_sync","site":["a",5]}"#),
            "33: field \"site[1]\" is a number; expected a string"
        );
        assert_eq!(
            err(r#"{"op":"launch","stream":"s","name":7}"#),
            "36: field \"name\" is a number; expected a string"
        );
        assert_eq!(
            err(r#"{"op":"event_query","event":"e","complete":"yes"}"#),
            "44: field \"complete\" is a string; expected true or false"
        );
        assert_eq!(
            err(r#"{"op":"stream_create","stream":"s","blocking":1}"#),
            "47: field \"blocking\" is a number; expected true or false"
        );
        assert_eq!(
            err(r#"{"op":"stream_sync","stream":[1]}"#),
            "30: field \"stream\" is an array; expected a string or an integer from 0 to \
             18446744073709551615"
        );
        assert_eq!(
            err(r#"{"op":"launch","stream":"s","reads":["a",true]}"#),
            format!("42: field \"reads[1]\" is a boolean; expected {REGION}")
        );
        assert_eq!(
            err(r#"{"op":"launch","stream":"s","reads":"a"}"#),
            "37: field \"reads\" is a string; expected an array of regions"
        );
        assert_eq!(
            err(r#"{"op":"memset","stream":"s","dst":{"buffer":"a","offest":1}}"#),
            "49: unknown field \"offest\" in region \"dst\"; expected one of buffer, offset, bytes"
        );
        assert_eq!(
            err(r#"{"op":"memset","stream":"s","dst":{"bytes":1,"bytes":2,"buffer":"a"}}"#),
            "46: duplicate field \"bytes\" in region \"dst\"; expected each field at most once"
        );
        assert_eq!(
            err(r#"{"op":"memset","stream":"s","dst":{"bytes":1}}"#),
            "35: missing field \"buffer\" in region \"dst\"; expected a buffer id"
        );
        assert_eq!(
            err(r#"{"op":"memset","stream":"s","dst":{"buffer":"a","offset":-1}}"#),
            format!("58: field \"dst.offset\" is negative (-1); {INT}")
        );
        assert_eq!(
            err(r#"{"op":"host_read","buffer":{"buffer":"a","bytes":true}}"#),
            format!("50: field \"buffer.bytes\" is a boolean; {INT}")
        );
    }

    #[test]
    fn host_is_not_a_stream() {
        let expected = "the reserved name of the CPU thread; expected a stream id other than \
                        \"host\"";
        assert_eq!(
            err(r#"{"op":"stream_sync","stream":"host"}"#),
            format!("30: field \"stream\" is \"host\", {expected}")
        );
        assert_eq!(
            err(r#"{"op":"free","buffer":"a","stream":"host"}"#),
            format!("36: field \"stream\" is \"host\", {expected}")
        );
        assert_eq!(
            err(r#"{"op":"alloc","buffer":"a","bytes":1,"stream":"h\u006fst"}"#),
            format!("47: field \"stream\" is \"host\", {expected}")
        );
        // Other ids may be "host".
        assert_eq!(
            op(r#"{"op":"event_sync","event":"host"}"#).op,
            Op::EventSync {
                event: Id::from("host")
            }
        );
    }

    #[test]
    fn malformed_json() {
        assert_eq!(
            err(r#"{"op":"launch","stream":}"#),
            "25: invalid JSON: expected value"
        );
        assert_eq!(
            err(r#"{"op":"launch""#),
            "14: invalid JSON: EOF while parsing an object"
        );
        assert_eq!(
            err(r#"{"op":"device_sync"} x"#),
            "22: invalid JSON: trailing characters"
        );
        assert_eq!(
            err(r#"{"op":"device_sync",}"#),
            "21: invalid JSON: key must be a string"
        );
        assert_eq!(
            err("{\"op\":\"device_sync\",\"site\":\"a\tb\"}"),
            "29: invalid JSON: control character (\\u0000-\\u001F) found while parsing a string"
        );
        // A syntax error anywhere wins over an earlier bad value.
        assert_eq!(
            err(r#"{"op":"lanch","stream":}"#),
            "24: invalid JSON: expected value"
        );
        assert_eq!(err("hello"), "1: invalid JSON: expected value");
        // A lone surrogate is valid JSON but not a string.
        assert_eq!(
            err(r#"{"op":"stream_sync","stream":"\ud800"}"#),
            "37: invalid string: unexpected end of hex escape"
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let open = "[".repeat(100_000);
        assert_eq!(err(&open), "100000: invalid JSON: EOF while parsing a list");
        let line = format!(r#"{{"op":"launch","stream":{open}"#);
        assert!(err(&line).contains("invalid JSON: EOF while parsing a list"));
        // Closed, it is valid JSON but a wrong value.
        let deep = format!("{open}{}", "]".repeat(100_000));
        let line = format!(r#"{{"op":"launch","stream":"s","reads":{deep}}}"#);
        assert_eq!(
            err(&line),
            format!("38: field \"reads[0]\" is an array; expected {REGION}")
        );
        let line = format!(r#"{{"x":{deep},"op":"device_sync"}}"#);
        assert_eq!(
            err(&line),
            "2: unknown field \"x\" for op \"device_sync\"; expected one of device, site"
        );
    }

    #[test]
    fn invalid_utf8() {
        let line = b"{\"op\":\"launch\",\"stream\":\"\xff\"}";
        let e = parse_line_bytes(line).map(|_| ()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "26: invalid UTF-8 (byte 0xff); expected UTF-8 text"
        );
        let line = b"{\"op\":\"launch\",\"stream\":\"caf\xc3\"}";
        let e = parse_line_bytes(line).map(|_| ()).unwrap_err();
        assert_eq!(e.column, 29);
        let (ops, e) = read_all(b"{\"op\":\"device_sync\"}\n# caf\xe9\n");
        assert_eq!(ops.len(), 1);
        assert_eq!(
            e.as_deref(),
            Some("t.jsonl:2:6: invalid UTF-8 (byte 0xe9); expected UTF-8 text")
        );
    }

    #[test]
    fn reader_lines_comments_and_errors() {
        let text = "# a trace\n\n{\"op\":\"stream_sync\",\"stream\":\"a\"}\n   \n  # indented\n\
                    \t{\"op\":\"device_sync\"}\n{\"op\":\"event_sync\",\"event\":7}";
        let mut reader = TraceReader::new(text.as_bytes(), "t.jsonl");
        assert_eq!(reader.line(), 0);
        let (op, spans) = reader.next_op().unwrap().unwrap();
        assert_eq!(
            (op.op.name(), spans.line(), reader.ops_read()),
            ("stream_sync", 3, 1)
        );
        let (op, spans) = reader.next_op().unwrap().unwrap();
        assert_eq!(
            (op.op.name(), spans.locate(Field::Op)),
            ("device_sync", (6, 2))
        );
        let (op, spans) = reader.next_op().unwrap().unwrap();
        assert_eq!(
            (op.op.name(), spans.line(), reader.ops_read()),
            ("event_sync", 7, 3)
        );
        assert!(reader.next_op().unwrap().is_none());
        assert!(reader.next_op().unwrap().is_none());
        assert_eq!((reader.line(), reader.ops_read()), (7, 3));

        let text = "{\"op\":\"device_sync\"}\n# c\n{\"op\":\"lanch\"}\n{\"op\":\"device_sync\"}\n";
        let mut reader = TraceReader::new(text.as_bytes(), "trace.jsonl");
        assert!(reader.next_op().unwrap().is_some());
        let e = reader.next_op().map(|_| ()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("trace.jsonl:3:7: unknown op \"lanch\"; expected {OPS}")
        );
        assert_eq!((e.file.as_str(), e.line, e.column), ("trace.jsonl", 3, 7));
        // The reader goes on after an error; the bad line is not an op.
        let (_, spans) = reader.next_op().unwrap().unwrap();
        assert_eq!((spans.line(), reader.ops_read()), (4, 2));
    }

    #[test]
    fn bom_and_crlf() {
        let text =
            "\u{feff}{\"op\":\"device_sync\"}\r\n{\"op\":\"stream_sync\",\"stream\":\"s\"}\r\n";
        let (ops, e) = read_all(text.as_bytes());
        assert_eq!(e, None);
        assert_eq!(ops.iter().map(|(l, _)| *l).collect::<Vec<_>>(), [1, 2]);
        let mut reader = TraceReader::new(text.as_bytes(), "t");
        assert_eq!(
            reader.next_op().unwrap().unwrap().1.locate(Field::Op),
            (1, 1)
        );
        assert_eq!(
            reader.next_op().unwrap().unwrap().1.locate(Field::Stream),
            (2, 30)
        );
        // Columns of line 1 do not count the mark.
        let (_, e) = read_all("\u{feff}{\"op\":\"lanch\"}\n".as_bytes());
        assert!(e.unwrap().starts_with("t.jsonl:1:7: unknown op"));
        // Nor does an error at the end of a CRLF line count the CR.
        let (_, e) = read_all(b"{\"op\":\"device_sync\"}\n{\"op\":\"launch\"\r\n");
        assert_eq!(
            e.as_deref(),
            Some("t.jsonl:2:14: invalid JSON: EOF while parsing an object")
        );
        // A mark elsewhere is not ignored.
        let (_, e) =
            read_all("{\"op\":\"device_sync\"}\n\u{feff}{\"op\":\"device_sync\"}\n".as_bytes());
        assert_eq!(
            e.as_deref(),
            Some("t.jsonl:2:1: invalid JSON: expected value")
        );
    }

    #[test]
    fn parse_error_display() {
        let e = ParseError::at(
            "t.jsonl",
            (3, 9),
            "region past the end of buffer \"a\"",
            Some("at most 16 bytes"),
        );
        assert_eq!(
            e.to_string(),
            "t.jsonl:3:9: region past the end of buffer \"a\"; expected at most 16 bytes"
        );
        let e = ParseError::at("t.jsonl", (3, 9), "bad", None);
        assert_eq!(e.to_string(), "t.jsonl:3:9: bad");
        let line = LineError {
            column: 4,
            message: "m".to_owned(),
            expected: None,
        };
        assert_eq!(line.to_string(), "4: m");
        assert_eq!(line.at_line("f", 2).to_string(), "f:2:4: m");
    }

    #[test]
    fn blank_and_comment_lines() {
        for line in ["", "   ", "\t\r\n", "#", "  # {\"op\":\"lanch\"}"] {
            assert_eq!(parse_line(line), Ok(None), "{line:?}");
        }
    }

    /// The scanner's tables name what the schema names.
    #[test]
    fn scanner_tables_follow_the_schema() {
        use crate::trace::schema::Key as K;
        for key in K::ALL {
            assert_eq!(
                KEY_LITERALS[key as usize],
                format!(",\"{}\":", key.name()).as_bytes()
            );
            assert_eq!(key_from_name(short(key.name().as_bytes())), Some(key));
        }
        for (i, name) in Op::NAMES.iter().enumerate() {
            let kind = kind_from_word(pack(name.as_bytes())).expect("a known op");
            assert_eq!((kind as usize, kind.name()), (i, *name));
        }
    }

    proptest! {
        /// The fast path and the general scanner agree on every line the writer writes, and on
        /// the same lines with their keys spaced out.
        #[test]
        fn fast_path_agrees_with_general_scanner(op in arb_trace_op()) {
            let mut line = String::new();
            write_op(&op, &mut line);
            let fast = parse_line(&line);
            prop_assert_eq!(&fast, &general(&line));
            prop_assert_eq!(fast.map(|o| o.map(|(op, _)| op)), Ok(Some(op.clone())));
            let spaced = line.replace(",\"", ", \"");
            prop_assert_eq!(parse_line(&spaced), general(&spaced));
        }

        /// Every line the writer writes takes the fast path, in place, unless a string has an
        /// escape or a number 20 digits: the writer's field order (the schema's) is the one the
        /// fast path expects.
        #[test]
        fn written_lines_take_the_fast_path(op in arb_trace_op()) {
            let mut line = String::new();
            write_op(&op, &mut line);
            line.push('\n');
            let mut spans = Spans::default();
            let fast = Scanner::canonical_in_place(line.as_bytes(), &mut spans);
            if line.contains('\\') || numbers(&op.op).iter().any(|&n| n >= 10u64.pow(19)) {
                prop_assert_eq!(fast.map(|(op, _)| op), None);
            } else {
                prop_assert_eq!(fast, Some((op, line.len())));
            }
        }

        /// Cutting a written line anywhere gives the same answer from both paths, and no panic.
        #[test]
        fn truncated_lines(op in arb_trace_op(), cut in any::<prop::sample::Index>()) {
            let mut line = String::new();
            write_op(&op, &mut line);
            let mut at = cut.index(line.len() + 1);
            while !line.is_char_boundary(at) {
                at -= 1;
            }
            let line = &line[..at];
            prop_assert_eq!(parse_line(line), general(line));
        }

        /// So does a written line with one byte changed.
        #[test]
        fn mutated_lines(op in arb_trace_op(), at in any::<prop::sample::Index>(), byte in 0u8..0x80) {
            let mut line = String::new();
            write_op(&op, &mut line);
            let mut bytes = line.into_bytes();
            let at = at.index(bytes.len());
            bytes[at] = byte;
            if let Ok(line) = std::str::from_utf8(&bytes) {
                prop_assert_eq!(parse_line(line), general(line));
            }
        }
    }

    /// Every integer of an op's fields and regions.
    fn numbers(op: &Op) -> Vec<u64> {
        use crate::trace::schema::Value;
        let mut out = Vec::new();
        let region = |r: &Region, out: &mut Vec<u64>| {
            out.push(r.offset);
            out.extend(r.bytes);
        };
        for field in op.kind().fields() {
            match op.value(field.key) {
                Some(Value::Int(n)) => out.push(n),
                Some(Value::Region(r)) => region(r, &mut out),
                Some(Value::Regions(rs)) => rs.iter().for_each(|r| region(r, &mut out)),
                _ => {}
            }
        }
        out
    }

    /// Every result of `reader` (which goes on after errors) as `line:col` or `line:op`.
    fn results<R: BufRead>(mut reader: TraceReader<R>) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            match reader.next_op() {
                Ok(Some((op, spans))) => out.push(format!("{}:{}", spans.line(), op.op.name())),
                Ok(None) => return out,
                Err(e) => out.push(format!("{}:{}: {}", e.line, e.column, e.message)),
            }
        }
    }

    #[test]
    fn over_long_lines_are_bad_input_and_skipped() {
        let op = r#"{"op":"device_sync"}"#; // 20 bytes
        let long = format!(r#"{{"op":"stream_sync","stream":"{}"}}"#, "x".repeat(40));
        let text = format!("{op}\n{long}\n{op}\n\u{feff}{op}\r\n{long}");
        let want = [
            "1:device_sync",
            "2:33: the line is longer than 32 bytes",
            "3:device_sync",
            "4:1",
            "5:33: the line is longer than 32 bytes",
        ];
        for cap in [1, 3, 7, 16, 64, 1 << 16] {
            let reader = TraceReader::new(BufReader::with_capacity(cap, text.as_bytes()), "t")
                .with_line_limit(32);
            let got = results(reader);
            assert_eq!(got.len(), 5, "{got:?}");
            assert_eq!(got[..3], want[..3], "buffer {cap}");
            assert_eq!(got[4], want[4], "buffer {cap}");
            // Line 4 starts with a BOM that is not at the start of the file: bad input.
            assert!(got[3].starts_with("4:1: "), "{got:?}");
        }
        // Exactly at the limit is fine; one byte more is not, also through a final `\r`.
        let at = format!(r#"{{"op":"device_sync"{}}}"#, " ".repeat(12));
        assert_eq!(at.len(), 32);
        let text = format!("{at}\n{at}\r\n{at}");
        let got = results(TraceReader::new(text.as_bytes(), "t").with_line_limit(32));
        assert_eq!(
            got,
            [
                "1:device_sync",
                "2:33: the line is longer than 32 bytes",
                "3:device_sync"
            ]
        );
        // A byte-order mark on line 1 counts toward the limit but not toward columns.
        let text = format!("\u{feff}{at}\n{op}");
        let got = results(TraceReader::new(text.as_bytes(), "t").with_line_limit(32));
        assert_eq!(
            got,
            ["1:30: the line is longer than 32 bytes", "2:device_sync"]
        );
        assert_eq!(
            check_line_length(format!("\u{feff}{at}").as_bytes(), true, 32).map(|e| e.column),
            Some(30)
        );
    }

    /// An endless line (`/dev/zero`): an error once the limit is passed, having read little more.
    #[test]
    fn an_endless_line_ends_at_the_limit() {
        struct Zeros(u64);
        impl std::io::Read for Zeros {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                buf.fill(0);
                self.0 += buf.len() as u64;
                Ok(buf.len())
            }
        }
        let mut reader = TraceReader::new(BufReader::new(Zeros(0)), "/dev/zero");
        let e = reader.next_op().expect_err("an error");
        assert_eq!(
            e.to_string(),
            format!(
                "/dev/zero:1:{}: the line is longer than {MAX_LINE_BYTES} bytes; expected a line \
                 of at most {MAX_LINE_BYTES} bytes (the trace format's line limit)",
                MAX_LINE_BYTES + 1
            )
        );
        let read = reader.into_inner().into_inner().0;
        assert!(
            read <= MAX_LINE_BYTES as u64 + (1 << 16),
            "read {read} bytes"
        );
        assert!(reader_keeps_little(), "the line buffer is bounded");
    }

    /// The reader's line buffer never holds more than the limit (checked through its capacity
    /// after an over-long line).
    fn reader_keeps_little() -> bool {
        let text = "y".repeat(10_000);
        let mut r = TraceReader::new(BufReader::with_capacity(16, text.as_bytes()), "t")
            .with_line_limit(100);
        let e = r.next_op().expect_err("an error");
        e.column == 101 && r.buf.capacity() < 1_000 && r.next_op() == Ok(None)
    }

    #[test]
    fn echoed_values_are_clipped() {
        let name = "q".repeat(10_000);
        let e = parse_line(&format!(r#"{{"op":"{name}"}}"#)).unwrap_err();
        assert!(e.message.len() < 100, "{}", e.message);
        assert!(e.message.ends_with("…\""), "{}", e.message);
        let e = parse_line(&format!(r#"{{"op":"sync","{name}":1}}"#)).unwrap_err();
        assert!(e.message.len() < 200, "{}", e.message);
        let digits = "9".repeat(10_000);
        let e = parse_line(&format!(r#"{{"op":"device_sync","device":{digits}}}"#)).unwrap_err();
        assert!(e.message.len() < 150, "{}", e.message);
        assert!(e.message.contains("is too large (999"), "{}", e.message);
        let e = parse_line(&format!(
            r#"{{"op":"alloc","buffer":"b","bytes":1,"memory":"{name}"}}"#
        ))
        .unwrap_err();
        assert!(e.message.len() < 150, "{}", e.message);
        // Control characters in echoed values are escaped.
        let e = parse_line("{\"op\":\"\\u001b[2J\"}").unwrap_err();
        assert_eq!(e.message, "unknown op \"\\u{1b}[2J\"");
    }
}
