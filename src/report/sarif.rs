//! SARIF 2.1.0 reports, for code-scanning dashboards and editors that read static-analysis logs.
//!
//! See [`render_sarif`] for how the report maps onto SARIF, and `docs/sarif.md`.

use std::fmt::Write as _;

use serde::Serialize;

use super::text::title;
use super::{AccessKind, Conflict, Hazard, HazardKind, Report, Severity};
use crate::trace::Site;

/// The `$schema` of the log.
const SCHEMA: &str = "https://json.schemastore.org/sarif-2.1.0.json";
/// SARIF's logical-location kind for a JSON object: an op is one object of the trace.
const OP_KIND: &str = "object";

/// How to render SARIF.
#[derive(Clone, Debug, Default)]
pub struct SarifOptions {
    /// The trace file's path as given on the command line: recorded as the run's analysis target
    /// and used as the location of hazards whose site is not a file location.
    pub trace: Option<String>,
}

/// Renders the report as a SARIF 2.1.0 log (pretty-printed JSON).
///
/// One run, one rule per [`HazardKind`], one result per hazard. How the report maps onto SARIF:
///
/// - **Physical locations.** A site frame of the form `path:line` or `path:line:col` (parsed from
///   the right, so the path may itself contain `:`; line and column are positive integers) whose
///   path is relative and stays inside the tree it is relative to is a file location:
///   `artifactLocation.uri` is the path with `\` turned into `/` and `.`, `..` resolved, and
///   `region` holds `startLine` and, when given, `startColumn`. Absolute paths, URIs
///   (`file:///etc/passwd:1:1`) and paths that climb out (`../../x:1:1`) are not: the trace
///   says where its sites are, and a report must not point a viewer at any file of the machine.
///   For a stack, the innermost frame that is a file location is used. A hazard whose site has
///   none is located in the trace file itself (without a region) when [`SarifOptions::trace`]
///   is set, and by its logical location alone otherwise; the site is then written, as text, at
///   the end of the location's message (`…, at /abs/train.py:3`).
/// - **Messages** are plain text (§3.11.6): `[` and `]` are escaped as `\[` and `\]` (a `\`
///   before a bracket as `\\`), so that text from the trace cannot form an embedded link.
/// - **Logical locations.** Every location names its op, `{"name": "op 11", "kind": "object"}`:
///   an op is one JSON object of the trace, and `object` is SARIF's kind for a JSON object.
/// - **Related locations.** One per conflicting access (ids 1 to n, in the report's order), then
///   one per note of the hazard (the allocation, the free behind a reuse race, …); a reuse race's
///   free that no note names gets one of its own. Each names its op and, when its site parses,
///   the file location.
/// - **Stacks.** A hazard whose site is a stack also carries it as a SARIF `stack`, innermost
///   frame first.
/// - **Fingerprints.** `partialFingerprints["streamsanHazard/v1"]` is
///   `<kind>:<buffer>:<site>`, the site written as the text report writes it (frames joined by
///   ` <- `), or `op N` when the op has no site; a warning has `-` for the buffer. It does not
///   depend on op indices when sites are recorded, so it survives changes to unrelated parts of
///   the trace; hazards of one kind on one buffer at one site (a loop that races on every
///   iteration) share it.
/// - **Trace.** With [`SarifOptions::trace`] set, the trace is the run's only artifact (role
///   `analysisTarget`) and every result's `analysisTarget`.
/// - **Properties.** Each result's property bag repeats the JSON report's `op`, `buffer`,
///   `pattern`, `participant` and `fix` (null when absent); the run's holds the `ops`, `errors`
///   and `warnings` counts.
///
/// The output is deterministic: no timestamps, no absolute paths other than those the trace gave.
pub fn render_sarif(report: &Report, opts: &SarifOptions) -> String {
    let trace = opts.trace.as_deref().map(|t| ArtifactLocation {
        uri: path_to_uri(t),
        index: Some(0),
    });
    let log = Log {
        schema: SCHEMA,
        version: "2.1.0",
        runs: vec![Run {
            tool: Tool {
                driver: Driver {
                    name: "streamsan",
                    version: env!("CARGO_PKG_VERSION"),
                    semantic_version: env!("CARGO_PKG_VERSION"),
                    rules: HazardKind::ALL
                        .iter()
                        .map(|&k| rule(k))
                        .chain(report.syncs.as_ref().map(|_| redundant_sync_rule()))
                        .collect(),
                },
            },
            artifacts: trace.as_ref().map(|t| {
                vec![Artifact {
                    location: ArtifactLocation {
                        uri: t.uri.clone(),
                        index: None,
                    },
                    roles: vec!["analysisTarget"],
                }]
            }),
            results: report
                .hazards
                .iter()
                .map(|h| result(h, trace.as_ref()))
                .chain(
                    report
                        .syncs
                        .iter()
                        .flatten()
                        .filter(|v| !v.needed)
                        .map(|v| redundant_sync(v, report.is_clean(), trace.as_ref())),
                )
                .collect(),
            properties: RunProperties {
                ops: report.ops,
                errors: report.errors,
                warnings: report.warnings,
            },
        }],
    };
    // Serializing plain data with string keys cannot fail.
    serde_json::to_string_pretty(&log).unwrap_or_default()
}

