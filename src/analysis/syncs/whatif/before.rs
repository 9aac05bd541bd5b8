//! What an op does to the what-ifs before the real checker checks it: their clocks, event captures
//! and `record_stream` sets, and a graph launch's entry clocks.

use super::*;

impl Engine {
    /// Finds what the op does to the what-ifs, before the real checker checks it, and applies
    /// the new clocks and captures (the real checker does not look at them). Keeps history for
    /// the what-ifs' host clocks from now on where the op may move the real host's clock ahead.
    pub fn before(&mut self, checker: &mut Checker, op: &Op, captured: bool) -> Pre {
        let mut pre = Pre::default();
        if captured {
            // A captured op runs nothing and changes no clock; a captured record leaves its
            // event never recorded outside the capture, in every what-if as in the real state.
            if let Op::EventRecord { event, .. } = op {
                let mut out = self.by_event.get(event).to_vec();
                out.sort_unstable();
                for &wid in &out {
                    self.set_capture(wid, event, Diff::new());
                }
                pre.affected = out;
            }
            return pre;
        }
        if let Op::GraphLaunch { stream, .. } = op {
            self.graph_launch(checker, stream);
        }
        let any = self.live > 0;
        let sync = super::super::is_sync(op);
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        let mut updates: Vec<(u32, Participant, Diff, Option<Id>)> = Vec::new();
        {
            let order = checker.order();
            let host = Participant::HOST;
            if let Some((stream, _, _)) = stream_op(op) {
                // Rules 2 and 5, then the op: the new clock of `p` joins its own, the host's,
                // the legacy default stream's edges and, for a wait, the event's capture.
                let found = order.find_stream(stream);
                // A stream used for the first time is created by the op, as the next
                // participant: its clock is what it joins.
                let p = found.unwrap_or(Participant(order.participants() as u32));
                let waited = match op {
                    Op::EventWait { event, .. } => order.capture(event).map(|c| (event, c)),
                    _ => None,
                };
                let mut resolved: Sources<'_> =
                    smallvec::smallvec![(Src::Part(host), order.host_clock())];
                if let Some(q) = found {
                    resolved.push((Src::Part(q), order.clock(q)));
                    resolved.extend(
                        legacy(order, q)
                            .iter()
                            .map(|&b| (Src::Part(b), order.clock(b))),
                    );
                }
                resolved.extend(waited.map(|(e, c)| (Src::Event(e), c)));
                if any {
                    for &(s, _) in &resolved {
                        match s {
                            Src::Part(q) => self.collect_part(q, &mut out),
                            Src::Event(e) => out.extend_from_slice(self.by_event.get(e)),
                            Src::HostBefore(_) => {}
                        }
                    }
                    let recorded = match op {
                        Op::EventRecord { event, .. } => Some(event),
                        _ => None,
                    };
                    if let Some(e) = recorded {
                        // A record replaces the capture: what-ifs with one of their own too.
                        out.extend_from_slice(self.by_event.get(e));
                    }
                    out.sort_unstable();
                    out.dedup();
                    // Where the stream knows the host's clock already (it joined it since the
                    // host's last change), a what-if that differs on the host alone gives it
                    // nothing new: no component of the join can be below the real one.
                    let knows_host = !out.is_empty()
                        && found.is_some_and(|q| order.host_clock().le(order.clock(q)));
                    let mut d = std::mem::take(&mut self.scratch_diff);
                    for &wid in &out {
                        let w = self.w(wid);
                        if knows_host
                            && recorded.is_none()
                            && w.clock(p).is_none()
                            && resolved[1..].iter().all(|&(s, _)| diff_of(w, s).is_none())
                        {
                            continue;
                        }
                        combine_into(w, &resolved, p, &mut d);
                        self.stats.updates += 1;
                        if let Some(e) = recorded {
                            self.set_capture_from(wid, e, &d);
                        }
                        self.set_clock_from(wid, p, &d);
                    }
                    self.scratch_diff = d;
                }
                if matches!(op, Op::EventWait { .. }) {
                    // The wait replaced by nothing: the stream keeps the clock it had.
                    let empty = VectorClock::new();
                    let base = found.map_or(&empty, |q| order.clock(q));
                    let others: smallvec::SmallVec<[&VectorClock; 4]> = resolved
                        .iter()
                        .filter(|&&(s, _)| !matches!(s, Src::Part(q) if Some(q) == found))
                        .map(|&(_, c)| c)
                        .collect();
                    let d = raised(base, &others, p);
                    if !d.is_empty() {
                        pre.removed = Some((p, d));
                    }
                }
            }
            match op {
                Op::Free { buffer, .. }
                    if checker.live_generation(buffer).is_some_and(|g| g.is_pool()) =>
                {
                    // A pool buffer's free is not checked; what its `record_stream` streams
                    // excuse from then on is fixed by their clocks now. A what-if where that
                    // differs is left to a re-check.
                    let gen = checker.live_generation(buffer).expect("a live pool buffer");
                    let mut gone = self.by_buffer.get(buffer).to_vec();
                    for &q in gen.record_streams() {
                        self.collect_part(q, &mut gone);
                    }
                    gone.sort_unstable();
                    gone.dedup();
                    for wid in gone {
                        self.give_up(wid);
                    }
                }
                Op::Free { buffer, stream } => {
                    if let Some(gen) = checker.live_generation(buffer).filter(|g| !g.is_external())
                    {
                        if any {
                            let by = match stream {
                                Some(s) => order.find_stream(s),
                                None if gen.memory == MemoryKind::Device => Some(gen.owner),
                                None => Some(host),
                            };
                            if let Some(by) = by {
                                self.collect_part(by, &mut out);
                            }
                            self.collect_part(host, &mut out);
                            for &q in gen.record_streams() {
                                self.collect_part(q, &mut out);
                            }
                            out.extend_from_slice(self.by_buffer.get(buffer));
                            out.sort_unstable();
                            out.dedup();
                        }
                        if !out.is_empty() {
                            pre.free = Some(FreeData {
                                entries: gen.history.all(),
                                record_streams: gen.record_streams().to_vec(),
                                memory: gen.memory,
                                base: gen.addr(),
                                size: gen.size().unwrap_or(0),
                                owner: gen.owner,
                            });
                        }
                    }
                }
                Op::HostRead { .. } | Op::HostWrite { .. } => {
                    // An access advances the host's own component only: no difference changes.
                    self.collect_part(host, &mut out);
                }
                Op::EventSync { .. }
                | Op::EventQuery { complete: true, .. }
                | Op::StreamSync { .. }
                | Op::StreamQuery { complete: true, .. }
                | Op::DeviceSync { .. } => {
                    // The host joins what it waited for.
                    let mut srcs: Vec<Src<'_>> = vec![Src::Part(host)];
                    match op {
                        Op::EventSync { event } | Op::EventQuery { event, .. }
                            if order.capture(event).is_some() =>
                        {
                            srcs.push(Src::Event(event));
                        }
                        Op::StreamSync { stream } | Op::StreamQuery { stream, .. } => {
                            if let Some(p) = order.find_stream(stream) {
                                srcs.push(Src::Part(p));
                                if p == Order::DEFAULT {
                                    srcs.extend(order.blocking0().iter().map(|&b| Src::Part(b)));
                                }
                            }
                        }
                        Op::DeviceSync { device } => {
                            srcs.extend(streams_of(order, *device).into_iter().map(Src::Part));
                        }
                        _ => {}
                    }
                    if any {
                        match op {
                            Op::DeviceSync { device } => {
                                self.collect_device(order, *device, &mut out)
                            }
                            _ => {
                                for s in &srcs {
                                    match *s {
                                        Src::Part(q) => self.collect_part(q, &mut out),
                                        Src::Event(e) => {
                                            out.extend_from_slice(self.by_event.get(e))
                                        }
                                        Src::HostBefore(_) => {}
                                    }
                                }
                            }
                        }
                        out.sort_unstable();
                        out.dedup();
                        let resolved = sources(order, &srcs);
                        for &wid in &out {
                            let d = combine(self.w(wid), &resolved, host);
                            updates.push((wid, host, d, None));
                        }
                    }
                    // The host sync replaced by nothing: the host keeps the clock it had.
                    let others: Vec<&VectorClock> = srcs[1..]
                        .iter()
                        .filter_map(|s| match *s {
                            Src::Part(q) => Some(order.clock(q)),
                            Src::Event(e) => order.capture(e),
                            Src::HostBefore(_) => None,
                        })
                        .collect();
                    let d = raised(order.host_clock(), &others, host);
                    if !d.is_empty() {
                        pre.removed = Some((host, d));
                    }
                }
                Op::Alloc {
                    addr: Some(_),
                    memory: MemoryKind::Device,
                    ..
                } if any => {
                    // The memory may reappear on another stream: the device synchronizes.
                    pre.host = Some(order.host_clock().clone());
                }
                Op::RecordStream { buffer, stream } => {
                    let q = order.find_stream(stream);
                    pre.rs_adds = checker
                        .live_generation(buffer)
                        .filter(|g| !g.is_external())
                        .is_some_and(|g| {
                            let owner_stream = g.memory == MemoryKind::Device && Some(g.owner) == q;
                            !owner_stream && q.is_none_or(|q| !g.record_streams().contains(&q))
                        });
                    out.extend_from_slice(self.by_buffer.get(buffer));
                }
                Op::EventCreate { event } | Op::EventDestroy { event } => {
                    out.extend_from_slice(self.by_event.get(event));
                }
                _ => {}
            }
            let host_sync = matches!(
                op,
                Op::EventSync { .. }
                    | Op::EventQuery { complete: true, .. }
                    | Op::StreamSync { .. }
                    | Op::StreamQuery { complete: true, .. }
                    | Op::DeviceSync { .. }
                    | Op::Alloc {
                        addr: Some(_),
                        memory: MemoryKind::Device,
                        ..
                    }
            );
            if host_sync && (sync || any) && !self.retaining {
                // From here on the real host may get ahead of a what-if's: keep what the real
                // host's clock covers and a what-if's may not.
                let keep = order.host_clock().clone();
                checker.retain(Some(keep));
                self.retaining = true;
            }
        }
        out.sort_unstable();
        out.dedup();
        self.stats.updates += updates.len() as u64;
        for (wid, p, d, recorded) in updates {
            if let Some(e) = recorded {
                self.set_capture(wid, &e, d.clone());
            }
            self.set_clock(wid, p, d);
        }
        if let Op::EventCreate { event } | Op::EventDestroy { event } = op {
            for &wid in &out {
                self.set_capture(wid, event, Diff::new());
            }
        }
        pre.affected = out;
        pre
    }

