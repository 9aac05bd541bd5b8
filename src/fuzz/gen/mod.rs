//! The random program generator: multi-stream programs with the synchronization they need, except
//! where a coin leaves it out.
//!
//! # How a program is built
//!
//! A program is a list of trace-format ops over streams `s0`…`s3` (created with `stream_create`,
//! non-blocking) and, with [`GenConfig::blocking`], the blocking stream `b` and the legacy
//! `"default"` stream; buffers `x0`, `x1`, … (device memory owned by a stream, or pinned host
//! memory); and events `e0`…`e5`. Each step picks one of: an allocation (often followed by a
//! first touch), a kernel launch over whole buffers and sub-regions, a copy (device↔device,
//! pinned↔device), a memset, a host read or write of pinned memory, a free (caching or
//! stream-ordered, often followed by an allocation of the same size on the same stream so that
//! the allocator hands the same block out again), a host sync or query, or — only with
//! [`GenConfig::use_after_free`] and `missing_sync > 0.5` — a use of a freed buffer.
//!
//! Before every access the generator asks its model which earlier accesses by other participants
//! it conflicts with and does not already happen after — on the same buffer, or on the same bytes
//! of an earlier, freed buffer — and before every free which accesses do not happen before the
//! free. For each such participant it inserts one synchronization: an `event_record` (just now,
//! or reusing an event recorded right after the earlier access) with an `event_wait`, a host sync
//! (`stream_sync`, `device_sync`, `event_sync`, a successful query), or for a free a
//! `record_stream` — unless a coin with probability [`GenConfig::missing_sync`] says to leave it
//! out (sometimes waiting on a stale event instead, the "event recorded too early" bug). That is
//! how hazards are planted: data races, unsafe frees, and reuse races when the block of an unsafe
//! free is handed out again.
//!
//! With [`GenConfig::graphs`], a step may also capture a CUDA graph (`g0`, `g1`) or launch one:
//! a capture on a stream, perhaps forked to a second stream and joined back, over live buffers and
//! temporaries from the graph's pool (private, or `p0` shared by both graphs), temporaries perhaps
//! freed inside the capture with or without `record_stream`; a launch on any stream after the
//! synchronization its replay's accesses need with the work around it (through the stream the
//! other graph was last launched on, for a replay's accesses), unless a coin leaves it out. The
//! model replays a launch on participants of its own (`g0/c`), with pools as arenas of the
//! allocator model, as the trace format says.
//!
//! # The model
//!
//! The generator keeps its own small model of the trace format's happens-before rules (vector
//! clocks over the host and the streams, events as snapshots, host syncs, the legacy default
//! stream, allocations and frees as uses) written from the format, not borrowed from the checker,
//! so that the two check each other. Addresses come from the allocator policies of
//! `crate::alloc`, the same policies the checker, the simulator and the GPU backend use, so the
//! model knows which freed bytes a new buffer reuses.
//!
//! # Guarantee
//!
//! Every program satisfies [`validate()`] and is valid input for the checker. With
//! `missing_sync == 0` every program is free of hazards under the trace format. The same
//! configuration and seed (or decision words) give the same program. The id of an op, for the
//! simulator and the GPU kernels, is its index in [`Program::ops`].
//!
//! # Where things are
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`GenConfig`], [`Program`], the entry points, where decisions come from |
//! | `model.rs` | the model: participants and names, clocks, buffers, the allocators' addresses |
//! | `build.rs` | the builder: each step's choices and the ops it emits, syncs included |
//! | `validate.rs` | [`validate()`]: the constraints every generated program satisfies |
//! | `predict.rs` | [`predicted_hazards`]: the model's own verdict on a program |

mod build;
mod model;
mod predict;
mod validate;

use std::fmt;

#[cfg(feature = "proptest")]
use proptest::strategy::Strategy;

use crate::checker::{CheckError, Checker};
use crate::report::Report;
use crate::trace::{write_op, TraceOp};
use crate::workload::SplitMix;

