//! Vector clocks and epochs over dense participant indices.
//!
//! Happens-before between participants (the host and every stream) is tracked with vector clocks
//! (Lamport 1978, Mattern 1989). An access is summarised by its [`Epoch`] — the participant and
//! that participant's own clock component at the access — as in FastTrack (Flanagan & Freund,
//! PLDI 2009): an earlier access `e` happens before a later one by `q` exactly when `q`'s clock
//! covers `e`, an O(1) test.

use std::fmt;

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

/// A vector clock: one component per participant; missing components are 0.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct VectorClock(Vec<Time>);

impl VectorClock {
    /// The clock that is before everything.
    pub const fn new() -> Self {
        VectorClock(Vec::new())
    }

    /// The component of `p`.
    #[inline]
    pub fn get(&self, p: Participant) -> Time {
        self.0.get(p.index()).copied().unwrap_or(0)
    }

    /// Whether the access at `e` happens before this clock.
    #[inline]
    pub fn covers(&self, e: Epoch) -> bool {
        self.get(e.participant) >= e.time
    }

    /// Advances `p`'s own component and returns the epoch of the new access.
    #[inline]
    pub fn tick(&mut self, p: Participant) -> Epoch {
        let i = p.index();
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        self.0[i] += 1;
        Epoch {
            participant: p,
            time: self.0[i],
        }
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
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            if *b > *a {
                *a = *b;
            }
        }
    }

    /// Whether every component of this clock is at most the same component of `other`.
    pub fn le(&self, other: &VectorClock) -> bool {
        self.0
            .iter()
            .enumerate()
            .all(|(i, &t)| t <= other.0.get(i).copied().unwrap_or(0))
    }

    /// The components, indexed by participant.
    pub fn components(&self) -> &[Time] {
        &self.0
    }
}

impl fmt::Debug for VectorClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.0).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
