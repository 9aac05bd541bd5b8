//! One entry point for a test, in the spirit of `loom::model`: [`model`] runs a closure against a
//! fresh [`CudaContext`] of the cudarc-shaped facade, checks
//! everything it did, and fails the test with the report if it has a hazard.
//!
//! ```
//! use streamsan::cudarc::driver::{CudaSlice, DriverError};
//!
//! streamsan::model(|cx| -> Result<(), DriverError> {
//!     let ctx = cx.ctx();
//!     let s1 = ctx.new_stream()?;
//!     let s2 = s1.fork()?; // s2 waits for s1's work so far
//!     let a: CudaSlice<f32> = s1.clone_htod(&[1.0, 2.0, 3.0])?;
//!     s2.join(&s1)?; // without this, the copy below races with the upload
//!     let _b = s2.clone_dtod(&a)?;
//!     s1.join(&s2)?; // without this, dropping `a` on s1 frees memory s2 still reads
//!     Ok(())
//! });
//! ```
//!
//! [`model`] uses [`Builder::new`], whose fields take their defaults from environment variables
//! (each field's doc names its variable), so CI can move every model test to the GPU, or pin them
//! to the simulator, without touching the tests.
//!
//! What a run does:
//! 1. picks the backend: the simulator, or a GPU ([`Backend`]); where a GPU is needed and there is
//!    none it prints `skipped: <reason>` and returns (the test passes), unless
//!    `STREAMSAN_REQUIRE_GPU=1` ([`Builder::require_gpu`]) makes that a failure;
//! 2. on a GPU, takes one process-wide lock for the whole run, so that model tests running on
//!    parallel test threads use the device one at a time;
//! 3. runs the closure with a new [`Cx`]; its handles are dropped (their memory freed, in the
//!    trace too) when it returns;
//! 4. checks the whole run; on a hazard it writes the trace to [`Builder::trace_dir`], prints
//!    `replay: streamsan check <path>`, and panics with the text report;
//! 5. with [`Builder::syncs`] (`STREAMSAN_SYNCS=1`), says which of the run's synchronizations
//!    were needed and which were redundant, by call site (on standard error for a clean run; the
//!    failing report lists them too).
//!
//! The closure may return `()` or `Result<(), E>` for any `E: Debug` (an `Err` fails the run).
//! [`Builder::check`] does the same without panicking on a hazard and returns the [`Checked`]
//! run: for tests that assert the hazards themselves, and for property tests (a proptest body
//! can call it once per case).

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::cudarc::driver::{CudaContext, DriverError};
use crate::report::{render_text, Report, TextOptions};
use crate::session::{BackendKind, Session, SessionConfig, SessionError};

/// `STREAMSAN_BACKEND`: `sim`, `cuda` or `auto`.
pub const BACKEND_ENV: &str = "STREAMSAN_BACKEND";
/// `STREAMSAN_DEVICE`: the GPU ordinal.
pub const DEVICE_ENV: &str = "STREAMSAN_DEVICE";
/// `STREAMSAN_TRACE_DIR`: where the traces of failing runs go.
pub const TRACE_DIR_ENV: &str = "STREAMSAN_TRACE_DIR";
/// `STREAMSAN_SYNCS`: run the synchronization analysis (set, and neither empty nor `0`).
pub const SYNCS_ENV: &str = "STREAMSAN_SYNCS";
/// `STREAMSAN_REQUIRE_GPU`: a missing GPU fails instead of skipping (the device layer's
/// variable: `streamsan::cuda::REQUIRE_GPU_ENV`).
pub const REQUIRE_GPU_ENV: &str = "STREAMSAN_REQUIRE_GPU";

/// Which backend a model runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The CPU simulator: every machine, deterministic.
    Sim,
    /// A GPU: skipped where there is none (failed under `STREAMSAN_REQUIRE_GPU=1`).
    Cuda,
    /// A GPU where there is one, else the simulator — except under `STREAMSAN_REQUIRE_GPU=1`,
    /// where a missing GPU fails.
    Auto,
}

