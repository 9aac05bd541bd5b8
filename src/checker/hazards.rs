//! The checker's reports of races and uses after free: the hazards and their conflicts.

use super::*;

impl Checker {
    /// Reports the races found for the current op by `p`. For a graph replay, `captured` is the
    /// captured op's [`Access::captured`] and `fix_p` the launch stream, which the fix orders
    /// (the replay's participants follow it); otherwise `captured` is 0 and `fix_p` is `p`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn report_races(
        &mut self,
        i: u64,
        op: &Op,
        p: Participant,
        site: &Option<Arc<Site>>,
        label: &Option<Arc<str>>,
        captured: u32,
        fix_p: Participant,
    ) {
        let mut found = std::mem::take(&mut self.found);
        // Group by (kind, accessed generation), in the op's region order.
        found.sort_by_key(|f| (f.kind, self.op_accesses[f.at].gen, f.at));
        let participant = self.order.name(p).to_string();
        let mut start = 0;
        while start < found.len() {
            let key = (found[start].kind, self.op_accesses[found[start].at].gen);
            let mut stop = start;
            while stop < found.len()
                && (found[stop].kind, self.op_accesses[found[stop].at].gen) == key
            {
                stop += 1;
            }
            let group = &found[start..stop];
            let (kind, g) = key;
            let (mut lo, mut hi, mut writes) = (u64::MAX, 0, false);
            for f in group {
                let a = self.op_accesses[f.at];
                lo = lo.min(a.offset);
                hi = hi.max(a.end);
                writes |= a.kind.writes();
            }
            let my_kind = if writes {
                AccessKind::Write
            } else {
                AccessKind::Read
            };
            // Each participant's latest conflicting op, with all its conflicting regions.
            let latest = latest_ops(group.iter().map(|f| &f.access));
            let kept: Vec<&Found> = group
                .iter()
                .filter(|f| is_latest(&latest, &f.access))
                .collect();
            let mut conflicts: Vec<Conflict> = kept
                .iter()
                .map(|f| self.conflict(&f.access, &f.buffer))
                .collect();
            conflicts.sort_by(conflict_order);
            conflicts.dedup();
            let pattern = Pattern::of(my_kind, conflicts.iter().map(|c| c.access));
            // The most recent free among the conflicts listed.
            let freed = kept
                .iter()
                .filter_map(|f| f.freed.as_ref())
                .max_by_key(|f| f.op);
            let free = freed.map(|f| FreeRef {
                op: f.op,
                buffer: f.name.to_string(),
            });
            let gen = self.gen(g);
            let mut notes = Vec::new();
            if let Some(a) = gen.alloc_op() {
                notes.push(OpNote {
                    what: format!("{} allocated on {}", gen.name, self.order.name(gen.owner)),
                    op: a,
                    site: gen.alloc_site.clone(),
                });
            }
            if let Some(f) = freed {
                notes.push(OpNote {
                    what: format!("{} freed here; its memory was handed out again", f.name),
                    op: f.op,
                    site: f.site.clone(),
                });
            }
            let replay = self.graphs.replay_of(captured);
            let plan = if captured == 0 {
                let named = self.graphs.with_launch_streams(&self.order, &conflicts);
                race_plan(
                    &self.order,
                    kind,
                    i,
                    fix_p,
                    named.as_deref().unwrap_or(&conflicts),
                    free.as_ref(),
                )
            } else {
                self.replay_plan(kind, i, fix_p, captured, &kept, &conflicts, free.as_ref())
            };
            self.hazards.push(Hazard {
                kind,
                severity: kind.severity(),
                op: i,
                buffer: Some(gen.name.to_string()),
                pattern: Some(pattern),
                access: Some(AccessRef {
                    op: i,
                    participant: participant.clone(),
                    access: my_kind,
                    offset: lo,
                    bytes: bytes_of(lo, hi),
                    site: site.clone(),
                    captured: replay.as_ref().map(|r| r.captured),
                }),
                conflicts,
                free,
                fix: Some(plan.sentence()),
                detail: Detail {
                    op_name: op.name(),
                    label: label.clone(),
                    event: None,
                    participant: participant.clone(),
                    notes,
                    why: Vec::new(),
                    replay,
                    plan: Some(plan),
                },
                confirmation: None,
            });
            start = stop;
        }
        found.clear();
        self.found = found;
    }

    /// The report's entry for an earlier conflicting access of `buffer`.
    pub(super) fn conflict(&self, a: &Access, buffer: &Id) -> Conflict {
        conflict_of(&self.order, &self.label_names, &self.graphs, a, buffer)
    }

    /// Reports the uses after free of the current op by `p` (for a graph replay, `captured` is
    /// the captured op's [`Access::captured`]; else 0).
    pub(super) fn report_use_after_free(
        &mut self,
        i: u64,
        op: &Op,
        p: Participant,
        site: &Option<Arc<Site>>,
        captured: u32,
    ) {
        let mut uaf = std::mem::take(&mut self.uaf);
        uaf.sort_by(|a, b| a.name.cmp(&b.name));
        let participant = self.order.name(p).to_string();
        let replay = self.graphs.replay_of(captured);
        let mut start = 0;
        while start < uaf.len() {
            let mut stop = start;
            while stop < uaf.len() && uaf[stop].name == uaf[start].name {
                stop += 1;
            }
            let group = &uaf[start..stop];
            let name = &group[0].name;
            let access = group[0].kind.map(|_| {
                let lo = group.iter().map(|u| u.offset).min().unwrap_or(0);
                let hi = group.iter().map(|u| u.end).max().unwrap_or(0);
                let writes = group.iter().any(|u| u.kind.is_some_and(AccessKind::writes));
                AccessRef {
                    op: i,
                    participant: participant.clone(),
                    access: if writes {
                        AccessKind::Write
                    } else {
                        AccessKind::Read
                    },
                    offset: lo,
                    bytes: bytes_of(lo, hi),
                    site: site.clone(),
                    captured: replay.as_ref().map(|r| r.captured),
                }
            });
            let freed = match (&group[0].freed, self.lookup(name)) {
                (Some(f), _) => Some(f.clone()),
                (None, Some(Name::Freed(f))) => {
                    let f = self.freed(f);
                    Some(FreedBy::Op(f.free_op, f.free_by, f.free_site.clone()))
                }
                (None, Some(Name::Forgotten)) => Some(FreedBy::Forgotten),
                _ => None,
            };
            // A free whose details are forgotten is named as such: the report says what is
            // known (the name was freed), not at which op.
            let (free_op, notes) = match freed {
                Some(FreedBy::Op(op, by, site)) => (
                    Some(op),
                    vec![OpNote {
                        what: format!("{name} freed here by {}", self.order.name(by)),
                        op,
                        site,
                    }],
                ),
                Some(FreedBy::Forgotten) | None => (None, vec![]),
            };
            let plan = match &replay {
                Some(r) => FixPlan::FreeAfterReplays {
                    buffer: name.to_string(),
                    free: free_op,
                    graph: r.graph.clone(),
                    captured: r.captured,
                },
                None => FixPlan::MoveFree {
                    buffer: name.to_string(),
                    free: free_op,
                    before: i,
                },
            };
            self.hazards.push(Hazard {
                kind: HazardKind::UseAfterFree,
                severity: HazardKind::UseAfterFree.severity(),
                op: i,
                buffer: Some(name.to_string()),
                pattern: None,
                access,
                conflicts: vec![],
                free: None,
                fix: Some(plan.sentence()),
                detail: Detail {
                    op_name: op.name(),
                    label: None,
                    event: None,
                    participant: participant.clone(),
                    notes,
                    why: Vec::new(),
                    replay: replay.clone(),
                    plan: Some(plan),
                },
                confirmation: None,
            });
            start = stop;
        }
        uaf.clear();
        self.uaf = uaf;
    }
}

