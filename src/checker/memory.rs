//! The checker's allocations and frees: the allocator models, `unsafe-free` and `invalid-free`.

use super::*;

impl Checker {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn alloc(
        &mut self,
        i: u64,
        buffer: &Id,
        bytes: u64,
        stream: Option<&Id>,
        memory: MemoryKind,
        addr: Option<u64>,
        pool: Option<&Id>,
        site: Option<Arc<Site>>,
    ) -> Result<(), CheckError> {
        let cur = self.lookup(buffer);
        if let Some(Name::Live(_)) = cur {
            return Err(Self::err(
                i,
                Field::Buffer,
                format!("buffer \"{buffer}\" is already allocated and not yet freed"),
                Some("a new name, or a free of the buffer first"),
            ));
        }
        let stream_p = stream.map(|s| self.order.stream(s));
        let owner = match memory {
            MemoryKind::Device => stream_p.unwrap_or(Order::DEFAULT),
            _ => Participant::HOST,
        };
        // Device memory allocated on a capturing stream comes from the capture's pool (and is
        // not a use: nothing runs at capture); outside a capture, from the pool the alloc names.
        let captured = match memory {
            MemoryKind::Device => self.graphs.capture_pool(owner),
            _ => None,
        };
        if let Some(name) = pool {
            if memory != MemoryKind::Device {
                return Err(Self::err(
                    i,
                    Field::Pool,
                    format!(
                        "a graph memory pool holds device memory only, and this allocation is of {} memory",
                        memory.as_str()
                    ),
                    Some("no \"pool\" on a pinned or managed allocation"),
                ));
            }
            if let Some(c) = captured.filter(|&c| self.graphs.pool_named(name) != Some(c)) {
                let graph = self.graphs.capture_graph_name(owner).cloned();
                let capture_pool = self.graphs.pool_name(c).cloned();
                let (graph, capture_pool) =
                    (graph.unwrap_or_default(), capture_pool.unwrap_or_default());
                return Err(Self::err(
                    i,
                    Field::Pool,
                    format!(
                        "stream \"{}\" is capturing graph \"{graph}\", whose allocations come from pool \"{capture_pool}\", not \"{name}\"",
                        self.order.name(owner)
                    ),
                    Some("the capture's pool, or no \"pool\""),
                ));
            }
        }
        let pool = match (captured, pool) {
            (Some(c), _) => Some(c),
            (None, Some(name)) => Some(self.graphs.pool_or_add(name)),
            (None, None) => None,
        };
        let mut base = None;
        if bytes > 0 {
            let with_addr = addr.is_some();
            match self.addr_mode {
                None => self.addr_mode = Some(with_addr),
                Some(mode) if mode != with_addr => {
                    return Err(Self::err(
                        i,
                        if with_addr { Field::Addr } else { Field::Op },
                        if with_addr {
                            "this allocation gives \"addr\" but earlier allocations did not"
                        } else {
                            "this allocation has no \"addr\" but earlier allocations gave one"
                        },
                        Some("\"addr\" on every non-empty allocation or on none"),
                    ))
                }
                _ => {}
            }
            match addr {
                Some(a) => {
                    let end = a.checked_add(bytes).ok_or_else(|| {
                        Self::err(
                            i,
                            Field::Addr,
                            "addr + bytes overflows",
                            Some("a range below 2^64"),
                        )
                    })?;
                    if let Some((&s, &(e, g))) = self.live[memory.index()].range(..end).next_back()
                    {
                        if e > a {
                            return Err(Self::err(
                                i,
                                Field::Addr,
                                format!(
                                    "{} memory [{a:#x}, {end:#x}) overlaps the live buffer \"{}\" at [{s:#x}, {e:#x})",
                                    memory.as_str(),
                                    self.gen(g).name
                                ),
                                Some("an address range that no live allocation of the same memory kind uses"),
                            ));
                        }
                    }
                    if memory == MemoryKind::Device {
                        // Bytes another graph pool held went back to the driver (PyTorch frees a
                        // pool's segments once no graph uses it: `empty_cache`, which every
                        // capture's start calls), which synchronized the device.
                        let released = self.graphs.pool_bytes.release(a, end, pool);
                        self.reappear(i, a, end, owner, released);
                    }
                    base = Some(a);
                }
                None => {
                    let block = match (memory, pool) {
                        (MemoryKind::Device, Some(p)) => {
                            self.graphs
                                .pools
                                .allocate(p, bytes, owner.0, self.device.memory_mut())
                        }
                        (MemoryKind::Device, None) => self.device.allocate(bytes, owner.0),
                        (MemoryKind::Pinned, _) => self.pinned.allocate(bytes),
                        (MemoryKind::Managed, _) => self.managed.allocate(bytes),
                    }
                    .map_err(|e| {
                        Self::err(
                            i,
                            Field::Bytes,
                            format!("the allocator model cannot serve {bytes} bytes: {e}"),
                            Some("a size the address space can hold"),
                        )
                    })?;
                    if let Some(b) = block {
                        base = Some(b.addr);
                    }
                }
            }
        }
        // The allocation is a use: a write of the whole buffer by the owner, at the epoch of
        // the owner's latest access (time 0, before everything, if it has none). A capture's
        // is not (nothing runs at capture); a pool's outside a capture is.
        let epoch = self.order.clock(owner).epoch(owner);
        let mut accesses = self.spare_vec();
        if bytes > 0 && memory == MemoryKind::Device && epoch.time > 0 && captured.is_none() {
            accesses.push(Access {
                op: i,
                time: epoch.time,
                participant: owner,
                kind: AccessKind::Alloc,
                offset: 0,
                end: bytes,
                site: site.clone(),
                label: 0,
                captured: 0,
            });
        }
        self.history += accesses.len();
        let used = !accesses.is_empty();
        // Only the bytes that hold tombstones now can race with freed buffers: while this buffer
        // lives, no other buffer is freed on its bytes.
        let (reuse, reuse_large) = match base {
            Some(a) => self.graveyard.reuse(memory, a, a + bytes),
            None => (Vec::new(), false),
        };
        let mut gen = Generation::allocated(
            buffer.clone(),
            memory,
            owner,
            bytes,
            base,
            i,
            site,
            History::flat(accesses),
        );
        if reuse_large || !reuse.is_empty() {
            gen.set_reuse(reuse, reuse_large);
        }
        let g = self.new_gen(gen);
        if let Some(p) = pool {
            let addr_mode = self.addr_mode == Some(true);
            let pg = self
                .graphs
                .add_pool_buffer(p, g, buffer, base, bytes, i, addr_mode);
            if let Some(gen) = self.gens[g.0 as usize].as_mut() {
                gen.set_pool(pg);
            }
            if used {
                // The allocation's use is the first access of its history.
                self.graphs.pool_access(pg, owner);
            }
        }
        // Recorded addresses are checked for overlaps; the model's never overlap.
        if let (Some(a), Some(true)) = (base, self.addr_mode) {
            self.live[memory.index()].insert(a, (a + bytes, g));
        }
        // A name used so far as external starts a new, unrelated buffer.
        self.rebind(buffer, cur, Name::Live(g));
        match cur {
            // An external buffer that a graph's body names stays with the graph.
            Some(Name::External(old)) if !self.gen(old).is_captured() => self.drop_gen(old),
            // The name is allocated again: what remained of the freed one is no longer needed.
            Some(Name::Freed(f)) => self.release_freed(f),
            _ => {}
        }
        Ok(())
    }

