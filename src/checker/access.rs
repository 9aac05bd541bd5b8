//! The checker's access ops: regions resolved to generations, `data-race` and `reuse-race`.

use super::*;

impl Checker {
    pub(super) fn begin_access_op(&mut self, _i: u64) {
        self.op_accesses.clear();
        self.uaf.clear();
    }

    /// Resolves a region of the current op to a generation and byte range, or notes a use after
    /// free. Bad input: a region past the end of its buffer, a host access to device memory.
    pub(super) fn resolve(
        &mut self,
        i: u64,
        r: &Region,
        field: Field,
        kind: AccessKind,
        host: bool,
    ) -> Result<(), CheckError> {
        let bound = self.lookup(&r.buffer);
        let (g, size, memory) = match bound {
            Some(Name::Live(g)) => {
                let gen = self.gen(g);
                (Some(g), gen.size(), gen.memory)
            }
            Some(Name::External(g)) => (Some(g), None, MemoryKind::Device),
            Some(n @ (Name::Freed(_) | Name::Forgotten)) => {
                let (size, memory) = self.freed_size(&r.buffer, n).expect("a freed name");
                (None, Some(size), memory)
            }
            None => (None, None, MemoryKind::Device),
        };
        if host && !memory.host_accessible() {
            return Err(Self::err(
                i,
                field,
                format!(
                    "the host cannot access buffer \"{}\": it is {}device memory",
                    r.buffer,
                    if size.is_none() {
                        "external, hence "
                    } else {
                        ""
                    }
                ),
                Some("a pinned or managed buffer"),
            ));
        }
        let end = Self::region_end(i, r, field, size)?;
        let g = match (g, g.is_none() && bound.is_some()) {
            (Some(g), _) => g,
            (None, false) => {
                let g = self.new_external(&r.buffer);
                self.rebind(&r.buffer, None, Name::External(g));
                g
            }
            (None, true) => {
                self.uaf.push(UseAfterFree {
                    name: r.buffer.clone(),
                    kind: Some(kind),
                    offset: r.offset,
                    end,
                    freed: None,
                });
                return Ok(());
            }
        };
        self.op_accesses.push(OpAccess {
            gen: g,
            kind,
            offset: r.offset,
            end,
        });
        Ok(())
    }

    /// One past the last byte of region `r` of a buffer of `size` bytes (`None`: external,
    /// `u64::MAX` for "to the end"). Bad input: a region past the end of the buffer.
    #[inline(always)]
    pub(super) fn region_end(
        i: u64,
        r: &Region,
        field: Field,
        size: Option<u64>,
    ) -> Result<u64, CheckError> {
        Ok(match (size, r.bytes) {
            (Some(size), bytes) => {
                let end = match bytes {
                    Some(b) => r.offset.saturating_add(b),
                    None => r.offset.max(size),
                };
                if end > size || r.offset > size {
                    return Err(Self::past_the_end(i, r, field, size, end));
                }
                end
            }
            (None, Some(b)) => r.offset.saturating_add(b),
            (None, None) => u64::MAX,
        })
    }

    /// The bad-input error of a region past the end of its buffer (off the hot path).
    #[cold]
    #[inline(never)]
    fn past_the_end(i: u64, r: &Region, field: Field, size: u64, end: u64) -> CheckError {
        Self::err(
            i,
            field,
            format!(
                "region [{}, {}) reaches past the end of buffer \"{}\" ({size} bytes)",
                r.offset,
                if end == u64::MAX {
                    "end".to_string()
                } else {
                    end.to_string()
                },
                r.buffer
            ),
            Some("a region inside the buffer"),
        )
    }

    /// A region both read and written counts as written; the same region twice counts once.
    pub(super) fn dedup_regions(&mut self) {
        dedup_accesses(&mut self.op_accesses);
    }

