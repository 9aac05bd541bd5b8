//! CUDA graphs in the oracle, from the trace format's "CUDA graphs" section alone.
//!
//! A capture records its ops (no node, no edge: they do not run). Each `graph_launch` unrolls
//! the body into nodes of its own: an *entry* after the launch op (and after the previous
//! launch's exit of the same graph: launches of one graph are ordered), one node per captured
//! op with an edge from the entry and from the previous captured op of its stream, an edge from
//! a captured record to each captured wait of it, and an *exit* after all of them, which the
//! launch stream's later ops follow. A captured access is an access by the participant `G/c` at
//! its node, reported at the launch.

use std::collections::{HashMap, HashSet};

use super::{Access, Builder, SharedSpace};
use crate::alloc::{Block, DeviceCachingAllocator, StreamKey};
use crate::report::HazardKind;
use crate::trace::{Id, Op, Region, DEFAULT_STREAM};

/// Every graph and pool of the trace, and what is capturing now.
#[derive(Default)]
pub(super) struct State {
    graphs: HashMap<String, Graph>,
    /// Capturing streams → the graph they capture into.
    capturing: HashMap<String, String>,
    /// Events whose latest record was captured (in a capture underway) → graph, body index.
    events: HashMap<String, (String, usize)>,
    pools: HashMap<String, Pool>,
}

struct Graph {
    ended: bool,
    origin: String,
    pool: String,
    body: Vec<Body>,
    /// The exit node of the latest launch.
    last_exit: Option<usize>,
}

struct Body {
    op: usize,
    stream: String,
    kind: BodyKind,
}

enum BodyKind {
    /// (buffer, start, end, writes) of each region.
    Access(Vec<(usize, u64, Option<u64>, bool)>),
    Record,
    /// The body index of the captured record waited for (`None`: never recorded).
    Wait(Option<usize>),
}

struct Pool {
    alloc: DeviceCachingAllocator<SharedSpace>,
    capturing: usize,
    held: Vec<(u64, StreamKey)>,
}


/// A captured region: the buffer's index, the region's offset, its end (`None`: no end known, an
/// external buffer of unknown size) and whether it is written.
type CapturedRegion = (usize, u64, Option<u64>, bool);

impl Builder {
    fn capturing(&self, stream: &str) -> Option<String> {
        self.g.capturing.get(stream).cloned()
    }

    fn is_blocking0(&self, stream: &str) -> bool {
        self.streams
            .get(stream)
            .is_some_and(|s| s.blocking && s.device == 0 && stream != DEFAULT_STREAM)
    }

    /// The pool a device allocation owned by `owner` comes from, if `owner` is capturing.
    pub(super) fn capture_pool(&self, owner: &str) -> Option<String> {
        let g = self.g.capturing.get(owner)?;
        Some(self.g.graphs[g].pool.clone())
    }

    /// With `addr`: a graph pool keeps the bytes of its buffers, freed or not, until another
    /// pool or a plain allocation takes them (they went back to the driver); a device allocation
    /// of `[a, end)` from `pool` (or from none) takes them from every other pool. Returns whether
    /// any pool gave bytes up.
    pub(super) fn release_pool_bytes(&mut self, a: u64, end: u64, pool: Option<&str>) -> bool {
        let mut any = false;
        for b in &mut self.buffers {
            if b.pool.is_none() || b.pool.as_deref() == pool {
                continue;
            }
            let Some(s) = b.addr else { continue };
            let e = s + b.size.unwrap_or(0);
            let (lo, hi) = (s.max(a), e.min(end));
            if lo >= hi {
                continue;
            }
            // What of [lo, hi) this buffer's pool still held.
            let mut held = vec![(lo, hi)];
            for &(r0, r1) in &b.released {
                held = held
                    .into_iter()
                    .flat_map(|(h0, h1)| {
                        let mut rest = Vec::new();
                        if h0 < r0.min(h1) {
                            rest.push((h0, r0.min(h1)));
                        }
                        if r1.max(h0) < h1 {
                            rest.push((r1.max(h0), h1));
                        }
                        rest
                    })
                    .collect();
            }
            if !held.is_empty() {
                any = true;
                b.released.push((lo, hi));
            }
        }
        any
    }

