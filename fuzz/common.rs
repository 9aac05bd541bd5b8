//! The checks behind the fuzz targets, shared with `tests/fuzz_corpus.rs` (both include this file
//! with `#[path]`), so that every corpus and crash file is replayed by a plain `cargo test`.
//!
//! - [`check_parse_line`]: `parse_line_bytes` never panics, and an op it parses survives
//!   `write_op` and `parse_line` unchanged.
//! - [`check_trace_reader`]: `TraceReader` never panics, and reading a whole file (with the
//!   reader's buffer as large as the file, and with a tiny buffer that splits lines) gives, line
//!   for line, what `parse_line_bytes` gives: the same ops, the same field columns, the same
//!   errors at the same lines and columns.
//! - [`check_checker_oracle`]: the bytes are decoded ([`decode_program`]) into a small
//!   program (well-formed, or in graph mode now and then not); the checker never panics and its
//!   hazards — op, kind, buffer, sorted conflict ops, and for a graph replay the captured ops —
//!   equal the brute-force oracle's, or both reject the program, at the same op when it
//!   captures graphs; with [`INDEXED`] limits (its interval indexes on every path) the checker
//!   gives the same report to the byte.

use std::io::{BufRead, BufReader};

use streamsan::checker::Limits;
use streamsan::oracle::{oracle_hazards, OracleHazard};
use streamsan::report::{render_text, TextOptions};
use streamsan::trace::{
    check_line_length, parse_line, parse_line_bytes, write_op, Field, Id, MemoryKind, Op, Region,
    Spans, TraceOp, TraceReader, DEFAULT_STREAM,
};
use streamsan::{Checker, HazardKind, Report};

// ---------------------------------------------------------------------------------------------
// parse_line

