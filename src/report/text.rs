//! Text reports in the style of rustc and Miri diagnostics: a title naming both operations and
//! their participants, the hazard's own op as the primary location, the conflicting accesses,
//! `note:`s with the allocation and free, `why:` (when the dependency graph explained it: the
//! last synchronization each side had, the missing edge), and `help:` with the missing
//! synchronization in CUDA and PyTorch terms.
//!
//! Everything that comes from the trace (ids, kernel names, sites) and every sentence built from
//! it goes through [`escape`] before it is written: control characters in an id cannot move the
//! cursor, clear the screen or start a line of their own, with or without colour.

use std::fmt::Write as _;

use super::{AccessKind, Conflict, FixPlan, Hazard, HazardKind, Report, Severity, Wait};
use crate::text::escape;

/// How to render text.
#[derive(Clone, Debug, Default)]
pub struct TextOptions {
    /// Emit ANSI colours.
    pub color: bool,
    /// The trace's file name, shown with op locations.
    pub file: Option<String>,
}

impl TextOptions {
    /// Plain text, no colour.
    pub fn plain() -> Self {
        TextOptions::default()
    }

    /// Colour when `stream` is a terminal and `NO_COLOR` is unset.
    pub fn for_terminal(is_terminal: bool) -> Self {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        TextOptions {
            color: is_terminal && !no_color,
            file: None,
        }
    }
}

struct Paint(bool);

impl Paint {
    fn wrap(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn error(&self, s: &str) -> String {
        self.wrap("1;31", s)
    }
    fn warning(&self, s: &str) -> String {
        self.wrap("1;33", s)
    }
    fn blue(&self, s: &str) -> String {
        self.wrap("1;34", s)
    }
    fn help(&self, s: &str) -> String {
        self.wrap("1;32", s)
    }
    fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }
}

fn range(offset: u64, bytes: Option<u64>) -> String {
    match bytes {
        Some(b) => format!("[{offset}, {})", offset.saturating_add(b)),
        None if offset == 0 => "(whole)".to_string(),
        None => format!("[{offset}, end)"),
    }
}

fn verb(kind: AccessKind) -> &'static str {
    match kind {
        AccessKind::Read => "read",
        AccessKind::Write => "write",
        AccessKind::Alloc => "allocation",
        AccessKind::Free => "free",
    }
}

fn who(participant: &str) -> String {
    if participant == crate::trace::HOST {
        "the host".to_string()
    } else {
        format!("stream {participant}")
    }
}

fn conflict_line(c: &Conflict) -> String {
    let mut s = format!(
        "{} of {}{} by {} at op {}",
        verb(c.access),
        c.buffer,
        range(c.offset, c.bytes),
        who(&c.participant),
        c.op
    );
    if let Some(m) = c.captured {
        let _ = write!(s, " (the replay of op {m})");
    }
    if let Some(l) = &c.label {
        let _ = write!(s, " (kernel `{l}`)");
    }
    match (&c.captured_site, &c.site) {
        (Some(site), _) | (None, Some(site)) => {
            let _ = write!(s, ", {site}");
        }
        (None, None) => {}
    }
    s
}

/// `op N`, or `op N (the replay of op M)` for a replay's access.
fn op_of(op: u64, captured: Option<u64>) -> String {
    match captured {
        Some(m) => format!("op {op} (the replay of op {m})"),
        None => format!("op {op}"),
    }
}

/// `in graph g, replay at op N of the launch captured at op M`: where a replay's hazard is.
pub(crate) fn replay_line(h: &Hazard) -> Option<String> {
    let r = h.detail.replay.as_ref()?;
    let mut s = format!(
        "in graph {}, replay at op {} of the {} captured at op {}",
        r.graph, h.op, r.captured_name, r.captured
    );
    if let Some(site) = &r.captured_site {
        let _ = write!(s, ", {site}");
    }
    Some(s)
}

/// `in graph g, replay at op N of the launch captured at op M (the earlier access)`: for each
/// conflict that is another launch's replay (a replay's own conflicts are in its
/// [`replay_line`]).
fn conflict_replay_lines(h: &Hazard) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for c in &h.conflicts {
        let Some(r) = c.replay.as_ref().filter(|_| c.op != h.op) else {
            continue;
        };
        let line = format!(
            "in graph {}, replay at op {} of the {} captured at op {} (the earlier access)",
            r.graph, c.op, r.captured_name, r.captured
        );
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
    lines
}