    /// With `addr`: device memory that reappears on another stream than the one that last freed
    /// it went back to the driver and was allocated again, which synchronizes the device.
    #[inline(never)]
    pub(super) fn reappear(
        &mut self,
        i: u64,
        start: u64,
        end: u64,
        owner: Participant,
        released: bool,
    ) {
        let mut sync = released;
        let mut overlapped = Vec::new();
        // The ranges are disjoint: walking down from `end`, the first that ends at or below
        // `start` ends the overlaps.
        for (&s, &(e, p)) in self.freed_by.range(..end).rev() {
            if e <= start {
                break;
            }
            sync |= p != owner;
            overlapped.push((s, e, p));
        }
        for (s, e, p) in overlapped {
            self.freed_by.remove(&s);
            if s < start {
                self.freed_by.insert(s, (start, p));
            }
            if e > end {
                self.freed_by.insert(end, (e, p));
            }
        }
        if sync {
            let device = self.order.device(owner);
            self.order.device_sync(device);
            self.implicit_syncs.push((i, device));
        }
    }

    /// With `addr`: device bytes `[start, end)`, free of any other range of `freed_by`, were
    /// freed by `by`. Ranges that touch and were freed by the same participant are one: a loop
    /// that frees ever new addresses keeps one range.
    #[inline(never)]
    fn freed_by_insert(&mut self, mut start: u64, mut end: u64, by: Participant) {
        if let Some((&s, &(e, p))) = self.freed_by.range(..start).next_back() {
            if e == start && p == by {
                self.freed_by.remove(&s);
                start = s;
            }
        }
        if let Some(&(e, p)) = self.freed_by.get(&end) {
            if p == by {
                self.freed_by.remove(&end);
                end = e;
            }
        }
        self.freed_by.insert(start, (end, by));
    }

