//! What the device kernels compute, defined on the CPU: the reference every backend must match.
//!
//! Memory is viewed as little-endian `u32` words. Every region handed to a kernel is 4-byte aligned
//! and a whole number of words long. The kernels in `kernels/streamsan.cu` compute these same
//! functions bit for bit; the tests in `tests/cuda_device.rs` compare the two word for word.
//!
//! | used for | device kernel | CPU reference |
//! |---|---|---|
//! | `launch` (one write region `j`) | `hash_launch` | [`hash_region_cpu`] |
//! | `launch` (all write regions) | `hash_launch` per region, in order | [`run_hash_launch_cpu`] |
//! | `memset` | `cuMemsetD32Async` of [`memset_word`] | [`memset_word`] |
//! | `free` (poisoning on) | `fill` with [`POISON`] | [`POISON`] |
//! | — | `checksum` | [`checksum`] |
//! | — | `compare` | [`count_mismatches`] |
//!
//! # Why a hash
//!
//! Word `i` of write region `j` of launch `op_id` is a hash of `(op_id, j, i)` and of word `i` of
//! each read region. So a result names its writer (two launches almost never write the same word),
//! carries its inputs (a read of stale data changes the output) and pins its position (a shifted
//! copy does not match). A race that changes which value lands in a word, or which value a launch
//! read, shows up as a mismatch against this reference.
//!
//! # Aliasing
//!
//! A launch with several write regions runs as several kernel launches, region 0 first, on one
//! stream. If a write region overlaps a read region of the same launch, later regions read what
//! earlier ones wrote; a reference executor over a memory model must apply the regions in the same
//! order, computing each from memory as the previous one left it. Within one region, word `i` may
//! alias word `i` of a read region (each word is read and then written by the same thread), but not
//! any other word: that would be a race inside the kernel, with no defined result.

/// The largest number of read regions one `hash_launch` kernel takes.
pub const MAX_READS: usize = 4;

/// The value a read region contributes at an index past its end.
pub const MISSING_READ: u32 = 0xdead_beef;

/// Seed of [`hash_word`].
pub const HASH_SEED: u32 = 0x5eed_5a17;

/// Seed of [`memset_word`] (`"mems"` in ASCII).
pub const MEMSET_SEED: u32 = 0x6d65_6d73;

/// Poison written into freed blocks.
pub const POISON: u32 = 0xDEAD_F00D;

/// One round of the MurmurHash3 (x86, 32-bit) body: folds `v` into the state `h`.
pub const fn mix(h: u32, v: u32) -> u32 {
    let x = h ^ v.wrapping_mul(0xcc9e_2d51);
    x.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64)
}

/// The MurmurHash3 finalizer: an invertible avalanche of all 32 bits.
pub const fn fmix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// Value written at word `i` of write region `j` by the launch with id `op_id`, given the words
/// read at index `i` from each read region (`None` where `i` is past that read region's end).
///
/// The read regions are folded in order: their order is part of the launch.
pub fn hash_word(op_id: u32, j: u32, i: u32, reads: impl IntoIterator<Item = Option<u32>>) -> u32 {
    let mut h = mix(mix(mix(HASH_SEED, op_id), j), i);
    for r in reads {
        h = match r {
            Some(v) => mix(h, v),
            None => mix(h, MISSING_READ),
        };
    }
    fmix(h)
}

/// The value a memset with id `op_id` writes to every word.
pub fn memset_word(op_id: u32) -> u32 {
    fmix(mix(MEMSET_SEED, op_id))
}

/// Fills write region `j` of launch `op_id`: `out[i] = hash_word(op_id, j, i, reads[..][i])`.
///
/// This is what one `hash_launch` kernel computes.
///
/// # Panics
///
/// If `out` is longer than `u32::MAX` words (word indices are 32-bit).
pub fn hash_region_cpu(op_id: u32, j: u32, reads: &[&[u32]], out: &mut [u32]) {
    assert!(
        u32::try_from(out.len()).is_ok(),
        "a region is at most u32::MAX words"
    );
    for (i, w) in out.iter_mut().enumerate() {
        *w = hash_word(op_id, j, i as u32, reads.iter().map(|r| r.get(i).copied()));
    }
}

/// Runs a whole launch on the CPU: every write region `j`, in order, through [`hash_region_cpu`].
///
/// The slices cannot alias, so this is the reference for launches whose write regions overlap
/// neither their read regions nor each other (see the module docs for the aliasing rule).
pub fn run_hash_launch_cpu(op_id: u32, reads: &[&[u32]], writes: &mut [&mut [u32]]) {
    for (j, out) in writes.iter_mut().enumerate() {
        let j = u32::try_from(j).expect("at most u32::MAX write regions");
        hash_region_cpu(op_id, j, reads, out);
    }
}

/// Checksum of a region: the wrapping sum over `i` of `fmix(words[i] ^ i)` as `u64`.
///
/// A sum does not depend on the order of its terms, so the device computes it with one atomic add
/// per warp; the index in each term still makes it sensitive to words changing places. Indices are
/// 32-bit, as on the device.
pub fn checksum(words: &[u32]) -> u64 {
    words.iter().enumerate().fold(0u64, |acc, (i, &w)| {
        acc.wrapping_add(u64::from(fmix(w ^ i as u32)))
    })
}

