"""python -m streamsan.torch [options] script.py [args…]: runs a script under streamsan.torch.check
(`--syncs`: with the synchronization analysis, as `check(syncs=True)`).

Prints the report to standard error and exits 1 when the script had hazards (2 on bad usage), or
with the script's own status when it exited with one; like `python -m cProfile`. A script that
raises still gets its report (the ops it ran before), then its traceback.

Under torchrun (`torchrun --nproc-per-node=N -m streamsan.torch script.py`) every rank checks
itself: `--trace` and `-o` paths get the rank (`{rank}` in the path, or `.rankN` before the
extension), and a report written to standard error starts with a line naming its rank and is
written at once, not interleaved with the other ranks' lines. A rank that is done waits for the
other ranks of its node before it exits: torchrun stops every worker of a node as soon as one
exits with a failure (and 1, "hazards found", is one), which would cut a slower rank's check and
report short. A rank whose script raised does not wait: it writes its report and leaves with its
traceback at once, as it would unchecked.
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import sys
import tempfile
import time


def _wait_for_local_ranks(timeout: float = 600.0) -> None:
    """Under torchrun with more than one worker on this node: marks this rank done and waits (at
    most `timeout` seconds) until every local rank is, so that no rank's failing exit makes the
    launcher stop the others before they have written their reports. Markers are files in a
    directory of the system's temporary directory named after the run (TORCHELASTIC_RUN_ID and
    its restart count)."""
    from . import _rank

    env = os.environ
    run_id = env.get("TORCHELASTIC_RUN_ID")
    local_world, local_rank = _rank._int(env, "LOCAL_WORLD_SIZE"), _rank._int(env, "LOCAL_RANK")
    if not run_id or local_world is None or local_rank is None:
        return
    if local_world <= 1 or not 0 <= local_rank < local_world:
        return
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{run_id}-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    d = os.path.join(tempfile.gettempdir(), f"streamsan-ranks-{uid}-{tag}")
    try:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{local_rank}.done"), "w"):
            pass
    except OSError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(d, f"{r}.done")) for r in range(local_world)):
            return
        time.sleep(0.05)


def _write_at_once(text: str) -> None:
    """Writes to standard error in one go: the ranks of a distributed run share the terminal."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor
        sys.stderr.write(text)
        return
    sys.stderr.flush()
    data = text.encode(sys.stderr.encoding or "utf-8", errors="replace")
    while data:
        data = data[os.write(fd, data):]


EPILOG = """examples:
  python -m streamsan.torch train.py --epochs 1          # the report on standard error
  python -m streamsan.torch --syncs train.py             # and which synchronizations were needed
  python -m streamsan.torch --format html -o report.html train.py
  python -m streamsan.torch --trace run.jsonl -m mypkg.train   # keep the trace: `streamsan check run.jsonl`
  torchrun --nproc-per-node=2 -m streamsan.torch train.py      # one check and one report per rank

exit status: 0 when the script ran clean, 1 when it had hazards, 2 on bad usage; the script's own
status when it exited with one (sys.exit(n), an uncaught exception).

Everything the process's threads do on the GPU inside the script is checked: kernels and copies
on their streams, allocations and frees of the caching allocator, events, waits and host
synchronizations, CUDA graph captures and replays, Triton kernels (torch.compile's and your
own). docs/pytorch.md has the details."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m streamsan.torch",
        description="Run a PyTorch script (or, with -m, a module) under streamsan.torch.check: its streams,\n"
        "events and allocations are checked as it runs, and the report is written when it ends (when it\n"
        "fails too: the report first, then its traceback).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trace", help="also write the trace (format v1) to this file (per rank under torchrun)")
    p.add_argument("--backend", default="auto", choices=["auto", "native", "python"],
                   help="the recorder: the C++ one (native: built on first use, needs a C++ compiler), the "
                   "Python one (a TorchDispatchMode, slower), or auto (native where it builds; default)")
    p.add_argument("--syncs", action="store_true",
                   help="also say which synchronizations were needed (an event wait, stream wait or host "
                   "sync that orders no conflicting accesses is not), by source line, on standard error")
    p.add_argument("--format", default="text", choices=["text", "json", "sarif", "html"],
                   help="report format (default text)")
    p.add_argument("-o", "--output", help="write the report here instead of standard error (per rank under torchrun)")
    p.add_argument("-m", dest="module", action="store_true", help="run a module, as python -m")
    p.add_argument("script", help="the script to run (with -m: the module)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    a = p.parse_args(argv)

    from . import check

    sys.argv = [a.script, *a.args]
    # The synchronizations' sentences go with the text report, in the same write (print_syncs
    # off: nothing else on standard error before a JSON report); the other formats hold them.
    run = check(raise_on_hazard=False, trace=a.trace, backend=a.backend, syncs=a.syncs, print_syncs=False)
    status = 0
    failure: BaseException | None = None
    try:
        with run:
            try:
                if a.module:
                    runpy.run_module(a.script, run_name="__main__", alter_sys=True)
                else:
                    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
                    runpy.run_path(a.script, run_name="__main__")
            except SystemExit as e:
                status = _exit_status(e)
            except BaseException as e:  # noqa: BLE001 - the script failed (or was interrupted): what
                failure = e  # it ran is still reported, then its exception goes on (its traceback)
        if run.report is None:  # a process forked inside the check: the report is the parent's
            if failure is not None:
                raise failure
            return status
        _write_report(a, run)
    except BaseException as e:
        # The check or its report failed too: the script's exception is shown with it.
        if failure is not None and e is not failure and e.__context__ is None:
            e.__context__ = failure
        raise
    if failure is not None:
        # A rank that failed leaves at once (torchrun stops the others), with its traceback.
        raise failure
    _wait_for_local_ranks()
    if status:
        return status
    return 1 if run.report.errors else 0


def _exit_status(e: SystemExit) -> int:
    """The status of the script's `sys.exit(code)`; a code that is not a number is printed to
    standard error and exits 1, as Python does."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


def _write_report(a: argparse.Namespace, run) -> None:
    """The report in the format asked for, to the file asked for or standard error (in one write:
    the ranks of a distributed run share it)."""
    from . import _rank

    report = run.report
    text = {
        "text": lambda: report.to_text(color=a.output is None and sys.stderr.isatty()),
        "json": report.to_json,
        "sarif": lambda: report.to_sarif(trace=run.trace),
        "html": report.to_html,
    }[a.format]()
    if a.format == "text" and run.syncs:
        text = "\n  ".join(["synchronizations, by site:"] + run.syncs) + "\n" + text
    if a.output:
        with open(_rank.path_for(a.output, run.rank), "w") as f:
            f.write(text)
    else:
        if run.header is not None and a.format == "text":
            text = f"{run.header}\n{text}"
        _write_at_once(text)


if __name__ == "__main__":
    sys.exit(main())
