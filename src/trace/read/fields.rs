//! The reader's side of the op schema: keys and op names as the scanner compares them, the
//! values found in an op object ([`Fields`]) and the op built from them. Which fields each op
//! has, and which it requires, is [`crate::trace::schema`]'s.

use super::error::{bad, Bad, Scan};
use crate::trace::schema::{Key, Kind};
use crate::trace::{Id, MemoryKind, Op, Region, Site, TraceOp};

/// Up to 8 bytes as one integer, little-endian, to compare short names fast.
pub(super) const fn short(bytes: &[u8]) -> u64 {
    let mut word = 0;
    let mut i = 0;
    while i < bytes.len() && i < 8 {
        word |= (bytes[i] as u64) << (8 * i);
        i += 1;
    }
    word
}

/// Up to 15 bytes and their length as one integer, to compare names fast; 0 for longer texts.
pub(super) const fn pack(bytes: &[u8]) -> u128 {
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

/// The key whose name is `name` in its [`short`] form.
pub(super) fn key_from_name(name: u64) -> Option<Key> {
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
    const GRAPH: u64 = short(b"graph");
    const POOL: u64 = short(b"pool");
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
        GRAPH => Key::Graph,
        POOL => Key::Pool,
        _ => return None,
    })
}

/// The op whose name is `word` in its [`pack`]ed form.
#[inline]
pub(super) fn kind_from_word(word: u128) -> Option<Kind> {
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
    const GRAPH_BEGIN: u128 = pack(b"graph_begin");
    const GRAPH_END: u128 = pack(b"graph_end");
    const GRAPH_LAUNCH: u128 = pack(b"graph_launch");
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
        GRAPH_BEGIN => Kind::GraphBegin,
        GRAPH_END => Kind::GraphEnd,
        GRAPH_LAUNCH => Kind::GraphLaunch,
        _ => return None,
    })
}

/// The message of a missing required field `key` of op `kind`, at the object's position `obj`.
#[cold]
pub(super) fn missing(kind: Kind, key: Key, obj: usize) -> Bad {
    let message = format!(
        "missing field \"{}\" for op \"{}\"",
        key.name(),
        kind.name()
    );
    let expected = kind.field(key).map_or("a value", |f| f.ty.describe());
    bad(obj, message, Some(expected))
}

/// The values of an op object, as found.
#[derive(Default)]
pub(super) struct Fields {
    pub(super) stream: Option<Id>,
    pub(super) event: Option<Id>,
    pub(super) buffer: Option<Id>,
    pub(super) region: Option<Region>,
    pub(super) bytes: Option<u64>,
    pub(super) addr: Option<u64>,
    pub(super) addr_pos: usize,
    pub(super) memory: Option<MemoryKind>,
    pub(super) device: Option<u64>,
    pub(super) blocking: Option<bool>,
    pub(super) complete: Option<bool>,
    pub(super) name: Option<String>,
    pub(super) reads: Vec<Region>,
    pub(super) writes: Vec<Region>,
    pub(super) src: Option<Region>,
    pub(super) dst: Option<Region>,
    pub(super) site: Option<Site>,
    pub(super) graph: Option<Id>,
    pub(super) pool: Option<Id>,
}

/// `one of stream_create, alloc, …` with every op name.
pub(super) fn op_names() -> String {
    format!("one of {}", Op::NAMES.join(", "))
}

/// The op of `kind` from its fields; `obj` is the position of the object, for missing fields
/// (which the caller has checked against the schema already).
pub(super) fn build(kind: Kind, f: &mut Fields, obj: usize) -> Scan<TraceOp> {
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
                pool: f.pool.take(),
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
        Kind::GraphBegin => Op::GraphBegin {
            graph: f.graph.take().ok_or_else(|| missing(Key::Graph))?,
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
            pool: f.pool.take(),
        },
        Kind::GraphEnd => Op::GraphEnd {
            graph: f.graph.take().ok_or_else(|| missing(Key::Graph))?,
        },
        Kind::GraphLaunch => Op::GraphLaunch {
            graph: f.graph.take().ok_or_else(|| missing(Key::Graph))?,
            stream: f.stream.take().ok_or_else(|| missing(Key::Stream))?,
        },
    };
    Ok(TraceOp {
        op,
        site: f.site.take(),
    })
}
