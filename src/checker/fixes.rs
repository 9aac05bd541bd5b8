//! The fix sentences of the checker's hazards.

use super::*;

pub(super) fn list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [a] => a.clone(),
        [a, b] => format!("{a} and {b}"),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

/// The minimal synchronization that orders every earlier access before op `i` on `p`.
pub(super) fn fix_wait(order: &Order, i: u64, p: Participant, conflicts: &[Conflict]) -> String {
    fix_wait_on(order.name(p), i, conflicts)
}

/// The minimal synchronization that orders every earlier access before op `i` on the
/// participant named `later`.
pub(super) fn fix_wait_on(later: &str, i: u64, conflicts: &[Conflict]) -> String {
    let latest = latest_by_participant(conflicts);
    if later == crate::trace::HOST {
        let parts: Vec<String> = latest
            .iter()
            .map(|(q, op)| format!("{q} after op {op}"))
            .collect();
        return format!(
            "make the host wait for {} before op {i}: record an event there and event_sync it, or stream_sync the stream",
            list(&parts)
        );
    }
    let parts: Vec<String> = latest
        .iter()
        .map(|(q, op)| format!("on {q} after op {op}"))
        .collect();
    let them = if latest.len() == 1 { "it" } else { "them" };
    let event = if latest.len() == 1 {
        "an event"
    } else {
        "events"
    };
    format!(
        "record {event} {} and make {later} wait on {them} before op {i}",
        list(&parts)
    )
}

pub(super) fn fix_race(
    order: &Order,
    kind: HazardKind,
    i: u64,
    p: Participant,
    conflicts: &[Conflict],
    free: Option<&FreeRef>,
) -> String {
    fix_race_on(order.name(p), kind, i, conflicts, free, true)
}

/// [`fix_race`] for the participant named `later`; `record_stream` is suggested only with
/// `record_stream`.
pub(super) fn fix_race_on(
    later: &str,
    kind: HazardKind,
    i: u64,
    conflicts: &[Conflict],
    free: Option<&FreeRef>,
    record_stream: bool,
) -> String {
    if kind == HazardKind::ReuseRace && record_stream {
        if let Some(f) = free {
            // record_stream is the allocator's own fix when every earlier access is by a stream
            // other than the old buffer's owner; otherwise order the access directly.
            let streams: Vec<String> = latest_by_participant(conflicts)
                .iter()
                .filter(|(q, _)| *q != crate::trace::HOST)
                .map(|(q, _)| q.to_string())
                .collect();
            let recordable = conflicts
                .iter()
                .all(|c| c.participant != crate::trace::HOST && c.access != AccessKind::Alloc);
            if recordable && conflicts.iter().all(|c| c.buffer == f.buffer) {
                return format!(
                    "call record_stream({}, {}) before its free at op {} so its memory is not reused while that work runs, or {}",
                    f.buffer,
                    list(&streams),
                    f.op,
                    fix_wait_on(later, i, conflicts)
                );
            }
        }
    }
    fix_wait_on(later, i, conflicts)
}

/// Of `streams`, the ones to name by `record_stream` at a free, now, so that every conflict is
/// ordered before the reuse of the memory: a stream is left out when the clocks of the others
/// kept cover all of its conflicts (`record_stream` orders what the named stream had
/// synchronized with by the free, not only its own work). Each stream kept is needed given the
/// others; with none left out, `streams` in order.
pub(crate) fn fewest_record_streams(
    order: &Order,
    streams: &[String],
    conflicts: &[Conflict],
) -> Vec<String> {
    let clock_of = |p: &str| {
        order
            .find_stream(&Id::from(p))
            .map(|q| order.clock(q).clone())
            .unwrap_or_default()
    };
    let mut kept = streams.to_vec();
    let mut k = 0;
    while k < kept.len() {
        let mut others = VectorClock::new();
        for (j, q) in kept.iter().enumerate() {
            if j != k {
                others.join(&clock_of(q));
            }
        }
        let covered = conflicts
            .iter()
            .filter(|c| c.participant == kept[k])
            .all(|c| c.epoch.is_some_and(|e| others.covers(e)));
        if covered {
            kept.remove(k);
        } else {
            k += 1;
        }
    }
    kept
}

#[allow(clippy::too_many_arguments)]
pub(super) fn fix_unsafe_free(
    order: &Order,
    buffer: &Id,
    i: u64,
    by: Participant,
    stream_ordered: bool,
    memory: MemoryKind,
    owner: Participant,
    conflicts: &[Conflict],
) -> String {
    let streams: Vec<String> = latest_by_participant(conflicts)
        .iter()
        .filter(|(q, _)| {
            *q != crate::trace::HOST && (memory != MemoryKind::Device || *q != order.name(owner))
        })
        .map(|(q, _)| q.to_string())
        .collect();
    let all_recordable = !stream_ordered
        && conflicts.iter().all(|c| {
            c.participant != crate::trace::HOST
                && (memory != MemoryKind::Device || c.participant != order.name(owner))
        });
    if all_recordable && !streams.is_empty() {
        let streams = fewest_record_streams(order, &streams, conflicts);
        format!(
            "call record_stream({buffer}, {}) before the free at op {i}, or {}",
            list(&streams),
            fix_wait(order, i, by, conflicts)
        )
    } else {
        fix_wait(order, i, by, conflicts)
    }
}
