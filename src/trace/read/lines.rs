//! [`TraceReader`]: a trace read line by line, canonical lines in place.

use std::io::BufRead;

use super::error::{LineError, ParseError};
use super::limit::{line_end, line_too_long, starts_with_bom, BOM, MAX_LINE_BYTES, MIN_LINE_LIMIT};
use super::scan::Scanner;
use super::spans::Spans;
use super::{parse_into, utf8};
use crate::trace::TraceOp;

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
    pub(super) buf: Vec<u8>,
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
