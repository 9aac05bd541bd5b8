//! Happens-before state: participants, events, host syncs and the legacy default stream.
//!
//! This module implements the happens-before rules of the trace format (rules 1–5). Every
//! participant — the host and each stream — keeps a [`VectorClock`]. An op on a stream first joins
//! the host's clock (rule 2: what the host did before issuing it happens before it) and, on device
//! 0, the legacy default stream's implicit edges (rule 5). Events are snapshots of a stream's
//! clock (rule 3); host syncs join clocks into the host (rule 4). Only accesses advance a
//! participant's own component, so an access's [`Epoch`] identifies it.
//!
//! Guarantee: `covers` answers exactly "does this access happen before that point" under the
//! rules; it is checked against a brute-force reachability oracle in the tests.

use rustc_hash::FxHashMap as HashMap;

use crate::clock::{Epoch, Participant, VectorClock};
use crate::trace::{Id, DEFAULT_STREAM, HOST};

/// What is known of one stream.
#[derive(Clone, Debug)]
pub struct StreamInfo {
    /// Its name in the trace.
    pub name: Id,
    /// Its device.
    pub device: u64,
    /// Whether it synchronizes with the legacy default stream.
    pub blocking: bool,
    /// Whether a `stream_create` declared it (rather than a first use).
    pub declared: bool,
    /// Whether this is a graph's replay participant `G/c` rather than a stream of the trace:
    /// it has no name a trace op can use, no legacy-default-stream edges, and a `device_sync`
    /// does not name it (the launch stream it joins into covers its work).
    pub replay: bool,
    clock: VectorClock,
    /// The version of the host's clock it joined last (rule 2): joining it again is a no-op.
    host_seen: u64,
}

/// An event's state: never recorded, or the snapshot its last record captured.
#[derive(Clone, Debug, Default)]
struct EventState {
    capture: Option<VectorClock>,
}

/// Why a `stream_create` was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamError {
    /// `"default"` always exists and cannot be created.
    LegacyDefault,
    /// The stream exists with other attributes.
    Redeclared {
        /// Its existing device.
        device: u64,
        /// Its existing blocking flag.
        blocking: bool,
        /// Whether it came from a first use (rather than a `stream_create`).
        implicit: bool,
    },
}

/// The outcome of an `event_wait`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The stream now waits for the event's capture.
    Joined,
    /// The event was never recorded (or was destroyed or reset): no effect.
    Unrecorded,
}

/// Happens-before state of a trace: one clock per participant, and the events.
#[derive(Clone, Debug)]
pub struct Order {
    host: VectorClock,
    /// Bumped whenever the host's clock changes.
    host_version: u64,
    streams: Vec<StreamInfo>,
    by_name: HashMap<Id, Participant>,
    events: HashMap<Id, EventState>,
    /// Blocking streams of device 0, which synchronize with the legacy default stream.
    blocking0: Vec<Participant>,
    /// The stream [`Order::stream`] found last.
    last_stream: Option<(Id, Participant)>,
}

impl Default for Order {
    fn default() -> Self {
        Self::new()
    }
}

impl Order {
    /// The legacy default stream, which always exists.
    pub const DEFAULT: Participant = Participant(1);

    /// A fresh state: the host and the legacy default stream of device 0.
    pub fn new() -> Self {
        let mut order = Order {
            host: VectorClock::new(),
            host_version: 1,
            streams: Vec::new(),
            by_name: HashMap::default(),
            events: HashMap::default(),
            blocking0: Vec::new(),
            last_stream: None,
        };
        let d = order.add_stream(Id::from(DEFAULT_STREAM), 0, false, true);
        debug_assert_eq!(d, Self::DEFAULT);
        order
    }

    fn add_stream(&mut self, name: Id, device: u64, blocking: bool, declared: bool) -> Participant {
        let p = Participant(self.streams.len() as u32 + 1);
        if blocking && device == 0 {
            self.blocking0.push(p);
        }
        self.by_name.insert(name.clone(), p);
        self.streams.push(StreamInfo {
            name,
            device,
            blocking,
            declared,
            replay: false,
            clock: VectorClock::new(),
            host_seen: 0,
        });
        p
    }

