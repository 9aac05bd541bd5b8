//! Running trace programs on the simulated device under a scheduler: [`run`], the sequential
//! [`reference`], and exhaustive exploration of every schedule ([`explore`]).
//!
//! What a run produces is an [`Outcome`]: a digest of every region each op read, a checksum of
//! every buffer live at the end, and the last value each word of every buffer generation received.
//! Two runs of one program agree exactly when no op observed different data.

use smallvec::SmallVec;

use super::device::{Device, Mark, SpanList, Timing, Work};
use crate::exec::backend::{Backend, Fill, Issued, Kernel, Op as ExecOp, Span};
use crate::exec::error::ExecError;
use crate::exec::graphs::{replay_numbering, BodyKind};
use crate::exec::outcome::{Executor, Outcome};
use crate::exec::program::Resolver;
use crate::exec::sched::{
    Actor, Adversarial, RandomScheduler, Ready, Replay, Scheduler, Sequential,
};
use crate::kernels::{fmix, hash_word, memset_word};
use crate::trace::{Op, Region, TraceOp};
use crate::workload::SplitMix;

/// Knobs of a simulated run.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// Words a kernel processes per scheduling step (`u32::MAX`: every op is atomic).
    pub chunk_words: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { chunk_words: 16 }
    }
}

/// The most words the simulator gives one buffer, or placed memory of one kind: larger programs
/// are not simulated (an [`ExecError::Unsupported`] says so).
pub const MAX_WORDS: u64 = 1 << 24;

/// One run of a program.
struct Run<'p> {
    program: &'p [TraceOp],
    device: Device,
    names: Resolver,
    /// The host's next op.
    next: usize,
    /// The number of the next replayed op (see [`crate::exec::ReplayNumbering`]).
    next_replayed: usize,
}

/// Runs `program` under `scheduler`.
pub fn run(
    program: &[TraceOp],
    scheduler: &mut dyn Scheduler,
    cfg: SimConfig,
) -> Result<Outcome, ExecError> {
    let mut r = Run {
        program,
        device: Device::program(cfg.chunk_words),
        names: Resolver::new(None),
        next: 0,
        next_replayed: program.len(),
    };
    debug_assert_eq!(r.device.timing, Timing::Scheduled);
    let mut steps = 0;
    let mut ready = Vec::new();
    loop {
        ready.clear();
        if let Some(op) = r.device.host_op() {
            ready.push(Ready {
                actor: Actor::Host,
                op,
            });
        } else if r.next < program.len() && r.device.host_free() {
            ready.push(Ready {
                actor: Actor::Host,
                op: r.next,
            });
        }
        r.device.ready_streams(&mut ready);
        if ready.is_empty() {
            break;
        }
        let k = scheduler.pick(&ready);
        let pick = ready[k.min(ready.len() - 1)];
        let completed = match pick.actor {
            Actor::Stream(s) => r.device.step_stream(s),
            Actor::Host if r.device.host_op().is_some() => r.device.step_host(),
            Actor::Host => {
                r.device.host_wait.clear();
                let i = r.next;
                r.next += 1;
                match r.issue(i)? {
                    Issued::Queued => None,
                    Issued::Retry => {
                        r.next = i;
                        None
                    }
                    _ => Some(i),
                }
            }
        };
        if let Some(op) = completed {
            scheduler.completed(op);
        }
        steps += 1;
    }
    r.outcome(steps)
}

/// Runs `program` in issue order: the sequential reference. A replay runs where its launch is
/// in the order, its body in body order.
pub fn reference(program: &[TraceOp]) -> Result<Outcome, ExecError> {
    let cfg = SimConfig {
        chunk_words: u32::MAX,
    };
    if !program.iter().any(|t| t.op.is_graph_op()) {
        return run(program, &mut Sequential, cfg);
    }
    let numbering = replay_numbering(program);
    run(
        program,
        &mut InOrder {
            launch_of: |op: usize| numbering.trace_op(op),
        },
        cfg,
    )
}

