//! The checker beside the program: the JSON Lines a `Checker` is handed go into a queue bounded
//! by bytes, and a thread of the checker's own parses and checks them, in the order they were
//! handed, through the same [`Core`] a synchronous `Checker` uses on the caller's thread.
//!
//! The caller only copies its batch into the queue: it waits (with the GIL released) only when
//! the queue is full, that is when the checker has fallen behind by more than the bound, so the
//! program's memory stays flat however far ahead it runs. Batches are admitted in the order
//! their callers entered (a ticket taken with the GIL held), so two threads that hand batches
//! over in turn keep their order even when one of them had to wait for room.
//!
//! A hand-over does not wake the thread while batches are coming: it looks at the queue every
//! [`POLL`] by itself, so the program's thread pays a copy and a lock per batch, not the system
//! call of a wake-up. Only a thread that found the queue empty [`POLLS_BEFORE_SLEEP`] times in a
//! row sleeps until a batch wakes it. A caller that waits for it to catch up checks what is
//! queued itself when the thread is between batches (no wake-up either way), else wakes it.
//! Wake-ups are made after `state` is let go (a thread woken while it is held only waits again,
//! for the lock), and only when someone waits.
//!
//! The thread is started at a check's first batch; once the check is over it waits for the next
//! check's first batch (at most [`THREAD_IDLE`], then ends): a program that enters a check at
//! every step starts one thread, not one per check.
//!
//! What the thread finds comes back through [`State`]: the hazards not handed out yet, the
//! errors of bad input not raised yet (each raised once, in order, by the caller's next call),
//! and why the thread died if it panicked. Every wait ends when the thread makes progress, has
//! stopped, or has died; the thread never touches Python.
//!
//! Locks: `state` is held briefly by everyone, never while waiting for anything but its
//! condition variables; `core` is held by whoever checks (the thread, a caller catching up, who
//! released the GIL, or the caller of a synchronous `Checker`, who holds the GIL and waits for
//! nothing) and by the readers of the counters, who release the GIL first. `core` may be held
//! while taking the list of temporary copies (`SPOOLS`, in lib.rs), never the other way. Nobody
//! takes the GIL while holding any of them.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use streamsan::analysis::run::CheckRun;
use streamsan::trace::{parse_line_bytes, ParseError};
use streamsan::Hazard;

/// The thread [`dispose`] hands values to, and the process that made it.
type Disposer = (u32, std::sync::mpsc::Sender<Box<dyn Send>>);
static DISPOSER: Mutex<Option<Disposer>> = Mutex::new(None);

/// Drops `value` on a thread of this process's own ("streamsan-drop", made at the first call,
/// idle between calls), not the caller's: the end of a check drops the checker's state there,
/// whose drop takes time in proportion to what was checked, while the program waits for the
/// report. It is dropped here instead where no thread can be had, where another caller is
/// handing a value over at the same moment, and in a process forked from the one that made the
/// thread (which has no such thread; a lock a thread of the parent held at the fork stays held
/// in the child: it is only ever tried, never waited for).
pub(crate) fn dispose<T: Send + 'static>(value: T) {
    let Ok(mut d) = DISPOSER.try_lock() else {
        return; // busy, or poisoned: `value` is dropped here
    };
    let me = std::process::id();
    if d.is_none() {
        let (tx, rx) = std::sync::mpsc::channel::<Box<dyn Send>>();
        let spawned = std::thread::Builder::new()
            .name("streamsan-drop".into())
            .spawn(move || {
                for value in rx {
                    drop(value);
                }
            });
        if spawned.is_err() {
            return;
        }
        *d = Some((me, tx));
    }
    let refused = match d.as_ref() {
        Some((pid, tx)) if *pid == me => tx.send(Box::new(value)).err(),
        _ => return, // a forked child's: `value` is dropped here, the lock let go of first
    };
    drop(d);
    drop(refused); // the thread is gone: dropped here, the lock let go of
}

/// Locks `m`, whether or not a panic poisoned it: what it guards stays memory-safe, and a dead
/// thread is reported by [`State::dead`].
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a line was not checked.
pub(crate) enum LineError {
    /// The check has finished.
    Finished,
    /// Bad input: the located message (`NAME:LINE:COLUMN: …`) of `TraceError`.
    Bad(String),
}

/// What a check holds while ops come: the checker, the number of lines read, the copy of the
/// ops kept to explain the report. Whoever checks has it: the checker's thread, or the caller's.
pub(crate) struct Core {
    /// The run; `None` once finished.
    pub(crate) run: Option<CheckRun>,
    /// Lines read so far (the line number of bad-input messages).
    pub(crate) lines: u64,
    /// How bad-input messages name the ops' source.
    pub(crate) name: String,
    /// Where the checked lines are copied, if they are kept.
    pub(crate) out: OpsCopy,
    /// The first error writing the kept ops; the kept file is then incomplete.
    pub(crate) write_error: Option<String>,
}