    /// A graph's replay participant `G/c` (trace format, "CUDA graphs"), printed as `name`. It
    /// is not a stream of the trace: [`Order::stream`] never finds it.
    pub fn add_replay_participant(&mut self, name: Id, device: u64) -> Participant {
        let p = Participant(self.streams.len() as u32 + 1);
        self.streams.push(StreamInfo {
            name,
            device,
            blocking: false,
            declared: true,
            replay: true,
            clock: VectorClock::new(),
            host_seen: 0,
        });
        p
    }

    /// Joins `clock` into participant `p`'s (a stream or a replay participant, not the host).
    pub fn join_clock(&mut self, p: Participant, clock: &VectorClock) {
        debug_assert!(!p.is_host());
        self.streams[p.index() - 1].clock.join(clock);
    }

    /// Joins `from`'s clock into `into`'s (two streams or replay participants, not the host).
    pub fn join_participant(&mut self, into: Participant, from: Participant) {
        debug_assert!(!into.is_host() && !from.is_host());
        if into != from {
            let (a, b) = pick2(&mut self.streams, into.index() - 1, from.index() - 1);
            a.clock.join(&b.clock);
        }
    }

    fn info(&self, p: Participant) -> &StreamInfo {
        &self.streams[p.index() - 1]
    }

    fn clock_mut(&mut self, p: Participant) -> &mut VectorClock {
        if p.is_host() {
            self.host_version += 1;
            &mut self.host
        } else {
            &mut self.streams[p.index() - 1].clock
        }
    }

    /// The participant of stream `name`, created on first use (non-blocking, device 0).
    ///
    /// `name` must not be `"host"`; the parser rejects it as a stream id.
    pub fn stream(&mut self, name: &Id) -> Participant {
        debug_assert_ne!(name.as_str(), HOST);
        // Consecutive ops mostly name the same stream: compare with the last one first.
        if let Some((last, p)) = &self.last_stream {
            if last == name {
                return *p;
            }
        }
        let p = match self.by_name.get(name) {
            Some(&p) => p,
            None => self.add_stream(name.clone(), 0, false, false),
        };
        self.last_stream = Some((name.clone(), p));
        p
    }

    /// The participant of stream `name` if it exists.
    pub fn find_stream(&self, name: &Id) -> Option<Participant> {
        self.by_name.get(name).copied()
    }

    /// `stream_create`: declares a stream; redeclaring with the same attributes has no effect.
    pub fn create_stream(
        &mut self,
        name: &Id,
        device: u64,
        blocking: bool,
    ) -> Result<Participant, StreamError> {
        if name.as_str() == DEFAULT_STREAM {
            return Err(StreamError::LegacyDefault);
        }
        match self.by_name.get(name) {
            None => Ok(self.add_stream(name.clone(), device, blocking, true)),
            Some(&p) => {
                let info = self.info(p);
                if info.device == device && info.blocking == blocking {
                    Ok(p)
                } else {
                    Err(StreamError::Redeclared {
                        device: info.device,
                        blocking: info.blocking,
                        implicit: !info.declared,
                    })
                }
            }
        }
    }

    /// The name of a participant as reports print it.
    pub fn name(&self, p: Participant) -> &str {
        if p.is_host() {
            HOST
        } else {
            self.info(p).name.as_str()
        }
    }

    /// What is known of stream `p` (not the host).
    pub fn stream_info(&self, p: Participant) -> &StreamInfo {
        self.info(p)
    }

    /// Number of participants, the host included.
    pub fn participants(&self) -> usize {
        self.streams.len() + 1
    }

    /// The current clock of `p`.
    pub fn clock(&self, p: Participant) -> &VectorClock {
        if p.is_host() {
            &self.host
        } else {
            &self.streams[p.index() - 1].clock
        }
    }

