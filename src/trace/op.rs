//! [`Op`]: one operation of a trace, and the questions every part of streamsan asks of it —
//! its participant, the stream and the event it names, the regions it accesses and how,
//! whether it synchronizes — answered here once, from the trace format's rules.

use super::{Id, MemoryKind, Region};

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
        /// The CUDA graph memory pool the device memory comes from outside a capture (PyTorch's
        /// allocations routed to a graph's private pool, as cudagraph trees do in their
        /// warm-up), in the namespace of [`Op::GraphBegin`]'s `pool`; `None`: the plain device
        /// allocator, or on a capturing stream the capture's pool.
        pool: Option<Id>,
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
    /// `graph_begin`: the host starts capturing `graph` on `stream`, its origin.
    GraphBegin {
        /// The graph.
        graph: Id,
        /// The origin: the stream whose work (and that of the streams that join it) is captured.
        stream: Id,
        /// The memory pool of the capture's allocations (by default a private pool named after
        /// the graph).
        pool: Option<Id>,
    },
    /// `graph_end`: the capture of `graph` ends; the graph can be launched from now on.
    GraphEnd {
        /// The graph.
        graph: Id,
    },
    /// `graph_launch`: replays the captured work of `graph` on `stream`.
    GraphLaunch {
        /// The graph.
        graph: Id,
        /// The stream it is launched on.
        stream: Id,
    },
}

