//! The freed names whose details are forgotten, exactly and compactly: numbered names as runs
//! of numbers per pattern (see the `names` module).

use std::collections::{BTreeMap, VecDeque};

use smol_str::SmolStr;

use super::*;

/// The freed names whose details are forgotten: each with its [`Residue`], exactly.
#[derive(Clone, Debug, Default)]
pub(super) struct Forgotten {
    /// The patterns of names with a number, by id, and their ids by hash (a pattern whose hash
    /// another took first goes to the next free hash: every pattern is compared in full).
    patterns: Vec<Pattern>,
    pattern_ids: BTreeMap<u64, u32>,
    /// By pattern id: one past its largest number kept (a loop's new names are past it).
    ends: Vec<u64>,
    /// The residues, by id, and their ids (a trace frees buffers of a few sizes on a few streams).
    residues: Vec<Residue>,
    residue_ids: BTreeMap<Residue, u32>,
    /// Runs of consecutive numbers of a pattern: (pattern, first number) → their residues.
    /// Disjoint; adjacent runs are joined where that is cheap (see [`join`]).
    runs: BTreeMap<(u32, u64), Run>,
    /// Names without a number (or with one of more than 19 digits), with their residue's id.
    others: HashMap<Id, u32>,
    /// The run the latest insertion went to: the next number of a loop extends it.
    hint: Option<(u32, u64)>,
}

/// A [`Run::Same`] up to this long becomes a [`Run::Each`] to join a neighbour.
const SHORT_RUN: u64 = 16;

/// The residues (ids) of consecutive numbers.
#[derive(Clone, Debug)]
enum Run {
    /// `len` numbers with one residue: a loop that frees buffers of one size.
    Same { id: u32, len: u64 },
    /// One residue per number (4 bytes each): buffers of differing sizes.
    Each(VecDeque<u32>),
}

impl Run {
    fn len(&self) -> u64 {
        match self {
            Run::Same { len, .. } => *len,
            Run::Each(ids) => ids.len() as u64,
        }
    }

    /// The residue id of its `k`-th number.
    fn get(&self, k: u64) -> u32 {
        match self {
            Run::Same { id, .. } => *id,
            Run::Each(ids) => ids[k as usize],
        }
    }

    /// Whether it may become a [`Run::Each`] at a cost bounded by its neighbour's.
    fn pliable(&self) -> bool {
        matches!(self, Run::Each(_)) || self.len() <= SHORT_RUN
    }

    fn into_each(self) -> VecDeque<u32> {
        match self {
            Run::Same { id, len } => std::iter::repeat_n(id, len as usize).collect(),
            Run::Each(ids) => ids,
        }
    }
}

/// Joins the adjacent runs at `a` and `b` (`b` starts where `a` ends) when that is cheap: two
/// runs of one residue, or two pliable ones (the shorter copied into the longer, so a number is
/// copied at most a logarithmic number of times). The joined run starts at `a`.
fn join(runs: &mut BTreeMap<(u32, u64), Run>, a: (u32, u64), b: (u32, u64)) {
    let (Some(ra), Some(rb)) = (runs.get(&a), runs.get(&b)) else {
        return;
    };
    if let (Run::Same { id: x, len: la }, Run::Same { id: y, len: lb }) = (ra, rb) {
        if x == y {
            let joined = Run::Same {
                id: *x,
                len: la + lb,
            };
            runs.remove(&b);
            runs.insert(a, joined);
            return;
        }
    }
    if !(ra.pliable() && rb.pliable()) {
        return;
    }
    let (Some(ra), Some(rb)) = (runs.remove(&a), runs.remove(&b)) else {
        return;
    };
    let (mut left, mut right) = (ra.into_each(), rb.into_each());
    let ids = if left.len() >= right.len() {
        left.extend(right);
        left
    } else {
        for &id in left.iter().rev() {
            right.push_front(id);
        }
        right
    };
    runs.insert(a, Run::Each(ids));
}

