//! The ops of typed buffers of any element type, for the cudarc-shaped facade
//! ([`crate::cudarc`]): user kernels, copies from and to pageable host memory, byte memsets and
//! host accesses of pinned memory by bytes.
//!
//! Same pattern as every op of [`super::state`]: take the lock, validate, execute on the backend,
//! record. Regions here may start and end at any byte (a view of `bf16`s); the simulator runs
//! them on the words that cover them and changes only their own bytes.

use std::borrow::Cow;
use std::panic::Location;

use super::buffer::Region;
use super::handle::Stream;
use super::record::Rec;
use super::state::{Backend, Shared};
use super::SessionError;
use crate::trace::MemoryKind;

/// How a user kernel runs.
pub(crate) enum KernelExec<'a> {
    /// On a GPU: `cuLaunchKernel` of a function of the session's context.
    #[cfg(feature = "cuda")]
    Cuda {
        /// The function.
        func: cudarc::driver::sys::CUfunction,
        /// Grid dimensions in blocks.
        grid: (u32, u32, u32),
        /// Block dimensions in threads.
        block: (u32, u32, u32),
        /// Dynamic shared memory per block.
        shared_mem_bytes: u32,
        /// One pointer to each parameter's value.
        args: &'a mut [*mut std::ffi::c_void],
    },
    /// The built-in hash kernel over the declared regions (the simulator's stand-in for a user
    /// kernel: its values differ from the real kernel's, its accesses are the same).
    Hash(std::marker::PhantomData<&'a ()>),
}

impl Shared {
    /// Launches a user kernel on `stream` and records it with its reads and writes. Returns the
    /// op index.
    ///
    /// # Safety
    ///
    /// For [`KernelExec::Cuda`]: as for [`super::cuda::CudaBackend::launch_user`]. A region both
    /// read and written should be given as written only.
    pub(crate) unsafe fn launch_kernel(
        &self,
        stream: &Stream,
        name: &'static str,
        reads: &[Region],
        writes: &[Region],
        exec: KernelExec<'_>,
        site: &'static Location<'static>,
    ) -> Result<u64, SessionError> {
        let s = &*stream.inner;
        if s.shared.session != self.session
            || reads
                .iter()
                .chain(writes)
                .any(|r| r.session != self.session)
        {
            return Err(SessionError::WrongSession);
        }
        let mut st = self.lock()?;
        let op = st.next_op;
        match (&mut st.backend, exec) {
            (Backend::Sim(b), _) => b.hash_slices(s.key, op as u32, reads, writes)?,
            #[cfg(feature = "cuda")]
            (
                Backend::Cuda(b),
                KernelExec::Cuda {
                    func,
                    grid,
                    block,
                    shared_mem_bytes,
                    args,
                },
            ) => {
                let gpu = super::state::gpu_stream(s)?;
                // SAFETY: the caller's contract.
                unsafe { b.launch_user(gpu, func, grid, block, shared_mem_bytes, args) }?
            }
            #[cfg(feature = "cuda")]
            (Backend::Cuda(_), KernelExec::Hash(_)) => {
                return Err(SessionError::InvalidArgument(format!(
                    "kernel {name:?} has no GPU function: it was loaded for the simulator"
                )))
            }
        }
        st.record_launch(s.key, Cow::Borrowed(name), reads, writes, Some(site));
        Ok(op)
    }

    /// Copies `data` from pageable host memory into `dst` on `stream` (`cuMemcpyHtoDAsync`):
    /// staged at the call, written in stream order. Recorded as a launch `memcpy_htod` writing
    /// `dst` on `stream`, with no synchronization (the host may reuse `data` at once, but other
    /// streams must wait for `stream` before touching `dst`).
    pub(crate) fn memcpy_htod_bytes(
        &self,
        stream: &Stream,
        data: &[u8],
        dst: Region,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.same(&stream.inner.shared)?;
        self.same_region(&dst)?;
        if data.len() as u64 != dst.bytes {
            return Err(SessionError::InvalidArgument(format!(
                "copying {} bytes into a region of {}",
                data.len(),
                dst.bytes
            )));
        }
        let mut st = self.lock()?;
        let s = &*stream.inner;
        match &mut st.backend {
            Backend::Sim(b) => b.store(s.key, &dst, data)?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.store(super::state::gpu_stream(s)?, &dst, data)?,
        }
        st.record_launch(s.key, Cow::Borrowed("memcpy_htod"), [], [&dst], Some(site));
        Ok(())
    }

