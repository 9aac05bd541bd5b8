//! The simulated backend: the session's ops on CPU memory, with the allocator policies of
//! [`crate::alloc`] and the kernel semantics of [`crate::kernels`].
//!
//! Memory is an arena per memory kind, as in [`crate::sim`]: segments at the addresses
//! [`ModelMemory`] gives (the checker's own model addresses), backed by words grown on demand, with
//! the same contents for never-written memory. Ops run when issued, except on a *lagging* stream:
//! a launch with a spin starts a lag, and the stream's work from there on waits in a queue until
//! CUDA's ordering forces it — a host sync of the stream, the device or an event it recorded; an
//! event wait by another stream; the legacy default stream's implicit edges; a `record_stream`
//! fence at a free. Every queued op had its cross-stream dependencies met when it was queued
//! (dependencies are forced at issue time), so running a queue never needs another one: every
//! schedule produced is one a GPU could produce, with the spun stream as late as possible.

use std::collections::{BTreeMap, VecDeque};

use super::buffer::{Region, Regions, WORD};
use super::handle::StreamKind;
use super::SessionError;
use crate::alloc::{
    AllocError, Block, DeviceCachingAllocator, HostCachingAllocator, Memory, ModelMemory,
};
use crate::kernels::{fmix, hash_word};
use crate::trace::MemoryKind;

/// The simulated memory is full: the segment the allocator asked for does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("out of simulated {} memory: a segment of {bytes} bytes does not fit in {capacity} bytes ({mapped} mapped)", memory.as_str())]
pub struct SimOutOfMemory {
    /// The memory kind.
    pub memory: MemoryKind,
    /// The segment size asked for.
    pub bytes: u64,
    /// The simulated capacity.
    pub capacity: u64,
    /// Bytes already mapped.
    pub mapped: u64,
}

/// Segments of one memory kind, backed by words grown on demand.
#[derive(Debug)]
pub(crate) struct SimArena {
    memory: MemoryKind,
    model: ModelMemory,
    capacity: u64,
    /// Base → (size in bytes, the words written or read so far from the base).
    segments: BTreeMap<u64, (u64, Vec<u32>)>,
}

impl Memory for SimArena {
    type Error = SimOutOfMemory;

    fn map_segment(&mut self, bytes: u64) -> Result<u64, Self::Error> {
        let mapped = self.model.mapped_bytes();
        let oom = SimOutOfMemory {
            memory: self.memory,
            bytes,
            capacity: self.capacity,
            mapped,
        };
        if mapped
            .checked_add(bytes)
            .is_none_or(|end| end > self.capacity)
        {
            return Err(oom);
        }
        let base = self.model.map_segment(bytes).map_err(|_| oom)?;
        self.segments.insert(base, (bytes, Vec::new()));
        Ok(base)
    }
}

impl SimArena {
    fn new(memory: MemoryKind, base: u64, capacity: u64) -> Self {
        SimArena {
            memory,
            model: ModelMemory::new(base),
            capacity,
            segments: BTreeMap::new(),
        }
    }

    /// The contents of never-written memory: a pattern of the address ([`crate::sim`]'s).
    fn fresh(addr: u64) -> u32 {
        fmix((addr >> 2) as u32 ^ 0xa5a5_0000)
    }

    /// The words of `[addr, addr + 4 * words)`, which must lie in one segment.
    fn words_mut(&mut self, addr: u64, words: u64) -> Option<&mut [u32]> {
        if words == 0 {
            return Some(&mut []);
        }
        let (&base, (size, seg)) = self.segments.range_mut(..=addr).next_back()?;
        let end = addr.checked_add(words.checked_mul(WORD)?)?;
        if end > base + *size || addr % WORD != 0 {
            return None;
        }
        let first = ((addr - base) / WORD) as usize;
        let last = ((end - base) / WORD) as usize;
        if seg.len() < last {
            let from = seg.len();
            seg.extend((from..last).map(|k| SimArena::fresh(base + WORD * k as u64)));
        }
        Some(&mut seg[first..last])
    }
}

impl SimArena {
    /// The whole words covering `[addr, addr + bytes)` and the offset of `addr` in the first one.
    fn covering_mut(&mut self, addr: u64, bytes: u64) -> Option<(&mut [u32], usize)> {
        let first = addr - addr % WORD;
        let end = addr.checked_add(bytes)?.checked_next_multiple_of(WORD)?;
        let words = self.words_mut(first, (end - first) / WORD)?;
        Some((words, (addr - first) as usize))
    }