/// `parse_line_bytes` on any bytes; when it parses, the op must come back from its written form.
pub fn check_parse_line(data: &[u8]) {
    let Ok(Some((op, _))) = parse_line_bytes(data) else {
        return;
    };
    let mut line = String::new();
    write_op(&op, &mut line);
    match parse_line(&line) {
        Ok(Some((back, _))) => {
            assert_eq!(
                back, op,
                "write_op then parse_line changed the op; line {line}"
            );
            let mut again = String::new();
            write_op(&back, &mut again);
            assert_eq!(again, line, "write_op is not stable");
        }
        other => panic!("parse_line does not take back what write_op wrote: {line:?}: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// TraceReader

/// One line's result as the checks compare it: the op with its line and field columns, or the
/// error's line, column, message and expectation.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// An op, the 1-based line, and the column of every field (see [`columns`]).
    Op(TraceOp, u64, Vec<Option<u64>>),
    /// An error: line, column, message, expected.
    Err(u64, u64, String, Option<String>),
}

/// The columns of every field of `op` that `spans` may know.
pub fn columns(spans: &Spans, op: &TraceOp) -> Vec<Option<u64>> {
    let mut v: Vec<Option<u64>> = [
        Field::Op,
        Field::Stream,
        Field::Event,
        Field::Buffer,
        Field::Bytes,
        Field::Addr,
        Field::Memory,
        Field::Device,
        Field::Blocking,
        Field::Src,
        Field::Dst,
    ]
    .iter()
    .map(|&f| spans.column(f))
    .collect();
    if let Op::Launch { reads, writes, .. } = &op.op {
        v.extend((0..reads.len() as u32).map(|i| spans.column(Field::Read(i))));
        v.extend((0..writes.len() as u32).map(|i| spans.column(Field::Write(i))));
    }
    v
}

/// Every result of a reader until its end. A reader goes on after an error, so the loop ends
/// at `None`; it is bounded by the number of lines, which a correct reader never exceeds.
pub fn read_all<R: BufRead>(mut reader: TraceReader<R>, lines: usize) -> Vec<Read> {
    let mut out = Vec::new();
    loop {
        assert!(
            out.len() <= lines,
            "the reader returned more results than lines"
        );
        match reader.next_op() {
            Ok(Some((op, spans))) => {
                let cols = columns(spans, &op);
                out.push(Read::Op(op, spans.line(), cols));
            }
            Ok(None) => return out,
            Err(e) => out.push(Read::Err(e.line, e.column, e.message, e.expected)),
        }
    }
}

/// The lines of `data`, without their `\n` (as the file holds them: `\r` and BOM included).
fn pieces(data: &[u8]) -> Vec<&[u8]> {
    let mut pieces: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    if data.is_empty() || data.ends_with(b"\n") {
        pieces.pop();
    }
    pieces
}

/// What a reader must return for line number `line`, `piece` as the file holds it:
/// `parse_line_bytes` without a final `\r` and (on line 1) a byte-order mark.
fn one_line(mut piece: &[u8], line: u64) -> Option<Read> {
    if let Some(rest) = piece.strip_suffix(b"\r") {
        piece = rest;
    }
    if line == 1 {
        if let Some(rest) = piece.strip_prefix(b"\xEF\xBB\xBF") {
            piece = rest;
        }
    }
    match parse_line_bytes(piece) {
        Ok(None) => None,
        Ok(Some((op, spans))) => {
            let cols = columns(&spans, &op);
            Some(Read::Op(op, line, cols))
        }
        Err(e) => Some(Read::Err(line, e.column, e.message, e.expected)),
    }
}

/// What a reader must return for `data`: `parse_line_bytes` of each line, without its `\n`, a
/// final `\r`, and (on line 1) a byte-order mark.
pub fn line_by_line(data: &[u8]) -> Vec<Read> {
    let pieces = pieces(data);
    (1..)
        .zip(pieces)
        .filter_map(|(line, piece)| one_line(piece, line))
        .collect()
}

/// [`line_by_line`] with a line limit: a line longer than `limit` bytes (as in the file) is the
/// error `check_line_length` gives, whatever it holds.
pub fn line_by_line_limited(data: &[u8], limit: usize) -> Vec<Read> {
    let pieces = pieces(data);
    (1..)
        .zip(pieces)
        .filter_map(
            |(line, piece)| match check_line_length(piece, line == 1, limit) {
                Some(e) => Some(Read::Err(line, e.column, e.message, e.expected)),
                None => one_line(piece, line),
            },
        )
        .collect()
}

/// `TraceReader` over `data` as a whole file, with a large and with a tiny buffer, against
/// [`line_by_line`].
pub fn check_trace_reader(data: &[u8]) {
    let lines = data.iter().filter(|&&b| b == b'\n').count() + 1;
    let expected = line_by_line(data);
    let whole = read_all(TraceReader::new(data, "fuzz.jsonl"), lines);
    assert_eq!(
        whole, expected,
        "TraceReader (one buffer) against parse_line"
    );
    // A buffer of 1 to 16 bytes, chosen by the input, splits lines at varying places.
    let cap = 1 + data.first().map_or(0, |b| usize::from(*b) % 16);
    let small = read_all(
        TraceReader::new(BufReader::with_capacity(cap, data), "fuzz.jsonl"),
        lines,
    );
    assert_eq!(
        small, expected,
        "TraceReader (buffer of {cap}) against parse_line"
    );
    // A line limit of 8 to 71 bytes, chosen by the input, with the same small buffer: lines
    // past it are errors at the limit (and the reader goes on with the next line), the others
    // read as before.
    let limit = 8 + data.get(1).map_or(0, |b| usize::from(*b) % 64);
    let limited = read_all(
        TraceReader::new(BufReader::with_capacity(cap, data), "fuzz.jsonl").with_line_limit(limit),
        lines,
    );
    assert_eq!(
        limited,
        line_by_line_limited(data, limit),
        "TraceReader (buffer of {cap}, line limit {limit}) against parse_line"
    );
}

// ---------------------------------------------------------------------------------------------
// checker against oracle

/// At most this many ops per decoded program.
pub const MAX_OPS: usize = 40;

/// Reads decision bytes; past the end every byte is 0 and [`Bytes::done`] is true.
struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn below(&mut self, n: usize) -> usize {
        usize::from(self.byte()) % n.max(1)
    }

    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
}

/// What the decoder knows of a buffer name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Name {
    /// Not allocated yet: naming it makes an external buffer.
    Unused,
    /// Used without an allocation: an external buffer of unknown size.
    External,
    /// Allocated and not freed.
    Live(Buffer),
    /// Allocated, then freed: naming it is a use-after-free.
    Freed(Buffer),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Buffer {
    bytes: u64,
    memory: MemoryKind,
    /// The `addr` slot it occupies (while live), in `addr` mode.
    slot: Option<usize>,
}

/// Allocation sizes: zero, tiny, around the 512-byte rounding, a few KiB.
const SIZES: [u64; 8] = [0, 4, 16, 100, 512, 513, 1024, 4096];
/// `addr` slots per memory kind (1 MiB apart, larger than every size above).
const SLOTS: usize = 4;

/// What the decoder knows of CUDA graphs: captures underway (graph, streams), ended graphs,
/// and the events captured in a capture underway.
#[derive(Default)]
struct Graphs {
    on: bool,
    /// Lets bad input through now and then (the checker and the oracle must reject it alike).
    loose: bool,
    made: u32,
    captures: Vec<(Id, Vec<Id>)>,
    ended: Vec<Id>,
    events: Vec<(Id, Id)>,
    /// Blocking streams of device 0.
    blocking: Vec<Id>,
}

impl Graphs {
    fn capture_of(&self, s: &Id) -> Option<usize> {
        self.captures.iter().position(|(_, v)| v.contains(s))
    }

    fn captured_in(&self, e: &Id) -> Option<&Id> {
        self.events.iter().find(|(x, _)| x == e).map(|(_, g)| g)
    }

    /// Whether `op` is valid during the captures underway; updates what is captured.
    fn admit(&mut self, op: &Op, recorded: &[Id]) -> bool {
        if self.captures.is_empty() {
            return true;
        }
        let blocking = self
            .captures
            .iter()
            .any(|(_, v)| v.iter().any(|s| self.blocking.contains(s)));
        if blocking && op.on_stream().is_some_and(|s| s.as_str() == DEFAULT_STREAM) {
            return false;
        }
        match op {
            Op::EventRecord { event, stream } => {
                self.events.retain(|(e, _)| e != event);
                if let Some(c) = self.capture_of(stream) {
                    self.events
                        .push((event.clone(), self.captures[c].0.clone()));
                }
            }
            Op::EventWait { stream, event } => {
                match (self.capture_of(stream), self.captured_in(event).cloned()) {
                    (Some(c), Some(g)) => return self.captures[c].0 == g,
                    (Some(_), None) => return !recorded.contains(event),
                    (None, Some(g)) => {
                        if stream.as_str() == DEFAULT_STREAM {
                            return false;
                        }
                        if let Some(c) = self.captures.iter_mut().find(|(h, _)| *h == g) {
                            c.1.push(stream.clone());
                        }
                    }
                    (None, None) => {}
                }
            }
            Op::EventSync { event } | Op::EventQuery { event, .. } => {
                return self.captured_in(event).is_none()
            }
            Op::StreamSync { stream }
            | Op::StreamQuery { stream, .. }
            | Op::GraphLaunch { stream, .. }
            | Op::Free {
                stream: Some(stream),
                ..
            } => return self.capture_of(stream).is_none(),
            Op::DeviceSync { .. } => return false,
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.events.retain(|(e, _)| e != event);
            }
            _ => {}
        }
        true
    }
}

