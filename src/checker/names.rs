//! Buffer names: what each name refers to now (a live, external or freed buffer), the details of
//! the most recent frees, and the compact record of the older freed names.
//!
//! A freed name must stay known to the end of the trace: a later use of it is `use-after-free`
//! (the same name never seen would be external, which is legal) and a second free is
//! `invalid-free`. Besides that, a freed name decides its size (a region past its end is bad
//! input: docs/trace-format.md, "Choices where the format is silent") and whether the host may
//! access its memory (a host access of device memory is bad input); its owner names the
//! participant of an `invalid-free` of it. That is its [`Residue`]. Everything else — the op,
//! participant and site of its free — only words reports. So the checker keeps those details for
//! the [`FREED_KEPT`] most recent frees (a ring, [`Name::Freed`]) and then forgets them: an older
//! freed name keeps its residue only ([`Name::Forgotten`]), and a report of it says that it was
//! freed at an op no longer kept.
//!
//! The forgotten names are kept exactly, never by hash alone (a hash that clashed would turn an
//! external buffer into a use after free). A name with decimal digits in it is a *pattern* — the
//! text before and after its last number, and the number's width when it is zero-padded — and a
//! number: `b17` is `b#` and 17, `layer3.weight` is `layer#.weight` and 3, `t000123` is `t#`
//! (width 6) and 123. Consecutive numbers of one pattern are one run: with one residue, a loop
//! that allocates, uses and frees a new name each time (`b0`, `b1`, …) keeps one run however long
//! it runs; with residues that differ (buffers of several sizes), a run keeps a 4-byte residue id
//! per number. Names without digits are kept one by one (a few dozen bytes each): what a freed
//! name decides has to be kept, and nothing in such names lets them share.
//!
//! Pool buffers of CUDA graphs are never forgotten: their generation outlives the free (the
//! graph's replays keep accessing their bytes), and the name leads to it.

use super::*;

mod forgotten;

use forgotten::Forgotten;

/// How many of the most recently freed names keep the details of their free, by default.
pub(super) const FREED_KEPT: usize = 1024;

/// [`Name::Freed`] slots of pool buffers have this bit set; the others are slots of the ring.
const POOL_SLOT: u32 = 1 << 31;

/// What a buffer name refers to now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Name {
    Live(GenId),
    External(GenId),
    /// Freed, with the details of its free: the slot of its [`FreedName`].
    Freed(u32),
    /// Freed long ago: only its [`Residue`] is left. Never stored in the table: what
    /// [`Checker::lookup`] answers for a name found among the forgotten ones.
    Forgotten,
}

/// What remains of a freed name: enough to report use-after-free and invalid-free.
#[derive(Clone, Debug)]
pub(super) struct FreedName {
    pub name: Id,
    pub size: u64,
    pub memory: MemoryKind,
    pub owner: Participant,
    pub free_op: u64,
    pub free_by: Participant,
    pub free_site: Option<Arc<Site>>,
    /// A pool buffer's generation, which outlives its free ([`NO_GEN`] for other buffers).
    pub pool_gen: u32,
}

/// [`FreedName::pool_gen`] of a buffer that is not a pool buffer.
pub(super) const NO_GEN: u32 = u32::MAX;

impl FreedName {
    fn residue(&self) -> Residue {
        Residue {
            size: self.size,
            owner: self.owner,
            memory: self.memory,
        }
    }
}

/// What a forgotten freed name still decides: its size (a region past its end is bad input), its
/// memory kind (the host may not access device memory) and its owner (the participant of a
/// caching free of device memory, which an `invalid-free` of it names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Residue {
    pub size: u64,
    pub owner: Participant,
    pub memory: MemoryKind,
}

