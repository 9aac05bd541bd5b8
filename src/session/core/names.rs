//! The names a session gives its streams, events and buffers, and the rules names follow.

use std::collections::HashSet;

use super::error::SessionError;
use crate::trace::{Id, MemoryKind, DEFAULT_STREAM, HOST};

/// Which counter a fresh name comes from.
#[derive(Clone, Copy)]
enum Counter {
    Streams = 0,
    Events = 1,
    Device = 2,
    Pinned = 3,
}

/// Every name a session gave or was given.
pub(crate) struct Names {
    counters: [u64; 4],
    streams: HashSet<Id>,
    /// Names of live buffers.
    live: HashSet<Id>,
    /// Names of every buffer ever allocated or declared external.
    used: HashSet<Id>,
    external: HashSet<Id>,
}

impl Names {
    pub(crate) fn new() -> Self {
        Names {
            counters: [0; 4],
            streams: HashSet::from([Id::from(DEFAULT_STREAM), Id::from(HOST)]),
            live: HashSet::new(),
            used: HashSet::new(),
            external: HashSet::new(),
        }
    }

    fn fresh(&mut self, which: Counter, prefix: &str) -> Id {
        loop {
            self.counters[which as usize] += 1;
            let id = Id::from(format!("{prefix}{}", self.counters[which as usize]));
            let taken = match which {
                Counter::Streams => self.streams.contains(&id),
                Counter::Events => false,
                Counter::Device | Counter::Pinned => self.used.contains(&id),
            };
            if !taken {
                return id;
            }
        }
    }

    /// The name of a new stream: `name`, or `s1`, `s2`, … (not `"host"` or `"default"`, not the
    /// name of another stream). Not taken until [`Names::add_stream`].
    pub(crate) fn stream(&mut self, name: Option<&str>) -> Result<Id, SessionError> {
        match name {
            None => Ok(self.fresh(Counter::Streams, "s")),
            Some(n) => {
                if n.is_empty() || n == HOST || n == DEFAULT_STREAM {
                    return Err(SessionError::InvalidArgument(format!(
                        "{n:?} cannot name a stream (empty, or reserved)"
                    )));
                }
                let id = Id::from(n);
                if self.streams.contains(&id) {
                    return Err(SessionError::InvalidArgument(format!(
                        "this session already has a stream named {n:?}"
                    )));
                }
                Ok(id)
            }
        }
    }

    /// Takes a stream's name.
    pub(crate) fn add_stream(&mut self, id: &Id) {
        self.streams.insert(id.clone());
    }

    /// The name of a new event: `e1`, `e2`, …
    pub(crate) fn event(&mut self) -> Id {
        self.fresh(Counter::Events, "e")
    }

    /// The name of a new buffer: `name`, or `b1`, … (device) and `p1`, … (pinned); not the name
    /// of a live or external buffer. Not taken until [`Names::add_buffer`].
    pub(crate) fn buffer(
        &mut self,
        name: Option<&str>,
        memory: MemoryKind,
    ) -> Result<Id, SessionError> {
        match name {
            None if memory == MemoryKind::Device => Ok(self.fresh(Counter::Device, "b")),
            None => Ok(self.fresh(Counter::Pinned, "p")),
            Some(n) => {
                let id = Id::from(n);
                if n.is_empty() || self.live.contains(&id) || self.external.contains(&id) {
                    return Err(SessionError::InvalidArgument(format!(
                        "{n:?} cannot name a buffer: empty, or the name of a live or external buffer"
                    )));
                }
                Ok(id)
            }
        }
    }

    /// Takes a live buffer's name.
    pub(crate) fn add_buffer(&mut self, id: &Id) {
        self.live.insert(id.clone());
        self.used.insert(id.clone());
    }

    /// Gives a freed buffer's name back (it may be allocated again).
    pub(crate) fn remove_buffer(&mut self, id: &Id) {
        self.live.remove(id);
    }

    /// Takes the name of an external buffer: not empty, and never a buffer's name before.
    pub(crate) fn external(&mut self, name: &str) -> Result<Id, SessionError> {
        let id = Id::from(name);
        if name.is_empty() || self.used.contains(&id) {
            return Err(SessionError::InvalidArgument(format!(
                "{name:?} cannot name an external buffer: empty, or already a buffer's name"
            )));
        }
        self.used.insert(id.clone());
        self.external.insert(id.clone());
        Ok(id)
    }
}