struct Decoder<'a> {
    bytes: Bytes<'a>,
    /// `"default"`, then `s1`, `s2`, … (2 to 4 streams).
    streams: Vec<Id>,
    /// The attributes of each stream for a redundant `stream_create`: (device, blocking).
    attrs: Vec<(u64, bool)>,
    names: Vec<Name>,
    addr_mode: bool,
    /// Which name holds each slot, per memory kind (device, pinned, managed).
    slots: [[Option<usize>; SLOTS]; 3],
    ops: Vec<TraceOp>,
    g: Graphs,
    /// Events recorded outside captures (and not reset since).
    recorded: Vec<Id>,
}

fn kind_index(m: MemoryKind) -> usize {
    match m {
        MemoryKind::Device => 0,
        MemoryKind::Pinned => 1,
        MemoryKind::Managed => 2,
    }
}

/// Decodes fuzzer bytes into a small program that the trace format calls well-formed: at most
/// [`MAX_OPS`] ops over 2 to 4 streams (`"default"` among them) and 1 to 4 buffer names, every
/// region inside its buffer, no live name allocated again, host accesses only of pinned or
/// managed memory, copies whose source and destination do not overlap, and (in `addr` mode)
/// addresses on every non-empty allocation that never overlap a live one. Hazards of every kind
/// are expected: nothing makes the program synchronized.
pub fn decode_program(data: &[u8]) -> Vec<TraceOp> {
    let mut bytes = Bytes { data, pos: 0 };
    let h0 = bytes.byte();
    let h1 = bytes.byte();
    let h2 = bytes.byte();
    let extra = 1 + usize::from(h0 % 3);
    let addr_mode = (h0 >> 2) & 3 == 0;
    let buffers = 1 + usize::from(h1 % 4);
    // Graph mode: captures, pools and replays (not with addr, whose slots pools do not know).
    let graphs = (h0 >> 4) & 1 == 1 && !addr_mode;
    let mut d = Decoder {
        bytes,
        streams: vec![Id::from(DEFAULT_STREAM)],
        attrs: vec![(0, true)],
        names: vec![Name::Unused; buffers],
        addr_mode,
        slots: [[None; SLOTS]; 3],
        ops: Vec::new(),
        g: Graphs {
            on: graphs,
            loose: (h0 >> 5) & 3 == 3,
            ..Graphs::default()
        },
        recorded: Vec::new(),
    };
    for i in 0..extra {
        let stream = Id::from(format!("s{}", i + 1));
        // 0: implicit (non-blocking, device 0); 1: created non-blocking; 2: blocking;
        // 3: device 1 (blocking in `addr` mode, where the allocator model is per device 0).
        let (device, blocking, create) = match (h2 >> (2 * i)) & 3 {
            0 => (0, false, false),
            1 => (0, false, true),
            3 if !addr_mode => (1, false, true),
            _ => (0, true, true),
        };
        if create {
            d.push(Op::StreamCreate {
                stream: stream.clone(),
                device,
                blocking,
            });
        }
        if blocking && device == 0 {
            d.g.blocking.push(stream.clone());
        }
        d.streams.push(stream);
        d.attrs.push((device, blocking));
    }
    while !d.bytes.done() && d.ops.len() < MAX_OPS {
        d.step();
    }
    d.ops
}

