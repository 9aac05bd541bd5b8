//! What each lane knows of every other lane, stored so that knowledge passed on by events and
//! host syncs is shared, not copied.
//!
//! A lane's knowledge maps each lane index to a [`Prov`]: the latest op of that lane known to
//! happen before the lane's current point, and the synchronization through which it became
//! known. A wait joins the waited knowledge into the lane's, with the wait as the new arrival of
//! everything it brings. Stored densely, a chain of streams each waiting on the previous one
//! costs the square of its length. Here knowledge is a persistent 16-way trie over lane indices
//! whose nodes are shared between lanes and event captures (`Arc`), and an arrival is a tag on a
//! whole subtree ("everything known here came through this wait") rather than a rewrite of each
//! entry: a join adopts the waited subtrees wherever the lane knew nothing there, so a wait
//! costs the depth of the trie times its fan-out, not the number of lanes known.
//!
//! Guarantee: [`Know::get`] answers exactly what the dense vector of provenances answered
//! (tested against it below), so explanations are unchanged.

use std::sync::Arc;

use super::{How, Prov};

const BITS: u32 = 4;
const FAN: usize = 1 << BITS;
const MASK: usize = FAN - 1;
/// `upto` of a slot that knows nothing.
const NONE: u64 = u64::MAX;

/// A synchronization op through which knowledge arrives (shared by everything it brought).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ArrivalRec {
    pub via: u64,
    pub from: Option<u64>,
    pub how: How,
    pub label: Arc<str>,
    pub on_host: bool,
}

/// One lane's entry: the latest op known and how it arrived (`None`: the lane's own op, or, under
/// a tag, the tag's arrival).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Slot {
    upto: u64,
    arrival: Option<Arc<ArrivalRec>>,
}

const EMPTY: Slot = Slot {
    upto: NONE,
    arrival: None,
};

impl Slot {
    fn known(&self) -> Option<u64> {
        (self.upto != NONE).then_some(self.upto)
    }

    /// The slot as seen under `tag`.
    fn under(&self, tag: Option<&Arc<ArrivalRec>>) -> Slot {
        match (tag, self.upto) {
            (Some(t), u) if u != NONE => Slot {
                upto: u,
                arrival: Some(t.clone()),
            },
            _ => self.clone(),
        }
    }

    fn prov(&self) -> Prov {
        let Some(upto) = self.known() else {
            return Prov::default();
        };
        match &self.arrival {
            None => Prov {
                upto: Some(upto),
                via: Some(upto),
                ..Prov::default()
            },
            Some(a) => Prov {
                upto: Some(upto),
                via: Some(a.via),
                from: a.from,
                how: a.how,
                label: Some(a.label.clone()),
                on_host: a.on_host,
            },
        }
    }
}

#[derive(Clone, Debug)]
enum Node {
    Leaf(Box<[Slot; FAN]>),
    Inner([Option<Arc<Node>>; FAN]),
    /// Every slot known below arrived through this (it overrides tags and arrivals below).
    Tagged(Arc<ArrivalRec>, Arc<Node>),
}

fn empty_leaf() -> Node {
    Node::Leaf(Box::new(std::array::from_fn(|_| EMPTY)))
}

fn empty_inner() -> [Option<Arc<Node>>; FAN] {
    Default::default()
}

/// A subtree as seen from above: its node and the tag of the nearest tagged ancestor.
#[derive(Clone, Copy)]
struct View<'a> {
    node: &'a Arc<Node>,
    tag: Option<&'a Arc<ArrivalRec>>,
}

impl<'a> View<'a> {
    /// Looks through a tagged node (the outermost tag wins).
    fn open(self) -> (&'a Node, Option<&'a Arc<ArrivalRec>>) {
        match &**self.node {
            Node::Tagged(t, inner) => (&**inner, self.tag.or(Some(t))),
            n => (n, self.tag),
        }
    }

    /// The subtree as a node of its own, keeping its tag.
    fn materialize(self) -> Arc<Node> {
        match (self.tag, &**self.node) {
            (None, _) => self.node.clone(),
            (Some(t), Node::Tagged(_, inner)) => Arc::new(Node::Tagged(t.clone(), inner.clone())),
            (Some(t), _) => Arc::new(Node::Tagged(t.clone(), self.node.clone())),
        }
    }