impl Backend {
    /// `sim`, `cuda` or `auto`, as [`BACKEND_ENV`] spells them.
    pub fn parse(s: &str) -> Option<Backend> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sim" | "simulator" => Some(Backend::Sim),
            "cuda" | "gpu" => Some(Backend::Cuda),
            "auto" | "" => Some(Backend::Auto),
            _ => None,
        }
    }
}

/// Every knob of a model run. [`Builder::new`] reads each default from its environment variable.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Builder {
    /// The backend. Default from `STREAMSAN_BACKEND` (`sim`, `cuda` or `auto`), else
    /// [`Backend::Auto`]. A value it cannot read is reported when the model runs.
    pub backend: Backend,
    /// The GPU ordinal. Default from `STREAMSAN_DEVICE`, else 0.
    pub device: usize,
    /// Where the trace of a run with a hazard is written. Default from `STREAMSAN_TRACE_DIR`,
    /// else `streamsan` in the system's temporary directory.
    pub trace_dir: PathBuf,
    /// Fail, instead of skipping, where a GPU is needed and there is none. Default from
    /// `STREAMSAN_REQUIRE_GPU` (set, and neither empty nor `0`).
    pub require_gpu: bool,
    /// The stem of trace file names. Default: the current thread's name (under `cargo test`,
    /// the test's path), else `model`.
    pub name: Option<String>,
    /// Run the synchronization analysis: which of the run's synchronizations (event waits,
    /// host syncs, `record_stream`) its memory safety needed, and which it paid for for
    /// nothing, by call site. [`Builder::run`] prints them on standard error for a clean run;
    /// they never fail one. Default from `STREAMSAN_SYNCS` (set, and neither empty nor `0`).
    pub syncs: bool,
    /// Why the environment could not be read, if it could not (reported when the model runs).
    env_error: Option<String>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    /// The defaults, from the environment (see each field).
    pub fn new() -> Builder {
        let mut env_error = None;
        let backend = match std::env::var(BACKEND_ENV) {
            Ok(v) => Backend::parse(&v).unwrap_or_else(|| {
                env_error = Some(format!("{BACKEND_ENV}={v:?}: expected sim, cuda or auto"));
                Backend::Auto
            }),
            Err(_) => Backend::Auto,
        };
        let device = match std::env::var(DEVICE_ENV) {
            Ok(v) => v.trim().parse().unwrap_or_else(|_| {
                env_error = Some(format!("{DEVICE_ENV}={v:?}: expected a GPU ordinal"));
                0
            }),
            Err(_) => 0,
        };
        let trace_dir = std::env::var_os(TRACE_DIR_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("streamsan"));
        let require_gpu =
            std::env::var_os(REQUIRE_GPU_ENV).is_some_and(|v| !v.is_empty() && v != "0");
        let syncs = std::env::var_os(SYNCS_ENV).is_some_and(|v| !v.is_empty() && v != "0");
        Builder {
            backend,
            device,
            trace_dir,
            require_gpu,
            name: None,
            syncs,
            env_error,
        }
    }

    /// Runs `f` once and fails on a hazard: see the [module docs](self).
    ///
    /// # Panics
    ///
    /// With the text report where the run has a hazard of severity error; where `f` fails;
    /// where a GPU is required and there is none; where the environment cannot be read.
    #[track_caller]
    pub fn run<F, R>(&self, f: F)
    where
        F: FnOnce(&Cx) -> R,
        R: ModelResult,
    {
        match self.check(f) {
            Ok(Outcome::Ran(checked)) => {
                if !checked.report.is_clean() {
                    let text = render_text(&checked.report, &TextOptions::plain());
                    let replay = match &checked.trace {
                        Some(p) => format!("replay: streamsan check {}", p.display()),
                        None => "(the trace could not be written)".to_owned(),
                    };
                    eprintln!("{replay}");
                    panic!("streamsan found hazards:\n{text}{replay}");
                }
                if let Some(syncs) = &checked.report.syncs {
                    eprint!(
                        "{}",
                        crate::analysis::syncs::render_text(syncs, checked.report.is_clean())
                    );
                }
            }
            Ok(Outcome::Skipped(reason)) => {
                println!("skipped: {reason} (set {REQUIRE_GPU_ENV}=1 to fail instead)");
            }
            Err(e) => panic!("streamsan::model: {e}"),
        }
    }

    /// Runs `f` once and returns the checked run (or why it was skipped), without panicking on
    /// a hazard. Writes the trace of a run with a hazard of severity error, as [`Builder::run`].
    pub fn check<F, R>(&self, f: F) -> Result<Outcome, ModelError>
    where
        F: FnOnce(&Cx) -> R,
        R: ModelResult,
    {
        if let Some(e) = &self.env_error {
            return Err(ModelError::Env(e.clone()));
        }
        let config = SessionConfig {
            syncs: self.syncs,
            ..SessionConfig::default()
        };
        let session = match self.pick()? {
            Pick::Sim => {
                Session::simulated_with(config).map_err(|e| ModelError::Session(e.into()))?
            }
            Pick::Cuda => match cuda_session(self.device, config) {
                Ok(s) => s,
                Err(SessionError::NoGpu { reason }) => return self.no_gpu(reason),
                Err(e) => return Err(ModelError::Session(e.into())),
            },
            Pick::Skip(reason) => return Ok(Outcome::Skipped(reason)),
        };
        let backend = session.backend();
        let _device = (backend != BackendKind::Simulated)
            .then(|| DEVICE_LOCK.lock().unwrap_or_else(PoisonError::into_inner));
        let cx = Cx {
            ctx: CudaContext::from_session(session),
        };
        let result = f(&cx).into_result();
        let ctx = cx.ctx;
        result.map_err(ModelError::Failed)?;
        let hazards = ctx
            .session()
            .hazards()
            .map_err(|e| ModelError::Session(e.into()))?;
        let trace = if hazards.iter().any(|h| h.is_error()) {
            let path = self.trace_path();
            let written = std::fs::create_dir_all(&self.trace_dir)
                .map_err(SessionError::from)
                .and_then(|()| ctx.session().write_trace(&path));
            written.ok().map(|()| path)
        } else {
            None
        };
        let report = ctx.finish().map_err(ModelError::Session)?;
        Ok(Outcome::Ran(Checked {
            report,
            trace,
            backend,
        }))
    }

    fn pick(&self) -> Result<Pick, ModelError> {
        match self.backend {
            Backend::Sim => Ok(Pick::Sim),
            Backend::Cuda => match gpu_missing() {
                None => Ok(Pick::Cuda),
                Some(reason) => self.no_gpu(reason).map(|o| match o {
                    Outcome::Skipped(r) => Pick::Skip(r),
                    Outcome::Ran(_) => Pick::Cuda,
                }),
            },
            Backend::Auto => match gpu_missing() {
                None => Ok(Pick::Cuda),
                Some(reason) if self.require_gpu => Err(ModelError::NoGpu(reason)),
                Some(_) => Ok(Pick::Sim),
            },
        }
    }

    fn no_gpu(&self, reason: String) -> Result<Outcome, ModelError> {
        if self.require_gpu {
            Err(ModelError::NoGpu(reason))
        } else {
            Ok(Outcome::Skipped(reason))
        }
    }

    fn trace_path(&self) -> PathBuf {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let stem = self
            .name
            .clone()
            .or_else(|| std::thread::current().name().map(str::to_owned))
            .unwrap_or_else(|| "model".into());
        let stem: String = stem
            .chars()
            .map(|c| {
                if c.is_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        self.trace_dir
            .join(format!("{stem}-{}-{run}.jsonl", std::process::id()))
    }
}

enum Pick {
    Sim,
    Cuda,
    Skip(String),
}

/// The one lock of the process around every model run on a GPU.
static DEVICE_LOCK: Mutex<()> = Mutex::new(());

/// Why there is no GPU here, or `None` where there is one.
fn gpu_missing() -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        match crate::cuda::Gpu::device_count() {
            Ok(n) if n > 0 => None,
            Ok(_) => Some(crate::cuda::GpuError::NoDevice.to_string()),
            Err(e) => Some(e.to_string()),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        Some("streamsan was built without the `cuda` feature".into())
    }
}