use build::Builder;

pub use predict::predicted_hazards;
pub use validate::validate;

/// Knobs of the generator.
#[derive(Clone, Debug, PartialEq)]
pub struct GenConfig {
    /// Target length in ops: [`generate`] returns exactly this many, `arb_program` at most.
    pub ops: usize,
    /// Number of non-default streams `s0`, `s1`, … (1..=4; other values are clamped).
    pub streams: u32,
    /// Number of distinct buffer names `x0`, `x1`, … (1..=6 is typical; at least 1).
    pub buffers: u32,
    /// Probability (0..=1) that a needed synchronization is left out. Once a free is left unsafe,
    /// accesses that reuse its bytes are not repaired either (the bug carries on into the reuse).
    pub missing_sync: f64,
    /// Whether pinned host buffers (host reads and writes, pinned↔device copies) appear.
    pub pinned: bool,
    /// Whether the blocking stream `b` and the legacy `"default"` stream appear.
    pub blocking: bool,
    /// Whether stream-ordered frees (`cudaFreeAsync`) appear besides caching frees.
    pub stream_ordered_free: bool,
    /// Whether uses of freed buffers may appear; they do only when `missing_sync > 0.5`.
    pub use_after_free: bool,
    /// Largest buffer size in 4-byte words (at least 4: every buffer has at least 16 bytes).
    pub max_words: u32,
    /// Write every new buffer whole on its owner right after allocating it, so no program reads
    /// uninitialized memory. A GPU leaves the previous owner's bytes there, whose value depends on
    /// timing even in a program free of hazards; the simulator makes such reads deterministic,
    /// a GPU cannot. A program then may end a few ops short of `ops` rather than between an
    /// allocation and its initializing write.
    pub initialize: bool,
    /// Whether CUDA graphs appear: captures (`g0`, `g1`) on a stream, perhaps forked to a second
    /// one and joined back, over live buffers (static inputs and outputs) and temporaries from
    /// the graph's pool (private, or `p0` shared by both graphs), temporaries freed inside the
    /// capture with or without `record_stream`; launches on any stream, synchronized with the
    /// work around them unless a coin leaves it out.
    pub graphs: bool,
}

impl Default for GenConfig {
    /// 40 ops over 3 streams and 4 buffer names of up to 1 KiB, every feature on except
    /// use-after-free, with 20% of the needed synchronizations left out.
    fn default() -> Self {
        GenConfig {
            ops: 40,
            streams: 3,
            buffers: 4,
            missing_sync: 0.2,
            pinned: true,
            blocking: true,
            stream_ordered_free: true,
            use_after_free: false,
            max_words: 256,
            initialize: false,
            graphs: false,
        }
    }
}

/// A generated program: the ops in issue order. The id of an op, which the simulator and the GPU
/// kernels use, is its index in `ops` (its op index in reports).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Program {
    /// The ops, numbered from 0.
    pub ops: Vec<TraceOp>,
}

impl Program {
    /// The program as a trace: JSON Lines, one op a line, as [`write_op`] writes them (the one
    /// trace writer), which `streamsan check` reads.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for op in &self.ops {
            write_op(op, &mut out);
            out.push('\n');
        }
        out
    }

    /// Runs the checker over the program: its report, or the first op it refused.
    pub fn check(&self) -> Result<Report, CheckError> {
        let mut checker = Checker::new();
        for op in &self.ops {
            checker.check(op)?;
        }
        Ok(checker.finish())
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_jsonl())
    }
}

impl fmt::Debug for Program {
    /// The trace, so that a failing proptest case prints a file `streamsan check` reproduces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Program of {} ops:", self.ops.len())?;
        f.write_str(&self.to_jsonl())
    }
}

/// A program from a seeded generator (for `streamsan fuzz --seed S`).
pub fn generate(cfg: &GenConfig, rng: &mut SplitMix) -> Program {
    Builder::new(cfg, Rng(rng)).run()
}

