//! Hazards and reports: what the checker found, in the JSON form the trace format fixes and as
//! rustc-style text.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::trace::Site;

mod plan;
mod sarif;
pub mod syncs;
mod text;

pub use plan::{After, Earlier, FixPlan, Wait};

pub use sarif::{render_sarif, SarifOptions};
pub(crate) use text::title;
pub use text::{render_hazard, render_text, TextOptions};

/// The kinds of hazard, in the order reports sort them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HazardKind {
    /// Two accesses of the same buffer conflict without happens-before.
    DataRace,
    /// A free while another participant's access may still be running.
    UnsafeFree,
    /// An access conflicts with an unordered access to the same bytes of an earlier, freed buffer.
    ReuseRace,
    /// An op names a buffer after its free.
    UseAfterFree,
    /// A free of a buffer that was never allocated, is external, or is already freed.
    InvalidFree,
    /// An `event_wait` on an event that was never recorded (a warning).
    WaitOnUnrecordedEvent,
}

impl HazardKind {
    /// The name reports use (`"data-race"`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            HazardKind::DataRace => "data-race",
            HazardKind::UnsafeFree => "unsafe-free",
            HazardKind::ReuseRace => "reuse-race",
            HazardKind::UseAfterFree => "use-after-free",
            HazardKind::InvalidFree => "invalid-free",
            HazardKind::WaitOnUnrecordedEvent => "wait-on-unrecorded-event",
        }
    }

    /// Every kind, in report order.
    pub const ALL: [HazardKind; 6] = [
        HazardKind::DataRace,
        HazardKind::UnsafeFree,
        HazardKind::ReuseRace,
        HazardKind::UseAfterFree,
        HazardKind::InvalidFree,
        HazardKind::WaitOnUnrecordedEvent,
    ];

    /// The severity of this kind.
    pub fn severity(self) -> Severity {
        match self {
            HazardKind::WaitOnUnrecordedEvent => Severity::Warning,
            _ => Severity::Error,
        }
    }
}

impl fmt::Display for HazardKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How serious a hazard is: errors fail `streamsan check` (exit 1), warnings do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Data may be corrupted.
    Error,
    /// Suspicious, but not a hazard by itself.
    Warning,
}

/// The shape of a race: what the later access does after what the earlier one did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// A read of bytes an unordered write produced.
    ReadAfterWrite,
    /// A read of freshly allocated bytes whose allocation is not ordered before it.
    ReadAfterAlloc,
    /// A write over an unordered write.
    WriteAfterWrite,
    /// A write over bytes an unordered read may still be reading.
    WriteAfterRead,
    /// A write of freshly allocated bytes whose allocation is not ordered before it.
    WriteAfterAlloc,
}

impl Pattern {
    /// The name reports use.
    pub fn as_str(self) -> &'static str {
        match self {
            Pattern::ReadAfterWrite => "read-after-write",
            Pattern::ReadAfterAlloc => "read-after-alloc",
            Pattern::WriteAfterWrite => "write-after-write",
            Pattern::WriteAfterRead => "write-after-read",
            Pattern::WriteAfterAlloc => "write-after-alloc",
        }
    }

    /// The pattern of an access of kind `later` against earlier conflicts of the given kinds.
    pub fn of(later: AccessKind, earlier: impl IntoIterator<Item = AccessKind>) -> Pattern {
        let (mut w, mut r) = (false, false);
        for k in earlier {
            match k {
                AccessKind::Write => w = true,
                AccessKind::Read => r = true,
                _ => {}
            }
        }
        match (later, w, r) {
            (AccessKind::Read, true, _) => Pattern::ReadAfterWrite,
            (AccessKind::Read, false, _) => Pattern::ReadAfterAlloc,
            (_, true, _) => Pattern::WriteAfterWrite,
            (_, false, true) => Pattern::WriteAfterRead,
            _ => Pattern::WriteAfterAlloc,
        }
    }
}

/// What an access does to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessKind {
    /// Reads the bytes.
    Read,
    /// Writes the bytes.
    Write,
    /// The allocation's use of the new buffer (counts as a write).
    Alloc,
    /// A free's use of the buffer.
    Free,
}

impl AccessKind {
    /// Whether the access counts as a write for conflicts.
    pub fn writes(self) -> bool {
        !matches!(self, AccessKind::Read)
    }

    /// The name reports use.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessKind::Read => "read",
            AccessKind::Write => "write",
            AccessKind::Alloc => "alloc",
            AccessKind::Free => "free",
        }
    }
}