#[cfg(feature = "cuda")]
fn cuda_session(device: usize, config: SessionConfig) -> Result<Session, SessionError> {
    Session::cuda_with(device, config)
}

#[cfg(not(feature = "cuda"))]
fn cuda_session(_device: usize, _config: SessionConfig) -> Result<Session, SessionError> {
    Err(SessionError::NoGpu {
        reason: "streamsan was built without the `cuda` feature".into(),
    })
}

/// What a model's closure gets: the context, and through it the session.
pub struct Cx {
    ctx: Arc<CudaContext>,
}

impl fmt::Debug for Cx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cx").field("ctx", &self.ctx).finish()
    }
}

impl Cx {
    /// The facade's context (cudarc's `CudaContext`) on the run's backend.
    pub fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The session that records and checks the run.
    pub fn session(&self) -> &Session {
        self.ctx.session()
    }

    /// Whether the run is on the CPU simulator (kernels run as the hash kernel there: values
    /// differ from the GPU's, hazards do not).
    pub fn is_simulated(&self) -> bool {
        self.ctx.is_simulated()
    }
}

/// What a model's closure may return: `()`, or `Result<(), E>` with `E: Debug`.
pub trait ModelResult {
    /// `Err` with the failure's text if the closure failed.
    fn into_result(self) -> Result<(), String>;
}

