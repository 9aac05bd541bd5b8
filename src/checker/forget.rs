//! What the checker may forget (the sweeps of history and the graveyard), and the views the
//! synchronization analysis takes of the checker.

use super::*;

impl Checker {
    /// Drops the tombstones the host's clock covers: keeps reuse lookups short between the
    /// sweeps of [`Self::prune`]. Runs when the graveyard has doubled since the last pass.
    pub(super) fn prune_graveyard(&mut self) {
        let forget = forget_clock(&self.forget, &self.order);
        if forget != &self.host_at_graveyard_prune {
            self.graveyard.prune(forget);
            self.host_at_graveyard_prune = forget.clone();
        }
        self.graveyard_prune_at = (2 * self.graveyard.len()).max(self.limits.sweep_at / 64);
    }

    /// Drops every history entry and tombstone that the host's clock covers. Runs when the
    /// history has doubled since the last pass.
    pub(super) fn prune(&mut self) {
        if forget_clock(&self.forget, &self.order) != &self.host_at_prune {
            let Checker {
                gens,
                order,
                history,
                limits,
                forget,
                ..
            } = self;
            // Below the host's clock, a covered entry may outlive the entries covering it.
            let exact = forget.is_none();
            let host = forget_clock(forget, order);
            for gen in gens.iter_mut().flatten() {
                *history -= gen.history.prune(host, limits.history_index_at, exact);
            }
            self.prune_graveyard();
            self.host_at_prune = forget_clock(&self.forget, &self.order).clone();
        }
        self.prune_at = (2 * self.history).max(self.limits.sweep_at);
    }
}

/// What the checker may forget now: history that this clock covers (the host's clock, or its
/// meet with the clock [`Checker::retain`] keeps history for).
pub(super) fn forget_clock<'a>(
    forget: &'a Option<VectorClock>,
    order: &'a Order,
) -> &'a VectorClock {
    forget.as_ref().unwrap_or_else(|| order.host_clock())
}

/// One region of the access op just checked, as the synchronization analysis sees it.
#[derive(Clone, Debug)]
pub(crate) struct RegionView {
    /// Its position among the op's regions (for [`Checker::probe_region`]).
    pub at: usize,
    /// The accessed buffer's name.
    pub buffer: Id,
    /// Whether the region is written.
    pub writes: bool,
    /// The buffer's memory kind.
    pub memory: MemoryKind,
    /// The region's absolute bytes, where the buffer takes memory (and the region is not empty).
    pub bytes: Option<(u64, u64)>,
}

impl Checker {
    /// Counts an op that has no effect at all: the op index advances and nothing else changes.
    /// The synchronization analysis checks a trace with one op replaced by nothing this way
    /// (every later op keeps its index).
    pub fn skip(&mut self) {
        self.ops += 1;
    }

    /// Keeps the history that `clock` does not cover even where the host's clock covers it
    /// (`None`: forget, as usual, whatever the host's clock covers). Verdicts and reports do not
    /// change, only what is kept: the synchronization analysis asks what-if questions with host
    /// clocks behind the real one, which may still conflict with that history.
    pub fn retain(&mut self, clock: Option<VectorClock>) {
        self.retain = clock.map(|c| (c, 0));
        self.forget = None;
        self.refresh_forget();
    }

    /// Recomputes what may be forgotten after the host's clock changed (with [`Checker::retain`]).
    pub(super) fn refresh_forget(&mut self) {
        if let Some((keep, version)) = &mut self.retain {
            let now = self.order.host_version();
            if self.forget.is_none() || *version != now {
                self.forget = Some(self.order.host_clock().meet(keep));
                *version = now;
            }
        }
    }

    /// The live (or external) generation `name` refers to now.
    pub(crate) fn live_generation(&self, name: &Id) -> Option<&Generation> {
        match self.lookup(name)? {
            Name::Live(g) | Name::External(g) => self.gens[g.0 as usize].as_ref(),
            Name::Freed(_) | Name::Forgotten => None,
        }
    }

    /// The regions of the access op just checked (`launch`, `copy`, `memset`, `host_read`,
    /// `host_write`), each resolved to its buffer; uses after free are left out.
    pub(crate) fn last_regions(&self) -> Vec<RegionView> {
        self.op_accesses
            .iter()
            .enumerate()
            .filter_map(|(at, a)| {
                let gen = self.gens[a.gen.0 as usize].as_ref()?;
                let bytes = match (gen.addr(), gen.size()) {
                    (Some(base), Some(size)) if a.offset < a.end && a.offset < size => {
                        Some((base + a.offset, base + a.end.min(size)))
                    }
                    _ => None,
                };
                Some(RegionView {
                    at,
                    buffer: gen.name.clone(),
                    writes: a.kind.writes(),
                    memory: gen.memory,
                    bytes,
                })
            })
            .collect()
    }

    /// Whether region `at` of the access op just checked, issued by `p` with `clock` instead of
    /// the clock it had, conflicts with an earlier access of its buffer (`data-race`) and with a
    /// tombstone on its bytes (`reuse-race`). Reads only: every entry is looked at, covered ones
    /// included (the ordering that lets the checker skip them may be missing from `clock`).
    pub(crate) fn probe_region(
        &self,
        at: usize,
        p: Participant,
        clock: &VectorClock,
    ) -> (bool, bool) {
        let Some(&OpAccess {
            gen: g,
            kind,
            offset,
            end,
        }) = self.op_accesses.get(at)
        else {
            return (false, false);
        };
        let Some(gen) = self.gens[g.0 as usize].as_ref() else {
            return (false, false);
        };
        if offset >= end {
            return (false, false);
        }
        let probe = Probe {
            participant: p,
            clock,
            writes: kind.writes(),
            offset,
            end,
        };
        let hits = |a: &Access| probe.conflicts(a) && a.overlaps(offset, end);
        let h = &gen.history;
        let race = match h.rest.as_deref() {
            Some(crate::shadow::Rest {
                index: Some(ix), ..
            }) => {
                let mut found = false;
                ix.for_each(offset, end, |e| found = found || hits(&e.access));
                found
            }
            _ => h.accesses.iter().any(hits) || h.covered().iter().any(hits),
        };
        let Some(base) = gen.addr() else {
            return (race, false);
        };
        let (lo, hi) = (base + offset, base + end.min(gen.size().unwrap_or(0)));
        if lo >= hi {
            return (race, false);
        }
        let mut reuse = gen.reuse().iter().any(|rec| {
            rec.entries.iter().any(|a| {
                let (s, e) = rec.range(a);
                s < hi && lo < e && probe.conflicts(a)
            })
        });
        if !reuse && gen.reuse_large() {
            self.graveyard
                .large_ref(gen.memory)
                .for_each(lo, hi, |e| reuse = reuse || probe.conflicts(&e.access));
        }
        (race, reuse)
    }
}
