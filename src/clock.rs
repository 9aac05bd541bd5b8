//! Vector clocks and epochs over dense participant indices.
//!
//! Happens-before between participants (the host and every stream) is tracked with vector clocks
//! (Lamport 1978, Mattern 1989). An access is summarised by its [`Epoch`] — the participant and
//! that participant's own clock component at the access — as in FastTrack (Flanagan & Freund,
//! PLDI 2009): an earlier access `e` happens before a later one by `q` exactly when `q`'s clock
//! covers `e`, an O(1) test.
//!
//! # Representation
//!
//! A clock's size follows what its participant knows, not how many participants the trace has.
//! The components of the first [`DENSE`] participants (the host, the legacy default stream and
//! the first streams: every participant of most programs) are a plain vector, read and joined
//! in place. The components of later participants live in a persistent 16-way trie whose nodes
//! are shared between clocks (`Arc`): a clock holds only the paths to the participants it knows,
//! an event's capture shares its stream's nodes, and a join adopts the other clock's subtree
//! wherever that subtree dominates its own, so a stream that waits on an event of a stream that
//! knows thousands of others pays for its own path, not for their components. Joining skips
//! subtrees that are the same node. Guarantee: every operation answers exactly as a dense vector
//! clock would (tested against one below).

use std::fmt;
use std::sync::Arc;

/// A dense participant index: 0 is the host, streams follow in order of first appearance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Participant(pub u32);

impl Participant {
    /// The host thread that issues the trace.
    pub const HOST: Participant = Participant(0);

    /// The participant's position in a vector clock.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// Whether this is the host.
    #[inline]
    pub fn is_host(self) -> bool {
        self.0 == 0
    }
}

/// A participant's logical time: the number of accesses it has issued.
pub type Time = u64;

/// The moment of one access: a participant and its own clock component at that access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Epoch {
    /// Who accessed.
    pub participant: Participant,
    /// The participant's own component at the access. Time 0 is before everything.
    pub time: Time,
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.time, self.participant.0)
    }
}

/// Participants below this index keep their components in a clock's dense part.
pub const DENSE: usize = 64;

const BITS: u32 = 4;
const FAN: usize = 1 << BITS;
const MASK: usize = FAN - 1;

/// A node of the shared trie: 16 components, or 16 subtrees.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Leaf([Time; FAN]),
    Inner([Option<Arc<Node>>; FAN]),
}

/// The shared trie of the components of participants `DENSE..`: a root and its height (0: the
/// root is a leaf, for indices below 16; each level adds 4 bits).
#[derive(Clone, Debug)]
struct Trie {
    root: Arc<Node>,
    height: u32,
}

fn height_for(i: usize) -> u32 {
    let mut h = 0;
    while (i >> (BITS * (h + 1))) != 0 {
        h += 1;
    }
    h
}

fn empty_inner() -> [Option<Arc<Node>>; FAN] {
    Default::default()
}

impl Trie {
    fn get(&self, i: usize) -> Time {
        if (i >> (BITS * (self.height + 1))) != 0 {
            return 0;
        }
        let mut node = &*self.root;
        let mut level = self.height;
        loop {
            match node {
                Node::Leaf(t) => return t[i & MASK],
                Node::Inner(c) => {
                    level -= 1;
                    match &c[(i >> (BITS * (level + 1))) & MASK] {
                        Some(n) => node = n,
                        None => return 0,
                    }
                }
            }
        }
    }

    /// Raises the root so that index `i` fits.
    fn grow(&mut self, h: u32) {
        while self.height < h {
            let mut c = empty_inner();
            c[0] = Some(self.root.clone());
            self.root = Arc::new(Node::Inner(c));
            self.height += 1;
        }
    }

    fn slot(&mut self, i: usize) -> &mut Time {
        self.grow(height_for(i));
        let mut node = Arc::make_mut(&mut self.root);
        let mut level = self.height;
        loop {
            match node {
                Node::Leaf(t) => return &mut t[i & MASK],
                Node::Inner(c) => {
                    level -= 1;
                    let child = c[(i >> (BITS * (level + 1))) & MASK].get_or_insert_with(|| {
                        Arc::new(if level == 0 {
                            Node::Leaf([0; FAN])
                        } else {
                            Node::Inner(empty_inner())
                        })
                    });
                    node = Arc::make_mut(child);
                }
            }
        }
    }

