//! The report's synchronization verdicts (`--syncs`): the data of the JSON report's `syncs`
//! array and its text rendering. The analysis that computes them is
//! [`crate::analysis::syncs`]; the report owns what it prints.

use std::sync::Arc;

use serde::Serialize;

use super::{Hazard, HazardKind};
use crate::trace::Site;

/// An error of a trace as the analysis compares them: its kind, the op it is reported at, and
/// its buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ErrorKey {
    /// The hazard kind (always of severity error).
    pub kind: HazardKind,
    /// The op index it is reported at.
    pub op: u64,
    /// Its buffer.
    pub buffer: Option<String>,
}

impl ErrorKey {
    /// The key of an error hazard.
    pub fn of(h: &Hazard) -> ErrorKey {
        ErrorKey {
            kind: h.kind,
            op: h.op,
            buffer: h.buffer.clone(),
        }
    }

    fn sort_key(&self) -> (u64, HazardKind, Option<&str>) {
        (self.op, self.kind, self.buffer.as_deref())
    }
}

impl PartialOrd for ErrorKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ErrorKey {
    /// Sorted like a report's hazards: by op, then kind, then buffer.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.sort_key().cmp(&other.sort_key())
    }
}

impl std::fmt::Display for ErrorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.buffer {
            Some(b) => write!(f, "{} on {} at op {}", self.kind, b, self.op),
            None => write!(f, "{} at op {}", self.kind, self.op),
        }
    }
}

/// The verdict on one synchronization op: the JSON report's `syncs` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SyncVerdict {
    /// Its op index.
    pub op: u64,
    /// Its op name (`"event_wait"`, `"stream_sync"`, …).
    pub kind: &'static str,
    /// Its site, as given.
    pub site: Option<Arc<Site>>,
    /// Whether the trace without it has an error the trace as written does not have.
    pub needed: bool,
    /// Those errors, sorted like the report's hazards; empty when it is redundant.
    pub prevents: Vec<ErrorKey>,
}

/// The text output of the analysis: a summary line, then one line per site (or per op without a
/// site) with the count of its synchronization ops and how many were needed and redundant, in
/// three groups: redundant sites first (under the advice that applies to each of them), then
/// sites with some redundant ops, then sites whose every op was needed. `clean`: whether the
/// trace has no error (a redundant sync then keeps the program hazard-free; otherwise it adds no
/// hazard).
pub fn render_text(syncs: &[SyncVerdict], clean: bool) -> String {
    use std::fmt::Write as _;
    // Sites with a label, grouped; an op without a site is a group of its own (most ops of a
    // trace without sites: no table for them).
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut labelled: Vec<(String, Vec<usize>)> = Vec::new();
    for (k, v) in syncs.iter().enumerate() {
        if let Some(site) = &v.site {
            let key = site.to_string();
            match index.get(&key) {
                Some(&g) => labelled[g].1.push(k),
                None => {
                    index.insert(key.clone(), labelled.len());
                    labelled.push((key, vec![k]));
                }
            }
        }
    }
    let rank = |members: &[usize]| {
        let needed = members.iter().filter(|&&k| syncs[k].needed).count();
        match needed {
            0 => 0,
            n if n < members.len() => 1,
            _ => 2,
        }
    };
    let mut groups: Vec<(u8, u64, Option<usize>, usize)> = labelled
        .iter()
        .enumerate()
        .map(|(g, (_, m))| (rank(m), syncs[m[0]].op, Some(g), m[0]))
        .collect();
    groups.extend(
        syncs
            .iter()
            .enumerate()
            .filter(|(_, v)| v.site.is_none())
            .map(|(k, v)| (if v.needed { 2 } else { 0 }, v.op, None, k)),
    );
    groups.sort_unstable_by_key(|&(r, op, _, _)| (r, op));
    let plural = |n: u64, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    let total = syncs.len() as u64;
    let needed = syncs.iter().filter(|s| s.needed).count() as u64;
    let mut out = String::with_capacity(64 + 80 * groups.len());
    let _ = writeln!(
        out,
        "synchronization: {} at {}: {} needed, {} redundant",
        plural(total, "synchronization op"),
        plural(groups.len() as u64, "site"),
        needed,
        total - needed
    );
    let keeps = if clean {
        "removing it keeps the program hazard-free"
    } else {
        "removing it alone adds no hazard"
    };
    let mut current = None;
    for &(r, _, g, k) in &groups {
        if current != Some(r) {
            current = Some(r);
            let _ = match r {
                0 => writeln!(
                    out,
                    "redundant — {keeps}; if it is there for timing, time with CUDA events instead:"
                ),
                1 => writeln!(
                    out,
                    "partly needed — the redundant ones can go, each alone:"
                ),
                _ => writeln!(out, "needed:"),
            };
        }
        let (members, label): (Vec<usize>, Option<&str>) = match g {
            Some(g) => (labelled[g].1.clone(), Some(labelled[g].0.as_str())),
            None => (vec![k], None),
        };
        out.push_str("  ");
        match label {
            Some(site) => out.push_str(&crate::text::escape(site)),
            None => {
                let _ = write!(out, "op {}", syncs[k].op);
            }
        }
        out.push_str(" (");
        let mut kinds: Vec<&str> = Vec::new();
        for &m in &members {
            if !kinds.contains(&syncs[m].kind) {
                kinds.push(syncs[m].kind);
            }
        }
        out.push_str(&kinds.join(", "));
        let count = members.len();
        let needed = members.iter().filter(|&&m| syncs[m].needed).count();
        let _ = write!(
            out,
            "): {count} synchronization{}, {needed} needed, {} redundant",
            if count == 1 { "" } else { "s" },
            count - needed
        );
        if r > 0 {
            let mut prevents: Vec<ErrorKey> = members
                .iter()
                .flat_map(|&m| syncs[m].prevents.iter().cloned())
                .collect();
            prevents.sort();
            prevents.dedup();
            if r == 1 {
                let redundant: Vec<u64> = members
                    .iter()
                    .filter(|&&m| !syncs[m].needed)
                    .map(|&m| syncs[m].op)
                    .collect();
                let _ = write!(
                    out,
                    " ({}); the needed ones prevent {}",
                    op_list(&redundant),
                    error_list(&prevents)
                );
            } else {
                let _ = write!(out, "; prevents {}", error_list(&prevents));
            }
        }
        out.push('\n');
    }
    out
}

/// A list of op indices, the first few of them: `"ops 3, 9 and 12"`, `"ops 3, 9, 12, … (40)"`.
fn op_list(ops: &[u64]) -> String {
    const SHOWN: usize = 5;
    let shown: Vec<String> = ops.iter().take(SHOWN).map(|o| o.to_string()).collect();
    let word = if ops.len() == 1 { "op" } else { "ops" };
    match ops.len() {
        0 => String::new(),
        1 => format!("{word} {}", shown[0]),
        n if n <= SHOWN => format!("{word} {} and {}", shown[..n - 1].join(", "), shown[n - 1]),
        n => format!("{word} {}, … ({n} in all)", shown.join(", ")),
    }
}

/// A list of errors, the first few of them.
fn error_list(errors: &[ErrorKey]) -> String {
    const SHOWN: usize = 3;
    let shown: Vec<String> = errors
        .iter()
        .take(SHOWN)
        .map(|e| crate::text::escape(&e.to_string()).into_owned())
        .collect();
    let more = errors.len().saturating_sub(SHOWN);
    let mut s = shown.join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}
