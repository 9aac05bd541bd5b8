//! The session core's ops that move data: kernel launches, copies, memsets, copies from and to
//! pageable host memory, and host accesses of pinned memory.
//!
//! Same pattern as every op of the core: validate, take the lock, issue to the backend, record.
//! Regions of the typed buffers of [`crate::cudarc`] may start and end at any byte (a view of
//! `bf16`s); the simulator runs them on the words that cover them and changes only their bytes.

use std::borrow::Cow;
use std::cell::RefCell;
use std::panic::Location;

use super::error::SessionError;
use super::kernel::{KernelExec, LaunchDesc};
use super::raw::{KernelFn, RawLaunch, RawTarget};
use super::record::Rec;
use super::region::{Region, RegionSlice};
use super::{guarded_callback, Core, State, StreamRef};
use crate::exec::{Backend, Fill, Issued, Kernel, Op};
use crate::kernels::MAX_READS;
use crate::trace::MemoryKind;

/// Words of `bytes`, little-endian, the last one padded with zeros.
fn words_of(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut le = [0u8; 4];
            le[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(le)
        })
        .collect()
}

/// The bytes of `words`, little-endian, cut to `bytes`.
fn bytes_of(words: &[u32], bytes: u64) -> Vec<u8> {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take(usize::try_from(bytes).unwrap_or(usize::MAX))
        .collect()
}

fn pinned_only(r: &Region) -> Result<(), SessionError> {
    if r.memory == MemoryKind::Device || r.external {
        return Err(SessionError::InvalidArgument(
            "the host can only touch pinned memory".into(),
        ));
    }
    Ok(())
}

impl State {
    /// A copy from or to pageable memory on `stream`: not on a capturing stream (CUDA cannot
    /// capture it, and it synchronizes).
    fn pageable_check(&self, stream: u32) -> Result<(), SessionError> {
        self.graphs.check_stream(stream)?;
        if self.is_capturing(stream) {
            return Err(SessionError::Capture(
                "a copy from or to pageable memory on a capturing stream".into(),
            ));
        }
        Ok(())
    }

    /// Records a pageable copy as a launch on `stream`, followed by a stream sync if `synced`.
    fn record_pageable_copy(
        &mut self,
        stream: u32,
        name: &'static str,
        region: &Region,
        write: bool,
        synced: bool,
        site: &'static Location<'static>,
    ) {
        let one = [*region];
        let (reads, writes): (&[Region], &[Region]) = if write { (&[], &one) } else { (&one, &[]) };
        self.record_launch(stream, Cow::Borrowed(name), reads, writes, Some(site));
        if synced {
            self.record(Rec::StreamSync {
                stream,
                site: Some(site),
            });
        }
    }
}

