//! The constraints every generated program satisfies, checked.

use std::collections::{HashMap, HashSet};

use super::Program;
use crate::trace::{Id, MemoryKind, Op, Region, DEFAULT_STREAM, HOST};

/// Checks the constraints every generated program satisfies, which the simulator and the GPU
/// kernels rely on; the error names the first offending op.
///
/// - Valid checker input: no host access to device memory, regions within bounds, no allocation
///   of a live name, no stream named `"host"`, no copy whose source and destination overlap in
///   one buffer, no `addr`; every stream but `"default"` created by `stream_create` (device 0)
///   before its use; every event recorded before a wait, sync or query on it.
/// - Memory: only device and pinned allocations, each a multiple of 4 bytes and at least 16; no
///   external buffers (every buffer is allocated before its first use); frees and
///   `record_stream` name live buffers; stream-ordered frees free device memory. A region may
///   name a freed buffer (a use after free), within its old bounds.
/// - Regions: offset and length multiples of 4, non-empty. Kernels and memsets touch device
///   memory; host reads and writes pinned memory; a copy has at least one device side and a
///   source and destination of equal length.
/// - A launch has 0–4 read regions and 1–2 write regions; no read region overlaps a write region
///   unless it is the identical range of the same buffer, and write regions do not overlap each
///   other.
pub fn validate(program: &Program) -> Result<(), String> {
    let mut v = Validator::default();
    for (i, top) in program.ops.iter().enumerate() {
        v.op(&top.op)
            .map_err(|e| format!("op {i} ({}): {e}", top.op.name()))?;
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct ValidBuf {
    bytes: u64,
    memory: MemoryKind,
    live: bool,
}

/// A region resolved: its buffer, memory, byte range and whether the buffer is live.
struct Resolved<'a> {
    buffer: &'a Id,
    memory: MemoryKind,
    lo: u64,
    hi: u64,
}

impl Resolved<'_> {
    fn overlaps(&self, other: &Resolved<'_>) -> bool {
        self.buffer == other.buffer && self.lo < other.hi && other.lo < self.hi
    }

    fn same(&self, other: &Resolved<'_>) -> bool {
        self.buffer == other.buffer && self.lo == other.lo && self.hi == other.hi
    }
}

#[derive(Default)]
struct Validator {
    bufs: HashMap<Id, ValidBuf>,
    streams: HashMap<Id, bool>,
    recorded: HashSet<Id>,
}

impl Validator {
    fn stream(&self, s: &Id) -> Result<(), String> {
        if s.as_str() == HOST {
            return Err("\"host\" used as a stream".into());
        }
        if s.as_str() != DEFAULT_STREAM && !self.streams.contains_key(s) {
            return Err(format!("stream {s} used before its stream_create"));
        }
        Ok(())
    }

    fn event(&self, e: &Id) -> Result<(), String> {
        if self.recorded.contains(e) {
            Ok(())
        } else {
            Err(format!("event {e} is not recorded"))
        }
    }

    fn live(&self, b: &Id) -> Result<ValidBuf, String> {
        match self.bufs.get(b) {
            Some(buf) if buf.live => Ok(*buf),
            Some(_) => Err(format!("buffer {b} is freed")),
            None => Err(format!("buffer {b} was never allocated")),
        }
    }