    /// The bytes of `[addr, addr + bytes)`, which must lie in one segment (words are stored
    /// little-endian, as on the device).
    fn read_bytes(&mut self, addr: u64, bytes: u64) -> Option<Vec<u8>> {
        let (words, skip) = self.covering_mut(addr, bytes)?;
        Some(
            words
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .skip(skip)
                .take(bytes as usize)
                .collect(),
        )
    }

    /// Writes `data` at `addr`, which must lie in one segment; the other bytes of the words it
    /// touches keep their values.
    fn write_bytes(&mut self, addr: u64, data: &[u8]) -> Option<()> {
        let (words, skip) = self.covering_mut(addr, data.len() as u64)?;
        for (k, &b) in data.iter().enumerate() {
            let at = skip + k;
            let mut le = words[at / 4].to_le_bytes();
            le[at % 4] = b;
            words[at / 4] = u32::from_le_bytes(le);
        }
        Some(())
    }
}

/// Whether a region is whole words at a word-aligned address (the fast path of the simulator).
fn aligned(r: &Region) -> bool {
    r.device_ptr() % WORD == 0 && r.bytes % WORD == 0
}

/// Work waiting on a lagging stream (kept inline: it mostly runs at once and is never stored).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Work {
    Hash {
        op: u32,
        reads: Regions,
        writes: Regions,
    },
    Copy {
        src: Region,
        dst: Region,
    },
    Memset {
        dst: Region,
        value: u32,
    },
    /// A copy from pageable host memory, its bytes staged at the call.
    Store {
        dst: Region,
        data: Vec<u8>,
    },
    /// Event records and waits, frees in stream order, user kernels: nothing to run later.
    Marker,
}

#[derive(Debug)]
struct SimStream {
    kind: StreamKind,
    /// Sequence number of the last op issued on the stream.
    issued: u64,
    /// Sequence number of the last op done.
    done: u64,
    queue: VecDeque<(u64, Work)>,
}

/// The CPU backend of a session.
#[derive(Debug)]
pub(crate) struct SimBackend {
    device: DeviceCachingAllocator<SimArena>,
    pinned: HostCachingAllocator<SimArena>,
    /// By stream key; 0 is the legacy default stream.
    streams: Vec<SimStream>,
    /// By event key: the stream and sequence number captured by the last record.
    events: Vec<Option<(u32, u64)>>,
    /// Run the work on the simulated memory (`false`: keep the allocators, issue nothing: launches,
    /// event records and waits return at once, for measuring the session's own cost;
    /// [`SessionConfig::sim_execute`](super::SessionConfig::sim_execute)).
    execute: bool,
}

fn not_simulated(what: &str) -> SessionError {
    SessionError::InvalidArgument(format!(
        "{what}: the simulator has no memory behind external regions"
    ))
}

impl SimBackend {
    pub(crate) fn new(device_bytes: u64, pinned_bytes: u64) -> Self {
        SimBackend {
            device: DeviceCachingAllocator::new(SimArena::new(
                MemoryKind::Device,
                crate::alloc::space::DEVICE_BASE,
                device_bytes,
            )),
            pinned: HostCachingAllocator::new(SimArena::new(
                MemoryKind::Pinned,
                crate::alloc::space::PINNED_BASE,
                pinned_bytes,
            )),
            streams: vec![SimStream {
                kind: StreamKind::LegacyDefault,
                issued: 0,
                done: 0,
                queue: VecDeque::new(),
            }],
            events: Vec::new(),
            execute: true,
        }
    }

    /// Whether work runs on the simulated memory (see [`SimBackend::execute`]).
    pub(crate) fn set_execute(&mut self, execute: bool) {
        self.execute = execute;
    }

    pub(crate) fn create_stream(&mut self, key: u32, kind: StreamKind) {
        let k = key as usize;
        while self.streams.len() <= k {
            self.streams.push(SimStream {
                kind: StreamKind::NonBlocking,
                issued: 0,
                done: 0,
                queue: VecDeque::new(),
            });
        }
        self.streams[k].kind = kind;
    }

    pub(crate) fn create_event(&mut self, key: u32) {
        let k = key as usize;
        if self.events.len() <= k {
            self.events.resize(k + 1, None);
        }
        self.events[k] = None;
    }