impl Core {
    fn regions<'r>(&self, rs: impl IntoIterator<Item = &'r Region>) -> Result<(), SessionError> {
        for r in rs {
            self.region(r)?;
        }
        Ok(())
    }

    /// Runs the built-in hash kernel on `stream` over `reads` and `writes` (after `spin_ns` of
    /// spinning) and records the launch. Returns the op index.
    pub(crate) fn launch_hash(
        &self,
        stream: StreamRef,
        launch: &mut LaunchDesc,
    ) -> Result<u64, SessionError> {
        let name = std::mem::take(&mut launch.name);
        let (reads, writes, spin_ns, site) =
            (&launch.reads, &launch.writes, launch.spin_ns, launch.site);
        let s = self.stream(stream)?;
        self.regions(reads.iter().chain(writes.iter()))?;
        if reads.len() > MAX_READS {
            return Err(SessionError::InvalidArgument(format!(
                "the hash kernel reads at most {MAX_READS} regions, not {} (launch {name:?})",
                reads.len()
            )));
        }
        let mut st = self.lock()?;
        let op = st.next_op;
        if st.backend.runs_work() {
            st.issue_stream_op(
                op,
                s,
                Op::Launch {
                    stream: s,
                    kernel: Kernel::Hash {
                        id: op as u32,
                        spin_ns,
                    },
                    reads,
                    writes,
                    fences: &[],
                },
            )?;
        } else {
            st.graphs.check_stream(s)?;
        }
        st.record_launch(s, name, reads.iter(), writes.iter(), Some(site));
        Ok(op)
    }

    /// Runs a user kernel's closure `f` with the stream brought up to date (after `spin_ns` of
    /// spinning), and records the launch, even if `f` failed (it may have enqueued work before
    /// failing). Returns the op index.
    pub(crate) fn launch_run(
        &self,
        stream: StreamRef,
        launch: &mut LaunchDesc,
        f: &mut KernelFn<'_>,
    ) -> Result<u64, SessionError> {
        let name = std::mem::take(&mut launch.name);
        let (reads, writes, spin_ns, site) =
            (&launch.reads, &launch.writes, launch.spin_ns, launch.site);
        let s = self.stream(stream)?;
        self.regions(reads.iter().chain(writes.iter()))?;
        let mut st = self.lock()?;
        let op = st.next_op;
        st.graphs.check_stream(s)?;
        if st.is_capturing(s) && !st.backend.captures() {
            return Err(SessionError::Capture(
                "a kernel run by a closure cannot be captured on the simulator (it runs now)"
                    .into(),
            ));
        }
        let (r, w) = (reads.to_vec(), writes.to_vec());
        st.backend.issue(op, Op::RunNow { stream: s, spin_ns })?;
        let result = {
            let target = match st.backend.sim() {
                Some(dev) => RawTarget::Sim(RefCell::new(dev)),
                #[cfg(feature = "cuda")]
                None => match st.backend.gpu_stream(s) {
                    Some((gpu, stream)) => RawTarget::Cuda { stream, gpu },
                    None => return Err(SessionError::WrongSession),
                },
                #[cfg(not(feature = "cuda"))]
                None => return Err(SessionError::WrongSession),
            };
            let raw = RawLaunch {
                op,
                reads: &r,
                writes: &w,
                target,
            };
            guarded_callback(self.session, || f(&raw))
        };
        st.record_launch(s, name, reads.iter(), writes.iter(), Some(site));
        result.map_err(SessionError::Launch)?;
        Ok(op)
    }

    /// Launches a user kernel on `stream` and records it with its reads and writes. Returns the
    /// op index.
    ///
    /// # Safety
    ///
    /// For [`KernelExec::Cuda`]: `func` must be a live function of the session's context, and
    /// `args` must point to one value of the type of each of its parameters, live until the call
    /// returns; the kernel must touch only memory that stays valid until it completes. A region
    /// both read and written should be given as written only.
    pub(crate) unsafe fn launch_kernel(
        &self,
        stream: StreamRef,
        name: &'static str,
        reads: &[Region],
        writes: &[Region],
        exec: KernelExec<'_>,
        site: &'static Location<'static>,
    ) -> Result<u64, SessionError> {
        let s = self.stream(stream)?;
        self.regions(reads.iter().chain(writes))?;
        let mut st = self.lock()?;
        let op = st.next_op;
        let id = op as u32;
        if st.backend.runs_work() {
            let kernel = match exec {
                #[cfg(feature = "cuda")]
                KernelExec::Cuda {
                    func,
                    grid,
                    block,
                    shared_mem_bytes,
                    args,
                } => Kernel::User {
                    id,
                    func,
                    grid,
                    block,
                    shared_mem_bytes,
                    args,
                },
                KernelExec::Hash(_) => Kernel::Standin { id, name },
            };
            st.issue_stream_op(
                op,
                s,
                Op::Launch {
                    stream: s,
                    kernel,
                    reads: &RegionSlice(reads),
                    writes: &RegionSlice(writes),
                    fences: &[],
                },
            )?;
        } else {
            st.graphs.check_stream(s)?;
        }
        st.record_launch(s, Cow::Borrowed(name), reads, writes, Some(site));
        Ok(op)
    }

    pub(crate) fn copy(
        &self,
        stream: StreamRef,
        src: Region,
        dst: Region,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        let s = self.stream(stream)?;
        self.regions([&src, &dst])?;
        if src.bytes != dst.bytes {
            return Err(SessionError::InvalidArgument(format!(
                "copy of {} bytes into {} bytes",
                src.bytes, dst.bytes
            )));
        }
        if src.overlaps(&dst) {
            return Err(SessionError::InvalidArgument(
                "copy source and destination overlap".into(),
            ));
        }
        let mut st = self.lock()?;
        let op = st.next_op;
        st.issue_stream_op(
            op,
            s,
            Op::Copy {
                stream: s,
                src: src.span(),
                dst: dst.span(),
                fences: &[],
            },
        )?;
        st.record_copy(s, &src, &dst, Some(site));
        Ok(())
    }

    /// A memset of `dst` on `stream` (a `memset`).
    pub(crate) fn memset(
        &self,
        stream: StreamRef,
        dst: Region,
        fill: Fill,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        let s = self.stream(stream)?;
        self.region(&dst)?;
        if matches!(fill, Fill::Byte(_)) && dst.memory != MemoryKind::Device {
            return Err(SessionError::InvalidArgument(
                "a byte memset writes device memory".into(),
            ));
        }
        let mut st = self.lock()?;
        let op = st.next_op;
        st.issue_stream_op(
            op,
            s,
            Op::Memset {
                stream: s,
                dst: dst.span(),
                fill,
                fences: &[],
            },
        )?;
        st.record(Rec::Memset {
            stream: s,
            dst: (&dst).into(),
            site: Some(site),
        });
        Ok(())
    }

    /// Copies `data` from pageable host memory into `dst` on `stream`: staged at the call,
    /// written in stream order. Recorded as a launch `memcpy_htod` writing `dst` on `stream`,
    /// followed by a `stream_sync` of `stream` when `synced` (the copy is then waited for).
    pub(crate) fn memcpy_htod(
        &self,
        stream: StreamRef,
        data: &[u8],
        dst: Region,
        synced: bool,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        let s = self.stream(stream)?;
        self.region(&dst)?;
        if data.len() as u64 != dst.bytes {
            return Err(SessionError::InvalidArgument(format!(
                "copying {} bytes into a region of {}",
                data.len(),
                dst.bytes
            )));
        }
        let mut st = self.lock()?;
        st.pageable_check(s)?;
        let op = st.next_op;
        st.backend.issue(
            op,
            Op::Store {
                stream: s,
                dst: dst.span(),
                data,
            },
        )?;
        if synced {
            st.backend.issue(op, Op::StreamSync { stream: s })?;
        }
        st.record_pageable_copy(s, "memcpy_htod", &dst, true, synced, site);
        Ok(())
    }

    /// Copies `src` into pageable host memory through `stream` and waits for it: recorded as a
    /// launch `name` reading `src` on `stream`, then a `stream_sync` of `stream`.
    pub(crate) fn memcpy_dtoh(
        &self,
        stream: StreamRef,
        src: Region,
        name: &'static str,
        site: &'static Location<'static>,
    ) -> Result<Vec<u8>, SessionError> {
        let s = self.stream(stream)?;
        self.region(&src)?;
        let mut st = self.lock()?;
        st.pageable_check(s)?;
        let op = st.next_op;
        let bytes = match st.backend.issue(
            op,
            Op::Load {
                stream: s,
                src: src.span(),
            },
        )? {
            Issued::Bytes(b) => b,
            _ => Vec::new(),
        };
        st.record_pageable_copy(s, name, &src, false, true, site);
        Ok(bytes)
    }

    /// [`Core::memcpy_htod`] of words, waited for (`cudaMemcpy`).
    pub(crate) fn memcpy_htod_words(
        &self,
        stream: StreamRef,
        words: &[u32],
        dst: Region,
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        if words.len() as u64 != dst.words() {
            return Err(SessionError::InvalidArgument(format!(
                "copying {} elements into a region of {}",
                words.len(),
                dst.words()
            )));
        }
        self.memcpy_htod(stream, &bytes_of(words, dst.bytes), dst, true, site)
    }

    /// [`Core::memcpy_dtoh`] as words (`memcpy_dtov`).
    pub(crate) fn memcpy_dtov(
        &self,
        stream: StreamRef,
        src: Region,
        site: &'static Location<'static>,
    ) -> Result<Vec<u32>, SessionError> {
        Ok(words_of(&self.memcpy_dtoh(
            stream,
            src,
            "memcpy_dtov",
            site,
        )?))
    }

    /// The host reads the bytes of pinned memory now: a `host_read`.
    pub(crate) fn host_read_bytes(
        &self,
        region: &Region,
        site: &'static Location<'static>,
    ) -> Result<Vec<u8>, SessionError> {
        self.region(region)?;
        pinned_only(region)?;
        let mut st = self.lock()?;
        let op = st.next_op;
        let bytes = match st.backend.issue(
            op,
            Op::HostRead {
                span: region.span(),
                fences: &[],
            },
        )? {
            Issued::Bytes(b) => b,
            _ => Vec::new(),
        };
        st.record(Rec::HostRead {
            region: region.into(),
            site: Some(site),
        });
        Ok(bytes)
    }

    /// The host reads the words of pinned memory now: a `host_read`.
    pub(crate) fn host_read(
        &self,
        region: &Region,
        site: &'static Location<'static>,
    ) -> Result<Vec<u32>, SessionError> {
        Ok(words_of(&self.host_read_bytes(region, site)?))
    }

    /// The host writes the bytes of pinned memory now: a `host_write`.
    pub(crate) fn host_write_bytes(
        &self,
        region: &Region,
        data: &[u8],
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.region(region)?;
        pinned_only(region)?;
        if data.len() as u64 != region.bytes {
            return Err(SessionError::InvalidArgument(format!(
                "writing {} bytes into a region of {}",
                data.len(),
                region.bytes
            )));
        }
        let mut st = self.lock()?;
        let op = st.next_op;
        st.backend.issue(
            op,
            Op::HostWrite {
                span: region.span(),
                data,
                fences: &[],
            },
        )?;
        st.record(Rec::HostWrite {
            region: region.into(),
            site: Some(site),
        });
        Ok(())
    }

    /// The host rewrites the words of pinned memory now (a `host_write`): `f` gets the current
    /// words and changes them, under the lock.
    pub(crate) fn host_write_with(
        &self,
        region: &Region,
        f: &mut dyn FnMut(&mut [u32]),
        site: &'static Location<'static>,
    ) -> Result<(), SessionError> {
        self.region(region)?;
        pinned_only(region)?;
        let mut st = self.lock()?;
        let op = st.next_op;
        let span = region.span();
        let mut words = match st.backend.issue(op, Op::HostRead { span, fences: &[] })? {
            Issued::Bytes(b) => words_of(&b),
            _ => Vec::new(),
        };
        guarded_callback(self.session, || f(&mut words));
        let data = bytes_of(&words, region.bytes);
        st.backend.issue(
            op,
            Op::HostWrite {
                span,
                data: &data,
                fences: &[],
            },
        )?;
        st.record(Rec::HostWrite {
            region: region.into(),
            site: Some(site),
        });
        Ok(())
    }
}