/// A name with its last number taken out: the text before and after it, and its width when it
/// is zero-padded (0 otherwise). With the number it gives the name back, and only that name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pattern {
    before: SmolStr,
    after: SmolStr,
    width: u8,
}

/// A [`Pattern`] borrowed from a name.
#[derive(Clone, Copy, Debug)]
struct PatternRef<'a> {
    before: &'a str,
    after: &'a str,
    width: u8,
}

impl PatternRef<'_> {
    fn hash(&self) -> u64 {
        use std::hash::Hasher;
        #[cfg(test)]
        if crate::checker::tests::WEAK_NAME_HASH.with(|w| w.get()) {
            // Every pattern clashes.
            return 7;
        }
        let mut h = rustc_hash::FxHasher::default();
        h.write(self.before.as_bytes());
        h.write_u8(0xff);
        h.write(self.after.as_bytes());
        h.write_u8(self.width);
        h.finish()
    }

    fn is(&self, p: &Pattern) -> bool {
        self.width == p.width && self.before == p.before && self.after == p.after
    }
}

/// `name` as a pattern and a number: split at its last run of decimal digits.
fn split(name: &str) -> Option<(PatternRef<'_>, u64)> {
    let b = name.as_bytes();
    let mut end = b.len();
    while end > 0 && !b[end - 1].is_ascii_digit() {
        end -= 1;
    }
    let mut start = end;
    while start > 0 && b[start - 1].is_ascii_digit() {
        start -= 1;
    }
    let digits = &b[start..end];
    // At most 19 digits: the number and one past it fit in a u64.
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    let width = if digits.len() > 1 && digits[0] == b'0' {
        digits.len() as u8
    } else {
        0
    };
    // ASCII digits border on character boundaries.
    let pattern = PatternRef {
        before: &name[..start],
        after: &name[end..],
        width,
    };
    Some((pattern, n))
}