    /// `invalid-free`: the free at op `i` of `buffer`, which `bound` says is not live.
    #[cold]
    #[inline(never)]
    fn invalid_free(
        &mut self,
        i: u64,
        buffer: &Id,
        named: Option<Participant>,
        bound: Option<Name>,
        site: Option<Arc<Site>>,
    ) {
        let (why, by, bytes, notes) = match bound {
            None => (
                "was never allocated".to_string(),
                named.unwrap_or(Participant::HOST),
                None,
                vec![],
            ),
            Some(Name::External(_)) => (
                "is external: it was used without an alloc, so this trace does not own it"
                    .to_string(),
                named.unwrap_or(Participant::HOST),
                None,
                vec![],
            ),
            Some(Name::Freed(f)) => {
                let f = self.freed(f);
                (
                    format!("was already freed at op {}", f.free_op),
                    named.unwrap_or(if f.memory == MemoryKind::Device {
                        f.owner
                    } else {
                        Participant::HOST
                    }),
                    Some(f.size),
                    vec![OpNote {
                        what: "first freed here".into(),
                        op: f.free_op,
                        site: f.free_site.clone(),
                    }],
                )
            }
            Some(Name::Forgotten) => {
                // Its free is forgotten: what is known is that it was freed.
                let r = self.residue(buffer);
                (
                    "was already freed, at an op no longer kept".to_string(),
                    named.unwrap_or(if r.memory == MemoryKind::Device {
                        r.owner
                    } else {
                        Participant::HOST
                    }),
                    Some(r.size),
                    vec![],
                )
            }
            Some(Name::Live(_)) => unreachable!(),
        };
        let participant = self.order.name(by).to_string();
        let plan = FixPlan::RemoveFree {
            buffer: buffer.to_string(),
            at: i,
            why,
        };
        self.hazards.push(Hazard {
            kind: HazardKind::InvalidFree,
            severity: HazardKind::InvalidFree.severity(),
            op: i,
            buffer: Some(buffer.to_string()),
            pattern: None,
            access: Some(AccessRef {
                op: i,
                participant: participant.clone(),
                access: AccessKind::Free,
                offset: 0,
                bytes,
                site,
                captured: None,
            }),
            conflicts: vec![],
            free: None,
            fix: Some(plan.sentence()),
            detail: Detail {
                op_name: "free",
                label: None,
                event: None,
                participant,
                notes,
                why: Vec::new(),
                replay: None,
                plan: Some(plan),
            },
            confirmation: None,
        });
    }