    /// Clock components stored: every participant's clock and every event's capture, each shared
    /// node of their tries once.
    pub fn clock_entries(&self) -> usize {
        let mut seen = Default::default();
        let clocks = self.streams.iter().map(|s| &s.clock).chain([&self.host]);
        let captures = self.events.values().filter_map(|e| e.capture.as_ref());
        clocks.chain(captures).map(|c| c.stored(&mut seen)).sum()
    }

    /// The host's clock.
    pub fn host_clock(&self) -> &VectorClock {
        &self.host
    }

    /// A number that changes whenever the host's clock may have changed.
    pub(crate) fn host_version(&self) -> u64 {
        self.host_version
    }

    /// The capture of `event`'s latest record; `None` if it was never recorded (or was reset).
    pub fn capture(&self, event: &Id) -> Option<&VectorClock> {
        self.events.get(event).and_then(|e| e.capture.as_ref())
    }

    /// The blocking streams of device 0, which synchronize with the legacy default stream.
    pub fn blocking0(&self) -> &[Participant] {
        &self.blocking0
    }

    /// Whether stream `p` is a blocking stream of device 0.
    pub fn is_blocking0(&self, p: Participant) -> bool {
        !p.is_host() && p != Self::DEFAULT && {
            let s = self.info(p);
            s.blocking && s.device == 0
        }
    }

    /// Rules 2 and 5: before an op on stream `p`, join what the host did before issuing it and
    /// the implicit edges of the legacy default stream.
    pub fn begin_stream_op(&mut self, p: Participant) {
        debug_assert!(!p.is_host());
        let idx = p.index() - 1;
        let stream = &mut self.streams[idx];
        if stream.host_seen != self.host_version {
            stream.clock.join(&self.host);
            stream.host_seen = self.host_version;
        }
        if p == Self::DEFAULT {
            for i in 0..self.blocking0.len() {
                let b = self.blocking0[i].index() - 1;
                let (d, other) = pick2(&mut self.streams, 0, b);
                d.clock.join(&other.clock);
            }
        } else if self.streams[idx].blocking && self.streams[idx].device == 0 {
            let (s, d) = pick2(&mut self.streams, idx, 0);
            s.clock.join(&d.clock);
        }
    }

    /// The clock an op on stream `p` issued now would have: [`begin_stream_op`]'s joins
    /// (rules 2 and 5), without changing anything.
    ///
    /// [`begin_stream_op`]: Order::begin_stream_op
    pub fn issue_clock(&self, p: Participant) -> VectorClock {
        if p.is_host() {
            return self.host.clone();
        }
        let idx = p.index() - 1;
        let mut clock = self.streams[idx].clock.clone();
        clock.join(&self.host);
        if p == Self::DEFAULT {
            for b in &self.blocking0 {
                clock.join(&self.streams[b.index() - 1].clock);
            }
        } else if self.streams[idx].blocking && self.streams[idx].device == 0 {
            clock.join(&self.streams[0].clock);
        }
        clock
    }

    /// Advances `p`'s own component for an access and returns its epoch.
    #[inline]
    pub fn tick(&mut self, p: Participant) -> Epoch {
        self.clock_mut(p).tick(p)
    }

    /// `event_record`: the event captures the work issued on `p` so far.
    pub fn record(&mut self, event: &Id, p: Participant) {
        self.begin_stream_op(p);
        let clock = &self.streams[p.index() - 1].clock;
        match self.events.get_mut(event) {
            Some(EventState { capture: Some(c) }) => c.clone_from(clock),
            Some(state) => state.capture = Some(clock.clone()),
            None => {
                self.events.insert(
                    event.clone(),
                    EventState {
                        capture: Some(clock.clone()),
                    },
                );
            }
        }
    }

    /// `event_wait`: later work on `p` waits for the event's capture.
    pub fn wait(&mut self, p: Participant, event: &Id) -> Wait {
        self.begin_stream_op(p);
        match self.events.get(event).and_then(|e| e.capture.as_ref()) {
            Some(capture) => {
                self.streams[p.index() - 1].clock.join(capture);
                Wait::Joined
            }
            None => Wait::Unrecorded,
        }
    }

