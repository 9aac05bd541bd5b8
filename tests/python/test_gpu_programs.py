"""The program suite on a GPU (the CUDA graph programs included): every buggy variant is
reported at its `# RACE` line and every fixed one is clean, by both recorders
(STREAMSAN_TEST_BACKEND=native or python: one of them); widened, the buggy variants corrupt data
and the fixed ones never do."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu

BACKENDS = [b for b in os.environ.get("STREAMSAN_TEST_BACKEND", "native,python").split(",") if b]


def _programs():
    import programs

    return programs


def _cases():
    import importlib.util
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if importlib.util.find_spec("torch") is None:
        return ["(torch missing)"]
    import programs

    bugs, clean = programs.program_sets("all")
    return list(bugs) + list(clean)


def _fn(programs, name):
    bugs, clean = programs.program_sets("all")
    return bugs.get(name) or clean[name]


def _clean(programs, name) -> bool:
    return name in programs.program_sets("all")[1]


@pytest.mark.parametrize("name", _cases())
@pytest.mark.parametrize("backend", BACKENDS)
def test_verdicts(gpu, name, backend):
    import streamsan.torch

    programs = _programs()
    fn = _fn(programs, name)
    lines = programs.race_lines(fn)
    with streamsan.torch.check(raise_on_hazard=False, backend=backend) as fixed:
        assert fn(True, False)
    assert fixed.backend == backend
    assert fixed.report.errors == 0, fixed.report.to_text()
    with streamsan.torch.check(raise_on_hazard=False, backend=backend) as buggy:
        fn(False, False)
    if _clean(programs, name):
        assert buggy.report.errors == 0, buggy.report.to_text()
        return
    assert buggy.report.errors > 0
    file = os.path.basename(programs.__file__)
    reported = {
        int(h["access"]["site"].rsplit(":", 1)[1])
        for h in buggy.report.hazards
        if h.get("access") and (h["access"].get("site") or "").rsplit(":", 1)[0].endswith(file)
    }
    assert reported & lines, (sorted(reported), sorted(lines), buggy.report.to_text())


@pytest.mark.parametrize("name", _cases())
def test_widened_runs_corrupt_only_the_buggy_variant(gpu, name):
    programs = _programs()
    fn = _fn(programs, name)
    fixed_bad = sum(not fn(True, True) for _ in range(3))
    assert fixed_bad == 0
    buggy_bad = sum(not fn(False, True) for _ in range(3))
    if _clean(programs, name):
        assert buggy_bad == 0
    else:
        assert buggy_bad > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_raises_hazard_error(gpu, backend):
    import streamsan
    import streamsan.torch

    programs = _programs()
    with pytest.raises(streamsan.HazardError) as e:
        with streamsan.torch.check(backend=backend):
            programs.side_stream_without_wait(False, False)
    assert "data-race" in str(e.value) and "programs.py" in str(e.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_trace_file_rechecks_the_same(gpu, tmp_path, backend):
    import streamsan
    import streamsan.torch

    programs = _programs()
    path = tmp_path / "run.jsonl"
    with streamsan.torch.check(raise_on_hazard=False, trace=path, backend=backend) as run:
        programs.free_without_record_stream(False, False)
    assert run.backend == backend
    again = streamsan.check_trace(path)
    assert again.hazards == run.report.hazards and again.errors > 0
    path2 = tmp_path / "rec.jsonl"
    with streamsan.torch.record(path2, backend=backend):
        programs.free_without_record_stream(False, False)
    assert streamsan.check_trace(path2).errors > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_events_queries_and_syncs_order_work(gpu, backend):
    import streamsan.torch

    torch = gpu
    with streamsan.torch.check(backend=backend) as run:
        side = torch.cuda.Stream()
        x = torch.ones(1 << 16, device="cuda")
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        side.wait_event(ev)
        with torch.cuda.stream(side):
            y = x * 2
            done = torch.cuda.Event(enable_timing=True)
            done.record(side)
        while not done.query():
            pass
        ev.elapsed_time(done)
        _ = y.sum().item()
        del y
        torch.cuda.synchronize()
    assert run.report.errors == 0
    assert run.report.ops > 8


def _generic_poll(torch, poll: str):
    """A side stream writes `y = 2 x` after a long sleep, with `torch.Stream` and `torch.Event`
    (the device-generic API); the host waits for it by `poll` (`event`: `Event.query()` until
    true; `stream`: `Stream.query()`; `elapsed`: `Event.elapsed_time`, retried until both events
    are complete; `none`: not at all), then the default stream reads `y`. Returns what it read
    (`y + 1`) and what it should have."""
    x = torch.randn(1 << 20, device="cuda")
    side = torch.Stream(device="cuda")
    side.wait_stream(torch.accelerator.current_stream())
    start = torch.Event(device="cuda", enable_timing=True)
    done = torch.Event(device="cuda", enable_timing=True)
    with side:
        start.record(side)
        torch.cuda._sleep(100_000_000)
        y = x * 2
        done.record(side)
    if poll == "event":
        while not done.query():
            pass
    elif poll == "stream":
        while not side.query():
            pass
    elif poll == "elapsed":
        while True:
            try:
                start.elapsed_time(done)
                break
            except RuntimeError:  # "Both events must be completed …": not yet
                pass
    z = y + 1  # GENERIC-READ
    torch.cuda.synchronize()
    return z, x * 2 + 1


@pytest.mark.parametrize("poll", ["event", "stream", "elapsed", "none"])
def test_a_poll_of_a_generic_event_or_stream_orders_what_follows(gpu, poll):
    """`torch.Event.query()`, `torch.Stream.query()` and `torch.Event.elapsed_time` that found the
    side stream's work complete order the default stream's read after it under the C++ recorder
    (c10's GPU trace reports no query: it sees them through c10's CUDA guard); without a poll the
    read races the write, reported at its line."""
    import streamsan.torch

    from conftest import marked_line

    torch = gpu
    with streamsan.torch.check(raise_on_hazard=False, backend="native") as run:
        got, want = _generic_poll(torch, poll)
    if poll == "none":
        assert run.report.errors > 0
        lines = {h["access"]["site"] for h in run.report.hazards if h["kind"] == "data-race"}
        line = marked_line(__file__, "GENERIC-READ")
        assert any(site.endswith(f":{line}") for site in lines), run.report.to_text()
    else:
        assert run.report.errors == 0, run.report.to_text()
        assert torch.equal(got, want)


# The program suite's verdicts under the C++ recorder, in a process of its own (the allocator's
# configuration is read when CUDA starts): one line of JSON per program variant.
_VERDICTS_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
import programs
import streamsan.torch

bugs, clean = programs.program_sets("all")
for name, fn in {**bugs, **clean}.items():
    for fixed in (True, False):
        with streamsan.torch.check(raise_on_hazard=False, backend="native") as run:
            ok = fn(fixed, False)
        sites = sorted({int(h["access"]["site"].rsplit(":", 1)[1]) for h in run.report.hazards
                        if h.get("access") and (h["access"].get("site") or "").rsplit(":", 1)[0].endswith("programs.py")})
        print(json.dumps({"name": name, "fixed": fixed, "ok": ok is not False, "errors": run.report.errors,
                          "sites": sites, "text": run.report.to_text() if run.report.errors else ""}), flush=True)
"""


def test_verdicts_with_expandable_segments(gpu, tmp_path):
    """With the caching allocator's expandable segments (`PYTORCH_CUDA_ALLOC_CONF=
    expandable_segments:True`, which PyTorch's out-of-memory message suggests and many training
    scripts set: each stream's blocks are carved from a growing mapping of its own), the C++
    recorder's verdicts on the program suite are the same: every fixed variant and clean program
    clean, every buggy variant reported at one of its `# RACE` lines."""
    import subprocess
    import sys

    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", _VERDICTS_SCRIPT], cwd=here, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    programs = _programs()
    rows = [__import__("json").loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 * len(_cases()), done.stdout[-2000:]
    for r in rows:
        clean = _clean(programs, r["name"])
        assert r["ok"] or not r["fixed"], r["name"]  # a fixed variant computes the right result
        if r["fixed"] or clean:
            assert r["errors"] == 0, (r["name"], r["fixed"], r["text"])
        else:
            lines = programs.race_lines(_fn(programs, r["name"]))
            assert r["errors"] > 0 and set(r["sites"]) & lines, (r["name"], r["sites"], sorted(lines), r["text"])