    /// `other`'s root seen at this trie's height (which must be at least `other`'s).
    fn join(&mut self, other: &Trie) {
        if self.height < other.height {
            self.grow(other.height);
        }
        // Descend along child 0 to the subtree of self that `other`'s root corresponds to.
        let depth = self.height - other.height;
        if depth == 0 {
            if let Some(n) = join_node(&self.root, &other.root) {
                self.root = n;
            }
            return;
        }
        let mut node = Arc::make_mut(&mut self.root);
        for d in 0..depth {
            let Node::Inner(c) = node else {
                unreachable!("inner nodes above the leaves")
            };
            let last = d + 1 == depth;
            match &mut c[0] {
                slot @ None => {
                    *slot = Some(if last {
                        other.root.clone()
                    } else {
                        Arc::new(Node::Inner(empty_inner()))
                    });
                    if last {
                        return;
                    }
                }
                Some(child) if last => {
                    if let Some(n) = join_node(child, &other.root) {
                        *child = n;
                    }
                    return;
                }
                Some(_) => {}
            }
            node = Arc::make_mut(c[0].as_mut().expect("child"));
        }
    }

    fn le(&self, other: Option<&Trie>) -> bool {
        fn le_node(a: &Node, b: Option<&Node>) -> bool {
            match (a, b) {
                (Node::Leaf(x), Some(Node::Leaf(y))) => x.iter().zip(y).all(|(p, q)| p <= q),
                (Node::Leaf(x), None) => x.iter().all(|&p| p == 0),
                (Node::Inner(x), Some(Node::Inner(y))) => x
                    .iter()
                    .zip(y)
                    .all(|(p, q)| p.as_ref().is_none_or(|p| le_node(p, q.as_deref()))),
                (Node::Inner(x), None) => x.iter().flatten().all(|p| le_node(p, None)),
                _ => unreachable!("tries of one height have one shape"),
            }
        }
        match other {
            None => le_node(&self.root, None),
            Some(o) => {
                if Arc::ptr_eq(&self.root, &o.root) && self.height == o.height {
                    return true;
                }
                let (mut a, mut b) = (self.clone(), o.clone());
                let h = a.height.max(b.height);
                a.grow(h);
                b.grow(h);
                le_node(&a.root, Some(&b.root))
            }
        }
    }

    /// Distinct nodes reachable from this trie that `seen` does not hold yet, as components.
    fn count(&self, seen: &mut rustc_hash::FxHashSet<usize>) -> usize {
        fn walk(n: &Arc<Node>, seen: &mut rustc_hash::FxHashSet<usize>) -> usize {
            if !seen.insert(Arc::as_ptr(n) as usize) {
                return 0;
            }
            match &**n {
                Node::Leaf(_) => FAN,
                Node::Inner(c) => FAN + c.iter().flatten().map(|c| walk(c, seen)).sum::<usize>(),
            }
        }
        walk(&self.root, seen)
    }
}

/// The join of two nodes of one level; `None` when it is `a` itself. Where `b` dominates `a`,
/// the join is `b`'s node, shared.
fn join_node(a: &Arc<Node>, b: &Arc<Node>) -> Option<Arc<Node>> {
    if Arc::ptr_eq(a, b) {
        return None;
    }
    match (&**a, &**b) {
        (Node::Leaf(x), Node::Leaf(y)) => {
            if y.iter().zip(x).all(|(q, p)| q <= p) {
                None
            } else if x.iter().zip(y).all(|(p, q)| p <= q) {
                Some(b.clone())
            } else {
                let mut m = *x;
                for (p, q) in m.iter_mut().zip(y) {
                    *p = (*p).max(*q);
                }
                Some(Arc::new(Node::Leaf(m)))
            }
        }
        (Node::Inner(x), Node::Inner(y)) => {
            let mut out: Option<[Option<Arc<Node>>; FAN]> = None;
            for k in 0..FAN {
                let joined = match (&x[k], &y[k]) {
                    (_, None) => None,
                    (None, Some(q)) => Some(q.clone()),
                    (Some(p), Some(q)) => join_node(p, q),
                };
                if let Some(j) = joined {
                    out.get_or_insert_with(|| x.clone())[k] = Some(j);
                }
            }
            let out = out?;
            let same_as_b = out.iter().zip(y).all(|(p, q)| match (p, q) {
                (Some(p), Some(q)) => Arc::ptr_eq(p, q),
                (None, None) => true,
                _ => false,
            });
            Some(if same_as_b {
                b.clone()
            } else {
                Arc::new(Node::Inner(out))
            })
        }
        _ => unreachable!("tries of one height have one shape"),
    }
}