#[derive(Serialize)]
struct Log {
    #[serde(rename = "$schema")]
    schema: &'static str,
    version: &'static str,
    runs: Vec<Run>,
}

#[derive(Serialize)]
struct Run {
    tool: Tool,
    #[serde(skip_serializing_if = "Option::is_none")]
    artifacts: Option<Vec<Artifact>>,
    results: Vec<SarifResult>,
    properties: RunProperties,
}

#[derive(Serialize)]
struct RunProperties {
    ops: u64,
    errors: u64,
    warnings: u64,
}

#[derive(Serialize)]
struct Tool {
    driver: Driver,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Driver {
    name: &'static str,
    version: &'static str,
    semantic_version: &'static str,
    rules: Vec<Rule>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    id: &'static str,
    name: &'static str,
    short_description: Text,
    full_description: Text,
    default_configuration: Configuration,
    help: Text,
    properties: RuleProperties,
}

#[derive(Serialize)]
struct RuleProperties {
    tags: [&'static str; 3],
}

#[derive(Serialize)]
struct Configuration {
    level: &'static str,
}

#[derive(Serialize)]
struct Text {
    text: String,
}

impl Text {
    /// A plain-text message of this crate's own (the rules' descriptions).
    fn new(text: impl Into<String>) -> Self {
        Text { text: text.into() }
    }