/// Where and how an op touched a buffer — the hazard's own access.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AccessRef {
    /// The op index.
    pub op: u64,
    /// The participant: a stream name or `"host"`.
    pub participant: String,
    /// What it did.
    pub access: AccessKind,
    /// First byte, relative to the buffer.
    pub offset: u64,
    /// Number of bytes; `None` for the whole of an external buffer.
    pub bytes: Option<u64>,
    /// The op's site, as given.
    pub site: Option<Arc<Site>>,
    /// For an access of a graph replay (`op` is then the `graph_launch`): the op index of the
    /// captured op it replays. Absent from the JSON report otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captured: Option<u64>,
}

/// An earlier access that conflicts with the hazard's access without happens-before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Conflict {
    /// The op index of the earlier access.
    pub op: u64,
    /// Its participant.
    pub participant: String,
    /// What it did: read, write or alloc.
    pub access: AccessKind,
    /// The buffer it touched (an earlier, freed buffer for a reuse race).
    pub buffer: String,
    /// First byte, relative to that buffer.
    pub offset: u64,
    /// Number of bytes; `None` for the whole of an external buffer.
    pub bytes: Option<u64>,
    /// Its site, as given (for a replayed access, the `graph_launch`'s).
    pub site: Option<Arc<Site>>,
    /// For an access of a graph replay (`op` is then the `graph_launch`): the op index of the
    /// captured op it replays. Absent from the JSON report otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captured: Option<u64>,
    /// The captured op's site, for text and SARIF reports; not part of the JSON report.
    #[serde(skip)]
    pub captured_site: Option<Arc<Site>>,
    /// Extra context for text reports (kernel name); not part of the JSON report.
    #[serde(skip)]
    pub label: Option<Arc<str>>,
    /// The access's epoch in the checker's clocks (`streamsan fix` asks whether a later point
    /// covers it); not part of the JSON report.
    #[serde(skip)]
    pub epoch: Option<crate::clock::Epoch>,
    /// For a replay's access: the graph and the captured op (text reports name them; not part of
    /// the JSON report).
    #[serde(skip)]
    pub replay: Option<Replay>,
}

/// The free behind a reuse race.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FreeRef {
    /// The op index of the free.
    pub op: u64,
    /// The freed buffer.
    pub buffer: String,
}

/// A site and op index, for the notes of text reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpNote {
    /// What happened (`"allocated on s1"`, `"freed by the host"`).
    pub what: String,
    /// The op index.
    pub op: u64,
    /// The op's site.
    pub site: Option<Arc<Site>>,
}

/// One hazard: a kind, an op, a buffer, and the evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hazard {
    /// What went wrong.
    pub kind: HazardKind,
    /// Error or warning.
    pub severity: Severity,
    /// The op index where it is reported.
    pub op: u64,
    /// The buffer (null for warnings).
    pub buffer: Option<String>,
    /// For races: the shape of the conflict.
    pub pattern: Option<Pattern>,
    /// The hazard's own access.
    pub access: Option<AccessRef>,
    /// The earlier conflicting accesses — for each participant, those of its latest conflicting
    /// op — sorted by op.
    pub conflicts: Vec<Conflict>,
    /// For reuse races: the most recent free among the conflicts.
    pub free: Option<FreeRef>,
    /// The minimal synchronization that removes the hazard, in one sentence.
    pub fix: Option<String>,
    /// Context for text reports; not part of the JSON report.
    #[serde(skip)]
    pub detail: Detail,
    /// What `check --confirm` saw when it provoked the hazard: the report's one extension of
    /// the trace format, present only with `--confirm`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
}

/// The outcome of provoking one hazard on an executor (`check --confirm sim|cuda`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Confirmation {
    /// The provocation ran `attempts` times; `observed` of them corrupted the hazard's data.
    Ran {
        /// `"sim"` or `"cuda"`.
        backend: &'static str,
        /// Attempts whose data differed from the sequential reference.
        observed: u32,
        /// Attempts made.
        attempts: u32,
    },
    /// The provocation did not run, and why.
    Skipped {
        /// `"sim"` or `"cuda"`.
        backend: &'static str,
        /// Why not.
        skipped: String,
    },
}

