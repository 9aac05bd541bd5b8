//! The trace model: ops, ids, regions and sites — the one language every part of streamsan speaks.
//!
//! A trace is a sequence of [`TraceOp`]s, numbered from 0 in issue order (the *op index*). The
//! normative definition is the trace format, version 1 (`docs/trace-format.md`): this module is
//! its Rust form. [`reader`] parses JSON Lines with located errors; [`writer`] writes ops back.

use std::fmt;

pub mod arbitrary;
pub mod reader;
pub mod writer;

pub use reader::{
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

/// One operation of a trace, without its site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `stream_create`: declares a stream with its attributes.
    StreamCreate {
        /// The stream.
        stream: Id,
        /// Its device (0 by default).
        device: u64,
        /// Whether it synchronizes with the legacy default stream (false by default).
        blocking: bool,
    },
    /// `alloc`: allocates `bytes` bytes through the allocator model.
    Alloc {
        /// The new buffer's name.
        buffer: Id,
        /// Requested size.
        bytes: u64,
        /// The owning stream of device memory (`"default"` when absent).
        stream: Option<Id>,
        /// The memory kind.
        memory: MemoryKind,
        /// The address a recorded program actually got, instead of the model's choice.
        addr: Option<u64>,
    },
    /// `free`: a caching free (no stream) or a stream-ordered free on `stream`.
    Free {
        /// The buffer.
        buffer: Id,
        /// The stream of a stream-ordered free (`cudaFreeAsync`).
        stream: Option<Id>,
    },
    /// `record_stream`: the freed memory is not reused before `stream`'s work up to the free ends.
    RecordStream {
        /// The buffer.
        buffer: Id,
        /// The stream whose work must finish first.
        stream: Id,
    },
    /// `launch`: a kernel on `stream`.
    Launch {
        /// The stream.
        stream: Id,
        /// The kernel's name, for reports (stored inline when short, like ids).
        name: Option<smol_str::SmolStr>,
        /// Regions the kernel reads.
        reads: Vec<Region>,
        /// Regions the kernel writes (a region both read and written counts as written).
        writes: Vec<Region>,
    },
    /// `copy`: an async memcpy from `src` to `dst` on `stream`.
    Copy {
        /// The stream.
        stream: Id,
        /// The source region (read).
        src: Region,
        /// The destination region (written).
        dst: Region,
    },
    /// `memset`: writes `dst` on `stream`.
    Memset {
        /// The stream.
        stream: Id,
        /// The destination region.
        dst: Region,
    },
    /// `host_read`: the host reads pinned or managed memory.
    HostRead {
        /// The region read.
        buffer: Region,
    },
    /// `host_write`: the host writes pinned or managed memory.
    HostWrite {
        /// The region written.
        buffer: Region,
    },
    /// `event_create`: creates the event, or resets it to never-recorded.
    EventCreate {
        /// The event.
        event: Id,
    },
    /// `event_destroy`: the event becomes never-recorded.
    EventDestroy {
        /// The event.
        event: Id,
    },
    /// `event_record`: the event captures the work issued on `stream` so far.
    EventRecord {
        /// The event.
        event: Id,
        /// The stream.
        stream: Id,
    },
    /// `event_wait`: later work on `stream` waits for the event's capture.
    EventWait {
        /// The waiting stream.
        stream: Id,
        /// The event.
        event: Id,
    },
    /// `event_sync`: the host waits for the event's capture.
    EventSync {
        /// The event.
        event: Id,
    },
    /// `event_query`: with `complete`, the same as `event_sync`; otherwise nothing.
    EventQuery {
        /// The event.
        event: Id,
        /// Whether the query reported completion.
        complete: bool,
    },
    /// `stream_sync`: the host waits for all work issued on `stream` so far.
    StreamSync {
        /// The stream.
        stream: Id,
    },
    /// `stream_query`: with `complete`, the same as `stream_sync`; otherwise nothing.
    StreamQuery {
        /// The stream.
        stream: Id,
        /// Whether the query reported completion.
        complete: bool,
    },
    /// `device_sync`: the host waits for all work issued on every stream of `device`.
    DeviceSync {
        /// The device (0 by default).
        device: u64,
    },
}

impl Op {
    /// The op's name as the trace format spells it (`"launch"`, `"event_wait"`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Op::StreamCreate { .. } => "stream_create",
            Op::Alloc { .. } => "alloc",
            Op::Free { .. } => "free",
            Op::RecordStream { .. } => "record_stream",
            Op::Launch { .. } => "launch",
            Op::Copy { .. } => "copy",
            Op::Memset { .. } => "memset",
            Op::HostRead { .. } => "host_read",
            Op::HostWrite { .. } => "host_write",
            Op::EventCreate { .. } => "event_create",
            Op::EventDestroy { .. } => "event_destroy",
            Op::EventRecord { .. } => "event_record",
            Op::EventWait { .. } => "event_wait",
            Op::EventSync { .. } => "event_sync",
            Op::EventQuery { .. } => "event_query",
            Op::StreamSync { .. } => "stream_sync",
            Op::StreamQuery { .. } => "stream_query",
            Op::DeviceSync { .. } => "device_sync",
        }
    }

    /// The stream of an op on a stream (rule 1 of the trace format: `launch`, `copy`, `memset`,
    /// `event_record`, `event_wait` and a stream-ordered `free`); `None` for the host's ops.
    pub fn on_stream(&self) -> Option<&Id> {
        match self {
            Op::Launch { stream, .. }
            | Op::Copy { stream, .. }
            | Op::Memset { stream, .. }
            | Op::EventRecord { stream, .. }
            | Op::EventWait { stream, .. }
            | Op::Free {
                stream: Some(stream),
                ..
            } => Some(stream),
            _ => None,
        }
    }

    /// The event an event op names.
    pub fn event(&self) -> Option<&Id> {
        match self {
            Op::EventCreate { event }
            | Op::EventDestroy { event }
            | Op::EventRecord { event, .. }
            | Op::EventWait { event, .. }
            | Op::EventSync { event }
            | Op::EventQuery { event, .. } => Some(event),
            _ => None,
        }
    }

    /// Every op name of the trace format, in the order the format lists them.
    pub const NAMES: &'static [&'static str] = &[
        "stream_create",
        "alloc",
        "free",
        "record_stream",
        "launch",
        "copy",
        "memset",
        "host_read",
        "host_write",
        "event_create",
        "event_destroy",
        "event_record",
        "event_wait",
        "event_sync",
        "event_query",
        "stream_sync",
        "stream_query",
        "device_sync",
    ];
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
}
