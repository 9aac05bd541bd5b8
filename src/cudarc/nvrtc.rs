//! Run-time compilation, as `cudarc::nvrtc`: [`compile_ptx`], [`compile_ptx_with_opts`],
//! [`Ptx`] and [`CompileOptions`].
//!
//! Where NVRTC can be loaded (a build with the `cuda` feature on a machine with CUDA), a source
//! is compiled at the call, as cudarc does, and its errors are returned there. Elsewhere — the
//! simulator on a machine without CUDA — the source is kept as it is: the simulator never runs
//! it (its kernels run as the hash kernel), and a GPU compiles it when the module is loaded.

use std::fmt;
use std::path::PathBuf;

#[cfg(feature = "cuda")]
use super::context::DriverError;

/// A module to load with [`CudaContext::load_module`](super::CudaContext::load_module): compiled
/// PTX, a CUDA source whose compilation was put off, PTX text, a PTX or CUBIN file, or CUBIN
/// bytes.
#[derive(Clone, Debug)]
pub struct Ptx(Inner);

#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
enum Inner {
    #[cfg(feature = "cuda")]
    Compiled(::cudarc::nvrtc::Ptx),
    Source {
        src: String,
        opts: CompileOptions,
    },
    Text(String),
    File(PathBuf),
    Binary(Vec<u8>),
}

impl Ptx {
    /// A pre-compiled `.ptx` (or `.cubin`) file.
    pub fn from_file<P: Into<PathBuf>>(path: P) -> Self {
        Ptx(Inner::File(path.into()))
    }

    /// The text of a pre-compiled `.ptx` file.
    pub fn from_src<S: Into<String>>(src: S) -> Self {
        Ptx(Inner::Text(src.into()))
    }

    /// CUBIN bytes.
    pub fn from_binary(data: Vec<u8>) -> Self {
        Ptx(Inner::Binary(data))
    }

    /// The PTX text (or, for a source whose compilation was put off, the CUDA source). Empty for
    /// CUBIN bytes and for a file that cannot be read.
    pub fn to_src(&self) -> String {
        self.text().unwrap_or_default()
    }

    /// Whether this is a CUDA source not compiled yet (no NVRTC where it was compiled).
    pub fn is_deferred(&self) -> bool {
        matches!(self.0, Inner::Source { .. })
    }

    /// The text the simulator looks function names up in.
    pub(crate) fn text(&self) -> Option<String> {
        match &self.0 {
            #[cfg(feature = "cuda")]
            Inner::Compiled(p) => p
                .as_bytes()
                .map(|b| String::from_utf8_lossy(b).trim_end_matches('\0').to_owned()),
            Inner::Source { src, .. } => Some(src.clone()),
            Inner::Text(t) => Some(t.clone()),
            Inner::File(path) => std::fs::read_to_string(path).ok(),
            Inner::Binary(_) => None,
        }
    }

    /// cudarc's `Ptx`, compiling a deferred source now.
    #[cfg(feature = "cuda")]
    pub(crate) fn into_cudarc(self) -> Result<::cudarc::nvrtc::Ptx, DriverError> {
        Ok(match self.0 {
            Inner::Compiled(p) => p,
            Inner::Source { src, opts } => match compile_now(&src, opts) {
                Ok(Some(p)) => p,
                Ok(None) => {
                    return Err(DriverError::from(crate::session::SessionError::Gpu(
                        crate::cuda::GpuError::NoNvrtc,
                    )))
                }
                Err(e) => return Err(DriverError::invalid(e.to_string())),
            },
            Inner::Text(t) => ::cudarc::nvrtc::Ptx::from_src(t),
            Inner::File(path) => ::cudarc::nvrtc::Ptx::from_file(path),
            Inner::Binary(b) => ::cudarc::nvrtc::Ptx::from_binary(b),
        })
    }
}

impl<S: Into<String>> From<S> for Ptx {
    fn from(value: S) -> Self {
        Self::from_src(value)
    }
}