impl Confirmation {
    /// One line for text reports: "confirmed on the simulator: corruption observed in 3 of 5
    /// attempts", "not confirmed on GPU: …", "not run on GPU: …".
    pub fn describe(&self) -> String {
        let on = |backend: &str| {
            if backend == "cuda" {
                "GPU"
            } else {
                "the simulator"
            }
        };
        match self {
            Confirmation::Ran {
                backend,
                observed,
                attempts,
            } if *observed > 0 => format!(
                "confirmed on {}: corruption observed in {observed} of {attempts} attempts",
                on(backend)
            ),
            Confirmation::Ran {
                backend, attempts, ..
            } => format!(
                "not confirmed on {}: no corruption observed in {attempts} attempts",
                on(backend)
            ),
            Confirmation::Skipped { backend, skipped } => {
                format!("not run on {}: {skipped}", on(backend))
            }
        }
    }

    /// Whether corruption was observed.
    pub fn is_confirmed(&self) -> bool {
        matches!(self, Confirmation::Ran { observed, .. } if *observed > 0)
    }
}

/// Context that text reports show and the JSON report leaves out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Detail {
    /// The op's name (`"launch"`, `"free"`, …).
    pub op_name: &'static str,
    /// The kernel name of a launch.
    pub label: Option<Arc<str>>,
    /// The event of an event op.
    pub event: Option<String>,
    /// The op's participant.
    pub participant: String,
    /// Notes: the allocation, the free, the reuse.
    pub notes: Vec<OpNote>,
    /// Why the hazard happened: the conflicting accesses, the last synchronization each side
    /// had, the missing edge. Filled by the dependency graph ([`crate::graph`]); empty otherwise.
    pub why: Vec<String>,
    /// For a hazard found in a graph replay: the graph and the captured op.
    pub replay: Option<Replay>,
    /// The fix, as the checker decided it: `fix` is its sentence, `streamsan fix` applies it.
    pub plan: Option<FixPlan>,
}

/// Where in a graph a hazard found in a replay happened: the report is at the `graph_launch`,
/// the access is a captured op's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replay {
    /// The graph.
    pub graph: String,
    /// The op index of the captured op whose replay has the hazard.
    pub captured: u64,
    /// That op's name (`"launch"`, `"copy"`, `"memset"`).
    pub captured_name: &'static str,
    /// That op's site.
    pub captured_site: Option<Arc<Site>>,
}

impl Hazard {
    /// Whether this hazard fails a check.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The key reports sort by: op index, then kind, then buffer.
    pub fn sort_key(&self) -> (u64, HazardKind, Option<&str>) {
        (self.op, self.kind, self.buffer.as_deref())
    }
}

/// The latest conflicting op of each earlier participant, in order of participant name. (For a
/// replay's accesses, the op is the `graph_launch`.)
pub(crate) fn latest_by_participant(conflicts: &[Conflict]) -> Vec<(&str, u64)> {
    let mut v: Vec<(&str, u64)> = Vec::new();
    for c in conflicts {
        match v.iter_mut().find(|(p, _)| *p == c.participant) {
            Some(e) => e.1 = e.1.max(c.op),
            None => v.push((&c.participant, c.op)),
        }
    }
    v.sort();
    v
}

/// All hazards of a trace, with counts: the JSON report of the trace format.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Always `"streamsan-report"`.
    pub format: &'static str,
    /// Always 1.
    pub version: u32,
    /// Number of ops checked.
    pub ops: u64,
    /// Number of hazards of severity error.
    pub errors: u64,
    /// Number of warnings.
    pub warnings: u64,
    /// The hazards, sorted by op, kind, buffer.
    pub hazards: Vec<Hazard>,
    /// With the synchronization analysis (`check --syncs`): a verdict on every synchronization
    /// op, in op order (trace format, "Synchronization analysis").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syncs: Option<Vec<syncs::SyncVerdict>>,
}

impl Report {
    /// A report of `ops` ops with these hazards (sorted here).
    pub fn new(ops: u64, mut hazards: Vec<Hazard>) -> Self {
        hazards.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        let errors = hazards.iter().filter(|h| h.is_error()).count() as u64;
        let warnings = hazards.len() as u64 - errors;
        Report {
            format: "streamsan-report",
            version: 1,
            ops,
            errors,
            warnings,
            hazards,
            syncs: None,
        }
    }

    /// Whether no hazard of severity error was found.
    pub fn is_clean(&self) -> bool {
        self.errors == 0
    }

    /// The JSON report, pretty-printed.
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Panics with the text report unless the report is clean: for tests.
    #[track_caller]
    pub fn assert_clean(&self) {
        if !self.is_clean() {
            panic!("{}", render_text(self, &TextOptions::plain()));
        }
    }
}
