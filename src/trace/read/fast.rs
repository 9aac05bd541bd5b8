//! The fast path: lines in the form [`write_op`](crate::trace::write_op) writes them, read
//! where they lie.

use super::fields::kind_from_word;
use super::scan::{special_bytes, Scanner};
use super::spans::{key_slot, Spans};
use crate::trace::schema::{Key, Kind};
use crate::trace::{Id, MemoryKind, Op, Region, Site, TraceOp, HOST};

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
pub(super) const KEY_LITERALS: [&[u8]; 18] = [
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
    b",\"graph\":",
    b",\"pool\":",
];

/// The canonical form: `{"op":"NAME"` and then some of the op's fields, each as `,"key":value`
/// with no whitespace, in the order the format lists them, with values of the right type and no
/// escapes in strings (`site` last), then `}` and nothing but whitespace.
///
/// These functions return `None` as soon as the line is not in that form, whatever the reason:
/// the general scanner then reads the line again and reports the error if there is one. For a
/// line in the form, they give the same op and spans as the general scanner.
impl<'a> Scanner<'a> {
    pub(super) fn canonical_line(&mut self, spans: &mut Spans) -> Option<TraceOp> {
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
                let pool = self.field(Key::Pool, spans, Self::fast_id)?;
                Op::Alloc {
                    buffer,
                    bytes,
                    stream,
                    memory,
                    addr,
                    pool,
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
            Kind::GraphBegin => Op::GraphBegin {
                graph: self.field(Key::Graph, spans, Self::fast_id)??,
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
                pool: self.field(Key::Pool, spans, Self::fast_id)?,
            },
            Kind::GraphEnd => Op::GraphEnd {
                graph: self.field(Key::Graph, spans, Self::fast_id)??,
            },
            Kind::GraphLaunch => Op::GraphLaunch {
                graph: self.field(Key::Graph, spans, Self::fast_id)??,
                stream: self.field(Key::Stream, spans, Self::fast_stream)??,
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
    pub(super) fn canonical_in_place(bytes: &[u8], spans: &mut Spans) -> Option<(TraceOp, usize)> {
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
    pub(super) fn literal(&mut self, literal: &[u8]) -> bool {
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
    pub(super) fn field<T>(
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
    pub(super) fn fast_str(&mut self) -> Option<&'a str> {
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

    pub(super) fn fast_string(&mut self) -> Option<String> {
        self.fast_str().map(str::to_owned)
    }

    /// An integer of at most 19 digits.
    #[inline(always)]
    pub(super) fn fast_u64(&mut self) -> Option<u64> {
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
    pub(super) fn fast_id(&mut self) -> Option<Id> {
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

    pub(super) fn fast_stream(&mut self) -> Option<Id> {
        self.fast_id().filter(|id| id.as_str() != HOST)
    }

    pub(super) fn fast_bool(&mut self) -> Option<bool> {
        if self.literal(b"true") {
            Some(true)
        } else if self.literal(b"false") {
            Some(false)
        } else {
            None
        }
    }

    pub(super) fn fast_memory(&mut self) -> Option<MemoryKind> {
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
    pub(super) fn fast_region(&mut self) -> Option<Region> {
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

    pub(super) fn fast_regions(&mut self, columns: &mut Vec<u64>) -> Option<Vec<Region>> {
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

    pub(super) fn fast_site(&mut self) -> Option<Site> {
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
