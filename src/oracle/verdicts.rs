//! The oracle's verdicts, once the whole trace has been seen: reachability between the nodes,
//! then every hazard the trace format defines, by brute force over pairs of accesses.

use super::*;

impl Builder {
    /// Every hazard, once the whole trace has been seen.
    /// `anc[x]`: the bit set of the nodes with a path to node `x`.
    pub(super) fn ancestors(&self) -> Vec<Vec<u64>> {
        let n = self.nodes.len();
        let words = n.div_ceil(64);
        // Edges go forward in creation order, so creation order is topological.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&x| self.rank[x]);
        let mut anc = vec![vec![0u64; words]; n];
        for &x in &order {
            let preds: Vec<usize> = self
                .graph
                .neighbors_directed(self.nodes[x], Direction::Incoming)
                .map(|p| self.graph[p])
                .collect();
            for p in preds {
                debug_assert!(self.rank[p] < self.rank[x]);
                let from = std::mem::take(&mut anc[p]);
                for (d, s) in anc[x].iter_mut().zip(&from) {
                    *d |= s;
                }
                anc[p] = from;
                anc[x][p / 64] |= 1 << (p % 64);
            }
        }
        anc
    }

    pub(super) fn hazards(mut self) -> Vec<OracleHazard> {
        let anc = self.ancestors();
        let before = |a: usize, x: usize| a == x || anc[x][a / 64] & (1 << (a % 64)) != 0;
        let ordered = |at: Option<usize>, x: usize| at.is_none_or(|a| before(a, x));

        // Data races and reuse races, at each later (non-allocation) access: accesses are listed
        // in the order they happen (a replay's in body order).
        for (k, x) in self.accesses.iter().enumerate().filter(|(_, x)| !x.alloc) {
            let xb = &self.buffers[x.buffer];
            // The node of the later access: the op itself, or a replay's node.
            let xn = x.at.unwrap_or(x.op);
            for a in &self.accesses[..k] {
                if a.participant == x.participant || !(a.writes || x.writes) {
                    continue;
                }
                if ordered(a.at, xn) {
                    continue;
                }
                let ab = &self.buffers[a.buffer];
                let conflict = (a.participant.clone(), a.op as u64, a.captured);
                if a.buffer == x.buffer {
                    if overlaps(a.start, a.end, x.start, x.end) {
                        self.found
                            .entry((x.op as u64, HazardKind::DataRace, Some(xb.name.clone())))
                            .or_default()
                            .entry(x.captured)
                            .or_default()
                            .insert(conflict);
                    }
                    continue;
                }
                let (Some(xa), Some(aa)) = (xb.addr, ab.addr) else {
                    continue;
                };
                if ab.memory != xb.memory {
                    continue;
                }
                let same_pool = ab.pool.is_some() && ab.pool == xb.pool;
                // Reuse: the other buffer held these bytes before (freed before this one was
                // allocated) — or, in a graph pool, before or after.
                let a_first = ab.free_op.is_some_and(|f| f < xb.alloc_op);
                if !a_first && !same_pool {
                    continue;
                }
                // Ordered before the reuse by the allocator's record_stream events at the
                // free of the buffer that held the bytes first.
                if a_first && ab.recorded_at_free.iter().any(|&r| ordered(a.at, r)) {
                    continue;
                }
                let abs = |base: u64, s: u64, e: Option<u64>| (base + s, e.map(|e| base + e));
                let (a0, a1) = abs(aa, a.start, a.end);
                let (x0, x1) = abs(xa, x.start, x.end);
                if overlaps(a0, a1, x0, x1) {
                    self.found
                        .entry((x.op as u64, HazardKind::ReuseRace, Some(xb.name.clone())))
                        .or_default()
                        .entry(x.captured)
                        .or_default()
                        .insert(conflict);
                }
            }
        }

        // Unsafe frees: accesses by other participants not ordered before the free's clock.
        for f in &self.frees {
            let name = self.buffers[f.buffer].name.clone();
            let mut conflicts = BTreeSet::new();
            for a in self.accesses.iter().filter(|a| a.buffer == f.buffer) {
                if a.participant == f.freer {
                    continue;
                }
                let done =
                    a.at.is_none_or(|at| f.points.iter().any(|&p| before(at, p)));
                if !done {
                    conflicts.insert((a.participant.clone(), a.op as u64, a.captured));
                }
            }
            if !conflicts.is_empty() {
                self.found
                    .entry((f.op as u64, HazardKind::UnsafeFree, Some(name)))
                    .or_default()
                    .entry(None)
                    .or_default()
                    .extend(conflicts);
            }
        }

        // A launch reports, per kind and buffer, the first captured op that has the hazard;
        // the report lists, for each participant, only its latest conflicting op (a replay's
        // participant: its latest captured op of its latest launch).
        self.found
            .into_iter()
            .map(|((op, kind, buffer), by_captured)| {
                let (captured, conflicts) = by_captured.into_iter().next().unwrap_or_default();
                let mut latest: BTreeMap<String, (u64, Option<u64>)> = BTreeMap::new();
                for (p, a, c) in conflicts {
                    let e = latest.entry(p).or_insert((a, c));
                    *e = (*e).max((a, c));
                }
                let mut replayed: Vec<(u64, u64)> = latest
                    .values()
                    .filter_map(|&(a, c)| c.map(|c| (a, c)))
                    .collect();
                replayed.sort_unstable();
                replayed.dedup();
                let mut conflicts: Vec<u64> = latest.into_values().map(|(a, _)| a).collect();
                conflicts.sort_unstable();
                conflicts.dedup();
                OracleHazard {
                    op,
                    kind,
                    buffer,
                    conflicts,
                    captured,
                    replayed,
                }
            })
            .collect()
    }
}
