//! Simulated memory: one arena per memory kind, segments backed by words grown on demand.
//!
//! Segments lie where the model's address space of the kind puts them ([`crate::alloc::space`]),
//! so simulated addresses are the checker's. Every word holds its value and a tag: the buffer
//! generation whose access last wrote it. Never-written memory holds a pattern of its address
//! ([`Arena::fresh`]), so runs are deterministic.
//!
//! Reads come in two kinds. A *raw* read returns the value, whatever wrote it, as a GPU does (a
//! session's memory). A *tagged* read by generation `g` returns the value only if `g` wrote it,
//! and otherwise a pattern of `g`, the address and how many writes the word has received so far
//! ([`Arena::unwritten`]), counting an uninitialized read. A program's reads of memory it never
//! wrote then do not depend on *what* an earlier owner left there (a race among an earlier
//! owner's accesses does not spread to the next owner), only on *where* they fall among the
//! writes to those words: where every conflicting access is ordered — a program free of hazards —
//! that is the same in every run, and where a write by another buffer lands on the other side of
//! the read in some run (a read racing its own allocation, or the previous owner's late write)
//! the read sees another pattern, as a GPU's read would see other bytes. A write by an earlier
//! owner that lands after `g` wrote (a reuse race) still clobbers `g`'s data.
//!
//! Write counts are kept only where reads are tagged ([`Arena::count_writes`]): a session's
//! memory keeps values and tags.

use std::collections::BTreeMap;

use crate::alloc::{space, Memory, ModelMemory};
use crate::kernels::fmix;
use crate::trace::MemoryKind;

/// The bytes of a word.
const WORD: u64 = 4;

/// The tag of memory no buffer has written.
pub(crate) const UNWRITTEN: u32 = u32::MAX;

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

/// One segment: its size and the words touched so far from its base.
#[derive(Debug, Default)]
struct Segment {
    size: u64,
    values: Vec<u32>,
    tags: Vec<u32>,
    /// Writes each word has received (wrapping), where the arena counts them.
    writes: Vec<u32>,
}

/// The words of a range: values, tags and (where counted) write counts.
struct Words<'a> {
    values: &'a mut [u32],
    tags: &'a mut [u32],
    /// Empty where the arena does not count writes.
    writes: &'a mut [u32],
}

impl Words<'_> {
    /// Words `k..` of the range become generation `gen`'s, written once more.
    fn written(&mut self, k: usize, n: usize, gen: u32) {
        self.tags[k..k + n].fill(gen);
        if let Some(w) = self.writes.get_mut(k..k + n) {
            for c in w {
                *c = c.wrapping_add(1);
            }
        }
    }
}

/// Segments of one memory kind.
#[derive(Debug)]
pub(crate) struct Arena {
    memory: MemoryKind,
    model: ModelMemory,
    capacity: u64,
    segments: BTreeMap<u64, Segment>,
    /// Tagged reads of words the reading generation had not written.
    pub(crate) uninitialized: u64,
    /// Count the writes each word receives, which tagged reads of words their generation did not
    /// write depend on (a program run's memory).
    pub(crate) count_writes: bool,
}

impl Memory for Arena {
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
        self.segments.insert(
            base,
            Segment {
                size: bytes,
                ..Segment::default()
            },
        );
        Ok(base)
    }
}

impl Arena {
    /// An empty arena of `memory` at the model's base, of at most `capacity` bytes.
    pub(crate) fn new(memory: MemoryKind, capacity: u64) -> Self {
        Arena {
            memory,
            model: ModelMemory::of(memory),
            capacity,
            segments: BTreeMap::new(),
            uninitialized: 0,
            count_writes: false,
        }
    }

    /// The address the next segment gets.
    pub(crate) fn next_base(&self) -> u64 {
        self.model.next_base()
    }

    /// The contents of never-written memory: a pattern of the address.
    pub(crate) fn fresh(addr: u64) -> u32 {
        fmix((addr >> 2) as u32 ^ 0xa5a5_0000)
    }

    /// What a tagged read by generation `gen` sees at `addr` when `gen` did not write it and the
    /// word has received `writes` writes so far: a pattern of the three, so that a read that
    /// falls before another buffer's write in one run and after it in another sees different
    /// words (see the module docs).
    fn unwritten(addr: u64, gen: u32, writes: u32) -> u32 {
        fmix(
            gen.wrapping_mul(0x9e37_79b9)
                ^ (addr >> 2) as u32
                ^ fmix(writes.wrapping_mul(0x85eb_ca6b) ^ 0x1b87_3593),
        )
    }

