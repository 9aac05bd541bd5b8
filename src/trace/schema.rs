//! The fields of each op, described once: which fields an op has, in the order the trace format
//! lists them, whether each is required, and what its value is.
//!
//! The reader's "unknown field" and "missing field" errors and the writer's field order both
//! come from this table ([`Kind::fields`]); [`Op::value`] gives an op's value of a field by its
//! key. `site` belongs to every op and comes last; `op` comes first. The reader's fast path
//! expects lines in the writer's order, and its tests check that every line the writer writes
//! takes it.

use super::{Field, Id, MemoryKind, Op, Region};

/// What the format expects of an integer.
pub(crate) const INTEGER: &str = "an integer from 0 to 18446744073709551615";
/// What the format expects of an id.
pub(crate) const ID: &str = "a string or an integer from 0 to 18446744073709551615";
/// What the format expects of a region.
pub(crate) const REGION: &str =
    "a region: a buffer id or {\"buffer\": B, \"offset\": O, \"bytes\": N}";

/// A key of an op object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    Op,
    Stream,
    Event,
    Buffer,
    Bytes,
    Addr,
    Memory,
    Device,
    Blocking,
    Complete,
    Name,
    Reads,
    Writes,
    Src,
    Dst,
    Site,
    Graph,
    Pool,
}

impl Key {
    /// Every key, in declaration order (`Key::X as usize` is its index).
    #[cfg(test)]
    pub(crate) const ALL: [Key; 18] = [
        Key::Op,
        Key::Stream,
        Key::Event,
        Key::Buffer,
        Key::Bytes,
        Key::Addr,
        Key::Memory,
        Key::Device,
        Key::Blocking,
        Key::Complete,
        Key::Name,
        Key::Reads,
        Key::Writes,
        Key::Src,
        Key::Dst,
        Key::Site,
        Key::Graph,
        Key::Pool,
    ];

    /// The key as the trace format spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Key::Op => "op",
            Key::Stream => "stream",
            Key::Event => "event",
            Key::Buffer => "buffer",
            Key::Bytes => "bytes",
            Key::Addr => "addr",
            Key::Memory => "memory",
            Key::Device => "device",
            Key::Blocking => "blocking",
            Key::Complete => "complete",
            Key::Name => "name",
            Key::Reads => "reads",
            Key::Writes => "writes",
            Key::Src => "src",
            Key::Dst => "dst",
            Key::Site => "site",
            Key::Graph => "graph",
            Key::Pool => "pool",
        }
    }

    /// The key's bit in a set of keys.
    pub(crate) const fn bit(self) -> u32 {
        1 << self as u32
    }

    /// The field that [`Spans`](super::Spans) locates for this key: `reads` and `writes` keep a
    /// column per entry, `op` is the object, `complete`, `name` and `site` keep none.
    #[inline(always)]
    pub(crate) fn field(self) -> Option<Field> {
        Some(match self {
            Key::Stream => Field::Stream,
            Key::Event => Field::Event,
            Key::Buffer => Field::Buffer,
            Key::Bytes => Field::Bytes,
            Key::Addr => Field::Addr,
            Key::Memory => Field::Memory,
            Key::Device => Field::Device,
            Key::Blocking => Field::Blocking,
            Key::Src => Field::Src,
            Key::Dst => Field::Dst,
            Key::Graph => Field::Graph,
            Key::Pool => Field::Pool,
            Key::Op | Key::Complete | Key::Name | Key::Reads | Key::Writes | Key::Site => {
                return None
            }
        })
    }
}

/// What a field's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Type {
    /// A stream id (never `"host"`).
    Stream,
    /// An event id.
    Event,
    /// A buffer id.
    Buffer,
    /// A graph id.
    Graph,
    /// A memory pool id.
    Pool,
    /// A region: a buffer id, or `{"buffer": B, "offset": O, "bytes": N}`.
    Region,
    /// An array of regions.
    Regions,
    /// A byte count.
    Bytes,
    /// An integer from 0 to 2^64 − 1.
    Integer,
    /// `true` or `false`.
    Bool,
    /// A memory kind: `"device"`, `"pinned"` or `"managed"`.
    Memory,
    /// A string.
    Text,
}

impl Type {
    /// What a value of this type is, for the message about a missing one.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Type::Stream => "a stream id",
            Type::Event => "an event id",
            Type::Buffer => "a buffer id",
            Type::Graph => "a graph id",
            Type::Pool => "a pool id",
            Type::Region => REGION,
            Type::Regions => "an array of regions",
            Type::Bytes => "a byte count",
            Type::Integer => INTEGER,
            Type::Bool => "a boolean",
            Type::Memory => "one of device, pinned, managed",
            Type::Text => "a string",
        }
    }
}

