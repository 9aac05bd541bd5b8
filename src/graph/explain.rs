//! Explanations: for a hazard, the conflicting accesses, the last synchronization each side did
//! have, and the edge that is missing.

use super::{did, DepGraph, How, Prov};
use crate::report::latest_by_participant;
use crate::report::{AccessKind, Hazard, HazardKind};
use crate::trace::{Op, TraceOp, HOST};

/// A verb in the present for the later access.
fn does(kind: AccessKind) -> &'static str {
    match kind {
        AccessKind::Write => "writes",
        _ => "reads",
    }
}

fn who(participant: &str) -> String {
    if participant == HOST {
        "the host".to_string()
    } else {
        format!("stream {participant}")
    }
}

/// What a provenance's synchronization op was, in words.
fn describe(p: &Prov, later: &str) -> String {
    let Some(via) = p.via else {
        return "an earlier synchronization".to_string();
    };
    let label = p.label.as_deref().unwrap_or("?");
    let whose = if p.on_host && later != HOST {
        "the host's "
    } else {
        ""
    };
    let from = p.from.map(|f| f.to_string()).unwrap_or_else(|| "?".into());
    match p.how {
        How::Event => {
            format!("{whose}`{label}` at op {via} (the event was recorded at op {from})")
        }
        How::HostSync => format!("{whose}`{label}` at op {via} (which waited for op {from})"),
        How::Legacy => {
            format!("the legacy default stream's implicit wait at op {via} (for op {from})")
        }
        How::Implicit => format!(
            "{whose}`{label}` at op {via} (its memory came back from another stream, which synchronized the device)"
        ),
        How::Own => format!("op {via}"),
    }
}