impl Forgotten {
    pub(super) fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.others.is_empty()
    }

    /// Entries kept: runs and names without a number.
    pub(super) fn len(&self) -> usize {
        self.runs.len() + self.others.len()
    }

    /// The id of a pattern, if it has one; else the free hash where it would go.
    fn pattern_id(&self, pattern: PatternRef<'_>) -> Result<u32, u64> {
        // Mostly the pattern of the latest insertion: a loop's.
        if let Some((p, _)) = self.hint {
            if pattern.is(&self.patterns[p as usize]) {
                return Ok(p);
            }
        }
        let mut h = pattern.hash();
        while let Some(&id) = self.pattern_ids.get(&h) {
            if pattern.is(&self.patterns[id as usize]) {
                return Ok(id);
            }
            h = h.wrapping_add(1);
        }
        Err(h)
    }

    pub(super) fn get(&self, name: &Id) -> Option<Residue> {
        let id = match split(name.as_str()) {
            None => *self.others.get(name)?,
            Some((pattern, n)) => {
                let p = self.pattern_id(pattern).ok()?;
                if n >= self.ends[p as usize] {
                    return None;
                }
                let (&(q, start), run) = self.runs.range(..=(p, n)).next_back()?;
                if q != p || n - start >= run.len() {
                    return None;
                }
                run.get(n - start)
            }
        };
        Some(self.residues[id as usize])
    }

    fn residue_id(&mut self, r: Residue) -> u32 {
        if let Some(&last) = self.residues.last() {
            // Most frees of a loop free alike.
            if last == r {
                return self.residues.len() as u32 - 1;
            }
        }
        let residues = &mut self.residues;
        *self.residue_ids.entry(r).or_insert_with(|| {
            residues.push(r);
            residues.len() as u32 - 1
        })
    }

    /// Adds `name` with residue `r` (or gives it `r`, if it is there).
    pub(super) fn insert(&mut self, name: &Id, r: Residue) {
        let id = self.residue_id(r);
        let Some((pattern, n)) = split(name.as_str()) else {
            self.others.insert(name.clone(), id);
            return;
        };
        let p = match self.pattern_id(pattern) {
            Ok(p) => p,
            Err(h) => {
                let p = self.patterns.len() as u32;
                self.patterns.push(Pattern {
                    before: SmolStr::new(pattern.before),
                    after: SmolStr::new(pattern.after),
                    width: pattern.width,
                });
                self.pattern_ids.insert(h, p);
                self.ends.push(0);
                p
            }
        };
        let end = &mut self.ends[p as usize];
        // No run from n on when n is past them all.
        let past = *end <= n;
        *end = (*end).max(n + 1);
        // The number after the latest run's, with no run from there on: a loop's next name.
        if let Some(hint) = self.hint.filter(|h| h.0 == p) {
            let free = past || {
                let next = self.runs.range((p, n)..).next().map(|(&k, _)| k);
                next.is_none_or(|(q, m)| q != p || m > n + 1)
            };
            match self.runs.get_mut(&hint) {
                Some(Run::Same { id: same, len }) if free && *same == id && hint.1 + *len == n => {
                    *len += 1;
                    return;
                }
                Some(Run::Each(ids)) if free && hint.1 + ids.len() as u64 == n => {
                    ids.push_back(id);
                    return;
                }
                _ => {}
            }
        }
        self.insert_slow(p, n, id);
    }

    fn insert_slow(&mut self, p: u32, n: u64, id: u32) {
        let runs = &mut self.runs;
        // A number of a run takes the new residue there, or is split out of a run of one.
        if let Some((&(q, start), run)) = runs.range_mut(..=(p, n)).next_back() {
            if q == p && n - start < run.len() {
                match run {
                    Run::Each(ids) => {
                        ids[(n - start) as usize] = id;
                        return;
                    }
                    &mut Run::Same { id: old, len } => {
                        if old == id {
                            return;
                        }
                        runs.remove(&(p, start));
                        if start < n {
                            let len = n - start;
                            runs.insert((p, start), Run::Same { id: old, len });
                        }
                        let after = start + len - (n + 1);
                        if after > 0 {
                            runs.insert(
                                (p, n + 1),
                                Run::Same {
                                    id: old,
                                    len: after,
                                },
                            );
                        }
                    }
                }
            }
        }
        // A run of its own, joined with its neighbours where that is cheap.
        runs.insert((p, n), Run::Same { id, len: 1 });
        let mut at = (p, n);
        if let Some((&(q, start), before)) = runs.range(..(p, n)).next_back() {
            if q == p && start + before.len() == n {
                join(runs, (p, start), at);
                if !runs.contains_key(&at) {
                    at = (p, start);
                }
            }
        }
        let end = at.1 + runs.get(&at).map_or(0, Run::len);
        join(runs, at, (p, end));
        self.hint = Some(at);
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn r(size: u64) -> Residue {
        Residue {
            size,
            owner: Participant(1),
            memory: MemoryKind::Device,
        }
    }

    #[test]
    fn a_name_and_its_pattern_give_each_other() {
        for (name, before, n, after, width) in [
            ("b17", "b", 17, "", 0),
            ("7", "", 7, "", 0),
            ("0", "", 0, "", 0),
            ("t000123", "t", 123, "", 6),
            ("t00", "t", 0, "", 2),
            ("layer3.weight", "layer", 3, ".weight", 0),
            ("a1b22c", "a1b", 22, "c", 0),
            (
                "x9999999999999999999",
                "x",
                9_999_999_999_999_999_999,
                "",
                0,
            ),
        ] {
            let (p, m) = split(name).expect(name);
            assert_eq!((p.before, m, p.after, p.width), (before, n, after, width));
            let digits = if p.width == 0 {
                m.to_string()
            } else {
                format!("{m:0w$}", w = p.width as usize)
            };
            assert_eq!(format!("{}{digits}{}", p.before, p.after), name);
        }
        for name in ["x", "", "x99999999999999999999", "é"] {
            assert!(split(name).is_none(), "{name}");
        }
    }

    /// Runs extend, join and split; every name keeps its own residue. Also when every pattern's
    /// hash clashes.
    #[test]
    fn runs_keep_each_name_exactly() {
        runs_keep_each_name(false);
        crate::checker::tests::WEAK_NAME_HASH.with(|w| w.set(true));
        runs_keep_each_name(true);
        crate::checker::tests::WEAK_NAME_HASH.with(|w| w.set(false));
    }

    fn runs_keep_each_name(weak: bool) {
        let mut f = Forgotten::default();
        let mut want: std::collections::HashMap<String, u64> = Default::default();
        let mut rng = crate::workload::SplitMix::new(7);
        let check = |f: &Forgotten, want: &std::collections::HashMap<String, u64>| {
            for (name, &size) in want {
                assert_eq!(f.get(&Id::from(name.as_str())), Some(r(size)), "{name}");
            }
            // Runs never overlap, and adjacent runs of one residue never stay apart.
            let runs: Vec<_> = f.runs.iter().collect();
            for w in runs.windows(2) {
                let (&(p, start), a) = w[0];
                let (&(q, next), b) = w[1];
                assert!(p != q || start + a.len() <= next, "overlapping runs {w:?}");
                if let (Run::Same { id: x, .. }, Run::Same { id: y, .. }) = (a, b) {
                    assert!(!(p == q && start + a.len() == next && x == y), "{w:?}");
                }
            }
        };
        for round in 0..6000 {
            let sizes = 1 + (round / 1500) as u64;
            let mut names = vec![match rng.below(4) {
                0 => format!("b{}", rng.below(300)),
                1 => format!("t{:03}", rng.below(200)),
                2 => format!("b{}.w", rng.below(50)),
                _ => ["x", "y", "z"][rng.below(3) as usize].to_string(),
            }];
            if rng.below(40) == 0 {
                // A burst of consecutive numbers: long runs, split later.
                let first = rng.below(300);
                names.extend((first..first + 40).map(|k| format!("b{k}")));
            }
            let size = 512 * (1 + rng.below(sizes));
            for name in names {
                f.insert(&Id::from(name.as_str()), r(size));
                want.insert(name, size);
            }
            if rng.below(50) == 0 {
                check(&f, &want);
            }
        }
        check(&f, &want);
        // b#, b#.w, t# and t# zero-padded to 3 digits.
        assert_eq!(f.patterns.len(), 4);
        if weak {
            assert!(f.pattern_ids.keys().all(|&h| (7..11).contains(&h)));
        }
        for name in ["b400", "t200", "t0200", "b00", "b50.w", "w", "b-1"] {
            assert_eq!(f.get(&Id::from(name)), None, "{name}");
        }
    }

    #[test]
    fn a_numbered_loop_keeps_one_run() {
        let mut f = Forgotten::default();
        for i in 0..10_000 {
            f.insert(&Id::from(format!("b{i}")), r(4096));
        }
        assert_eq!(f.len(), 1);
        // One name of it freed again with another size splits the run, and nothing else.
        f.insert(&Id::from("b5000"), r(512));
        assert_eq!(f.len(), 3);
        assert!(f.runs.values().all(|r| matches!(r, Run::Same { .. })));
        assert_eq!(f.get(&Id::from("b5000")), Some(r(512)));
        assert_eq!(f.get(&Id::from("b5001")), Some(r(4096)));
        // Out of order, with the gaps filled last; with one size, and with sizes that differ.
        for sizes in [1, 3] {
            let mut g = Forgotten::default();
            for i in (0..1000).step_by(2).chain((1..1000).step_by(2)) {
                g.insert(&Id::from(format!("c{i}")), r(512 * (1 + i % sizes)));
            }
            assert_eq!(g.len(), 1, "{sizes}");
            for i in 0..1000 {
                let name = Id::from(format!("c{i}"));
                assert_eq!(g.get(&name), Some(r(512 * (1 + i % sizes))));
            }
        }
    }
}