    /// A plain-text message that holds text from the trace: [`escape_brackets`] applied.
    fn message(text: &str) -> Self {
        Text {
            text: escape_brackets(text),
        }
    }
}

/// `text` as a SARIF plain-text message (§3.11.6): a literal `[` or `]` would open or close an
/// embedded link (`[text](id)`), so each is escaped as `\[` or `\]`, and a `\` right before
/// a bracket is escaped as `\\` so that it is not read as an escape. Other backslashes (Windows
/// paths) stay as they are.
fn escape_brackets(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            '\\' if matches!(chars.peek(), Some('[' | ']')) => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out
}

#[derive(Serialize)]
struct Artifact {
    location: ArtifactLocation,
    roles: Vec<&'static str>,
}

#[derive(Clone, Serialize)]
struct ArtifactLocation {
    uri: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u32>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SarifResult {
    rule_id: &'static str,
    rule_index: usize,
    level: &'static str,
    message: Text,
    locations: Vec<Location>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    related_locations: Vec<Location>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stacks: Vec<Stack>,
    partial_fingerprints: Fingerprints,
    #[serde(skip_serializing_if = "Option::is_none")]
    analysis_target: Option<ArtifactLocation>,
    properties: ResultProperties,
}

#[derive(Serialize)]
struct Fingerprints {
    #[serde(rename = "streamsanHazard/v1")]
    hazard: String,
}

#[derive(Serialize)]
struct ResultProperties {
    op: u64,
    buffer: Option<String>,
    pattern: Option<&'static str>,
    participant: Option<String>,
    fix: Option<String>,
    /// What `check --confirm` saw, as in the JSON report.
    #[serde(skip_serializing_if = "Option::is_none")]
    confirmation: Option<super::Confirmation>,
}

#[derive(Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Location {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    physical_location: Option<PhysicalLocation>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    logical_locations: Vec<LogicalLocation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Text>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PhysicalLocation {
    artifact_location: ArtifactLocation,
    #[serde(skip_serializing_if = "Option::is_none")]
    region: Option<Region>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Region {
    start_line: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    start_column: Option<u64>,
}

#[derive(Serialize)]
struct LogicalLocation {
    name: String,
    kind: &'static str,
}

#[derive(Serialize)]
struct Stack {
    message: Text,
    frames: Vec<StackFrame>,
}

#[derive(Serialize)]
struct StackFrame {
    location: Location,
}

/// The rule of a hazard kind: its PascalCase name and the descriptions of the trace format's
/// hazard table.
fn rule(kind: HazardKind) -> Rule {
    let (name, short, full, help) = match kind {
        HazardKind::DataRace => (
            "DataRace",
            "Two accesses of the same buffer conflict without happens-before.",
            "Two accesses of the same buffer (the same allocation) by different participants \
             (streams or the host) overlap, at least one of them writes, and no event wait, host \
             synchronization or legacy-default-stream edge orders them. The result depends on \
             timing. Reported at the later access.",
            "Record an event on the earlier stream after its access and make the later stream \
             wait on it (cudaEventRecord + cudaStreamWaitEvent; in PyTorch ev.record(s1); \
             s2.wait_event(ev) or s2.wait_stream(s1)). For the host, synchronize the event or the \
             stream before touching pinned memory.",
        ),
        HazardKind::UnsafeFree => (
            "UnsafeFree",
            "A buffer is freed while another participant's access may still be running.",
            "A buffer is freed (a caching free is a use on its owning stream, a stream-ordered \
             free a use on its stream) while an access by another participant does not happen \
             before the free: the allocator may hand the memory out again while it is still in \
             use. Reported at the free.",
            "Call record_stream(buffer, other_stream) before the free (the allocator then waits \
             for that stream's work), or make the freeing stream wait on an event recorded on \
             the other stream after its access.",
        ),
        HazardKind::ReuseRace => (
            "ReuseRace",
            "An access conflicts with an unordered access to the same bytes of an earlier, freed buffer.",
            "An access, by any participant, to a buffer's bytes conflicts without happens-before \
             with an access to the same bytes of an earlier buffer that was freed: the caching \
             allocator handed the memory out again while the old owner's work may still run. \
             Reported at the access.",
            "The same as for the unsafe free that caused it: record_stream before the free, or \
             an event wait.",
        ),
        HazardKind::UseAfterFree => (
            "UseAfterFree",
            "An op names a buffer after its free.",
            "An op other than a free names a buffer after its free and before the name is \
             allocated again. The memory may already belong to another buffer. Reported at the \
             op; the access is not recorded.",
            "Move the free after the last use, or allocate again.",
        ),
        HazardKind::InvalidFree => (
            "InvalidFree",
            "A free of a buffer that was never allocated, is external, or is already freed.",
            "A free of a buffer that was never allocated, is external (used without an alloc), \
             or is already freed. A double free returns the same block to the allocator twice, \
             so two later allocations share it. Reported at the free.",
            "Free each allocation exactly once.",
        ),
        HazardKind::WaitOnUnrecordedEvent => (
            "WaitOnUnrecordedEvent",
            "A stream waits on an event that was never recorded.",
            "An event_wait on an event that was never recorded, or was reset by event_create or \
             destroyed. CUDA treats it as complete: the wait orders nothing, which usually means \
             a missing or misplaced cudaEventRecord. Reported at the wait.",
            "Record the event on the producing stream before the wait.",
        ),
    };
    Rule {
        id: kind.as_str(),
        name,
        short_description: Text::new(short),
        full_description: Text::new(full),
        default_configuration: Configuration {
            level: level(kind.severity()),
        },
        help: Text::new(help),
        properties: RuleProperties {
            tags: ["concurrency", "correctness", "gpu"],
        },
    }
}

fn level(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

fn rule_index(kind: HazardKind) -> usize {
    HazardKind::ALL
        .iter()
        .position(|&k| k == kind)
        .unwrap_or_default()
}

/// The title, then the fix: `"<title>. Fix: <fix>."`.
fn message(h: &Hazard) -> String {
    let mut s = title(h);
    if let Some(fix) = h.fix.as_deref().map(str::trim).filter(|f| !f.is_empty()) {
        let _ = write!(s, ". Fix: {fix}");
        if !fix.ends_with('.') {
            s.push('.');
        }
    }
    s
}

fn result(h: &Hazard, trace: Option<&ArtifactLocation>) -> SarifResult {
    let site = h.access.as_ref().and_then(|a| a.site.as_deref());
    let located = site.and_then(physical);
    let mut what = format!("op {}", h.op);
    if !h.detail.op_name.is_empty() {
        let _ = write!(what, ": {}", h.detail.op_name);
    }
    if let Some(l) = &h.detail.label {
        let _ = write!(what, " `{l}`");
    }
    if !h.detail.participant.is_empty() {
        let _ = write!(what, " on {}", h.detail.participant);
    }
    if let (Some(site), None) = (site, &located) {
        // A site that is not a file location inside the trace's tree stays text.
        let _ = write!(what, ", at {site}");
    }
    let primary = Location {
        id: None,
        physical_location: located.or_else(|| {
            trace.map(|t| PhysicalLocation {
                artifact_location: t.clone(),
                region: None,
            })
        }),
        logical_locations: vec![op_location(h.op)],
        message: Some(Text::message(&what)),
    };

    let mut related = Vec::new();
    if let (Some(r), Some(line)) = (&h.detail.replay, super::text::replay_line(h)) {
        // A replay's hazard is reported at the launch; the captured op is where the code is.
        related.push(related_location(
            related.len() + 1,
            format!("op {}: {line}", r.captured),
            r.captured,
            r.captured_site.as_deref(),
        ));
    }
    for c in &h.conflicts {
        let (op, site) = match c.captured {
            Some(m) => (m, c.captured_site.as_deref().or(c.site.as_deref())),
            None => (c.op, c.site.as_deref()),
        };
        related.push(related_location(
            related.len() + 1,
            conflict_message(c),
            op,
            site,
        ));
    }
    for n in &h.detail.notes {
        related.push(related_location(
            related.len() + 1,
            format!("op {}: {}", n.op, n.what),
            n.op,
            n.site.as_deref(),
        ));
    }
    if let Some(f) = &h.free {
        if !h.detail.notes.iter().any(|n| n.op == f.op) {
            related.push(related_location(
                related.len() + 1,
                format!("op {}: {} freed here", f.op, f.buffer),
                f.op,
                None,
            ));
        }
    }

    let stacks = match site {
        Some(Site::Stack(frames)) if !frames.is_empty() => vec![Stack {
            message: Text::new(format!("call stack of op {}", h.op)),
            frames: frames
                .iter()
                .map(|f| StackFrame {
                    location: Location {
                        physical_location: parse_location(f).and_then(|l| l.physical()),
                        message: Some(Text::message(f)),
                        ..Location::default()
                    },
                })
                .collect(),
        }],
        _ => Vec::new(),
    };

    let participant = h
        .access
        .as_ref()
        .map(|a| a.participant.clone())
        .or_else(|| Some(h.detail.participant.clone()).filter(|p| !p.is_empty()));

    SarifResult {
        rule_id: h.kind.as_str(),
        rule_index: rule_index(h.kind),
        level: level(h.severity),
        message: Text::message(&message(h)),
        locations: vec![primary],
        related_locations: related,
        stacks,
        partial_fingerprints: Fingerprints {
            hazard: fingerprint(h, site),
        },
        analysis_target: trace.cloned(),
        properties: ResultProperties {
            op: h.op,
            buffer: h.buffer.clone(),
            pattern: h.pattern.map(|p| p.as_str()),
            participant,
            fix: h.fix.clone(),
            confirmation: h.confirmation.clone(),
        },
    }
}

/// The id of the rule of redundant synchronization ops (`check --syncs`).
pub const REDUNDANT_SYNC: &str = "redundant-sync";

/// The rule of redundant synchronization ops, after the hazard kinds' (only with `--syncs`).
fn redundant_sync_rule() -> Rule {
    Rule {
        id: REDUNDANT_SYNC,
        name: "RedundantSync",
        short_description: Text::new(
            "A synchronization op that the program's memory safety does not need.",
        ),
        full_description: Text::new(
            "A synchronization op (an event wait, a host sync or successful query, a              record_stream) whose removal alone adds no hazard: the trace without it has no              error the trace as written does not have. Every synchronization costs: a host sync              stalls the host and drains the pipeline, an event wait serialises streams. Two              redundant ops may not be removable together (streamsan fix --remove-redundant              removes those that are).",
        ),
        default_configuration: Configuration { level: "note" },
        help: Text::new(
            "Remove it. If it is there for timing, time with CUDA events instead              (cudaEventRecord and cudaEventElapsedTime; in PyTorch              torch.cuda.Event(enable_timing=True)).",
        ),
        properties: RuleProperties {
            tags: ["performance", "synchronization", "gpu"],
        },
    }
}

/// A note for a redundant synchronization op, at its site.
fn redundant_sync(
    v: &super::syncs::SyncVerdict,
    clean: bool,
    trace: Option<&ArtifactLocation>,
) -> SarifResult {
    let site = v.site.as_deref();
    let located = site.and_then(physical);
    let mut what = format!("op {}: {}", v.op, v.kind);
    if let (Some(site), None) = (site, &located) {
        let _ = write!(what, ", at {site}");
    }
    let keeps = if clean {
        "removing it keeps the program hazard-free"
    } else {
        "removing it alone adds no hazard"
    };
    let stacks = match site {
        Some(Site::Stack(frames)) if !frames.is_empty() => vec![Stack {
            message: Text::new(format!("call stack of op {}", v.op)),
            frames: frames
                .iter()
                .map(|f| StackFrame {
                    location: Location {
                        physical_location: parse_location(f).and_then(|l| l.physical()),
                        message: Some(Text::message(f)),
                        ..Location::default()
                    },
                })
                .collect(),
        }],
        _ => Vec::new(),
    };
    SarifResult {
        rule_id: REDUNDANT_SYNC,
        rule_index: HazardKind::ALL.len(),
        level: "note",
        message: Text::message(&format!(
            "redundant {} at op {}: {keeps}; if it is there for timing, time with CUDA events instead.",
            v.kind, v.op
        )),
        locations: vec![Location {
            id: None,
            physical_location: located.or_else(|| {
                trace.map(|t| PhysicalLocation {
                    artifact_location: t.clone(),
                    region: None,
                })
            }),
            logical_locations: vec![op_location(v.op)],
            message: Some(Text::message(&what)),
        }],
        related_locations: Vec::new(),
        stacks,
        partial_fingerprints: Fingerprints {
            hazard: match site {
                Some(s) => format!("{REDUNDANT_SYNC}:{}:{s}", v.kind),
                None => format!("{REDUNDANT_SYNC}:{}:op {}", v.kind, v.op),
            },
        },
        analysis_target: trace.cloned(),
        properties: ResultProperties {
            op: v.op,
            buffer: None,
            pattern: None,
            participant: None,
            fix: Some(format!("remove the {} at op {}", v.kind, v.op)),
            confirmation: None,
        },
    }
}

fn op_location(op: u64) -> LogicalLocation {
    LogicalLocation {
        name: format!("op {op}"),
        kind: OP_KIND,
    }
}

fn related_location(id: usize, mut message: String, op: u64, site: Option<&Site>) -> Location {
    let located = site.and_then(physical);
    if let (Some(site), None) = (site, &located) {
        // A site that is not a file location inside the trace's tree stays text.
        let _ = write!(message, ", at {site}");
    }
    Location {
        id: Some(id),
        physical_location: located,
        logical_locations: vec![op_location(op)],
        message: Some(Text::message(&message)),
    }
}

/// `"read of x[0, 4096) by stream s1 at op 7"`, with the kernel name when known.
fn conflict_message(c: &Conflict) -> String {
    let verb = match c.access {
        AccessKind::Read => "read",
        AccessKind::Write => "write",
        AccessKind::Alloc => "allocation",
        AccessKind::Free => "free",
    };
    let range = match c.bytes {
        Some(b) => format!("[{}, {})", c.offset, c.offset.saturating_add(b)),
        None if c.offset == 0 => "(whole)".to_string(),
        None => format!("[{}, end)", c.offset),
    };
    let who = if c.participant == crate::trace::HOST {
        "the host".to_string()
    } else {
        format!("stream {}", c.participant)
    };
    let mut s = format!("{verb} of {}{range} by {who} at op {}", c.buffer, c.op);
    if let Some(m) = c.captured {
        let _ = write!(s, " (the replay of op {m})");
    }
    if let Some(l) = &c.label {
        let _ = write!(s, " (kernel `{l}`)");
    }
    s
}

/// `<kind>:<buffer>:<site>`, or `<kind>:<buffer>:op N` without a site; `-` for no buffer.
fn fingerprint(h: &Hazard, site: Option<&Site>) -> String {
    let buffer = h.buffer.as_deref().unwrap_or("-");
    match site {
        Some(s) => format!("{}:{buffer}:{s}", h.kind),
        None => format!("{}:{buffer}:op {}", h.kind, h.op),
    }
}

/// The file location of a site: the label, or the innermost frame of a stack that parses and
/// whose path stays inside the trace's tree.
fn physical(site: &Site) -> Option<PhysicalLocation> {
    match site {
        Site::Label(s) => parse_location(s)?.physical(),
        Site::Stack(frames) => frames.iter().find_map(|f| parse_location(f)?.physical()),
    }
}

/// A `path:line[:col]` site frame.
#[derive(Debug, PartialEq, Eq)]
struct FileLocation<'a> {
    path: &'a str,
    line: u64,
    column: Option<u64>,
}

impl FileLocation<'_> {
    /// The physical location, when the path is one [`contained_uri`] accepts.
    fn physical(&self) -> Option<PhysicalLocation> {
        Some(PhysicalLocation {
            artifact_location: ArtifactLocation {
                uri: contained_uri(self.path)?,
                index: None,
            },
            region: Some(Region {
                start_line: self.line,
                start_column: self.column,
            }),
        })
    }
}

/// A site's path as a relative URI reference that stays inside the tree it is relative to, or
/// `None`: a site comes from the trace, and must not point a SARIF viewer at any file it names
/// (`file:///etc/passwd`, `/home/u/.ssh/id_rsa`, `../../x`). `\` becomes `/`; absolute paths
/// (`/…`, `//server/…`, `C:…`) and anything whose first segment holds a `:` (a URI scheme such
/// as `file:` or `https:`, a drive) are refused; `.` segments and empty ones are dropped, and a
/// `..` must have a segment of the path itself to undo. Characters a URI cannot hold are
/// percent-encoded (a `%` too, so `%2e%2e` stays literal text).
fn contained_uri(path: &str) -> Option<String> {
    let p = path.replace('\\', "/");
    if p.starts_with('/') || p.split('/').next().is_some_and(|s| s.contains(':')) {
        return None;
    }
    let mut segments: Vec<&str> = Vec::new();
    for segment in p.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop()?;
            }
            s => segments.push(s),
        }
    }
    if segments.is_empty() {
        return None;
    }
    Some(encode(&segments.join("/")))
}