    /// Makes `[base, base + bytes)` usable as one segment where a program places memory itself
    /// (from the base of the kind's space).
    pub(crate) fn place(&mut self, bytes: u64) {
        let base = space::base(self.memory);
        let seg = self.segments.entry(base).or_default();
        seg.size = seg.size.max(bytes);
    }

    /// The values, tags and write counts of the words `[addr, addr + 4 * words)`, which must lie
    /// in one segment and start at a word.
    fn words_mut(&mut self, addr: u64, words: u64) -> Option<Words<'_>> {
        if words == 0 {
            return Some(Words {
                values: &mut [],
                tags: &mut [],
                writes: &mut [],
            });
        }
        let (&base, seg) = self.segments.range_mut(..=addr).next_back()?;
        let end = addr.checked_add(words.checked_mul(WORD)?)?;
        if end > base.saturating_add(seg.size) || addr % WORD != 0 {
            return None;
        }
        let first = ((addr - base) / WORD) as usize;
        let last = ((end - base) / WORD) as usize;
        if seg.values.len() < last {
            let from = seg.values.len();
            seg.values
                .extend((from..last).map(|k| Arena::fresh(base + WORD * k as u64)));
            seg.tags.resize(last, UNWRITTEN);
        }
        let writes: &mut [u32] = if self.count_writes {
            if seg.writes.len() < last {
                seg.writes.resize(last, 0);
            }
            &mut seg.writes[first..last]
        } else {
            &mut []
        };
        Some(Words {
            values: &mut seg.values[first..last],
            tags: &mut seg.tags[first..last],
            writes,
        })
    }

    /// Whether `[addr, addr + bytes)` lies in one segment.
    pub(crate) fn contains(&self, addr: u64, bytes: u64) -> bool {
        let Some((&base, seg)) = self.segments.range(..=addr).next_back() else {
            return false;
        };
        addr.checked_add(bytes)
            .is_some_and(|end| end <= base.saturating_add(seg.size))
    }

    /// Reads the word at `addr` (a word boundary inside a segment): raw, or as generation `gen`
    /// sees it.
    pub(crate) fn read_word(&mut self, addr: u64, gen: Option<u32>) -> u32 {
        let Some(w) = self.words_mut(addr, 1) else {
            return 0;
        };
        let (v, t, n) = (
            w.values[0],
            w.tags[0],
            w.writes.first().copied().unwrap_or(0),
        );
        match gen {
            Some(g) if t != g => {
                self.uninitialized += 1;
                Arena::unwritten(addr, g, n)
            }
            _ => v,
        }
    }

    /// Writes the word at `addr` as generation `gen`'s.
    #[cfg(test)]
    pub(crate) fn write_word(&mut self, addr: u64, value: u32, gen: u32) {
        if let Some(mut w) = self.words_mut(addr, 1) {
            w.values[0] = value;
            w.written(0, 1, gen);
        }
    }

    /// The raw values of the whole words covering `[addr, addr + bytes)` and the offset of `addr`
    /// in the first one.
    fn covering_mut(&mut self, addr: u64, bytes: u64) -> Option<(Words<'_>, usize)> {
        let first = addr - addr % WORD;
        let end = addr.checked_add(bytes)?.checked_next_multiple_of(WORD)?;
        let w = self.words_mut(first, (end - first) / WORD)?;
        Some((w, (addr - first) as usize))
    }

    /// The raw bytes of `[addr, addr + bytes)`, which must lie in one segment (words are stored
    /// little-endian, as on the device).
    pub(crate) fn read_bytes(&mut self, addr: u64, bytes: u64) -> Option<Vec<u8>> {
        let (words, skip) = self.covering_mut(addr, bytes)?;
        Some(
            words
                .values
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .skip(skip)
                .take(bytes as usize)
                .collect(),
        )
    }

    /// Writes `data` at `addr`, which must lie in one segment; the other bytes of the words it
    /// touches keep their values. The words become generation `gen`'s.
    pub(crate) fn write_bytes(&mut self, addr: u64, data: &[u8], gen: u32) -> Option<()> {
        let (mut words, skip) = self.covering_mut(addr, data.len() as u64)?;
        for (k, &b) in data.iter().enumerate() {
            let at = skip + k;
            let mut le = words.values[at / 4].to_le_bytes();
            le[at % 4] = b;
            words.values[at / 4] = u32::from_le_bytes(le);
        }
        // Each word touched is written once.
        let n = words.values.len();
        words.written(0, n, gen);
        Some(())
    }

    /// The raw values of `words` words at the word-aligned `addr`.
    pub(crate) fn read_words(&mut self, addr: u64, words: u64) -> Option<Vec<u32>> {
        self.words_mut(addr, words).map(|w| w.values.to_vec())
    }

    /// Writes `values` at the word-aligned `addr` as generation `gen`'s.
    pub(crate) fn write_words(&mut self, addr: u64, values: &[u32], gen: u32) -> Option<()> {
        let mut w = self.words_mut(addr, values.len() as u64)?;
        w.values.copy_from_slice(values);
        w.written(0, values.len(), gen);
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_grows_with_the_address_pattern() {
        let mut a = Arena::new(MemoryKind::Device, 1 << 20);
        let base = a.map_segment(4096).unwrap();
        assert_eq!(base, space::DEVICE_BASE);
        let w = a.read_words(base + 8, 2).unwrap();
        assert_eq!(w, vec![Arena::fresh(base + 8), Arena::fresh(base + 12)]);
        assert!(
            a.read_words(base + 4092, 2).is_none(),
            "crosses the segment end"
        );
        assert!(a.read_words(0x2, 1).is_none(), "below every segment");
        assert!(a.map_segment(1 << 20).is_err(), "over capacity");
        assert!(a.map_segment(u64::MAX).is_err());
    }

    #[test]
    fn tagged_reads_see_only_their_generation() {
        let mut a = Arena::new(MemoryKind::Device, u64::MAX);
        let base = a.map_segment(64).unwrap();
        a.write_word(base, 7, 1);
        assert_eq!(a.read_word(base, Some(1)), 7);
        assert_eq!(a.read_word(base, None), 7);
        assert_eq!(a.uninitialized, 0);
        let other = a.read_word(base, Some(2));
        assert_ne!(other, 7, "generation 2 never wrote it");
        assert_eq!(a.uninitialized, 1);
        assert_eq!(a.read_word(base + 4, None), Arena::fresh(base + 4));
    }

    #[test]
    fn unwritten_words_show_where_other_writes_fell() {
        let mut a = Arena::new(MemoryKind::Device, u64::MAX);
        a.count_writes = true;
        let base = a.map_segment(64).unwrap();
        // Generation 2 reads a word nobody wrote, then one generation 1 wrote: the reads differ,
        // so a read that lands before another buffer's write in one run and after it in another
        // observes different data.
        let fresh = a.read_word(base, Some(2));
        a.write_word(base, 7, 1);
        let after_one = a.read_word(base, Some(2));
        assert_ne!(fresh, after_one);
        assert_ne!(after_one, 7, "not the other generation's value");
        // Not what it was written with, whatever that was: only how many writes fell before.
        let mut b = Arena::new(MemoryKind::Device, u64::MAX);
        b.count_writes = true;
        assert_eq!(b.map_segment(64).unwrap(), base);
        b.write_word(base, 8, 3);
        assert_eq!(b.read_word(base, Some(2)), after_one);
        // A byte write counts once per word it touches; its own generation reads its value.
        a.write_bytes(base + 2, &[1, 2, 3], 2).unwrap();
        assert_eq!(a.read_word(base + 4, Some(2)), a.read_word(base + 4, None));
        a.write_word(base + 4, 9, 1);
        assert_ne!(a.read_word(base + 4, Some(2)), fresh);
        // Without counting (a session's memory), the pattern is the address's and the generation's.
        let mut c = Arena::new(MemoryKind::Device, u64::MAX);
        assert_eq!(c.map_segment(64).unwrap(), base);
        let before = c.read_word(base, Some(2));
        c.write_word(base, 7, 1);
        assert_eq!(c.read_word(base, Some(2)), before);
    }

    #[test]
    fn bytes_keep_the_rest_of_their_words() {
        let mut a = Arena::new(MemoryKind::Pinned, u64::MAX);
        let base = a.map_segment(64).unwrap();
        a.write_words(base, &[0x0403_0201, 0x0807_0605], 0).unwrap();
        a.write_bytes(base + 3, &[0xaa, 0xbb], 0).unwrap();
        assert_eq!(
            a.read_bytes(base + 2, 4).unwrap(),
            vec![0x03, 0xaa, 0xbb, 0x06]
        );
        assert_eq!(
            a.read_words(base, 2).unwrap(),
            vec![0xaa03_0201, 0x0807_06bb]
        );
    }
}
