//! Kernel launches: a builder that declares what a kernel reads and writes, then runs the built-in
//! hash kernel or a user kernel.

use std::borrow::Cow;
use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use super::buffer::AsRegion;
use super::core::{Core, LaunchDesc, Region, Regions, SessionError};
use super::handle::Stream;

pub use super::core::{LaunchError, RawLaunch};

/// A kernel launch being declared: made by [`Session::launch`](super::Session::launch), finished by
/// [`Launch::hash`] or [`Launch::run`].
///
/// ```
/// # use streamsan::session::Session;
/// # fn main() -> Result<(), streamsan::session::SessionError> {
/// let session = Session::simulated();
/// let s = session.stream()?;
/// let a = session.alloc::<u32>(&s, 256)?;
/// let mut b = session.alloc::<u32>(&s, 256)?;
/// session.launch(&s, "scale").read(&a).write(&mut b).hash()?;
/// // A view at an offset: only the second half of `b` is written.
/// session.launch(&s, "tail").writes(b.slice(128..)).hash()?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a launch does nothing until `hash` or `run` is called"]
pub struct Launch<'a> {
    pub(crate) core: &'a Arc<Core>,
    pub(crate) stream: &'a Stream,
    pub(crate) desc: LaunchDesc,
}

impl fmt::Debug for Launch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("stream", &self.stream.id())
            .field("name", &self.desc.name)
            .field("reads", &self.desc.reads)
            .field("writes", &self.desc.writes)
            .field("spin_ns", &self.desc.spin_ns)
            .finish()
    }
}

impl<'a> Launch<'a> {
    pub(crate) fn new(
        core: &'a Arc<Core>,
        stream: &'a Stream,
        name: Cow<'static, str>,
        site: &'static Location<'static>,
    ) -> Self {
        Launch {
            core,
            stream,
            desc: LaunchDesc {
                name,
                reads: Regions::default(),
                writes: Regions::default(),
                spin_ns: 0,
                site,
            },
        }
    }

    /// The kernel reads `buffer` (a whole buffer, or a region).
    pub fn read(mut self, buffer: &impl AsRegion) -> Self {
        self.desc.reads.push(buffer.region());
        self
    }

    /// The kernel writes `buffer` (a whole buffer, or a region). A region both read and written
    /// counts as written.
    pub fn write(mut self, buffer: &mut impl AsRegion) -> Self {
        self.desc.writes.push(buffer.region());
        self
    }

    /// The kernel reads `region` (a view, or an external region).
    pub fn reads(mut self, region: Region) -> Self {
        self.desc.reads.push(region);
        self
    }

    /// The kernel writes `region` (a view, or an external region).
    pub fn writes(mut self, region: Region) -> Self {
        self.desc.writes.push(region);
        self
    }

    /// Keeps the stream busy for `ns` nanoseconds before the kernel starts, to widen race windows.
    ///
    /// On a GPU this enqueues a one-thread `spin` kernel first (unrecorded: it touches no memory
    /// and orders nothing its stream does not already order). On the simulator the stream lags:
    /// this launch and everything after it on the stream run only when an ordering forces them.
    /// The result of the launch does not change.
    pub fn spin(mut self, ns: u64) -> Self {
        self.desc.spin_ns = ns;
        self
    }

    /// Runs the built-in hash kernel (`crate::kernels`): each write region `j` becomes
    /// `hash_word(op, j, i, reads[..][i])`, one kernel per write region on a GPU, where `op` is the
    /// launch's op index (returned). At most `MAX_READS` reads.
    #[inline]
    pub fn hash(mut self) -> Result<u64, SessionError> {
        self.core.launch_hash(self.stream.key(), &mut self.desc)
    }

    /// Runs a user kernel: `f` gets the raw stream and the declared regions, enqueues its work,
    /// and the launch is recorded with the declared reads and writes. Returns the op index.
    ///
    /// On the simulator `f` runs with the stream up to date (any lag is run first) and may read and
    /// write the declared regions with [`RawLaunch::read_words`] and [`RawLaunch::write_words`]. It
    /// runs under the session's lock: calling the session from `f` is
    /// [`SessionError::Reentrant`].
    ///
    /// # Safety
    ///
    /// On a GPU, the work `f` enqueues must be enqueued on [`RawLaunch::cu_stream`] only, must not
    /// synchronize or destroy it, and must touch only memory that stays valid until it completes:
    /// the declared regions (session memory stays mapped until the session ends) or memory the
    /// caller owns. It must not write host memory that Rust code holds a reference to. Touching
    /// memory outside the declared regions is not undefined behaviour by itself, but the report
    /// then misses those accesses.
    pub unsafe fn run<F>(mut self, mut f: F) -> Result<u64, SessionError>
    where
        F: FnMut(&RawLaunch<'_>) -> Result<(), LaunchError>,
    {
        self.core
            .launch_run(self.stream.key(), &mut self.desc, &mut f)
    }
}
