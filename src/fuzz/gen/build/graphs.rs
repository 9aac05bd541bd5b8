//! The builder's CUDA graph steps: captures with forks and joins, pool temporaries (private or
//! shared), temporaries freed inside a capture with or without `record_stream`, and launches on
//! several streams.

use super::super::model::{add_need, graph_name, lane_participant, BodyOp, GRAPHS, LANES};
use super::*;

impl<D: Decisions> Builder<D> {
    /// Whether graph `g` can be launched: its capture ended and every buffer its body names that
    /// is not a pool buffer is live (a launch after such a free would use freed memory).
    pub(super) fn launchable(&self, g: usize) -> bool {
        self.model.graphs[g].as_ref().is_some_and(|graph| {
            graph.ended
                && graph.body.iter().all(|b| match b {
                    BodyOp::Access(_, touches) => touches.iter().all(|t| {
                        let buf = &self.model.bufs[t.buf];
                        buf.live || buf.pool.is_some()
                    }),
                    _ => true,
                })
        })
    }

    /// A graph step: capture a new graph, or launch one.
    pub(super) fn step_graph(&mut self) {
        let launchable: Vec<usize> = (0..GRAPHS).filter(|&g| self.launchable(g)).collect();
        let fresh = (0..GRAPHS).find(|&g| self.model.graphs[g].is_none());
        match fresh {
            Some(g) if launchable.is_empty() || self.chance(0.2) => self.capture(g),
            _ if !launchable.is_empty() => {
                let g = self.pick(&launchable);
                self.launch_graph(g);
            }
            _ => self.step_sync(),
        }
    }

    /// A captured access by stream `p` to buffers among `bufs`: a kernel writing one region (and
    /// perhaps reading another, and often its own output: a step of an iteration, so that each
    /// replay writes new values) or a memset. Returns the buffers it touched.
    pub(super) fn body_access(&mut self, p: usize, bufs: &[usize]) -> Vec<usize> {
        let w = self.pick(bufs);
        let dst = self.span(w);
        if self.chance(0.1) {
            self.emit(Op::Memset {
                stream: stream_name(p),
                dst: self.region(dst),
            });
            return vec![w];
        }
        let mut reads = Vec::new();
        let mut touched = vec![w];
        if self.chance(0.6) {
            reads.push(self.region(dst));
        }
        if self.chance(0.7) {
            let r = self.pick(bufs);
            let src = self.span(r);
            if !src.overlaps(&dst) {
                reads.push(self.region(src));
                touched.push(r);
            }
        }
        self.emit(Op::Launch {
            stream: stream_name(p),
            name: None,
            reads,
            writes: vec![self.region(dst)],
        });
        touched
    }

