//! Captures: the capture state machine, the body, `graph_begin` and `graph_end`.

use super::*;

impl Checker {
    /// During a capture: what a capture changes about op `i`. `Ok(true)` when the op was
    /// captured (or otherwise handled here), `Ok(false)` when it runs as usual; `Err` for the
    /// programs CUDA rejects during a capture.
    pub(in crate::checker) fn capture_step(
        &mut self,
        i: u64,
        op: &Op,
        site: &Option<Arc<Site>>,
    ) -> Result<bool, CheckError> {
        if self.graphs.blocking > 0 && op.on_stream().is_some_and(|s| s.as_str() == DEFAULT_STREAM)
        {
            return Err(Self::err(
                i,
                Field::Stream,
                "an op on the legacy default stream while a blocking stream is capturing",
                Some("the op on another stream, or after the capture ends"),
            ));
        }
        match op {
            Op::Launch { stream, .. } | Op::Copy { stream, .. } | Op::Memset { stream, .. } => {
                let p = self.order.stream(stream);
                if let Some(&(g, lane)) = self.graphs.capturing.get(&p) {
                    self.capture_access(i, op, g, lane, site)?;
                    return Ok(true);
                }
            }
            Op::EventRecord { event, stream } => {
                let p = self.order.stream(stream);
                match self.graphs.capturing.get(&p) {
                    Some(&(g, lane)) => {
                        self.capture_record(i, op, g, lane, event, site);
                        return Ok(true);
                    }
                    None => {
                        self.graphs.events.remove(event);
                    }
                }
            }
            Op::EventWait { stream, event } => {
                let p = self.order.stream(stream);
                let captured = self.graphs.events.get(event).copied();
                match (self.graphs.capturing.get(&p).copied(), captured) {
                    (Some((g, lane)), Some((h, slot))) if g == h => {
                        self.capture_wait(i, op, g, lane, Some(slot), site);
                        return Ok(true);
                    }
                    (Some((g, _)), Some((h, _))) => {
                        let (me, other) = (
                            &self.graphs.graphs[g as usize].name,
                            &self.graphs.graphs[h as usize].name,
                        );
                        return Err(Self::err(
                            i,
                            Field::Event,
                            format!(
                                "stream \"{stream}\" is capturing graph \"{me}\" and waits on event \"{event}\", recorded in the capture of graph \"{other}\""
                            ),
                            Some("an event recorded in the same capture"),
                        ));
                    }
                    (Some((g, lane)), None) => {
                        if self.order.is_recorded(event) {
                            let me = &self.graphs.graphs[g as usize].name;
                            return Err(Self::err(
                                i,
                                Field::Event,
                                format!(
                                    "stream \"{stream}\" is capturing graph \"{me}\" and waits on event \"{event}\", recorded outside the capture"
                                ),
                                Some("an event recorded in the same capture"),
                            ));
                        }
                        self.warn_unrecorded(i, op, stream, event);
                        self.capture_wait(i, op, g, lane, None, site);
                        return Ok(true);
                    }
                    (None, Some((g, slot))) => {
                        if p == Order::DEFAULT {
                            return Err(Self::err(
                                i,
                                Field::Stream,
                                format!(
                                    "the legacy default stream waits on event \"{event}\", captured in graph \"{}\": it cannot join a capture",
                                    self.graphs.graphs[g as usize].name
                                ),
                                Some("a wait on another stream"),
                            ));
                        }
                        let lane = self.join_capture(g, p, slot);
                        self.capture_wait(i, op, g, lane, Some(slot), site);
                        return Ok(true);
                    }
                    (None, None) => {}
                }
            }
            Op::Free {
                stream: Some(stream),
                ..
            } => {
                let p = self.order.stream(stream);
                if let Some(g) = self.capturing_graph(p) {
                    return Err(Self::err(
                        i,
                        Field::Stream,
                        format!(
                            "a stream-ordered free on stream \"{stream}\", which is capturing graph \"{g}\""
                        ),
                        Some("a caching free, or a stream that is not capturing"),
                    ));
                }
            }
            Op::StreamSync { stream } | Op::StreamQuery { stream, .. } => {
                let p = self.order.stream(stream);
                if let Some(g) = self.capturing_graph(p) {
                    return Err(Self::err(
                        i,
                        Field::Stream,
                        format!(
                            "{} of stream \"{stream}\", which is capturing graph \"{g}\"",
                            op.name()
                        ),
                        Some("a stream that is not capturing"),
                    ));
                }
            }
            Op::EventSync { event } | Op::EventQuery { event, .. } => {
                if let Some(&(g, _)) = self.graphs.events.get(event) {
                    return Err(Self::err(
                        i,
                        Field::Event,
                        format!(
                            "{} of event \"{event}\", captured in graph \"{}\" during its capture",
                            op.name(),
                            self.graphs.graphs[g as usize].name
                        ),
                        Some("an event recorded outside a capture"),
                    ));
                }
            }
            Op::DeviceSync { .. } => {
                let g = self.graphs.graphs.iter().find(|g| !g.ended);
                let g = g.map_or_else(String::new, |g| g.name.to_string());
                return Err(Self::err(
                    i,
                    Field::Op,
                    format!("device_sync while graph \"{g}\" is being captured"),
                    Some("the device_sync after graph_end"),
                ));
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.graphs.events.remove(event);
            }
            _ => {}
        }
        Ok(false)
    }