impl Op {
    /// The op's name as the trace format spells it (`"launch"`, `"event_wait"`, …).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The participant the op belongs to (rule 1 of the trace format): the stream of `launch`,
    /// `copy`, `memset`, `event_record`, `event_wait`, a stream-ordered `free` and a
    /// `graph_launch`; the host for every other op. (A replay's accesses belong to the graph's
    /// participants `G/c`, not to the launch stream: see the checker.)
    #[inline]
    pub fn participant(&self) -> OpParticipant<'_> {
        match self.on_stream() {
            Some(stream) => OpParticipant::Stream(stream),
            None => OpParticipant::Host,
        }
    }

    /// The stream of an op on a stream (rule 1 of the trace format: `launch`, `copy`, `memset`,
    /// `event_record`, `event_wait`, a stream-ordered `free`, and `graph_launch`, which the format
    /// makes an op on its stream); `None` for the host's ops.
    #[inline]
    pub fn on_stream(&self) -> Option<&Id> {
        match self {
            Op::Launch { stream, .. }
            | Op::Copy { stream, .. }
            | Op::Memset { stream, .. }
            | Op::EventRecord { stream, .. }
            | Op::EventWait { stream, .. }
            | Op::GraphLaunch { stream, .. }
            | Op::Free {
                stream: Some(stream),
                ..
            } => Some(stream),
            _ => None,
        }
    }

    /// The stream the op names, in whatever role: the stream it is on ([`Op::on_stream`]), the
    /// stream a `stream_create` declares, a `stream_sync` or `stream_query` waits for, a
    /// `record_stream` names, an `alloc` gives as the owner, or a `graph_begin` captures on.
    /// `None` when it names none (an `alloc` without `stream` is owned by `"default"`, but does
    /// not name it).
    pub fn stream(&self) -> Option<&Id> {
        match self {
            Op::GraphBegin { stream, .. } | Op::GraphLaunch { stream, .. } => Some(stream),
            Op::StreamCreate { stream, .. }
            | Op::RecordStream { stream, .. }
            | Op::Launch { stream, .. }
            | Op::Copy { stream, .. }
            | Op::Memset { stream, .. }
            | Op::EventRecord { stream, .. }
            | Op::EventWait { stream, .. }
            | Op::StreamSync { stream }
            | Op::StreamQuery { stream, .. } => Some(stream),
            Op::Alloc { stream, .. } | Op::Free { stream, .. } => stream.as_ref(),
            Op::HostRead { .. }
            | Op::HostWrite { .. }
            | Op::EventCreate { .. }
            | Op::EventDestroy { .. }
            | Op::EventSync { .. }
            | Op::EventQuery { .. }
            | Op::DeviceSync { .. }
            | Op::GraphEnd { .. } => None,
        }
    }

    /// The graph a graph op names (`graph_begin`, `graph_end`, `graph_launch`).
    pub fn graph(&self) -> Option<&Id> {
        match self {
            Op::GraphBegin { graph, .. }
            | Op::GraphEnd { graph }
            | Op::GraphLaunch { graph, .. } => Some(graph),
            _ => None,
        }
    }

    /// Whether the op is one of the graph ops: `graph_begin`, `graph_end`, `graph_launch`.
    pub fn is_graph_op(&self) -> bool {
        self.graph().is_some()
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

    /// The buffer an allocator op names: the one an `alloc` creates, a `free` frees, a
    /// `record_stream` marks. (The buffers an op accesses are in [`Op::accesses`].)
    pub fn buffer(&self) -> Option<&Id> {
        match self {
            Op::Alloc { buffer, .. }
            | Op::Free { buffer, .. }
            | Op::RecordStream { buffer, .. } => Some(buffer),
            _ => None,
        }
    }

    /// Whether the op accesses memory: `launch`, `copy` and `memset` on their stream, `host_read`
    /// and `host_write` on the host. These are the ops that advance their participant's own
    /// component of its clock (an access is the epoch it creates), even with no region. (A
    /// `graph_launch` is not one: its replay's accesses are the captured ops', on the graph's
    /// own participants; and a captured op accesses nothing when it is issued.)
    #[inline]
    pub fn is_access(&self) -> bool {
        matches!(
            self,
            Op::Launch { .. }
                | Op::Copy { .. }
                | Op::Memset { .. }
                | Op::HostRead { .. }
                | Op::HostWrite { .. }
        )
    }

    /// The regions the op accesses and how, writes first: a launch's `writes` then its `reads`
    /// (each in its order), a copy's `dst` then its `src`, a memset's `dst`, a host access's
    /// region. Empty for every op that is not an access ([`Op::is_access`]). Allocations and
    /// frees are uses of their buffer too, but by the allocator's rules, not regions: see
    /// [`Op::buffer`].
    ///
    /// ```
    /// use streamsan::trace::{Id, Op, Region};
    /// let copy = Op::Copy { stream: Id::from("s1"), src: Region::whole("a"), dst: Region::whole("b") };
    /// let how: Vec<(&str, bool)> =
    ///     copy.accesses().map(|a| (a.region.buffer.as_str(), a.write)).collect();
    /// assert_eq!(how, [("b", true), ("a", false)]);
    /// ```
    pub fn accesses(&self) -> impl Iterator<Item = OpAccess<'_>> + '_ {
        use std::slice::from_ref;
        let (writes, reads): (&[Region], &[Region]) = match self {
            Op::Launch { reads, writes, .. } => (writes, reads),
            Op::Copy { src, dst, .. } => (from_ref(dst), from_ref(src)),
            Op::Memset { dst, .. } => (from_ref(dst), &[]),
            Op::HostWrite { buffer } => (from_ref(buffer), &[]),
            Op::HostRead { buffer } => (&[], from_ref(buffer)),
            _ => (&[], &[]),
        };
        let access = |write| move |region| OpAccess { region, write };
        writes
            .iter()
            .map(access(true))
            .chain(reads.iter().map(access(false)))
    }

    /// Whether the op is a synchronization op, as the synchronization analysis counts them:
    /// `event_wait`, `event_sync`, `event_query` that reported completion, `stream_sync`,
    /// `stream_query` that reported completion, `device_sync` and `record_stream`. Implicit
    /// orderings (issue order, the legacy default stream, a reappearing `addr`) are not ops, and
    /// neither graph ops nor the captured ops of a graph are analysed.
    pub fn is_sync(&self) -> bool {
        match self {
            Op::EventWait { .. }
            | Op::EventSync { .. }
            | Op::StreamSync { .. }
            | Op::DeviceSync { .. }
            | Op::RecordStream { .. } => true,
            Op::EventQuery { complete, .. } | Op::StreamQuery { complete, .. } => *complete,
            Op::StreamCreate { .. }
            | Op::Alloc { .. }
            | Op::Free { .. }
            | Op::Launch { .. }
            | Op::Copy { .. }
            | Op::Memset { .. }
            | Op::HostRead { .. }
            | Op::HostWrite { .. }
            | Op::EventCreate { .. }
            | Op::EventDestroy { .. }
            | Op::EventRecord { .. }
            | Op::GraphBegin { .. }
            | Op::GraphEnd { .. }
            | Op::GraphLaunch { .. } => false,
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
        "graph_begin",
        "graph_end",
        "graph_launch",
    ];
}

/// The participant an op belongs to (rule 1 of the trace format): see [`Op::participant`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpParticipant<'a> {
    /// The host: the CPU thread that issues the trace.
    Host,
    /// A stream.
    Stream(&'a Id),
}

impl<'a> OpParticipant<'a> {
    /// The stream, or `None` for the host.
    pub fn stream(self) -> Option<&'a Id> {
        match self {
            OpParticipant::Host => None,
            OpParticipant::Stream(stream) => Some(stream),
        }
    }

    /// The participant's name as reports print it: `"host"`, or the stream id (which is never
    /// `"host"`, the reserved name).
    pub fn as_str(self) -> &'a str {
        match self {
            OpParticipant::Host => super::HOST,
            OpParticipant::Stream(stream) => stream.as_str(),
        }
    }
}