/// The explanation of hazard `h`, whose op `op` the graph has just taken: lines of text, and the
/// ops they name (to draw with the hazard).
pub(super) fn explain(g: &DepGraph, h: &Hazard, op: &TraceOp) -> (Vec<String>, Vec<u64>) {
    let (mut why, mut named) = (Vec::new(), Vec::new());
    if !matches!(
        h.kind,
        HazardKind::DataRace | HazardKind::ReuseRace | HazardKind::UnsafeFree
    ) {
        return (why, named);
    }
    let Some(access) = &h.access else {
        return (why, named);
    };
    let b = h.op;
    let buffer = h.buffer.as_deref().unwrap_or("?");
    // A replay's access is its launch's, on the launch stream: the replay starts from what that
    // stream knows at the launch, and joins it at its end. Conflicts between the captured ops of
    // the same replay are the capture's.
    let later_name;
    let later = match (access.captured, g.launches.get(&b)) {
        (None, _) => access.participant.as_str(),
        (Some(m), Some((l, graph))) => {
            later_name = g.lanes[*l].name.clone();
            why.push(format!(
                "the replay of {graph} launched on {later_name} at op {b} {} {buffer}, captured at op {m}: it starts from what {later_name} knows at op {b}",
                does(access.access)
            ));
            later_name.as_str()
        }
        (Some(_), None) => return (why, named),
    };
    let mut inside = Vec::new();
    let mut conflicts = Vec::new();
    let mut replayed: Vec<(String, u64, u64, String)> = Vec::new();
    for c in &h.conflicts {
        match (c.captured, g.launches.get(&c.op)) {
            (Some(_), _) if c.op == b => inside.push(c),
            (Some(m), Some((l, graph))) => {
                let mut c = c.clone();
                c.participant = g.lanes[*l].name.clone();
                replayed.push((c.participant.clone(), c.op, m, graph.to_string()));
                c.captured = None;
                conflicts.push(c);
            }
            (Some(_), None) => return (Vec::new(), Vec::new()),
            (None, _) => conflicts.push(c.clone()),
        }
    }
    let know = g.knowledge(later);
    let latest = latest_by_participant(&conflicts);
    for &(p, a) in &latest {
        let Some(c) = conflicts.iter().find(|c| c.participant == p && c.op == a) else {
            continue;
        };
        let lane = g.lane_index(p);
        let prov = lane.map(|l| know.get(l)).unwrap_or_default();
        let replay = replayed.iter().find(|r| r.0 == p && r.1 == a);
        // The earlier side: what it did, and whether it recorded an event after it.
        let mut line = if let Some((_, _, m, graph)) = replay {
            format!(
                "the replay of {graph} launched on {p} at op {a} {} {}, captured at op {m}: it joins {p} at its end",
                did(c.access),
                c.buffer
            )
        } else if c.access == AccessKind::Alloc {
            format!(
                "{} {} at op {a}, which counts as a use on {p}",
                c.buffer,
                did(c.access).replace("was handed", "was allocated")
            )
        } else {
            format!("{} {} {} at op {a}", who(p), did(c.access), c.buffer)
        };
        let record = lane.and_then(|l| g.lanes[l].last_record.clone());
        match record {
            Some((r, event)) if r > a && prov.upto.is_none_or(|u| u < r) => {
                named.push(r);
                line.push_str(&format!(
                    "; {p} recorded event {event} after it, at op {r}, but {} did not wait on that record",
                    who(later)
                ));
            }
            _ if p != HOST => line.push_str(&format!("; {p} recorded no event after it")),
            _ => {}
        }
        why.push(line);
        // The later side: its latest synchronization with the earlier participant.
        match prov.upto {
            None => why.push(format!(
                "{} has no synchronization with {p} before op {b}",
                who(later)
            )),
            Some(upto) => {
                named.extend(prov.via);
                named.extend(prov.from);
                let missed = if c.access == AccessKind::Alloc {
                    format!("not {p}'s work before the allocation at op {a}")
                } else {
                    format!("not op {a}")
                };
                why.push(format!(
                    "{}'s latest synchronization with {p} is {}: it orders {p}'s ops up to op {upto} before op {b}, {missed}",
                    who(later),
                    describe(&prov, later)
                ));
            }
        }
    }
    if h.kind == HazardKind::UnsafeFree && matches!(&op.op, Op::Free { stream: None, .. }) {
        let streams: Vec<&str> = latest
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| *p != HOST && *p != later)
            .collect();
        if later != HOST && !streams.is_empty() {
            why.push(format!(
                "no record_stream({}, {}) before the free: the caching allocator may hand its memory to the next allocation on {later} while that work runs",
                h.buffer.as_deref().unwrap_or("?"),
                streams.join(", ")
            ));
        }
    }
    if let (HazardKind::ReuseRace, Some(free)) = (h.kind, &h.free) {
        // record_stream orders, before the reuse, what the named streams had synchronized with
        // by the free; the conflicts are what it did not cover.
        for r in g.recorded_at_free(free.op) {
            named.push(r.op);
            let upto = match r.last {
                Some(last) => format!("up to op {last}"),
                None => "(it had none)".to_string(),
            };
            let missed: Vec<String> = latest.iter().map(|(p, a)| format!("{p} op {a}")).collect();
            why.push(format!(
                "record_stream({}, {}) at op {}: before handing out {}'s memory again the allocator waits for {}'s work {upto} and for what {} had waited for by the free at op {} — not for {}",
                free.buffer,
                r.stream,
                r.op,
                free.buffer,
                r.stream,
                r.stream,
                free.op,
                missed.join(", ")
            ));
        }
    }
    // A replay's participant `G/c` by its capture stream `c`.
    let capture_stream = |participant: &str| {
        let graph = h.detail.replay.as_ref().map_or("", |r| r.graph.as_str());
        participant
            .strip_prefix(graph)
            .and_then(|s| s.strip_prefix('/'))
            .unwrap_or(participant)
            .to_string()
    };
    let mine = access
        .captured
        .map(|m| (m, capture_stream(&access.participant)));
    let mut inside_edges = Vec::new();
    if let (Some((m2, s2)), Some(graph)) = (&mine, h.detail.replay.as_ref().map(|r| &r.graph)) {
        for c in &inside {
            let (Some(m1), s1) = (c.captured, capture_stream(&c.participant)) else {
                continue;
            };
            let it = if c.buffer == buffer {
                "it".to_string()
            } else {
                format!("{buffer}, on the same memory")
            };
            why.push(format!(
                "in the same replay, captured op {m1} on {s1} {} {} and captured op {m2} on {s2} {} {it}; nothing in the capture of {graph} orders them: no captured event_wait on {s2} before op {m2} follows an event recorded on {s1} after op {m1}",
                did(c.access),
                c.buffer,
                did(access.access)
            ));
            named.push(m1);
            inside_edges.push(format!("captured op {m1} ({s1}) → captured op {m2} ({s2})"));
        }
    }
    let mut edges: Vec<String> = latest
        .iter()
        .map(|&(p, a)| {
            let alloc = h
                .conflicts
                .iter()
                .any(|c| c.participant == p && c.op == a && c.access == AccessKind::Alloc);
            if alloc {
                format!("{p} (its work before the allocation at op {a}) → {later} op {b}")
            } else {
                format!("{p} op {a} → {later} op {b}")
            }
        })
        .collect();
    edges.extend(inside_edges);
    why.push(format!(
        "missing edge{}: {}",
        if edges.len() == 1 { "" } else { "s" },
        edges.join(", ")
    ));
    named.sort_unstable();
    named.dedup();
    (why, named)
}