    /// Whether `op`, checked next, would be captured into a graph's body rather than run: a
    /// `launch`, `copy`, `memset` or `event_record` on a capturing stream, or an `event_wait`
    /// on a capturing stream or of a captured event (which makes its stream join the capture).
    /// Captured ops are part of a graph: the synchronization analysis does not judge them.
    /// (For an op the check rejects, the answer does not matter.)
    pub fn captures(&self, op: &Op) -> bool {
        if !self.graphs.capturing() {
            return false;
        }
        let capturing = |s: &Id| {
            self.order
                .find_stream(s)
                .is_some_and(|p| self.graphs.capturing.contains_key(&p))
        };
        match op {
            Op::Launch { stream, .. }
            | Op::Copy { stream, .. }
            | Op::Memset { stream, .. }
            | Op::EventRecord { stream, .. } => capturing(stream),
            Op::EventWait { stream, event } => {
                capturing(stream) || self.graphs.events.contains_key(event)
            }
            _ => false,
        }
    }

    /// The name of the graph stream `p` is capturing, if it is.
    pub(super) fn capturing_graph(&self, p: Participant) -> Option<Id> {
        let &(g, _) = self.graphs.capturing.get(&p)?;
        Some(self.graphs.graphs[g as usize].name.clone())
    }

    /// Whether a capture underway keeps the stream named `name` from taking part in a fix now:
    /// it is capturing (an event recorded on it would be captured, and it cannot wait on one
    /// recorded outside the capture), or it is the legacy default stream while a blocking stream
    /// captures (no op may be issued on it).
    pub(crate) fn capture_blocks(&self, name: &Id) -> bool {
        self.graphs.capturing()
            && ((self.graphs.blocking > 0 && name.as_str() == DEFAULT_STREAM)
                || self
                    .order
                    .find_stream(name)
                    .is_some_and(|p| self.graphs.capturing.contains_key(&p)))
    }

    /// Whether the latest record of event `event` was captured in a capture underway (a stream
    /// that waits on it joins that capture).
    pub(crate) fn event_captured(&self, event: &Id) -> bool {
        self.graphs.capturing() && self.graphs.events.contains_key(event)
    }

    /// Whether a capture is underway: no host synchronization is allowed then.
    pub(crate) fn capture_underway(&self) -> bool {
        self.graphs.capturing()
    }

    /// Whether `p` is a blocking stream of device 0 (rule 5 of the trace format).
    pub(super) fn blocking0(&self, p: Participant) -> bool {
        let info = self.order.stream_info(p);
        info.blocking && info.device == 0
    }

