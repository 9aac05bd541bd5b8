"""The real-code suite (tests/python/realcode.py) on a GPU, by both recorders
(STREAMSAN_TEST_BACKEND=native or python: one of them): every clean program checks clean and
computes the right result; every buggy program is reported at one of its `# RACE` lines and its
fixed variant checks clean. A program whose library is missing is skipped. The compiled suite
(tests/python/realcode_compiled.py: torch.compile, CUDA graph trees, user Triton kernels) the
same, in `test_compiled_verdicts` (the Python recorder runs compiled code eagerly: its verdict is
of the eager program), and the extra suite (tests/python/realcode_extra.py: more library code
paths, every program clean) in `test_extra_verdicts`.

`STREAMSAN_REALCODE_ONLY=NAME[,NAME…]` (exact names or substrings) runs only those programs. The
widened runs, CSAN and the cost are `realcode_report.py`'s (run by `gpu_realcode.sh`, which covers
these verdicts too: `gpu_all.sh` leaves this file out of its pytest run, too long for its limit)."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu

BACKENDS = [b for b in os.environ.get("STREAMSAN_TEST_BACKEND", "native,python").split(",") if b]


def _realcode():
    import realcode

    return realcode


def _cases(suite: str = "realcode"):
    import importlib.util
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if importlib.util.find_spec("torch") is None:
        return ["(torch missing)"]
    import realcode

    only = [n.strip() for n in os.environ.get("STREAMSAN_REALCODE_ONLY", "").split(",") if n.strip()]
    try:
        return [name for name, _, _ in realcode.programs(only or None, suite=suite)]
    except ValueError:  # STREAMSAN_REALCODE_ONLY names none of this suite's programs
        return []


def _program(realcode, name):
    if name in realcode.BUGS:
        return realcode.BUGS[name], False
    return realcode.CLEAN[name], True


def _suite_program(suite, name):
    bugs, clean = _realcode().program_sets(suite)
    if name in bugs:
        return bugs[name], False
    return clean[name], True


def _run(fn, fixed: bool, backend: str):
    """(the check, the program's result) of one run under streamsan.torch.check."""
    import streamsan.torch

    with streamsan.torch.check(raise_on_hazard=False, backend=backend) as run:
        try:
            got = fn(fixed, False)
        except RuntimeError as e:
            if str(e).startswith("needs "):
                pytest.skip(str(e))
            raise
    return run, _realcode().judged(got)  # a `Later` runs its reference after the check


def _reported_lines(realcode, run, path=None) -> set[int]:
    """The lines of `path` (realcode.py by default) the hazards' accesses were reported at."""
    file = os.path.basename(path or realcode.__file__)
    out = set()
    for h in run.report.hazards:
        site = (h.get("access") or {}).get("site") or ""
        path, _, line = site.rpartition(":")
        if path.endswith(file) and line.isdigit():
            out.add(int(line))
    return out


@pytest.mark.parametrize("name", _cases())
@pytest.mark.parametrize("backend", BACKENDS)
def test_realcode_verdicts(gpu, name, backend):
    realcode = _realcode()
    fn, clean = _program(realcode, name)
    run, ok = _run(fn, True, backend)
    assert run.backend == backend
    assert run.report.errors == 0, run.report.to_text()
    assert ok, f"{name}: wrong result under the check (fixed or clean variant)"
    if clean:
        return
    buggy, _ = _run(fn, False, backend)
    lines = realcode.race_lines(fn)
    assert buggy.report.errors > 0, f"{name}: the planted bug was not reported"
    reported = _reported_lines(realcode, buggy)
    assert reported & lines, (sorted(reported), sorted(lines), buggy.report.to_text())


@pytest.mark.parametrize("name", _cases("compiled"))
@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_verdicts(gpu, name, backend):
    """The compiled suite as test_realcode_verdicts, the buggy variant first, as realcode_report
    runs it: the first call of a compiled function in the process compiles it, and for
    mode="reduce-overhead" warms cudagraph trees up, inside that variant's check."""
    import inspect

    realcode = _realcode()
    fn, clean = _suite_program("compiled", name)
    if not clean:
        buggy, _ = _run(fn, False, backend)
        lines = realcode.race_lines(fn)
        assert buggy.report.errors > 0, f"{name}: the planted bug was not reported"
        reported = _reported_lines(realcode, buggy, inspect.getsourcefile(fn))
        assert reported & lines, (sorted(reported), sorted(lines), buggy.report.to_text())
    run, ok = _run(fn, True, backend)
    assert run.backend == backend
    assert run.report.errors == 0, run.report.to_text()
    assert ok, f"{name}: wrong result under the check (fixed or clean variant)"


@pytest.mark.parametrize("name", _cases("extra"))
@pytest.mark.parametrize("backend", BACKENDS)
def test_extra_verdicts(gpu, name, backend):
    """The extra suite: every program checks clean and computes the right result."""
    fn, clean = _suite_program("extra", name)
    assert clean, f"{name}: the extra suite has clean programs only"
    run, ok = _run(fn, True, backend)
    assert run.backend == backend
    assert run.report.errors == 0, run.report.to_text()
    assert ok, f"{name}: wrong result under the check"