pub(super) fn conflict_of(
    order: &Order,
    labels: &[Arc<str>],
    graphs: &graphs::Graphs,
    a: &Access,
    buffer: &Id,
) -> Conflict {
    let captured = graphs.captured_op(a.captured);
    Conflict {
        op: a.op,
        participant: order.name(a.participant).to_string(),
        access: a.kind,
        buffer: buffer.to_string(),
        offset: a.offset,
        bytes: bytes_of(a.offset, a.end),
        site: a.site.clone(),
        captured: captured.map(|c| c.op),
        captured_site: captured.and_then(|c| c.site.clone()),
        label: a
            .label
            .checked_sub(1)
            .and_then(|k| labels.get(k as usize).cloned()),
        epoch: Some(a.epoch()),
        replay: graphs.replay_of(a.captured),
    }
}

/// The latest op of each participant among `accesses` (for a replay's participant, the latest
/// captured op of its latest launch: [`Access::order_key`]).
#[inline]
pub(super) fn latest_ops<'a>(
    accesses: impl Iterator<Item = &'a Access>,
) -> Vec<(Participant, (u64, u32))> {
    let mut v: Vec<(Participant, (u64, u32))> = Vec::new();
    for a in accesses {
        let p = a.participant;
        match v.iter_mut().find(|(q, _)| *q == p) {
            Some(e) => e.1 = e.1.max(a.order_key()),
            None => v.push((p, a.order_key())),
        }
    }
    v
}

/// Whether `a` is an access of its participant's latest op in `latest`.
#[inline]
pub(super) fn is_latest(latest: &[(Participant, (u64, u32))], a: &Access) -> bool {
    latest
        .iter()
        .any(|&(p, key)| p == a.participant && key == a.order_key())
}

pub(super) fn conflict_order(a: &Conflict, b: &Conflict) -> std::cmp::Ordering {
    (a.op, a.captured, &a.buffer, a.offset, a.bytes, a.access)
        .cmp(&(b.op, b.captured, &b.buffer, b.offset, b.bytes, b.access))
}
