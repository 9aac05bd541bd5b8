//! Running trace programs: what the program runners of both backends share.
//!
//! A program names streams, events and buffers by ids; a backend takes keys and spans. The
//! [`Resolver`] keeps the program's side of a run: ids to keys (in order of first mention, the
//! legacy default stream first), live buffers and their generations, and the allocator semantics
//! that are the program's rather than the device's:
//!
//! - **`record_stream`**: a free takes a fence ([`Backend::fence`]) on every stream recorded for
//!   the buffer; memory that reuses the freed bytes carries those fences, and every later access of
//!   it waits for them first.
//! - **Placed memory**: an allocation with `addr` lies where the program puts it (the compressed
//!   addresses of [`crate::fuzz::runnable`]). Device memory that comes back on another stream than
//!   the one its free gave it to went back to the driver: the device is synchronized at its
//!   `alloc`, as the trace format says.
//! - **CUDA graphs** ([`super::graphs`]): which streams are capturing, the captured bodies with
//!   their regions resolved, the replay participants, and the graph memory pools: device memory
//!   allocated on a capturing stream comes from the capture's pool (outside a capture, from the
//!   pool its `alloc` names, if any), and a free of a pool buffer returns its block to the pool
//!   instead of the device.

use std::collections::{BTreeMap, HashMap};

use super::backend::{Backend, EventKey, Fence, Issued, Op, Span, StreamKey, StreamKind};
use super::error::ExecError;
use super::graphs::{BodyKind, Captured, Graphs};
use crate::alloc::{ModelMemory, PoolBytes, PoolIndex};
use crate::trace::{Id, MemoryKind, Region, DEFAULT_STREAM};

/// A live buffer of a program run.
#[derive(Clone, Debug)]
pub(crate) struct Buffer {
    pub(crate) memory: MemoryKind,
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// The owning stream (the allocation's).
    pub(crate) owner: StreamKey,
    /// Whether the program placed it (`addr`) rather than the allocator.
    pub(crate) placed: bool,
    /// Its generation: the index of its allocation among the run's allocations.
    pub(crate) gen: u32,
    /// `record_stream` fences of the freed buffers whose bytes it reuses.
    pub(crate) fences: Vec<Fence>,
    /// The graph pool it came from (allocated on a capturing stream): a pool buffer.
    pub(crate) pool: Option<PoolIndex>,
}

impl Buffer {
    /// The whole buffer as a span.
    pub(crate) fn span(&self) -> Span {
        Span {
            memory: self.memory,
            addr: self.addr,
            bytes: self.size,
            gen: self.gen,
            external: false,
        }
    }
}

/// A freed range and the fences its reuse must wait for.
#[derive(Debug)]
struct Freed {
    memory: MemoryKind,
    addr: u64,
    size: u64,
    fences: Vec<Fence>,
}

/// The program's side of a run. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Resolver {
    /// Prefixes messages of errors the backend reports (`"CUDA"`).
    label: Option<&'static str>,
    streams: HashMap<Id, StreamKey>,
    /// The device of each stream, by key.
    devices: Vec<u64>,
    events: HashMap<Id, EventKey>,
    buffers: HashMap<Id, Buffer>,
    /// By generation: its alloc op and buffer name.
    gens: Vec<(usize, Id)>,
    freed: Vec<Freed>,
    /// Placed device memory freed and not yet allocated again: start → (end, the stream its free
    /// gave it to).
    freed_to: BTreeMap<u64, (u64, StreamKey)>,
    /// Placed device memory the graph pools hold.
    pool_bytes: PoolBytes,
    record_streams: HashMap<Id, Vec<StreamKey>>,
    /// CUDA graphs: captures, bodies, replay participants, pools.
    pub(crate) graphs: Graphs,
}

impl Resolver {
    /// A run's resolver; `label` prefixes the messages of the backend's errors.
    pub(crate) fn new(label: Option<&'static str>) -> Self {
        Resolver {
            label,
            streams: HashMap::from([(Id::from(DEFAULT_STREAM), 0)]),
            devices: vec![0],
            events: HashMap::new(),
            buffers: HashMap::new(),
            gens: Vec::new(),
            freed: Vec::new(),
            freed_to: BTreeMap::new(),
            pool_bytes: PoolBytes::default(),
            record_streams: HashMap::new(),
            graphs: Graphs::default(),
        }
    }