impl Decoder<'_> {
    fn push(&mut self, op: Op) {
        if self.g.on {
            let valid = self.g.admit(&op, &self.recorded);
            if !(valid || self.g.loose && self.bytes.byte() % 4 == 0) {
                return;
            }
            match &op {
                Op::EventRecord { event, stream } => {
                    self.recorded.retain(|e| e != event);
                    if self.g.capture_of(stream).is_none() {
                        self.recorded.push(event.clone());
                    }
                }
                Op::EventCreate { event } | Op::EventDestroy { event } => {
                    self.recorded.retain(|e| e != event)
                }
                _ => {}
            }
        }
        self.ops.push(TraceOp::from(op));
    }

    /// A graph step: begin or end a capture, fork a stream into one, launch a graph.
    fn graph_step(&mut self) {
        let b = self.bytes.byte();
        // Without a capture underway: begin one, or launch; with one: end it, fork a stream
        // into it, begin another, or launch.
        let action = match (self.g.captures.is_empty(), b % 4) {
            (true, 0 | 1) | (false, 2) => 0,
            (false, 0) => 1,
            (false, 1) => 2,
            _ => 3,
        };
        match action {
            0 if self.g.made < 3 => {
                let stream = self.stream();
                let free =
                    stream.as_str() != DEFAULT_STREAM && self.g.capture_of(&stream).is_none();
                if !free && !self.g.loose {
                    return;
                }
                let graph = Id::from(format!("g{}", self.g.made));
                self.g.made += 1;
                let pool = (self.bytes.byte() % 2 == 0).then(|| Id::from("p"));
                self.ops.push(TraceOp::from(Op::GraphBegin {
                    graph: graph.clone(),
                    stream: stream.clone(),
                    pool,
                }));
                if free {
                    self.g.captures.push((graph, vec![stream]));
                }
            }
            1 if !self.g.captures.is_empty() => {
                let c = self.bytes.below(self.g.captures.len());
                let (graph, streams) = self.g.captures[c].clone();
                // Join every forked stream into the origin, unless this program is loose.
                if !(self.g.loose && self.bytes.byte() % 2 == 0) {
                    for s in &streams[1..] {
                        self.push(Op::EventRecord {
                            event: Id::from("ej"),
                            stream: s.clone(),
                        });
                        self.push(Op::EventWait {
                            stream: streams[0].clone(),
                            event: Id::from("ej"),
                        });
                    }
                }
                self.ops.push(TraceOp::from(Op::GraphEnd {
                    graph: graph.clone(),
                }));
                self.g.captures.remove(c);
                self.g.events.retain(|(_, g)| *g != graph);
                self.g.ended.push(graph);
            }
            2 if !self.g.captures.is_empty() => {
                let c = self.bytes.below(self.g.captures.len());
                let streams = self.g.captures[c].1.clone();
                let from = streams[self.bytes.below(streams.len())].clone();
                let to = self.stream();
                let event = self.event();
                self.push(Op::EventRecord {
                    event: event.clone(),
                    stream: from,
                });
                self.push(Op::EventWait { stream: to, event });
            }
            _ => {
                let graph = match self.g.ended.len() {
                    0 if self.g.loose => Id::from(format!("g{}", self.bytes.below(3))),
                    0 => return,
                    n => self.g.ended[self.bytes.below(n)].clone(),
                };
                let stream = self.stream();
                self.push(Op::GraphLaunch { graph, stream });
            }
        }
    }

    fn stream(&mut self) -> Id {
        let k = self.bytes.below(self.streams.len());
        self.streams[k].clone()
    }

    fn event(&mut self) -> Id {
        Id::from(format!("e{}", self.bytes.below(3)))
    }

    fn name(&self, k: usize) -> Id {
        Id::from(format!("x{k}"))
    }

    /// A region of name `k`, inside its buffer (for an external buffer: a small range).
    fn region(&mut self, k: usize) -> Region {
        let name = self.name(k);
        let size = match self.names[k] {
            Name::Live(b) | Name::Freed(b) => Some(b.bytes),
            Name::Unused | Name::External => None,
        };
        if self.names[k] == Name::Unused {
            self.names[k] = Name::External;
        }
        let form = self.bytes.byte();
        match (form % 4, size) {
            (0 | 1, _) => Region::whole(name),
            (_, None) => {
                let offset = u64::from(self.bytes.byte() % 64);
                let bytes = u64::from(self.bytes.byte() % 64);
                if form % 4 == 2 {
                    Region::range(name, offset, bytes)
                } else {
                    Region {
                        buffer: name,
                        offset,
                        bytes: None,
                    }
                }
            }
            (_, Some(size)) => {
                let offset = u64::from(self.bytes.byte()) * size / 255;
                let rest = size - offset;
                let bytes = u64::from(self.bytes.byte()) * rest / 255;
                if form % 4 == 2 {
                    Region::range(name, offset, bytes)
                } else {
                    Region {
                        buffer: name,
                        offset,
                        bytes: None,
                    }
                }
            }
        }
    }

    fn regions(&mut self) -> Vec<Region> {
        let n = self.bytes.below(3);
        (0..n)
            .map(|_| {
                let k = self.bytes.below(self.names.len());
                self.region(k)
            })
            .collect()
    }

    /// A source and a destination that do not overlap: different names, or the two halves of one.
    fn copy_regions(&mut self) -> Option<(Region, Region)> {
        let a = self.bytes.below(self.names.len());
        let b = self.bytes.below(self.names.len());
        if a != b {
            let src = self.region(a);
            let dst = self.region(b);
            return Some((src, dst));
        }
        let size = match self.names[a] {
            Name::Live(buf) | Name::Freed(buf) => buf.bytes,
            Name::Unused | Name::External => {
                self.names[a] = Name::External;
                128
            }
        };
        if size < 2 {
            return None;
        }
        let half = size / 2;
        let (lo, hi) = (
            Region::range(self.name(a), 0, half),
            Region::range(self.name(a), half, size - half),
        );
        Some(if self.bytes.byte() % 2 == 0 {
            (lo, hi)
        } else {
            (hi, lo)
        })
    }

    fn alloc(&mut self, k: usize) {
        let bytes = SIZES[self.bytes.below(SIZES.len())];
        let memory = match self.bytes.byte() % 8 {
            0 => MemoryKind::Pinned,
            1 => MemoryKind::Managed,
            _ => MemoryKind::Device,
        };
        let stream = match self.bytes.byte() % 4 {
            0 => None,
            _ if memory != MemoryKind::Device => None,
            _ => Some(self.stream()),
        };
        let (addr, slot) = if self.addr_mode && bytes > 0 {
            let kind = kind_index(memory);
            let want = self.bytes.below(SLOTS);
            // At most 3 other names are live, so a free slot exists.
            let slot = (0..SLOTS)
                .map(|i| (want + i) % SLOTS)
                .find(|&s| self.slots[kind][s].is_none())
                .expect("a free slot");
            self.slots[kind][slot] = Some(k);
            let base = match memory {
                MemoryKind::Device => 0x10_0000,
                MemoryKind::Pinned => 0x4000_0000,
                MemoryKind::Managed => 0x5000_0000,
            };
            (Some(base + 0x10_0000 * slot as u64), Some(slot))
        } else {
            (None, None)
        };
        self.names[k] = Name::Live(Buffer {
            bytes,
            memory,
            slot,
        });
        self.push(Op::Alloc {
            buffer: self.name(k),
            bytes,
            stream,
            memory,
            addr,
            pool: None,
        });
    }

    fn free(&mut self, k: usize) {
        let stream = match self.bytes.byte() % 3 {
            0 => Some(self.stream()),
            _ => None,
        };
        // A stream-ordered free on a capturing stream (or on the legacy default stream while a
        // blocking stream captures) is bad input: a caching free instead.
        let stream = stream.filter(|s| {
            !self.g.on
                || self.g.admit(
                    &Op::Free {
                        buffer: Id::from(""),
                        stream: Some(s.clone()),
                    },
                    &[],
                )
        });
        if let Name::Live(b) = self.names[k] {
            if let Some(slot) = b.slot {
                self.slots[kind_index(b.memory)][slot] = None;
            }
            self.names[k] = Name::Freed(Buffer { slot: None, ..b });
        }
        // Freeing an unused, external or freed name is an `invalid-free`, not bad input.
        self.push(Op::Free {
            buffer: self.name(k),
            stream,
        });
    }

    /// A name the host may touch: pinned or managed, live or freed.
    fn host_name(&mut self) -> Option<usize> {
        let host: Vec<usize> = (0..self.names.len())
            .filter(|&k| {
                matches!(self.names[k], Name::Live(b) | Name::Freed(b)
                    if b.memory != MemoryKind::Device)
            })
            .collect();
        (!host.is_empty()).then(|| host[self.bytes.below(host.len())])
    }

    fn step(&mut self) {
        let sel = self.bytes.byte();
        if self.g.on && sel >= 200 {
            return self.graph_step();
        }
        match sel % 24 {
            0..=3 => {
                let stream = self.stream();
                let name = (self.bytes.byte() % 4 == 0).then(|| "k".to_owned());
                let reads = self.regions();
                let writes = self.regions();
                self.push(Op::Launch {
                    stream,
                    name: name.map(Into::into),
                    reads,
                    writes,
                });
            }
            4 | 5 => {
                let k = self.bytes.below(self.names.len());
                match self.names[k] {
                    Name::Live(_) => self.free(k),
                    _ => self.alloc(k),
                }
            }
            6 | 7 => {
                let stream = self.stream();
                match self.copy_regions() {
                    Some((src, dst)) => self.push(Op::Copy { stream, src, dst }),
                    None => {
                        let k = self.bytes.below(self.names.len());
                        let dst = self.region(k);
                        self.push(Op::Memset { stream, dst });
                    }
                }
            }
            8 => {
                let stream = self.stream();
                let k = self.bytes.below(self.names.len());
                let dst = self.region(k);
                self.push(Op::Memset { stream, dst });
            }
            v @ (9 | 10) => {
                if let Some(k) = self.host_name() {
                    let buffer = self.region(k);
                    self.push(if v == 9 {
                        Op::HostRead { buffer }
                    } else {
                        Op::HostWrite { buffer }
                    });
                }
            }
            11 | 12 => {
                let k = self.bytes.below(self.names.len());
                self.free(k);
            }
            13 => {
                let k = self.bytes.below(self.names.len());
                let stream = self.stream();
                if self.names[k] == Name::Unused {
                    self.names[k] = Name::External;
                }
                self.push(Op::RecordStream {
                    buffer: self.name(k),
                    stream,
                });
            }
            14 => {
                let event = self.event();
                self.push(Op::EventCreate { event });
            }
            15 => {
                let event = self.event();
                self.push(Op::EventDestroy { event });
            }
            16 | 17 => {
                let event = self.event();
                let stream = self.stream();
                self.push(Op::EventRecord { event, stream });
            }
            18 | 19 => {
                let stream = self.stream();
                let event = self.event();
                self.push(Op::EventWait { stream, event });
            }
            20 => {
                let event = self.event();
                let b = self.bytes.byte();
                self.push(if b % 2 == 0 {
                    Op::EventSync { event }
                } else {
                    Op::EventQuery {
                        event,
                        complete: b % 4 == 1,
                    }
                });
            }
            21 => {
                let stream = self.stream();
                let b = self.bytes.byte();
                self.push(if b % 2 == 0 {
                    Op::StreamSync { stream }
                } else {
                    Op::StreamQuery {
                        stream,
                        complete: b % 4 == 1,
                    }
                });
            }
            22 => {
                let device = u64::from(self.bytes.byte() % 4 == 0);
                self.push(Op::DeviceSync { device });
            }
            _ => {
                // A redundant stream_create: the same attributes, so it has no effect.
                let k = self.bytes.below(self.streams.len());
                if k > 0 {
                    let (device, blocking) = self.attrs[k];
                    let stream = self.streams[k].clone();
                    self.push(Op::StreamCreate {
                        stream,
                        device,
                        blocking,
                    });
                }
            }
        }
    }
}