/// [`Sequential`] for a program with replays: a replayed op is ordered as its launch, then by
/// its number (body order).
struct InOrder<F> {
    launch_of: F,
}

impl<F: Fn(usize) -> usize> Scheduler for InOrder<F> {
    fn pick(&mut self, ready: &[Ready]) -> usize {
        let key = |r: &Ready| ((self.launch_of)(r.op), r.op, r.actor == Actor::Host);
        let mut best = 0;
        for (k, r) in ready.iter().enumerate() {
            if key(r) < key(&ready[best]) {
                best = k;
            }
        }
        best
    }
}

impl Run<'_> {
    /// The host issues op `i`.
    fn issue(&mut self, i: usize) -> Result<Issued, ExecError> {
        let index = i as u64;
        let dev = &mut self.device;
        let names = &mut self.names;
        let op = &self.program[i].op;
        let issued = match op {
            Op::GraphBegin {
                graph,
                stream,
                pool,
            } => {
                names.graph_begin(i, graph, stream, pool.as_ref(), dev)?;
                Issued::Done
            }
            Op::GraphEnd { graph } => {
                names.graph_end(i, graph)?;
                Issued::Done
            }
            Op::GraphLaunch { graph, stream } => {
                let (graph, stream) = (graph.clone(), stream.clone());
                return self.launch_graph(i, &graph, &stream);
            }
            Op::StreamCreate {
                stream,
                device,
                blocking,
            } => {
                names.stream_create(i, stream, *device, *blocking, dev)?;
                Issued::Done
            }
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                addr,
                pool,
            } => {
                if *bytes / 4 > MAX_WORDS {
                    return Err(names.unsupported(
                        i,
                        format!(
                            "buffer {buffer} of {bytes} bytes is too large to simulate (at most {} bytes)",
                            4 * MAX_WORDS
                        ),
                    ));
                }
                if let Some(a) = addr.filter(|_| *bytes > 0) {
                    let base = crate::alloc::space::base(*memory);
                    let inside = a >= base
                        && a.checked_add(*bytes)
                            .is_some_and(|e| (e - base) / 4 <= MAX_WORDS);
                    if !inside {
                        return Err(names.unsupported(
                            i,
                            format!(
                                "{} memory at {a:#x} is outside what the simulator can place ({} bytes from {base:#x})",
                                memory.as_str(),
                                4 * MAX_WORDS
                            ),
                        ));
                    }
                }
                let (gen, addr) = names.alloc(
                    i,
                    buffer,
                    *bytes,
                    stream.as_ref(),
                    *memory,
                    *addr,
                    pool.as_ref(),
                    dev,
                )?;
                dev.track(gen, addr, *bytes);
                Issued::Done
            }
            Op::Free { buffer, stream } => names.free(i, buffer, stream.as_ref(), dev)?,
            Op::RecordStream { buffer, stream } => {
                names.record_stream(i, buffer, stream, dev)?;
                Issued::Done
            }
            Op::Launch {
                stream,
                reads,
                writes,
                ..
            } => {
                let s = names.stream(i, stream, dev)?;
                if let Some(c) = names.captured(s) {
                    names.capture_access(i, c, op)?;
                    return Ok(Issued::Done);
                }
                let r: Vec<Span> = reads
                    .iter()
                    .map(|x| names.span(i, x))
                    .collect::<Result<_, _>>()?;
                let w: Vec<Span> = writes
                    .iter()
                    .map(|x| names.span(i, x))
                    .collect::<Result<_, _>>()?;
                let all: Vec<&Region> = reads.iter().chain(writes).collect();
                let fences = names.fences(&all);
                dev.issue(
                    index,
                    ExecOp::Launch {
                        stream: s,
                        kernel: Kernel::Hash {
                            id: i as u32,
                            spin_ns: 0,
                        },
                        reads: &r,
                        writes: &w,
                        fences: &fences,
                    },
                )
                .map_err(names.failed(i, "launch"))?
            }
            Op::Copy { stream, src, dst } => {
                let s = names.stream(i, stream, dev)?;
                if let Some(c) = names.captured(s) {
                    names.capture_access(i, c, op)?;
                    return Ok(Issued::Done);
                }
                let (a, b) = (names.span(i, src)?, names.span(i, dst)?);
                if a.bytes != b.bytes {
                    return Err(names.unsupported(i, "copy regions of different lengths"));
                }
                let fences = names.fences(&[src, dst]);
                dev.issue(
                    index,
                    ExecOp::Copy {
                        stream: s,
                        src: a,
                        dst: b,
                        fences: &fences,
                    },
                )
                .map_err(names.failed(i, "copy"))?
            }
            Op::Memset { stream, dst } => {
                let s = names.stream(i, stream, dev)?;
                if let Some(c) = names.captured(s) {
                    names.capture_access(i, c, op)?;
                    return Ok(Issued::Done);
                }
                let d = names.span(i, dst)?;
                let fences = names.fences(&[dst]);
                dev.issue(
                    index,
                    ExecOp::Memset {
                        stream: s,
                        dst: d,
                        fill: Fill::Word(memset_word(i as u32)),
                        fences: &fences,
                    },
                )
                .map_err(names.failed(i, "memset"))?
            }
            Op::HostRead { buffer } => {
                let span = names.span(i, buffer)?;
                let fences = names.fences(&[buffer]);
                dev.issue(
                    index,
                    ExecOp::HostRead {
                        span,
                        fences: &fences,
                    },
                )
                .map_err(names.failed(i, "host read"))?
            }
            Op::HostWrite { buffer } => {
                let span = names.span(i, buffer)?;
                let fences = names.fences(&[buffer]);
                let data: Vec<u8> = (0..span.bytes / 4)
                    .flat_map(|k| hash_word(i as u32, 0, k as u32, []).to_le_bytes())
                    .collect();
                dev.issue(
                    index,
                    ExecOp::HostWrite {
                        span,
                        data: &data,
                        fences: &fences,
                    },
                )
                .map_err(names.failed(i, "host write"))?
            }
            Op::EventCreate { event } => {
                let event = names.event(event);
                dev.issue(index, ExecOp::EventCreate { event })?
            }
            Op::EventDestroy { event } => {
                let event = names.event(event);
                dev.issue(index, ExecOp::EventDestroy { event })?
            }
            Op::EventRecord { event, stream } => {
                let stream = names.stream(i, stream, dev)?;
                let event = names.event(event);
                if names.graphs.any_capturing() && names.graphs.record(i, event, stream) {
                    return Ok(Issued::Done);
                }
                dev.issue(index, ExecOp::EventRecord { event, stream })?
            }
            Op::EventWait { stream, event } => {
                let stream = names.stream(i, stream, dev)?;
                let event = names.event(event);
                if names.graphs.any_capturing() && names.graphs.wait(i, stream, event) {
                    return Ok(Issued::Done);
                }
                dev.issue(index, ExecOp::EventWait { stream, event })?
            }
            // A query that returned `true` orders like a sync; one that returned `false` orders
            // nothing.
            Op::EventSync { event }
            | Op::EventQuery {
                event,
                complete: true,
            } => {
                let event = names.event(event);
                dev.issue(index, ExecOp::EventSync { event })?;
                Issued::Done
            }
            Op::EventQuery {
                complete: false, ..
            }
            | Op::StreamQuery {
                complete: false, ..
            } => Issued::Done,
            Op::StreamSync { stream }
            | Op::StreamQuery {
                stream,
                complete: true,
            } => {
                let stream = names.stream(i, stream, dev)?;
                dev.issue(index, ExecOp::StreamSync { stream })?;
                Issued::Done
            }
            Op::DeviceSync { device } => {
                dev.issue(index, ExecOp::DeviceSync { device: *device })?;
                Issued::Done
            }
        };
        Ok(issued)
    }

    /// A `graph_launch` of `graph` on `stream` as op `i`: the body replayed on the graph's
    /// participants, one stream per lane. Each lane's first op of the launch follows everything
    /// issued on the launch stream so far and the whole previous launch; captured records and
    /// waits order the lanes; the launch stream's later work follows every lane.
    fn launch_graph(
        &mut self,
        i: usize,
        graph: &crate::trace::Id,
        stream: &crate::trace::Id,
    ) -> Result<Issued, ExecError> {
        let dev = &mut self.device;
        let names = &mut self.names;
        let s = names.stream(i, stream, dev)?;
        if names.captured(s).is_some() {
            return Err(names.unsupported(i, "a graph launched on a capturing stream"));
        }
        let g = names.graph_launch(i, graph, dev)?;
        let graph = &names.graphs.graphs[g];
        let lanes = &graph.participants;
        // Entry: the launch is an op on its stream (with its legacy default stream edges).
        dev.submit(s, i, Work::Marker, SmallVec::new(), false);
        let mut entry: SmallVec<[Mark; 2]> = SmallVec::new();
        entry.push(dev.last(s));
        entry.extend(lanes.iter().map(|&p| dev.last(p)));
        let mut started = vec![false; lanes.len()];
        let mut slots: Vec<Option<Mark>> = vec![None; graph.slots];
        for b in &graph.body {
            let lane = lanes[b.lane];
            let mut deps: SmallVec<[Mark; 2]> = SmallVec::new();
            if !std::mem::replace(&mut started[b.lane], true) {
                deps.extend(entry.iter().copied());
            }
            let work = match &b.kind {
                BodyKind::Launch {
                    reads,
                    writes,
                    fences,
                } => {
                    deps.extend(Device::marks(fences));
                    let words = reads
                        .iter()
                        .chain(writes)
                        .map(|x| u32::try_from(x.words()).unwrap_or(u32::MAX))
                        .max()
                        .unwrap_or(0);
                    Work::Launch {
                        id: b.op as u32,
                        reads: reads.iter().copied().collect::<SpanList>(),
                        writes: writes.iter().copied().collect::<SpanList>(),
                        words,
                    }
                }
                BodyKind::Copy { src, dst, fences } => {
                    deps.extend(Device::marks(fences));
                    Work::Copy {
                        src: *src,
                        dst: *dst,
                    }
                }
                BodyKind::Memset { dst, fences } => {
                    deps.extend(Device::marks(fences));
                    Work::Memset {
                        dst: *dst,
                        value: memset_word(b.op as u32),
                    }
                }
                BodyKind::Record(_) => Work::Marker,
                BodyKind::Wait(slot) => {
                    if let Some(m) = slot.and_then(|k| slots.get(k).copied().flatten()) {
                        deps.push(m);
                    }
                    Work::Marker
                }
            };
            let id = self.next_replayed;
            self.next_replayed += 1;
            dev.submit(lane, id, work, deps, false);
            if let BodyKind::Record(k) = b.kind {
                if let Some(x) = slots.get_mut(k) {
                    *x = Some(dev.last(lane));
                }
            }
        }
        // Exit: later work on the launch stream waits for the whole replay.
        let exit: SmallVec<[Mark; 2]> = lanes.iter().map(|&p| dev.last(p)).collect();
        Ok(dev.submit(s, i, Work::Marker, exit, false))
    }

    /// What the run observed, once nothing can move.
    fn outcome(mut self, steps: usize) -> Result<Outcome, ExecError> {
        let mut outcome = Outcome {
            steps,
            ..Outcome::default()
        };
        let gens = self.names.generations();
        let obs = self.device.observer.take().unwrap_or_default();
        for ((op, k), (gen, digest)) in obs.reads {
            if let Some((_, name)) = gens.get(gen as usize) {
                outcome.reads.insert((op, k), (name.clone(), digest));
            }
        }
        // Every buffer live at the end: its checksum.
        let live: Vec<(crate::trace::Id, Span)> = self
            .names
            .live()
            .into_iter()
            .map(|(id, b)| (id.clone(), b.span()))
            .collect();
        for (name, s) in live {
            let mut sum = 0u64;
            let arena = self.device.arena(s.memory);
            for i in 0..(s.bytes / 4) {
                let w = arena.read_word(s.addr + 4 * i, Some(s.gen));
                sum = sum.wrapping_add(u64::from(fmix(w ^ i as u32)));
            }
            outcome.live.insert(name, sum);
        }
        outcome.uninitialized = self.device.device.memory().uninitialized
            + self.device.pinned.memory().uninitialized
            + self.device.managed.memory().uninitialized;
        for (gen, (_, words)) in obs.gens.iter().enumerate() {
            let Some((op, name)) = gens.get(gen) else {
                continue;
            };
            let sum = words.iter().enumerate().fold(0u64, |acc, (k, w)| {
                acc.wrapping_add(w.map_or(0x5a5a, |v| u64::from(fmix(v ^ k as u32))))
            });
            outcome.written.insert(*op, (name.clone(), sum));
        }
        Ok(outcome)
    }
}