/// Buffer names and what they refer to. A name is stored once, by the generation or the freed
/// record it refers to: the table keys it by its hash, and a name whose hash another name took
/// first goes to `clash` (a million live buffers would otherwise pay for each name twice).
#[derive(Clone, Debug)]
pub(super) struct Names {
    by_hash: HashMap<u64, Name>,
    clash: HashMap<Id, Name>,
    /// The most recent frees with their details: a ring of `keep` slots, `cursor` the next one.
    /// `None`: the slot's name was allocated again.
    recent: Vec<Option<FreedName>>,
    cursor: usize,
    keep: usize,
    /// Freed pool buffers (slots with [`POOL_SLOT`]), never forgotten, and their slots free for
    /// reuse.
    pool: Vec<FreedName>,
    pool_slots: Vec<u32>,
    /// The freed names whose details are forgotten.
    forgotten: Forgotten,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            by_hash: HashMap::default(),
            clash: HashMap::default(),
            recent: Vec::new(),
            cursor: 0,
            keep: FREED_KEPT,
            pool: Vec::new(),
            pool_slots: Vec::new(),
            forgotten: Forgotten::default(),
        }
    }
}

fn name_hash(name: &Id) -> u64 {
    use std::hash::BuildHasher;
    #[cfg(test)]
    if tests::WEAK_NAME_HASH.with(|w| w.get()) {
        // Every name of one length clashes: the tests' way to reach `Names::clash`.
        return name.as_str().len() as u64;
    }
    rustc_hash::FxBuildHasher.hash_one(name)
}

impl Names {
    /// The freed name of a [`Name::Freed`] slot.
    fn slot(&self, f: u32) -> Option<&FreedName> {
        if f & POOL_SLOT != 0 {
            self.pool.get((f & !POOL_SLOT) as usize)
        } else {
            self.recent.get(f as usize).and_then(Option::as_ref)
        }
    }

    /// Freed names that keep the details of their free, and entries (runs and single names) of
    /// the forgotten ones.
    pub(super) fn counts(&self) -> (usize, usize) {
        let kept = self.recent.iter().flatten().count() + self.pool.len() - self.pool_slots.len();
        (kept, self.forgotten.len())
    }
}

impl Checker {
    /// The name a binding refers to.
    fn name_of(&self, n: Name) -> Option<&Id> {
        match n {
            Name::Live(g) | Name::External(g) => {
                self.gens[g.0 as usize].as_ref().map(|gen| &gen.name)
            }
            Name::Freed(f) => self.names.slot(f).map(|f| &f.name),
            Name::Forgotten => None,
        }
    }

    /// What `name` refers to now.
    pub(super) fn lookup(&self, name: &Id) -> Option<Name> {
        match self.names.by_hash.get(&name_hash(name)) {
            None => self.lookup_forgotten(name),
            Some(&n) if self.name_of(n) == Some(name) => Some(n),
            Some(_) => match self.names.clash.get(name) {
                Some(&n) => Some(n),
                None => self.lookup_forgotten(name),
            },
        }
    }

    /// A name not in the table: forgotten, or never seen.
    #[cold]
    #[inline(never)]
    fn lookup_forgotten(&self, name: &Id) -> Option<Name> {
        if self.names.forgotten.is_empty() {
            return None;
        }
        self.names.forgotten.get(name).map(|_| Name::Forgotten)
    }

    /// The details of a freed name (a [`Name::Freed`] slot).
    pub(super) fn freed(&self, f: u32) -> &FreedName {
        self.names.slot(f).expect("a freed name's slot")
    }

    /// What remains of a name that [`Checker::lookup`] found forgotten.
    pub(super) fn residue(&self, name: &Id) -> Residue {
        self.names.forgotten.get(name).expect("a forgotten name")
    }

    /// The size and memory kind of a freed name, with or without the details of its free.
    #[cold]
    #[inline(never)]
    pub(super) fn freed_size(&self, name: &Id, n: Name) -> Option<(u64, MemoryKind)> {
        match n {
            Name::Freed(f) => {
                let f = self.freed(f);
                Some((f.size, f.memory))
            }
            Name::Forgotten => {
                let r = self.residue(name);
                Some((r.size, r.memory))
            }
            Name::Live(_) | Name::External(_) => None,
        }
    }