/// A hazard reduced to what the checker and the oracle both decide: op, kind, buffer, the
/// conflicting ops, the captured op of a replay's hazard, and the conflicts that are replays as
/// (launch, captured).
pub type Key = (
    u64,
    HazardKind,
    Option<String>,
    Vec<u64>,
    Option<u64>,
    Vec<(u64, u64)>,
);

/// The checker's report on `ops` with `limits`, or its rejection.
pub fn checker_report(ops: &[TraceOp], limits: Limits) -> Result<Report, String> {
    let mut checker = Checker::with_limits(limits);
    for (i, op) in ops.iter().enumerate() {
        checker.check(op).map_err(|e| format!("op {i}: {e}"))?;
    }
    Ok(checker.finish())
}

/// The limits that take every other path of the checker's state: every history in its interval
/// index, every freed buffer buried entry by entry in the graveyard's interval index, a sweep of
/// what the host's clock covers whenever the history has grown.
pub const INDEXED: Limits = Limits {
    history_index_at: 0,
    small_freed_pages: 0,
    sweep_at: 0,
};

/// The checker's hazards as keys, or its rejection. The checker with [`INDEXED`] limits must
/// give the same report, to the byte.
pub fn checker_keys(ops: &[TraceOp]) -> Result<Vec<Key>, String> {
    let report = checker_report(ops, Limits::default())?;
    let indexed = checker_report(ops, INDEXED)
        .unwrap_or_else(|e| panic!("the indexed checker rejects what the flat one accepts: {e}"));
    assert!(
        report.to_json() == indexed.to_json(),
        "the indexed checker reports otherwise\n  flat    {}\n  indexed {}\nprogram:\n{}",
        report.to_json(),
        indexed.to_json(),
        to_jsonl(ops)
    );
    // The reports themselves must render.
    let _ = report.to_json();
    let _ = render_text(&report, &TextOptions::plain());
    let mut keys: Vec<Key> = report
        .hazards
        .into_iter()
        .map(|h| {
            let mut c: Vec<u64> = h.conflicts.iter().map(|c| c.op).collect();
            c.sort_unstable();
            c.dedup();
            let mut r: Vec<(u64, u64)> = h
                .conflicts
                .iter()
                .filter_map(|c| c.captured.map(|m| (c.op, m)))
                .collect();
            r.sort_unstable();
            r.dedup();
            let captured = h.access.as_ref().and_then(|a| a.captured);
            (h.op, h.kind, h.buffer, c, captured, r)
        })
        .collect();
    keys.sort();
    Ok(keys)
}

