//! CUDA graphs in a GPU program run: captured ops prepared with their observation slots and
//! delays, and a launch replayed with the scheduler's holds on its replayed ops.

use super::*;

impl Run<'_> {
    pub(super) fn prepare_captured(
        &mut self,
        i: usize,
        s: StreamKey,
        g: usize,
        regions: &[&Region],
        hold: Hold,
    ) -> Result<(), ExecError> {
        if self.graphs.len() <= g {
            self.graphs.resize_with(g + 1, GraphRun::default);
        }
        for f in self.names.fences(regions) {
            if !self.graphs[g].fences.contains(&f) {
                self.graphs[g].fences.push(f);
            }
        }
        if hold == Hold::SyncAfter {
            // A sequential run: the body becomes a chain in body order.
            let lanes = self.names.graphs.graphs[g].lanes.clone();
            for t in lanes.into_iter().filter(|&t| t != s) {
                let e = self
                    .dev
                    .gpu
                    .new_event()
                    .map_err(driver(i, "serializing a capture"))?;
                let (from, to) = (
                    self.dev.stream(t).map_err(|e| unsupported(i, e))?,
                    self.dev.stream(s).map_err(|e| unsupported(i, e))?,
                );
                e.record(from).map_err(driver(i, "serializing a capture"))?;
                to.wait(&e).map_err(driver(i, "serializing a capture"))?;
                self.graphs[g].internal.push(e);
            }
        }
        let d = self.next_delay;
        if d >= self.delay_count {
            return Err(unsupported(i, "ran out of captured delays"));
        }
        self.next_delay += 1;
        self.graphs[g].delays.push((i, d));
        let kernels = self
            .dev
            .gpu
            .kernels()
            .map_err(driver(i, "capturing a delay"))?;
        let stream = self.dev.stream(s).map_err(|e| unsupported(i, e))?;
        // SAFETY: the word lies in the run's delay array, mapped until the run is released
        // (which waits for the device first), so every replay of the graph may read it.
        unsafe { kernels.spin_at(stream, self.delays + 4 * d as u64) }
            .map_err(driver(i, "capturing a delay"))
    }

    /// Moves the observations made since `from` (by captured op `i` of graph `g`) to the graph:
    /// its launches observe them.
    pub(super) fn capture_observations(&mut self, g: usize, i: usize, from: usize) {
        if self.graphs.len() <= g {
            self.graphs.resize_with(g + 1, GraphRun::default);
        }
        for ((_, k), buffer, obs) in self.observed.drain(from..) {
            if let Observed::Slots(slots) = obs {
                self.graphs[g].obs.push((i, k, buffer, slots));
            }
        }
    }

    /// A `graph_launch` of `graph` on `stream` as op `i` (`cuGraphLaunch`), held as the scheduler
    /// says, each replayed op delayed as the scheduler says for its number. Returns whether a
    /// sequential run synchronizes after it.
    pub(super) fn launch_graph(
        &mut self,
        i: usize,
        graph: &Id,
        stream: &Id,
        hold: Hold,
        scheduler: &mut dyn Scheduler,
    ) -> Result<bool, ExecError> {
        let s = self.names.stream(i, stream, &mut self.dev)?;
        if self.names.captured(s).is_some() {
            return Err(unsupported(i, "a graph launched on a capturing stream"));
        }
        let g = self.names.graph_launch(i, graph, &mut self.dev)?;
        if self.graphs.len() <= g {
            self.graphs.resize_with(g + 1, GraphRun::default);
        }
        // The replayed ops' numbers, in body order.
        let mut ids: HashMap<usize, usize> = HashMap::new();
        for b in &self.names.graphs.graphs[g].body {
            ids.insert(b.op, self.next_replayed);
            self.next_replayed += 1;
        }
        let mut sync = hold == Hold::SyncAfter;
        // This launch's delays: (delay, nanoseconds), as the scheduler holds each replayed op.
        let mut delays: Vec<(usize, u32)> = Vec::new();
        for &(captured, d) in &self.graphs[g].delays {
            let id = ids.get(&captured).copied().unwrap_or(captured);
            let ns = match scheduler.hold(id, true) {
                Hold::Spin(ns) => u32::try_from(ns).unwrap_or(u32::MAX),
                Hold::SyncAfter => {
                    sync = true;
                    0
                }
                Hold::None => 0,
            };
            delays.push((d, ns));
        }
        if let Some((t, e)) = self.graphs[g].last {
            if t != s {
                // Launches of one graph are ordered: this one also waits for the copies of the
                // previous launch's observations.
                let stream = self.dev.stream(s).map_err(|x| unsupported(i, x))?;
                if let Some(ev) = self.graphs[g].internal.get(e) {
                    stream
                        .wait(ev)
                        .map_err(driver(i, "ordering launches of one graph"))?;
                }
            }
        }
        let fences = self.graphs[g].fences.clone();
        self.dev
            .wait_fences(s, &fences)
            .map_err(self.names.failed(i, "waiting for a record_stream fence"))?;
        {
            let kernels = self
                .dev
                .gpu
                .kernels()
                .map_err(driver(i, "delaying the launch"))?;
            let stream = self.dev.stream(s).map_err(|e| unsupported(i, e))?;
            // Written by kernels on the launch stream, right before the launch (a copy from the
            // host might make the host wait for the stream).
            for (d, ns) in delays {
                let word = DeviceRegion::new(self.delays + 4 * d as u64, 1);
                // SAFETY: the word lies in the run's delay array, mapped until the run is
                // released, which waits for the device first.
                unsafe { kernels.fill(stream, word, ns) }
                    .map_err(driver(i, "setting a replay's delays"))?;
            }
            if let Hold::Spin(ns) = hold {
                kernels
                    .spin(stream, ns)
                    .map_err(driver(i, "delaying the launch"))?;
            }
        }
        self.dev
            .graph_launch(g as GraphKey, s)
            .map_err(self.names.failed(i, "launching a graph"))?;
        // The replay's observations, copied on the launch stream (after the whole replay) into
        // slots of this launch.
        let obs = self.graphs[g].obs.clone();
        for (captured, k, buffer, scratch) in obs {
            let id = ids.get(&captured).copied().unwrap_or(captured);
            let mut fresh = Vec::with_capacity(scratch.len());
            for from in scratch {
                let to = self.next_slot;
                if to >= self.slot_count {
                    return Err(unsupported(i, "ran out of checksum slots"));
                }
                self.next_slot += 1;
                let span = |slot: usize| Span {
                    memory: MemoryKind::Device,
                    addr: self.slots + 8 * slot as u64,
                    bytes: 8,
                    gen: 0,
                    external: false,
                };
                self.dev
                    .issue(
                        i as u64,
                        ExecOp::Copy {
                            stream: s,
                            src: span(from),
                            dst: span(to),
                            fences: &[],
                        },
                    )
                    .map_err(self.names.failed(i, "copying a replay's observation"))?;
                fresh.push(to);
            }
            self.observe(id, k, &buffer, Observed::Slots(fresh));
        }
        let end = self
            .dev
            .gpu
            .new_event()
            .map_err(driver(i, "marking a launch's end"))?;
        end.record(self.dev.stream(s).map_err(|e| unsupported(i, e))?)
            .map_err(driver(i, "marking a launch's end"))?;
        self.graphs[g].internal.push(end);
        self.graphs[g].last = Some((s, self.graphs[g].internal.len() - 1));
        Ok(sync)
    }
}