/// The one-line title of a hazard, naming both operations and their participants.
pub(crate) fn title(h: &Hazard) -> String {
    let buffer = h.buffer.as_deref().unwrap_or("?");
    let me = h.access.as_ref();
    let first = h.conflicts.last();
    // `op N`, and for a replay's access `op N (the replay of op M)`.
    let mine = op_of(h.op, me.and_then(|a| a.captured));
    let theirs = first.map(|c| op_of(c.op, c.captured)).unwrap_or_default();
    let more = match h.conflicts.len() {
        0 | 1 => String::new(),
        n => format!(" (and {} more)", n - 1),
    };
    match h.kind {
        HazardKind::DataRace => match (me, first) {
            (Some(a), Some(c)) => format!(
                "data race on {buffer}: {} by {} at {} is not ordered after the {} by {} at {}{more}",
                verb(a.access),
                who(&a.participant),
                mine,
                verb(c.access),
                who(&c.participant),
                theirs
            ),
            _ => format!("data race on {buffer} at op {}", h.op),
        },
        HazardKind::ReuseRace => match (me, first, &h.free) {
            // In a graph pool, the freed buffer's replays keep using its bytes after the pool
            // handed them to another buffer.
            (Some(a), Some(c), Some(f)) if f.buffer == buffer => format!(
                "reuse race: {} of {buffer} by {} at {} touches its memory, freed at op {} and handed to {}, while the {} by {} at {} may still run{more}",
                verb(a.access),
                who(&a.participant),
                mine,
                f.op,
                c.buffer,
                verb(c.access),
                who(&c.participant),
                theirs
            ),
            (Some(a), Some(c), Some(f)) => format!(
                "reuse race: {} of {buffer} by {} at {} touches memory of {}, freed at op {}, while the {} by {} at {} may still run{more}",
                verb(a.access),
                who(&a.participant),
                mine,
                f.buffer,
                f.op,
                verb(c.access),
                who(&c.participant),
                theirs
            ),
            _ => format!("reuse race on {buffer} at op {}", h.op),
        },
        HazardKind::UnsafeFree => match (me, first) {
            (Some(a), Some(c)) => format!(
                "unsafe free of {buffer} by {} at {}: the {} by {} at {} may still be running{more}",
                who(&a.participant),
                mine,
                verb(c.access),
                who(&c.participant),
                theirs
            ),
            _ => format!("unsafe free of {buffer} at op {}", h.op),
        },
        HazardKind::UseAfterFree => format!(
            "use after free: {} on {} at op {} uses {buffer} after its free",
            h.detail.op_name,
            h.detail.participant,
            h.op
        ),
        HazardKind::InvalidFree => format!("invalid free of {buffer} at op {}", h.op),
        HazardKind::WaitOnUnrecordedEvent => format!(
            "{} waits at op {} on event {}, which is not recorded: the wait has no effect",
            who(&h.detail.participant),
            h.op,
            h.detail.event.as_deref().unwrap_or("?")
        ),
    }
}

/// `a`, `a and b`, `a, b, and c`.
fn list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [a] => a.clone(),
        [a, b] => format!("{a} and {b}"),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

/// A wait in words: record an event on each earlier stream and make the waiter wait on it.
fn wait_sentence(w: &Wait) -> String {
    let i = w.before;
    if w.waiter == crate::trace::HOST {
        let parts: Vec<String> = w
            .after
            .iter()
            .map(|a| format!("{} after op {}", a.stream, a.op))
            .collect();
        return format!(
            "make the host wait for {} before op {i}: record an event there and event_sync it, or stream_sync the stream",
            list(&parts)
        );
    }
    let parts: Vec<String> = w
        .after
        .iter()
        .map(|a| format!("on {} after op {}", a.stream, a.op))
        .collect();
    let (event, them) = if w.after.len() == 1 {
        ("an event", "it")
    } else {
        ("events", "them")
    };
    format!(
        "record {event} {} and make {} wait on {them} before op {i}",
        list(&parts),
        w.waiter
    )
}

