//! Replays: `graph_launch`, the body run on the `G/c` participants, the fix of a replay's
//! race, and the free of a pool buffer.

use super::*;

impl Checker {
    /// `graph_launch`: replays `graph` on `stream`.
    pub(in crate::checker) fn graph_launch(
        &mut self,
        i: u64,
        op: &Op,
        graph: &Id,
        stream: &Id,
        site: Option<Arc<Site>>,
    ) -> Result<(), CheckError> {
        let s = self.order.stream(stream);
        if self.graphs.capturing() {
            if let Some(g) = self.capturing_graph(s) {
                return Err(Self::err(
                    i,
                    Field::Stream,
                    format!(
                        "graph_launch on stream \"{stream}\", which is capturing graph \"{g}\""
                    ),
                    Some("a stream that is not capturing"),
                ));
            }
        }
        let g = match self.graphs.by_name.get(graph) {
            Some(&g) if self.graphs.graphs[g as usize].ended => g,
            Some(_) => {
                return Err(Self::err(
                    i,
                    Field::Graph,
                    format!("graph \"{graph}\" has not ended its capture"),
                    Some("a graph_end of the graph first"),
                ))
            }
            None => {
                return Err(Self::err(
                    i,
                    Field::Graph,
                    format!("graph \"{graph}\" was never captured"),
                    Some("a graph captured with graph_begin and graph_end"),
                ))
            }
        };
        self.replay(i, op, g, s, site);
        Ok(())
    }

    /// Replays graph `g` on stream `s` at op `i` (see the module docs).
    pub(super) fn replay(
        &mut self,
        i: u64,
        op: &Op,
        g: u32,
        s: Participant,
        site: Option<Arc<Site>>,
    ) {
        // Rules 1, 2 and 5: the launch is an op on `s`.
        self.order.begin_stream_op(s);
        let graph = std::mem::take(&mut self.graphs.graphs[g as usize]);
        let mut participants = graph.participants;
        for lane in &graph.lanes[participants.len()..] {
            let name = format!("{}/{}", graph.name, self.order.name(lane.stream));
            let device = self.order.device(lane.stream);
            participants.push(self.order.add_replay_participant(Id::from(name), device));
        }
        let graph = Graph {
            participants,
            ..graph
        };
        // The entry clock, into every lane's participant: launches of one graph are ordered.
        let entry = self.order.clock(s).clone();
        for &p in &graph.participants {
            self.order.join_clock(p, &entry);
        }
        let mut snapshots = std::mem::take(&mut self.graphs.snapshots);
        if snapshots.len() < graph.slots as usize {
            snapshots.resize(graph.slots as usize, VectorClock::new());
        }
        let first = self.hazards.len();
        for b in &graph.body {
            let p = graph.participants[b.lane as usize];
            match b.kind {
                BodyKind::Record(slot) => snapshots[slot as usize].clone_from(self.order.clock(p)),
                BodyKind::Wait(Some(slot)) => self.order.join_clock(p, &snapshots[slot as usize]),
                BodyKind::Wait(None) => {}
                BodyKind::Access { from, to, label } => {
                    self.op_accesses.clear();
                    self.uaf.clear();
                    for r in &graph.regions[from as usize..to as usize] {
                        let buf = &graph.bufs[r.buf as usize];
                        match (buf.gen, &buf.freed) {
                            (Some(gen), None) => self.op_accesses.push(OpAccess {
                                gen,
                                kind: r.kind,
                                offset: r.offset,
                                end: r.end,
                            }),
                            (_, freed) => self.uaf.push(UseAfterFree {
                                name: buf.name.clone(),
                                kind: Some(r.kind),
                                offset: r.offset,
                                end: r.end,
                                freed: freed.clone(),
                            }),
                        }
                    }
                    let time = self.order.tick(p).time;
                    self.found.clear();
                    for at in 0..self.op_accesses.len() {
                        self.check_access(at, p);
                    }
                    let before = self.hazards.len();
                    if !self.found.is_empty() {
                        let label = self.label_of(label);
                        self.report_races(i, op, p, &site, &label, b.captured, s);
                    }
                    if !self.uaf.is_empty() {
                        self.report_use_after_free(i, op, p, &site, b.captured);
                    }
                    if self.hazards.len() > before {
                        // One hazard per launch, kind and buffer: the first captured op's.
                        let (done, new) = self.hazards.split_at(before);
                        let seen = &done[first..];
                        let keep: Vec<bool> = new
                            .iter()
                            .map(|h| {
                                !seen
                                    .iter()
                                    .any(|d| d.kind == h.kind && d.buffer == h.buffer)
                            })
                            .collect();
                        // A later captured op's plan joins the kept hazard's: following the
                        // fix removes the hazard from every captured op that has it.
                        let merged: Vec<_> = new
                            .iter()
                            .zip(&keep)
                            .filter(|(_, &k)| !k)
                            .map(|(h, _)| (h.kind, h.buffer.clone(), h.detail.plan.clone()))
                            .collect();
                        for (kind, buffer, plan) in merged {
                            let into = self.hazards[first..before]
                                .iter_mut()
                                .find(|d| d.kind == kind && d.buffer == buffer);
                            if let (Some(d), Some(plan)) = (into, plan) {
                                if let Some(mine) = d.detail.plan.as_mut() {
                                    mine.merge(plan);
                                    d.fix = Some(mine.sentence());
                                }
                            }
                        }
                        let mut k = 0;
                        self.hazards.retain(|_| {
                            k += 1;
                            k <= before || keep[k - before - 1]
                        });
                    }
                    self.record_accesses(i, p, time, &site, label, b.captured);
                }
            }
        }
        self.graphs.snapshots = snapshots;
        // The exit: work issued on `s` after the launch waits for the whole replay.
        for &p in &graph.participants {
            self.order.join_participant(s, p);
        }
        self.graphs.graphs[g as usize] = graph;
        if self.graphs.launches.len() == LAUNCH_LOG {
            self.graphs.launches.pop_front();
        }
        self.graphs.launches.push_back((i, s));
    }

