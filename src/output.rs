//! Output files written safely, and temporary files removed even when the process is
//! interrupted.
//!
//! Every file the `streamsan` command writes — `check -o`, `fix -o`, `bench --write-trace`,
//! `fuzz`'s counterexamples — goes through [`OutputFile`]:
//!
//! - **A regular file, or no file yet**, is written under a temporary name beside it and renamed
//!   over it when complete ([`OutputFile::commit`]): readers see the old content or the new, never
//!   a part, and a failed or interrupted run leaves the old file as it was. The temporary is
//!   created exclusively (`O_EXCL`: never through a link planted at its name) with an
//!   unpredictable name, `.NAME.streamsan-XXXXXXXXXXXXXXXX.tmp`, in the target's own directory.
//!   The new file keeps the permissions of the file it replaces (a new one gets `0666` less the
//!   umask); it belongs to the user who ran the command, and other hard links to the old file
//!   keep the old content.
//! - **A symbolic link** is followed to the file it names, and that file is replaced as above, in
//!   its own directory: the link stays a link. A dangling link creates the file it names.
//! - **A character device or a FIFO** (`/dev/null`, `/dev/stdout`, a named pipe) is opened and
//!   written in place, as a shell redirection would; it is never replaced by a regular file. So
//!   is a regular file reached through a link that does not name it (`/proc/self/fd/N` of a
//!   deleted file).
//! - **Anything else** (a directory, a block device, a socket) is refused with a message.
//!
//! [`TempFile`] is a file of this process alone (mode `0600`, exclusive, unpredictable name),
//! removed when dropped. While it exists it is also *registered*: after
//! [`remove_temporaries_on_signals`], SIGINT, SIGTERM and SIGHUP remove every registered file
//! before the process dies of the signal (so the shell still sees 130 or 143). Outputs' temporary
//! names are registered the same way.

use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// How many symbolic links [`OutputFile::create`] follows before giving up (as Linux does).
const MAX_LINKS: usize = 40;

/// An output file being written; see the [module documentation](self) for what happens to the
/// path. Dropped without [`commit`](OutputFile::commit), a replacement leaves the old file as it
/// was (its temporary is removed).
pub struct OutputFile {
    out: BufWriter<File>,
    /// The temporary to rename over `dest`; `None` when written in place.
    replace: Option<(TempFile, PathBuf)>,
}

impl OutputFile {
    /// Opens `path` for writing, as the [module documentation](self) says. The error says what
    /// is wrong in words, without the path.
    pub fn create(path: &Path) -> io::Result<OutputFile> {
        let followed = match std::fs::metadata(path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        match &followed {
            Some(m) if m.is_dir() => return Err(refused("is a directory")),
            Some(m) if !m.is_file() => return in_place(path, m),
            _ => {}
        }
        let dest = resolve_links(path)?;
        if let Some(m) = &followed {
            // A link the kernel follows somewhere else than its text says (`/proc/self/fd/N`).
            let named = std::fs::metadata(&dest).ok();
            if !named.is_some_and(|n| same_inode(&n, m)) {
                return in_place(path, m);
            }
        }
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = dest
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let prefix = format!(".{}.streamsan-", shorten(&name, 160));
        let (tmp, file) = TempFile::create_in(&dir, &prefix, ".tmp", 0o666)?;
        if let Some(m) = &followed {
            // Best effort: the replacement keeps the old file's permissions.
            let _ = file.set_permissions(m.permissions());
        }
        Ok(OutputFile {
            out: BufWriter::with_capacity(1 << 16, file),
            replace: Some((tmp, dest)),
        })
    }

    /// Whether the output is written in place (a device or FIFO) rather than replaced.
    pub fn in_place(&self) -> bool {
        self.replace.is_none()
    }

    /// Finishes the output: flushes it and, for a replacement, renames the temporary over the
    /// target.
    pub fn commit(mut self) -> io::Result<()> {
        self.out.flush()?;
        if let Some((tmp, dest)) = self.replace.take() {
            tmp.persist(&dest)?;
        }
        Ok(())
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.out.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn refused(what: &str) -> io::Error {
    io::Error::other(format!("{what}; write the output elsewhere"))
}

/// Opens an existing file that is not replaced (a device, a FIFO, a file behind a magic link).
fn in_place(path: &Path, m: &std::fs::Metadata) -> io::Result<OutputFile> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = m.file_type();
        if !(t.is_file() || t.is_char_device() || t.is_fifo()) {
            let what = if t.is_block_device() {
                "is a block device"
            } else if t.is_socket() {
                "is a socket"
            } else {
                "is not a regular file, a character device or a FIFO"
            };
            return Err(refused(what));
        }
    }
    let file = OpenOptions::new()
        .write(true)
        .truncate(m.is_file())
        .open(path)?;
    Ok(OutputFile {
        out: BufWriter::with_capacity(1 << 16, file),
        replace: None,
    })
}

/// Whether two metadata are of the same file.
fn same_inode(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino()
    }
    #[cfg(not(unix))]
    {
        a.len() == b.len() && a.modified().ok() == b.modified().ok()
    }
}

