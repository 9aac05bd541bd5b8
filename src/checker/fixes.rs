//! The fix of each hazard the checker reports, decided here once as a [`FixPlan`]: the report's
//! `fix` sentence renders it, and `streamsan fix` ([`crate::fix`]) applies it.

use super::*;
use crate::report::{After, Earlier, FixPlan, Wait};

/// The earlier work of `conflicts` to order: each participant's latest op (in order of
/// participant name), with the accesses of its conflicts.
pub(crate) fn after_of(conflicts: &[Conflict]) -> Vec<After> {
    latest_by_participant(conflicts)
        .into_iter()
        .map(|(q, op)| After {
            stream: q.to_string(),
            op,
            accesses: conflicts
                .iter()
                .filter(|c| c.participant == q)
                .filter_map(|c| {
                    c.epoch.map(|epoch| Earlier {
                        op: c.op,
                        buffer: c.buffer.clone(),
                        epoch,
                    })
                })
                .collect(),
        })
        .collect()
}

/// The minimal synchronization that orders every earlier access before op `i` on the
/// participant named `later`.
pub(super) fn wait_plan(later: &str, i: u64, conflicts: &[Conflict]) -> Wait {
    Wait {
        waiter: later.to_string(),
        before: i,
        after: after_of(conflicts),
    }
}

/// The fix of a race at op `i` on `p`.
pub(super) fn race_plan(
    order: &Order,
    kind: HazardKind,
    i: u64,
    p: Participant,
    conflicts: &[Conflict],
    free: Option<&FreeRef>,
) -> FixPlan {
    race_plan_on(order.name(p), kind, i, conflicts, free, true)
}

/// [`race_plan`] for the participant named `later`; `record_stream` is planned only with
/// `record_stream`.
pub(super) fn race_plan_on(
    later: &str,
    kind: HazardKind,
    i: u64,
    conflicts: &[Conflict],
    free: Option<&FreeRef>,
    record_stream: bool,
) -> FixPlan {
    let wait = wait_plan(later, i, conflicts);
    if kind == HazardKind::ReuseRace && record_stream {
        if let Some(f) = free {
            // record_stream is the allocator's own fix when every earlier access is by a stream
            // other than the old buffer's owner, issued before the free (it orders the work a
            // stream issued up to the free: not a graph's replay launched after it); otherwise
            // order the access directly.
            let recordable = conflicts.iter().all(|c| {
                c.participant != crate::trace::HOST && c.access != AccessKind::Alloc && c.op < f.op
            });
            if recordable && conflicts.iter().all(|c| c.buffer == f.buffer) {
                let candidates: Vec<After> = wait
                    .after
                    .iter()
                    .filter(|a| a.stream != crate::trace::HOST)
                    .cloned()
                    .collect();
                return FixPlan::RecordStream {
                    buffer: f.buffer.clone(),
                    streams: candidates.iter().map(|a| a.stream.clone()).collect(),
                    candidates,
                    free: f.op,
                    reused: true,
                    or: wait,
                };
            }
        }
    }
    FixPlan::Wait(wait)
}

/// Of `candidates`, the streams to name by `record_stream` at a free, now, so that every
/// access they list is ordered before the reuse of the memory: a stream is left out when the
/// clocks of the others kept cover all of its accesses (`record_stream` orders what the named
/// stream had synchronized with by the free, not only its own work). Each stream kept is
/// needed given the others; with none left out, every candidate in order.
pub(crate) fn fewest_record_streams(order: &Order, candidates: &[After]) -> Vec<String> {
    let clock_of = |p: &str| {
        order
            .find_stream(&Id::from(p))
            .map(|q| order.clock(q).clone())
            .unwrap_or_default()
    };
    let mut kept: Vec<&After> = candidates.iter().collect();
    let mut k = 0;
    while k < kept.len() {
        let mut others = VectorClock::new();
        for (j, q) in kept.iter().enumerate() {
            if j != k {
                others.join(&clock_of(&q.stream));
            }
        }
        let covered = kept[k].accesses.iter().all(|a| others.covers(a.epoch));
        if covered {
            kept.remove(k);
        } else {
            k += 1;
        }
    }
    kept.into_iter().map(|a| a.stream.clone()).collect()
}

/// The fix of an unsafe free of `buffer` at op `i` by `by`.
#[allow(clippy::too_many_arguments)]
pub(super) fn unsafe_free_plan(
    order: &Order,
    buffer: &Id,
    i: u64,
    by: Participant,
    stream_ordered: bool,
    memory: MemoryKind,
    owner: Participant,
    conflicts: &[Conflict],
) -> FixPlan {
    let wait = wait_plan(order.name(by), i, conflicts);
    let recordable = |q: &str| {
        q != crate::trace::HOST && (memory != MemoryKind::Device || q != order.name(owner))
    };
    let candidates: Vec<After> = wait
        .after
        .iter()
        .filter(|a| recordable(&a.stream))
        .cloned()
        .collect();
    let all_recordable = !stream_ordered && conflicts.iter().all(|c| recordable(&c.participant));
    if all_recordable && !candidates.is_empty() {
        FixPlan::RecordStream {
            buffer: buffer.to_string(),
            streams: fewest_record_streams(order, &candidates),
            candidates,
            free: i,
            reused: false,
            or: wait,
        }
    } else {
        FixPlan::Wait(wait)
    }
}