/// What an exhaustive exploration saw.
#[derive(Clone, Debug, Default)]
pub struct Exploration {
    /// Complete schedules run.
    pub schedules: usize,
    /// Whether every schedule was explored (false when `limit` cut the search).
    pub complete: bool,
    /// Outcomes that differ from the first schedule's, with the choices that produced them.
    pub divergent: Vec<(Vec<usize>, Outcome)>,
}

/// Runs every schedule of `program` (depth first, up to `limit` schedules) and collects the
/// outcomes that differ from the sequential reference.
pub fn explore(
    program: &[TraceOp],
    cfg: SimConfig,
    limit: usize,
) -> Result<Exploration, ExecError> {
    let reference = reference(program)?;
    let mut ex = Exploration::default();
    let mut prefix: Vec<usize> = Vec::new();
    loop {
        let mut replay = Replay {
            prefix: prefix.clone(),
            trail: Vec::new(),
        };
        let outcome = run(program, &mut replay, cfg)?;
        ex.schedules += 1;
        if outcome.reads != reference.reads || outcome.live != reference.live {
            ex.divergent
                .push((replay.trail.iter().map(|t| t.0).collect(), outcome));
        }
        // Next schedule: bump the deepest choice that has an untried alternative.
        let mut trail = replay.trail;
        while let Some(&(c, n)) = trail.last() {
            if c + 1 < n {
                break;
            }
            trail.pop();
        }
        match trail.last_mut() {
            None => {
                ex.complete = true;
                return Ok(ex);
            }
            Some(last) => last.0 += 1,
        }
        prefix = trail.iter().map(|t| t.0).collect();
        if ex.schedules >= limit {
            return Ok(ex);
        }
    }
}

/// The simulated device as a program runner: [`Device`] plus a scheduler per run.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimExecutor {
    /// Chunking of kernels.
    pub config: SimConfig,
}

impl Executor for SimExecutor {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn holds_replayed_ops(&self) -> bool {
        true
    }
    fn reference(&mut self, program: &[TraceOp]) -> Result<Outcome, ExecError> {
        reference(program)
    }
    fn random(&mut self, program: &[TraceOp], seed: u64) -> Result<Outcome, ExecError> {
        run(
            program,
            &mut RandomScheduler(SplitMix::new(seed)),
            self.config,
        )
    }
    fn provoke(
        &mut self,
        program: &[TraceOp],
        holds: &[(usize, usize)],
        seed: u64,
    ) -> Result<Outcome, ExecError> {
        run(
            program,
            &mut Adversarial::new(holds.to_vec(), seed),
            self.config,
        )
    }
}