/// A program from decision words, one vector of words per step of the generator: each word drives
/// one choice of its step, and a missing word (past the end of its step's vector) or a zero word
/// takes the simplest choice. The program ends when the steps do (or at [`GenConfig::ops`]).
/// Fewer steps give a shorter program, fewer or smaller words a simpler one; removing a step
/// leaves the words of the other steps as they were.
pub fn generate_from_words(cfg: &GenConfig, steps: &[Vec<u64>]) -> Program {
    Builder::new(
        cfg,
        Steps {
            steps,
            step: None,
            at: 0,
        },
    )
    .run()
}

#[cfg(feature = "proptest")]
/// A proptest strategy for programs that shrinks to minimal programs.
///
/// It draws decision words, one vector per step, and feeds them to [`generate_from_words`];
/// proptest shrinks the vectors (fewer steps, fewer words, words towards 0), which shortens and
/// simplifies the program, and every shrunk program is again a generated one, so it satisfies
/// [`validate()`].
pub fn arb_program(cfg: GenConfig) -> impl Strategy<Value = Program> {
    let step = proptest::collection::vec(proptest::arbitrary::any::<u64>(), 0..=WORDS_PER_STEP);
    proptest::collection::vec(step, 0..=cfg.ops.max(1))
        .prop_map(move |steps| generate_from_words(&cfg, &steps))
}

/// The most decision words [`arb_program`] draws for one step (a step with many regions and
/// synchronizations may ask for more; those take the simplest choice).
#[cfg(feature = "proptest")]
const WORDS_PER_STEP: usize = 32;

// ---------------------------------------------------------------------------------------------
// Decisions

/// Where the generator's choices come from.
pub(super) trait Decisions {
    /// Starts the next step; false when no steps are left (the program ends).
    fn next_step(&mut self) -> bool;
    /// The next decision word of the current step.
    fn word(&mut self) -> u64;
}

pub(super) struct Rng<'a>(&'a mut SplitMix);

impl Decisions for Rng<'_> {
    fn next_step(&mut self) -> bool {
        true
    }

    fn word(&mut self) -> u64 {
        self.0.next_u64()
    }
}

pub(super) struct Steps<'a> {
    steps: &'a [Vec<u64>],
    step: Option<usize>,
    at: usize,
}

impl Decisions for Steps<'_> {
    fn next_step(&mut self) -> bool {
        let next = self.step.map_or(0, |s| s + 1);
        self.step = Some(next);
        self.at = 0;
        next < self.steps.len()
    }

    fn word(&mut self) -> u64 {
        let words = self.step.and_then(|s| self.steps.get(s));
        let w = words.and_then(|v| v.get(self.at)).copied().unwrap_or(0);
        self.at += 1;
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_words_give_a_small_valid_program() {
        let cfg = GenConfig::default();
        let p = generate_from_words(&cfg, &vec![vec![]; 12]);
        validate(&p).unwrap();
        assert!(!p.ops.is_empty() && p.ops.len() <= cfg.ops);
        assert!(p.check().unwrap().is_clean(), "{p}");
        assert_eq!(generate_from_words(&cfg, &[]).ops.len(), 0);
    }

    /// The trace of a program reads back to the same ops.
    #[test]
    fn the_trace_reads_back() {
        for seed in 0..20 {
            let p = generate(&GenConfig::default(), &mut SplitMix::new(seed));
            let text = p.to_jsonl();
            let read: Vec<TraceOp> = crate::trace::TraceReader::new(text.as_bytes(), "p.jsonl")
                .map(|r| r.map(|(op, _)| op))
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(read, p.ops);
        }
    }

    #[test]
    fn lines_name_the_op_first() {
        let p = generate(&GenConfig::default(), &mut SplitMix::new(7));
        for line in p.to_jsonl().lines() {
            assert!(line.starts_with("{\"op\":\""), "{line}");
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(v.is_object());
        }
    }
}