    /// An unsupported op `op`, with the label.
    pub(crate) fn unsupported(&self, op: usize, message: impl std::fmt::Display) -> ExecError {
        match self.label {
            Some(l) => ExecError::unsupported(op, format!("{l}: {message}")),
            None => ExecError::unsupported(op, message.to_string()),
        }
    }

    /// A backend's error at op `op` while doing `what`, as an unsupported op.
    pub(crate) fn failed<'a>(
        &'a self,
        op: usize,
        what: &'a str,
    ) -> impl FnOnce(ExecError) -> ExecError + 'a {
        move |e| match e {
            e @ ExecError::Unsupported { .. } => e,
            e => self.unsupported(op, format!("{what}: {e}")),
        }
    }

    /// The key of stream `id`; a stream named before any `stream_create` is created non-blocking.
    pub(crate) fn stream(
        &mut self,
        op: usize,
        id: &Id,
        backend: &mut dyn Backend,
    ) -> Result<StreamKey, ExecError> {
        if let Some(&s) = self.streams.get(id) {
            return Ok(s);
        }
        let key = self.devices.len() as StreamKey;
        backend
            .issue(
                op as u64,
                Op::StreamCreate {
                    stream: key,
                    kind: StreamKind::NonBlocking,
                    device: 0,
                },
            )
            .map_err(self.failed(op, "creating a stream"))?;
        self.streams.insert(id.clone(), key);
        self.devices.push(0);
        Ok(key)
    }

    /// A `stream_create`: the stream is (re)made of its kind, on `device`. The legacy default
    /// stream is not created.
    pub(crate) fn stream_create(
        &mut self,
        op: usize,
        id: &Id,
        device: u64,
        blocking: bool,
        backend: &mut dyn Backend,
    ) -> Result<(), ExecError> {
        if id.as_str() == DEFAULT_STREAM {
            return Ok(());
        }
        let key = match self.streams.get(id) {
            Some(&s) => s,
            None => {
                let key = self.devices.len() as StreamKey;
                self.streams.insert(id.clone(), key);
                self.devices.push(device);
                key
            }
        };
        self.devices[key as usize] = device;
        let kind = if blocking {
            StreamKind::Blocking
        } else {
            StreamKind::NonBlocking
        };
        backend
            .issue(
                op as u64,
                Op::StreamCreate {
                    stream: key,
                    kind,
                    device,
                },
            )
            .map_err(self.failed(op, "creating a stream"))?;
        Ok(())
    }

    /// The key of event `id`.
    pub(crate) fn event(&mut self, id: &Id) -> EventKey {
        let n = self.events.len() as EventKey;
        *self.events.entry(id.clone()).or_insert(n)
    }

    /// The live buffer `id`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the GPU runner's
    pub(crate) fn buffer(&self, id: &Id) -> Option<&Buffer> {
        self.buffers.get(id)
    }

    /// Whether `record_stream` named a stream for buffer `id` since its allocation.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the GPU runner's
    pub(crate) fn recorded(&self, id: &Id) -> bool {
        self.record_streams.get(id).is_some_and(|v| !v.is_empty())
    }

    /// The live buffers, by name.
    pub(crate) fn live(&self) -> Vec<(&Id, &Buffer)> {
        let mut v: Vec<(&Id, &Buffer)> = self.buffers.iter().collect();
        v.sort_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// The generations of the run: (alloc op, buffer name) of each.
    pub(crate) fn generations(&self) -> &[(usize, Id)] {
        &self.gens
    }

    /// Region `r` as a span: whole 4-byte words inside a live buffer.
    pub(crate) fn span(&self, op: usize, r: &Region) -> Result<Span, ExecError> {
        let b = self.buffers.get(&r.buffer).ok_or_else(|| {
            self.unsupported(
                op,
                format!("buffer {} is not allocated (external or freed)", r.buffer),
            )
        })?;
        let bytes = r.bytes.unwrap_or(b.size.saturating_sub(r.offset));
        let inside = r.offset.checked_add(bytes).is_some_and(|e| e <= b.size);
        if r.offset % 4 != 0 || bytes % 4 != 0 || !inside {
            return Err(self.unsupported(
                op,
                format!(
                    "region of {} is not whole 4-byte words inside the buffer",
                    r.buffer
                ),
            ));
        }
        if u32::try_from(bytes / 4).is_err() {
            return Err(self.unsupported(op, format!("region of {} is too large", r.buffer)));
        }
        Ok(Span {
            memory: b.memory,
            addr: b.addr + r.offset,
            bytes,
            gen: b.gen,
            external: false,
        })
    }

    /// The fences of the buffers of `regions`.
    pub(crate) fn fences(&self, regions: &[&Region]) -> Vec<Fence> {
        let mut v: Vec<Fence> = Vec::new();
        for r in regions {
            if let Some(b) = self.buffers.get(&r.buffer) {
                for f in &b.fences {
                    if !v.contains(f) {
                        v.push(*f);
                    }
                }
            }
        }
        v
    }

    /// An `alloc` as op `op`: returns the new buffer's generation and address.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn alloc(
        &mut self,
        op: usize,
        buffer: &Id,
        bytes: u64,
        stream: Option<&Id>,
        memory: MemoryKind,
        addr: Option<u64>,
        pool: Option<&Id>,
        backend: &mut dyn Backend,
    ) -> Result<(u32, u64), ExecError> {
        let owner = match stream {
            Some(s) => self.stream(op, s, backend)?,
            None => 0,
        };
        let placed = addr.filter(|_| bytes > 0);
        // Device memory allocated on a capturing stream comes from the capture's pool; outside
        // a capture, from the pool the alloc names.
        let pool = match memory {
            MemoryKind::Device => self
                .graphs
                .alloc_pool(owner, pool)
                .map_err(|e| self.unsupported(op, e))?,
            _ if pool.is_some() => {
                return Err(self.unsupported(
                    op,
                    format!("{buffer}: a graph pool holds device memory only"),
                ))
            }
            _ => None,
        };
        if let (Some(p), None) = (pool, placed) {
            let addr = self.pool_alloc(op, buffer, p, bytes, owner, backend)?;
            let fences = self.reuse_fences(memory, addr, bytes, backend);
            let gen = self.gens.len() as u32;
            self.gens.push((op, buffer.clone()));
            self.buffers.insert(
                buffer.clone(),
                Buffer {
                    memory,
                    addr,
                    size: bytes,
                    owner,
                    placed: false,
                    gen,
                    fences,
                    pool: Some(p),
                },
            );
            self.record_streams.remove(buffer);
            return Ok((gen, addr));
        }
        if let Some(a) = placed.filter(|_| memory == MemoryKind::Device) {
            let end = a.saturating_add(bytes);
            // Bytes another graph pool held went back to the driver (PyTorch frees a pool's
            // segments once no graph uses it) and came back; so did memory a plain free gave to
            // another stream. Either way the device was synchronized.
            let released = self.pool_bytes.release(a, end, pool);
            let reappears = pool.is_none() && self.reappears(a, end, owner);
            if let Some(p) = pool {
                self.pool_bytes.hold(a, end, p);
            }
            if released || reappears {
                let device = self.devices[owner as usize];
                backend
                    .issue(op as u64, Op::DeviceSync { device })
                    .map_err(
                        self.failed(op, "synchronizing the device for memory that came back"),
                    )?;
            }
        }
        let issued = backend
            .issue(
                op as u64,
                Op::Alloc {
                    memory,
                    bytes,
                    stream: owner,
                    at: placed,
                },
            )
            .map_err(self.failed(op, &format!("allocating {buffer}")))?;
        let addr = match issued {
            Issued::Allocated(a) => a.unwrap_or(0),
            _ => 0,
        };
        let fences = self.reuse_fences(memory, addr, bytes, backend);
        let gen = self.gens.len() as u32;
        self.gens.push((op, buffer.clone()));
        self.buffers.insert(
            buffer.clone(),
            Buffer {
                memory,
                addr,
                size: bytes,
                owner,
                placed: placed.is_some(),
                gen,
                fences,
                pool,
            },
        );
        self.record_streams.remove(buffer);
        Ok((gen, addr))
    }

    /// The fences a new block at `addr` must wait for: it reuses memory of earlier buffers freed
    /// with `record_stream`.
    fn reuse_fences(
        &mut self,
        memory: MemoryKind,
        addr: u64,
        bytes: u64,
        backend: &dyn Backend,
    ) -> Vec<Fence> {
        let end = addr.saturating_add(bytes);
        let mut fences: Vec<Fence> = Vec::new();
        self.freed.retain(|f| {
            let overlaps = f.memory == memory && f.addr < end && addr < f.addr + f.size;
            if overlaps {
                for &x in &f.fences {
                    if !backend.fence_done(x) && !fences.contains(&x) {
                        fences.push(x);
                    }
                }
            }
            // A freed range the new buffer covers whole hands its fences on to it.
            let covered = overlaps && addr <= f.addr && f.addr + f.size <= end;
            !covered && f.fences.iter().any(|&x| !backend.fence_done(x))
        });
        fences
    }

    /// `bytes` for `owner` from graph pool `pool`: the block the pool's arena gives, any new
    /// segment mapped on the backend at the device address space's next segment.
    fn pool_alloc(
        &mut self,
        op: usize,
        buffer: &Id,
        pool: PoolIndex,
        bytes: u64,
        owner: StreamKey,
        backend: &mut dyn Backend,
    ) -> Result<u64, ExecError> {
        let base = backend
            .next_device_segment()
            .ok_or_else(|| self.unsupported(op, "this backend does not place graph pool memory"))?;
        let mut space = ModelMemory::new(base);
        let block = self
            .graphs
            .pools
            .allocate(pool, bytes, owner, &mut space)
            .map_err(|e| self.unsupported(op, format!("allocating {buffer} from its pool: {e}")))?;
        if space.mapped_bytes() > 0 {
            let at = backend
                .map_device_segment(space.mapped_bytes())
                .map_err(self.failed(op, &format!("mapping pool memory for {buffer}")))?;
            if at != base {
                return Err(self.unsupported(
                    op,
                    format!("pool memory for {buffer} was mapped at {at:#x}, not {base:#x}"),
                ));
            }
        }
        Ok(block.map_or(0, |b| b.addr))
    }

    /// A `free` as op `op` (nothing for a buffer that is not live).
    pub(crate) fn free(
        &mut self,
        op: usize,
        buffer: &Id,
        stream: Option<&Id>,
        backend: &mut dyn Backend,
    ) -> Result<Issued, ExecError> {
        let Some(b) = self.buffers.remove(buffer) else {
            return Ok(Issued::Done);
        };
        let recorded = self.record_streams.remove(buffer).unwrap_or_default();
        let hold = !recorded.is_empty();
        let mut fences: Vec<Fence> = Vec::new();
        for s in recorded {
            let f = backend
                .fence(s)
                .map_err(self.failed(op, "recording a record_stream fence"))?;
            if let Some(f) = f.filter(|f| !fences.contains(f)) {
                fences.push(f);
            }
        }
        for &f in &b.fences {
            if !backend.fence_done(f) && !fences.contains(&f) {
                fences.push(f);
            }
        }
        let to = match stream {
            Some(s) => Some(self.stream(op, s, backend)?),
            None => None,
        };
        if let Some(p) = b.pool {
            // Back to the pool, held back during a capture of it if record_stream named streams:
            // nothing is freed on the device, and the graph's replays keep the bytes. What the
            // record_stream streams did by now is ordered before every reuse of the block. A
            // stream-ordered free gives the block to its stream, as the checker's model does.
            if b.size > 0 {
                if !b.placed {
                    self.graphs
                        .pools
                        .free(p, b.addr, to.unwrap_or(b.owner), hold)
                        .map_err(|e| self.unsupported(op, format!("freeing {buffer}: {e}")))?;
                }
                if !fences.is_empty() {
                    self.freed.push(Freed {
                        memory: b.memory,
                        addr: b.addr,
                        size: b.size,
                        fences,
                    });
                }
            }
            return Ok(Issued::Done);
        }
        if b.size > 0 {
            if b.placed && b.memory == MemoryKind::Device {
                self.freed_to
                    .insert(b.addr, (b.addr + b.size, to.unwrap_or(b.owner)));
            }
            if !fences.is_empty() {
                self.freed.push(Freed {
                    memory: b.memory,
                    addr: b.addr,
                    size: b.size,
                    fences,
                });
            }
        }
        backend
            .issue(
                op as u64,
                Op::Free {
                    span: b.span(),
                    owner: b.owner,
                    to,
                    record_streams: &[],
                    placed: b.placed,
                },
            )
            .map_err(self.failed(op, &format!("freeing {buffer}")))
    }

    /// A `record_stream` as op `op`.
    pub(crate) fn record_stream(
        &mut self,
        op: usize,
        buffer: &Id,
        stream: &Id,
        backend: &mut dyn Backend,
    ) -> Result<(), ExecError> {
        let s = self.stream(op, stream, backend)?;
        self.record_streams
            .entry(buffer.clone())
            .or_default()
            .push(s);
        Ok(())
    }

    /// A `graph_begin` as op `op`.
    pub(crate) fn graph_begin(
        &mut self,
        op: usize,
        graph: &Id,
        stream: &Id,
        pool: Option<&Id>,
        backend: &mut dyn Backend,
    ) -> Result<(), ExecError> {
        let s = self.stream(op, stream, backend)?;
        if s == 0 {
            return Err(self.unsupported(op, "a capture on the legacy default stream"));
        }
        self.graphs
            .begin(graph, s, pool)
            .map(|_| ())
            .map_err(|m| self.unsupported(op, m))
    }

    /// A `graph_end` as op `op`.
    pub(crate) fn graph_end(&mut self, op: usize, graph: &Id) -> Result<(), ExecError> {
        self.graphs
            .end(graph)
            .map(|_| ())
            .map_err(|m| self.unsupported(op, m))
    }

    /// Where a stream op of `op` on stream `s` goes: `Some` when `s` is capturing (the op is
    /// captured, not run).
    #[inline]
    pub(crate) fn captured(&self, s: StreamKey) -> Option<Captured> {
        if self.graphs.any_capturing() {
            self.graphs.capturing(s)
        } else {
            None
        }
    }

    /// Captures access op `op` (a launch, copy or memset of the program) into `c`'s body, its
    /// regions resolved now.
    pub(crate) fn capture_access(
        &mut self,
        op: usize,
        c: Captured,
        what: &crate::trace::Op,
    ) -> Result<(), ExecError> {
        use crate::trace::Op as T;
        let kind = match what {
            T::Launch { reads, writes, .. } => {
                let r: Vec<Span> = reads
                    .iter()
                    .map(|x| self.span(op, x))
                    .collect::<Result<_, _>>()?;
                let w: Vec<Span> = writes
                    .iter()
                    .map(|x| self.span(op, x))
                    .collect::<Result<_, _>>()?;
                let all: Vec<&Region> = reads.iter().chain(writes).collect();
                BodyKind::Launch {
                    reads: r,
                    writes: w,
                    fences: self.fences(&all),
                }
            }
            T::Copy { src, dst, .. } => {
                let (a, b) = (self.span(op, src)?, self.span(op, dst)?);
                if a.bytes != b.bytes {
                    return Err(self.unsupported(op, "copy regions of different lengths"));
                }
                BodyKind::Copy {
                    src: a,
                    dst: b,
                    fences: self.fences(&[src, dst]),
                }
            }
            T::Memset { dst, .. } => BodyKind::Memset {
                dst: self.span(op, dst)?,
                fences: self.fences(&[dst]),
            },
            _ => return Err(self.unsupported(op, "only launches, copies and memsets are captured")),
        };
        self.graphs.capture(c, op, kind);
        Ok(())
    }

    /// The graph a `graph_launch` as op `op` replays, with its replay participants (one backend
    /// stream per lane, created at its first launch); counts the launch.
    pub(crate) fn graph_launch(
        &mut self,
        op: usize,
        graph: &Id,
        backend: &mut dyn Backend,
    ) -> Result<usize, ExecError> {
        let g = match self.graphs.by_name(graph) {
            Some(g) if self.graphs.graphs[g].ended => g,
            _ => return Err(self.unsupported(op, format!("graph {graph} has not been captured"))),
        };
        if self.graphs.graphs[g].participants.is_empty() {
            let n = self.graphs.graphs[g].lanes.len();
            let mut keys = Vec::with_capacity(n);
            for _ in 0..n {
                let key = self.devices.len() as StreamKey;
                backend
                    .issue(
                        op as u64,
                        Op::StreamCreate {
                            stream: key,
                            kind: StreamKind::NonBlocking,
                            device: 0,
                        },
                    )
                    .map_err(self.failed(op, "creating a replay participant"))?;
                self.devices.push(0);
                keys.push(key);
            }
            self.graphs.graphs[g].participants = keys;
        }
        self.graphs.graphs[g].launches += 1;
        Ok(g)
    }

    /// Whether placed device memory `[start, end)`, allocated on stream `owner`, was last freed
    /// to another stream (it went back to the driver).
    fn reappears(&mut self, start: u64, end: u64, owner: StreamKey) -> bool {
        let overlapped: Vec<(u64, u64, StreamKey)> = self
            .freed_to
            .range(..end)
            .filter(|(_, &(e, _))| e > start)
            .map(|(&s, &(e, p))| (s, e, p))
            .collect();
        let mut other = false;
        for (s, e, p) in overlapped {
            other |= p != owner;
            self.freed_to.remove(&s);
            if s < start {
                self.freed_to.insert(s, (start, p));
            }
            if e > end {
                self.freed_to.insert(end, (e, p));
            }
        }
        other
    }
}