    /// Makes the pool named `name` (empty) if it does not exist yet.
    pub(super) fn named_pool(&mut self, name: &str) {
        let space = self.space.clone();
        self.g.pools.entry(name.to_owned()).or_insert_with(|| Pool {
            alloc: DeviceCachingAllocator::new(space),
            capturing: 0,
            held: Vec::new(),
        });
    }

    pub(super) fn pool_allocate(
        &mut self,
        pool: &str,
        bytes: u64,
        key: StreamKey,
    ) -> Result<Option<Block>, String> {
        let p = self.g.pools.get_mut(pool).ok_or("no such pool")?;
        p.alloc.allocate(bytes, key).map_err(|e| e.to_string())
    }

    /// A pool buffer's block goes back to its pool — after the pool's captures, if it had
    /// `record_stream` streams and a capture of the pool is underway.
    pub(super) fn pool_free(
        &mut self,
        pool: &str,
        addr: u64,
        key: StreamKey,
        held: bool,
    ) -> Result<(), String> {
        let p = self.g.pools.get_mut(pool).ok_or("no such pool")?;
        if held && p.capturing > 0 {
            p.held.push((addr, key));
            return Ok(());
        }
        p.alloc.free(addr, key).map_err(|e| e.to_string())
    }

    /// What a capture underway changes about op `i`: `Ok(true)` when the op is captured.
    pub(super) fn capture_op(&mut self, i: usize, op: &Op) -> Result<bool, String> {
        if self.g.capturing.is_empty() {
            return Ok(false);
        }
        let blocking = self.g.capturing.keys().any(|s| self.is_blocking0(s));
        if blocking && op.on_stream().is_some_and(|s| s.as_str() == DEFAULT_STREAM) {
            return Err("an op on the legacy default stream while a blocking stream captures".into());
        }
        match op {
            Op::Launch {
                stream,
                reads,
                writes,
                ..
            } => {
                if let Some(g) = self.capturing(stream.as_str()) {
                    let mut regions = Vec::new();
                    for r in reads {
                        regions.extend(self.captured_region(r, false)?);
                    }
                    for r in writes {
                        regions.extend(self.captured_region(r, true)?);
                    }
                    self.add_body(&g, i, stream, BodyKind::Access(regions));
                    return Ok(true);
                }
            }
            Op::Copy { stream, src, dst } => {
                if let Some(g) = self.capturing(stream.as_str()) {
                    let s = self.captured_region(src, false)?;
                    let d = self.captured_region(dst, true)?;
                    if let (Some(s), Some(d)) = (s, d) {
                        if s.0 == d.0 && s.2 != Some(s.1) && d.2 != Some(d.1)
                            && super::overlaps(s.1, s.2, d.1, d.2)
                        {
                            return Err("copy source and destination overlap".into());
                        }
                    }
                    let regions = s.into_iter().chain(d).collect();
                    self.add_body(&g, i, stream, BodyKind::Access(regions));
                    return Ok(true);
                }
            }
            Op::Memset { stream, dst } => {
                if let Some(g) = self.capturing(stream.as_str()) {
                    let regions = self.captured_region(dst, true)?.into_iter().collect();
                    self.add_body(&g, i, stream, BodyKind::Access(regions));
                    return Ok(true);
                }
            }
            Op::EventRecord { event, stream } => match self.capturing(stream.as_str()) {
                Some(g) => {
                    let at = self.add_body(&g, i, stream, BodyKind::Record);
                    self.g.events.insert(event.as_str().to_owned(), (g, at));
                    // Outside the capture, the event counts as never recorded.
                    self.events.insert(event.as_str().to_owned(), None);
                    return Ok(true);
                }
                None => {
                    self.g.events.remove(event.as_str());
                }
            },
            Op::EventWait { stream, event } => {
                let captured = self.g.events.get(event.as_str()).cloned();
                match (self.capturing(stream.as_str()), captured) {
                    (Some(g), Some((h, at))) if g == h => {
                        self.add_body(&g, i, stream, BodyKind::Wait(Some(at)));
                        return Ok(true);
                    }
                    (Some(_), Some(_)) => {
                        return Err("a capturing stream waits on an event of another capture".into())
                    }
                    (Some(g), None) => {
                        if self.capture(event).is_some() {
                            return Err(
                                "a capturing stream waits on an event recorded outside".into()
                            );
                        }
                        self.report(i, HazardKind::WaitOnUnrecordedEvent, None);
                        self.add_body(&g, i, stream, BodyKind::Wait(None));
                        return Ok(true);
                    }
                    (None, Some((g, at))) => {
                        if stream.as_str() == DEFAULT_STREAM {
                            return Err("the legacy default stream joins a capture".into());
                        }
                        // The stream joins the capture.
                        self.stream(stream)?;
                        self.g
                            .capturing
                            .insert(stream.as_str().to_owned(), g.clone());
                        self.add_body(&g, i, stream, BodyKind::Wait(Some(at)));
                        return Ok(true);
                    }
                    (None, None) => {}
                }
            }
            Op::Free {
                stream: Some(s), ..
            } if self.capturing(s.as_str()).is_some() => {
                return Err("a stream-ordered free on a capturing stream".into());
            }
            Op::StreamSync { stream } | Op::StreamQuery { stream, .. }
                if self.capturing(stream.as_str()).is_some() =>
            {
                return Err("a sync or query of a capturing stream".into());
            }
            Op::EventSync { event } | Op::EventQuery { event, .. }
                if self.g.events.contains_key(event.as_str()) =>
            {
                return Err("a sync or query of a captured event".into());
            }
            Op::DeviceSync { .. } => return Err("device_sync during a capture".into()),
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.g.events.remove(event.as_str());
            }
            _ => {}
        }
        Ok(false)
    }

    /// A region of a captured access: the buffer its name denotes now (freed or not), and its
    /// bytes (`None` for an empty one, which touches nothing).
    fn captured_region(
        &mut self,
        r: &Region,
        writes: bool,
    ) -> Result<Option<CapturedRegion>, String> {
        let name = r.buffer.as_str();
        let buffer = match self.names.get(name).copied() {
            Some(super::Name::Live(b))
            | Some(super::Name::External(b))
            | Some(super::Name::Freed(b)) => b,
            None => self.external(name),
        };
        let start = r.offset;
        let end = match (self.buffers[buffer].size, r.bytes) {
            (_, Some(n)) => Some(
                start
                    .checked_add(n)
                    .ok_or_else(|| format!("region of {name} overflows"))?,
            ),
            (Some(size), None) => Some(size),
            (None, None) => None,
        };
        if let Some(size) = self.buffers[buffer].size {
            if start > size || end.is_some_and(|e| e > size) {
                return Err(format!("region of {name} reaches past its end"));
            }
        }
        Ok(Some((buffer, start, end, writes)))
    }

    fn add_body(&mut self, g: &str, i: usize, stream: &Id, kind: BodyKind) -> usize {
        let graph = self.g.graphs.get_mut(g).expect("a graph being captured");
        graph.body.push(Body {
            op: i,
            stream: stream.as_str().to_owned(),
            kind,
        });
        graph.body.len() - 1
    }

    pub(super) fn graph_begin(
        &mut self,
        i: usize,
        graph: &Id,
        stream: &Id,
        pool: Option<&Id>,
    ) -> Result<(), String> {
        self.host_op(i);
        if stream.as_str() == DEFAULT_STREAM {
            return Err("graph_begin on the legacy default stream".into());
        }
        self.stream(stream)?;
        if self.capturing(stream.as_str()).is_some() {
            return Err("graph_begin on a capturing stream".into());
        }
        if self.g.graphs.contains_key(graph.as_str()) {
            return Err("graph_begin of a graph already captured".into());
        }
        let pool = pool.unwrap_or(graph).as_str().to_owned();
        self.named_pool(&pool);
        if let Some(p) = self.g.pools.get_mut(&pool) {
            p.capturing += 1;
        }
        self.g.graphs.insert(
            graph.as_str().to_owned(),
            Graph {
                ended: false,
                origin: stream.as_str().to_owned(),
                pool,
                body: Vec::new(),
                last_exit: None,
            },
        );
        self.g
            .capturing
            .insert(stream.as_str().to_owned(), graph.as_str().to_owned());
        Ok(())
    }

    pub(super) fn graph_end(&mut self, i: usize, graph: &Id) -> Result<(), String> {
        self.host_op(i);
        let name = graph.as_str();
        let g = match self.g.graphs.get(name) {
            Some(g) if !g.ended => g,
            _ => return Err("graph_end of a graph not being captured".into()),
        };
        // Every joined stream's captured work reaches the origin's last captured op through
        // its stream's order and captured record → wait edges.
        let origin_last = g.body.iter().rposition(|b| b.stream == g.origin);
        let streams: HashSet<&str> = g.body.iter().map(|b| b.stream.as_str()).collect();
        for s in streams.iter().filter(|&&s| s != g.origin) {
            let last_work = g
                .body
                .iter()
                .rposition(|b| b.stream == *s && matches!(b.kind, BodyKind::Access(_)));
            let Some(from) = last_work else {
                continue;
            };
            if !origin_last.is_some_and(|to| body_reaches(&g.body, from, to)) {
                return Err(format!("unjoined work of stream {s} at graph_end"));
            }
        }
        let pool = g.pool.clone();
        self.g.capturing.retain(|_, h| h != name);
        self.g.events.retain(|_, (h, _)| h != name);
        if let Some(g) = self.g.graphs.get_mut(name) {
            g.ended = true;
        }
        if let Some(p) = self.g.pools.get_mut(&pool) {
            p.capturing -= 1;
            if p.capturing == 0 {
                for (addr, key) in std::mem::take(&mut p.held) {
                    p.alloc.free(addr, key).map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn graph_launch(&mut self, i: usize, graph: &Id, stream: &Id) -> Result<(), String> {
        if self.capturing(stream.as_str()).is_some() {
            return Err("graph_launch on a capturing stream".into());
        }
        self.stream_op(i, stream)?;
        let name = graph.as_str();
        let (body, last_exit) = match self.g.graphs.get_mut(name) {
            Some(g) if g.ended => (std::mem::take(&mut g.body), g.last_exit),
            _ => return Err("graph_launch of a graph that has not ended its capture".into()),
        };
        let entry = self.new_node();
        self.edge(i, entry);
        self.edge_from(last_exit, entry);
        let mut last: HashMap<&str, usize> = HashMap::new();
        let mut nodes = vec![usize::MAX; body.len()];
        for (k, b) in body.iter().enumerate() {
            let n = self.new_node();
            nodes[k] = n;
            self.edge(entry, n);
            if let Some(&l) = last.get(b.stream.as_str()) {
                self.edge(l, n);
            }
            last.insert(b.stream.as_str(), n);
            match &b.kind {
                BodyKind::Record | BodyKind::Wait(None) => {}
                BodyKind::Wait(Some(r)) => self.edge(nodes[*r], n),
                BodyKind::Access(regions) => {
                    let participant = format!("{name}/{}", b.stream);
                    for &(buffer, start, end, writes) in regions {
                        let buf = &self.buffers[buffer];
                        if buf.free_op.is_some() && buf.pool.is_none() {
                            let bname = buf.name.clone();
                            self.report_at(
                                i,
                                HazardKind::UseAfterFree,
                                Some(&bname),
                                Some(b.op as u64),
                            );
                            continue;
                        }
                        if end == Some(start) {
                            // An empty region touches no byte.
                            continue;
                        }
                        self.accesses.push(Access {
                            op: i,
                            captured: Some(b.op as u64),
                            buffer,
                            participant: participant.clone(),
                            writes,
                            alloc: false,
                            start,
                            end,
                            at: Some(n),
                        });
                    }
                }
            }
        }
        let exit = self.new_node();
        self.edge(entry, exit);
        let lasts: Vec<usize> = last.into_values().collect();
        for l in lasts {
            self.edge(l, exit);
        }
        if let Some(s) = self.streams.get_mut(stream.as_str()) {
            s.last_op = Some(exit);
        }
        if let Some(g) = self.g.graphs.get_mut(name) {
            g.body = body;
            g.last_exit = Some(exit);
        }
        Ok(())
    }
}

/// Whether captured op `to` follows captured op `from` in a body: along a stream's captured ops,
/// and from a captured record to its waits.
fn body_reaches(body: &[Body], from: usize, to: usize) -> bool {
    let mut seen = vec![false; body.len()];
    let mut stack = vec![from];
    while let Some(k) = stack.pop() {
        if k == to {
            return true;
        }
        if std::mem::replace(&mut seen[k], true) {
            continue;
        }
        if let Some(next) = (k + 1..body.len()).find(|&j| body[j].stream == body[k].stream) {
            stack.push(next);
        }
        if matches!(body[k].kind, BodyKind::Record) {
            for (j, b) in body.iter().enumerate().skip(k + 1) {
                if matches!(b.kind, BodyKind::Wait(Some(r)) if r == k) {
                    stack.push(j);
                }
            }
        }
    }
    false
}