    pub(super) fn free(
        &mut self,
        i: u64,
        buffer: &Id,
        stream: Option<&Id>,
        site: Option<Arc<Site>>,
    ) -> Result<(), CheckError> {
        let named = stream.map(|s| self.order.stream(s));
        if let Some(p) = named {
            // A stream-ordered free is an op on its stream (rules 2 and 5 apply).
            self.order.begin_stream_op(p);
        }
        let g = match self.lookup(buffer) {
            Some(Name::Live(g)) => g,
            other => {
                self.invalid_free(i, buffer, named, other, site);
                return Ok(());
            }
        };
        if self.gen(g).is_pool() {
            self.free_pool_buffer(i, g, buffer, named, site);
            return Ok(());
        }
        let (memory, owner, size, base) = {
            let gen = self.gen(g);
            (gen.memory, gen.owner, gen.size().unwrap_or(0), gen.addr())
        };
        let by = named.unwrap_or(if memory == MemoryKind::Device {
            owner
        } else {
            Participant::HOST
        });
        // The free's clock: the freeing participant's (joined with the host's), joined with the
        // clock of every stream named by record_stream. An access happens before it when one of
        // those clocks covers it.
        let mut gen = self.take_gen(g).expect("live generation");
        if gen.is_captured() {
            // The graphs whose bodies name it: their launches now use freed memory.
            self.graphs.buffer_freed(g, i, by, &site);
        }
        let alloc_op = gen.alloc_op();
        let rs = gen.take_record_streams();
        let Generation {
            name,
            alloc_site,
            history,
            ..
        } = gen;
        let order = &self.order;
        let before_free = |e: crate::clock::Epoch| {
            order.clock(by).covers(e)
                || order.host_clock().covers(e)
                || rs.iter().any(|&p| order.clock(p).covers(e))
        };
        let mut entries = history.into_all();
        let unordered: Vec<&Access> = entries
            .iter()
            .filter(|a| a.participant != by && !before_free(a.epoch()))
            .collect();
        // Each participant's latest conflicting op, with all its regions.
        let latest = latest_ops(unordered.iter().copied());
        let mut conflicts: Vec<Conflict> = unordered
            .iter()
            .filter(|a| is_latest(&latest, a))
            .map(|a| conflict_of(order, &self.label_names, &self.graphs, a, &name))
            .collect();
        let alloc_op = alloc_op.unwrap_or(0);
        if !rs.is_empty() {
            // The allocator hands these bytes out again only after the events it records now on
            // the record_stream streams complete: whatever those streams' clocks cover happens
            // before every access to memory that reuses them, so it can never be a reuse race.
            let mut excused = VectorClock::new();
            for &p in &rs {
                excused.join(order.clock(p));
            }
            entries.retain(|a| !excused.covers(a.epoch()));
        }
        if !conflicts.is_empty() {
            conflicts.sort_by(conflict_order);
            conflicts.dedup();
            let participant = self.order.name(by).to_string();
            let launch_named = self.graphs.with_launch_streams(&self.order, &conflicts);
            let plan = unsafe_free_plan(
                &self.order,
                buffer,
                i,
                by,
                named.is_some(),
                memory,
                owner,
                launch_named.as_deref().unwrap_or(&conflicts),
            );
            self.hazards.push(Hazard {
                kind: HazardKind::UnsafeFree,
                severity: HazardKind::UnsafeFree.severity(),
                op: i,
                buffer: Some(buffer.to_string()),
                pattern: None,
                access: Some(AccessRef {
                    op: i,
                    participant: participant.clone(),
                    access: AccessKind::Free,
                    offset: 0,
                    bytes: Some(size),
                    site: site.clone(),
                    captured: None,
                }),
                conflicts,
                free: None,
                fix: Some(plan.sentence()),
                detail: Detail {
                    op_name: "free",
                    label: None,
                    event: None,
                    participant,
                    notes: vec![OpNote {
                        what: format!("allocated on {}", self.order.name(owner)),
                        op: alloc_op,
                        site: alloc_site,
                    }],
                    why: Vec::new(),
                    replay: None,
                    plan: Some(plan),
                },
                confirmation: None,
            });
        }
        // Hand the memory back to the allocator model.
        if let Some(a) = base {
            if self.addr_mode == Some(true) {
                self.live[memory.index()].remove(&a);
                if memory == MemoryKind::Device {
                    self.freed_by_insert(a, a + size, by);
                }
            } else {
                // The model handed this block out, so giving it back cannot fail.
                let _ = match memory {
                    MemoryKind::Device => self.device.free(a, by.0),
                    MemoryKind::Pinned => self.pinned.free(a),
                    MemoryKind::Managed => self.managed.free(a),
                };
            }
        }
        // What the accesses left unexcused still decides reuse races: bury them, in op order,
        // so that each trims the earlier tombstones of its participant it subsumes.
        if let Some(a) = base.filter(|_| size > 0) {
            let forget = forget_clock(&self.forget, &self.order);
            entries.retain(|e| !forget.covers(e.epoch()));
            if !entries.is_empty() {
                if self.graveyard.len() >= self.graveyard_prune_at {
                    self.prune_graveyard();
                }
                let freed = Freed {
                    name: buffer.clone(),
                    op: i,
                    site: site.clone(),
                };
                let forget = forget_clock(&self.forget, &self.order);
                if let Some(mut v) = self.graveyard.bury(memory, a, size, entries, freed, forget) {
                    if v.capacity() > 0 && v.capacity() <= 4 * FLAT_MAX && self.spare.len() < 1024 {
                        v.clear();
                        self.spare.push(v);
                    }
                }
            }
        }
        let freed = FreedName {
            name: buffer.clone(),
            size,
            memory,
            owner,
            free_op: i,
            free_by: by,
            free_site: site,
            pool_gen: NO_GEN,
        };
        self.bind_freed(buffer, g, freed);
        Ok(())
    }
}
