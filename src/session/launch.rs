//! Kernel launches: a builder that declares what a kernel reads and writes, then runs the built-in
//! hash kernel or a user kernel.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use super::buffer::{AsRegion, Region, Regions};
use super::sim::SimBackend;
use super::state::Shared;
use super::{SessionError, Stream};

/// The error a user kernel of [`Launch::run`] returns.
pub type LaunchError = Box<dyn std::error::Error + Send + Sync>;

/// A user kernel as [`Launch::run`] passes it on.
pub(crate) type KernelFn<'f> = dyn FnMut(&RawLaunch<'_>) -> Result<(), LaunchError> + 'f;

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
    pub(crate) shared: &'a Arc<Shared>,
    pub(crate) stream: &'a Stream,
    pub(crate) name: Cow<'static, str>,
    pub(crate) reads: Regions,
    pub(crate) writes: Regions,
    pub(crate) spin_ns: u64,
    pub(crate) site: &'static Location<'static>,
}

impl fmt::Debug for Launch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("stream", &self.stream.id())
            .field("name", &self.name)
            .field("reads", &self.reads)
            .field("writes", &self.writes)
            .field("spin_ns", &self.spin_ns)
            .finish()
    }
}

impl<'a> Launch<'a> {
    pub(crate) fn new(
        shared: &'a Arc<Shared>,
        stream: &'a Stream,
        name: Cow<'static, str>,
        site: &'static Location<'static>,
    ) -> Self {
        Launch {
            shared,
            stream,
            name,
            reads: Regions::default(),
            writes: Regions::default(),
            spin_ns: 0,
            site,
        }
    }

    /// The kernel reads `buffer` (a whole buffer, or a region).
    pub fn read(mut self, buffer: &impl AsRegion) -> Self {
        self.reads.push(buffer.region());
        self
    }

    /// The kernel writes `buffer` (a whole buffer, or a region). A region both read and written
    /// counts as written.
    pub fn write(mut self, buffer: &mut impl AsRegion) -> Self {
        self.writes.push(buffer.region());
        self
    }

    /// The kernel reads `region` (a view, or an external region).
    pub fn reads(mut self, region: Region) -> Self {
        self.reads.push(region);
        self
    }

    /// The kernel writes `region` (a view, or an external region).
    pub fn writes(mut self, region: Region) -> Self {
        self.writes.push(region);
        self
    }

    /// Keeps the stream busy for `ns` nanoseconds before the kernel starts, to widen race windows.
    ///
    /// On a GPU this enqueues a one-thread `spin` kernel first (unrecorded: it touches no memory
    /// and orders nothing its stream does not already order). On the simulator the stream lags:
    /// this launch and everything after it on the stream run only when an ordering forces them.
    /// The result of the launch does not change.
    pub fn spin(mut self, ns: u64) -> Self {
        self.spin_ns = ns;
        self
    }

    /// Runs the built-in hash kernel ([`crate::kernels`]): each write region `j` becomes
    /// `hash_word(op, j, i, reads[..][i])`, one kernel per write region on a GPU, where `op` is the
    /// launch's op index (returned). At most [`MAX_READS`](crate::kernels::MAX_READS) reads.
    pub fn hash(self) -> Result<u64, SessionError> {
        let shared = self.shared;
        shared.launch_hash(self)
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
    pub unsafe fn run<F>(self, mut f: F) -> Result<u64, SessionError>
    where
        F: FnMut(&RawLaunch<'_>) -> Result<(), LaunchError>,
    {
        let shared = self.shared;
        shared.launch_run(self, &mut f)
    }
}

/// Where a user kernel runs.
pub(crate) enum RawTarget<'a> {
    Sim(RefCell<&'a mut SimBackend>),
    #[cfg(feature = "cuda")]
    Cuda {
        stream: &'a crate::cuda::Stream,
        gpu: &'a crate::cuda::Gpu,
    },
}

/// What a user kernel gets from [`Launch::run`]: its op index, its declared regions, and the
/// stream (on a GPU) or the simulated memory (on the simulator).
pub struct RawLaunch<'a> {
    pub(crate) op: u64,
    pub(crate) reads: &'a [Region],
    pub(crate) writes: &'a [Region],
    pub(crate) target: RawTarget<'a>,
}

impl fmt::Debug for RawLaunch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawLaunch")
            .field("op", &self.op)
            .field("reads", &self.reads)
            .field("writes", &self.writes)
            .field("simulated", &self.is_simulated())
            .finish()
    }
}