/// A vector clock: one component per participant; missing components are 0.
#[derive(Default)]
pub struct VectorClock {
    dense: Vec<Time>,
    shared: Option<Trie>,
}

impl Clone for VectorClock {
    fn clone(&self) -> Self {
        VectorClock {
            dense: self.dense.clone(),
            shared: self.shared.clone(),
        }
    }

    /// Reuses this clock's storage (an event re-recorded takes its stream's clock in place).
    fn clone_from(&mut self, source: &Self) {
        self.dense.clone_from(&source.dense);
        self.shared.clone_from(&source.shared);
    }
}

impl VectorClock {
    /// The clock that is before everything.
    pub const fn new() -> Self {
        VectorClock {
            dense: Vec::new(),
            shared: None,
        }
    }

    /// The component of `p`.
    #[inline]
    pub fn get(&self, p: Participant) -> Time {
        let i = p.index();
        if i < DENSE {
            self.dense.get(i).copied().unwrap_or(0)
        } else {
            self.shared.as_ref().map_or(0, |t| t.get(i))
        }
    }

    /// Whether the access at `e` happens before this clock.
    #[inline]
    pub fn covers(&self, e: Epoch) -> bool {
        self.get(e.participant) >= e.time
    }

    fn slot(&mut self, i: usize) -> &mut Time {
        if i < DENSE {
            if self.dense.len() <= i {
                self.dense.resize(i + 1, 0);
            }
            &mut self.dense[i]
        } else {
            self.shared
                .get_or_insert_with(|| Trie {
                    root: Arc::new(Node::Leaf([0; FAN])),
                    height: 0,
                })
                .slot(i)
        }
    }

    /// Advances `p`'s own component and returns the epoch of the new access.
    #[inline]
    pub fn tick(&mut self, p: Participant) -> Epoch {
        let t = self.slot(p.index());
        *t += 1;
        Epoch {
            participant: p,
            time: *t,
        }
    }

    /// Raises `p`'s component to at least `time`.
    pub fn raise(&mut self, p: Participant, time: Time) {
        let t = self.slot(p.index());
        *t = (*t).max(time);
    }

    /// The epoch of `p`'s latest access as this clock knows it (time 0 if none).
    #[inline]
    pub fn epoch(&self, p: Participant) -> Epoch {
        Epoch {
            participant: p,
            time: self.get(p),
        }
    }

    /// Joins `other` into this clock: the component-wise maximum.
    #[inline]
    pub fn join(&mut self, other: &VectorClock) {
        if self.dense.len() < other.dense.len() {
            self.dense.resize(other.dense.len(), 0);
        }
        for (a, b) in self.dense.iter_mut().zip(&other.dense) {
            if *b > *a {
                *a = *b;
            }
        }
        if let Some(o) = &other.shared {
            self.join_shared(o);
        }
    }

    #[inline(never)]
    fn join_shared(&mut self, other: &Trie) {
        match &mut self.shared {
            None => self.shared = Some(other.clone()),
            Some(t) => t.join(other),
        }
    }

    /// Lowers `p`'s component to at most `time`.
    pub fn lower(&mut self, p: Participant, time: Time) {
        if self.get(p) > time {
            *self.slot(p.index()) = time;
        }
    }

