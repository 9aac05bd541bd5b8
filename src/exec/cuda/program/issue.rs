//! The host issues one op of a GPU program run: the driver call it names, on the stream it
//! names, with its observations.

use super::*;

impl Run<'_> {
    /// The host issues op `i`.
    pub(super) fn issue(&mut self, i: usize, hold: Hold) -> Result<(), ExecError> {
        let index = i as u64;
        let program = self.program;
        match &program[i].op {
            Op::GraphBegin {
                graph,
                stream,
                pool,
            } => {
                self.names
                    .graph_begin(i, graph, stream, pool.as_ref(), &mut self.dev)?;
                let s = self.names.stream(i, stream, &mut self.dev)?;
                self.dev
                    .graph_begin(s)
                    .map_err(self.names.failed(i, "beginning a capture"))?;
            }
            Op::GraphEnd { graph } => {
                let g = self.names.graphs.by_name(graph).ok_or_else(|| {
                    unsupported(i, format!("graph {graph} is not being captured"))
                })?;
                let origin = self.names.graphs.graphs[g].lanes[0];
                self.names.graph_end(i, graph)?;
                self.dev
                    .graph_end(g as GraphKey, origin)
                    .map_err(self.names.failed(i, "ending a capture"))?;
                // Events recorded in the capture count as never recorded from now on.
                let events = self
                    .graphs
                    .get(g)
                    .map(|r| r.events.clone())
                    .unwrap_or_default();
                for event in events {
                    self.dev
                        .issue(index, ExecOp::EventCreate { event })
                        .map_err(self.names.failed(i, "renewing a captured event"))?;
                }
            }
            Op::GraphLaunch { .. } => {
                return Err(unsupported(i, "a graph launch outside the run's loop"));
            }
            Op::StreamCreate {
                stream,
                device,
                blocking,
            } => {
                self.names
                    .stream_create(i, stream, *device, *blocking, &mut self.dev)?;
            }
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                addr,
                pool,
            } => {
                if bytes % 4 != 0 {
                    return Err(unsupported(
                        i,
                        format!("buffer {buffer} of {bytes} bytes is not whole 4-byte words"),
                    ));
                }
                self.names.alloc(
                    i,
                    buffer,
                    *bytes,
                    stream.as_ref(),
                    *memory,
                    *addr,
                    pool.as_ref(),
                    &mut self.dev,
                )?;
            }
            Op::Free { buffer, stream } => {
                self.observe_free(i, buffer, stream.as_ref())?;
                self.names.free(i, buffer, stream.as_ref(), &mut self.dev)?;
            }
            Op::RecordStream { buffer, stream } => {
                self.names.record_stream(i, buffer, stream, &mut self.dev)?;
            }
            Op::Launch {
                stream,
                reads,
                writes,
                ..
            } => {
                let s = self.names.stream(i, stream, &mut self.dev)?;
                let captured = self.names.captured(s);
                let from = self.observed.len();
                let r: Vec<(Id, Span)> = reads
                    .iter()
                    .map(|x| Ok((x.buffer.clone(), self.names.span(i, x)?)))
                    .collect::<Result<_, ExecError>>()?;
                let w: Vec<(Id, Span)> = writes
                    .iter()
                    .map(|x| Ok((x.buffer.clone(), self.names.span(i, x)?)))
                    .collect::<Result<_, ExecError>>()?;
                let all: Vec<&Region> = reads.iter().chain(writes).collect();
                self.prepare(i, s, &all, hold)?;
                let before: Vec<usize> = r
                    .iter()
                    .map(|(_, x)| self.checksum_slot(i, s, x))
                    .collect::<Result<_, _>>()?;
                // The kernel hashes at most MAX_READS read regions into its writes; every read
                // region is observed all the same.
                let rs: Vec<Span> = r.iter().take(MAX_READS).map(|x| x.1).collect();
                let ws: Vec<Span> = w.iter().map(|x| x.1).collect();
                self.dev
                    .issue(
                        index,
                        ExecOp::Launch {
                            stream: s,
                            kernel: Kernel::Hash {
                                id: u32::try_from(i)
                                    .map_err(|_| unsupported(i, "op index too large"))?,
                                spin_ns: 0,
                            },
                            reads: &rs,
                            writes: &ws,
                            fences: &[],
                        },
                    )
                    .map_err(self.names.failed(i, "launching hash_launch"))?;
                for (k, ((name, x), pre)) in r.iter().zip(before).enumerate() {
                    let post = self.checksum_slot(i, s, x)?;
                    self.observe(i, k, name, Observed::Slots(vec![pre, post]));
                }
                for (j, (name, x)) in w.iter().enumerate() {
                    let slot = self.checksum_slot(i, s, x)?;
                    self.observe(i, WRITE_KEY + j, name, Observed::Slots(vec![slot]));
                }
                if let Some(c) = captured {
                    self.names.capture_access(i, c, &program[i].op)?;
                    self.capture_observations(c.graph, i, from);
                }
            }
            Op::Copy { stream, src, dst } => {
                let s = self.names.stream(i, stream, &mut self.dev)?;
                let captured = self.names.captured(s);
                let from = self.observed.len();
                let (a, b) = (self.names.span(i, src)?, self.names.span(i, dst)?);
                if a.bytes != b.bytes {
                    return Err(unsupported(i, "copy regions of different lengths"));
                }
                if a.addr < b.end() && b.addr < a.end() {
                    return Err(unsupported(i, "overlapping copy regions"));
                }
                self.prepare(i, s, &[src, dst], hold)?;
                let pre = self.checksum_slot(i, s, &a)?;
                self.dev
                    .issue(
                        index,
                        ExecOp::Copy {
                            stream: s,
                            src: a,
                            dst: b,
                            fences: &[],
                        },
                    )
                    .map_err(self.names.failed(i, "enqueuing a copy"))?;
                let post = self.checksum_slot(i, s, &a)?;
                let out = self.checksum_slot(i, s, &b)?;
                self.observe(i, 0, &src.buffer, Observed::Slots(vec![pre, post]));
                self.observe(i, WRITE_KEY, &dst.buffer, Observed::Slots(vec![out]));
                if let Some(c) = captured {
                    self.names.capture_access(i, c, &program[i].op)?;
                    self.capture_observations(c.graph, i, from);
                }
            }
            Op::Memset { stream, dst } => {
                let s = self.names.stream(i, stream, &mut self.dev)?;
                let captured = self.names.captured(s);
                let from = self.observed.len();
                let d = self.names.span(i, dst)?;
                self.prepare(i, s, &[dst], hold)?;
                let op_id = u32::try_from(i).map_err(|_| unsupported(i, "op index too large"))?;
                self.dev
                    .issue(
                        index,
                        ExecOp::Memset {
                            stream: s,
                            dst: d,
                            fill: Fill::Word(memset_word(op_id)),
                            fences: &[],
                        },
                    )
                    .map_err(self.names.failed(i, "enqueuing a memset"))?;
                let out = self.checksum_slot(i, s, &d)?;
                self.observe(i, WRITE_KEY, &dst.buffer, Observed::Slots(vec![out]));
                if let Some(c) = captured {
                    self.names.capture_access(i, c, &program[i].op)?;
                    self.capture_observations(c.graph, i, from);
                }
            }
            Op::HostRead { buffer } => {
                let span = self.names.span(i, buffer)?;
                if span.memory == MemoryKind::Device {
                    return Err(unsupported(i, "a host read of device memory"));
                }
                let fences = self.names.fences(&[buffer]);
                let issued = self
                    .dev
                    .issue(
                        index,
                        ExecOp::HostRead {
                            span,
                            fences: &fences,
                        },
                    )
                    .map_err(self.names.failed(i, "a host read"))?;
                if let Issued::Bytes(bytes) = issued {
                    let v = checksum(&words_of(&bytes));
                    self.observe(i, 0, &buffer.buffer, Observed::Value(v));
                }
            }
            Op::HostWrite { buffer } => {
                let span = self.names.span(i, buffer)?;
                if span.memory == MemoryKind::Device {
                    return Err(unsupported(i, "a host write of device memory"));
                }
                let fences = self.names.fences(&[buffer]);
                let op_id = u32::try_from(i).map_err(|_| unsupported(i, "op index too large"))?;
                let data: Vec<u8> = (0..(span.bytes / 4) as u32)
                    .flat_map(|k| hash_word(op_id, 0, k, []).to_le_bytes())
                    .collect();
                self.dev
                    .issue(
                        index,
                        ExecOp::HostWrite {
                            span,
                            data: &data,
                            fences: &fences,
                        },
                    )
                    .map_err(self.names.failed(i, "a host write"))?;
            }
            Op::EventCreate { event } => {
                let event = self.names.event(event);
                self.dev
                    .issue(index, ExecOp::EventCreate { event })
                    .map_err(self.names.failed(i, "creating an event"))?;
            }
            Op::EventDestroy { event } => {
                let event = self.names.event(event);
                self.dev
                    .issue(index, ExecOp::EventDestroy { event })
                    .map_err(self.names.failed(i, "destroying an event"))?;
            }
            Op::EventRecord { event, stream } => {
                let stream = self.names.stream(i, stream, &mut self.dev)?;
                let event = self.names.event(event);
                if self.names.graphs.any_capturing() && self.names.graphs.record(i, event, stream) {
                    // Captured (the driver records it into the graph): renewed at the end.
                    if let Some(c) = self.names.captured(stream) {
                        if self.graphs.len() <= c.graph {
                            self.graphs.resize_with(c.graph + 1, GraphRun::default);
                        }
                        self.graphs[c.graph].events.push(event);
                    }
                }
                self.dev
                    .issue(index, ExecOp::EventRecord { event, stream })
                    .map_err(self.names.failed(i, "recording an event"))?;
            }
            Op::EventWait { stream, event } => {
                let stream = self.names.stream(i, stream, &mut self.dev)?;
                let event = self.names.event(event);
                if self.names.graphs.any_capturing() && self.names.graphs.wait(i, stream, event) {
                    // Captured, or joining a capture: the driver takes a wait on an event of the
                    // capture; one on an event never recorded in it has no effect and is not
                    // issued (a capturing stream cannot wait on an event from outside).
                    let of_capture = self.names.captured(stream).is_some_and(|c| {
                        matches!(
                            self.names.graphs.graphs[c.graph].body.last(),
                            Some(b) if matches!(b.kind, BodyKind::Wait(Some(_)))
                        )
                    });
                    if !of_capture {
                        return Ok(());
                    }
                }
                self.dev
                    .issue(index, ExecOp::EventWait { stream, event })
                    .map_err(self.names.failed(i, "waiting on an event"))?;
            }
            // A query that returned `true` orders like a sync; one that returned `false` orders
            // nothing.
            Op::EventSync { event }
            | Op::EventQuery {
                event,
                complete: true,
            } => {
                let event = self.names.event(event);
                self.dev
                    .issue(index, ExecOp::EventSync { event })
                    .map_err(self.names.failed(i, "synchronizing an event"))?;
            }
            Op::EventQuery {
                complete: false, ..
            }
            | Op::StreamQuery {
                complete: false, ..
            } => {}
            Op::StreamSync { stream }
            | Op::StreamQuery {
                stream,
                complete: true,
            } => {
                let stream = self.names.stream(i, stream, &mut self.dev)?;
                self.dev
                    .issue(index, ExecOp::StreamSync { stream })
                    .map_err(self.names.failed(i, "synchronizing a stream"))?;
            }
            Op::DeviceSync { device } => {
                self.dev
                    .issue(index, ExecOp::DeviceSync { device: *device })
                    .map_err(self.names.failed(i, "synchronizing the device"))?;
            }
        }
        Ok(())
    }

    /// A free's view of the freed buffer's final contents, seen by the freeing participant at the
    /// free: what its program left there (a write the free is not ordered after is an unsafe
    /// free). Not where the observation itself would need or add ordering: with record_stream
    /// (the free is ordered after the recorded streams, the freeing stream is not), with fences of
    /// earlier owners, or on the legacy stream (whose implicit edges would order blocking streams
    /// that the program leaves unordered).
    pub(super) fn observe_free(
        &mut self,
        i: usize,
        buffer: &Id,
        stream: Option<&Id>,
    ) -> Result<(), ExecError> {
        if self.names.recorded(buffer) {
            return Ok(());
        }
        // A pool buffer's memory stays with its pool (its graph's replays keep using it), and a
        // capturing stream runs nothing now: nothing to observe.
        let Some(b) = self
            .names
            .buffer(buffer)
            .filter(|b| b.fences.is_empty() && b.pool.is_none())
            .filter(|b| self.names.captured(b.owner).is_none())
            .cloned()
        else {
            return Ok(());
        };
        if b.size == 0 || b.size % 4 != 0 {
            return Ok(());
        }
        let sp = self.names.span(i, &Region::whole(buffer.clone()))?;
        if b.memory == MemoryKind::Device {
            let s = match stream {
                Some(s) => self.names.stream(i, s, &mut self.dev)?,
                None => b.owner,
            };
            if s != 0 {
                let out = self.checksum_slot(i, s, &sp)?;
                self.observe(i, FREE_KEY, buffer, Observed::Slots(vec![out]));
            }
        } else if stream.is_none() {
            let bytes = self.dev.host_read(&sp).map_err(|e| unsupported(i, e))?;
            let v = checksum(&words_of(&bytes));
            self.observe(i, FREE_KEY, buffer, Observed::Value(v));
        }
        Ok(())
    }
}