    /// A `graph_launch` on `stream`: a what-if whose entry clock of the replay differs (its
    /// host's, the stream's or the legacy default stream's edges into it), or with tombstones of
    /// its own (which the replay's accesses would have to be checked against), is given up: a
    /// re-check decides its op. Every other what-if replays exactly as the real state does (the
    /// replay participants' clocks never differ in a live what-if: only a launch changes them,
    /// and a what-if whose entry clock differs does not outlive it), so it is left as it is.
    pub(super) fn graph_launch(&mut self, checker: &Checker, stream: &Id) {
        if self.live == 0 {
            return;
        }
        let order = checker.order();
        let host = Participant::HOST;
        let found = order.find_stream(stream);
        let target = found.unwrap_or(Participant(order.participants() as u32));
        let mut resolved: Sources<'_> = smallvec::smallvec![(Src::Part(host), order.host_clock())];
        let mut out = Vec::new();
        self.collect_part(host, &mut out);
        if let Some(q) = found {
            resolved.push((Src::Part(q), order.clock(q)));
            self.collect_part(q, &mut out);
            for &b in legacy(order, q) {
                resolved.push((Src::Part(b), order.clock(b)));
                self.collect_part(b, &mut out);
            }
        }
        if self.tombs.count > 0 {
            out.extend((0..self.slab.len() as u32).filter(|&w| {
                self.slab[w as usize]
                    .as_ref()
                    .is_some_and(|w| !w.tombs.is_empty())
            }));
        }
        out.sort_unstable();
        out.dedup();
        let mut d = Diff::new();
        let (gone, same): (Vec<u32>, Vec<u32>) = out.into_iter().partition(|&wid| {
            let w = self.w(wid);
            combine_into(w, &resolved, target, &mut d);
            !d.is_empty() || !w.tombs.is_empty()
        });
        for wid in gone {
            self.give_up(wid);
        }
        // The rest enter the replay with the real entry clock: the stream's clock after it is
        // the real one.
        for wid in same {
            self.set_clock(wid, target, Diff::new());
        }
    }
}
