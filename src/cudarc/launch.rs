//! Modules, functions and the launch builder: cudarc's `CudaModule`, `CudaFunction`,
//! `LaunchConfig`, `LaunchArgs` and `PushKernelArg`, where `.arg(&x)` records a read of `x` and
//! `.arg(&mut y)` a write of `y`.

use std::ffi::c_void;
use std::fmt;
use std::panic::Location;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::session::{KernelExec, Region};

use super::context::{intern, CudaContext, DriverError};
use super::nvrtc::Ptx;
use super::slice::{CudaSlice, CudaView, CudaViewMut, DeviceRepr};
use super::stream::{CudaEvent, CudaStream};

/// The grid of a launch, as cudarc's `LaunchConfig`.
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    /// (width, height, depth) of the grid in blocks.
    pub grid_dim: (u32, u32, u32),
    /// (x, y, z) threads of each block.
    pub block_dim: (u32, u32, u32),
    /// Dynamic shared memory per block in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// Blocks of 1024 threads, enough of them for `n` threads.
    pub fn for_num_elems(n: u32) -> Self {
        const NUM_THREADS: u32 = 1024;
        LaunchConfig {
            grid_dim: (n.div_ceil(NUM_THREADS), 1, 1),
            block_dim: (NUM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// A loaded module, as cudarc's `CudaModule`: from [`CudaContext::load_module`].
pub struct CudaModule {
    ctx: Arc<CudaContext>,
    #[cfg(feature = "cuda")]
    gpu: Option<Arc<::cudarc::driver::CudaModule>>,
    /// The source or PTX text, where there is one: the simulator checks function names in it.
    text: Option<String>,
}

impl fmt::Debug for CudaModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaModule").finish_non_exhaustive()
    }
}

/// A kernel of a module, as cudarc's `CudaFunction`: from [`CudaModule::load_function`].
#[derive(Clone)]
pub struct CudaFunction {
    module: Arc<CudaModule>,
    name: &'static str,
    #[cfg(feature = "cuda")]
    gpu: Option<::cudarc::driver::CudaFunction>,
}

impl fmt::Debug for CudaFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaFunction")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl CudaContext {
    /// Loads a module: compiled with NVRTC ([`compile_ptx`](super::nvrtc::compile_ptx)) or PTX
    /// ([`Ptx::from_src`], [`Ptx::from_file`]).
    ///
    /// On a GPU the module is loaded into the session's context (`cuModuleLoadData`), and a source
    /// whose compilation was put off (no NVRTC where it was compiled) is compiled now. On the
    /// simulator nothing is compiled or loaded: its functions run as the hash kernel.
    pub fn load_module(self: &Arc<Self>, ptx: Ptx) -> Result<Arc<CudaModule>, DriverError> {
        let text = ptx.text();
        #[cfg(feature = "cuda")]
        if let Some(ctx) = self.session.context() {
            let image = ptx.into_cudarc()?;
            let module = ctx.load_module(image).map_err(|e| gpu_error(e.into()))?;
            return Ok(Arc::new(CudaModule {
                ctx: self.clone(),
                gpu: Some(module),
                text,
            }));
        }
        Ok(Arc::new(CudaModule {
            ctx: self.clone(),
            #[cfg(feature = "cuda")]
            gpu: None,
            text,
        }))
    }
}

#[cfg(feature = "cuda")]
pub(crate) fn gpu_error(e: crate::cuda::GpuError) -> DriverError {
    DriverError::from(crate::session::SessionError::Gpu(e))
}

/// Whether `text` names `name` as a whole identifier.
fn names(text: &str, name: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

impl CudaModule {
    /// The context this module was loaded in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The kernel `name` (an `extern "C"` name). On the simulator the name must appear in the
    /// module's source or PTX text, where there is one.
    pub fn load_function(self: &Arc<Self>, name: &str) -> Result<CudaFunction, DriverError> {
        #[cfg(feature = "cuda")]
        if let Some(m) = &self.gpu {
            let f = m.load_function(name).map_err(|e| gpu_error(e.into()))?;
            return Ok(CudaFunction {
                module: self.clone(),
                name: intern(name),
                gpu: Some(f),
            });
        }
        if let Some(text) = &self.text {
            if !names(text, name) {
                return Err(DriverError::invalid(format!(
                    "the module has no function {name:?}"
                )));
            }
        }
        Ok(CudaFunction {
            module: self.clone(),
            name: intern(name),
            #[cfg(feature = "cuda")]
            gpu: None,
        })
    }
}

impl CudaFunction {
    /// The kernel's name (the `name` of its `launch` ops).
    pub fn name(&self) -> &str {
        self.name
    }

    /// The module it belongs to.
    pub fn module(&self) -> &Arc<CudaModule> {
        &self.module
    }

    /// The driver's handle on a GPU (`None` on the simulator).
    #[cfg(feature = "cuda")]
    pub fn cu_function(&self) -> Option<::cudarc::driver::sys::CUfunction> {
        self.gpu.as_ref().map(|f| f.cu_function())
    }
}

/// A launch being built, as cudarc's `LaunchArgs`: from [`CudaStream::launch_builder`], with
/// arguments pushed by [`PushKernelArg::arg`], run by [`LaunchArgs::launch`].
///
/// Every argument that is device memory is an access of the launch: `&slice` and `&view` are
/// reads of their bytes, `&mut slice` and `&mut view` writes. Memory a kernel reaches some other
/// way (a raw address passed as an integer) is declared by hand with [`LaunchArgs::reads`] and
/// [`LaunchArgs::writes`]. Nothing is allocated per launch for up to 8 arguments and 4 reads and
/// 4 writes.
pub struct LaunchArgs<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    args: SmallVec<[*mut c_void; 8]>,
    reads: SmallVec<[Region; 4]>,
    writes: SmallVec<[Region; 4]>,
}