/// Whether a field must be given, and what its absence means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// The op must have it.
    Required,
    /// It may be absent, and its absence means something of its own (the `stream` of an
    /// `alloc` or a `free`, `addr`, `pool`, a launch's `name`).
    Optional,
    /// Absent means its default: `device` 0, `blocking` false, `memory` device, no `reads` or
    /// `writes`. The writer leaves it out at its default.
    Defaulted,
}

/// One field of an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FieldSpec {
    /// Its key.
    pub(crate) key: Key,
    /// What its value is.
    pub(crate) ty: Type,
    /// Whether it must be given.
    pub(crate) need: Need,
}

const fn req(key: Key, ty: Type) -> FieldSpec {
    FieldSpec {
        key,
        ty,
        need: Need::Required,
    }
}

const fn opt(key: Key, ty: Type) -> FieldSpec {
    FieldSpec {
        key,
        ty,
        need: Need::Optional,
    }
}

const fn dflt(key: Key, ty: Type) -> FieldSpec {
    FieldSpec {
        key,
        ty,
        need: Need::Defaulted,
    }
}

/// An op of the format, in the order of [`Op::NAMES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    StreamCreate,
    Alloc,
    Free,
    RecordStream,
    Launch,
    Copy,
    Memset,
    HostRead,
    HostWrite,
    EventCreate,
    EventDestroy,
    EventRecord,
    EventWait,
    EventSync,
    EventQuery,
    StreamSync,
    StreamQuery,
    DeviceSync,
    GraphBegin,
    GraphEnd,
    GraphLaunch,
}

use Key as K;
use Type as T;

/// The fields of each op (besides `op` and `site`), in the order the format lists them, indexed
/// by [`Kind`].
const FIELDS: [&[FieldSpec]; 21] = [
    // stream_create
    &[
        req(K::Stream, T::Stream),
        dflt(K::Device, T::Integer),
        dflt(K::Blocking, T::Bool),
    ],
    // alloc
    &[
        req(K::Buffer, T::Buffer),
        req(K::Bytes, T::Bytes),
        opt(K::Stream, T::Stream),
        dflt(K::Memory, T::Memory),
        opt(K::Addr, T::Integer),
        opt(K::Pool, T::Pool),
    ],
    // free
    &[req(K::Buffer, T::Buffer), opt(K::Stream, T::Stream)],
    // record_stream
    &[req(K::Buffer, T::Buffer), req(K::Stream, T::Stream)],
    // launch
    &[
        req(K::Stream, T::Stream),
        opt(K::Name, T::Text),
        dflt(K::Reads, T::Regions),
        dflt(K::Writes, T::Regions),
    ],
    // copy
    &[
        req(K::Stream, T::Stream),
        req(K::Src, T::Region),
        req(K::Dst, T::Region),
    ],
    // memset
    &[req(K::Stream, T::Stream), req(K::Dst, T::Region)],
    // host_read
    &[req(K::Buffer, T::Region)],
    // host_write
    &[req(K::Buffer, T::Region)],
    // event_create
    &[req(K::Event, T::Event)],
    // event_destroy
    &[req(K::Event, T::Event)],
    // event_record
    &[req(K::Event, T::Event), req(K::Stream, T::Stream)],
    // event_wait
    &[req(K::Stream, T::Stream), req(K::Event, T::Event)],
    // event_sync
    &[req(K::Event, T::Event)],
    // event_query
    &[req(K::Event, T::Event), req(K::Complete, T::Bool)],
    // stream_sync
    &[req(K::Stream, T::Stream)],
    // stream_query
    &[req(K::Stream, T::Stream), req(K::Complete, T::Bool)],
    // device_sync
    &[dflt(K::Device, T::Integer)],
    // graph_begin
    &[
        req(K::Graph, T::Graph),
        req(K::Stream, T::Stream),
        opt(K::Pool, T::Pool),
    ],
    // graph_end
    &[req(K::Graph, T::Graph)],
    // graph_launch
    &[req(K::Graph, T::Graph), req(K::Stream, T::Stream)],
];

/// The keys each op accepts: its fields, `op` and `site`.
const ALLOWED: [u32; 21] = {
    let mut allowed = [0u32; 21];
    let mut op = 0;
    while op < FIELDS.len() {
        let mut mask = Key::Op.bit() | Key::Site.bit();
        let mut i = 0;
        while i < FIELDS[op].len() {
            mask |= FIELDS[op][i].key.bit();
            i += 1;
        }
        allowed[op] = mask;
        op += 1;
    }
    allowed
};