    /// Calls `f(p, mine, theirs)` for every component where this clock is above `base`.
    pub fn for_each_above(&self, base: &VectorClock, mut f: impl FnMut(Participant, Time, Time)) {
        for (i, &t) in self.dense.iter().enumerate() {
            let b = base.dense.get(i).copied().unwrap_or(0);
            if t > b {
                f(Participant(i as u32), t, b);
            }
        }
        if self.shared.is_some() && !self.le(base) {
            for (p, t) in self.nonzero() {
                if p.index() >= DENSE && t > base.get(p) {
                    f(p, t, base.get(p));
                }
            }
        }
    }

    /// The component-wise minimum of the two clocks: what both know.
    pub fn meet(&self, other: &VectorClock) -> VectorClock {
        let mut out = VectorClock::new();
        let n = self.dense.len().min(other.dense.len());
        out.dense = (0..n).map(|i| self.dense[i].min(other.dense[i])).collect();
        if let (Some(_), Some(_)) = (&self.shared, &other.shared) {
            for (p, t) in self.nonzero() {
                if p.index() >= DENSE {
                    let m = t.min(other.get(p));
                    if m > 0 {
                        out.raise(p, m);
                    }
                }
            }
        }
        out
    }

    /// Whether every component of this clock is at most the same component of `other`.
    pub fn le(&self, other: &VectorClock) -> bool {
        self.dense
            .iter()
            .enumerate()
            .all(|(i, &t)| t <= other.dense.get(i).copied().unwrap_or(0))
            && self
                .shared
                .as_ref()
                .is_none_or(|s| s.le(other.shared.as_ref()))
    }

    /// Components stored by this clock that `seen` (nodes already counted for other clocks)
    /// does not hold yet: its dense part, and the trie nodes only it reaches so far.
    pub fn stored(&self, seen: &mut rustc_hash::FxHashSet<usize>) -> usize {
        self.dense.len() + self.shared.as_ref().map_or(0, |t| t.count(seen))
    }

    /// The non-zero components, by participant, in order.
    pub fn nonzero(&self) -> Vec<(Participant, Time)> {
        let mut v: Vec<(Participant, Time)> = self
            .dense
            .iter()
            .enumerate()
            .filter(|(_, &t)| t > 0)
            .map(|(i, &t)| (Participant(i as u32), t))
            .collect();
        fn walk(n: &Node, base: usize, level: u32, out: &mut Vec<(Participant, Time)>) {
            match n {
                Node::Leaf(t) => out.extend(
                    t.iter()
                        .enumerate()
                        .filter(|(_, &t)| t > 0)
                        .map(|(k, &t)| (Participant((base + k) as u32), t)),
                ),
                Node::Inner(c) => {
                    for (k, child) in c.iter().enumerate() {
                        if let Some(child) = child {
                            let shift = BITS * level;
                            walk(child, base + (k << shift), level - 1, out);
                        }
                    }
                }
            }
        }
        if let Some(t) = &self.shared {
            walk(&t.root, 0, t.height, &mut v);
        }
        v
    }
}

impl PartialEq for VectorClock {
    /// The same components (trailing zeros and sharing do not matter).
    fn eq(&self, other: &Self) -> bool {
        let n = self.dense.len().max(other.dense.len());
        let dense_eq = (0..n).all(|i| {
            self.dense.get(i).copied().unwrap_or(0) == other.dense.get(i).copied().unwrap_or(0)
        });
        dense_eq
            && match (&self.shared, &other.shared) {
                (Some(a), Some(b)) if Arc::ptr_eq(&a.root, &b.root) && a.height == b.height => true,
                (None, None) => true,
                _ => self.le(other) && other.le(self),
            }
    }
}

impl Eq for VectorClock {}