/// A positive decimal integer with no sign, or `None`.
fn positive(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|&n| n > 0)
}

/// Parses `path:line` or `path:line:col` from the right: the path may contain `:` (a Windows
/// drive letter), line and column are positive integers, and the path is not empty.
fn parse_location(frame: &str) -> Option<FileLocation<'_>> {
    let frame = frame.trim();
    let (rest, last) = frame.rsplit_once(':')?;
    let last = positive(last)?;
    let (path, line, column) = match rest.rsplit_once(':') {
        Some((path, mid)) if !mid.is_empty() && mid.bytes().all(|b| b.is_ascii_digit()) => {
            (path, positive(mid)?, Some(last))
        }
        _ => (rest, last, None),
    };
    if path.trim().is_empty() {
        return None;
    }
    Some(FileLocation { path, line, column })
}

/// A path as a URI reference: `\` becomes `/`; relative paths stay relative (with `./` in front
/// when their first segment has a `:`, which would read as a scheme); absolute paths and Windows
/// drive paths become `file://` URIs. Characters that a URI may not hold are percent-encoded.
fn path_to_uri(path: &str) -> String {
    let p = path.replace('\\', "/");
    if p.starts_with("file://") {
        return p;
    }
    let b = p.as_bytes();
    let drive = b.len() >= 2
        && b[0].is_ascii_alphabetic()
        && b[1] == b':'
        && (b.len() == 2 || b[2] == b'/');
    if drive {
        format!("file:///{}", encode(&p))
    } else if p.starts_with("//") {
        // A UNC path: //server/share/…
        format!("file:{}", encode(&p))
    } else if p.starts_with('/') {
        format!("file://{}", encode(&p))
    } else if p.split('/').next().is_some_and(|seg| seg.contains(':')) {
        format!("./{}", encode(&p))
    } else {
        encode(&p)
    }
}

