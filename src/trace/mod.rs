//! The trace model: ops, ids, regions and sites — the one language every part of streamsan speaks.
//!
//! A trace is a sequence of [`TraceOp`]s, numbered from 0 in issue order (the *op index*). The
//! normative definition is the trace format, version 1 (`docs/trace-format.md`): this module is
//! its Rust form. [`read`] parses JSON Lines with located errors; [`writer`] writes ops back.

use std::fmt;

#[cfg(any(test, feature = "proptest"))]
pub mod arbitrary;
mod op;
pub mod read;
mod schema;
pub mod writer;

/// The reader's former path: [`read`].
#[doc(hidden)]
pub use read as reader;

pub use op::{Op, OpAccess, OpParticipant};

pub use read::{
    check_line_length, parse_line, parse_line_bytes, LineError, ParseError, Spans, TraceReader,
    MAX_LINE_BYTES,
};
pub use writer::{write_op, TraceWriter};

/// The identifier of a stream, event or buffer.
///
/// Traces may spell an id as a JSON string or a non-negative integer; `7` and `"7"` name the same
/// thing, so an id is kept as its string form. Short ids (up to 23 bytes) are stored inline and
/// every id clones in O(1), so ids cost no allocation on the hot path.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Id(smol_str::SmolStr);

impl Id {
    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<&str> for Id {
    fn from(s: &str) -> Self {
        Id(smol_str::SmolStr::new(s))
    }
}

impl From<String> for Id {
    fn from(s: String) -> Self {
        Id(smol_str::SmolStr::new(s))
    }
}

impl From<&String> for Id {
    fn from(s: &String) -> Self {
        Id(smol_str::SmolStr::new(s))
    }
}

impl From<std::borrow::Cow<'_, str>> for Id {
    fn from(s: std::borrow::Cow<'_, str>) -> Self {
        Id(smol_str::SmolStr::new(s))
    }
}

impl From<u64> for Id {
    fn from(n: u64) -> Self {
        Id(smol_str::format_smolstr!("{n}"))
    }
}

/// The reserved name of the host participant.
pub const HOST: &str = "host";
/// The name of the legacy default stream of device 0.
pub const DEFAULT_STREAM: &str = "default";

/// Where an op was issued: a label such as `"src/train.rs:42:9"`, or a stack, innermost frame first.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum Site {
    /// One label.
    Label(String),
    /// A stack of frames, innermost first.
    Stack(Vec<String>),
}

impl Site {
    /// The innermost frame: the label itself, or the first frame of a stack.
    pub fn innermost(&self) -> Option<&str> {
        match self {
            Site::Label(s) => Some(s),
            Site::Stack(v) => v.first().map(|s| s.as_str()),
        }
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Site::Label(s) => f.write_str(s),
            Site::Stack(v) => f.write_str(&v.join(" <- ")),
        }
    }
}

/// The kind of memory an allocation comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum MemoryKind {
    /// Device memory, served by the device caching allocator and owned by a stream.
    #[default]
    Device,
    /// Page-locked host memory, served by the host caching allocator and owned by the host.
    Pinned,
    /// Managed (unified) memory, served by the host caching allocator and owned by the host.
    Managed,
}

impl MemoryKind {
    /// The name the trace format uses.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryKind::Device => "device",
            MemoryKind::Pinned => "pinned",
            MemoryKind::Managed => "managed",
        }
    }

    /// A dense index (0, 1, 2), for tables kept per memory kind.
    pub fn index(self) -> usize {
        match self {
            MemoryKind::Device => 0,
            MemoryKind::Pinned => 1,
            MemoryKind::Managed => 2,
        }
    }

    /// Whether the host may touch this memory (`host_read`, `host_write`).
    pub fn host_accessible(self) -> bool {
        !matches!(self, MemoryKind::Device)
    }
}

/// A byte range of one buffer: the whole buffer, or `offset` and `bytes` within it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// The buffer.
    pub buffer: Id,
    /// First byte, relative to the buffer's start (0 by default).
    pub offset: u64,
    /// Length; `None` means "up to the end of the buffer".
    pub bytes: Option<u64>,
}

impl Region {
    /// The whole of `buffer`.
    pub fn whole(buffer: impl Into<Id>) -> Self {
        Region {
            buffer: buffer.into(),
            offset: 0,
            bytes: None,
        }
    }

    /// `bytes` bytes of `buffer` starting at `offset`.
    pub fn range(buffer: impl Into<Id>, offset: u64, bytes: u64) -> Self {
        Region {
            buffer: buffer.into(),
            offset,
            bytes: Some(bytes),
        }
    }

    /// Whether this is the bare form: the whole buffer from offset 0.
    pub fn is_whole(&self) -> bool {
        self.offset == 0 && self.bytes.is_none()
    }
}

/// An op with its optional site: one line of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceOp {
    /// The operation.
    pub op: Op,
    /// Where it was issued, echoed in reports as given.
    pub site: Option<Site>,
}

impl From<Op> for TraceOp {
    fn from(op: Op) -> Self {
        TraceOp { op, site: None }
    }
}

/// A field of an op, named so that errors found after parsing (a region past the end of its
/// buffer, a host access to device memory, …) can be located in the trace line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// The op object itself.
    Op,
    /// `stream`.
    Stream,
    /// `event`.
    Event,
    /// `buffer` (an id, or the region of `host_read` / `host_write`).
    Buffer,
    /// `bytes` of an `alloc`.
    Bytes,
    /// `addr` of an `alloc`.
    Addr,
    /// `memory` of an `alloc`.
    Memory,
    /// `device`.
    Device,
    /// `blocking` of a `stream_create`.
    Blocking,
    /// `src` of a `copy`.
    Src,
    /// `dst` of a `copy` or `memset`.
    Dst,
    /// The i-th entry of `reads`.
    Read(u32),
    /// The i-th entry of `writes`.
    Write(u32),
    /// `graph` of a graph op.
    Graph,
    /// `pool` of a `graph_begin`.
    Pool,
}