fn inside(r: &Region, of: &[Region]) -> bool {
    of.iter().any(|d| {
        d.key == r.key
            && d.memory == r.memory
            && d.device_ptr() <= r.device_ptr()
            && r.device_ptr() + r.bytes <= d.device_ptr() + d.bytes
    })
}

impl RawLaunch<'_> {
    /// The launch's op index.
    pub fn op(&self) -> u64 {
        self.op
    }

    /// The declared read regions, in order (their `device_ptr` is what a kernel takes).
    pub fn reads(&self) -> &[Region] {
        self.reads
    }

    /// The declared write regions, in order.
    pub fn writes(&self) -> &[Region] {
        self.writes
    }

    /// Whether this launch runs on the simulator.
    pub fn is_simulated(&self) -> bool {
        matches!(self.target, RawTarget::Sim(_))
    }

    /// The raw `CUstream` to enqueue the kernel on; `None` on the simulator.
    #[cfg(feature = "cuda")]
    pub fn cu_stream(&self) -> Option<cudarc::driver::sys::CUstream> {
        match &self.target {
            RawTarget::Cuda { stream, .. } => Some(stream.raw()),
            RawTarget::Sim(_) => None,
        }
    }

    /// The device layer's stream, for [`crate::cuda::Kernels`]; `None` on the simulator.
    #[cfg(feature = "cuda")]
    pub fn stream(&self) -> Option<&crate::cuda::Stream> {
        match &self.target {
            RawTarget::Cuda { stream, .. } => Some(stream),
            RawTarget::Sim(_) => None,
        }
    }

    /// The session's device (event tracking off): its [`Kernels`](crate::cuda::Kernels) and its
    /// cudarc context, to launch functions of other modules; `None` on the simulator.
    #[cfg(feature = "cuda")]
    pub fn gpu(&self) -> Option<&crate::cuda::Gpu> {
        match &self.target {
            RawTarget::Cuda { gpu, .. } => Some(gpu),
            RawTarget::Sim(_) => None,
        }
    }

    /// On the simulator, the words of `region`, which must lie inside a declared read or write
    /// region. On a GPU, an error: read device memory with a kernel.
    pub fn read_words(&self, region: &Region) -> Result<Vec<u32>, SessionError> {
        match &self.target {
            RawTarget::Sim(b) => {
                if !inside(region, self.reads) && !inside(region, self.writes) {
                    return Err(SessionError::InvalidArgument(format!(
                        "{region:?} is not inside a declared region of the launch"
                    )));
                }
                b.borrow_mut().read(region)
            }
            #[cfg(feature = "cuda")]
            RawTarget::Cuda { .. } => Err(SessionError::InvalidArgument(
                "read_words is for the simulator; on a GPU, enqueue a kernel on cu_stream()".into(),
            )),
        }
    }

    /// On the simulator, writes the words of `region`, which must lie inside a declared write
    /// region. On a GPU, an error: write device memory with a kernel.
    pub fn write_words(&self, region: &Region, words: &[u32]) -> Result<(), SessionError> {
        match &self.target {
            RawTarget::Sim(b) => {
                if !inside(region, self.writes) {
                    return Err(SessionError::InvalidArgument(format!(
                        "{region:?} is not inside a declared write region of the launch"
                    )));
                }
                b.borrow_mut().write(region, words)
            }
            #[cfg(feature = "cuda")]
            RawTarget::Cuda { .. } => Err(SessionError::InvalidArgument(
                "write_words is for the simulator; on a GPU, enqueue a kernel on cu_stream()"
                    .into(),
            )),
        }
    }
}
