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

use std::collections::{BTreeMap, HashMap};

use super::backend::{Backend, EventKey, Fence, Issued, Op, Span, StreamKey, StreamKind};
use super::error::ExecError;
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
    record_streams: HashMap<Id, Vec<StreamKey>>,
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
            record_streams: HashMap::new(),
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
        backend: &mut dyn Backend,
    ) -> Result<(u32, u64), ExecError> {
        let owner = match stream {
            Some(s) => self.stream(op, s, backend)?,
            None => 0,
        };
        let placed = addr.filter(|_| bytes > 0);
        if let Some(a) = placed {
            if memory == MemoryKind::Device && self.reappears(a, a.saturating_add(bytes), owner) {
                // The memory went back to the driver and came back: the device was synchronized.
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
        // The block reuses memory of earlier buffers freed with record_stream: fence.
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
            },
        );
        self.record_streams.remove(buffer);
        Ok((gen, addr))
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