impl fmt::Debug for LaunchArgs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaunchArgs")
            .field("func", &self.func.name)
            .field("args", &self.args.len())
            .field("reads", &self.reads)
            .field("writes", &self.writes)
            .finish()
    }
}

impl CudaStream {
    /// Starts a launch of `func` on this stream.
    pub fn launch_builder<'a>(&'a self, func: &'a CudaFunction) -> LaunchArgs<'a> {
        LaunchArgs {
            stream: self,
            func,
            args: SmallVec::new(),
            reads: SmallVec::new(),
            writes: SmallVec::new(),
        }
    }
}

/// Pushing a kernel argument, as cudarc's `PushKernelArg`: a value (`&T` where `T:
/// DeviceRepr`), or device memory, whose access is recorded.
///
/// # Safety
///
/// An implementation must push a pointer to a value of the kernel parameter's type that lives
/// as long as the builder.
pub unsafe trait PushKernelArg<T> {
    /// Pushes the next argument.
    fn arg(&mut self, arg: T) -> &mut Self;
}

// SAFETY: a pointer to the value, borrowed for the builder's lifetime.
unsafe impl<'a, 'b: 'a, T: DeviceRepr> PushKernelArg<&'b T> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b T) -> &mut Self {
        self.args.push(arg as *const T as *mut c_void);
        self
    }
}

// SAFETY: as above; `bool` is passed by value only.
unsafe impl<'a, 'b: 'a> PushKernelArg<&'b bool> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b bool) -> &mut Self {
        self.args.push(arg as *const bool as *mut c_void);
        self
    }
}

// SAFETY: a pointer to the slice's device address, borrowed for the builder's lifetime.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b CudaSlice<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b CudaSlice<T>) -> &mut Self {
        self.reads.push(arg.region);
        self.args.push(&arg.ptr as *const u64 as *mut c_void);
        self
    }
}

// SAFETY: as above.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b mut CudaSlice<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut CudaSlice<T>) -> &mut Self {
        self.writes.push(arg.region);
        self.args.push(&arg.ptr as *const u64 as *mut c_void);
        self
    }
}

// SAFETY: as above.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b CudaView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b CudaView<'c, T>) -> &mut Self {
        self.reads.push(arg.region);
        self.args.push(&arg.ptr as *const u64 as *mut c_void);
        self
    }
}

// SAFETY: as above.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut CudaViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut CudaViewMut<'c, T>) -> &mut Self {
        self.writes.push(arg.region);
        self.args.push(&arg.ptr as *const u64 as *mut c_void);
        self
    }
}

impl LaunchArgs<'_> {
    /// Declares by hand that the kernel reads `region` (memory it reaches through a raw address,
    /// or an external region of the session).
    pub fn reads(&mut self, region: Region) -> &mut Self {
        self.reads.push(region);
        self
    }

    /// Declares by hand that the kernel writes `region`.
    pub fn writes(&mut self, region: Region) -> &mut Self {
        self.writes.push(region);
        self
    }

    /// Launches the kernel on the stream and records a `launch` named after the function, with
    /// the declared reads and writes, at the caller's site. Returns `None` (cudarc returns
    /// timing events when asked; the facade's events do not time).
    ///
    /// On the simulator the kernel runs as the hash kernel over its declared regions
    /// (`crate::kernels`): the values it writes differ from the real kernel's, the accesses —
    /// and so the hazards — do not.
    ///
    /// # Safety
    ///
    /// As for cudarc: the arguments must match the kernel's parameters in number, order and
    /// type, the kernel must touch only the memory it is given and stay in its bounds, and it
    /// must write only the memory passed as `&mut` (or declared with [`LaunchArgs::writes`]) —
    /// what it writes elsewhere is invisible to the checker.
    #[track_caller]
    pub unsafe fn launch(
        &mut self,
        cfg: LaunchConfig,
    ) -> Result<Option<(CudaEvent, CudaEvent)>, DriverError> {
        let site = Location::caller();
        let LaunchArgs {
            stream,
            func,
            args,
            reads,
            writes,
        } = self;
        let exec = exec(func, args, cfg);
        // SAFETY: the caller's contract; every argument pointer borrows its value for the
        // builder's lifetime.
        unsafe {
            stream.ctx.session.core().launch_kernel(
                stream.stream.key(),
                func.name,
                reads,
                writes,
                exec,
                site,
            )
        }?;
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
fn exec<'x>(func: &CudaFunction, args: &'x mut [*mut c_void], cfg: LaunchConfig) -> KernelExec<'x> {
    match &func.gpu {
        Some(f) => KernelExec::Cuda {
            func: f.cu_function(),
            grid: cfg.grid_dim,
            block: cfg.block_dim,
            shared_mem_bytes: cfg.shared_mem_bytes,
            args,
        },
        None => KernelExec::Hash(std::marker::PhantomData),
    }
}

#[cfg(not(feature = "cuda"))]
fn exec<'x>(
    _func: &CudaFunction,
    _args: &'x mut [*mut c_void],
    _cfg: LaunchConfig,
) -> KernelExec<'x> {
    KernelExec::Hash(std::marker::PhantomData)
}