/// `path` with its final symbolic links followed (each relative target read from the link's
/// own directory): the path of what is not a link, which may not exist.
fn resolve_links(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(io::Error::other("too many levels of symbolic links"))
}

/// At most `max` bytes of `name`, cut at a character boundary (a temporary's name must stay
/// within the file system's name limit).
fn shorten(name: &str, max: usize) -> &str {
    let mut end = name.len().min(max);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// 64 unpredictable bits: std's hash keys come from the operating system's random source, and a
/// counter makes each call differ.
fn random_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish()
}

/// A temporary file of this process: created exclusively under an unpredictable name, removed
/// when dropped (unless [persisted](TempFile::persist)), and removed on SIGINT, SIGTERM and
/// SIGHUP once [`remove_temporaries_on_signals`] was called.
pub struct TempFile {
    path: PathBuf,
    slot: Option<usize>,
}

impl TempFile {
    /// A new file `dir/PREFIX<16 hex digits>SUFFIX`, created exclusively with permissions `mode`
    /// (less the umask), open for writing.
    pub fn create_in(
        dir: &Path,
        prefix: &str,
        suffix: &str,
        mode: u32,
    ) -> io::Result<(TempFile, File)> {
        let mut last = io::Error::other("no name was free");
        for _ in 0..16 {
            let path = dir.join(format!("{prefix}{:016x}{suffix}", random_u64()));
            let mut options = OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
            #[cfg(not(unix))]
            let _ = mode;
            // Registered before it exists: a signal that comes as it is made still removes it
            // (unlinking a name that does not exist yet is harmless).
            let slot = signals::register(&path);
            match options.open(&path) {
                Ok(file) => return Ok((TempFile { path, slot }, file)),
                Err(e) => {
                    if let Some(slot) = slot {
                        signals::unregister(slot);
                    }
                    if e.kind() != io::ErrorKind::AlreadyExists {
                        return Err(e);
                    }
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// A new private file (`0600`) in the system's temporary directory.
    pub fn private(prefix: &str, suffix: &str) -> io::Result<(TempFile, File)> {
        TempFile::create_in(&std::env::temp_dir(), prefix, suffix, 0o600)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the file to `dest`; it is no longer removed. On failure it is removed.
    pub fn persist(mut self, dest: &Path) -> io::Result<()> {
        std::fs::rename(&self.path, dest)?;
        if let Some(slot) = self.slot.take() {
            signals::unregister(slot);
        }
        self.path = PathBuf::new();
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            signals::unregister(slot);
        }
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl std::fmt::Debug for TempFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TempFile")
            .field("path", &self.path)
            .finish()
    }
}

/// Makes SIGINT, SIGTERM and SIGHUP remove every registered temporary file, then end the process
/// by the same signal (its exit status stays the conventional one). A signal the process
/// inherited as ignored stays ignored. Does nothing where signals are not Unix's. Call it once,
/// early in `main`.
pub fn remove_temporaries_on_signals() {
    signals::install();
}

#[cfg(unix)]
mod signals {
    //! The registry of temporary files, and the signal handler that removes them.
    //!
    //! The handler may only call async-signal-safe functions: it reads the registered paths from
    //! a fixed array of atomic pointers to C strings, `unlink`s each, restores the default action
    //! and raises the signal again. A path is freed on unregistering only when no handler has
    //! started (a handler may be reading it on another thread); otherwise it is leaked, and the
    //! process is ending anyway.

    use std::ffi::{c_char, c_int, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::ptr::null_mut;
    use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering::SeqCst};

    /// How many temporaries can be registered at once (the command has at most two).
    const SLOTS: usize = 32;

    static PATHS: [AtomicPtr<c_char>; SLOTS] = [const { AtomicPtr::new(null_mut()) }; SLOTS];
    static IN_HANDLER: AtomicBool = AtomicBool::new(false);

    /// Registers `path`; `None` when it cannot be (no free slot, a NUL in the path).
    pub(super) fn register(path: &Path) -> Option<usize> {
        let c = CString::new(path.as_os_str().as_bytes()).ok()?.into_raw();
        for (i, slot) in PATHS.iter().enumerate() {
            if slot.compare_exchange(null_mut(), c, SeqCst, SeqCst).is_ok() {
                return Some(i);
            }
        }
        // SAFETY: `c` came from `CString::into_raw` above and was not published.
        drop(unsafe { CString::from_raw(c) });
        None
    }

    pub(super) fn unregister(slot: usize) {
        let Some(s) = PATHS.get(slot) else { return };
        let c = s.swap(null_mut(), SeqCst);
        if !c.is_null() && !IN_HANDLER.load(SeqCst) {
            // SAFETY: `c` came from `CString::into_raw` in `register`; it is no longer in the
            // array, and no handler had started when it was taken out, so none can read it.
            drop(unsafe { CString::from_raw(c) });
        }
    }

    extern "C" fn handler(signal: c_int) {
        IN_HANDLER.store(true, SeqCst);
        for slot in &PATHS {
            let c = slot.load(SeqCst);
            if !c.is_null() {
                // SAFETY: a registered path is a valid C string that is never freed once a
                // handler has started; `unlink` is async-signal-safe.
                unsafe { libc::unlink(c) };
            }
        }
        // SAFETY: `signal` and `raise` are async-signal-safe; with the default action
        // restored, the raised signal ends the process once this handler returns.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
    }

    pub(super) fn install() {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: `sigaction` with a zeroed, then filled, `sigaction` struct; the handler
            // is an `extern "C" fn(c_int)` that only does async-signal-safe work.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, std::ptr::null(), &mut old) != 0
                    || old.sa_sigaction == libc::SIG_IGN
                {
                    continue;
                }
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = handler as extern "C" fn(c_int) as libc::sighandler_t;
                libc::sigemptyset(&mut action.sa_mask);
                action.sa_flags = libc::SA_RESTART;
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(not(unix))]
mod signals {
    //! No signal handling: temporaries are removed when dropped only.
    pub(super) fn register(_: &std::path::Path) -> Option<usize> {
        None
    }
    pub(super) fn unregister(_: usize) {}
    pub(super) fn install() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporaries_are_exclusive_random_and_removed() {
        let dir = std::env::temp_dir();
        let (a, _) = TempFile::private("streamsan-test-", ".tmp").unwrap();
        let (b, _) = TempFile::private("streamsan-test-", ".tmp").unwrap();
        assert_ne!(a.path(), b.path());
        assert!(a.path().starts_with(&dir) && a.path().exists());
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists());
        let dest = dir.join(format!("streamsan-test-dest-{:x}", random_u64()));
        b.persist(&dest).unwrap();
        assert!(dest.exists());
        std::fs::remove_file(dest).unwrap();
    }

    #[test]
    fn names_are_cut_at_character_boundaries() {
        assert_eq!(shorten("abc", 10), "abc");
        assert_eq!(shorten("aéb", 2), "a");
        assert_eq!(shorten("aéb", 3), "aé");
    }
}