    /// Runs the accesses of the current op: checks each region, then records them.
    pub(super) fn run_access_op(
        &mut self,
        i: u64,
        op: &Op,
        p: Participant,
        site: Option<Arc<Site>>,
        label_id: u32,
    ) {
        if p.is_host() {
            self.order.tick(p);
        } else {
            self.order.begin_stream_op(p);
            self.order.tick(p);
        }
        let epoch = self.order.clock(p).epoch(p);
        self.found.clear();
        for at in 0..self.op_accesses.len() {
            self.check_access(at, p);
        }
        if !self.found.is_empty() {
            let label = self.label_of(label_id);
            self.report_races(i, op, p, &site, &label, 0, p);
        }
        if !self.uaf.is_empty() {
            self.report_use_after_free(i, op, p, &site, 0);
        }
        self.record_accesses(i, p, epoch.time, &site, label_id, 0);
    }

    /// Records the accesses of the current op (`op_accesses`), by `p` at `time`; `captured` is
    /// [`Access::captured`].
    #[inline(always)]
    pub(super) fn record_accesses(
        &mut self,
        i: u64,
        p: Participant,
        time: crate::clock::Time,
        site: &Option<Arc<Site>>,
        label_id: u32,
        captured: u32,
    ) {
        let Checker {
            op_accesses,
            gens,
            history,
            order,
            limits,
            forget,
            graphs,
            ..
        } = self;
        let flat_max = limits.history_index_at;
        for a in op_accesses.iter() {
            if a.offset >= a.end {
                // An access of no bytes uses no memory: it can never conflict.
                continue;
            }
            let gen = gens[a.gen.0 as usize]
                .as_mut()
                .expect("accessed generation");
            if let Some(pg) = gen.pool_index() {
                graphs.pool_access(pg, p);
            }
            let access = Access {
                op: i,
                time,
                participant: p,
                kind: a.kind,
                offset: a.offset,
                end: a.end,
                site: site.clone(),
                label: label_id,
                captured,
            };
            let h = &mut gen.history;
            match h.index_mut() {
                None => {
                    *history += 1;
                    h.accesses.push(access);
                    if h.accesses.len() > flat_max || h.len() > flat_max {
                        let before = h.len();
                        h.index_now();
                        *history = *history + h.len() - before;
                    }
                }
                Some(ix) => {
                    // The check has already trimmed what this access subsumes on its bytes.
                    let before = ix.slots();
                    let entry = Arc::new(Entry {
                        access,
                        freed: None,
                    });
                    let forget = forget_clock(forget, order);
                    ix.insert(a.offset, a.end, entry, |e| forget.covers(e.access.epoch()));
                    *history = *history + ix.slots() - before;
                }
            }
        }
    }