/// Where a check's lines are copied.
pub(crate) enum OpsCopy {
    /// Nowhere.
    Nothing,
    /// In memory, while they take at most `limit` bytes: a short check touches no file. Past
    /// that they go to the temporary copy at `path` (registered for removal already), made then
    /// with what the memory held.
    Memory {
        /// The lines kept so far, each with its line end, in parts of [`PART_BYTES`] or more
        /// (each a whole number of lines): growing copies nothing that was kept.
        parts: Vec<Vec<u8>>,
        /// Bytes in `parts`.
        held: usize,
        /// The most bytes kept in memory.
        limit: usize,
        /// Where they go past `limit`.
        path: PathBuf,
    },
    /// A temporary copy, made at the first line kept (by whoever checks it: usually the
    /// checker's thread, off the caller's) or when the check finishes, at this path, registered
    /// for removal already.
    Spool(PathBuf),
    /// This file.
    File(BufWriter<File>),
}

/// The size of the parts the ops kept in memory are held in ([`OpsCopy::Memory`]).
const PART_BYTES: usize = 64 << 10;

impl OpsCopy {
    /// Makes the temporary copy now, if it is to be made and is not yet; a failure is the
    /// copy's write error. Lines kept in memory stay there.
    pub(crate) fn open(&mut self) -> Result<(), String> {
        if let OpsCopy::Spool(path) = self {
            match crate::create_spool(path) {
                Ok(f) => *self = OpsCopy::File(BufWriter::with_capacity(1 << 16, f)),
                Err(e) => {
                    *self = OpsCopy::Nothing;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Keeps `line` (without its line end): in memory while it fits, else in the file.
    fn write_line(&mut self, line: &[u8]) -> Result<(), String> {
        let mut held_before = Vec::new();
        if let OpsCopy::Memory {
            parts,
            held,
            limit,
            path,
        } = self
        {
            let need = line.len() + 1;
            if *held + need <= *limit {
                let fits = parts.last().is_some_and(|p| p.capacity() - p.len() >= need);
                if !fits {
                    parts.push(Vec::with_capacity(need.max(PART_BYTES)));
                }
                if let Some(part) = parts.last_mut() {
                    part.extend_from_slice(line);
                    part.push(b'\n');
                    *held += need;
                }
                return Ok(());
            }
            // Past the limit: what memory held goes to the file, first.
            held_before = std::mem::take(parts);
            *self = OpsCopy::Spool(std::mem::take(path));
        }
        self.open()?;
        if let OpsCopy::File(out) = self {
            for part in &held_before {
                out.write_all(part).map_err(|e| e.to_string())?;
            }
            out.write_all(line)
                .and_then(|_| out.write_all(b"\n"))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl Core {
    /// Checks one line (without its line end); returns the number of hazards found before it,
    /// or `None` for a blank or comment line. On bad input the op is not checked.
    pub(crate) fn check_line(&mut self, line: &[u8]) -> Result<Option<usize>, LineError> {
        if self.run.is_none() {
            return Err(LineError::Finished);
        }
        self.lines += 1;
        let number = self.lines;
        let parsed = parse_line_bytes(line)
            .map_err(|e| LineError::Bad(e.at_line(self.name.clone(), number).to_string()))?;
        let Some((op, spans)) = parsed else {
            self.keep(line);
            return Ok(None);
        };
        let Some(run) = self.run.as_mut() else {
            return Err(LineError::Finished);
        };
        let before = run.checker().hazards().len();
        if let Err(e) = run.check(&op).map(|_| ()) {
            let at = spans.locate(e.field);
            let err = ParseError::at(
                self.name.clone(),
                (number, at.1),
                e.message,
                e.expected.as_deref(),
            );
            return Err(LineError::Bad(err.to_string()));
        }
        self.keep(line);
        Ok(Some(before))
    }

    /// Checks JSON Lines (blank and `#` lines skipped) up to the first bad line, whose error is
    /// returned: the ops before it stay checked, the rest of `text` is dropped. Stops early,
    /// without an error, once `stop` says so.
    pub(crate) fn check_lines(
        &mut self,
        text: &[u8],
        stop: &dyn Fn() -> bool,
    ) -> Result<(), LineError> {
        let mut rest = text;
        while !rest.is_empty() {
            if stop() {
                return Ok(());
            }
            let (line, next) = match rest.iter().position(|&c| c == b'\n') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &rest[rest.len()..]),
            };
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            self.check_line(line)?;
            rest = next;
        }
        Ok(())
    }

    /// The number of hazards found so far.
    pub(crate) fn found(&self) -> usize {
        self.run.as_ref().map_or(0, |r| r.checker().hazards().len())
    }

    /// Checks a batch of JSON Lines (see [`Self::check_lines`]): the hazards it found, and why
    /// it stopped early, if it did.
    pub(crate) fn check_batch(
        &mut self,
        text: &[u8],
        stop: &dyn Fn() -> bool,
    ) -> (Vec<Hazard>, Result<(), LineError>) {
        let from = self.found();
        let r = self.check_lines(text, stop);
        (self.hazards_from(from), r)
    }

    /// The hazards found from the `from`th on.
    pub(crate) fn hazards_from(&self, from: usize) -> Vec<Hazard> {
        self.run
            .as_ref()
            .map_or_else(Vec::new, |r| r.checker().hazards()[from..].to_vec())
    }

    /// Writes what the copy of the ops holds in its buffer to its file.
    fn flush_copy(&mut self) {
        if let OpsCopy::File(out) = &mut self.out {
            if let Err(e) = out.flush() {
                self.write_error = Some(e.to_string());
                self.out = OpsCopy::Nothing;
            }
        }
    }

    fn keep(&mut self, line: &[u8]) {
        if let Err(e) = self.out.write_line(line) {
            self.write_error = Some(e);
            self.out = OpsCopy::Nothing;
        }
    }
}

/// What the callers and the checker's thread share about the queue and what the thread found.
pub(crate) struct State {
    /// Whether a thread checks the batches (else the caller checks them on its own thread).
    pub(crate) threaded: bool,
    /// No more batches are taken: the check is finishing. The thread ends once the queue is
    /// empty and nobody checks a batch.
    pub(crate) closed: bool,
    /// The report was made.
    pub(crate) finished: bool,
    queue: VecDeque<Vec<u8>>,
    /// Bytes of the batches in the queue and of the one being checked.
    pub(crate) bytes: usize,
    /// The most `bytes` ever were.
    pub(crate) peak: usize,
    /// The queue's bound in bytes (a larger batch is taken alone).
    bound: usize,
    /// Tickets handed to callers, in the order they entered.
    tickets: u64,
    /// Batches admitted to the queue (the holder of ticket `admitted` goes next).
    admitted: u64,
    /// Batches checked (by the thread, or by callers catching up).
    checked: u64,
    /// Hazards found and not handed out yet, in the order found.
    pub(crate) found: Vec<Hazard>,
    /// Errors of bad input not raised yet, in the order found.
    pub(crate) errors: VecDeque<String>,
    /// Why the thread died (it panicked): the check cannot go on.
    pub(crate) dead: Option<String>,
    /// The thread has ended (or there is none: a synchronous Checker, or one whose thread
    /// could not be started; a thread not started yet is not `exited`).
    pub(crate) exited: bool,
    /// Time spent parsing and checking batches: the thread's, and that of callers that checked
    /// the last batches themselves when catching up.
    pub(crate) busy: Duration,
    /// Time callers spent waiting for room in the queue or for their turn (the program held
    /// back by the checker).
    pub(crate) waited: Duration,
    /// The thread is waiting for a batch: an admitted batch wakes it (else it looks at the
    /// queue before it waits again, and nothing needs waking).
    idle: bool,
    /// Someone is checking batches taken from the queue: the thread, or a caller catching up
    /// (see [`Shared::check_queued_here`]). Batches are taken only while nobody is, so they
    /// are checked in order.
    checking: bool,
    /// The thread was started (at the first batch admitted: a check that hands none over
    /// starts none, and the first hand-over, often the recorder's own thread, pays for it).
    spawned: bool,
    /// The thread could not be started: whoever hands a batch over checks the queue.
    no_thread: bool,
    /// Callers waiting on `progress`: the thread's progress wakes them (a wake-up is a system
    /// call, which a batch handed over while nobody waits does not pay).
    waiters: usize,
}

impl State {
    /// Whether the holder of `ticket` may put `len` bytes in the queue now: it is its turn, and
    /// there is room (a batch larger than the bound is taken alone, into an empty queue).
    fn admits(&self, ticket: u64, len: usize) -> bool {
        self.admitted == ticket && (self.bytes == 0 || self.bytes.saturating_add(len) <= self.bound)
    }

    /// Counts a batch of `len` bytes as checked, with what checking it found.
    fn record_batch(&mut self, len: usize, found: Vec<Hazard>, r: Result<(), LineError>) {
        self.bytes -= len;
        self.checked += 1;
        self.found.extend(found);
        if let Err(LineError::Bad(message)) = r {
            self.errors.push_back(message);
        }
    }

    /// Whether every batch admitted so far has been checked (or never will be).
    fn caught_up(&self) -> bool {
        self.checked == self.admitted || self.exited || self.dead.is_some()
    }
}

/// Options of the checker's thread; `delay` and `panic_at` are for streamsan's own tests.
pub(crate) struct Options {
    /// The queue's bound in bytes.
    pub(crate) bound: usize,
    /// The thread sleeps this long before each batch.
    pub(crate) delay: Duration,
    /// The thread panics on this batch (counted from 0).
    pub(crate) panic_at: Option<u64>,
}

/// A caller's entry into the queue: admitted (or refused) at once, or waiting with its ticket.
enum Entry {
    Done(Result<(), Refused>),
    Wait(u64, Vec<u8>),
}

/// Whom an admitted batch wakes: the thread, waiting for work; callers waiting on `progress`.
struct Wake {
    thread: bool,
    waiters: bool,
    /// The thread is to be started.
    spawn: bool,
    /// There is no thread: the caller checks the queue.
    check_here: bool,
}

/// Why a batch was not taken.
pub(crate) enum Refused {
    /// The check is finishing or finished.
    Finished,
    /// The thread died; why.
    Dead(String),
}

/// The queue, the thread's findings and the [`Core`], shared by the callers and the thread.
pub(crate) struct Shared {
    /// The check itself.
    pub(crate) core: Mutex<Core>,
    /// The queue and what the thread found.
    pub(crate) state: Mutex<State>,
    /// The thread waits here for batches.
    work: Condvar,
    /// Callers wait here for room, for their turn, for the thread to catch up or to end.
    progress: Condvar,
    /// Set when the Checker goes away: the thread drops what is left and ends.
    abort: AtomicBool,
    delay: Duration,
    panic_at: Option<u64>,
    /// Whether a thread serves this check (started for it, or an idle one that took it), until
    /// the check waits for it or leaves it (see [`Self::take_thread`]).
    thread: AtomicBool,
    /// This `Shared`, for the thread started at the first batch.
    me: Weak<Shared>,
    /// The process that made it: a process forked from it has a copy, without the thread, and
    /// with whatever locks the parent's threads held at the fork held for good.
    pub(crate) pid: u32,
}

/// How long a caller waiting for the thread sleeps between looks at Python's signals.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// How often the thread looks at the queue while batches are coming. It is not woken for each
/// batch: waking a sleeping thread is a system call (10-40 µs where CPUs are virtual), paid by
/// the program's thread at every hand-over; a look that finds the queue empty costs the
/// checker's thread alone.
const POLL: Duration = Duration::from_millis(1);

/// Empty looks after which the thread sleeps until a batch wakes it (a program that stopped
/// recording for a while, or a check left open).
const POLLS_BEFORE_SLEEP: u32 = 100;

/// How long dropping a Checker waits for its thread to end before leaving it behind.
const DROP_WAIT: Duration = Duration::from_secs(2);

/// How long a checker's thread whose check is over waits for the next check before it ends: a
/// program that enters a check at every step (a test, a benchmark's timed loop) starts one
/// thread, not one per check (starting a thread costs about as much as the rest of entering
/// and leaving a short check).
const THREAD_IDLE: Duration = Duration::from_secs(10);

/// [`THREAD_IDLE`] in milliseconds, or another wait set by [`set_thread_idle`] (tests).
static THREAD_IDLE_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(THREAD_IDLE.as_millis() as u64);

/// Sets how long an idle checker's thread waits for the next check (threads waiting already
/// keep the wait they began).
pub(crate) fn set_thread_idle(wait: Duration) {
    THREAD_IDLE_MS.store(wait.as_millis() as u64, Ordering::Relaxed);
}

/// The checkers' threads whose check is over, each with its process and a number of its own,
/// waiting for the next check on their channel (at most [`THREAD_IDLE`]).
type Idle = Vec<(u32, u64, std::sync::mpsc::Sender<Arc<Shared>>)>;
static IDLE_THREADS: Mutex<Idle> = Mutex::new(Vec::new());

/// Numbers the checkers' threads (their entries in [`IDLE_THREADS`]).
static THREAD_NUMBERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Hands `shared` to an idle checker's thread of this process, if there is one; gives it back
/// if not. Only tried: a lock a parent's thread held at a fork stays held in the child.
fn hand_to_idle(mut shared: Arc<Shared>) -> Result<(), Arc<Shared>> {
    let me = std::process::id();
    let Ok(mut idle) = IDLE_THREADS.try_lock() else {
        return Err(shared);
    };
    idle.retain(|(pid, _, _)| *pid == me); // a forked child's copies of its parent's threads
    while let Some((_, _, tx)) = idle.pop() {
        match tx.send(shared) {
            Ok(()) => return Ok(()),
            Err(refused) => shared = refused.0, // that thread has ended
        }
    }
    Err(shared)
}

/// A checker's thread: serves `first`, then each check an idle wait of [`THREAD_IDLE`] brings.
fn serve_checks(first: Arc<Shared>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let number = THREAD_NUMBERS.fetch_add(1, Ordering::Relaxed);
    let me = std::process::id();
    let mut shared = first;
    loop {
        run(&shared);
        // The check's state goes here if this was its last holder.
        drop(shared);
        // Only tried (a lock a parent's thread held at a fork stays held in the child; a busy
        // one is let be): where it is not had, this thread ends, and the next check starts one.
        match IDLE_THREADS.try_lock() {
            Ok(mut idle) => idle.push((me, number, tx.clone())),
            Err(_) => return,
        }
        let idle = Duration::from_millis(THREAD_IDLE_MS.load(Ordering::Relaxed));
        shared = match rx.recv_timeout(idle) {
            Ok(next) => next,
            Err(_) => {
                let mut idle = lock(&IDLE_THREADS);
                if let Some(i) = idle.iter().position(|(_, n, _)| *n == number) {
                    idle.swap_remove(i);
                    return;
                }
                drop(idle);
                // Taken by a check meanwhile: it is on its way.
                match rx.recv() {
                    Ok(next) => next,
                    Err(_) => return,
                }
            }
        };
    }
}

impl Shared {
    /// A check whose batches the caller checks on its own thread (`options`: `None`) or a
    /// thread does, started at the first batch admitted (see [`Self::spawn`]).
    pub(crate) fn start(core: Core, options: Option<Options>) -> Arc<Shared> {
        let threaded = options.is_some();
        let options = options.unwrap_or(Options {
            bound: usize::MAX,
            delay: Duration::ZERO,
            panic_at: None,
        });
        Arc::new_cyclic(|me| Shared {
            core: Mutex::new(core),
            state: Mutex::new(State {
                threaded,
                closed: false,
                finished: false,
                queue: VecDeque::new(),
                bytes: 0,
                peak: 0,
                bound: options.bound,
                tickets: 0,
                admitted: 0,
                checked: 0,
                found: Vec::new(),
                errors: VecDeque::new(),
                dead: None,
                exited: !threaded,
                busy: Duration::ZERO,
                waited: Duration::ZERO,
                idle: false,
                waiters: 0,
                checking: false,
                spawned: false,
                no_thread: false,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
            abort: AtomicBool::new(false),
            delay: options.delay,
            panic_at: options.panic_at,
            thread: AtomicBool::new(false),
            me: me.clone(),
            pid: std::process::id(),
        })
    }

    /// Whether this is a copy in a process forked from the one that made it (see `pid`).
    pub(crate) fn forked(&self) -> bool {
        std::process::id() != self.pid
    }

    /// Starts the checker's thread (asked for by the first batch admitted). Where no thread can
    /// be had, the check goes on without one: whoever hands a batch over (this caller now, the
    /// recorder's hand-overs and Python's pushes after it) checks the queue on its own thread,
    /// in order.
    fn spawn(&self) {
        let Some(worker) = self.me.upgrade() else {
            return;
        };
        // Said before a thread has the check: one that checks it and is done at once is still
        // waited for by the caller that takes it (`take_thread`).
        self.thread.store(true, Ordering::Relaxed);
        let worker = match hand_to_idle(worker) {
            Ok(()) => return,
            Err(worker) => worker,
        };
        // Not joined: it goes on to wait for the next check (a check is over with its thread
        // when `exited`).
        let spawned = std::thread::Builder::new()
            .name("streamsan-checker".into())
            .spawn(move || serve_checks(worker));
        if let Err(e) = spawned {
            self.thread.store(false, Ordering::Relaxed);
            eprintln!(
                "streamsan: cannot start the checker's thread: {e}; checking on the \
                 threads that hand the ops over"
            );
            lock(&self.state).no_thread = true;
            self.check_queued_here(true);
        }
    }

    /// Whether a thread served this check and was not waited for or left yet (once: the
    /// caller then waits for it to be done with the check, `exited`, or leaves it).
    pub(crate) fn take_thread(&self) -> bool {
        self.thread.swap(false, Ordering::Relaxed)
    }

    /// Why no batch can be taken now, if so.
    fn refused(s: &State) -> Option<Refused> {
        if let Some(why) = &s.dead {
            Some(Refused::Dead(why.clone()))
        } else if s.closed || s.finished {
            Some(Refused::Finished)
        } else if s.exited {
            Some(Refused::Dead("the checker's thread has stopped".into()))
        } else {
            None
        }
    }

    /// Hands `batch` to the thread: returns as soon as it is in the queue. Waits, with the GIL
    /// released, only while the queue is full or callers that entered before have not handed
    /// theirs over yet.
    pub(crate) fn push(&self, py: pyo3::Python<'_>, batch: Vec<u8>) -> Result<(), Refused> {
        match self.enter(batch, false, false) {
            Entry::Done(r) => r,
            Entry::Wait(ticket, batch) => py.detach(|| self.wait_turn(ticket, batch, false, false)),
        }
    }

    /// [`Self::push`] for a caller outside Python (the C++ recorder's hand-over, which may hold
    /// the GIL: the thread never needs it, so the wait ends as it does in `push`). `now`: the
    /// thread is woken for the batch, not left to find it at its next look (the recorder's own
    /// thread hands over what came before a host synchronization: the program waits for the
    /// GPU, and the batch is checked during that wait; the wake-up's system call is that
    /// thread's, not the program's). The first batch handed over without `now` starts no
    /// thread: a check whose ops fit one batch (handed over at its end, and checked by the
    /// caller waiting for them) makes no system call for one; the next batch starts it.
    pub(crate) fn push_raw(&self, batch: Vec<u8>, now: bool) -> Result<(), Refused> {
        match self.enter(batch, now, true) {
            Entry::Done(r) => r,
            Entry::Wait(ticket, batch) => self.wait_turn(ticket, batch, now, true),
        }
    }

    /// Takes a ticket, and admits `batch` at once when it is its turn and there is room (`now`,
    /// `lazy`: see [`Self::admit`]).
    fn enter(&self, batch: Vec<u8>, now: bool, lazy: bool) -> Entry {
        let len = batch.len();
        let mut s = lock(&self.state);
        if let Some(r) = Self::refused(&s) {
            return Entry::Done(Err(r));
        }
        let ticket = s.tickets;
        s.tickets += 1;
        if s.admits(ticket, len) {
            let wake = self.admit(&mut s, batch, now, lazy);
            drop(s);
            self.wake(wake);
            return Entry::Done(Ok(()));
        }
        Entry::Wait(ticket, batch)
    }

    /// Waits for the turn of `ticket` and room for `batch`, then admits it. A thread not
    /// started yet (see [`Self::admit`]) is started first: the room comes from its progress.
    fn wait_turn(&self, ticket: u64, batch: Vec<u8>, now: bool, lazy: bool) -> Result<(), Refused> {
        let len = batch.len();
        let since = Instant::now();
        let mut s = lock(&self.state);
        loop {
            if let Some(r) = Self::refused(&s) {
                s.waited += since.elapsed();
                return Err(r);
            }
            if s.admits(ticket, len) {
                s.waited += since.elapsed();
                let wake = self.admit(&mut s, batch, now, lazy);
                drop(s);
                self.wake(wake);
                return Ok(());
            }
            if s.threaded && !s.spawned {
                drop(s);
                self.start_late();
                s = lock(&self.state);
                continue;
            }
            s = self.wait_progress(s, None);
        }
    }

    /// Starts the thread a native caller's first batch did not start (see [`Self::admit`]),
    /// where the progress waited for is to come from it.
    fn start_late(&self) {
        let spawn = {
            let mut s = lock(&self.state);
            let spawn = s.threaded && !s.spawned;
            s.spawned = true;
            spawn
        };
        if spawn {
            self.spawn();
        }
    }

    /// Waits on `progress` (at most `limit`), counted in `waiters` while it does.
    fn wait_progress<'a>(
        &'a self,
        mut s: MutexGuard<'a, State>,
        limit: Option<Duration>,
    ) -> MutexGuard<'a, State> {
        s.waiters += 1;
        let mut s = match limit {
            None => self.progress.wait(s).unwrap_or_else(|p| p.into_inner()),
            Some(limit) => {
                self.progress
                    .wait_timeout(s, limit)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
        };
        s.waiters -= 1;
        s
    }

    /// Puts `batch` in the queue; `state` held. Returns whom to wake once `state` is let go
    /// (woken while it is held, the thread would only wait again, for the lock): the thread when
    /// it sleeps, or (`now`) when it is between looks at the queue. The thread is started at the
    /// first batch, or with `lazy` at the first handed over `now` or the second.
    fn admit(&self, s: &mut State, batch: Vec<u8>, now: bool, lazy: bool) -> Wake {
        s.bytes += batch.len();
        s.peak = s.peak.max(s.bytes);
        s.queue.push_back(batch);
        s.admitted += 1;
        let spawn = s.threaded && !s.spawned && (!lazy || now || s.admitted >= 2);
        s.spawned |= spawn;
        Wake {
            thread: s.idle || (now && !s.checking),
            // The next ticket's holder may be waiting for its turn.
            waiters: s.waiters > 0,
            spawn,
            check_here: s.no_thread,
        }
    }

    /// Wakes whom `admit` said, `state` not held.
    fn wake(&self, wake: Wake) {
        if wake.spawn {
            self.spawn();
        }
        if wake.check_here {
            self.check_queued_here(true);
        }
        if wake.thread {
            self.work.notify_one();
        }
        if wake.waiters {
            self.progress.notify_all();
        }
    }

    /// Waits, with the GIL released, until the thread has checked every batch admitted so far
    /// (or has ended). Python's signals are looked at while waiting: a `KeyboardInterrupt`
    /// ends the wait, and changes nothing.
    pub(crate) fn catch_up(&self, py: pyo3::Python<'_>) -> pyo3::PyResult<()> {
        loop {
            if py.detach(|| self.look()) {
                return Ok(());
            }
            py.check_signals()?;
        }
    }

    /// Checks what is in the queue on the caller's thread, when nobody is checking a batch
    /// (the thread is between batches, or has not looked at the queue yet): a caller that waits
    /// for the thread to catch up (at the end of a check, the last batch) checks it itself
    /// rather than waking the thread and waiting to be woken. In order: batches are taken only
    /// while nobody checks. Returns whether every batch admitted is checked now. `always`: also
    /// where the tests' hooks (`_delay`, `_panic_at`) ask for the thread to check every batch
    /// (the thread could not be started). A panic while checking ends the check as the
    /// thread's panic does ([`State::dead`]): the batches taken count as checked.
    fn check_queued_here(&self, always: bool) -> bool {
        if !always && (!self.delay.is_zero() || self.panic_at.is_some()) {
            return false;
        }
        let batches = {
            let mut s = lock(&self.state);
            if s.checking || s.dead.is_some() || s.queue.is_empty() {
                return !s.checking && s.caught_up();
            }
            s.checking = true;
            std::mem::take(&mut s.queue)
        };
        // Whatever happens while checking (a panic: raised in the caller), the thread may take
        // batches again afterwards.
        struct Done<'a>(&'a Shared);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut s = lock(&self.0.state);
                s.checking = false;
                let more = !s.queue.is_empty() || s.closed;
                let waiters = s.waiters > 0;
                drop(s);
                if more {
                    self.0.work.notify_one();
                }
                if waiters {
                    self.0.progress.notify_all();
                }
            }
        }
        let done = Done(self);
        let since = Instant::now();
        let mut results = Vec::with_capacity(batches.len());
        let checked = catch_unwind(AssertUnwindSafe(|| {
            let mut core = lock(&self.core);
            for b in &batches {
                results.push(core.check_batch(b, &|| self.aborted()));
            }
        }));
        {
            let mut s = lock(&self.state);
            if let Err(payload) = checked {
                for b in &batches {
                    s.record_batch(b.len(), Vec::new(), Ok(()));
                }
                s.closed = true;
                s.dead = Some(format!(
                    "the checker panicked: {}; the check is incomplete",
                    panic_message(payload.as_ref())
                ));
                drop(s);
                drop(done);
                return true;
            }
            s.busy += since.elapsed();
            for (b, (found, r)) in batches.iter().zip(results) {
                s.record_batch(b.len(), found, r);
            }
        }
        drop(done);
        let s = lock(&self.state);
        !s.checking && s.caught_up()
    }

    /// Waits, signals unseen, until every batch admitted is checked (here when nobody checks
    /// one, see [`Self::check_queued_here`]): for a closed queue, after which the thread
    /// checks nothing more (it may still write out the copy of the ops, which a finishing
    /// Checker has taken already).
    pub(crate) fn settle(&self) {
        while !self.look() {}
    }

    /// One look of a caller waiting for every batch admitted to be checked: checks them here
    /// when it may, else wakes the thread (it may be between looks at the queue) and waits for
    /// its progress at most [`SIGNAL_POLL`]. Returns whether they are all checked.
    fn look(&self) -> bool {
        if self.check_queued_here(false) {
            return true;
        }
        self.start_late();
        self.work.notify_one();
        let s = lock(&self.state);
        if s.caught_up() {
            return true;
        }
        self.wait_progress(s, Some(SIGNAL_POLL)).caught_up()
    }

    /// Closes the queue: the thread checks what is in it, then ends.
    pub(crate) fn close(&self) {
        lock(&self.state).closed = true;
        self.work.notify_all();
        self.progress.notify_all();
    }

    /// Waits until the thread has ended, at most `limit` (`None`: as long as it takes to check
    /// what is queued). Returns whether it has.
    pub(crate) fn wait_exit(&self, limit: Option<Duration>) -> bool {
        let until = limit.map(|l| Instant::now() + l);
        let mut s = lock(&self.state);
        loop {
            if s.exited {
                return true;
            }
            match until {
                None => s = self.wait_progress(s, None),
                Some(until) => {
                    let now = Instant::now();
                    if now >= until {
                        return false;
                    }
                    s = self.wait_progress(s, Some(until - now));
                }
            }
        }
    }

    /// Tells the thread to drop what is left and end.
    pub(crate) fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
        self.close();
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    /// The thread's loop: takes batches in order and checks them until the queue is closed
    /// and empty, or the Checker goes away.
    fn serve(&self) {
        let mut empty_polls = 0;
        loop {
            let (number, batch) = {
                let mut s = lock(&self.state);
                loop {
                    if self.aborted() {
                        return;
                    }
                    if !s.checking {
                        if let Some(b) = s.queue.pop_front() {
                            empty_polls = 0;
                            s.checking = true;
                            break (s.checked, b);
                        }
                        if s.closed {
                            return;
                        }
                    }
                    if empty_polls < POLLS_BEFORE_SLEEP {
                        // Batches are coming: look again soon, unwoken.
                        empty_polls += 1;
                        s = self
                            .work
                            .wait_timeout(s, POLL)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    } else {
                        s.idle = true;
                        s = self.work.wait(s).unwrap_or_else(|p| p.into_inner());
                        s.idle = false;
                    }
                }
            };
            self.pause();
            if self.panic_at == Some(number) {
                panic!("a panic of the checker's thread, asked for by a test (batch {number})");
            }
            let since = Instant::now();
            let (found, r) = lock(&self.core).check_batch(&batch, &|| self.aborted());
            let mut s = lock(&self.state);
            s.checking = false;
            s.busy += since.elapsed();
            s.record_batch(batch.len(), found, r);
            let waiters = s.waiters > 0;
            let dry = s.queue.is_empty();
            drop(s);
            if waiters {
                self.progress.notify_all();
            }
            if dry {
                // Nothing more to check for now: the copy of the ops goes to its file here,
                // not when the check finishes, on the caller's thread.
                lock(&self.core).flush_copy();
            }
        }
    }

    /// The test hook `delay`: sleeps before a batch, in slices, as long as not aborted.
    fn pause(&self) {
        let until = Instant::now() + self.delay;
        while !self.aborted() {
            let now = Instant::now();
            if now >= until {
                break;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(10)));
        }
    }
}

/// Marks the thread ended when it returns or unwinds, and wakes every waiter.
struct Exit<'a>(&'a Shared);

impl Drop for Exit<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        s.exited = true;
        s.queue.clear();
        s.bytes = 0;
        drop(s);
        self.0.progress.notify_all();
        self.0.work.notify_all();
    }
}