    /// The untagged node below any tag.
    fn bare(self) -> &'a Arc<Node> {
        match &**self.node {
            Node::Tagged(_, inner) => inner,
            _ => self.node,
        }
    }
}

fn tagged(tag: &Arc<ArrivalRec>, v: View<'_>) -> Arc<Node> {
    Arc::new(Node::Tagged(tag.clone(), v.bare().clone()))
}

/// The join of two views of one level (see [`Know::join`]).
fn join_view(
    d: Option<View<'_>>,
    s: Option<View<'_>>,
    arrival: Option<&Arc<ArrivalRec>>,
) -> Option<Arc<Node>> {
    let (d, s) = match (d, s) {
        (d, None) => return d.map(View::materialize),
        (None, Some(s)) => {
            return Some(match arrival {
                Some(a) => tagged(a, s),
                None => s.materialize(),
            })
        }
        (Some(d), Some(s)) => (d, s),
    };
    if Arc::ptr_eq(d.bare(), s.bare()) {
        // The same entries: nothing is strictly later.
        return Some(d.materialize());
    }
    let (dn, dt) = d.open();
    let (sn, st) = s.open();
    match (dn, sn) {
        (Node::Leaf(x), Node::Leaf(y)) => {
            let mut changed = false;
            let out: [Slot; FAN] = std::array::from_fn(|k| {
                let dk = x[k].under(dt);
                if y[k].upto != NONE && (dk.upto == NONE || y[k].upto > dk.upto) {
                    changed = true;
                    match arrival {
                        Some(a) => Slot {
                            upto: y[k].upto,
                            arrival: Some(a.clone()),
                        },
                        None => y[k].under(st),
                    }
                } else {
                    dk
                }
            });
            Some(if changed {
                Arc::new(Node::Leaf(Box::new(out)))
            } else {
                d.materialize()
            })
        }
        (Node::Inner(x), Node::Inner(y)) => {
            let mut out = empty_inner();
            let mut changed = false;
            for k in 0..FAN {
                let dv = x[k].as_ref().map(|n| View { node: n, tag: dt });
                let sv = y[k].as_ref().map(|n| View { node: n, tag: st });
                out[k] = join_view(dv, sv, arrival);
                let same = match (&out[k], &x[k]) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                };
                changed |= !same;
            }
            Some(if !changed && dt.is_none() {
                d.node.clone()
            } else {
                Arc::new(Node::Inner(out))
            })
        }
        _ => unreachable!("tries of one height have one shape"),
    }
}

/// A lane's knowledge of every lane (see the module docs). Missing lanes know nothing.
#[derive(Clone, Debug, Default)]
pub(super) struct Know {
    root: Option<Arc<Node>>,
    height: u32,
}

fn height_for(i: usize) -> u32 {
    let mut h = 0;
    while (i >> (BITS * (h + 1))) != 0 {
        h += 1;
    }
    h
}

impl Know {
    /// What is known of lane `i`.
    pub fn get(&self, i: usize) -> Prov {
        let Some(root) = &self.root else {
            return Prov::default();
        };
        if (i >> (BITS * (self.height + 1))) != 0 {
            return Prov::default();
        }
        let mut v = View {
            node: root,
            tag: None,
        };
        let mut level = self.height;
        loop {
            let (n, tag) = v.open();
            match n {
                Node::Leaf(slots) => return slots[i & MASK].under(tag).prov(),
                Node::Inner(c) => {
                    level -= 1;
                    match &c[(i >> (BITS * (level + 1))) & MASK] {
                        Some(child) => v = View { node: child, tag },
                        None => return Prov::default(),
                    }
                }
                Node::Tagged(..) => unreachable!("open looks through tags"),
            }
        }
    }

    fn grow(&mut self, h: u32) {
        if self.root.is_none() {
            self.height = self.height.max(h);
            return;
        }
        while self.height < h {
            let mut c = empty_inner();
            c[0] = self.root.take();
            self.root = Some(Arc::new(Node::Inner(c)));
            self.height += 1;
        }
    }