/// The keys each op requires.
const REQUIRED: [u32; 21] = {
    let mut required = [0u32; 21];
    let mut op = 0;
    while op < FIELDS.len() {
        let mut i = 0;
        while i < FIELDS[op].len() {
            if matches!(FIELDS[op][i].need, Need::Required) {
                required[op] |= FIELDS[op][i].key.bit();
            }
            i += 1;
        }
        op += 1;
    }
    required
};

impl Kind {
    /// The op's name as the trace format spells it.
    pub(crate) fn name(self) -> &'static str {
        Op::NAMES[self as usize]
    }

    /// The op's fields besides `op` and `site`, in the order the format lists them.
    pub(crate) fn fields(self) -> &'static [FieldSpec] {
        FIELDS[self as usize]
    }

    /// The field `key` of this op, if it has one (`op` and `site` are not in the table).
    pub(crate) fn field(self, key: Key) -> Option<&'static FieldSpec> {
        self.fields().iter().find(|f| f.key == key)
    }

    /// The keys the op accepts, `op` and `site` included, as a set of [`Key::bit`]s.
    pub(crate) fn allowed(self) -> u32 {
        ALLOWED[self as usize]
    }

    /// The first required field, in the format's order, whose key is not in `seen` (a set of
    /// [`Key::bit`]s).
    pub(crate) fn first_missing(self, seen: u32) -> Option<&'static FieldSpec> {
        if REQUIRED[self as usize] & !seen == 0 {
            return None;
        }
        self.fields()
            .iter()
            .find(|f| f.need == Need::Required && seen & f.key.bit() == 0)
    }

    /// The names of the keys the op accepts besides `op`, in order: `one of stream, site`.
    pub(crate) fn expected_keys(self) -> String {
        let names: Vec<&str> = self
            .fields()
            .iter()
            .map(|f| f.key.name())
            .chain([Key::Site.name()])
            .collect();
        format!("one of {}", names.join(", "))
    }
}

