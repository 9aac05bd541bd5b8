//! The simulated device as a [`Backend`]: each op of the execution layer, issued.

use smallvec::SmallVec;

use super::device::{Device, Mark, SimStream, SpanList, Timing, Work};
use super::program::MAX_WORDS;
use crate::alloc::AllocatorStats;
use crate::exec::backend::{
    Backend, EventKey, Fence, Fill, Issued, Kernel, Op, SimMemory, Span, StreamKey, StreamKind,
};
use crate::exec::error::ExecError;
use crate::trace::MemoryKind;

impl Backend for Device {
    #[inline]
    fn issue(&mut self, index: u64, op: Op<'_>) -> Result<Issued, ExecError> {
        if !self.execute {
            // No device work: what would run on the device returns at once.
            match op {
                Op::Launch { .. }
                | Op::Store { .. }
                | Op::EventRecord { .. }
                | Op::EventWait { .. } => return Ok(Issued::Done),
                Op::Load { src, .. } => return Ok(Issued::Bytes(vec![0; src.bytes as usize])),
                _ => {}
            }
        }
        self.issue_op(index, op)
    }

    fn fence(&mut self, stream: StreamKey) -> Result<Option<Fence>, ExecError> {
        let m = self.last(stream);
        Ok((m.seq > 0 && !self.is_done(&m)).then_some(Fence {
            stream,
            mark: m.seq,
        }))
    }

    fn fence_done(&self, fence: Fence) -> bool {
        self.is_done(&Mark {
            stream: fence.stream,
            seq: fence.mark,
        })
    }

    fn release_stream(&mut self, _: StreamKey) {}

    fn next_device_segment(&self) -> Option<u64> {
        Some(self.device.memory().next_base())
    }

    fn map_device_segment(&mut self, bytes: u64) -> Result<u64, ExecError> {
        use crate::alloc::Memory;
        self.device
            .memory_mut()
            .map_segment(bytes)
            .map_err(|e| ExecError::InvalidArgument(e.to_string()))
    }

    #[inline]
    fn runs_work(&self) -> bool {
        self.execute
    }

    fn device_memory_stats(&self) -> AllocatorStats {
        self.device.stats()
    }

    fn sim(&mut self) -> Option<&mut dyn SimMemory> {
        Some(self)
    }
}

