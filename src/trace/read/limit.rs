//! The line limit: how long a line may be, and where a line ends.

use super::error::LineError;

/// The longest line a [`TraceReader`](super::TraceReader) accepts: 16 MiB, counting every byte before the line's
/// `\n` (a `\r` and, on line 1, a byte-order mark included).
///
/// A longer line is bad input, reported at the column of its first byte past the limit as soon
/// as the reader has seen it, without reading the rest of the line: memory stays bounded on any
/// input (`streamsan check /dev/zero` ends at once). The limit is far above any real op: a
/// launch that names 100,000 regions in the long form is about 4.5 MB.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// The smallest line limit [`TraceReader::with_line_limit`](super::TraceReader::with_line_limit) sets.
pub const MIN_LINE_LIMIT: usize = 8;

/// A UTF-8 byte-order mark.
pub(super) const BOM: &[u8; 3] = b"\xEF\xBB\xBF";

/// Whether the bytes `head` then `more` start with a byte-order mark.
pub(super) fn starts_with_bom(head: &[u8], more: &[u8]) -> bool {
    head.iter().chain(more).take(3).copied().eq(*BOM)
}

/// The error of a line longer than `limit` bytes, at the column of its first byte past the
/// limit (columns of line 1 do not count a byte-order mark, `bom`).
#[cold]
pub(super) fn line_too_long(limit: usize, bom: bool) -> LineError {
    let column = limit as u64 + 1 - if bom { 3 } else { 0 };
    LineError {
        column,
        message: format!("the line is longer than {limit} bytes"),
        expected: Some(format!(
            "a line of at most {limit} bytes (the trace format's line limit)"
        )),
    }
}

/// The error [`TraceReader`](super::TraceReader) reports for line `bytes` (as read from the file, without its
/// `\n`; `first` when it is line 1) when it is longer than `limit`, else `None`. For tests
/// that hold the reader against [`parse_line_bytes`](super::parse_line_bytes).
pub fn check_line_length(bytes: &[u8], first: bool, limit: usize) -> Option<LineError> {
    let limit = limit.max(MIN_LINE_LIMIT);
    (bytes.len() > limit).then(|| line_too_long(limit, first && bytes.starts_with(BOM)))
}

/// The position of the first `\n` of `bytes`, eight bytes at a time.
#[inline]
pub(super) fn line_end(bytes: &[u8]) -> Option<usize> {
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