/// The number of indices where `a` and `b` differ, over their common length: what the `compare`
/// kernel counts.
pub fn count_mismatches(a: &[u32], b: &[u32]) -> u64 {
    a.iter().zip(b).filter(|(x, y)| x != y).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_and_fmix_pinned_values() {
        // fmix is MurmurHash3's 32-bit finalizer.
        assert_eq!(fmix(0), 0);
        assert_eq!(fmix(1), 0x514e_28b7);
        // mix(h, v) is one MurmurHash3 body round with the key premultiplied once.
        assert_eq!(mix(0, 0), 0xe654_6b64);
        assert_eq!(
            mix(HASH_SEED, 1),
            (HASH_SEED ^ 0xcc9e_2d51)
                .rotate_left(13)
                .wrapping_mul(5)
                .wrapping_add(0xe654_6b64)
        );
    }

    #[test]
    fn hash_word_pinned_values() {
        // Pinned so that the CPU reference cannot drift silently from the device kernel.
        let expect = |op, j, i, reads: &[Option<u32>]| {
            let mut h = mix(mix(mix(0x5eed_5a17, op), j), i);
            for r in reads {
                h = mix(h, r.unwrap_or(0xdead_beef));
            }
            fmix(h)
        };
        for (op, j, i, reads) in [
            (0u32, 0u32, 0u32, vec![]),
            (7, 1, 3, vec![Some(5)]),
            (u32::MAX, 3, 1 << 20, vec![Some(1), None, Some(u32::MAX)]),
        ] {
            assert_eq!(hash_word(op, j, i, reads.clone()), expect(op, j, i, &reads));
        }
    }

    #[test]
    fn hash_word_depends_on_every_input() {
        let base = hash_word(1, 0, 0, [Some(10), Some(20)]);
        assert_ne!(base, hash_word(2, 0, 0, [Some(10), Some(20)]));
        assert_ne!(base, hash_word(1, 1, 0, [Some(10), Some(20)]));
        assert_ne!(base, hash_word(1, 0, 1, [Some(10), Some(20)]));
        assert_ne!(base, hash_word(1, 0, 0, [Some(11), Some(20)]));
        assert_ne!(base, hash_word(1, 0, 0, [Some(20), Some(10)]));
        assert_ne!(base, hash_word(1, 0, 0, [Some(10)]));
        assert_ne!(base, hash_word(1, 0, 0, [Some(10), None]));
        // A missing read is the MISSING_READ word.
        assert_eq!(
            hash_word(1, 0, 0, [Some(10), None]),
            hash_word(1, 0, 0, [Some(10), Some(MISSING_READ)])
        );
    }

    #[test]
    fn memset_word_is_distinct_per_op() {
        assert_eq!(memset_word(3), fmix(mix(0x6d65_6d73, 3)));
        assert_ne!(memset_word(3), memset_word(4));
        assert_ne!(memset_word(0), POISON);
    }

    #[test]
    fn hash_region_reads_short_regions_as_missing() {
        let r0 = [1u32, 2, 3, 4];
        let r1 = [9u32];
        let mut out = [0u32; 6];
        hash_region_cpu(5, 2, &[&r0, &r1], &mut out);
        for (i, &w) in out.iter().enumerate() {
            let reads = [r0.get(i).copied(), r1.get(i).copied()];
            assert_eq!(w, hash_word(5, 2, i as u32, reads));
        }
        assert_eq!(out[5], hash_word(5, 2, 5, [None, None]));
    }

    #[test]
    fn run_hash_launch_fills_each_write_region_with_its_index() {
        let r = [7u32; 3];
        let mut w0 = [0u32; 3];
        let mut w1 = [0u32; 5];
        run_hash_launch_cpu(11, &[&r], &mut [&mut w0, &mut w1]);
        let mut e0 = [0u32; 3];
        let mut e1 = [0u32; 5];
        hash_region_cpu(11, 0, &[&r], &mut e0);
        hash_region_cpu(11, 1, &[&r], &mut e1);
        assert_eq!(w0, e0);
        assert_eq!(w1, e1);
        assert_ne!(w0[..], w1[..3]);
    }

    #[test]
    fn checksum_is_a_wrapping_sum_of_indexed_terms() {
        assert_eq!(checksum(&[]), 0);
        assert_eq!(checksum(&[0]), 0);
        assert_eq!(
            checksum(&[5, 6]),
            u64::from(fmix(5)) + u64::from(fmix(6 ^ 1))
        );
        // Words changing places changes the checksum.
        assert_ne!(checksum(&[1, 2]), checksum(&[2, 1]));
    }

    #[test]
    fn count_mismatches_counts_common_prefix() {
        assert_eq!(count_mismatches(&[1, 2, 3], &[1, 0, 3, 4]), 1);
        assert_eq!(count_mismatches(&[], &[1]), 0);
    }
}
