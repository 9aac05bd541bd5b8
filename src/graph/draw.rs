//! The dependency graph drawn: the [`Picture`] of the ops kept, their edges and the hazards.

use super::*;

impl DepGraph {
    pub(super) fn picture(&self, report: &Report, title: &str) -> Picture {
        let drawn_hazards = report.hazards.len().min(self.cfg.max_drawn_hazards);
        let whole = !self.pruned && self.stats.ops <= self.cfg.draw_whole;
        let mut drawn: BTreeSet<u64> = BTreeSet::new();
        if whole {
            drawn.extend(self.nodes.keys().copied());
        } else {
            for (k, h) in report.hazards.iter().take(drawn_hazards).enumerate() {
                drawn.insert(h.op);
                drawn.extend(h.conflicts.iter().map(|c| c.op));
                drawn.extend(h.free.as_ref().map(|f| f.op));
                drawn.extend(self.named[k].iter().copied());
            }
            drawn.retain(|op| self.nodes.contains_key(op));
        }
        let mut lanes_used: BTreeSet<usize> = drawn
            .iter()
            .filter_map(|op| self.node(*op).map(|n| n.lane))
            .collect();
        lanes_used.insert(HOST_LANE);
        let lane_pos: HashMap<usize, usize> = lanes_used
            .iter()
            .enumerate()
            .map(|(pos, &l)| (l, pos))
            .collect();
        let lanes = lanes_used
            .iter()
            .map(|&l| {
                let s = &self.lanes[l];
                let description = if l == HOST_LANE {
                    "the host".to_string()
                } else if l == DEFAULT_LANE {
                    "legacy default stream, device 0".to_string()
                } else {
                    format!(
                        "stream, device {}, {}",
                        s.device,
                        if s.blocking {
                            "blocking"
                        } else {
                            "non-blocking"
                        }
                    )
                };
                Lane {
                    name: s.name.clone(),
                    description,
                }
            })
            .collect();
        let mut nodes: Vec<Node> = Vec::new();
        for &op in &drawn {
            let Some(n) = self.node(op) else { continue };
            let hazards: Vec<usize> = (0..drawn_hazards)
                .filter(|&k| report.hazards[k].op == op)
                .collect();
            let conflicts: Vec<usize> = (0..drawn_hazards)
                .filter(|&k| report.hazards[k].conflicts.iter().any(|c| c.op == op))
                .collect();
            let role = if !hazards.is_empty() {
                Role::Hazard
            } else if !conflicts.is_empty() {
                Role::Conflict
            } else {
                Role::Context
            };
            nodes.push(Node {
                op,
                lane: lane_pos.get(&n.lane).copied().unwrap_or(0),
                op_name: n.op_name,
                label: n.label.to_string(),
                accesses: n.accesses.clone(),
                site: n.site.clone(),
                role,
                hazards,
                conflicts,
            });
        }
        // Edges of the graph between drawn ops; where a lane's consecutive drawn ops have none,
        // an elided edge stands for the ops between them.
        let mut edges: Vec<Edge> = Vec::new();
        let mut linked: HashSet<(u64, u64)> = HashSet::default();
        for &op in &drawn {
            let Some(&n) = self.nodes.get(&op) else {
                continue;
            };
            for e in self.g.edges_directed(n, Direction::Incoming) {
                let from = self.g[e.source()].op;
                if !drawn.contains(&from) {
                    continue;
                }
                let (kind, label) = e.weight();
                linked.insert((from, op));
                edges.push(Edge {
                    from,
                    to: op,
                    kind: *kind,
                    label: label.as_ref().map(|l| l.to_string()),
                    hazards: vec![],
                });
            }
        }
        let mut last_on_lane: HashMap<usize, u64> = HashMap::default();
        for &op in &drawn {
            let Some(n) = self.node(op) else { continue };
            if let Some(prev) = last_on_lane.insert(n.lane, op) {
                if !linked.contains(&(prev, op)) {
                    edges.push(Edge {
                        from: prev,
                        to: op,
                        kind: EdgeKind::Elided,
                        label: None,
                        hazards: vec![],
                    });
                }
            }
        }
        // The missing edges: from each participant's latest conflicting op to the hazard's op.
        let mut missing: Vec<Edge> = Vec::new();
        for (k, h) in report.hazards.iter().take(drawn_hazards).enumerate() {
            for (_, from) in latest_by_participant(&h.conflicts) {
                if !drawn.contains(&from) || !drawn.contains(&h.op) {
                    continue;
                }
                match missing.iter_mut().find(|e| e.from == from && e.to == h.op) {
                    Some(e) => e.hazards.push(k),
                    None => missing.push(Edge {
                        from,
                        to: h.op,
                        kind: EdgeKind::Missing,
                        label: None,
                        hazards: vec![k],
                    }),
                }
            }
        }
        edges.extend(missing);
        edges.sort_by_key(|e| (e.to, e.from, e.kind));
        let hazards = report
            .hazards
            .iter()
            .enumerate()
            .map(|(k, h)| PictureHazard {
                kind: h.kind,
                severity: h.severity,
                op: h.op,
                buffer: h.buffer.clone(),
                title: crate::report::title(h),
                why: self.why.get(k).cloned().unwrap_or_default(),
                fix: h.fix.clone(),
                conflicts: h.conflicts.iter().map(|c| c.op).collect(),
            })
            .collect();
        let syncs = report
            .syncs
            .iter()
            .flatten()
            .filter(|v| drawn.contains(&v.op))
            .map(|v| PictureSync {
                op: v.op,
                needed: v.needed,
                prevents: v.prevents.iter().map(|k| k.to_string()).collect(),
            })
            .collect();
        let replays = self.replays(report, drawn_hazards, &drawn);
        Picture {
            title: title.to_string(),
            ops: self.stats.ops,
            lanes,
            elided: self.stats.ops.saturating_sub(nodes.len() as u64),
            nodes,
            edges,
            hazards,
            syncs,
            replays,
        }
    }