    fn set_slot(&mut self, i: usize, slot: Slot) {
        self.grow(height_for(i));
        let height = self.height;
        let root = self.root.get_or_insert_with(|| {
            Arc::new(if height == 0 {
                empty_leaf()
            } else {
                Node::Inner(empty_inner())
            })
        });
        set_in(root, height, i, slot, None);
    }

    /// Lane `i`'s own op `op`: it knows its own ops.
    pub fn set_own(&mut self, i: usize, op: u64) {
        self.set_slot(
            i,
            Slot {
                upto: op,
                arrival: None,
            },
        );
    }

    /// Joins `src` into this knowledge where it knows later ops. With an `arrival`, what is new
    /// arrives through it; without, it keeps the provenance it had in `src`.
    pub fn join(&mut self, src: &Know, arrival: Option<&Arc<ArrivalRec>>) {
        let Some(sroot) = &src.root else {
            return;
        };
        let h = self.height.max(src.height);
        self.grow(h);
        // `src` seen at this height: along child 0 from a root of height `h`.
        let mut s = src.clone();
        s.grow(h);
        let sroot = s.root.as_ref().unwrap_or(sroot);
        let d = self.root.as_ref().map(|n| View { node: n, tag: None });
        let sv = Some(View {
            node: sroot,
            tag: None,
        });
        self.root = join_view(d, sv, arrival);
        self.height = h;
    }

    /// Calls `f` with every op a provenance stored here names (its `upto` of own ops, and `via`
    /// and `from` of arrivals), visiting nodes not in `seen` yet.
    pub fn ops(&self, seen: &mut rustc_hash::FxHashSet<usize>, f: &mut impl FnMut(u64)) {
        fn arrival(a: &ArrivalRec, f: &mut impl FnMut(u64)) {
            f(a.via);
            if let Some(x) = a.from {
                f(x);
            }
        }
        fn walk(n: &Arc<Node>, seen: &mut rustc_hash::FxHashSet<usize>, f: &mut impl FnMut(u64)) {
            if !seen.insert(Arc::as_ptr(n) as usize) {
                return;
            }
            match &**n {
                Node::Leaf(slots) => {
                    for s in slots.iter().filter(|s| s.upto != NONE) {
                        match &s.arrival {
                            None => f(s.upto),
                            Some(a) => arrival(a, f),
                        }
                    }
                }
                Node::Inner(c) => {
                    for child in c.iter().flatten() {
                        walk(child, seen, f);
                    }
                }
                Node::Tagged(t, inner) => {
                    arrival(t, f);
                    walk(inner, seen, f);
                }
            }
        }
        if let Some(r) = &self.root {
            walk(r, seen, f);
        }
    }

    /// Trie nodes stored here that `seen` does not hold yet.
    pub fn nodes(&self, seen: &mut rustc_hash::FxHashSet<usize>) -> usize {
        let mut n = 0;
        fn walk(node: &Arc<Node>, seen: &mut rustc_hash::FxHashSet<usize>, n: &mut usize) {
            if !seen.insert(Arc::as_ptr(node) as usize) {
                return;
            }
            *n += 1;
            match &**node {
                Node::Leaf(_) => {}
                Node::Inner(c) => c.iter().flatten().for_each(|c| walk(c, seen, n)),
                Node::Tagged(_, inner) => walk(inner, seen, n),
            }
        }
        if let Some(r) = &self.root {
            walk(r, seen, &mut n);
        }
        n
    }
}