/// The oracle's hazards as keys, or its rejection.
pub fn oracle_keys(ops: &[TraceOp]) -> Result<Vec<Key>, String> {
    Ok(oracle_hazards(ops)?
        .into_iter()
        .map(|h: OracleHazard| (h.op, h.kind, h.buffer, h.conflicts, h.captured, h.replayed))
        .collect())
}

/// The program as a trace.
pub fn to_jsonl(ops: &[TraceOp]) -> String {
    let mut s = String::new();
    for op in ops {
        write_op(op, &mut s);
        s.push('\n');
    }
    s
}

/// The checker against the oracle on one program: both accept it and agree, or both reject it.
pub fn compare_program(ops: &[TraceOp]) {
    let checker = checker_keys(ops);
    let oracle = oracle_keys(ops);
    match (checker, oracle) {
        (Ok(c), Ok(o)) => assert!(
            c == o,
            "checker and oracle disagree\n  oracle  {o:?}\n  checker {c:?}\nprogram:\n{}",
            to_jsonl(ops)
        ),
        (Err(c), Err(o)) => {
            // Both reject it: the oracle, which may let some bad input pass, not before the
            // checker; with graphs, whose every rule both check, at the same op.
            let at = |e: &str| -> Option<u64> {
                e.strip_prefix("op ")?
                    .split(|ch: char| !ch.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            };
            let graphs = ops.iter().any(|o| o.op.is_graph_op());
            let (c_at, o_at) = (at(&c), at(&o));
            assert!(
                c_at.is_some() && o_at.is_some() && (o_at >= c_at) && (!graphs || o_at == c_at),
                "the checker and the oracle reject at different ops\n  checker {c}\n  oracle  {o}\nprogram:\n{}",
                to_jsonl(ops)
            );
        }
        (Err(e), Ok(_)) => panic!(
            "the checker rejects a program the oracle accepts: {e}\nprogram:\n{}",
            to_jsonl(ops)
        ),
        (Ok(_), Err(e)) => panic!(
            "the oracle rejects a program the checker accepts: {e}\nprogram:\n{}",
            to_jsonl(ops)
        ),
    }
}

/// Decodes `data` into a program and compares the checker with the oracle on it; the program
/// also survives writing and reading back.
pub fn check_checker_oracle(data: &[u8]) {
    let ops = decode_program(data);
    let text = to_jsonl(&ops);
    let back: Vec<TraceOp> = TraceReader::new(text.as_bytes(), "decoded.jsonl")
        .map(|r| r.map(|(op, _)| op))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("a decoded program does not read back: {e}\n{text}"));
    assert_eq!(back, ops, "a decoded program does not read back unchanged");
    compare_program(&ops);
}