    /// Captures graph `g`: on an origin stream, accesses to live device buffers (its static
    /// inputs and outputs) and perhaps to a temporary from the graph's pool (private, or `p0`
    /// shared by both graphs); perhaps a fork to a second stream joined back before the end,
    /// with accesses in the fork window on both (disjoint unless a coin leaves the race in); the
    /// temporary perhaps freed inside the capture, with or without `record_stream` for the
    /// forked stream, and a second temporary allocated after it.
    pub(super) fn capture(&mut self, g: usize) {
        let s_streams: Vec<usize> = (0..self.cfg.streams as usize)
            .map(|i| FIRST_S + i)
            .collect();
        let origin = self.pick(&s_streams);
        let others: Vec<usize> = s_streams.iter().copied().filter(|&p| p != origin).collect();
        let side = (!others.is_empty() && self.chance(0.6)).then(|| self.pick(&others));
        self.create(origin);
        if let Some(q) = side {
            self.create(q);
        }
        let shared = self.chance(0.5);
        self.emit(Op::GraphBegin {
            graph: graph_name(g),
            stream: stream_name(origin),
            pool: shared.then(|| "p0".into()),
        });
        let mut bufs = self.live_bufs(MemoryKind::Device);
        // A temporary from the pool, written whole first.
        let slots = self.free_slots();
        let tmp = if !slots.is_empty() && self.chance(0.6) {
            let slot = self.pick(&slots);
            let words = self.pick_words();
            self.emit(Op::Alloc {
                buffer: buffer_name(slot),
                bytes: words * 4,
                stream: Some(stream_name(origin)),
                memory: MemoryKind::Device,
                addr: None,
                pool: None,
            });
            self.emit(Op::Memset {
                stream: stream_name(origin),
                dst: Region::whole(buffer_name(slot)),
            });
            let b = self.model.slots[slot];
            bufs.extend(b);
            b.map(|b| (b, slot, words))
        } else {
            None
        };
        if bufs.is_empty() {
            self.emit(Op::GraphEnd {
                graph: graph_name(g),
            });
            return;
        }
        for _ in 0..1 + self.below(2) {
            self.body_access(origin, &bufs);
        }
        if let Some(q) = side {
            let e = self.record(origin);
            self.emit(Op::EventWait {
                stream: stream_name(q),
                event: event_name(e),
            });
            let mut side_bufs: Vec<usize> = Vec::new();
            for _ in 0..1 + self.below(2) {
                side_bufs.extend(self.body_access(q, &bufs));
            }
            // The fork window: the origin works on other buffers (or, by a coin, on any).
            let racy = self.chance(self.cfg.missing_sync);
            let window: Vec<usize> = bufs
                .iter()
                .copied()
                .filter(|b| racy || !side_bufs.contains(b))
                .collect();
            if !window.is_empty() && self.chance(0.5) {
                self.body_access(origin, &window);
            }
            // The temporary freed inside the capture, in the window: without record_stream for
            // the forked stream, its block can go to the next temporary while the fork uses it.
            if let Some((t, slot, words)) = tmp.filter(|_| self.chance(0.5)) {
                if side_bufs.contains(&t) && !self.chance(self.cfg.missing_sync) {
                    self.emit(Op::RecordStream {
                        buffer: buffer_name(slot),
                        stream: stream_name(q),
                    });
                }
                self.emit(Op::Free {
                    buffer: buffer_name(slot),
                    stream: None,
                });
                if self.chance(0.7) {
                    self.emit(Op::Alloc {
                        buffer: buffer_name(slot),
                        bytes: words * 4,
                        stream: Some(stream_name(origin)),
                        memory: MemoryKind::Device,
                        addr: None,
                        pool: None,
                    });
                    self.emit(Op::Memset {
                        stream: stream_name(origin),
                        dst: Region::whole(buffer_name(slot)),
                    });
                }
            }
            let e = self.record(q);
            self.emit(Op::EventWait {
                stream: stream_name(origin),
                event: event_name(e),
            });
            if self.chance(0.5) {
                let live = self.live_bufs(MemoryKind::Device);
                if !live.is_empty() {
                    self.body_access(origin, &live);
                }
            }
        } else if let Some((_, slot, _)) = tmp.filter(|_| self.chance(0.4)) {
            self.emit(Op::Free {
                buffer: buffer_name(slot),
                stream: None,
            });
        }
        self.emit(Op::GraphEnd {
            graph: graph_name(g),
        });
    }

    /// Launches graph `g` on a stream, after the synchronization its replay's accesses need
    /// with work outside the graph (unless a coin leaves it out).
    pub(super) fn launch_graph(&mut self, g: usize) {
        let streams: Vec<usize> = self
            .streams
            .iter()
            .copied()
            .filter(|&p| p != DEFAULT_P)
            .collect();
        let s = self.pick(&streams);
        self.create(s);
        let lanes: Vec<usize> = (0..LANES).map(|c| lane_participant(g, c)).collect();
        let mut needs: Vec<Need> = Vec::new();
        let mut m = self.model.clone();
        m.launch(g, s, |m, p, touches| {
            m.conflicts(p, touches, |from, t, _, sloppy| {
                if !lanes.contains(&from) {
                    add_need(&mut needs, from, t, sloppy);
                }
            })
        });
        for need in needs {
            self.sync(s, need, None);
        }
        self.emit(Op::GraphLaunch {
            graph: graph_name(g),
            stream: stream_name(s),
        });
    }
}