    pub(crate) fn destroy_event(&mut self, key: u32) {
        if let Some(e) = self.events.get_mut(key as usize) {
            *e = None;
        }
    }

    pub(crate) fn alloc_device(
        &mut self,
        bytes: u64,
        stream: u32,
    ) -> Result<Option<Block>, AllocError<SimOutOfMemory>> {
        self.device.allocate(bytes, stream)
    }

    pub(crate) fn alloc_pinned(
        &mut self,
        bytes: u64,
    ) -> Result<Option<Block>, AllocError<SimOutOfMemory>> {
        self.pinned.allocate(bytes)
    }

    /// Frees a block: device memory to `to` (stream order) or its owner (caching), pinned memory
    /// to the host pool. `fences` are the streams named by `record_stream`: their work so far
    /// runs first, so the block is reused only after it.
    pub(crate) fn free(
        &mut self,
        region: &Region,
        to: Option<u32>,
        fences: &[u32],
    ) -> Result<(), String> {
        for &s in fences {
            self.flush(s, u64::MAX);
        }
        if let Some(s) = to {
            self.issue(s, Work::Marker, false);
        }
        if region.bytes == 0 {
            return Ok(());
        }
        let r = match (region.memory, to) {
            (MemoryKind::Device, Some(s)) => self.device.free(region.base, s),
            (MemoryKind::Device, None) => self.device.free_caching(region.base),
            (_, _) => self.pinned.free(region.base),
        };
        r.map_err(|e| e.to_string())
    }

    pub(crate) fn stats(&self) -> crate::alloc::AllocatorStats {
        self.device.stats()
    }

    fn arena(&mut self, memory: MemoryKind) -> &mut SimArena {
        match memory {
            MemoryKind::Device => self.device.memory_mut(),
            _ => self.pinned.memory_mut(),
        }
    }

    /// Checks that a region can be executed on: session memory inside one segment.
    pub(crate) fn check(&mut self, r: &Region, what: &str) -> Result<(), SessionError> {
        if r.external {
            return Err(not_simulated(what));
        }
        match self.arena(r.memory).covering_mut(r.device_ptr(), r.bytes) {
            Some(_) => Ok(()),
            None => Err(SessionError::InvalidArgument(format!(
                "{what}: {r:?} is not inside the simulated memory"
            ))),
        }
    }

    /// The words of a region (a host access, or a user kernel's).
    pub(crate) fn read(&mut self, r: &Region) -> Result<Vec<u32>, SessionError> {
        self.check(r, "read")?;
        Ok(self.read_now(r))
    }

    /// Writes the words of a region (a host access, or a user kernel's).
    pub(crate) fn write(&mut self, r: &Region, words: &[u32]) -> Result<(), SessionError> {
        self.check(r, "write")?;
        self.write_now(r, words);
        Ok(())
    }

    /// The bytes of a region (a host access of pinned memory).
    pub(crate) fn read_bytes(&mut self, r: &Region) -> Result<Vec<u8>, SessionError> {
        self.check(r, "read")?;
        Ok(self
            .arena(r.memory)
            .read_bytes(r.device_ptr(), r.bytes)
            .unwrap_or_default())
    }

    /// Writes the bytes of a region (a host access of pinned memory).
    pub(crate) fn write_bytes(&mut self, r: &Region, data: &[u8]) -> Result<(), SessionError> {
        self.check(r, "write")?;
        let n = data.len().min(r.bytes as usize);
        self.arena(r.memory).write_bytes(r.device_ptr(), &data[..n]);
        Ok(())
    }

    /// The region as words: its bytes from the first, the last word padded with zeros.
    fn read_now(&mut self, r: &Region) -> Vec<u32> {
        if aligned(r) {
            return self
                .arena(r.memory)
                .words_mut(r.device_ptr(), r.words())
                .map(|w| w.to_vec())
                .unwrap_or_default();
        }
        let bytes = self
            .arena(r.memory)
            .read_bytes(r.device_ptr(), r.bytes)
            .unwrap_or_default();
        bytes
            .chunks(WORD as usize)
            .map(|c| {
                let mut le = [0u8; 4];
                le[..c.len()].copy_from_slice(c);
                u32::from_le_bytes(le)
            })
            .collect()
    }