/// The value of one field of an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    /// A stream, event or buffer id.
    Id(&'a Id),
    /// An integer.
    Int(u64),
    /// A boolean.
    Bool(bool),
    /// A memory kind.
    Memory(MemoryKind),
    /// A region.
    Region(&'a Region),
    /// A list of regions.
    Regions(&'a [Region]),
    /// A string.
    Text(&'a str),
}

impl Value<'_> {
    /// Whether this is the value a [`Need::Defaulted`] field has when absent.
    pub(crate) fn is_default(self) -> bool {
        match self {
            Value::Int(n) => n == 0,
            Value::Bool(b) => !b,
            Value::Memory(m) => m == MemoryKind::default(),
            Value::Regions(r) => r.is_empty(),
            Value::Id(_) | Value::Region(_) | Value::Text(_) => false,
        }
    }
}

impl Op {
    /// The op's kind, the index of its row in the schema.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Op::StreamCreate { .. } => Kind::StreamCreate,
            Op::Alloc { .. } => Kind::Alloc,
            Op::Free { .. } => Kind::Free,
            Op::RecordStream { .. } => Kind::RecordStream,
            Op::Launch { .. } => Kind::Launch,
            Op::Copy { .. } => Kind::Copy,
            Op::Memset { .. } => Kind::Memset,
            Op::HostRead { .. } => Kind::HostRead,
            Op::HostWrite { .. } => Kind::HostWrite,
            Op::EventCreate { .. } => Kind::EventCreate,
            Op::EventDestroy { .. } => Kind::EventDestroy,
            Op::EventRecord { .. } => Kind::EventRecord,
            Op::EventWait { .. } => Kind::EventWait,
            Op::EventSync { .. } => Kind::EventSync,
            Op::EventQuery { .. } => Kind::EventQuery,
            Op::StreamSync { .. } => Kind::StreamSync,
            Op::StreamQuery { .. } => Kind::StreamQuery,
            Op::DeviceSync { .. } => Kind::DeviceSync,
            Op::GraphBegin { .. } => Kind::GraphBegin,
            Op::GraphEnd { .. } => Kind::GraphEnd,
            Op::GraphLaunch { .. } => Kind::GraphLaunch,
        }
    }

    /// The op's value of field `key`: `None` when the op has no such field, or an optional one
    /// ([`Need::Optional`]) is absent. A defaulted field always has its value.
    pub(crate) fn value(&self, key: Key) -> Option<Value<'_>> {
        use Value as V;
        Some(match (self, key) {
            (Op::StreamCreate { stream, .. }, K::Stream) => V::Id(stream),
            (Op::StreamCreate { device, .. }, K::Device) => V::Int(*device),
            (Op::StreamCreate { blocking, .. }, K::Blocking) => V::Bool(*blocking),
            (Op::Alloc { buffer, .. }, K::Buffer) => V::Id(buffer),
            (Op::Alloc { bytes, .. }, K::Bytes) => V::Int(*bytes),
            (Op::Alloc { stream, .. }, K::Stream) => V::Id(stream.as_ref()?),
            (Op::Alloc { memory, .. }, K::Memory) => V::Memory(*memory),
            (Op::Alloc { addr, .. }, K::Addr) => V::Int((*addr)?),
            (Op::Alloc { pool, .. }, K::Pool) => V::Id(pool.as_ref()?),
            (Op::Free { buffer, .. }, K::Buffer) => V::Id(buffer),
            (Op::Free { stream, .. }, K::Stream) => V::Id(stream.as_ref()?),
            (Op::RecordStream { buffer, .. }, K::Buffer) => V::Id(buffer),
            (Op::RecordStream { stream, .. }, K::Stream) => V::Id(stream),
            (Op::Launch { stream, .. }, K::Stream) => V::Id(stream),
            (Op::Launch { name, .. }, K::Name) => V::Text(name.as_deref()?),
            (Op::Launch { reads, .. }, K::Reads) => V::Regions(reads),
            (Op::Launch { writes, .. }, K::Writes) => V::Regions(writes),
            (Op::Copy { stream, .. }, K::Stream) => V::Id(stream),
            (Op::Copy { src, .. }, K::Src) => V::Region(src),
            (Op::Copy { dst, .. }, K::Dst) => V::Region(dst),
            (Op::Memset { stream, .. }, K::Stream) => V::Id(stream),
            (Op::Memset { dst, .. }, K::Dst) => V::Region(dst),
            (Op::HostRead { buffer } | Op::HostWrite { buffer }, K::Buffer) => V::Region(buffer),
            (
                Op::EventCreate { event }
                | Op::EventDestroy { event }
                | Op::EventRecord { event, .. }
                | Op::EventWait { event, .. }
                | Op::EventSync { event }
                | Op::EventQuery { event, .. },
                K::Event,
            ) => V::Id(event),
            (
                Op::EventRecord { stream, .. }
                | Op::EventWait { stream, .. }
                | Op::StreamSync { stream }
                | Op::StreamQuery { stream, .. },
                K::Stream,
            ) => V::Id(stream),
            (Op::EventQuery { complete, .. } | Op::StreamQuery { complete, .. }, K::Complete) => {
                V::Bool(*complete)
            }
            (Op::DeviceSync { device }, K::Device) => V::Int(*device),
            (
                Op::GraphBegin { graph, .. }
                | Op::GraphEnd { graph }
                | Op::GraphLaunch { graph, .. },
                K::Graph,
            ) => V::Id(graph),
            (Op::GraphBegin { stream, .. } | Op::GraphLaunch { stream, .. }, K::Stream) => {
                V::Id(stream)
            }
            (Op::GraphBegin { pool, .. }, K::Pool) => V::Id(pool.as_ref()?),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::arbitrary::arb_op;
    use proptest::prelude::*;

    #[test]
    fn one_row_per_op_name() {
        assert_eq!(FIELDS.len(), Op::NAMES.len());
        for (i, k) in Key::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
        // No key twice in a row, and `op` and `site` in none.
        for fields in FIELDS {
            for (i, f) in fields.iter().enumerate() {
                assert!(!matches!(f.key, Key::Op | Key::Site));
                assert!(fields[..i].iter().all(|g| g.key != f.key));
            }
        }
    }

    proptest! {
        /// An op has a value exactly for the fields its row lists: always for required and
        /// defaulted ones, and the kind names the op.
        #[test]
        fn values_follow_the_schema(op in arb_op()) {
            let kind = op.kind();
            prop_assert_eq!(kind.name(), op.name());
            for key in Key::ALL {
                let value = op.value(key);
                match kind.field(key) {
                    None => prop_assert!(value.is_none(), "{:?} of {:?}", key, op),
                    Some(f) if f.need != Need::Optional => {
                        prop_assert!(value.is_some(), "{:?} of {:?}", key, op)
                    }
                    Some(_) => {}
                }
            }
        }
    }
}
