//! Fix plans: the synchronization that removes a hazard, decided once, where the hazard is
//! found (the checker). The report's `fix` sentence is this plan in words
//! ([`FixPlan::sentence`], written by the text renderer), and `streamsan fix` inserts the ops
//! it names ([`crate::fix`]): one decision, two renderings.

use crate::clock::Epoch;

/// The synchronization that removes one hazard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FixPlan {
    /// Order the earlier work before the hazard's op.
    Wait(Wait),
    /// `record_stream(buffer, streams)` before the buffer's free at op `free` (the allocator
    /// then waits for those streams before it hands the memory out again), or else the wait
    /// `or`.
    RecordStream {
        /// The freed buffer.
        buffer: String,
        /// The streams to name, the fewest that order every conflict.
        streams: Vec<String>,
        /// Every stream that `record_stream` may name, with the accesses it would order (a fix
        /// over a changed program picks the fewest again among those still unordered).
        candidates: Vec<After>,
        /// The op index of the free.
        free: u64,
        /// Whether the hazard is a reuse of the freed memory (at a later access), not the free
        /// itself.
        reused: bool,
        /// The other way: order the accesses directly.
        or: Wait,
    },
    /// A race found in a replay of `graph`: what orders the conflicts of the program around
    /// the launch (`launch`), and what orders the conflicts between the replay's own captured
    /// ops inside the capture (`capture`, one plan per captured op that needs one). The report
    /// lists the conflicts of the first captured op with the hazard; the plan covers every
    /// captured op of the replay with that hazard (kind and buffer).
    Replay {
        /// The graph.
        graph: String,
        /// Around the launch, on the program's streams.
        launch: Vec<FixPlan>,
        /// Inside the capture, between captured ops on the capture's streams.
        capture: Vec<FixPlan>,
    },
    /// A use after free: move the free of `buffer` at op `free` after op `before`, or allocate
    /// the buffer again before the use. (No synchronization fixes it.)
    MoveFree {
        /// The buffer.
        buffer: String,
        /// Its free (`None`: a free so long before that the checker no longer keeps its op).
        free: Option<u64>,
        /// The use.
        before: u64,
    },
    /// A replay uses `buffer`, freed at op `free` after the capture of `graph` (op `captured`
    /// names it): free it after the graph's last launch, or capture again.
    FreeAfterReplays {
        /// The buffer.
        buffer: String,
        /// Its free (`None`: a free so long before that the checker no longer keeps its op).
        free: Option<u64>,
        /// The graph.
        graph: String,
        /// The captured op that names the buffer.
        captured: u64,
    },
    /// An invalid free: remove it (`why` says what the buffer is).
    RemoveFree {
        /// The buffer.
        buffer: String,
        /// The free.
        at: u64,
        /// Why the free is invalid: "was never allocated", …
        why: String,
    },
    /// A wait on an event never recorded: record it where the work the waiter must wait for
    /// is.
    RecordEvent {
        /// The event.
        event: String,
        /// The waiting stream.
        waiter: String,
        /// The wait.
        before: u64,
    },
}

/// Earlier work ordered before op `before` of `waiter`: an event recorded on each stream of
/// `after` (just after its op), and waited on by `waiter` (`event_wait`; the host:
/// `event_sync`, or a `stream_sync` of the stream).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    /// The stream (or the host) whose op must wait.
    pub waiter: String,
    /// That op's index.
    pub before: u64,
    /// The earlier work, one entry per stream, in order of stream name.
    pub after: Vec<After>,
}

/// One stream's earlier work that a fix orders: its latest conflicting op, and the accesses
/// the ordering must cover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct After {
    /// The stream (for a graph's replay, its launch stream; inside a capture, the captured
    /// op's stream).
    pub stream: String,
    /// Its latest conflicting op.
    pub op: u64,
    /// The conflicting accesses (empty inside a capture, where no clock runs).
    pub accesses: Vec<Earlier>,
}

/// One earlier access a fix orders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Earlier {
    /// Its op index (for a replay's access, the launch).
    pub op: u64,
    /// The buffer it accessed.
    pub buffer: String,
    /// Its epoch in the checker's clocks (for a replay's access, its launch stream's).
    pub epoch: Epoch,
}

impl FixPlan {
    /// The plan in one sentence: the report's `fix`.
    pub fn sentence(&self) -> String {
        super::text::fix_sentence(self)
    }

    /// Adds the plan of another captured op of the same replay with the same hazard (a
    /// [`FixPlan::Replay`] of the same graph): waits before the same op by the same waiter
    /// become one; other parts are added unless already there.
    pub fn merge(&mut self, other: FixPlan) {
        let FixPlan::Replay {
            launch: mine,
            capture: my_capture,
            ..
        } = self
        else {
            return;
        };
        let FixPlan::Replay {
            launch, capture, ..
        } = other
        else {
            return;
        };
        for (into, parts) in [(mine, launch), (my_capture, capture)] {
            for part in parts {
                add_part(into, part);
            }
        }
    }

    /// Whether the plan names `record_stream` (anywhere).
    pub fn names_record_stream(&self) -> bool {
        match self {
            FixPlan::RecordStream { .. } => true,
            FixPlan::Replay {
                launch, capture, ..
            } => launch
                .iter()
                .chain(capture)
                .any(FixPlan::names_record_stream),
            _ => false,
        }
    }
}

/// Adds `part` to `parts`: into a wait before the same op by the same waiter (its streams
/// joined, each with its latest op and all its accesses), else as a part of its own unless an
/// equal one is there.
fn add_part(parts: &mut Vec<FixPlan>, part: FixPlan) {
    if let FixPlan::Wait(w) = &part {
        let same = parts.iter_mut().find_map(|p| match p {
            FixPlan::Wait(v) if v.waiter == w.waiter && v.before == w.before => Some(v),
            _ => None,
        });
        if let Some(v) = same {
            for a in &w.after {
                match v.after.iter_mut().find(|b| b.stream == a.stream) {
                    Some(b) => {
                        b.op = b.op.max(a.op);
                        for e in &a.accesses {
                            if !b.accesses.contains(e) {
                                b.accesses.push(e.clone());
                            }
                        }
                    }
                    None => v.after.push(a.clone()),
                }
            }
            v.after.sort_by(|a, b| a.stream.cmp(&b.stream));
            return;
        }
    }
    if !parts.contains(&part) {
        parts.push(part);
    }
}