    /// Writes `words` over the region's bytes (the last word cut to the region's end).
    fn write_now(&mut self, r: &Region, words: &[u32]) {
        if aligned(r) {
            if let Some(dst) = self.arena(r.memory).words_mut(r.device_ptr(), r.words()) {
                let n = dst.len().min(words.len());
                dst[..n].copy_from_slice(&words[..n]);
            }
            return;
        }
        let bytes: Vec<u8> = words
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .take(r.bytes as usize)
            .collect();
        self.arena(r.memory).write_bytes(r.device_ptr(), &bytes);
    }

    fn execute(&mut self, work: &Work) {
        if !self.execute {
            return;
        }
        match work {
            Work::Hash { op, reads, writes } => {
                // Region by region, each from memory as the previous one left it, as the device
                // runs one kernel per write region.
                for (j, w) in writes.iter().enumerate() {
                    let inputs: Vec<Vec<u32>> = reads.iter().map(|r| self.read_now(r)).collect();
                    let out: Vec<u32> = (0..w.bytes.div_ceil(WORD) as u32)
                        .map(|i| {
                            hash_word(
                                *op,
                                j as u32,
                                i,
                                inputs.iter().map(|r| r.get(i as usize).copied()),
                            )
                        })
                        .collect();
                    self.write_now(w, &out);
                }
            }
            Work::Copy { src, dst } => {
                let words = self.read_now(src);
                self.write_now(dst, &words);
            }
            Work::Memset { dst, value } => {
                let words = vec![*value; dst.bytes.div_ceil(WORD) as usize];
                self.write_now(dst, &words);
            }
            Work::Store { dst, data } => {
                let n = data.len().min(dst.bytes as usize);
                self.arena(dst.memory)
                    .write_bytes(dst.device_ptr(), &data[..n]);
            }
            Work::Marker => {}
        }
    }

    /// Runs the queued work of stream `s` up to sequence number `upto`.
    fn flush(&mut self, s: u32, upto: u64) {
        let Some(stream) = self.streams.get_mut(s as usize) else {
            return;
        };
        let mut done = Vec::new();
        while let Some(&(seq, _)) = stream.queue.front() {
            if seq > upto {
                break;
            }
            if let Some(item) = stream.queue.pop_front() {
                done.push(item);
            }
        }
        for (seq, work) in done {
            self.execute(&work);
            self.streams[s as usize].done = seq;
        }
    }

    fn flush_where(&mut self, pick: impl Fn(u32, &SimStream) -> bool) {
        let keys: Vec<u32> = (0..self.streams.len() as u32)
            .filter(|&k| pick(k, &self.streams[k as usize]))
            .collect();
        for k in keys {
            self.flush(k, u64::MAX);
        }
    }

    /// Rule 5: an op on the legacy default stream waits for the blocking streams, and an op on a
    /// blocking stream waits for the legacy default stream.
    fn legacy_deps(&mut self, s: u32) {
        match self.streams.get(s as usize).map(|st| st.kind) {
            Some(StreamKind::LegacyDefault) => {
                self.flush_where(|_, st| st.kind == StreamKind::Blocking)
            }
            Some(StreamKind::Blocking) => self.flush(0, u64::MAX),
            _ => {}
        }
    }

    /// Issues work on stream `s`: runs it now, or queues it behind a lag (`lag` starts one).
    fn issue(&mut self, s: u32, work: Work, lag: bool) {
        self.legacy_deps(s);
        let Some(stream) = self.streams.get_mut(s as usize) else {
            return;
        };
        stream.issued += 1;
        let seq = stream.issued;
        if lag || !stream.queue.is_empty() {
            stream.queue.push_back((seq, work));
        } else {
            self.execute(&work);
            self.streams[s as usize].done = seq;
        }
    }

    /// Brings stream `s` up to date and counts one op run now on it (a user kernel, a copy from
    /// or to pageable memory).
    pub(crate) fn run_now(&mut self, s: u32) {
        self.legacy_deps(s);
        self.flush(s, u64::MAX);
        self.issue(s, Work::Marker, false);
    }

    pub(crate) fn hash(
        &mut self,
        s: u32,
        op: u32,
        reads: &Regions,
        writes: &Regions,
        spin: bool,
    ) -> Result<(), SessionError> {
        if !self.execute {
            return Ok(());
        }
        for r in reads.iter().chain(writes.iter()) {
            self.check(r, "launch")?;
        }
        self.issue(
            s,
            Work::Hash {
                op,
                reads: reads.clone(),
                writes: writes.clone(),
            },
            spin,
        );
        Ok(())
    }