    /// `data-race` and `reuse-race`: the earlier accesses that conflict with region `at` of the
    /// current op and do not happen before it.
    pub(super) fn check_access(&mut self, at: usize, p: Participant) {
        let OpAccess {
            gen: g,
            kind,
            offset,
            end,
        } = self.op_accesses[at];
        let Checker {
            order,
            gens,
            found,
            graveyard,
            history,
            forget,
            graphs,
            ..
        } = self;
        let clock = order.clock(p);
        // Entries this clock covers can never conflict again (see `Checker::retain`).
        let host = forget_clock(forget, order);
        let gen = gens[g.0 as usize].as_mut().expect("accessed generation");
        let probe = Probe {
            participant: p,
            clock,
            writes: kind.writes(),
            offset,
            end,
        };
        let hits = std::cell::Cell::new(0);
        let name = &gen.name;
        let mut hit = |a: &Access| {
            hits.set(hits.get() + 1);
            found.push(Found {
                at,
                kind: HazardKind::DataRace,
                access: a.clone(),
                buffer: name.clone(),
                freed: None,
            });
        };
        let h = &mut gen.history;
        match h.rest.as_deref_mut() {
            None | Some(crate::shadow::Rest { index: None, .. }) => {
                // An empty access covers nothing and conflicts with nothing.
                let cover = (offset < end).then_some(&mut h.rest);
                *history -= scan(&mut h.accesses, cover, host, probe, &mut hit);
                if hits.get() > 0 {
                    if let Some(r) = h.rest.as_deref_mut() {
                        *history -= scan(&mut r.covered, None, host, probe, &mut hit);
                    }
                }
            }
            Some(crate::shadow::Rest {
                index: Some(ix), ..
            }) if offset < end => {
                // Pieces split at the access's bounds lie inside it: an entry of this
                // participant that the access dominates is trimmed from them (rule 2).
                let before = ix.slots();
                ix.split_at(offset);
                ix.split_at(end);
                let grown = ix.slots() - before;
                let mut last: Option<*const Entry> = None;
                let dropped = ix.visit(offset, end, |e| {
                    let a = &e.access;
                    if host.covers(a.epoch()) {
                        return Visit::Drop;
                    }
                    if probe.conflicts(a) && last != Some(Arc::as_ptr(e)) {
                        last = Some(Arc::as_ptr(e));
                        hit(a);
                    }
                    if a.participant == p && Access::dominates(probe.writes, a) {
                        Visit::Drop
                    } else {
                        Visit::Keep
                    }
                });
                *history = *history + grown - dropped;
            }
            Some(_) => {}
        }

        // Reuse: tombstones of freed buffers on the bytes this region occupies.
        let (Some(base), memory) = (gen.addr(), gen.memory) else {
            return;
        };
        if offset >= end {
            return;
        }
        let gen = match gen.pool_index() {
            Some(pg) => {
                // The other buffers of its pool that held these bytes, earlier or later.
                let (lo, hi) = (base + offset, base + end.min(gen.size().unwrap_or(0)));
                graphs.pool_reuse(gens, history, pg, lo, hi, at, &probe, host, found);
                gens[g.0 as usize].as_mut().expect("accessed generation")
            }
            None => gen,
        };
        let (lo, hi) = (base + offset, base + end.min(gen.size().unwrap_or(0)));
        if gen.reuse().is_empty() && !gen.reuse_large() {
            return;
        }
        let mut alive = false;
        for rec in gen.reuse() {
            for a in &rec.entries {
                if host.covers(a.epoch()) {
                    continue;
                }
                alive = true;
                let (s, e) = rec.range(a);
                if s < hi && lo < e && probe.conflicts(a) {
                    found.push(Found {
                        at,
                        kind: HazardKind::ReuseRace,
                        access: a.clone(),
                        buffer: rec.freed.name.clone(),
                        freed: Some(FreedAt {
                            op: rec.freed.op,
                            site: rec.freed.site.clone(),
                            name: rec.freed.name.clone(),
                        }),
                    });
                }
            }
        }
        if gen.reuse_large() {
            let mut last: Option<*const Entry> = None;
            graveyard.large(memory).visit(lo, hi, |e| {
                if host.covers(e.access.epoch()) {
                    return Visit::Drop;
                }
                alive = true;
                let a = &e.access;
                if probe.conflicts(a) && last != Some(Arc::as_ptr(e)) {
                    last = Some(Arc::as_ptr(e));
                    found.push(Found {
                        at,
                        kind: HazardKind::ReuseRace,
                        access: a.clone(),
                        buffer: e
                            .freed
                            .as_ref()
                            .map_or_else(Id::default, |f| f.name.clone()),
                        freed: e.freed.as_ref().map(|f| FreedAt {
                            op: f.op,
                            site: f.site.clone(),
                            name: f.name.clone(),
                        }),
                    });
                }
                Visit::Keep
            });
        }
        if !alive && offset == 0 && end >= gen.size().unwrap_or(0) {
            // Every tombstone on its bytes is covered by the host's clock now.
            gen.set_reuse(Vec::new(), false);
        }
    }
}

/// A region both read and written counts as written; the same region twice counts once.
pub(super) fn dedup_accesses(v: &mut Vec<OpAccess>) {
    if v.len() < 2 {
        return;
    }
    if v.len() <= 16 {
        let mut k = 0;
        while k < v.len() {
            let a = v[k];
            let dup = v[..k].iter().any(|b| {
                b.gen == a.gen
                    && b.offset == a.offset
                    && b.end == a.end
                    && (b.kind == a.kind || b.kind.writes())
            });
            if dup {
                v.remove(k);
            } else {
                k += 1;
            }
        }
        return;
    }
    // Many regions: the kinds seen so far per region (bit 0 read, bit 1 write).
    let mut seen: HashMap<(GenId, u64, u64), u8> = HashMap::default();
    v.retain(|a| {
        let bit = if a.kind.writes() { 2 } else { 1 };
        let kinds = seen.entry((a.gen, a.offset, a.end)).or_insert(0);
        let dup = *kinds & bit != 0 || *kinds & 2 != 0;
        *kinds |= bit;
        !dup
    });
}