    /// Adds captured op `i` of graph `g` to the table of captured ops: its [`Access::captured`].
    pub(super) fn add_captured(
        &mut self,
        i: u64,
        op: &Op,
        g: u32,
        lane: u32,
        kind: BodyKind,
        site: &Option<Arc<Site>>,
    ) {
        let name = self.graphs.graphs[g as usize].name.clone();
        let stream = op.on_stream().cloned().unwrap_or_default();
        self.graphs.captured.push(CapturedOp {
            op: i,
            site: site.clone(),
            graph: name,
            name: op.name(),
            stream,
        });
        let captured = self.graphs.captured.len() as u32;
        self.graphs.graphs[g as usize].body.push(BodyOp {
            lane,
            captured,
            kind,
        });
    }

    /// A captured `launch`, `copy` or `memset` on lane `lane` of graph `g`.
    pub(super) fn capture_access(
        &mut self,
        i: u64,
        op: &Op,
        g: u32,
        lane: u32,
        site: &Option<Arc<Site>>,
    ) -> Result<(), CheckError> {
        let from = self.graphs.graphs[g as usize].regions.len();
        let resolved = self.capture_regions(i, op, g);
        let regions = &mut self.graphs.graphs[g as usize].regions;
        if let Err(e) = resolved {
            regions.truncate(from);
            return Err(e);
        }
        // Dedup as for a running op: a region read and written counts as written.
        let mut v: Vec<OpAccess> = regions[from..]
            .iter()
            .map(|r| OpAccess {
                gen: GenId(r.buf),
                kind: r.kind,
                offset: r.offset,
                end: r.end,
            })
            .collect();
        dedup_accesses(&mut v);
        regions.truncate(from);
        regions.extend(v.iter().map(|a| BodyRegion {
            buf: a.gen.0,
            kind: a.kind,
            offset: a.offset,
            end: a.end,
        }));
        let to = regions.len();
        let label = match op {
            Op::Launch {
                name: Some(name), ..
            } => self.label(name),
            _ => 0,
        };
        let graph = &mut self.graphs.graphs[g as usize];
        let l = &mut graph.lanes[lane as usize];
        grow(&mut l.clock, lane as usize + 1);
        l.clock[lane as usize] += 1;
        l.last_work = Some(i);
        let kind = BodyKind::Access {
            from: from as u32,
            to: to as u32,
            label,
        };
        self.add_captured(i, op, g, lane, kind, site);
        Ok(())
    }