    /// The replays to draw: each drawn `graph_launch` that a hazard names, with its body.
    fn replays(
        &self,
        report: &Report,
        drawn_hazards: usize,
        drawn: &BTreeSet<u64>,
    ) -> Vec<PictureReplay> {
        let mut launches: Vec<(&u64, &(usize, Id))> = self
            .launches
            .iter()
            .filter(|(op, _)| drawn.contains(op))
            .collect();
        launches.sort_by_key(|(op, _)| **op);
        let mut replays = Vec::new();
        for (&launch, (_, graph)) in launches {
            let Some(body) = self.bodies.get(graph) else {
                continue;
            };
            let mut lanes: Vec<String> = Vec::new();
            let mut ops = Vec::new();
            for b in body {
                let name = format!("{graph}/{}", b.stream);
                let lane = match lanes.iter().position(|l| *l == name) {
                    Some(k) => k,
                    None => {
                        lanes.push(name);
                        lanes.len() - 1
                    }
                };
                let mine = |k: &usize| {
                    let h = &report.hazards[*k];
                    h.op == launch && h.access.as_ref().and_then(|a| a.captured) == Some(b.captured)
                };
                let theirs = |k: &usize| {
                    report.hazards[*k]
                        .conflicts
                        .iter()
                        .any(|c| c.op == launch && c.captured == Some(b.captured))
                };
                ops.push(ReplayOp {
                    lane,
                    captured: b.captured,
                    label: b.label.to_string(),
                    accesses: b.accesses.clone(),
                    hazards: (0..drawn_hazards).filter(mine).collect(),
                    conflicts: (0..drawn_hazards).filter(theirs).collect(),
                });
            }
            replays.push(PictureReplay {
                launch,
                graph: graph.to_string(),
                lanes,
                ops,
            });
        }
        replays
    }
}