/// Percent-encodes every byte that is not allowed as such in a URI path.
fn encode(p: &str) -> String {
    let mut s = String::with_capacity(p.len());
    for &b in p.as_bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b);
        if keep {
            s.push(b as char);
        } else {
            let _ = write!(s, "%{b:02X}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(path: &str, line: u64, column: Option<u64>) -> Option<FileLocation<'_>> {
        Some(FileLocation { path, line, column })
    }

    #[test]
    fn parses_path_line_and_column() {
        assert_eq!(
            parse_location("src/pipeline.rs:21:5"),
            loc("src/pipeline.rs", 21, Some(5))
        );
        assert_eq!(parse_location("train.py:45"), loc("train.py", 45, None));
        assert_eq!(
            parse_location(" src/a.rs:3:4 "),
            loc("src/a.rs", 3, Some(4))
        );
    }

    #[test]
    fn windows_paths_keep_their_drive_letter() {
        assert_eq!(
            parse_location("C:\\x\\y.rs:3:4"),
            loc("C:\\x\\y.rs", 3, Some(4))
        );
        assert_eq!(parse_location("C:\\x\\y.rs:3"), loc("C:\\x\\y.rs", 3, None));
        assert_eq!(
            parse_location("C:/x/y.rs:10:2"),
            loc("C:/x/y.rs", 10, Some(2))
        );
    }

    #[test]
    fn rejects_what_is_not_a_file_location() {
        for s in [
            "a:b",
            "my-label",
            "file.rs",
            "file.rs:0",
            "file.rs:0:5",
            "file.rs:5:0",
            "file.rs:12:x",
            "file.rs:x:12:",
            "file.rs:+3",
            "file.rs:-3",
            "file.rs:3.5",
            ":12",
            ":12:4",
            "",
            "file.rs:99999999999999999999999",
        ] {
            assert_eq!(parse_location(s), None, "{s:?}");
        }
    }

    #[test]
    fn a_colon_in_the_path_is_kept() {
        assert_eq!(parse_location("a:b:7"), loc("a:b", 7, None));
        assert_eq!(parse_location("a:b:7:8"), loc("a:b", 7, Some(8)));
    }

    #[test]
    fn paths_become_uri_references() {
        assert_eq!(path_to_uri("src/pipeline.rs"), "src/pipeline.rs");
        assert_eq!(path_to_uri("src\\win\\a.rs"), "src/win/a.rs");
        assert_eq!(path_to_uri("C:\\x\\y.rs"), "file:///C:/x/y.rs");
        assert_eq!(path_to_uri("/home/u/a.rs"), "file:///home/u/a.rs");
        assert_eq!(path_to_uri("\\\\srv\\share\\a.rs"), "file://srv/share/a.rs");
        assert_eq!(path_to_uri("my dir/a%b.rs"), "my%20dir/a%25b.rs");
        assert_eq!(path_to_uri("a:b/c.rs"), "./a:b/c.rs");
        assert_eq!(path_to_uri("dir/é.rs"), "dir/%C3%A9.rs");
        assert_eq!(path_to_uri("file:///x/y.rs"), "file:///x/y.rs");
    }

    #[test]
    fn only_paths_inside_the_tree_become_uris() {
        assert_eq!(
            contained_uri("src/pipeline.rs").as_deref(),
            Some("src/pipeline.rs")
        );
        assert_eq!(
            contained_uri("src\\win\\a.rs").as_deref(),
            Some("src/win/a.rs")
        );
        assert_eq!(contained_uri("./a/./b/../c.rs").as_deref(), Some("a/c.rs"));
        assert_eq!(
            contained_uri("my dir/a%2e.rs").as_deref(),
            Some("my%20dir/a%252e.rs")
        );
        for outside in [
            "/etc/passwd",
            "file:///etc/passwd",
            "file:/etc/passwd",
            "https://example.com/x",
            "C:\\x\\y.rs",
            "C:/x/y.rs",
            "\\\\srv\\share\\a.rs",
            "//srv/share/a.rs",
            "../x",
            "../../x",
            "a/../../x",
            "a/b/../../../x",
            "..",
            ".",
            "",
            "a:b/c.rs",
        ] {
            assert_eq!(contained_uri(outside), None, "{outside:?}");
        }
        let site = |s: &str| physical(&Site::Label(s.into())).map(|p| p.artifact_location.uri);
        assert_eq!(site("src/a.rs:3:4").as_deref(), Some("src/a.rs"));
        assert_eq!(site("file:///etc/passwd:1:1"), None);
        assert_eq!(site("/abs/path:1:1"), None);
        assert_eq!(site("../../x:1:1"), None);
        // In a stack, the innermost frame inside the tree.
        let stack = Site::Stack(vec!["/usr/lib/x.py:3".into(), "train.py:9".into()]);
        let uri = physical(&stack).map(|p| p.artifact_location.uri);
        assert_eq!(uri.as_deref(), Some("train.py"));
    }

    #[test]
    fn brackets_in_messages_are_escaped() {
        assert_eq!(escape_brackets("x[0, 4096)"), "x\\[0, 4096)");
        assert_eq!(escape_brackets("see [here](1)"), "see \\[here\\](1)");
        assert_eq!(escape_brackets("a\\[b"), "a\\\\\\[b");
        assert_eq!(escape_brackets("C:\\x\\y"), "C:\\x\\y");
        assert_eq!(escape_brackets("plain"), "plain");
    }

    #[test]
    fn stacks_use_the_innermost_frame_that_parses() {
        let site = Site::Stack(vec![
            "<built-in>".into(),
            "lib/ops.py:10".into(),
            "train.py:45:3".into(),
        ]);
        let p = physical(&site).map(|p| (p.artifact_location.uri, p.region.map(|r| r.start_line)));
        assert_eq!(p, Some(("lib/ops.py".to_string(), Some(10))));
        assert!(physical(&Site::Stack(vec![])).is_none());
        assert!(physical(&Site::Label("step 3".into())).is_none());
    }
}