    /// The fix of a race that the replay at launch `i` on stream `s` found at captured op
    /// `captured`: the conflicts of the same replay are ordered inside the capture (between
    /// captured ops, on the capture's streams), the others around the launch (on the launch
    /// streams, which the replays join into).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::checker) fn replay_plan(
        &self,
        kind: HazardKind,
        i: u64,
        s: Participant,
        captured: u32,
        kept: &[&Found],
        conflicts: &[Conflict],
        free: Option<&FreeRef>,
    ) -> FixPlan {
        let Some(me) = self.graphs.captured_op(captured) else {
            return race_plan(&self.order, kind, i, s, conflicts, free);
        };
        let inside: Vec<Conflict> = kept
            .iter()
            .filter(|f| f.access.op == i && f.access.captured != 0)
            .filter_map(|f| {
                let cap = self.graphs.captured_op(f.access.captured)?;
                let mut c = self.conflict(&f.access, &f.buffer);
                c.participant = cap.stream.to_string();
                c.op = cap.op;
                c.captured = None;
                c.epoch = None;
                Some(c)
            })
            .collect();
        let outside: Vec<Conflict> = conflicts
            .iter()
            .filter(|c| !(c.op == i && c.captured.is_some()))
            .cloned()
            .collect();
        let launch = (!outside.is_empty()).then(|| {
            let named = self
                .graphs
                .with_launch_streams(&self.order, &outside)
                .unwrap_or(outside);
            // record_stream at a free outside a capture cannot order a later replay.
            let record_stream = named.iter().all(|c| c.captured.is_none());
            race_plan_on(self.order.name(s), kind, i, &named, free, record_stream)
        });
        let capture = (!inside.is_empty()).then(|| {
            // A free between the conflicting captured ops is inside the capture: there,
            // record_stream keeps the pool from handing its block out again.
            let record_stream =
                free.is_some_and(|f| inside.iter().all(|c| c.op < f.op) && f.op < me.op);
            race_plan_on(
                me.stream.as_str(),
                kind,
                me.op,
                &inside,
                free,
                record_stream,
            )
        });
        FixPlan::Replay {
            graph: me.graph.to_string(),
            launch: launch.into_iter().collect(),
            capture: capture.into_iter().collect(),
        }
    }

    /// A caching (or stream-ordered) free of pool buffer `g` at op `i`: its block goes back to
    /// its pool (held back until the pool's captures end if it had `record_stream` streams); it
    /// is not checked for `unsafe-free`; the generation stays for the graph's replays.
    pub(in crate::checker) fn free_pool_buffer(
        &mut self,
        i: u64,
        g: GenId,
        buffer: &Id,
        named: Option<Participant>,
        site: Option<Arc<Site>>,
    ) {
        let gen = self.gens[g.0 as usize].as_mut().expect("live generation");
        let (owner, size, base) = (gen.owner, gen.size().unwrap_or(0), gen.addr());
        let by = named.unwrap_or(owner);
        let rs = gen.take_record_streams();
        let excused = (!rs.is_empty()).then(|| {
            let mut c = VectorClock::new();
            for &p in &rs {
                c.join(self.order.clock(p));
            }
            c
        });
        let pg = gen.pool_index().map(|k| k as usize);
        if let (Some(a), Some(pg)) = (base, pg) {
            if self.addr_mode == Some(true) {
                self.live[MemoryKind::Device.index()].remove(&a);
            } else {
                let pool = self.graphs.pool_gens[pg].pool;
                // The pool handed this block out, so giving it back cannot fail.
                let _ = self.graphs.pools.free(pool, a, by.0, !rs.is_empty());
            }
        }
        if let Some(pg) = pg {
            let pg = &mut self.graphs.pool_gens[pg];
            pg.freed = Some((i, site.clone()));
            pg.excused = excused;
        }
        let freed = FreedName {
            name: buffer.clone(),
            size,
            memory: MemoryKind::Device,
            owner,
            free_op: i,
            free_by: by,
            free_site: site,
            pool_gen: g.0,
        };
        self.bind_freed(buffer, g, freed);
    }
}