    /// A user kernel on the simulator: the hash kernel over its declared regions (any number of
    /// reads; regions at any byte).
    pub(crate) fn hash_slices(
        &mut self,
        s: u32,
        op: u32,
        reads: &[Region],
        writes: &[Region],
    ) -> Result<(), SessionError> {
        if !self.execute {
            return Ok(());
        }
        for r in reads.iter().chain(writes) {
            self.check(r, "launch")?;
        }
        let mut rs = Regions::default();
        for r in reads {
            rs.push(*r);
        }
        let mut ws = Regions::default();
        for w in writes {
            ws.push(*w);
        }
        self.issue(
            s,
            Work::Hash {
                op,
                reads: rs,
                writes: ws,
            },
            false,
        );
        Ok(())
    }

    pub(crate) fn copy(&mut self, s: u32, src: &Region, dst: &Region) -> Result<(), SessionError> {
        self.check(src, "copy")?;
        self.check(dst, "copy")?;
        self.issue(
            s,
            Work::Copy {
                src: *src,
                dst: *dst,
            },
            false,
        );
        Ok(())
    }

    pub(crate) fn memset(&mut self, s: u32, dst: &Region, value: u32) -> Result<(), SessionError> {
        self.check(dst, "memset")?;
        self.issue(s, Work::Memset { dst: *dst, value }, false);
        Ok(())
    }

    /// Sets every byte of `dst` to `byte` on stream `s`.
    pub(crate) fn memset_byte(
        &mut self,
        s: u32,
        dst: &Region,
        byte: u8,
    ) -> Result<(), SessionError> {
        self.memset(s, dst, u32::from_ne_bytes([byte; 4]))
    }

    /// A copy from pageable host memory on stream `s`: `data` is staged now, written in stream
    /// order.
    pub(crate) fn store(&mut self, s: u32, dst: &Region, data: &[u8]) -> Result<(), SessionError> {
        if !self.execute {
            return Ok(());
        }
        self.check(dst, "memcpy_htod")?;
        self.issue(
            s,
            Work::Store {
                dst: *dst,
                data: data.to_vec(),
            },
            false,
        );
        Ok(())
    }

    /// A copy to pageable host memory on stream `s`, waited for: the stream's work up to it runs
    /// first. Returns the bytes of `src`.
    pub(crate) fn load(&mut self, s: u32, src: &Region) -> Result<Vec<u8>, SessionError> {
        if !self.execute {
            return Ok(vec![0; src.bytes as usize]);
        }
        self.check(src, "memcpy_dtoh")?;
        self.run_now(s);
        let bytes = self.read_bytes(src)?;
        self.stream_sync(s);
        Ok(bytes)
    }

    pub(crate) fn event_record(&mut self, e: u32, s: u32) {
        if !self.execute {
            return;
        }
        self.issue(s, Work::Marker, false);
        let seq = self.streams.get(s as usize).map_or(0, |st| st.issued);
        if let Some(slot) = self.events.get_mut(e as usize) {
            *slot = Some((s, seq));
        }
    }

    pub(crate) fn event_wait(&mut self, s: u32, e: u32) {
        if !self.execute {
            return;
        }
        if let Some(&Some((t, seq))) = self.events.get(e as usize) {
            self.flush(t, seq);
        }
        self.issue(s, Work::Marker, false);
    }

    pub(crate) fn event_sync(&mut self, e: u32) {
        if let Some(&Some((t, seq))) = self.events.get(e as usize) {
            self.flush(t, seq);
        }
    }

    pub(crate) fn event_query(&self, e: u32) -> bool {
        match self.events.get(e as usize) {
            Some(&Some((t, seq))) => self.streams.get(t as usize).is_none_or(|st| st.done >= seq),
            _ => true,
        }
    }

    pub(crate) fn stream_sync(&mut self, s: u32) {
        self.flush(s, u64::MAX);
        if s == 0 {
            self.flush_where(|_, st| st.kind == StreamKind::Blocking);
        }
    }

    pub(crate) fn stream_query(&self, s: u32) -> bool {
        let idle = |st: &SimStream| st.queue.is_empty();
        match self.streams.get(s as usize) {
            None => true,
            Some(st) if s == 0 => {
                idle(st)
                    && self
                        .streams
                        .iter()
                        .filter(|b| b.kind == StreamKind::Blocking)
                        .all(idle)
            }
            Some(st) => idle(st),
        }
    }