/// Options of NVRTC, as cudarc's `CompileOptions` (each `None` is not passed).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct CompileOptions {
    /// `--ftz`.
    pub ftz: Option<bool>,
    /// `--prec-sqrt`.
    pub prec_sqrt: Option<bool>,
    /// `--prec-div`.
    pub prec_div: Option<bool>,
    /// `--fmad`.
    pub fmad: Option<bool>,
    /// Further options, passed as they are.
    pub options: Vec<String>,
    /// `--use_fast_math` (as cudarc passes it).
    pub use_fast_math: Option<bool>,
    /// `--maxrregcount`.
    pub maxrregcount: Option<usize>,
    /// `--include-path`, one per entry.
    pub include_paths: Vec<String>,
    /// `--gpu-architecture`.
    pub arch: Option<&'static str>,
    /// The program's name in NVRTC's messages.
    pub name: Option<String>,
}

#[cfg(feature = "cuda")]
impl CompileOptions {
    fn into_cudarc(self) -> ::cudarc::nvrtc::CompileOptions {
        ::cudarc::nvrtc::CompileOptions {
            ftz: self.ftz,
            prec_sqrt: self.prec_sqrt,
            prec_div: self.prec_div,
            fmad: self.fmad,
            options: self.options,
            use_fast_math: self.use_fast_math,
            maxrregcount: self.maxrregcount,
            include_paths: self.include_paths,
            arch: self.arch,
            name: self.name,
        }
    }
}

/// A compilation failed, as cudarc's `CompileError`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileError {
    /// The source cannot be given to NVRTC (it holds a NUL byte).
    InvalidSource(String),
    /// NVRTC failed: its message (for a compile error, with the log).
    Nvrtc(String),
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompileError::InvalidSource(m) => write!(f, "invalid CUDA source: {m}"),
            CompileError::Nvrtc(m) => write!(f, "NVRTC: {m}"),
        }
    }
}

impl std::error::Error for CompileError {}

/// [`compile_ptx_with_opts`] with no options.
pub fn compile_ptx<S: AsRef<str>>(src: S) -> Result<Ptx, CompileError> {
    compile_ptx_with_opts(src, CompileOptions::default())
}

/// Compiles the CUDA source `src` with NVRTC where it can be loaded (errors are returned here,
/// as by cudarc); elsewhere keeps the source for a GPU to compile when the module is loaded (see
/// the [module docs](self)).
pub fn compile_ptx_with_opts<S: AsRef<str>>(
    src: S,
    opts: CompileOptions,
) -> Result<Ptx, CompileError> {
    let src = src.as_ref();
    if src.contains('\0') {
        return Err(CompileError::InvalidSource(
            "the source holds a NUL byte".into(),
        ));
    }
    #[cfg(feature = "cuda")]
    if let Some(ptx) = compile_now(src, opts.clone())? {
        return Ok(Ptx(Inner::Compiled(ptx)));
    }
    Ok(Ptx(Inner::Source {
        src: src.to_owned(),
        opts,
    }))
}

/// Compiles with NVRTC now: `None` where NVRTC cannot be loaded.
#[cfg(feature = "cuda")]
fn compile_now(
    src: &str,
    opts: CompileOptions,
) -> Result<Option<::cudarc::nvrtc::Ptx>, CompileError> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    // SAFETY: `is_culib_present` only tries to `dlopen` cudarc's candidate names for NVRTC.
    if !unsafe { ::cudarc::nvrtc::sys::is_culib_present() } {
        return Ok(None);
    }
    let opts = opts.into_cudarc();
    // A loader too old for the bindings panics on a missing symbol: that is "no NVRTC" too.
    match catch_unwind(AssertUnwindSafe(|| {
        ::cudarc::nvrtc::compile_ptx_with_opts(src, opts)
    })) {
        Ok(Ok(ptx)) => Ok(Some(ptx)),
        Ok(Err(e)) => Err(CompileError::Nvrtc(match e {
            ::cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => other.to_string(),
        })),
        Err(_) => Ok(None),
    }
}
