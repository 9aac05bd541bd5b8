//! The what-ifs after the real checker has checked an op: frees, accesses checked again with
//! the what-ifs' clocks, and housekeeping (retiring what-ifs that no longer differ).

use super::*;

impl Engine {
    /// Advances the what-ifs over op `i`, which the real checker has just checked; `errors` are
    /// the (kind, buffer) of the errors the real checker reported at it.
    #[allow(clippy::too_many_arguments)]
    pub fn after(
        &mut self,
        checker: &mut Checker,
        i: u64,
        op: &Op,
        site: Option<&Site>,
        pre: Pre,
        errors: &[(HazardKind, Option<String>)],
        captured: bool,
    ) {
        // A captured op is part of a graph, not a synchronization of the trace.
        let verdict = (super::super::is_sync(op) && !captured).then(|| {
            self.verdicts.push(Verdict {
                op: i,
                kind: op.name(),
                site: site.cloned().map(Arc::new),
                prevents: Vec::new(),
                undecided: false,
            });
            self.verdicts.len() - 1
        });
        let Pre {
            affected,
            removed,
            host,
            free,
            rs_adds,
        } = pre;
        let mut created = None;
        let mut pool_rs = false;
        if let (Some(v), Some((p, d))) = (verdict, removed) {
            let wid = self.new_whatif(v, i);
            self.set_clock(wid, p, d);
            created = Some(wid);
        }
        match op {
            Op::Alloc { .. } => {
                if let (Some(&(at, device)), Some(h)) = (checker.implicit_syncs().last(), &host) {
                    if at == i {
                        let order = checker.order();
                        let mut out = Vec::new();
                        self.collect_device(order, device, &mut out);
                        out.sort_unstable();
                        out.dedup();
                        let mut srcs = vec![Src::HostBefore(h)];
                        srcs.extend(streams_of(order, device).into_iter().map(Src::Part));
                        let resolved = sources(order, &srcs);
                        let ds: Vec<(u32, Diff)> = out
                            .iter()
                            .map(|&wid| (wid, combine(self.w(wid), &resolved, Participant::HOST)))
                            .collect();
                        for (wid, d) in ds {
                            self.set_clock(wid, Participant::HOST, d);
                        }
                    }
                }
            }
            Op::RecordStream { buffer, stream } => {
                let q = checker
                    .order()
                    .find_stream(stream)
                    .expect("the stream exists");
                for &wid in &affected {
                    if self.w(wid).record_stream.as_ref() == Some(&(buffer.clone(), q)) {
                        self.clear_record_stream(wid);
                    }
                }
                if let (true, Some(v)) = (rs_adds, verdict) {
                    let wid = self.new_whatif(v, i);
                    self.w_mut(wid).record_stream = Some((buffer.clone(), q));
                    self.by_buffer.insert(buffer, wid);
                    created = Some(wid);
                    // On a pool buffer, it also decides where the pool places later
                    // allocations of the same capture: left to a re-check.
                    pool_rs = checker.live_generation(buffer).is_some_and(|g| g.is_pool());
                }
            }
            Op::Free { buffer, stream } => {
                if let Some(free) = &free {
                    self.free(checker, i, buffer, stream.as_ref(), free, &affected, errors);
                }
            }
            _ => {}
        }
        if let Some(wid) = created {
            self.stats.changed += 1;
            if pool_rs {
                self.give_up(wid);
            } else if self.w(wid).is_empty() {
                self.remove(wid);
            }
        } else if verdict.is_some() {
            self.stats.unchanged += 1;
        }
        // Accesses: each what-if whose clock of the accessing participant differs asks the
        // real history and tombstones with its own clock; every what-if with tombstones asks
        // them.
        let access_p = match op {
            _ if captured => None,
            Op::Launch { stream, .. } | Op::Copy { stream, .. } | Op::Memset { stream, .. } => {
                checker.order().find_stream(stream)
            }
            Op::HostRead { .. } | Op::HostWrite { .. } => Some(Participant::HOST),
            _ => None,
        };
        if let Some(p) = access_p {
            self.accesses(checker, i, p, errors);
        }
        for &wid in &affected {
            if self.slab[wid as usize]
                .as_ref()
                .is_some_and(|w| w.is_empty())
            {
                self.remove(wid);
            }
        }
        self.recycle(affected);
        self.housekeeping(checker, i);
    }