    /// Resolves the regions of captured access `op` into graph `g`'s regions.
    pub(super) fn capture_regions(&mut self, i: u64, op: &Op, g: u32) -> Result<(), CheckError> {
        match op {
            Op::Launch { reads, writes, .. } => {
                for (k, r) in writes.iter().enumerate() {
                    self.capture_region(i, g, r, Field::Write(k as u32), AccessKind::Write)?;
                }
                for (k, r) in reads.iter().enumerate() {
                    self.capture_region(i, g, r, Field::Read(k as u32), AccessKind::Read)?;
                }
            }
            Op::Copy { src, dst, .. } => {
                let at = self.graphs.graphs[g as usize].regions.len();
                self.capture_region(i, g, dst, Field::Dst, AccessKind::Write)?;
                self.capture_region(i, g, src, Field::Src, AccessKind::Read)?;
                if let [a, b] = self.graphs.graphs[g as usize].regions[at..] {
                    if a.buf == b.buf && a.offset < b.end && b.offset < a.end {
                        return Err(Self::err(
                            i,
                            Field::Dst,
                            format!(
                                "copy source and destination overlap in buffer \"{}\"",
                                dst.buffer
                            ),
                            Some("disjoint regions"),
                        ));
                    }
                }
            }
            Op::Memset { dst, .. } => {
                self.capture_region(i, g, dst, Field::Dst, AccessKind::Write)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Resolves region `r` of a captured op of graph `g` to a buffer of its body: the buffer its
    /// name denotes now (a freed pool buffer's generation, whose bytes the replays access).
    pub(super) fn capture_region(
        &mut self,
        i: u64,
        g: u32,
        r: &Region,
        field: Field,
        kind: AccessKind,
    ) -> Result<(), CheckError> {
        let (key, size, freed) = match self.lookup(&r.buffer) {
            Some(Name::Live(gen)) => (BufKey::Gen(gen), self.gen(gen).size(), None),
            Some(Name::External(gen)) => (BufKey::Gen(gen), None, None),
            Some(Name::Freed(f)) => {
                let f = self.freed(f);
                if f.pool_gen != NO_GEN {
                    (BufKey::Gen(GenId(f.pool_gen)), Some(f.size), None)
                } else {
                    let freed = FreedBy::Op(f.free_op, f.free_by, f.free_site.clone());
                    (BufKey::Freed(f.name.clone()), Some(f.size), Some(freed))
                }
            }
            // Pool buffers are never forgotten.
            Some(Name::Forgotten) => {
                let size = self.residue(&r.buffer).size;
                let freed = FreedBy::Forgotten;
                (BufKey::Freed(r.buffer.clone()), Some(size), Some(freed))
            }
            None => {
                let gen = self.new_external(&r.buffer);
                self.rebind(&r.buffer, None, Name::External(gen));
                (BufKey::Gen(gen), None, None)
            }
        };
        let end = Self::region_end(i, r, field, size)?;
        let graph = &mut self.graphs.graphs[g as usize];
        let buf = match graph.buf_index.get(&key) {
            Some(&b) => b,
            None => {
                let b = graph.bufs.len() as u32;
                let gen = match key {
                    BufKey::Gen(gen) => Some(gen),
                    BufKey::Freed(_) => None,
                };
                graph.bufs.push(BodyBuf {
                    name: r.buffer.clone(),
                    gen,
                    freed,
                });
                graph.buf_index.insert(key, b);
                if let Some(gen) = gen {
                    let gn = self.gens[gen.0 as usize]
                        .as_mut()
                        .expect("named generation");
                    gn.set_captured();
                    if !gn.is_external() && !gn.is_pool() {
                        self.graphs.refs.entry(gen).or_default().push((g, b));
                    }
                }
                b
            }
        };
        self.graphs.graphs[g as usize].regions.push(BodyRegion {
            buf,
            kind,
            offset: r.offset,
            end,
        });
        Ok(())
    }

    /// A captured `event_record` of `event` on lane `lane` of graph `g`.
    pub(super) fn capture_record(
        &mut self,
        i: u64,
        op: &Op,
        g: u32,
        lane: u32,
        event: &Id,
        site: &Option<Arc<Site>>,
    ) {
        let graph = &mut self.graphs.graphs[g as usize];
        let slot = graph.slots;
        graph.slots += 1;
        let clock = graph.lanes[lane as usize].clock.clone();
        graph.slot_clocks.push(clock);
        self.graphs.events.insert(event.clone(), (g, slot));
        // The capture is no recorded work: outside the capture, the event counts as never
        // recorded (and after the capture ends, until it is recorded again).
        self.order.reset_event(event);
        self.add_captured(i, op, g, lane, BodyKind::Record(slot), site);
    }

    /// A captured `event_wait` on lane `lane` of graph `g`, of `slot` (`None`: the event was
    /// never recorded; the wait has no effect).
    pub(super) fn capture_wait(
        &mut self,
        i: u64,
        op: &Op,
        g: u32,
        lane: u32,
        slot: Option<u32>,
        site: &Option<Arc<Site>>,
    ) {
        if let Some(s) = slot {
            let graph = &mut self.graphs.graphs[g as usize];
            let snap = std::mem::take(&mut graph.slot_clocks[s as usize]);
            let l = &mut graph.lanes[lane as usize];
            grow(&mut l.clock, snap.len());
            for (a, b) in l.clock.iter_mut().zip(&snap) {
                *a = (*a).max(*b);
            }
            graph.slot_clocks[s as usize] = snap;
        }
        self.add_captured(i, op, g, lane, BodyKind::Wait(slot), site);
    }

    /// Stream `p` joins the capture of graph `g` by waiting on `slot`: its new lane.
    pub(super) fn join_capture(&mut self, g: u32, p: Participant, slot: u32) -> u32 {
        let blocking = self.blocking0(p);
        let graph = &mut self.graphs.graphs[g as usize];
        let lane = graph.lanes.len() as u32;
        graph.lanes.push(Lane {
            stream: p,
            clock: graph.slot_clocks[slot as usize].clone(),
            last_work: None,
        });
        self.graphs.capturing.insert(p, (g, lane));
        if blocking {
            self.graphs.blocking += 1;
        }
        lane
    }

    /// `graph_begin`: the host starts capturing `graph` on `stream`.
    pub(in crate::checker) fn graph_begin(
        &mut self,
        i: u64,
        graph: &Id,
        stream: &Id,
        pool: Option<&Id>,
    ) -> Result<(), CheckError> {
        if stream.as_str() == DEFAULT_STREAM {
            return Err(Self::err(
                i,
                Field::Stream,
                "graph_begin on the legacy default stream, which cannot be captured",
                Some("another stream"),
            ));
        }
        let p = self.order.stream(stream);
        if let Some(g) = self.capturing_graph(p) {
            return Err(Self::err(
                i,
                Field::Stream,
                format!("stream \"{stream}\" is already capturing graph \"{g}\""),
                Some("a stream that is not capturing"),
            ));
        }
        if self.graphs.by_name.contains_key(graph) {
            return Err(Self::err(
                i,
                Field::Graph,
                format!("graph \"{graph}\" is already captured"),
                Some("a new graph name"),
            ));
        }
        let pool = self.graphs.pool_or_add(pool.unwrap_or(graph));
        self.graphs.pools.begin_capture(pool);
        let g = self.graphs.graphs.len() as u32;
        self.graphs.graphs.push(Graph {
            name: graph.clone(),
            pool,
            lanes: vec![Lane {
                stream: p,
                clock: vec![0],
                last_work: None,
            }],
            ..Graph::default()
        });
        self.graphs.by_name.insert(graph.clone(), g);
        self.graphs.capturing.insert(p, (g, 0));
        self.graphs.active += 1;
        if self.blocking0(p) {
            self.graphs.blocking += 1;
        }
        Ok(())
    }

    /// `graph_end`: the capture of `graph` ends.
    pub(in crate::checker) fn graph_end(&mut self, i: u64, graph: &Id) -> Result<(), CheckError> {
        let g = match self.graphs.by_name.get(graph) {
            Some(&g) if !self.graphs.graphs[g as usize].ended => g,
            Some(_) => {
                return Err(Self::err(
                    i,
                    Field::Graph,
                    format!("graph \"{graph}\" is not being captured: its capture has ended"),
                    Some("a graph_begin of the graph first"),
                ))
            }
            None => {
                return Err(Self::err(
                    i,
                    Field::Graph,
                    format!("graph \"{graph}\" is not being captured"),
                    Some("a graph_begin of the graph first"),
                ))
            }
        };
        let gr = &self.graphs.graphs[g as usize];
        let origin = &gr.lanes[0];
        for (k, lane) in gr.lanes.iter().enumerate().skip(1) {
            let work = lane.clock.get(k).copied().unwrap_or(0);
            if work > origin.clock.get(k).copied().unwrap_or(0) {
                return Err(Self::err(
                    i,
                    Field::Graph,
                    format!(
                        "stream \"{}\" joined the capture of graph \"{graph}\", and its captured work (up to op {}) is not joined into the origin \"{}\"",
                        self.order.name(lane.stream),
                        lane.last_work.unwrap_or(0),
                        self.order.name(origin.stream),
                    ),
                    Some("an event recorded on that stream after its work, and waited for by the origin before graph_end"),
                ));
            }
        }
        let streams: Vec<Participant> = gr.lanes.iter().map(|l| l.stream).collect();
        for p in streams {
            self.graphs.capturing.remove(&p);
            if self.blocking0(p) {
                self.graphs.blocking -= 1;
            }
        }
        self.graphs.active -= 1;
        let gr = &mut self.graphs.graphs[g as usize];
        gr.ended = true;
        gr.slot_clocks = Vec::new();
        gr.buf_index = HashMap::default();
        for l in &mut gr.lanes {
            l.clock = Vec::new();
        }
        let pool = gr.pool;
        self.graphs.pools.end_capture(pool);
        // Its captured events count as never recorded (they are reset already).
        self.graphs.events.retain(|_, &mut (h, _)| h != g);
        Ok(())
    }
}