/// The checker's thread: serves the queue; a panic is caught and kept in [`State::dead`].
fn run(shared: &Shared) {
    let _exit = Exit(shared);
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| shared.serve())) {
        lock(&shared.state).dead = Some(format!(
            "the checker's thread panicked: {}; the check is incomplete",
            panic_message(payload.as_ref())
        ));
    }
}

/// A panic's message.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

/// Ends a Checker's thread's work when the Checker goes away: it drops what is left, and is
/// waited for at most [`DROP_WAIT`], else left behind (it holds no Python object, and goes on to
/// wait for the next check once done).
pub(crate) fn stop(shared: &Shared) {
    shared.abort();
    if shared.take_thread() {
        shared.wait_exit(Some(DROP_WAIT));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Arc<Shared> {
        let core = Core {
            run: Some(CheckRun::new(false, false)),
            lines: 0,
            name: "<test>".into(),
            out: OpsCopy::Nothing,
            write_error: None,
        };
        let options = Options {
            bound: 1 << 20,
            delay: Duration::ZERO,
            panic_at: None,
        };
        Shared::start(core, Some(options))
    }

    /// Whom `admit` wakes, for a thread started already (`spawned`), idle (asleep until woken)
    /// or not, checking a batch or not, and a batch handed over `now` or not.
    fn wakes_thread(idle: bool, checking: bool, now: bool) -> bool {
        let shared = shared();
        let mut s = lock(&shared.state);
        s.spawned = true; // no thread is started by this test
        s.idle = idle;
        s.checking = checking;
        let wake = shared.admit(&mut s, b"\n".to_vec(), now, false);
        assert!(!wake.spawn && !wake.waiters && !wake.check_here);
        wake.thread
    }

    #[test]
    fn a_native_callers_first_batch_starts_the_thread_only_handed_over_now() {
        // (`spawn` is only asked for here: no thread is started by this test.)
        for (now, second) in [(false, false), (false, true), (true, false)] {
            let shared = shared();
            let mut s = lock(&shared.state);
            let first = shared.admit(&mut s, b"\n".to_vec(), now, true);
            assert_eq!(first.spawn, now);
            let next = shared.admit(&mut s, b"\n".to_vec(), second, true);
            assert_eq!(
                next.spawn, !now,
                "the second batch starts it if the first did not"
            );
            assert!(s.spawned);
        }
        // A caller in Python starts it at the first.
        let shared = shared();
        let mut s = lock(&shared.state);
        assert!(shared.admit(&mut s, b"\n".to_vec(), false, false).spawn);
    }

    #[test]
    fn a_batch_handed_over_now_wakes_a_thread_between_looks() {
        assert!(wakes_thread(false, false, true));
    }

    #[test]
    fn a_batch_handed_over_otherwise_waits_for_the_next_look() {
        assert!(!wakes_thread(false, false, false));
    }

    #[test]
    fn a_thread_checking_a_batch_is_not_woken_it_takes_the_next_one_itself() {
        assert!(!wakes_thread(false, true, true));
    }

    #[test]
    fn a_sleeping_thread_is_woken_either_way() {
        assert!(wakes_thread(true, false, false));
        assert!(wakes_thread(true, false, true));
    }
}