impl fmt::Debug for VectorClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shared.is_none() {
            return f.debug_list().entries(&self.dense).finish();
        }
        f.debug_map()
            .entries(self.nonzero().into_iter().map(|(p, t)| (p.0, t)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn tick_join_cover() {
        let (h, s1, s2) = (Participant::HOST, Participant(1), Participant(2));
        let mut a = VectorClock::new();
        let mut b = VectorClock::new();
        let e1 = a.tick(s1);
        assert_eq!(
            e1,
            Epoch {
                participant: s1,
                time: 1
            }
        );
        assert!(a.covers(e1));
        assert!(!b.covers(e1));
        assert!(
            b.covers(Epoch {
                participant: s1,
                time: 0
            }),
            "time 0 is before everything"
        );
        b.tick(s2);
        b.join(&a);
        assert!(b.covers(e1));
        assert_eq!(b.get(h), 0);
        assert!(a.le(&b));
        assert!(!b.le(&a));
    }

    /// A chain of streams, each waiting on the previous one's capture: the clocks share their
    /// nodes, so storage grows with the number of streams times the trie's depth.
    #[test]
    fn chain_shares_storage() {
        let n = 3000u32;
        let mut clocks: Vec<VectorClock> = Vec::new();
        let mut prev = VectorClock::new();
        for k in 0..n {
            let p = Participant(k + 1);
            let mut c = VectorClock::new();
            c.join(&prev);
            c.tick(p);
            prev = c.clone();
            clocks.push(c);
        }
        let mut seen = Default::default();
        let stored: usize = clocks.iter().map(|c| c.stored(&mut seen)).sum();
        assert!(
            stored < 200 * n as usize,
            "{stored} components stored for {n} chained clocks"
        );
        let last = clocks.last().expect("clock");
        for k in 0..n {
            assert_eq!(last.get(Participant(k + 1)), 1);
        }
    }

    fn dense_join(a: &mut Vec<Time>, b: &[Time]) {
        if a.len() < b.len() {
            a.resize(b.len(), 0);
        }
        for (x, y) in a.iter_mut().zip(b) {
            *x = (*x).max(*y);
        }
    }

    proptest! {
        /// Ticks and joins over participants on both sides of the dense part, against plain
        /// dense vectors.
        #[test]
        fn agrees_with_dense_vectors(
            steps in proptest::collection::vec((0u8..4, 0usize..6, 0usize..6, 0u32..400), 1..200)
        ) {
            let mut model: Vec<Vec<Time>> = vec![Vec::new(); 6];
            let mut clocks: Vec<VectorClock> = vec![VectorClock::new(); 6];
            for (what, a, b, p) in steps {
                match what {
                    0 => {
                        clocks[a].tick(Participant(p));
                        let m = &mut model[a];
                        if m.len() <= p as usize { m.resize(p as usize + 1, 0); }
                        m[p as usize] += 1;
                    }
                    1 => {
                        let other = clocks[b].clone();
                        clocks[a].join(&other);
                        let o = model[b].clone();
                        dense_join(&mut model[a], &o);
                    }
                    3 => {
                        clocks[a].lower(Participant(p), b as Time);
                        if let Some(t) = model[a].get_mut(p as usize) {
                            *t = (*t).min(b as Time);
                        }
                    }
                    _ => {
                        clocks[a] = clocks[b].clone();
                        model[a] = model[b].clone();
                    }
                }
                for (c, m) in clocks.iter().zip(&model) {
                    for q in 0..400u32 {
                        prop_assert_eq!(c.get(Participant(q)), m.get(q as usize).copied().unwrap_or(0));
                    }
                }
            }
            for x in 0..6 {
                for y in 0..6 {
                    let dense_le = (0..400).all(|q| {
                        model[x].get(q).copied().unwrap_or(0) <= model[y].get(q).copied().unwrap_or(0)
                    });
                    prop_assert_eq!(clocks[x].le(&clocks[y]), dense_le);
                    prop_assert_eq!(clocks[x] == clocks[y], dense_le && clocks[y].le(&clocks[x]));
                    let meet = clocks[x].meet(&clocks[y]);
                    let mut above = Vec::new();
                    clocks[x].for_each_above(&clocks[y], |p, mine, theirs| above.push((p.0, mine, theirs)));
                    let mut want = Vec::new();
                    for q in 0..400u32 {
                        let (mx, my) = (
                            model[x].get(q as usize).copied().unwrap_or(0),
                            model[y].get(q as usize).copied().unwrap_or(0),
                        );
                        prop_assert_eq!(meet.get(Participant(q)), mx.min(my));
                        if mx > my {
                            want.push((q, mx, my));
                        }
                    }
                    above.sort_unstable();
                    prop_assert_eq!(above, want);
                }
            }
        }
    }
}
