//! The context, the error type and the pieces every other file of the facade shares.

use std::collections::HashSet;
use std::fmt;
use std::panic::Location;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::report::Report;
use crate::session::{Session, SessionError};

/// What can go wrong in a call of the facade: cudarc's `DriverError`, carrying the session's
/// error (a driver failure on a GPU, an allocation failure, a bad argument, …).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct DriverError(#[from] SessionError);

impl DriverError {
    /// The session's error behind it.
    pub fn session_error(&self) -> &SessionError {
        &self.0
    }

    /// The session's error behind it, by value.
    pub fn into_session_error(self) -> SessionError {
        self.0
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        DriverError(SessionError::InvalidArgument(message.into()))
    }
}

/// The flags of a new event, as cudarc takes them (`None`: `CU_EVENT_DISABLE_TIMING`). The
/// facade's events only order work, so every flag gives the same event.
#[cfg(feature = "cuda")]
pub type EventFlags = ::cudarc::driver::sys::CUevent_flags;

/// The flags of a new event, as cudarc takes them (`None`: `CU_EVENT_DISABLE_TIMING`). The
/// facade's events only order work, so every flag gives the same event.
#[cfg(not(feature = "cuda"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum EventFlags {
    /// `CU_EVENT_DEFAULT`.
    CU_EVENT_DEFAULT,
    /// `CU_EVENT_BLOCKING_SYNC`.
    CU_EVENT_BLOCKING_SYNC,
    /// `CU_EVENT_DISABLE_TIMING`.
    CU_EVENT_DISABLE_TIMING,
}

/// One device, as cudarc's `CudaContext`: the [`Session`] that records and checks every call made
/// through its streams, events, slices and modules.
///
/// Made by [`CudaContext::new`] (a GPU), [`CudaContext::simulated`] (the CPU simulator),
/// [`CudaContext::from_session`], or by [`crate::model()`], which hands one to the test.
/// cudarc's event tracking does not exist here: every cross-stream order is the program's own,
/// which is what the checker checks.
pub struct CudaContext {
    pub(crate) session: Session,
    ordinal: usize,
}

impl fmt::Debug for CudaContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaContext")
            .field("backend", &self.session.backend())
            .finish_non_exhaustive()
    }
}

impl CudaContext {
    /// A context on CUDA device `ordinal`, with a new checked [`Session`] on it
    /// ([`Session::cuda`]). Where there is no GPU the error is [`SessionError::NoGpu`] (never a
    /// panic).
    pub fn new(ordinal: usize) -> Result<Arc<Self>, DriverError> {
        #[cfg(feature = "cuda")]
        {
            Ok(Self::from_session_on(Session::cuda(ordinal)?, ordinal))
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(DriverError(SessionError::NoGpu {
                reason: format!("device {ordinal}: streamsan was built without the `cuda` feature"),
            }))
        }
    }

    /// A context on the CPU simulator, with a new checked [`Session`] ([`Session::simulated`]).
    pub fn simulated() -> Result<Arc<Self>, DriverError> {
        Ok(Self::from_session(Session::simulated_with(
            crate::session::SessionConfig::default(),
        )?))
    }

    /// A context over an existing session (any backend, any [`SessionConfig`](crate::session::SessionConfig)).
    pub fn from_session(session: Session) -> Arc<Self> {
        let ordinal = match session.backend() {
            crate::session::BackendKind::Cuda { ordinal } => ordinal,
            crate::session::BackendKind::Simulated => 0,
        };
        Self::from_session_on(session, ordinal)
    }

    fn from_session_on(session: Session, ordinal: usize) -> Arc<Self> {
        Arc::new(CudaContext { session, ordinal })
    }

    /// The session that records and checks this context's calls: its report, its trace, and the
    /// calls the facade does not have (`record_stream`, external regions, blocking streams).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Whether this context runs on the CPU simulator.
    pub fn is_simulated(&self) -> bool {
        self.session.is_simulated()
    }

    /// The device ordinal (0 on the simulator).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Blocks the host until all work of the device is done (`cuCtxSynchronize`): a
    /// `device_sync`.
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), DriverError> {
        Ok(self.session.core().device_sync(Location::caller())?)
    }

    /// Whether cudarc's automatic event tracking is on: never, here. The facade adds no
    /// synchronization of its own, so the checker sees the program's.
    pub fn is_event_tracking(&self) -> bool {
        false
    }

    /// Does nothing: event tracking is always off in the facade. Kept so that cudarc code that
    /// turns it off compiles unchanged.
    ///
    /// # Safety
    ///
    /// None needed here; `unsafe` only to match cudarc's signature.
    pub unsafe fn disable_event_tracking(&self) {}

    /// Free and total device memory in bytes: on a GPU the driver's (`cuMemGetInfo`), on the
    /// simulator what the session's allocator has reserved against its capacity is not tracked,
    /// so this is an error there.
    pub fn mem_get_info(&self) -> Result<(usize, usize), DriverError> {
        #[cfg(feature = "cuda")]
        if let Some(ctx) = self.session.context() {
            return ctx
                .mem_get_info()
                .map_err(|e| DriverError(SessionError::Gpu(crate::cuda::GpuError::from(e))));
        }
        Err(DriverError::invalid(
            "mem_get_info: the simulator has no driver memory counters",
        ))
    }

    /// Ends recording and returns the report of every hazard found so far ([`Session::finish`]).
    /// Later calls through this context's handles return [`SessionError::Finished`].
    pub fn finish(&self) -> Result<Report, DriverError> {
        Ok(self.session.core().finish()?)
    }
}

/// `name` as a `&'static str`, leaked once per distinct name in the process: kernel names are
/// recorded with every launch, and a static name costs nothing to record.
pub(crate) fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(&n) = names.get(name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}