impl Device {
    /// Issues op `index` (see [`Backend::issue`]).
    #[inline(never)]
    fn issue_op(&mut self, index: u64, op: Op<'_>) -> Result<Issued, ExecError> {
        let i = index as usize;
        match op {
            Op::StreamCreate {
                stream,
                kind,
                device,
            } => {
                let st = self.stream_mut(stream);
                if stream != 0 {
                    st.kind = kind;
                    st.device = device;
                }
                Ok(Issued::Done)
            }
            Op::EventCreate { event } | Op::EventDestroy { event } => {
                let k = event as usize;
                if self.events.len() <= k {
                    self.events.resize(k + 1, None);
                }
                self.events[k] = None;
                Ok(Issued::Done)
            }
            Op::Alloc {
                memory,
                bytes,
                stream,
                at,
            } => {
                let addr = match at {
                    Some(a) if bytes > 0 => {
                        self.arena(memory).place(4 * MAX_WORDS);
                        Some(a)
                    }
                    _ => {
                        let block = match memory {
                            MemoryKind::Device => self.device.allocate(bytes, stream),
                            MemoryKind::Pinned => self.pinned.allocate(bytes),
                            MemoryKind::Managed => self.managed.allocate(bytes),
                        }
                        .map_err(|e| ExecError::alloc(e, bytes, memory))?;
                        block.map(|b| b.addr)
                    }
                };
                Ok(Issued::Allocated(addr))
            }
            Op::Free {
                span,
                owner,
                to,
                record_streams,
                placed,
            } => {
                for &s in record_streams {
                    self.flush(s, u64::MAX);
                }
                if span.bytes > 0 && !placed {
                    let r = match span.memory {
                        MemoryKind::Device => self.device.free(span.addr, to.unwrap_or(owner)),
                        MemoryKind::Pinned => self.pinned.free(span.addr),
                        MemoryKind::Managed => self.managed.free(span.addr),
                    };
                    r.map_err(|e| ExecError::InvalidArgument(e.to_string()))?;
                }
                match to {
                    Some(s) => Ok(self.submit(s, i, Work::Marker, SmallVec::new(), false)),
                    None => Ok(Issued::Done),
                }
            }
            Op::Launch {
                stream,
                kernel,
                reads,
                writes,
                fences,
            } => {
                let (id, lag) = match kernel {
                    Kernel::Hash { id, spin_ns } => (id, spin_ns > 0),
                    #[cfg(feature = "cuda")]
                    Kernel::User { id, .. } => (id, false),
                    Kernel::Standin { id, .. } => (id, false),
                };
                let reads: SpanList = (0..reads.count()).map(|k| reads.span(k)).collect();
                let writes: SpanList = (0..writes.count()).map(|k| writes.span(k)).collect();
                for s in reads.iter().chain(&writes) {
                    self.check(s, "launch")?;
                }
                let words = reads
                    .iter()
                    .chain(&writes)
                    .map(|s| u32::try_from(s.words()).unwrap_or(u32::MAX))
                    .max()
                    .unwrap_or(0);
                let work = Work::Launch {
                    id,
                    reads,
                    writes,
                    words,
                };
                Ok(self.submit(stream, i, work, Device::marks(fences), lag))
            }
            Op::Copy {
                stream,
                src,
                dst,
                fences,
            } => {
                self.check(&src, "copy")?;
                self.check(&dst, "copy")?;
                Ok(self.submit(
                    stream,
                    i,
                    Work::Copy { src, dst },
                    Device::marks(fences),
                    false,
                ))
            }
            Op::Memset {
                stream,
                dst,
                fill,
                fences,
            } => {
                self.check(&dst, "memset")?;
                let value = match fill {
                    Fill::Word(v) => v,
                    Fill::Byte(b) => u32::from_ne_bytes([b; 4]),
                };
                Ok(self.submit(
                    stream,
                    i,
                    Work::Memset { dst, value },
                    Device::marks(fences),
                    false,
                ))
            }
            Op::Store { stream, dst, data } => {
                self.check(&dst, "memcpy_htod")?;
                let work = Work::Store {
                    dst,
                    data: data.to_vec(),
                };
                Ok(self.submit(stream, i, work, SmallVec::new(), false))
            }
            Op::Load { stream, src } => {
                self.check(&src, "memcpy_dtoh")?;
                self.run_now(stream, i);
                let bytes = self
                    .arena(src.memory)
                    .read_bytes(src.addr, src.bytes)
                    .unwrap_or_default();
                let marks = self.stream_marks(stream);
                self.wait_host(&marks);
                Ok(Issued::Bytes(bytes))
            }
            Op::RunNow { stream, .. } => {
                self.run_now(stream, i);
                Ok(Issued::Done)
            }
            Op::HostRead { span, fences } => {
                if self.timing == Timing::Scheduled {
                    return Ok(self.host_work(i, Work::HostRead { src: span }, fences));
                }
                for d in Device::marks(fences) {
                    self.flush(d.stream, d.seq);
                }
                self.check(&span, "read")?;
                Ok(Issued::Bytes(
                    self.arena(span.memory)
                        .read_bytes(span.addr, span.bytes)
                        .unwrap_or_default(),
                ))
            }
            Op::HostWrite { span, data, fences } => {
                if self.timing == Timing::Scheduled {
                    let words: Vec<u32> = data
                        .chunks(4)
                        .map(|c| {
                            let mut le = [0u8; 4];
                            le[..c.len()].copy_from_slice(c);
                            u32::from_le_bytes(le)
                        })
                        .collect();
                    let work = Work::HostWrite {
                        dst: span,
                        data: words,
                    };
                    return Ok(self.host_work(i, work, fences));
                }
                for d in Device::marks(fences) {
                    self.flush(d.stream, d.seq);
                }
                // A host write of whole bytes: the bytes past the data keep their values.
                self.check(&span, "write")?;
                let n = data.len().min(span.bytes as usize);
                self.arena(span.memory)
                    .write_bytes(span.addr, &data[..n], span.gen);
                Ok(Issued::Done)
            }
            Op::EventRecord { event, stream } => {
                let issued = self.submit(stream, i, Work::Marker, SmallVec::new(), false);
                let mark = self.last(stream);
                let k = event as usize;
                if self.events.len() <= k {
                    self.events.resize(k + 1, None);
                }
                self.events[k] = Some(mark);
                Ok(issued)
            }
            Op::EventWait { stream, event } => {
                let deps: SmallVec<[Mark; 2]> = self.event_mark(event).into_iter().collect();
                Ok(self.submit(stream, i, Work::Marker, deps, false))
            }
            Op::EventSync { event } => {
                let marks: SmallVec<[Mark; 4]> = self.event_mark(event).into_iter().collect();
                self.wait_host(&marks);
                Ok(Issued::Done)
            }
            Op::EventQuery { event } => Ok(Issued::Complete(
                self.event_mark(event).is_none_or(|m| self.is_done(&m)),
            )),
            Op::StreamSync { stream } => {
                let marks = self.stream_marks(stream);
                self.wait_host(&marks);
                Ok(Issued::Done)
            }
            Op::StreamQuery { stream } => {
                let idle = |st: &SimStream| st.queue.is_empty();
                let complete = match self.streams.get(stream as usize) {
                    None => true,
                    Some(st) if st.kind == StreamKind::LegacyDefault => {
                        idle(st)
                            && self
                                .streams
                                .iter()
                                .filter(|b| b.kind == StreamKind::Blocking)
                                .all(idle)
                    }
                    Some(st) => idle(st),
                };
                Ok(Issued::Complete(complete))
            }
            Op::DeviceSync { device } => {
                let marks: SmallVec<[Mark; 4]> = (0..self.streams.len())
                    .filter(|&k| self.streams[k].device == device)
                    .map(|k| self.last(k as StreamKey))
                    .collect();
                if self.timing == Timing::Eager {
                    self.flush_all();
                } else {
                    self.wait_host(&marks);
                }
                Ok(Issued::Done)
            }
        }
    }
}

impl Device {
    fn event_mark(&self, event: EventKey) -> Option<Mark> {
        self.events.get(event as usize).copied().flatten()
    }
}

impl SimMemory for Device {
    fn read(&mut self, span: &Span) -> Result<Vec<u32>, ExecError> {
        Device::read(self, span)
    }

    fn write(&mut self, span: &Span, words: &[u32]) -> Result<(), ExecError> {
        Device::write(self, span, words)
    }
}
