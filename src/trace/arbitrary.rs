//! Proptest strategies for arbitrary trace ops: every op, every field form.
//!
//! The ops are arbitrary in their syntax, not meaningful as programs: ids are drawn from short
//! names, integer-looking strings and arbitrary Unicode (quotes, backslashes and control
//! characters included); regions come in both forms; sites as labels and as stacks. What they
//! always satisfy is what the reader checks one line at a time: no stream is `"host"`, and no
//! `offset + bytes` or `addr + bytes` overflows. So `parse_line` of `write_op` of any of them gives
//! it back.

use proptest::prelude::*;

use super::{Id, MemoryKind, Op, Region, Site, TraceOp, HOST};

/// Text for ids, names and sites: short ASCII names, decimal numbers, or any characters.
pub fn arb_text() -> impl Strategy<Value = String> {
    let tricky = prop_oneof![
        any::<char>(),
        prop::sample::select(vec![
            '"', '\\', '/', '\n', '\r', '\t', '\0', '\u{1f}', '\u{7f}'
        ]),
        prop::sample::select(vec!['é', '\u{2028}', '\u{feff}', '😀', 'ß', '中']),
    ];
    prop_oneof![
        3 => (prop::sample::select(vec!["s", "b", "e", "t", "buf", ""]), 0u32..16)
            .prop_map(|(prefix, n)| format!("{prefix}{n}")),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        2 => prop::collection::vec(tricky, 0..8).prop_map(|chars| chars.into_iter().collect()),
    ]
}

/// Any id.
pub fn arb_id() -> impl Strategy<Value = Id> {
    arb_text().prop_map(Id::from)
}

/// A stream id: any id but `"host"`, often `"default"`.
pub fn arb_stream() -> impl Strategy<Value = Id> {
    prop_oneof![
        1 => Just(Id::from(super::DEFAULT_STREAM)),
        4 => arb_id().prop_filter("\"host\" is not a stream", |id| id.as_str() != HOST),
    ]
}

/// An integer, often small, sometimes at the ends of the range.
pub fn arb_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..5000,
        2 => any::<u64>(),
        1 => Just(u64::MAX),
        1 => Just(0u64),
    ]
}

/// A region of either form whose `offset + bytes` fits in 64 bits.
pub fn arb_region() -> impl Strategy<Value = Region> {
    prop_oneof![
        arb_id().prop_map(Region::whole),
        (arb_id(), arb_u64(), prop::option::of(arb_u64())).prop_map(|(buffer, offset, bytes)| {
            let bytes = bytes.map(|b| b.min(u64::MAX - offset));
            Region {
                buffer,
                offset,
                bytes,
            }
        }),
    ]
}

/// A site: a label or a stack of frames.
pub fn arb_site() -> impl Strategy<Value = Site> {
    prop_oneof![
        arb_text().prop_map(Site::Label),
        prop::collection::vec(arb_text(), 0..4).prop_map(Site::Stack),
    ]
}

/// A memory kind.
pub fn arb_memory() -> impl Strategy<Value = MemoryKind> {
    prop_oneof![
        Just(MemoryKind::Device),
        Just(MemoryKind::Pinned),
        Just(MemoryKind::Managed)
    ]
}

/// Any op, every variant equally likely.
pub fn arb_op() -> impl Strategy<Value = Op> {
    let regions = || prop::collection::vec(arb_region(), 0..4);
    let alloc = (
        arb_id(),
        arb_u64(),
        prop::option::of(arb_stream()),
        arb_memory(),
        prop::option::of(arb_id()),
    )
        .prop_flat_map(|(buffer, bytes, stream, memory, pool)| {
            let addr = prop::option::of(0..=u64::MAX - bytes);
            addr.prop_map(move |addr| Op::Alloc {
                buffer: buffer.clone(),
                bytes,
                stream: stream.clone(),
                memory,
                addr,
                pool: pool.clone(),
            })
        });
    prop_oneof![
        (arb_stream(), arb_u64(), any::<bool>()).prop_map(|(stream, device, blocking)| {
            Op::StreamCreate {
                stream,
                device,
                blocking,
            }
        }),
        alloc,
        (arb_id(), prop::option::of(arb_stream()))
            .prop_map(|(buffer, stream)| Op::Free { buffer, stream }),
        (arb_id(), arb_stream()).prop_map(|(buffer, stream)| Op::RecordStream { buffer, stream }),
        (
            arb_stream(),
            prop::option::of(arb_text()),
            regions(),
            regions()
        )
            .prop_map(|(stream, name, reads, writes)| Op::Launch {
                stream,
                name: name.map(Into::into),
                reads,
                writes
            }),
        (arb_stream(), arb_region(), arb_region()).prop_map(|(stream, src, dst)| Op::Copy {
            stream,
            src,
            dst
        }),
        (arb_stream(), arb_region()).prop_map(|(stream, dst)| Op::Memset { stream, dst }),
        arb_region().prop_map(|buffer| Op::HostRead { buffer }),
        arb_region().prop_map(|buffer| Op::HostWrite { buffer }),
        arb_id().prop_map(|event| Op::EventCreate { event }),
        arb_id().prop_map(|event| Op::EventDestroy { event }),
        (arb_id(), arb_stream()).prop_map(|(event, stream)| Op::EventRecord { event, stream }),
        (arb_stream(), arb_id()).prop_map(|(stream, event)| Op::EventWait { stream, event }),
        arb_id().prop_map(|event| Op::EventSync { event }),
        (arb_id(), any::<bool>()).prop_map(|(event, complete)| Op::EventQuery { event, complete }),
        arb_stream().prop_map(|stream| Op::StreamSync { stream }),
        (arb_stream(), any::<bool>())
            .prop_map(|(stream, complete)| Op::StreamQuery { stream, complete }),
        arb_u64().prop_map(|device| Op::DeviceSync { device }),
        (arb_id(), arb_stream(), prop::option::of(arb_id())).prop_map(|(graph, stream, pool)| {
            Op::GraphBegin {
                graph,
                stream,
                pool,
            }
        }),
        arb_id().prop_map(|graph| Op::GraphEnd { graph }),
        (arb_id(), arb_stream()).prop_map(|(graph, stream)| Op::GraphLaunch { graph, stream }),
    ]
}

/// Any op with or without a site.
pub fn arb_trace_op() -> impl Strategy<Value = TraceOp> {
    (arb_op(), prop::option::of(arb_site())).prop_map(|(op, site)| TraceOp { op, site })
}