/// A fix plan in one sentence: the report's `fix` (and the text report's `help:`).
pub(crate) fn fix_sentence(plan: &FixPlan) -> String {
    match plan {
        FixPlan::Wait(w) => wait_sentence(w),
        FixPlan::RecordStream {
            buffer,
            streams,
            free,
            reused: true,
            or,
            ..
        } => format!(
            "call record_stream({buffer}, {}) before its free at op {free} so its memory is not reused while that work runs, or {}",
            list(streams),
            wait_sentence(or)
        ),
        FixPlan::RecordStream {
            buffer,
            streams,
            free,
            or,
            ..
        } => format!(
            "call record_stream({buffer}, {}) before the free at op {free}, or {}",
            list(streams),
            wait_sentence(or)
        ),
        FixPlan::Replay {
            graph,
            launch,
            capture,
        } => {
            let mut parts: Vec<String> = launch.iter().map(fix_sentence).collect();
            for (k, p) in capture.iter().enumerate() {
                if k == 0 {
                    parts.push(format!("in the capture of graph {graph}, {}", fix_sentence(p)));
                } else {
                    parts.push(fix_sentence(p));
                }
            }
            parts.join("; and ")
        }
        FixPlan::MoveFree {
            buffer,
            free,
            before,
        } => format!(
            "{buffer} was freed at {}: move that free after op {before}, or allocate {buffer} again before using it",
            free_at(*free)
        ),
        FixPlan::FreeAfterReplays {
            buffer,
            free,
            graph,
            captured,
        } => format!(
            "{buffer} was freed at {} while graph {graph} still uses it (captured at op {captured}): free it only after the graph's last launch, or capture the graph again",
            free_at(*free)
        ),
        FixPlan::RemoveFree { buffer, at, why } => {
            format!("remove the free of {buffer} at op {at}: the buffer {why}")
        }
        FixPlan::RecordEvent {
            event,
            waiter,
            before,
        } => format!(
            "record event {event} on the stream whose work {waiter} must wait for before op {before}; this wait has no effect"
        ),
    }
}

/// Where a buffer was freed: its op, or, for a free whose op the checker no longer keeps, that.
fn free_at(op: Option<u64>) -> String {
    match op {
        Some(op) => format!("op {op}"),
        None => "an op no longer kept".to_string(),
    }
}

/// Terms of the fix in CUDA and PyTorch, for the hazard's kind: one line each. (None for a
/// graph replay's hazard: its participants are no streams of the program; the fix names them.)
fn terms(h: &Hazard) -> Vec<String> {
    if h.detail.replay.is_some() || h.conflicts.iter().any(|c| c.captured.is_some()) {
        // A replay's: the plan's wait around the launch names the program's streams.
        let wait = match &h.detail.plan {
            Some(FixPlan::Wait(w)) => Some(w),
            Some(FixPlan::Replay { launch, .. }) => launch.iter().find_map(|p| match p {
                FixPlan::Wait(w) => Some(w),
                _ => None,
            }),
            _ => None,
        };
        return match wait.and_then(|w| Some((w.waiter.as_str(), w.after.first()?))) {
            Some((later, first)) if first.stream != crate::trace::HOST => {
                wait_terms(first.stream.as_str(), later)
            }
            _ => vec![],
        };
    }
    let later = h
        .access
        .as_ref()
        .map(|a| a.participant.as_str())
        .unwrap_or(h.detail.participant.as_str());
    let Some(earlier) = h
        .conflicts
        .iter()
        .map(|c| c.participant.as_str())
        .find(|p| *p != crate::trace::HOST)
    else {
        return vec![];
    };
    if !matches!(
        h.kind,
        HazardKind::DataRace | HazardKind::ReuseRace | HazardKind::UnsafeFree
    ) {
        return vec![];
    }
    let mut v = Vec::new();
    if h.detail
        .plan
        .as_ref()
        .is_some_and(FixPlan::names_record_stream)
    {
        let t = h
            .free
            .as_ref()
            .map(|f| f.buffer.as_str())
            .or(h.buffer.as_deref())
            .unwrap_or("tensor");
        v.push(format!(
            "in PyTorch: {t}.record_stream({earlier}) before {t} is freed"
        ));
    }
    v.extend(wait_terms(earlier, later));
    v
}

/// `later` waits for `earlier`'s work, in CUDA and PyTorch terms.
fn wait_terms(earlier: &str, later: &str) -> Vec<String> {
    let mut v = Vec::new();
    if later == crate::trace::HOST {
        v.push(format!(
            "in CUDA:    cudaEventRecord(ev, {earlier}); cudaEventSynchronize(ev)  (or cudaStreamSynchronize({earlier}))"
        ));
        v.push(format!(
            "in PyTorch: ev.record({earlier}); ev.synchronize()  (or {earlier}.synchronize())"
        ));
    } else {
        v.push(format!(
            "in CUDA:    cudaEventRecord(ev, {earlier}); cudaStreamWaitEvent({later}, ev)"
        ));
        v.push(format!("in PyTorch: ev.record({earlier}); {later}.wait_event(ev)  (or {later}.wait_stream({earlier}))"));
    }
    v
}

