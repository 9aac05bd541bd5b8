//! The scanner: one pass over one line, reading JSON values as the trace format wants them —
//! strings eight bytes at a time, integers, ids, regions, sites — with located errors.

use std::borrow::Cow;

use super::error::{bad, found, from_serde, Bad, Path, RegionKey, Scan};
use super::fields::{pack, short};
use crate::text::{clip, ECHO_CHARS};
use crate::trace::schema::{Key, ID, INTEGER, REGION};
use crate::trace::{Id, MemoryKind, Region, Site, HOST};

/// The bytes that end the plain part of a JSON string: the quote, the backslash, control characters.
pub(super) static SPECIAL: [bool; 256] = {
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
pub(super) fn special_bytes(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let quote = w ^ (ONES * b'"' as u64);
    let backslash = w ^ (ONES * b'\\' as u64);
    let zero_quote = quote.wrapping_sub(ONES) & !quote;
    let zero_backslash = backslash.wrapping_sub(ONES) & !backslash;
    let control = w.wrapping_sub(ONES * 0x20) & !w;
    (zero_quote | zero_backslash | control) & HIGH
}

/// A one-pass scanner of one line. Positions are byte offsets; columns are positions + 1.
pub(super) struct Scanner<'a> {
    pub(super) b: &'a [u8],
    pub(super) pos: usize,
}

pub(super) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl<'a> Scanner<'a> {
    /// The bytes from `at` on (none past the end).
    pub(super) fn rest_at(&self, at: usize) -> &'a [u8] {
        self.b.get(at..).unwrap_or_default()
    }

    #[inline(always)]
    pub(super) fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    #[inline(always)]
    pub(super) fn ws(&mut self) {
        if matches!(self.b.get(self.pos), Some(&b) if b <= b' ') {
            self.skip_ws();
        }
    }

    pub(super) fn skip_ws(&mut self) {
        while let Some(&b) = self.b.get(self.pos) {
            if !is_ws(b) {
                break;
            }
            self.pos += 1;
        }
    }

    #[inline(always)]
    pub(super) fn peek_ws(&mut self) -> Option<u8> {
        match self.b.get(self.pos) {
            Some(&c) if c > b' ' => Some(c),
            _ => {
                self.skip_ws();
                self.peek()
            }
        }
    }

    #[cold]
    pub(super) fn syntax(&self) -> Bad {
        bad(self.pos, "invalid JSON".to_owned(), None)
    }

    /// Skips whitespace and `c`.
    #[inline(always)]
    pub(super) fn eat(&mut self, c: u8) -> Scan<()> {
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
    pub(super) fn slice(&self, from: usize, to: usize) -> Scan<&'a str> {
        match self.b.get(from..to).map(std::str::from_utf8) {
            Some(Ok(s)) => Ok(s),
            _ => Err(bad(from, "invalid JSON".to_owned(), None)),
        }
    }

    #[cold]
    pub(super) fn wrong_type(&self, path: Path, expected: &str) -> Bad {
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
    pub(super) fn plain_string(&mut self) -> Option<(usize, usize)> {
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
    pub(super) fn long_plain_string(&mut self, from: usize) -> Option<(usize, usize)> {
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
    pub(super) fn close_string(&mut self, from: usize, at: usize) -> Option<(usize, usize)> {
        if self.b.get(at) == Some(&b'"') {
            self.pos = at + 1;
            Some((from, at))
        } else {
            None
        }
    }

    /// A string at the current position (which holds its opening quote).
    #[inline(always)]
    pub(super) fn string(&mut self) -> Scan<Cow<'a, str>> {
        match self.plain_string() {
            Some((from, to)) => self.slice(from, to).map(Cow::Borrowed),
            None => self.escaped_string(),
        }
    }

    /// A string whose text is only compared with names of at most 8 bytes: its [`short`] form
    /// (`u64::MAX` for other texts).
    #[inline(always)]
    pub(super) fn name(&mut self) -> Scan<u64> {
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
    pub(super) fn long_name(&mut self) -> Scan<u64> {
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
    pub(super) fn word(&mut self) -> Scan<u128> {
        match self.plain_string() {
            Some((from, to)) => Ok(self.pack_at(from, to)),
            None => Ok(pack(self.escaped_string()?.as_bytes())),
        }
    }

    /// [`pack`] of the bytes `from..to` of the line.
    #[inline]
    pub(super) fn pack_at(&self, from: usize, to: usize) -> u128 {
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
    pub(super) fn escaped_string(&mut self) -> Scan<Cow<'a, str>> {
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
    pub(super) fn text_at(&self, at: usize) -> String {
        let mut p = Scanner { b: self.b, pos: at };
        let text = p.string().unwrap_or_default();
        clip(&text, ECHO_CHARS).into_owned()
    }

    /// The raw text of the number at `start`, for messages.
    pub(super) fn number_text(&self, start: usize) -> &'a str {
        let len = self
            .rest_at(start)
            .iter()
            .take_while(|&&c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
            .count();
        self.slice(start, start + len).unwrap_or("")
    }

    /// An integer from 0 to 2^64 − 1 at the current position (a digit or `-`).
    #[inline(always)]
    pub(super) fn integer(&mut self, path: Path, expected: &str) -> Scan<u64> {
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
    pub(super) fn long_integer(
        &mut self,
        path: Path,
        expected: &str,
        n: u64,
        mut i: usize,
    ) -> Scan<u64> {
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

    pub(super) fn u64_value(&mut self, path: Path) -> Scan<u64> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.integer(path, INTEGER),
            _ => Err(self.wrong_type(path, INTEGER)),
        }
    }

    pub(super) fn bool_value(&mut self, path: Path) -> Scan<bool> {
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

    pub(super) fn string_value(&mut self, path: Path, expected: &str) -> Scan<String> {
        match self.peek() {
            Some(b'"') => Ok(self.string()?.into_owned()),
            _ => Err(self.wrong_type(path, expected)),
        }
    }

    /// An id: a string, or an integer kept as its decimal text.
    #[inline(always)]
    pub(super) fn id(&mut self, path: Path) -> Scan<Id> {
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
    pub(super) fn stream_id(&mut self, path: Path) -> Scan<Id> {
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

    pub(super) fn memory(&mut self, path: Path) -> Scan<MemoryKind> {
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
    pub(super) fn region(&mut self, path: Path) -> Scan<Region> {
        match self.peek() {
            Some(b'{') => self.region_object(path),
            Some(b'"' | b'-' | b'0'..=b'9') => Ok(Region::whole(self.id(path)?)),
            _ => Err(self.wrong_type(path, REGION)),
        }
    }

    pub(super) fn region_object(&mut self, path: Path) -> Scan<Region> {
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
    pub(super) fn regions(&mut self, key: Key, columns: &mut Vec<u64>) -> Scan<Vec<Region>> {
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
    pub(super) fn site(&mut self) -> Scan<Site> {
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
}