    /// Whether `event` holds a capture: it was recorded, and not reset or destroyed since.
    pub fn is_recorded(&self, event: &Id) -> bool {
        self.events.get(event).is_some_and(|e| e.capture.is_some())
    }

    /// `event_create` and `event_destroy`: the event becomes never-recorded.
    pub fn reset_event(&mut self, event: &Id) {
        if let Some(e) = self.events.get_mut(event) {
            e.capture = None;
        }
    }

    /// `event_sync` (and a successful `event_query`): the host waits for the event's capture.
    pub fn event_sync(&mut self, event: &Id) {
        if let Some(capture) = self.events.get(event).and_then(|e| e.capture.as_ref()) {
            self.host.join(capture);
            self.host_version += 1;
        }
    }

    /// `stream_sync` (and a successful `stream_query`): the host waits for the work issued on
    /// `p`; for the legacy default stream, also for the blocking streams of device 0.
    pub fn stream_sync(&mut self, p: Participant) {
        self.host_version += 1;
        let Order {
            host,
            streams,
            blocking0,
            ..
        } = self;
        host.join(&streams[p.index() - 1].clock);
        if p == Self::DEFAULT {
            for b in blocking0.iter() {
                host.join(&streams[b.index() - 1].clock);
            }
        }
    }

    /// `device_sync`: the host waits for all work issued on every stream of `device`.
    pub fn device_sync(&mut self, device: u64) {
        self.host_version += 1;
        let Order { host, streams, .. } = self;
        for s in streams.iter().filter(|s| s.device == device && !s.replay) {
            host.join(&s.clock);
        }
    }

    /// The device of stream `p` (the host has none; 0 is returned for it).
    pub fn device(&self, p: Participant) -> u64 {
        if p.is_host() {
            0
        } else {
            self.info(p).device
        }
    }
}

/// Two distinct mutable elements of a slice.
fn pick2<T>(v: &mut [T], a: usize, b: usize) -> (&mut T, &T) {
    debug_assert_ne!(a, b);
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        (&mut lo[a], &hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(a);
        (&mut hi[0], &lo[b])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Id {
        Id::from(s)
    }

    #[test]
    fn event_orders_streams_and_rerecord_replaces() {
        let mut o = Order::new();
        let (s1, s2) = (o.stream(&id("s1")), o.stream(&id("s2")));
        o.begin_stream_op(s1);
        let w = o.tick(s1);
        o.record(&id("e"), s1);
        o.begin_stream_op(s1);
        let w2 = o.tick(s1);
        assert_eq!(o.wait(s2, &id("e")), Wait::Joined);
        assert!(o.clock(s2).covers(w));
        assert!(!o.clock(s2).covers(w2), "the capture is a snapshot");
        o.reset_event(&id("e"));
        assert_eq!(o.wait(s2, &id("e")), Wait::Unrecorded);
    }

    #[test]
    fn legacy_default_stream_edges() {
        let mut o = Order::new();
        let b = o.create_stream(&id("b"), 0, true).unwrap();
        let n = o.stream(&id("n"));
        o.begin_stream_op(b);
        let wb = o.tick(b);
        o.begin_stream_op(n);
        let wn = o.tick(n);
        o.begin_stream_op(Order::DEFAULT);
        assert!(o.clock(Order::DEFAULT).covers(wb));
        assert!(
            !o.clock(Order::DEFAULT).covers(wn),
            "non-blocking streams have no implicit edge"
        );
        let wd = o.tick(Order::DEFAULT);
        o.begin_stream_op(b);
        assert!(o.clock(b).covers(wd));
        o.stream_sync(Order::DEFAULT);
        assert!(o.host_clock().covers(wb));
    }

    #[test]
    fn redeclaring_a_stream() {
        let mut o = Order::new();
        o.stream(&id("s"));
        assert!(o.create_stream(&id("s"), 0, false).is_ok());
        assert!(matches!(
            o.create_stream(&id("s"), 0, true),
            Err(StreamError::Redeclared { implicit: true, .. })
        ));
        assert_eq!(
            o.create_stream(&id("default"), 0, false),
            Err(StreamError::LegacyDefault)
        );
    }
}
