//! The device kernels: NVRTC compilation, module loading, and launches with raw device addresses.
//!
//! `kernels/streamsan.cu` is compiled at run time for the device's own architecture: to a CUBIN
//! (`--gpu-architecture=sm_XY`) when NVRTC knows the device's compute capability, which avoids
//! PTX JIT and its driver-version requirement; otherwise to PTX for the newest virtual architecture
//! NVRTC supports below it, which the driver JIT-compiles. The compiled image is cached per process
//! and architecture, and loaded once per [`super::Gpu`].
//!
//! What each kernel computes is defined in [`crate::kernels`].

use std::ffi::{c_char, c_void, CString};
use std::sync::{Arc, Mutex};

use cudarc::driver::result;
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{result as nvrtc_result, sys as nvrtc_sys, Ptx};

use super::{DeviceRegion, GpuError, Stream};
use crate::kernels::MAX_READS;

/// The CUDA C source of the kernels.
pub const KERNELS_SOURCE: &str = include_str!("../../kernels/streamsan.cu");

/// Threads per block of every launch (a multiple of the warp size, as `checksum` and `compare`
/// need).
pub const BLOCK_THREADS: u32 = 256;

/// Blocks per multiprocessor at most: 8 × 256 threads fill an SM of compute capability 9.0.
const BLOCKS_PER_SM: u32 = 8;

/// A compiled form of [`KERNELS_SOURCE`].
#[derive(Clone, Debug)]
enum Image {
    /// SASS for one real architecture.
    Cubin(Vec<u8>),
    /// PTX text for a virtual architecture.
    Ptx(String),
}

/// Compiled images by compute capability `(major, minor)`.
type ImageCache = Vec<((i32, i32), Arc<Image>)>;

/// The compiled images: NVRTC runs once per process and architecture.
static IMAGES: Mutex<ImageCache> = Mutex::new(Vec::new());

/// An NVRTC program, destroyed on drop.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once, here.
        if let Err(e) = unsafe { nvrtc_result::destroy_program(self.0) } {
            tracing::warn!(error = %e, "nvrtcDestroyProgram failed");
        }
    }
}

/// The architectures NVRTC can compile for, as `10 * major + minor`.
fn supported_archs() -> Result<Vec<i32>, GpuError> {
    let mut n = 0;
    // SAFETY: writes one int through a valid pointer.
    unsafe { nvrtc_sys::nvrtcGetNumSupportedArchs(&mut n) }.result()?;
    let mut archs = vec![0i32; usize::try_from(n).unwrap_or(0)];
    // SAFETY: `archs` has room for the `n` ints NVRTC writes.
    unsafe { nvrtc_sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }.result()?;
    Ok(archs)
}

/// Bytes NVRTC returned, without their trailing NULs.
fn trim_nul(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}