    pub(crate) fn device_sync(&mut self) {
        self.flush_where(|_, _| true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(block: &Block, memory: MemoryKind, bytes: u64) -> Region {
        Region {
            session: 1,
            key: 1,
            memory,
            base: block.addr,
            offset: 0,
            bytes,
            whole: true,
            external: false,
        }
    }

    #[test]
    fn arena_grows_with_the_address_pattern() {
        let mut a = SimArena::new(MemoryKind::Device, 0x1000, 1 << 20);
        let base = a.map_segment(4096).unwrap();
        assert_eq!(base, 0x1000);
        let w = a.words_mut(0x1008, 2).unwrap().to_vec();
        assert_eq!(w, vec![SimArena::fresh(0x1008), SimArena::fresh(0x100c)]);
        assert!(
            a.words_mut(0x1000 + 4092, 2).is_none(),
            "crosses the segment end"
        );
        assert!(a.words_mut(0x2, 1).is_none(), "below every segment");
        assert!(a.map_segment(1 << 20).is_err(), "over capacity");
        assert!(a.map_segment(u64::MAX).is_err());
    }

    #[test]
    fn a_spin_delays_its_stream_until_a_sync() {
        let mut b = SimBackend::new(1 << 30, 1 << 30);
        b.create_stream(1, StreamKind::NonBlocking);
        b.create_stream(2, StreamKind::NonBlocking);
        let x = b.alloc_device(64, 1).unwrap().unwrap();
        let y = b.alloc_device(64, 2).unwrap().unwrap();
        let (x, y) = (
            region(&x, MemoryKind::Device, 64),
            region(&y, MemoryKind::Device, 64),
        );
        let mut none = Regions::default();
        let mut xs = Regions::default();
        xs.push(x);
        let mut ys = Regions::default();
        ys.push(y);
        b.hash(1, 0, &none, &xs, false).unwrap();
        let first = b.read(&x).unwrap();
        // Stream 2 reads x after a spin: queued.
        b.hash(2, 1, &xs, &ys, true).unwrap();
        assert!(!b.stream_query(2));
        let before = b.read(&y).unwrap();
        // Stream 1 overwrites x meanwhile; stream 2 then reads the new contents.
        b.hash(1, 2, &none, &xs, false).unwrap();
        b.device_sync();
        assert!(b.stream_query(2));
        let after = b.read(&y).unwrap();
        assert_ne!(before, after);
        let mut expect = vec![0u32; 16];
        let second = b.read(&x).unwrap();
        crate::kernels::hash_region_cpu(1, 0, &[&second], &mut expect);
        assert_eq!(after, expect);
        assert_ne!(first, second);
        none.push(y);
    }

    #[test]
    fn an_event_wait_forces_the_recorded_work() {
        let mut b = SimBackend::new(1 << 30, 1 << 30);
        b.create_stream(1, StreamKind::NonBlocking);
        b.create_stream(2, StreamKind::NonBlocking);
        b.create_event(0);
        let x = b.alloc_device(64, 1).unwrap().unwrap();
        let x = region(&x, MemoryKind::Device, 64);
        let mut xs = Regions::default();
        xs.push(x);
        b.hash(1, 5, &Regions::default(), &xs, true).unwrap();
        b.event_record(0, 1);
        assert!(!b.event_query(0));
        b.event_wait(2, 0);
        assert!(b.event_query(0));
        let mut expect = vec![0u32; 16];
        crate::kernels::hash_region_cpu(5, 0, &[], &mut expect);
        assert_eq!(b.read(&x).unwrap(), expect);
    }

    #[test]
    fn the_legacy_stream_waits_for_blocking_streams() {
        let mut b = SimBackend::new(1 << 30, 1 << 30);
        b.create_stream(1, StreamKind::Blocking);
        let x = b.alloc_device(64, 1).unwrap().unwrap();
        let x = region(&x, MemoryKind::Device, 64);
        let mut xs = Regions::default();
        xs.push(x);
        b.hash(1, 5, &Regions::default(), &xs, true).unwrap();
        assert!(
            !b.stream_query(0),
            "default's query covers blocking streams"
        );
        b.memset(0, &x, 7).unwrap();
        assert!(b.stream_query(1));
        assert_eq!(b.read(&x).unwrap(), vec![7; 16]);
    }
}