impl std::fmt::Display for OpParticipant<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One region an op accesses, and whether it writes it: see [`Op::accesses`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpAccess<'a> {
    /// The region.
    pub region: &'a Region,
    /// Whether the op writes it (else it reads it).
    pub write: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::arbitrary::arb_op;
    use proptest::prelude::*;

    /// One op of each kind, in the order of [`Op::NAMES`], with every stream, event and buffer
    /// named apart: `s…` streams, `e…` events, `b…` buffers.
    fn one_of_each() -> Vec<Op> {
        let id = Id::from;
        vec![
            Op::StreamCreate {
                stream: id("s0"),
                device: 0,
                blocking: false,
            },
            Op::Alloc {
                buffer: id("b0"),
                bytes: 16,
                stream: Some(id("s1")),
                memory: MemoryKind::Device,
                addr: None,
                pool: None,
            },
            Op::Free {
                buffer: id("b1"),
                stream: Some(id("s2")),
            },
            Op::RecordStream {
                buffer: id("b2"),
                stream: id("s3"),
            },
            Op::Launch {
                stream: id("s4"),
                name: None,
                reads: vec![Region::whole("b3"), Region::range("b4", 4, 8)],
                writes: vec![Region::whole("b5")],
            },
            Op::Copy {
                stream: id("s5"),
                src: Region::whole("b6"),
                dst: Region::whole("b7"),
            },
            Op::Memset {
                stream: id("s6"),
                dst: Region::whole("b8"),
            },
            Op::HostRead {
                buffer: Region::whole("b9"),
            },
            Op::HostWrite {
                buffer: Region::whole("b10"),
            },
            Op::EventCreate { event: id("e0") },
            Op::EventDestroy { event: id("e1") },
            Op::EventRecord {
                event: id("e2"),
                stream: id("s7"),
            },
            Op::EventWait {
                stream: id("s8"),
                event: id("e3"),
            },
            Op::EventSync { event: id("e4") },
            Op::EventQuery {
                event: id("e5"),
                complete: true,
            },
            Op::StreamSync { stream: id("s9") },
            Op::StreamQuery {
                stream: id("s10"),
                complete: true,
            },
            Op::DeviceSync { device: 0 },
            Op::GraphBegin {
                graph: id("g0"),
                stream: id("s11"),
                pool: Some(id("p0")),
            },
            Op::GraphEnd { graph: id("g1") },
            Op::GraphLaunch {
                graph: id("g2"),
                stream: id("s12"),
            },
        ]
    }

    #[test]
    fn every_question_of_every_op() {
        let ops = one_of_each();
        let names: Vec<&str> = ops.iter().map(Op::name).collect();
        assert_eq!(names, Op::NAMES);
        // (participant, stream named, event, buffer, accesses as "buffer:w|r", access, sync)
        type Row = (
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
            &'static [&'static str],
            bool,
            bool,
        );
        let rows: [Row; 21] = [
            ("host", Some("s0"), None, None, &[], false, false),
            ("host", Some("s1"), None, Some("b0"), &[], false, false),
            ("s2", Some("s2"), None, Some("b1"), &[], false, false),
            ("host", Some("s3"), None, Some("b2"), &[], false, true),
            (
                "s4",
                Some("s4"),
                None,
                None,
                &["b5:w", "b3:r", "b4:r"],
                true,
                false,
            ),
            ("s5", Some("s5"), None, None, &["b7:w", "b6:r"], true, false),
            ("s6", Some("s6"), None, None, &["b8:w"], true, false),
            ("host", None, None, None, &["b9:r"], true, false),
            ("host", None, None, None, &["b10:w"], true, false),
            ("host", None, Some("e0"), None, &[], false, false),
            ("host", None, Some("e1"), None, &[], false, false),
            ("s7", Some("s7"), Some("e2"), None, &[], false, false),
            ("s8", Some("s8"), Some("e3"), None, &[], false, true),
            ("host", None, Some("e4"), None, &[], false, true),
            ("host", None, Some("e5"), None, &[], false, true),
            ("host", Some("s9"), None, None, &[], false, true),
            ("host", Some("s10"), None, None, &[], false, true),
            ("host", None, None, None, &[], false, true),
            ("host", Some("s11"), None, None, &[], false, false),
            ("host", None, None, None, &[], false, false),
            ("s12", Some("s12"), None, None, &[], false, false),
        ];
        for (op, row) in ops.iter().zip(rows) {
            let (participant, stream, event, buffer, accesses, access, sync) = row;
            let name = op.name();
            assert_eq!(op.participant().as_str(), participant, "{name}");
            assert_eq!(op.stream().map(Id::as_str), stream, "{name}");
            assert_eq!(op.event().map(Id::as_str), event, "{name}");
            assert_eq!(op.buffer().map(Id::as_str), buffer, "{name}");
            let got: Vec<String> = op
                .accesses()
                .map(|a| format!("{}:{}", a.region.buffer, if a.write { "w" } else { "r" }))
                .collect();
            assert_eq!(got, accesses, "{name}");
            assert_eq!(op.is_access(), access, "{name}");
            assert_eq!(op.is_sync(), sync, "{name}");
            assert_eq!(op.is_graph_op(), name.starts_with("graph_"), "{name}");
        }
        let graphs: Vec<Option<&str>> = ops[18..]
            .iter()
            .map(|op| op.graph().map(Id::as_str))
            .collect();
        assert_eq!(graphs, [Some("g0"), Some("g1"), Some("g2")]);
    }

    #[test]
    fn what_depends_on_a_field() {
        // A caching free is the host's; a stream-ordered one is on its stream.
        let free = Op::Free {
            buffer: Id::from("b"),
            stream: None,
        };
        assert_eq!(free.participant(), OpParticipant::Host);
        assert_eq!(free.stream(), None);
        // An alloc without a stream names none (its owner is "default" by the format's rule).
        let alloc = Op::Alloc {
            buffer: Id::from("b"),
            bytes: 4,
            stream: None,
            memory: MemoryKind::Pinned,
            addr: None,
            pool: None,
        };
        assert_eq!(alloc.stream(), None);
        // Queries synchronize only when they reported completion.
        let busy = Op::StreamQuery {
            stream: Id::from("s"),
            complete: false,
        };
        assert!(!busy.is_sync());
        let busy = Op::EventQuery {
            event: Id::from("e"),
            complete: false,
        };
        assert!(!busy.is_sync());
        // A launch with no region still is an access (it advances its stream's epoch).
        let empty = Op::Launch {
            stream: Id::from("s"),
            name: None,
            reads: vec![],
            writes: vec![],
        };
        assert!(empty.is_access() && empty.accesses().next().is_none());
        assert_eq!(OpParticipant::Stream(&Id::from("s")).to_string(), "s");
        assert_eq!(OpParticipant::Host.stream(), None);
    }

    proptest! {
        /// The answers agree with each other on any op.
        #[test]
        fn answers_agree(op in arb_op()) {
            prop_assert_eq!(op.participant().stream(), op.on_stream());
            // The stream an op is on is a stream it names.
            if let Some(s) = op.on_stream() {
                prop_assert_eq!(op.stream(), Some(s));
            }
            // Only accesses access, and the host's accesses are host_read and host_write.
            if !op.is_access() {
                prop_assert_eq!(op.accesses().count(), 0);
            }
            if op.is_access() && op.participant() == OpParticipant::Host {
                let host_access = matches!(op, Op::HostRead { .. } | Op::HostWrite { .. });
                prop_assert!(host_access, "{:?}", op);
            }
            // Writes come first.
            let writes: Vec<bool> = op.accesses().map(|a| a.write).collect();
            prop_assert!(writes.windows(2).all(|w| w[0] >= w[1]));
            // No op both accesses and synchronizes.
            prop_assert!(!(op.is_access() && op.is_sync()));
        }
    }
}