    /// Copies `src` into pageable host memory through `stream` and waits for it: recorded as a
    /// launch `memcpy_dtoh` reading `src` on `stream`, then a `stream_sync` of `stream`.
    pub(crate) fn memcpy_dtoh_bytes(
        &self,
        stream: &Stream,
        src: Region,
        site: &'static Location<'static>,
    ) -> Result<Vec<u8>, SessionError> {
        self.same(&stream.inner.shared)?;
        self.same_region(&src)?;
        let mut st = self.lock()?;
        let s = &*stream.inner;
        let bytes = match &mut st.backend {
            Backend::Sim(b) => b.load(s.key, &src)?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.load(super::state::gpu_stream(s)?, &src)?,
        };
        st.record_launch(s.key, Cow::Borrowed("memcpy_dtoh"), [&src], [], Some(site));
        st.record(Rec::StreamSync {
            stream: s.key,
            site: Some(site),
        });
        Ok(bytes)
    }

    /// Sets every byte of `dst` to `byte` on `stream` (`cuMemsetD8Async`): a `memset`.
    pub(crate) fn memset_byte(
        &self,
        stream: &Stream,
        dst: Region,
        byte: u8,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.same(&stream.inner.shared)?;
        self.same_region(&dst)?;
        if dst.memory != MemoryKind::Device {
            return Err(SessionError::InvalidArgument(
                "a byte memset writes device memory".into(),
            ));
        }
        let mut st = self.lock()?;
        let s = &*stream.inner;
        match &mut st.backend {
            Backend::Sim(b) => b.memset_byte(s.key, &dst, byte)?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.memset_byte(super::state::gpu_stream(s)?, &dst, byte)?,
        }
        st.record(Rec::Memset {
            stream: s.key,
            dst: (&dst).into(),
            site: Some(site),
        });
        Ok(())
    }

    /// The host reads the bytes of pinned memory now: a `host_read`.
    pub(crate) fn host_read_bytes(
        &self,
        region: &Region,
        site: &'static Location<'static>,
    ) -> Result<Vec<u8>, SessionError> {
        self.same_region(region)?;
        pinned_only(region)?;
        let mut st = self.lock()?;
        let bytes = match &mut st.backend {
            Backend::Sim(b) => b.read_bytes(region)?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.host_read_bytes(region)?,
        };
        st.record(Rec::HostRead {
            region: region.into(),
            site: Some(site),
        });
        Ok(bytes)
    }

    /// The host writes the bytes of pinned memory now: a `host_write`.
    pub(crate) fn host_write_bytes(
        &self,
        region: &Region,
        data: &[u8],
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.same_region(region)?;
        pinned_only(region)?;
        if data.len() as u64 != region.bytes {
            return Err(SessionError::InvalidArgument(format!(
                "writing {} bytes into a region of {}",
                data.len(),
                region.bytes
            )));
        }
        let mut st = self.lock()?;
        match &mut st.backend {
            Backend::Sim(b) => b.write_bytes(region, data)?,
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.host_write_bytes(region, data)?,
        }
        st.record(Rec::HostWrite {
            region: region.into(),
            site: Some(site),
        });
        Ok(())
    }

    /// The stream-ordered free of a dropped buffer on `stream`: never panics; an error is parked.
    pub(crate) fn drop_free_on(&self, region: &Region, stream: &Stream) {
        let Some(mut st) = self.lock_for_drop() else {
            tracing::warn!(
                "a buffer dropped inside a callback of its own session is leaked (not freed)"
            );
            return;
        };
        if let Err(e) = st.free(region, Some(&stream.inner), None) {
            st.park(e);
        }
    }
}

fn pinned_only(r: &Region) -> Result<(), SessionError> {
    if r.memory == MemoryKind::Device || r.external {
        return Err(SessionError::InvalidArgument(
            "the host can only touch pinned memory".into(),
        ));
    }
    Ok(())
}