/// Compiles [`KERNELS_SOURCE`] for compute capability `cc`.
fn compile(cc: (i32, i32)) -> Result<Image, GpuError> {
    // SAFETY: `is_culib_present` only tries to `dlopen` cudarc's candidate names for NVRTC.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc);
    }
    let archs = supported_archs()?;
    let want = cc.0 * 10 + cc.1;
    let (arch, real) = if archs.contains(&want) {
        (format!("sm_{want}"), true)
    } else if let Some(&best) = archs.iter().filter(|&&a| a <= want).max() {
        (format!("compute_{best}"), false)
    } else {
        return Err(GpuError::UnsupportedArch {
            major: cc.0,
            minor: cc.1,
            supported: archs,
        });
    };
    let options = vec![format!("--gpu-architecture={arch}")];
    let src = CString::new(KERNELS_SOURCE).expect("the kernel source has no NUL byte");
    let program = Program(nvrtc_result::create_program(&src, Some(c"streamsan.cu"))?);
    // SAFETY: `program` is live; the options are plain strings.
    if let Err(e) = unsafe { nvrtc_result::compile_program(program.0, &options) } {
        // SAFETY: `program` is live.
        let log = unsafe { nvrtc_result::get_program_log(program.0) }
            .map(|log| {
                let bytes = log.iter().map(|&c| c as u8).collect();
                String::from_utf8_lossy(&trim_nul(bytes)).into_owned()
            })
            .unwrap_or_else(|_| format!("{e} (no log)"));
        return Err(GpuError::Compile { options, log });
    }
    if real {
        let mut size = 0usize;
        // SAFETY: `program` is live and compiled for a real architecture, so it has a CUBIN.
        unsafe { nvrtc_sys::nvrtcGetCUBINSize(program.0, &mut size) }.result()?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` has room for the `size` bytes NVRTC writes.
        unsafe { nvrtc_sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast::<c_char>()) }
            .result()?;
        Ok(Image::Cubin(cubin))
    } else {
        // SAFETY: `program` is live and compiled.
        let ptx = unsafe { nvrtc_result::get_ptx(program.0) }?;
        let bytes = trim_nul(ptx.into_iter().map(|c| c as u8).collect());
        let text = String::from_utf8(bytes)
            .map_err(|e| GpuError::InvalidArgument(format!("NVRTC returned non-UTF-8 PTX: {e}")))?;
        Ok(Image::Ptx(text))
    }
}

/// The compiled image for `cc`, from the cache or compiled now.
fn image_for(cc: (i32, i32)) -> Result<Arc<Image>, GpuError> {
    let mut cache = IMAGES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, image)) = cache.iter().find(|(c, _)| *c == cc) {
        return Ok(image.clone());
    }
    let image = Arc::new(compile(cc)?);
    cache.push((cc, image.clone()));
    Ok(image)
}

/// The kernels of [`KERNELS_SOURCE`], loaded in one context. Get them with
/// [`super::Gpu::kernels`].
///
/// Every launch uses [`BLOCK_THREADS`] threads per block and enough blocks to cover the region, at
/// most 8 per multiprocessor (the kernels loop over the rest), and at least one: a launch over 0
/// words still runs, so it still occupies its stream (and spins, for `hash_launch`).
#[derive(Debug)]
pub struct Kernels {
    ctx: Arc<CudaContext>,
    hash_launch: CudaFunction,
    fill: CudaFunction,
    copy_words: CudaFunction,
    spin: CudaFunction,
    spin_at: CudaFunction,
    checksum: CudaFunction,
    compare: CudaFunction,
    max_blocks: u32,
    cubin: bool,
}

/// A kernel argument by value, as `cuLaunchKernel` takes it: a pointer to its bytes.
fn arg<T>(value: &mut T) -> *mut c_void {
    (value as *mut T).cast()
}

impl Kernels {
    pub(super) fn load(
        ctx: &Arc<CudaContext>,
        cc: (i32, i32),
        multiprocessors: u32,
    ) -> Result<Kernels, GpuError> {
        let image = image_for(cc)?;
        let cubin = matches!(*image, Image::Cubin(_));
        let ptx = match &*image {
            Image::Cubin(bytes) => Ptx::from_binary(bytes.clone()),
            Image::Ptx(text) => Ptx::from_src(text.clone()),
        };
        let module = ctx.load_module(ptx)?;
        let function = |name: &str| module.load_function(name);
        Ok(Kernels {
            ctx: ctx.clone(),
            hash_launch: function("hash_launch")?,
            fill: function("fill")?,
            copy_words: function("copy_words")?,
            spin: function("spin")?,
            spin_at: function("spin_at")?,
            checksum: function("checksum")?,
            compare: function("compare")?,
            max_blocks: multiprocessors.saturating_mul(BLOCKS_PER_SM).max(1),
            cubin,
        })
    }

    /// Whether the kernels run from a CUBIN for the device's own architecture (`false`: PTX, JIT
    /// compiled by the driver).
    pub fn is_cubin(&self) -> bool {
        self.cubin
    }

    /// Blocks for a launch over `words` words.
    fn blocks_for(&self, words: u32) -> u32 {
        words.div_ceil(BLOCK_THREADS).clamp(1, self.max_blocks)
    }

    /// Enqueues `f` on `stream` with `blocks` blocks of [`BLOCK_THREADS`].
    ///
    /// # Safety
    ///
    /// `params` must point to values of exactly the types, in the order, of `f`'s parameters, and
    /// every address among them must be valid for what `f` does with it until the launch is done.
    unsafe fn launch(
        &self,
        stream: &Stream,
        f: &CudaFunction,
        blocks: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(GpuError::InvalidArgument(
                "the stream belongs to another context than the kernels".into(),
            ));
        }
        stream.bind()?;
        // SAFETY: `f` comes from a module this value keeps loaded; the caller guarantees the
        // parameters.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (blocks, 1, 1),
                (BLOCK_THREADS, 1, 1),
                0,
                stream.raw(),
                params,
            )
        }?;
        Ok(())
    }

    /// Enqueues `hash_launch`: writes region `j` of launch `op_id` into `out` from `reads` (at most
    /// `MAX_READS`), as `crate::kernels::hash_region_cpu` does. With `spin_ns > 0` every block
    /// first waits `spin_ns` nanoseconds, which widens race windows and does not change the result.
    ///
    /// # Safety
    ///
    /// `out` and every read region must be device-accessible memory that stays allocated until the
    /// launch is done; `out` must not overlap a read region except word for word at the same
    /// index, and the host must hold no Rust reference to `out` until then.
    pub unsafe fn hash_launch(
        &self,
        stream: &Stream,
        op_id: u32,
        j: u32,
        out: DeviceRegion,
        reads: &[DeviceRegion],
        spin_ns: u64,
    ) -> Result<(), GpuError> {
        if reads.len() > MAX_READS {
            return Err(GpuError::InvalidArgument(format!(
                "hash_launch takes at most {MAX_READS} reads, not {}",
                reads.len()
            )));
        }
        out.check_aligned()?;
        let mut r = [DeviceRegion::new(0, 0); MAX_READS];
        for (slot, read) in r.iter_mut().zip(reads) {
            read.check_aligned()?;
            *slot = *read;
        }
        let (mut out_ptr, mut n_out, mut op_id, mut j) = (out.ptr, out.words, op_id, j);
        let [(mut p0, mut n0), (mut p1, mut n1), (mut p2, mut n2), (mut p3, mut n3)] =
            r.map(|x| (x.ptr, x.words));
        let mut n_reads = reads.len() as u32;
        let mut spin_ns = spin_ns;
        let mut params = [
            arg(&mut out_ptr),
            arg(&mut n_out),
            arg(&mut op_id),
            arg(&mut j),
            arg(&mut p0),
            arg(&mut n0),
            arg(&mut p1),
            arg(&mut n1),
            arg(&mut p2),
            arg(&mut n2),
            arg(&mut p3),
            arg(&mut n3),
            arg(&mut n_reads),
            arg(&mut spin_ns),
        ];
        // SAFETY: the values match `hash_launch(unsigned int*, unsigned int, unsigned int,
        // unsigned int, (const unsigned int*, unsigned int) x 4, unsigned int, unsigned long
        // long)`; unused read slots are (0, 0) and never dereferenced (`k < n_reads`); the caller
        // guarantees the regions.
        unsafe {
            self.launch(
                stream,
                &self.hash_launch,
                self.blocks_for(out.words),
                &mut params,
            )
        }
    }

    /// Enqueues `fill`: every word of `dst` becomes `value`.
    ///
    /// # Safety
    ///
    /// As for `out` of [`Kernels::hash_launch`].
    pub unsafe fn fill(
        &self,
        stream: &Stream,
        dst: DeviceRegion,
        value: u32,
    ) -> Result<(), GpuError> {
        dst.check_aligned()?;
        let (mut p, mut n, mut value) = (dst.ptr, dst.words, value);
        let mut params = [arg(&mut p), arg(&mut n), arg(&mut value)];
        // SAFETY: the values match `fill(unsigned int*, unsigned int, unsigned int)`; the caller
        // guarantees the region.
        unsafe { self.launch(stream, &self.fill, self.blocks_for(dst.words), &mut params) }
    }

    /// Enqueues `copy_words`: `dst.words` words from device address `src` into `dst`.
    ///
    /// # Safety
    ///
    /// `dst` as `out` of [`Kernels::hash_launch`]; the source range must be device-accessible
    /// memory that stays allocated until the launch is done; the two must not overlap.
    pub unsafe fn copy_words(
        &self,
        stream: &Stream,
        dst: DeviceRegion,
        src: u64,
    ) -> Result<(), GpuError> {
        dst.check_aligned()?;
        DeviceRegion::new(src, dst.words).check_aligned()?;
        let (mut d, mut s, mut n) = (dst.ptr, src, dst.words);
        let mut params = [arg(&mut d), arg(&mut s), arg(&mut n)];
        // SAFETY: the values match `copy_words(unsigned int*, const unsigned int*, unsigned int)`;
        // the caller guarantees both ranges.
        unsafe {
            self.launch(
                stream,
                &self.copy_words,
                self.blocks_for(dst.words),
                &mut params,
            )
        }
    }

    /// Enqueues `spin`: a one-thread kernel that keeps `stream` busy for `ns` nanoseconds.
    pub fn spin(&self, stream: &Stream, ns: u64) -> Result<(), GpuError> {
        let mut ns = ns;
        let mut params = [arg(&mut ns)];
        // SAFETY: the value matches `spin(unsigned long long)`, which touches no memory.
        unsafe { self.launch(stream, &self.spin, 1, &mut params) }
    }

    /// Enqueues `spin_at`: a one-thread kernel that keeps `stream` busy for the number of
    /// nanoseconds in the `u32` at device address `ns`, read when it starts (a captured delay
    /// that each replay of a graph may set anew, e.g. with [`Kernels::fill`]).
    ///
    /// # Safety
    ///
    /// `ns` must be 4-byte aligned device-accessible memory that stays allocated until the
    /// launch (or every replay of a graph that captured it) is done.
    pub unsafe fn spin_at(&self, stream: &Stream, ns: u64) -> Result<(), GpuError> {
        if ns % 4 != 0 {
            return Err(GpuError::InvalidArgument(format!(
                "spin_at's delay {ns:#x} is not 4-byte aligned"
            )));
        }
        let mut p = ns;
        let mut params = [arg(&mut p)];
        // SAFETY: the value matches `spin_at(const unsigned int*)`; the caller guarantees the
        // word.
        unsafe { self.launch(stream, &self.spin_at, 1, &mut params) }
    }

    /// Enqueues `checksum`: adds `crate::kernels::checksum` of `src` to the `u64` at device
    /// address `out`, which the caller zeroes first (e.g. [`Stream::memset_d32`] of 2 words).
    ///
    /// # Safety
    ///
    /// `src` must be device-accessible memory that stays allocated until the launch is done; `out`
    /// as `out` of [`Kernels::hash_launch`], 8-byte aligned.
    pub unsafe fn checksum(
        &self,
        stream: &Stream,
        src: DeviceRegion,
        out: u64,
    ) -> Result<(), GpuError> {
        src.check_aligned()?;
        if out % 8 != 0 {
            return Err(GpuError::InvalidArgument(format!(
                "checksum target {out:#x} is not 8-byte aligned"
            )));
        }
        let (mut p, mut n, mut o) = (src.ptr, src.words, out);
        let mut params = [arg(&mut p), arg(&mut n), arg(&mut o)];
        // SAFETY: the values match `checksum(const unsigned int*, unsigned int, unsigned long
        // long*)`; the caller guarantees the ranges.
        unsafe {
            self.launch(
                stream,
                &self.checksum,
                self.blocks_for(src.words),
                &mut params,
            )
        }
    }

    /// Enqueues `compare`: adds the number of indices `i < words` where the words at `a` and `b`
    /// differ to the `u32` at device address `mismatches`, which the caller zeroes first.
    ///
    /// # Safety
    ///
    /// Both ranges must be device-accessible memory that stays allocated until the launch is done;
    /// `mismatches` as `out` of [`Kernels::hash_launch`].
    pub unsafe fn compare(
        &self,
        stream: &Stream,
        a: u64,
        b: u64,
        words: u32,
        mismatches: u64,
    ) -> Result<(), GpuError> {
        for ptr in [a, b, mismatches] {
            DeviceRegion::new(ptr, words).check_aligned()?;
        }
        let (mut a, mut b, mut n, mut m) = (a, b, words, mismatches);
        let mut params = [arg(&mut a), arg(&mut b), arg(&mut n), arg(&mut m)];
        // SAFETY: the values match `compare(const unsigned int*, const unsigned int*, unsigned
        // int, unsigned int*)`; the caller guarantees the ranges.
        unsafe { self.launch(stream, &self.compare, self.blocks_for(words), &mut params) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_declares_every_kernel() {
        for name in [
            "hash_launch",
            "fill",
            "copy_words",
            "spin",
            "spin_at",
            "checksum",
            "compare",
        ] {
            let decl = format!("extern \"C\" __global__ void {name}(");
            assert!(KERNELS_SOURCE.contains(&decl), "missing {decl}");
        }
    }

    #[test]
    fn source_uses_the_reference_constants() {
        use crate::kernels::{HASH_SEED, MISSING_READ};
        assert!(KERNELS_SOURCE.contains(&format!("SS_HASH_SEED {HASH_SEED:#x}u")));
        assert!(KERNELS_SOURCE.contains(&format!("SS_MISSING_READ {MISSING_READ:#x}u")));
        assert!(KERNELS_SOURCE.contains("0xcc9e2d51u"));
        assert!(KERNELS_SOURCE.contains("0xe6546b64u"));
        assert!(KERNELS_SOURCE.contains("0x85ebca6bu"));
        assert!(KERNELS_SOURCE.contains("0xc2b2ae35u"));
    }

    #[test]
    fn trim_nul_drops_trailing_nuls_only() {
        assert_eq!(trim_nul(b"a\0b\0\0".to_vec()), b"a\0b".to_vec());
        assert_eq!(trim_nul(Vec::new()), Vec::<u8>::new());
    }
}
