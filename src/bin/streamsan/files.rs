use super::*;

/// A reader that counts the bytes it hands out, for the progress bar.
pub(crate) struct Counting<R> {
    pub(crate) inner: R,
    pub(crate) count: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: io::Read> io::Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

pub(crate) type Input = (
    Box<dyn BufRead>,
    String,
    Option<u64>,
    std::rc::Rc<std::cell::Cell<u64>>,
);

pub(crate) fn open_input(path: &PathBuf) -> Result<Input, CliError> {
    let count = std::rc::Rc::new(std::cell::Cell::new(0));
    if path.as_os_str() == "-" {
        let r = Counting {
            inner: io::stdin(),
            count: count.clone(),
        };
        return Ok((
            Box::new(BufReader::with_capacity(1 << 16, r)),
            "<stdin>".into(),
            None,
            count,
        ));
    }
    let name = path.display().to_string();
    let f = File::open(path).map_err(|e| CliError::Io(format!("{name}: cannot open: {e}")))?;
    let len = f.metadata().ok().map(|m| m.len());
    let r = Counting {
        inner: f,
        count: count.clone(),
    };
    Ok((
        Box::new(BufReader::with_capacity(1 << 16, r)),
        name,
        len,
        count,
    ))
}

/// Where a command writes its result: standard output, or a file written safely (replaced
/// atomically, links followed, devices and FIFOs written in place; see `streamsan::output`).
pub(crate) enum Output {
    Stdout(io::BufWriter<io::Stdout>),
    File(OutputFile),
}

impl Output {
    /// Standard output for `None` and `-`, else the file.
    pub(crate) fn open(path: Option<&PathBuf>) -> Result<Output, CliError> {
        match path {
            Some(p) if p.as_os_str() != "-" => OutputFile::create(p)
                .map(Output::File)
                .map_err(|e| CliError::Io(format!("{}: cannot write: {e}", p.display()))),
            _ => Ok(Output::Stdout(io::BufWriter::with_capacity(
                1 << 16,
                io::stdout(),
            ))),
        }
    }

    /// Flushes the output and, for a file, puts it in place.
    pub(crate) fn commit(self) -> io::Result<()> {
        match self {
            Output::Stdout(mut w) => w.flush(),
            Output::File(f) => f.commit(),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Output::Stdout(w) => w.write(buf),
            Output::File(f) => f.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Output::Stdout(w) => w.write_all(buf),
            Output::File(f) => f.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::Stdout(w) => w.flush(),
            Output::File(f) => f.flush(),
        }
    }
}

/// Refuses to write `output` over the trace `file` being read (the same file, also through
/// links or another name).
pub(crate) fn refuse_overwrite(
    file: &PathBuf,
    output: Option<&PathBuf>,
    what: &str,
) -> Result<(), CliError> {
    match output {
        Some(out) if rereadable(file) && same_file(file, out) => Err(CliError::Usage(format!(
            "{}: the output would overwrite the trace being {what}; write it elsewhere",
            out.display()
        ))),
        _ => Ok(()),
    }
}

pub(crate) fn progress(len: Option<u64>) -> indicatif::ProgressBar {
    match len {
        Some(len) if len > (16 << 20) && io::stderr().is_terminal() => {
            let bar = indicatif::ProgressBar::new(len);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} checking {bytes}/{total_bytes} {wide_bar} {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        }
        _ => indicatif::ProgressBar::hidden(),
    }
}

/// The trace, opened again for a second walk: the file, or the copy of standard input.
pub(crate) enum Source {
    File(PathBuf),
}

impl Source {
    pub(crate) fn open(&self) -> Result<Box<dyn BufRead + '_>, CliError> {
        match self {
            Source::File(path) => File::open(path)
                .map(|f| Box::new(BufReader::with_capacity(1 << 16, f)) as Box<dyn BufRead>)
                .map_err(|e| CliError::Io(format!("{}: cannot open: {e}", path.display()))),
        }
    }

    /// The trace to read again for the re-check of the synchronization analysis.
    pub(crate) fn reread<'a>(&'a self, name: &'a str) -> streamsan::analysis::run::TraceFile<'a> {
        match self {
            Source::File(path) => streamsan::analysis::run::TraceFile::new(path, name),
        }
    }
}

/// Whether two paths name the same file (also through links).
pub(crate) fn same_file(a: &PathBuf, b: &PathBuf) -> bool {
    let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        x.dev() == y.dev() && x.ino() == y.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (x, y);
        std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
    }
}

/// Whether `path` names a regular file, which can be read a second time.
pub(crate) fn rereadable(path: &PathBuf) -> bool {
    path.as_os_str() != "-" && std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// A temporary copy of an input that cannot be read twice: a private file, removed when
/// dropped, and on SIGINT or SIGTERM.
pub(crate) struct Spool {
    pub(crate) file: TempFile,
    /// Set when writing the copy failed: the copy is then incomplete.
    pub(crate) failed: std::rc::Rc<std::cell::Cell<bool>>,
}

impl Spool {
    /// A new file of this process alone (created exclusively, readable by its owner only).
    pub(crate) fn create() -> Result<(Self, File), CliError> {
        let (file, f) = TempFile::private("streamsan-input-", ".jsonl").map_err(|e| {
            let dir = std::env::temp_dir();
            CliError::Io(format!(
                "{}: cannot create a temporary file: {e}",
                dir.display()
            ))
        })?;
        let failed = Default::default();
        Ok((Spool { file, failed }, f))
    }
}

/// A reader that copies what it reads to `copy`; a failed write stops the copy (and sets
/// `failed`) without failing the read.
pub(crate) struct Tee<R, W: Write> {
    pub(crate) inner: R,
    pub(crate) copy: Option<W>,
    pub(crate) failed: std::rc::Rc<std::cell::Cell<bool>>,
}

impl<R: io::Read, W: Write> io::Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(copy) = self.copy.as_mut() {
            let written =
                copy.write_all(&buf[..n])
                    .and_then(|_| if n == 0 { copy.flush() } else { Ok(()) });
            if written.is_err() {
                self.failed.set(true);
                self.copy = None;
            }
        }
        Ok(n)
    }
}