// ---------------------------------------------------------------------------------------------
// fix

/// The bytes are decoded ([`decode_program`]) into a small well-formed program, which
/// `fix_program` fixes: the fixed program has no data-race, reuse-race or unsafe-free, keeps
/// every original op in order, and inserts at most two ops per hazard fixed. The dependency
/// graph explains every race of the original, ending with its missing edge.
pub fn check_fix(data: &[u8]) {
    use streamsan::fix::{fix_program, is_fixable};
    let ops = decode_program(data);
    if ops.iter().any(|o| o.op.is_graph_op()) {
        // Fixing the hazards of graph replays, and explaining them, is not done yet.
        return;
    }
    let Ok(f) = fix_program(&ops) else {
        // Decoded programs may be bad input for the checker; nothing to fix then.
        return;
    };
    let text = to_jsonl(&ops);
    let left: Vec<(u64, HazardKind)> = f
        .after
        .hazards
        .iter()
        .filter(|h| is_fixable(h.kind))
        .map(|h| (h.op, h.kind))
        .collect();
    assert!(left.is_empty(), "fix left {left:?}\n{text}");
    let kept: Vec<&TraceOp> = f
        .ops
        .iter()
        .enumerate()
        .filter(|(i, _)| !f.inserted_at.contains(i))
        .map(|(_, op)| op)
        .collect();
    assert!(
        kept.len() == ops.len() && kept.iter().zip(&ops).all(|(a, b)| *a == b),
        "fix lost or moved an op\n{text}"
    );
    assert!(
        f.summary.inserted <= 2 * f.summary.fixed,
        "{:?}\n{text}",
        f.summary
    );
    // Every race is explained, and the op an explanation says its later side is ordered after
    // ("up to op U") comes before the conflicting access ("not op A").
    let mut checker = Checker::new();
    for op in &ops {
        let _ = checker.check(op);
    }
    let implicit = checker.implicit_syncs().to_vec();
    // The graph's paths are the oracle's happens-before, for every pair of ops.
    if let Ok(paths) = streamsan::oracle::oracle_paths(&ops) {
        let cfg = streamsan::graph::GraphConfig {
            window: u64::MAX,
            ..Default::default()
        };
        let mut g = streamsan::graph::DepGraph::new(&f.before, cfg).with_implicit_syncs(&implicit);
        for (i, op) in ops.iter().enumerate() {
            g.add(i as u64, op);
        }
        for (x, before) in paths.iter().enumerate() {
            for a in 0..x {
                let oracle = before[a / 64] & (1 << (a % 64)) != 0;
                assert_eq!(
                    g.reaches(a as u64, x as u64),
                    Some(oracle),
                    "graph and oracle disagree on op {a} → op {x}\n{text}"
                );
            }
        }
    }
    let mut report = f.before.clone();
    streamsan::graph::explain_program(&ops, &mut report, &implicit, "decoded");
    for h in report.hazards.iter().filter(|h| is_fixable(h.kind)) {
        assert!(
            !h.detail.why.is_empty(),
            "unexplained {} at op {}\n{text}",
            h.kind,
            h.op
        );
        for line in &h.detail.why {
            let upto = line
                .split("up to op ")
                .nth(1)
                .and_then(|r| r.split(' ').next());
            let a = line.split(", not op ").nth(1);
            if let (Some(u), Some(a)) = (upto, a) {
                let (u, a): (u64, u64) = (u.parse().unwrap_or(0), a.parse().unwrap_or(0));
                assert!(u < a, "{line}\n{text}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// syncs

/// The bytes are decoded ([`decode_program`]) into a small well-formed program, and the
/// synchronization analysis of it equals the brute force's (`needed` and `prevents` of every
/// synchronization op): with every what-if kept to the end, with the checker's interval indexes
/// on every path ([`INDEXED`]), and with what-ifs given up at once or after one (each op then
/// decided by a re-check). The analysis leaves the report as the plain checker gives it.
pub fn check_syncs(data: &[u8]) {
    use streamsan::analysis::syncs::{analyze_with, brute_force, SyncChecker, SyncConfig};
    let ops = decode_program(data);
    let Ok((report, expected)) = brute_force(&ops) else {
        // Decoded programs may be bad input for the checker; nothing to analyse then.
        return;
    };
    let keep_all = SyncConfig {
        max_live: usize::MAX,
        max_host: usize::MAX,
    };
    // A what-if is given up, without limits, only where a graph's replay or pool would need
    // it: those ops are decided by a re-check.
    let graphs = ops.iter().any(|o| o.op.is_graph_op());
    for limits in [Limits::default(), INDEXED] {
        let mut checker = SyncChecker::with_config(Checker::with_limits(limits), keep_all);
        for op in &ops {
            checker
                .check(op)
                .unwrap_or_else(|e| panic!("the analysis rejects an accepted program: {e}"));
        }
        let mut outcome = checker.finish();
        assert!(
            graphs || outcome.undecided.is_empty(),
            "a what-if was given up"
        );
        streamsan::analysis::syncs::resolve(&mut outcome, |skipped, real| {
            streamsan::analysis::syncs::recheck(&ops, skipped, real)
        })
        .expect("accepted");
        assert!(
            outcome.report.to_json() == report.to_json(),
            "the analysis changed the report\n  plain    {}\n  analysis {}\nprogram:\n{}",
            report.to_json(),
            outcome.report.to_json(),
            to_jsonl(&ops)
        );
        assert!(
            outcome.syncs == expected,
            "the analysis and the brute force disagree ({limits:?})\n  brute force {}\n  analysis    {}\nprogram:\n{}",
            describe_syncs(&expected),
            describe_syncs(&outcome.syncs),
            to_jsonl(&ops)
        );
    }
    for (max_live, max_host) in [(0, 0), (1, 0), (2, 1)] {
        let config = SyncConfig { max_live, max_host };
        let (_, syncs) = analyze_with(&ops, config).expect("accepted");
        assert!(
            syncs == expected,
            "with what-ifs given up ({config:?}) the analysis and the brute force disagree\n  brute force {}\n  analysis    {}\nprogram:\n{}",
            describe_syncs(&expected),
            describe_syncs(&syncs),
            to_jsonl(&ops)
        );
    }
}

/// Verdicts in one line each: op, kind, needed, what it prevents.
pub fn describe_syncs(syncs: &[streamsan::analysis::syncs::SyncVerdict]) -> String {
    let mut s = String::new();
    for v in syncs {
        let prevents: Vec<String> = v.prevents.iter().map(|k| k.to_string()).collect();
        s.push_str(&format!(
            "\n    op {} {} {} [{}]",
            v.op,
            v.kind,
            if v.needed { "needed" } else { "redundant" },
            prevents.join(", ")
        ));
    }
    s
}