    /// Takes back the list of a [`Pre`] for reuse.
    pub(super) fn recycle(&mut self, mut v: Vec<u32>) {
        if v.capacity() > self.scratch.capacity() {
            v.clear();
            self.scratch = v;
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn free(
        &mut self,
        checker: &Checker,
        i: u64,
        buffer: &Id,
        stream: Option<&Id>,
        free: &FreeData,
        affected: &[u32],
        errors: &[(HazardKind, Option<String>)],
    ) {
        let order = checker.order();
        let host = Participant::HOST;
        let by = match (stream, free.memory) {
            (Some(s), _) => order.find_stream(s).expect("the freeing stream exists"),
            (None, MemoryKind::Device) => free.owner,
            (None, _) => host,
        };
        let reported = errors
            .iter()
            .any(|(k, b)| *k == HazardKind::UnsafeFree && b.as_deref() == Some(buffer.as_str()));
        let excused = |e: Epoch| {
            free.record_streams
                .iter()
                .any(|&q| order.clock(q).covers(e))
        };
        for &wid in affected {
            let w = self.w(wid);
            let removed = match &w.record_stream {
                Some((b, q)) if b == buffer => Some(*q),
                _ => None,
            };
            let rs: Vec<Participant> = free
                .record_streams
                .iter()
                .copied()
                .filter(|&q| Some(q) != removed)
                .collect();
            let excused_here = |e: Epoch| rs.iter().any(|&q| w.covers(order, q, e));
            // The free's clock here: the freeing participant's, the host's, and the clocks of
            // the record_stream streams (trace format, "Frees and reuse").
            let unsafe_here = !reported
                && free.entries.iter().any(|a| {
                    let e = a.epoch();
                    a.participant != by
                        && !w.covers(order, by, e)
                        && !w.covers(order, host, e)
                        && !excused_here(e)
                });
            // What the real free's record_stream excused and this one does not stays: the
            // what-if's own tombstones.
            let mut new_tombs = Vec::new();
            let differs = removed.is_some() || rs.iter().any(|&q| w.clock(q).is_some());
            if let (Some(base), true) = (free.base.filter(|_| free.size > 0), differs) {
                for a in &free.entries {
                    let e = a.epoch();
                    if excused(e) && !excused_here(e) && !w.covers(order, host, e) {
                        let lo = base + a.offset;
                        let hi = base.saturating_add(a.end).min(base + free.size);
                        if lo < hi {
                            new_tombs.push((lo, hi, e, a.kind.writes()));
                        }
                    }
                }
            }
            if unsafe_here {
                self.prevent(
                    wid,
                    ErrorKey {
                        kind: HazardKind::UnsafeFree,
                        op: i,
                        buffer: Some(buffer.to_string()),
                    },
                );
            }
            for (lo, hi, epoch, writes) in new_tombs {
                let key = self.tombs.insert(
                    free.memory,
                    lo,
                    Tomb {
                        wid,
                        hi,
                        epoch,
                        writes,
                    },
                );
                self.w_mut(wid).tombs.push(key);
            }
            if removed.is_some() {
                self.clear_record_stream(wid);
            }
        }
    }

    pub(super) fn accesses(
        &mut self,
        checker: &Checker,
        i: u64,
        p: Participant,
        errors: &[(HazardKind, Option<String>)],
    ) {
        let ws = self.part(p);
        if ws.is_empty() && self.tombs.count == 0 {
            return;
        }
        let regions = checker.last_regions();
        let order = checker.order();
        let known = |kind: HazardKind, buffer: &Id| {
            errors
                .iter()
                .any(|(k, b)| *k == kind && b.as_deref() == Some(buffer.as_str()))
        };
        let mut found: Vec<(u32, ErrorKey)> = Vec::new();
        let mut probes = 0;
        // A pool buffer's bytes are checked against every buffer of its pool that held them,
        // which the probes do not ask: a what-if that would have to is left to a re-check.
        let pool: Vec<bool> = regions
            .iter()
            .map(|r| {
                checker
                    .live_generation(&r.buffer)
                    .is_some_and(|g| g.is_pool())
            })
            .collect();
        let mut gone: Vec<u32> = Vec::new();
        if pool.iter().any(|&x| x) {
            gone.extend_from_slice(ws);
        }
        for &wid in ws {
            if !gone.is_empty() {
                break;
            }
            let clock = self.w(wid).full_clock(order, p);
            for r in &regions {
                let race_known = known(HazardKind::DataRace, &r.buffer);
                let reuse_known = known(HazardKind::ReuseRace, &r.buffer);
                if race_known && reuse_known {
                    continue;
                }
                probes += 1;
                let (race, reuse) = checker.probe_region(r.at, p, &clock);
                for (hit, kind, known) in [
                    (race, HazardKind::DataRace, race_known),
                    (reuse, HazardKind::ReuseRace, reuse_known),
                ] {
                    if hit && !known {
                        found.push((
                            wid,
                            ErrorKey {
                                kind,
                                op: i,
                                buffer: Some(r.buffer.to_string()),
                            },
                        ));
                    }
                }
            }
        }
        self.stats.probes += probes;
        if self.tombs.count > 0 {
            for (r, &pool) in regions.iter().zip(&pool) {
                let Some((lo, hi)) = r.bytes else { continue };
                if pool {
                    self.tombs
                        .overlapping(r.memory, lo, hi, |t| gone.push(t.wid));
                    continue;
                }
                if known(HazardKind::ReuseRace, &r.buffer) {
                    continue;
                }
                self.tombs.overlapping(r.memory, lo, hi, |t| {
                    let w = self.slab[t.wid as usize].as_ref().expect("live what-if");
                    if t.epoch.participant != p
                        && (r.writes || t.writes)
                        && !w.covers(order, p, t.epoch)
                    {
                        found.push((
                            t.wid,
                            ErrorKey {
                                kind: HazardKind::ReuseRace,
                                op: i,
                                buffer: Some(r.buffer.to_string()),
                            },
                        ));
                    }
                });
            }
        }
        gone.sort_unstable();
        gone.dedup();
        for (wid, key) in found {
            if gone.binary_search(&wid).is_err() {
                self.prevent(wid, key);
            }
        }
        for wid in gone {
            self.give_up(wid);
        }
    }

    /// Drops the tombstones the what-ifs' host clocks cover, gives up the oldest what-ifs
    /// beyond the configured limits, and lets the checker forget what no what-if needs.
    pub(super) fn housekeeping(&mut self, checker: &mut Checker, i: u64) {
        let version = checker.order().host_version();
        if self.tombs.count > 0 && version != self.sweep_version && i >= self.sweep_at {
            self.sweep_version = version;
            self.sweep_at = i + self.tombs.count as u64;
            let order = checker.order();
            let mut emptied = Vec::new();
            for wid in 0..self.slab.len() as u32 {
                let Some(w) = self.slab[wid as usize].as_ref() else {
                    continue;
                };
                if w.tombs.is_empty() {
                    continue;
                }
                let mut drop = Vec::new();
                for &key in &w.tombs {
                    if let Some(t) = self.tombs.kinds[key.0].get(&(key.1, key.2)) {
                        if w.covers(order, Participant::HOST, t.epoch) {
                            drop.push(key);
                        }
                    }
                }
                if drop.is_empty() {
                    continue;
                }
                for &key in &drop {
                    self.tombs.remove(key);
                }
                let w = self.slab[wid as usize].as_mut().expect("live what-if");
                w.tombs.retain(|k| !drop.contains(k));
                if w.is_empty() {
                    emptied.push(wid);
                }
            }
            for wid in emptied {
                self.remove(wid);
            }
        }
        // Give up the oldest what-ifs beyond the limits (those with a host clock of their own
        // first, if there are too many of them): a re-check decides their ops.
        loop {
            let host_live = self.part(Participant::HOST).len();
            let victim = if host_live > self.config.max_host {
                self.part(Participant::HOST)
                    .iter()
                    .map(|&w| (self.w(w).born, w))
                    .min()
                    .map(|(_, w)| w)
            } else if self.live > self.config.max_live {
                self.ages.iter().next().map(|&(_, w)| w)
            } else {
                None
            };
            let Some(wid) = victim else { break };
            self.give_up(wid);
        }
        self.stats.peak_live = self.stats.peak_live.max(self.live);
        if self.retaining {
            if self.part(Participant::HOST).is_empty() {
                checker.retain(None);
                self.retaining = false;
                self.retain_stale = false;
            } else if self.retain_stale && i >= self.retain_at {
                // Keep only what the what-ifs' host clocks still need.
                let order = checker.order();
                let mut keep: Option<VectorClock> = None;
                for &wid in self.part(Participant::HOST) {
                    let c = self.w(wid).full_clock(order, Participant::HOST);
                    keep = Some(match keep {
                        None => c,
                        Some(k) => k.meet(&c),
                    });
                }
                checker.retain(keep);
                self.retain_stale = false;
                self.retain_at = i + 1024;
            }
        }
    }

    /// The clock components the live what-ifs store (their differences).
    pub fn clock_entries(&self) -> usize {
        self.slab
            .iter()
            .flatten()
            .map(|w| {
                w.clocks.iter().map(|(_, d)| d.len()).sum::<usize>()
                    + w.captures.iter().map(|(_, d)| d.len()).sum::<usize>()
            })
            .sum()
    }

    /// Live what-ifs.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Tombstones of live what-ifs.
    pub fn tombstones(&self) -> usize {
        self.tombs.count
    }
}