/// Sets slot `i` below `node` (of height `level`), copying the path and pushing tags down it.
fn set_in(node: &mut Arc<Node>, level: u32, i: usize, slot: Slot, tag: Option<Arc<ArrivalRec>>) {
    // Look through a tag: its arrival applies to everything below but the slot being set.
    if let Node::Tagged(t, inner) = &**node {
        let (t, inner) = (t.clone(), inner.clone());
        *node = inner;
        return set_in(node, level, i, slot, tag.or(Some(t)));
    }
    let n = Arc::make_mut(node);
    match n {
        Node::Leaf(slots) => {
            if let Some(t) = &tag {
                for s in slots.iter_mut() {
                    *s = s.under(Some(t));
                }
            }
            slots[i & MASK] = slot;
        }
        Node::Inner(c) => {
            let k = (i >> (BITS * level)) & MASK;
            if let Some(t) = &tag {
                for (j, child) in c.iter_mut().enumerate() {
                    if j != k {
                        if let Some(ch) = child {
                            *ch = tagged(
                                t,
                                View {
                                    node: ch,
                                    tag: None,
                                },
                            );
                        }
                    }
                }
            }
            let child = c[k].get_or_insert_with(|| {
                Arc::new(if level == 1 {
                    empty_leaf()
                } else {
                    Node::Inner(empty_inner())
                })
            });
            set_in(child, level - 1, i, slot, tag);
        }
        Node::Tagged(..) => unreachable!("tags are looked through above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The dense join the graph used before: the reference.
    fn dense_join(dst: &mut Vec<Prov>, src: &[Prov], arrival: Option<&ArrivalRec>) {
        if dst.len() < src.len() {
            dst.resize(src.len(), Prov::default());
        }
        for (d, s) in dst.iter_mut().zip(src) {
            if s.upto > d.upto {
                *d = match arrival {
                    Some(a) => Prov {
                        upto: s.upto,
                        via: Some(a.via),
                        from: a.from,
                        how: a.how,
                        label: Some(a.label.clone()),
                        on_host: a.on_host,
                    },
                    None => s.clone(),
                };
            }
        }
    }

    fn arrival(via: u64) -> Arc<ArrivalRec> {
        Arc::new(ArrivalRec {
            via,
            from: Some(via / 2),
            how: How::Event,
            label: Arc::from(format!("wait e{via}")),
            on_host: via % 2 == 0,
        })
    }

    proptest! {
        /// Own ops, joins with and without arrivals and copies, over lanes on both sides of the
        /// trie's first levels, against dense vectors of provenances.
        #[test]
        fn agrees_with_dense_provenance(
            steps in proptest::collection::vec((0u8..4, 0usize..5, 0usize..5, 0usize..300), 1..120)
        ) {
            let mut model: Vec<Vec<Prov>> = vec![Vec::new(); 5];
            let mut know: Vec<Know> = vec![Know::default(); 5];
            for (op, (what, a, b, lane)) in steps.into_iter().enumerate() {
                let op = op as u64;
                match what {
                    0 => {
                        know[a].set_own(lane, op);
                        let m = &mut model[a];
                        if m.len() <= lane { m.resize(lane + 1, Prov::default()); }
                        m[lane] = Prov { upto: Some(op), via: Some(op), ..Prov::default() };
                    }
                    1 => {
                        let arr = arrival(op);
                        let src = know[b].clone();
                        know[a].join(&src, Some(&arr));
                        let s = model[b].clone();
                        dense_join(&mut model[a], &s, Some(&arr));
                    }
                    2 => {
                        let src = know[b].clone();
                        know[a].join(&src, None);
                        let s = model[b].clone();
                        dense_join(&mut model[a], &s, None);
                    }
                    _ => {
                        know[a] = know[b].clone();
                        model[a] = model[b].clone();
                    }
                }
                for (k, m) in know.iter().zip(&model) {
                    for l in 0..300 {
                        prop_assert_eq!(k.get(l), m.get(l).cloned().unwrap_or_default());
                    }
                }
            }
        }
    }

    #[test]
    fn chain_of_waits_shares_nodes() {
        let n = 3000usize;
        let mut lanes: Vec<Know> = Vec::new();
        let mut prev = Know::default();
        for k in 0..n {
            let mut own = Know::default();
            own.join(&prev, Some(&arrival(k as u64)));
            own.set_own(k, k as u64);
            prev = own.clone();
            lanes.push(own);
        }
        let mut seen = Default::default();
        let nodes: usize = lanes.iter().map(|k| k.nodes(&mut seen)).sum();
        assert!(nodes < 40 * n, "{nodes} nodes for a chain of {n} lanes");
        assert_eq!(lanes[n - 1].get(0).upto, Some(0));
        assert_eq!(lanes[n - 1].get(n - 2).via, Some(n as u64 - 1));
    }
}