    fn region<'a>(&self, r: &'a Region) -> Result<Resolved<'a>, String> {
        let Some(buf) = self.bufs.get(&r.buffer) else {
            return Err(format!(
                "buffer {} was never allocated (external)",
                r.buffer
            ));
        };
        if r.offset % 4 != 0 {
            return Err(format!("offset {} is not a multiple of 4", r.offset));
        }
        let hi = match r.bytes {
            Some(n) if n % 4 != 0 => {
                return Err(format!("length {n} is not a multiple of 4"));
            }
            Some(n) => r.offset.checked_add(n).ok_or("region end overflows")?,
            None => buf.bytes,
        };
        if hi <= r.offset {
            return Err(format!("empty region of {}", r.buffer));
        }
        if hi > buf.bytes {
            return Err(format!(
                "region [{}, {hi}) reaches past the end of {} ({} bytes)",
                r.offset, r.buffer, buf.bytes
            ));
        }
        Ok(Resolved {
            buffer: &r.buffer,
            memory: buf.memory,
            lo: r.offset,
            hi,
        })
    }

    fn device_region<'a>(&self, r: &'a Region) -> Result<Resolved<'a>, String> {
        let x = self.region(r)?;
        if x.memory != MemoryKind::Device {
            return Err(format!("{} is not device memory", r.buffer));
        }
        Ok(x)
    }

    fn op(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::StreamCreate {
                stream,
                device,
                blocking,
            } => {
                if stream.as_str() == HOST || stream.as_str() == DEFAULT_STREAM {
                    return Err(format!("stream_create of {stream}"));
                }
                if *device != 0 {
                    return Err(format!("device {device}"));
                }
                if self.streams.insert(stream.clone(), *blocking) == Some(!*blocking) {
                    return Err(format!("stream {stream} redeclared"));
                }
            }
            Op::Alloc {
                buffer,
                bytes,
                stream,
                memory,
                addr,
                pool,
            } => {
                if addr.is_some() {
                    return Err("addr given".into());
                }
                if pool.is_some() {
                    return Err("pool given".into());
                }
                if self.bufs.get(buffer).is_some_and(|b| b.live) {
                    return Err(format!("buffer {buffer} is live"));
                }
                if bytes % 4 != 0 || *bytes < 16 {
                    return Err(format!("{bytes} bytes: not a multiple of 4 of at least 16"));
                }
                match (memory, stream) {
                    (MemoryKind::Device, Some(s)) => self.stream(s)?,
                    (MemoryKind::Device, None) => {}
                    (MemoryKind::Pinned, None) => {}
                    (MemoryKind::Pinned, Some(_)) => return Err("pinned alloc on a stream".into()),
                    (MemoryKind::Managed, _) => return Err("managed memory".into()),
                }
                self.bufs.insert(
                    buffer.clone(),
                    ValidBuf {
                        bytes: *bytes,
                        memory: *memory,
                        live: true,
                    },
                );
            }
            Op::Free { buffer, stream } => {
                let buf = self.live(buffer)?;
                if let Some(s) = stream {
                    self.stream(s)?;
                    if buf.memory != MemoryKind::Device {
                        return Err("stream-ordered free of host memory".into());
                    }
                }
                if let Some(b) = self.bufs.get_mut(buffer) {
                    b.live = false;
                }
            }
            Op::RecordStream { buffer, stream } => {
                self.stream(stream)?;
                self.live(buffer)?;
            }
            Op::Launch {
                stream,
                reads,
                writes,
                ..
            } => {
                self.stream(stream)?;
                if reads.len() > 4 || writes.is_empty() || writes.len() > 2 {
                    return Err(format!(
                        "{} reads and {} writes; expected 0-4 and 1-2",
                        reads.len(),
                        writes.len()
                    ));
                }
                let w = writes
                    .iter()
                    .map(|r| self.device_region(r))
                    .collect::<Result<Vec<_>, _>>()?;
                let r = reads
                    .iter()
                    .map(|r| self.device_region(r))
                    .collect::<Result<Vec<_>, _>>()?;
                if w.len() == 2 && w[0].overlaps(&w[1]) {
                    return Err("write regions overlap".into());
                }
                for x in &r {
                    if w.iter().any(|y| x.overlaps(y) && !x.same(y)) {
                        return Err(format!(
                            "read region of {} overlaps a write region",
                            x.buffer
                        ));
                    }
                }
            }
            Op::Copy { stream, src, dst } => {
                self.stream(stream)?;
                let (s, d) = (self.region(src)?, self.region(dst)?);
                if s.hi - s.lo != d.hi - d.lo {
                    return Err("source and destination lengths differ".into());
                }
                if s.overlaps(&d) {
                    return Err("source and destination overlap".into());
                }
                if s.memory != MemoryKind::Device && d.memory != MemoryKind::Device {
                    return Err("a copy between host buffers".into());
                }
            }
            Op::Memset { stream, dst } => {
                self.stream(stream)?;
                self.device_region(dst)?;
            }
            Op::HostRead { buffer } | Op::HostWrite { buffer } => {
                if self.region(buffer)?.memory != MemoryKind::Pinned {
                    return Err(format!("{} is not pinned memory", buffer.buffer));
                }
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                self.recorded.remove(event);
            }
            Op::EventRecord { event, stream } => {
                self.stream(stream)?;
                self.recorded.insert(event.clone());
            }
            Op::EventWait { stream, event } => {
                self.stream(stream)?;
                self.event(event)?;
            }
            Op::EventSync { event } | Op::EventQuery { event, .. } => self.event(event)?,
            Op::StreamSync { stream } | Op::StreamQuery { stream, .. } => self.stream(stream)?,
            Op::DeviceSync { device } => {
                if *device != 0 {
                    return Err(format!("device {device}"));
                }
            }
            // Captures and launches on created streams; which ops a capture takes and what a
            // launch replays are the checker's to judge (every generated program is valid input).
            Op::GraphBegin { stream, .. } | Op::GraphLaunch { stream, .. } => {
                if stream.as_str() == DEFAULT_STREAM {
                    return Err("a graph op on the legacy default stream".into());
                }
                self.stream(stream)?;
            }
            Op::GraphEnd { .. } => {}
        }
        Ok(())
    }
}
