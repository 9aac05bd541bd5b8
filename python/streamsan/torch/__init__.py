"""streamsan.torch: check a PyTorch program for stream synchronization bugs as it runs.

    import streamsan.torch

    with streamsan.torch.check():          # raises streamsan.HazardError on a hazard
        train_step()

    with streamsan.torch.check(raise_on_hazard=False, trace="run.jsonl") as run:
        train_step()
    print(run.report.to_text())

    streamsan.torch.record("run.jsonl")     # only write the trace (a context manager too)

    with streamsan.torch.check(syncs=True) as run:   # which synchronizations were needed
        train_step()
    print("\n".join(run.syncs))   # ".item() at train.py:88 synchronized the host 1,000 times; …"

    python -m streamsan.torch train.py ARGS…   # a whole script; exit status 1 on hazards
    pytest --streamsan                         # every test under check()
    pytest --streamsan-syncs                   # and which of its synchronizations were needed
    torchrun --nproc-per-node=4 -m streamsan.torch train.py   # one report per rank

What is recorded: every aten op's reads and writes as regions of their allocations, on the stream
current for it (the autograd engine's threads too); allocations and frees with their real
address, size and stream; record_stream; events, waits, queries and syncs; host reads of CUDA
tensors (`.item()`, `.cpu()`, `print`) as the copy plus the synchronization they are; pinned host
memory and `non_blocking` copies; collectives of torch.distributed; CUDA graphs (captures with
their pools, replays, `make_graphed_callables`: see streamsan.torch._graphs). See docs/pytorch.md
for what is not seen. `torch` is imported when a check starts, not before.

Under torchrun (RANK, WORLD_SIZE and LOCAL_RANK set, more than one process) each rank checks its
own streams and has its own report: `trace=` paths and report files get the rank (`{rank}` in the
path, or `.rankN` before the extension), and reports and `HazardError` name it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Union

from .. import Checker, HazardError, Report, TraceError
from . import _rank
from ._rank import Rank

__all__ = ["Rank", "Run", "check", "note_host_read", "note_host_write", "record"]

PathLike = Union[str, "os.PathLike[str]"]

# The recorder's class, imported by the first check (not with this package: nothing needs it
# before) and kept: an import inside `Run.__enter__` runs the import system's Python code at
# every check, which costs most once the program's own work has left the CPU's caches.
_Recorder: Any = None


_TRACE_NOTE = (
    "streamsan.torch: the trace recorded of this program is inconsistent here: a gap in what "
    "streamsan records, not a hazard of the program. The hazards found before it are in the "
    "check's `report`; please report this with the trace (streamsan.torch.check(trace=PATH) "
    "writes it)."
)


def _note_trace_error(error: BaseException) -> None:
    """A TraceError at a check's end says it is a gap of the recorder's (once; Python 3.11+)."""
    if hasattr(error, "add_note") and _TRACE_NOTE not in getattr(error, "__notes__", ()):
        error.add_note(_TRACE_NOTE)


class Run:
    """A check or recording in progress (a context manager); `report` is set when it ends.

    `raise_on_hazard`: raise `streamsan.HazardError` at exit when errors were found (not when the
    block itself raised). `trace`: also write the trace (format v1) there. `explain`: keep the
    ops (in `trace`, or a temporary file) to explain hazards (`why:`) and draw the report.
    `backend`: "auto" (the C++ recorder when it can be built, else Python), "native" or
    "python" (also set by STREAMSAN_TORCH_BACKEND). `check=False` only writes the trace.

    Under torchrun, `rank` is this process's `Rank` (else None) and `trace` is this rank's path
    (see `streamsan.torch._rank.path_for`), set when the check starts.

    Entering raises `RuntimeError` while another check or record runs in this process, and
    while the current stream is capturing a CUDA graph (begin the check before the capture: a
    capture begun inside a check is recorded, its replays checked).

    `threaded`: check on a thread of the checker's own, beside the program (the default; False,
    or STREAMSAN_CHECK_THREAD=0 when `threaded` is not given, checks each batch of ops on the
    thread that hands it over). The program waits for the checker only when it has fallen more
    than 64 MiB of ops behind; the report is the same. Bad input from the recorder is raised at
    exit either way (as the recorder's error); `hazards` (the hazards found so far, in the order
    found) then fills as the checker's thread catches up, and is complete after exit; `stats()`
    is the checker's state as far as it has checked.

    `syncs`: also run the synchronization analysis: when the check ends, `syncs` holds one
    sentence per call site that synchronized (redundant sites first: "wait_stream at
    train.py:52 made a stream wait 200 times; none was needed"), printed on standard error
    unless `print_syncs` is False, and the report has the verdicts (`report.syncs`,
    `report.syncs_by_site()`). A host read whose value the program uses (`.item()`, `.cpu()`)
    is recorded as a copy into host memory, the synchronization and the host's read: needed by
    construction. The analysis never fails a check.

    `phase_seconds`: how long entering and leaving the check took, by part, each once it is done
    (for measuring what a short check costs; see docs/performance.md): `enter_checker` (the
    rank, and the `Checker` made, or for `record()` the trace file opened), `enter_recorder`
    (the recorder made and given the checker's queue), `enter_start` (its hooks installed),
    `exit_recorder` (the recorder stopped: what it still held written and handed over), and
    when checking `exit_drain` (waiting for the checker to check every op) and `exit_report`
    (the report made, its hazards explained). Empty until the check is entered; a process
    forked inside the check keeps the parent's `enter_*` parts only.
    """

    def __init__(
        self,
        raise_on_hazard: bool = True,
        trace: Optional[PathLike] = None,
        explain: bool = True,
        backend: str = "auto",
        check: bool = True,
        syncs: bool = False,
        print_syncs: bool = True,
        threaded: Optional[bool] = None,
        _fake_device: bool = False,
        _profile: Optional[str] = None,
    ) -> None:
        if not check and trace is None:
            raise ValueError("record() needs a trace path")
        self.raise_on_hazard = raise_on_hazard
        self._trace_given = os.fspath(trace) if trace is not None else None
        self.trace = self._trace_given
        self.explain = explain
        self.backend_choice = backend
        self.checking = check
        self.analyse_syncs = syncs
        self.print_syncs = print_syncs
        if threaded is None:
            threaded = os.environ.get("STREAMSAN_CHECK_THREAD", "1") != "0"
        self.threaded = threaded
        self.syncs: list[str] = []
        # For streamsan's own tests: CPU tensors stand for device memory.
        self.fake_device = _fake_device or os.environ.get("STREAMSAN_TORCH_FAKE_DEVICE") == "1"
        # Profiling the C++ recorder: "1" (its stages timed) or "observe"; None: STREAMSAN_PROFILE.
        self.profile = _profile
        self.report: Optional[Report] = None
        self.rank: Optional[Rank] = None
        self.hazards: list[dict[str, Any]] = []
        self._checker: Optional[Checker] = None
        self._file = None
        self._recorder = None
        self._pid: Optional[int] = None  # the process that entered the check
        self.phase_seconds: dict[str, float] = {}

    @property
    def backend(self) -> Optional[str]:
        """The recorder in use: "native" or "python"."""
        return self._recorder.backend.name if self._recorder is not None else None

    def _sink(self, data: bytes) -> None:
        if os.getpid() != self._pid:
            return  # a process forked inside the check: its ops are not the check's (see __exit__)
        if self._checker is not None:
            self.hazards.extend(self._checker.push_lines(data))
        else:
            view = memoryview(data)
            while view:  # an unbuffered file may take part of it
                view = view[self._file.write(view) :]

    @property
    def header(self) -> Optional[str]:
        """What the report is of, for a rank of a distributed run (None for a single process)."""
        if self.rank is None:
            return None
        return f"streamsan.torch: {self.rank}, pid {os.getpid()}"

    def stats(self) -> dict[str, Any]:
        """What the check holds now: the checker's counters (`history`: access entries kept,
        `generations`, `graveyard`, `participants`, `ops`, `hazards`; on the checker's thread,
        as far as it has checked, with `queue_bytes`, the ops handed to it and not checked yet,
        and `queue_peak_bytes`), and the recorder's (`recorder_live_device_buffers`,
        `recorder_live_pinned_buffers`, …). For memory measurements of long runs: ops still in
        the recorder's batch are not counted yet."""
        out: dict[str, Any] = {}
        if self._checker is not None and os.getpid() == self._pid and not self._checker.finished:
            out.update(self._checker.stats())
        if self._recorder is not None:
            out.update({f"recorder_{k}": v for k, v in self._recorder.backend.counters.items()})
        return out

    def __enter__(self) -> "Run":
        global _Recorder
        if _Recorder is None:
            from ._recorder import Recorder as _Recorder

        t0 = time.perf_counter()
        self.phase_seconds = {}
        self._pid = os.getpid()
        self.rank = _rank.current()
        if self._trace_given is not None:
            self.trace = _rank.path_for(self._trace_given, self.rank)
        if self.checking:
            name = self.trace or (
                "<streamsan.torch>" if self.rank is None else f"<streamsan.torch rank {self.rank.rank}>"
            )
            self._checker = Checker(
                trace=self.trace,
                explain=self.explain,
                name=name,
                syncs=self.analyse_syncs,
                threaded=self.threaded,
            )
        else:
            # Unbuffered: a process forked inside the check finds nothing of the parent's in a
            # buffer of its own copy of the file, to write a second time when the copy goes.
            self._file = open(self.trace, "wb", buffering=0)
        t1 = time.perf_counter()
        try:
            self._recorder = _Recorder(
                self._sink, backend=self.backend_choice, fake_device=self.fake_device, profile=self.profile
            )
            if self._checker is not None and hasattr(self._checker, "_raw_sink"):
                # The C++ recorder hands its batches straight to the checker's queue.
                self._recorder.raw_sink = self._checker._raw_sink()
            t2 = time.perf_counter()
            self._recorder.start()
            self.phase_seconds = {"enter_checker": t1 - t0, "enter_recorder": t2 - t1,
                                  "enter_start": time.perf_counter() - t2}
        except BaseException:
            if self._recorder is not None:
                self._recorder.abandon()  # the next check may run
            if self._file is not None:
                self._file.close()
            raise
        return self

    def _leave_forked(self) -> None:
        """Leaves the check in a process forked inside it: the check, its checker and its report
        are the parent's. The recorder stops here (it recorded nothing since the fork), the
        checker and the trace file are not touched, `report` stays None, and a warning says so."""
        import warnings

        self._recorder.error = None  # the parent's, if any: raised there
        try:
            self._recorder.stop()
        finally:
            self._recorder.detach()
        warnings.warn(
            f"streamsan.torch: process {os.getpid()} was forked inside a check begun by process "
            f"{self._pid}: its ops after the fork were not checked (the check and its report are "
            "the parent's)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _end_check(self) -> Optional[BaseException]:
        """Waits for the checker to check every op, takes the hazards not returned yet, and
        makes the report. Returns the first error of bad input not raised yet (a threaded
        checker raises it after the batch that had it), to be raised as the recorder's."""
        error: Optional[BaseException] = None
        t0 = time.perf_counter()
        while True:
            try:
                self.hazards.extend(self._checker.drain())
                break
            except TraceError as e:  # one per call, in order; the hazards stay for the next
                if error is None:
                    error = e
        t1 = time.perf_counter()
        self.report = self._checker.finish()
        self.phase_seconds["exit_drain"] = t1 - t0
        self.phase_seconds["exit_report"] = time.perf_counter() - t1
        return error

    def __exit__(self, exc_type, exc, tb) -> None:
        if os.getpid() != self._pid:
            self._leave_forked()
            return
        error: Optional[BaseException] = None
        t0 = time.perf_counter()
        try:
            try:
                self._recorder.stop()  # (a checker fed on this thread may raise here)
            finally:
                self.phase_seconds["exit_recorder"] = time.perf_counter() - t0
                try:
                    if self._file is not None:
                        self._file.close()
                    if self._checker is not None:
                        error = self._end_check()
                finally:
                    self._recorder.detach()
        except TraceError as e:
            _note_trace_error(e)
            raise
        if error is not None:
            if isinstance(error, TraceError):
                _note_trace_error(error)
            raise error
        if self.report is not None and self.analyse_syncs:
            from .._syncs import describe

            self.syncs = describe(self.report)
            if self.print_syncs and self.syncs:
                import sys

                head = "streamsan.torch: synchronizations"
                if self.header:
                    head = f"{self.header}: synchronizations"
                print("\n  ".join([head] + self.syncs), file=sys.stderr)
        if (
            exc_type is None
            and self.raise_on_hazard
            and self.report is not None
            and self.report.errors
        ):
            raise HazardError(self.report, header=self.header)


def check(
    raise_on_hazard: bool = True,
    trace: Optional[PathLike] = None,
    explain: bool = True,
    backend: str = "auto",
    syncs: bool = False,
    print_syncs: bool = True,
    threaded: Optional[bool] = None,
) -> Run:
    """Checks the program inside the `with` block as it runs; see `Run`."""
    return Run(
        raise_on_hazard=raise_on_hazard,
        trace=trace,
        explain=explain,
        backend=backend,
        syncs=syncs,
        print_syncs=print_syncs,
        threaded=threaded,
    )


def record(path: PathLike, backend: str = "auto") -> Run:
    """Only writes the trace of the `with` block to `path`, for `streamsan check` later."""
    return Run(raise_on_hazard=False, trace=path, check=False, backend=backend)


def note_host_read(tensor) -> bool:
    """Declares that the host reads `tensor`'s pinned memory (e.g. through a numpy view).

    Returns whether it was recorded (a check is on, and the memory is pinned memory it knows).
    """
    from ._recorder import note_host_access

    return note_host_access(tensor, False)


def note_host_write(tensor) -> bool:
    """Declares that the host writes `tensor`'s pinned memory (e.g. through a numpy view)."""
    from ._recorder import note_host_access

    return note_host_access(tensor, True)