/// Renders one hazard.
pub fn render_hazard(h: &Hazard, opts: &TextOptions) -> String {
    let p = Paint(opts.color);
    let mut s = String::new();
    let head = match h.severity {
        Severity::Error => p.error(&format!("error[{}]", h.kind)),
        Severity::Warning => p.warning(&format!("warning[{}]", h.kind)),
    };
    let _ = writeln!(s, "{head}{}", p.bold(&format!(": {}", escape(&title(h)))));
    let mut what = format!("op {}: {}", h.op, h.detail.op_name);
    if let Some(r) = &h.detail.replay {
        let _ = write!(what, " of {}, replaying the {}", r.graph, r.captured_name);
    }
    if let Some(l) = &h.detail.label {
        let _ = write!(what, " `{l}`");
    }
    if !h.detail.participant.is_empty() {
        let _ = write!(what, " on {}", h.detail.participant);
    }
    let what = escape(&what);
    let file = escape(opts.file.as_deref().unwrap_or("trace"));
    match h.access.as_ref().and_then(|a| a.site.as_ref()) {
        Some(site) => {
            let site = escape(&site.to_string()).into_owned();
            let _ = writeln!(s, "  {} {site}  ({file}, {what})", p.blue("-->"));
        }
        None => {
            let _ = writeln!(s, "  {} {file}: {what}", p.blue("-->"));
        }
    }
    let bar = p.blue("   |");
    if let Some(line) = replay_line(h) {
        let _ = writeln!(s, "   {} {}", p.blue("="), escape(&line));
    }
    for line in conflict_replay_lines(h) {
        let _ = writeln!(s, "   {} {}", p.blue("="), escape(&line));
    }
    let _ = writeln!(s, "{bar}");
    if let (Some(a), Some(b)) = (&h.access, &h.buffer) {
        let this = format!(
            "this {}: {b}{} by {}",
            verb(a.access),
            range(a.offset, a.bytes),
            who(&a.participant)
        );
        let _ = writeln!(s, "{bar} {}", escape(&this));
    }
    for c in &h.conflicts {
        let _ = writeln!(s, "{bar} unordered with: {}", escape(&conflict_line(c)));
    }
    for n in &h.detail.notes {
        let site = n
            .site
            .as_ref()
            .map(|x| format!(" at {x}"))
            .unwrap_or_default();
        let note = format!("{} at op {}{site}", n.what, n.op);
        let _ = writeln!(
            s,
            "   {} {}: {}",
            p.blue("="),
            p.bold("note"),
            escape(&note)
        );
    }
    if !h.detail.why.is_empty() {
        let _ = writeln!(s, "{}:", p.bold("why"));
        for line in &h.detail.why {
            let _ = writeln!(s, "  - {}", escape(line));
        }
    }
    if let Some(f) = &h.fix {
        let _ = writeln!(s, "{}: {}", p.help("help"), escape(f));
    }
    for t in terms(h) {
        let _ = writeln!(s, "      {}", escape(&t));
    }
    s
}

/// Renders a whole report: every hazard, then a summary line.
pub fn render_text(report: &Report, opts: &TextOptions) -> String {
    let mut s = String::new();
    for h in &report.hazards {
        s.push_str(&render_hazard(h, opts));
        s.push('\n');
    }
    let p = Paint(opts.color);
    let plural = |n: u64, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    if let Some(syncs) = &report.syncs {
        s.push_str(&super::syncs::render_text(syncs, report.is_clean()));
    }
    if report.hazards.is_empty() {
        let _ = writeln!(
            s,
            "{}: no hazards in {}",
            p.help("streamsan"),
            plural(report.ops, "op")
        );
    } else {
        let _ = writeln!(
            s,
            "{}: {} and {} in {}",
            if report.errors > 0 {
                p.error("streamsan")
            } else {
                p.warning("streamsan")
            },
            plural(report.errors, "error"),
            plural(report.warnings, "warning"),
            plural(report.ops, "op")
        );
    }
    s
}
