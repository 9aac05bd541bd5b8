"""streamsan: finds the synchronization bugs of multi-stream GPU programs.

Two streams touching the same bytes with no event between them, and a buffer freed to a caching
allocator while another stream still uses it: streamsan checks programs for both, from a trace
(`check_trace`), op by op (`Checker`), or as a PyTorch program runs (`streamsan.torch`).

    >>> import streamsan
    >>> c = streamsan.Checker(explain=False)
    >>> c.push({"op": "alloc", "buffer": "a", "bytes": 4096, "stream": "s1"})
    []
    >>> c.push({"op": "launch", "stream": "s1", "writes": ["a"]})
    []
    >>> c.push({"op": "launch", "stream": "s2", "reads": ["a"]})[0]["kind"]
    'data-race'
    >>> c.finish()
    <streamsan.Report 1 error, 0 warnings in 3 ops: data-race on a at op 2>
"""

from __future__ import annotations

import atexit

from ._streamsan import Checker, Report, TraceError, __version__, check_trace
from ._streamsan import _remove_spools
from ._syncs import describe as describe_syncs

# The temporary copies of the ops a process's checks keep for their reports go when it exits
# normally, also those of a check still running then or of a report still held (a report whose
# text is first asked for by an `atexit` handler registered before this one, which runs after it,
# explains nothing).
atexit.register(_remove_spools)

__all__ = [
    "Checker",
    "HazardError",
    "Report",
    "TraceError",
    "__version__",
    "check_trace",
    "describe_syncs",
]


class HazardError(AssertionError):
    """Raised when a checked program has hazards of severity error.

    Its message is the text report (`report.to_text()`): every hazard with its accesses, why
    it happened and how to fix it, after `header` when there is one (streamsan.torch names the
    rank of a distributed run there). `report` is the `Report`.
    """

    def __init__(self, report: Report, header: str | None = None) -> None:
        text = report.to_text()
        super().__init__(text if not header else f"{header}\n{text}")
        self.report = report
        self.header = header

    def __reduce__(self):  # pickling (pytest-xdist, multiprocessing) keeps the message
        return (AssertionError, (str(self),))