    /// Binds `name`, which refers to `cur` now, to `new`.
    pub(super) fn rebind(&mut self, name: &Id, cur: Option<Name>, new: Name) {
        use std::collections::hash_map::Entry;
        match self.names.by_hash.entry(name_hash(name)) {
            Entry::Vacant(v) => {
                v.insert(new);
            }
            Entry::Occupied(mut o) if cur == Some(*o.get()) => {
                o.insert(new);
            }
            Entry::Occupied(_) => {
                self.names.clash.insert(name.clone(), new);
            }
        }
    }

    /// Takes `name`, which refers to `cur` now, out of the table. (A binding is held by one name
    /// at a time, so the entry that equals `cur` is `name`'s.)
    fn unbind(&mut self, name: &Id, cur: Name) {
        use std::collections::hash_map::Entry;
        let h = name_hash(name);
        let Names { by_hash, clash, .. } = &mut self.names;
        match by_hash.entry(h) {
            Entry::Occupied(mut o) if *o.get() == cur => {
                // A name whose hash clashed with this one's moves into its place.
                let heir = if clash.is_empty() {
                    None
                } else {
                    clash.keys().find(|k| name_hash(k) == h).cloned()
                };
                match heir.and_then(|k| clash.remove(&k)) {
                    Some(n) => {
                        o.insert(n);
                    }
                    None => {
                        o.remove();
                    }
                }
            }
            _ => {
                clash.remove(name);
            }
        }
    }

    /// Binds the name of generation `g`, freed now, to what remains of it. The least recent free
    /// in the ring gives way: its name is forgotten down to its residue.
    pub(super) fn bind_freed(&mut self, buffer: &Id, g: GenId, freed: FreedName) {
        let cur = Name::Live(g);
        if freed.pool_gen != NO_GEN {
            let names = &mut self.names;
            let slot = match names.pool_slots.pop() {
                Some(s) => {
                    names.pool[s as usize] = freed;
                    s
                }
                None => {
                    names.pool.push(freed);
                    names.pool.len() as u32 - 1
                }
            };
            self.rebind(buffer, Some(cur), Name::Freed(slot | POOL_SLOT));
            return;
        }
        let keep = self.names.keep;
        if keep == 0 {
            self.unbind(buffer, cur);
            self.names.forgotten.insert(buffer, freed.residue());
            return;
        }
        let slot = self.names.cursor;
        self.names.cursor = if slot + 1 == keep { 0 } else { slot + 1 };
        if slot == self.names.recent.len() {
            self.names.recent.push(Some(freed));
        } else if let Some(old) = self.names.recent[slot].replace(freed) {
            self.forget_name(old, slot as u32);
        }
        self.rebind(buffer, Some(cur), Name::Freed(slot as u32));
    }

    /// Forgets the details of the free of `old`, bound to slot `slot` until now.
    fn forget_name(&mut self, old: FreedName, slot: u32) {
        self.unbind(&old.name, Name::Freed(slot));
        self.names.forgotten.insert(&old.name, old.residue());
    }

    /// A freed name is allocated again: its slot is free.
    pub(super) fn release_freed(&mut self, f: u32) {
        if f & POOL_SLOT != 0 {
            self.names.pool_slots.push(f & !POOL_SLOT);
        } else if let Some(s) = self.names.recent.get_mut(f as usize) {
            *s = None;
        }
    }

    /// Keeps the details of the free (op, participant, site) of the `n` most recently freed
    /// names only (by default 1,024); older freed names keep what decides a verdict (that they
    /// were freed, their size, memory kind and owner), and their reports of `use-after-free` and
    /// `invalid-free` say that they were freed at an op no longer kept. Verdicts do not depend on
    /// `n`; memory does: a trace that frees ever new names keeps at most `n` of them in full.
    /// The names freed so far are forgotten at once.
    pub fn keep_free_details(&mut self, n: usize) {
        let recent = std::mem::take(&mut self.names.recent);
        for (slot, f) in recent.into_iter().enumerate() {
            if let Some(f) = f {
                self.forget_name(f, slot as u32);
            }
        }
        self.names.keep = n.min(POOL_SLOT as usize);
        self.names.cursor = 0;
    }
}