impl ModelResult for () {
    fn into_result(self) -> Result<(), String> {
        Ok(())
    }
}

impl<E: fmt::Debug> ModelResult for Result<(), E> {
    fn into_result(self) -> Result<(), String> {
        self.map_err(|e| format!("{e:?}"))
    }
}

/// A run that happened.
#[derive(Debug)]
#[non_exhaustive]
pub struct Checked {
    /// The report of the whole run (with `why:` explanations).
    pub report: Report,
    /// The trace written for a run with a hazard of severity error: `streamsan check` on it
    /// reproduces the report.
    pub trace: Option<PathBuf>,
    /// Where it ran.
    pub backend: BackendKind,
}

/// What [`Builder::check`] did.
#[derive(Debug)]
pub enum Outcome {
    /// The closure ran and the run was checked.
    Ran(Checked),
    /// There is no GPU for a backend that needs one: the reason.
    Skipped(String),
}

impl Outcome {
    /// The checked run, or `None` if it was skipped.
    pub fn ran(self) -> Option<Checked> {
        match self {
            Outcome::Ran(c) => Some(c),
            Outcome::Skipped(_) => None,
        }
    }
}

/// Why a model could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// An environment variable could not be read.
    #[error("{0}")]
    Env(String),
    /// A GPU is required (`STREAMSAN_REQUIRE_GPU=1`) and there is none.
    #[error("{REQUIRE_GPU_ENV} is set but there is no GPU: {0}")]
    NoGpu(String),
    /// The session failed.
    #[error("the session failed: {0}")]
    Session(DriverError),
    /// The closure returned an error.
    #[error("the model failed: {0}")]
    Failed(String),
}

/// Runs `f` once with [`Builder::new`]'s settings and panics on a hazard: see the
/// [module docs](mod@crate::model).
#[track_caller]
pub fn model<F, R>(f: F)
where
    F: FnOnce(&Cx) -> R,
    R: ModelResult,
{
    Builder::new().run(f)
}
