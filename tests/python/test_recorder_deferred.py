"""The C++ recorder's deferred writing: while a check hands its batches to the checker's raw
sink, the program's threads queue records of ops, launches, allocations, frees and host ops, and
the recorder's own thread writes them, in order (docs/architecture.md). On the CPU (fake device:
CPU tensors stand for device memory; `STREAMSAN_DEFER=all` defers its ops too)."""

import os
import re
import signal
import time

import pytest


def _ext():
    from conftest import native_ext_or_skip

    ext = native_ext_or_skip()
    if not hasattr(ext, "set_defer") or not ext.native_syncs():
        pytest.skip("this recorder does not defer, or records syncs through Python")
    return ext


def _wait_ok(pids, what: str, seconds: float = 30) -> None:
    """Waits for the forked children `pids` to exit with status 0, together at most `seconds`;
    one that has not exited by then is killed and the test fails with `what` (never a hang)."""
    deadline = time.monotonic() + seconds
    for pid in pids:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(what)
            time.sleep(0.01)


def _run(**kw):
    import streamsan.torch

    return streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True, **kw)


def _program(ext, torch):
    """Two streams ordered by events, allocations and frees of the allocator, launches outside
    the dispatcher, one race; every tensor lives through the check."""
    ext.set_fake_stream(0xA)
    x = torch.ones(64)
    y = torch.ones(64)
    z = torch.zeros(32)
    for i in range(600):
        ext.set_fake_stream(0xA)
        x.add_(y)
        ext.fake_trace(True, 0x100000 + 0x1000 * (i % 5), 512, 0xA)
        ext.record_kernel("triton_poi_fused_add_0", 0xA, 0, [(x, True, False), (z, False, True)])
        ext.fake_gpu_trace("record", 0xE1, 0xA)
        ext.fake_gpu_trace("wait", 0xE1, 0xB)
        ext.set_fake_stream(0xB)
        y.mul_(x[:64])
        ext.fake_trace(False, 0x100000 + 0x1000 * (i % 5), 512, 0xA)
        if i == 400:
            ext.set_fake_stream(0xA)
            z.add_(1.0)  # a race: 0xB's next use of z waited only for what 0xA did before
        ext.set_fake_stream(0xB)
        z.mul_(y[:32])
        ext.fake_gpu_trace("record", 0xE2, 0xB)
        ext.fake_gpu_trace("wait", 0xE2, 0xA)
    return x, y, z


def _check(tmp_path, monkeypatch, defer, name):
    ext = _ext()
    import torch
    monkeypatch.setenv("STREAMSAN_DEFER", defer)
    monkeypatch.setenv("STREAMSAN_PROFILE", "1")
    path = tmp_path / f"{name}.jsonl"
    run = _run(trace=path, threaded=True)
    with run:
        kept = _program(ext, torch)
        during = run.stats()
    after = ext.counters()
    del kept
    text = re.sub(r'"addr":\d+', '"addr":0', path.read_text())
    return run, text, during, after


def test_deferred_records_write_the_trace_written_at_once(tmp_path, monkeypatch):
    """Every record queued and written by the recorder's thread (ops of the fake device too)
    makes the trace and the report that writing each op at once makes."""
    at_once, text0, during0, _ = _check(tmp_path, monkeypatch, "0", "now")
    deferred, text1, during1, after = _check(tmp_path, monkeypatch, "all", "later")
    assert during0["recorder_deferring"] is False and during0["recorder_profile_deferred"] == 0
    assert during1["recorder_deferring"] is True
    # Ops, launches, allocations, frees and host ops: more than 5 records a step were queued,
    # and the recorder's thread (or the end of the check) wrote every one.
    prof = deferred.stats()
    assert prof["recorder_profile_deferred"] >= 600 * 9, prof
    assert after["deferring"] is False  # the check's end writes at once again
    assert text1 == text0
    assert deferred.report.to_json() == at_once.report.to_json()
    assert deferred.report.errors >= 1 and {h["kind"] for h in deferred.report.hazards} == {"data-race"}
    assert text1.count('"name":"triton_poi_fused_add_0"') == 600
    assert text1.count('"op":"free"') >= 600


def test_the_default_defers_host_ops_and_the_allocator_and_keeps_the_trace(tmp_path, monkeypatch):
    """By default the fake device's ops are written at once (their CPU storages may go while
    queued) and everything else is queued: the trace is the one written at once."""
    _, text0, _, _ = _check(tmp_path, monkeypatch, "0", "now")
    run, text1, during, _ = _check(tmp_path, monkeypatch, "1", "default")
    assert during["recorder_deferring"] is True
    assert run.stats()["recorder_profile_deferred"] >= 600 * 4
    assert text1 == text0


def test_a_child_forked_during_a_deferred_check_does_not_hang(monkeypatch):
    """The recorder's locks are taken around fork (its thread may hold them): a child forked
    while records are being written runs torch ops and exits."""
    ext = _ext()
    import torch
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    monkeypatch.setenv("STREAMSAN_DEFER", "all")
    run = _run(threaded=True)
    children = []
    with run:
        ext.set_fake_stream(0xA)
        x = torch.ones(16)
        for _ in range(8):
            for _ in range(200):
                x.add_(x)
                ext.fake_trace(True, 0x200000, 256, 0xA)
                ext.fake_trace(False, 0x200000, 256, 0xA)
            pid = os.fork()
            if pid == 0:  # the child: a few ops, then out without Python's exit handlers
                try:
                    y = torch.ones(4)
                    y.add_(y)
                    ext.counters()
                finally:
                    os._exit(0)
            children.append(pid)
    _wait_ok(children, "a child forked during the check hung")


def test_a_full_queue_is_written_by_the_program_and_the_trace_is_the_same(tmp_path, monkeypatch):
    """With the recorder's thread writing nothing (a benchmark's switch), the queue fills and the
    program's thread writes it at each 4,096 records: the queue never holds more (memory stays
    bounded), and the trace is the one written at once."""
    ext = _ext()
    import torch
    _, text0, _, _ = _check(tmp_path, monkeypatch, "0", "now")
    ext.bench_ablate(32)  # kResolverPaused
    try:
        run, text1, during, after = _check(tmp_path, monkeypatch, "all", "paused")
    finally:
        ext.bench_ablate(0)
    assert during["recorder_deferring"] is True
    prof = run.stats()
    assert prof["recorder_profile_deferred"] >= 600 * 9
    # Every 4,096 records the program's thread caught up; what was left was written at the end.
    assert after["queue_caught_up"] >= prof["recorder_profile_deferred"] // 4096 >= 1, (after, prof)
    assert text1 == text0
    assert run.report.errors >= 1


def test_what_is_recorded_before_the_program_waits_is_checked_while_it_waits(monkeypatch):
    """Ops fewer than a batch, then the program waits (as for the GPU): the recorder's thread
    hands the part batch to the checker, whose thread checks it during the wait, not at the
    check's end."""
    ext = _ext()
    import torch
    monkeypatch.setenv("STREAMSAN_DEFER", "all")
    run = _run(threaded=True)
    with run:
        ext.set_fake_stream(0xA)
        x = torch.ones(16)
        for _ in range(20):  # 20 lines, far below a batch (16 KiB)
            x.add_(x)
        # Waits until the count is the same 50 ms apart (at most 10 s).
        deadline = time.monotonic() + 10
        during, last = -1, run._checker.ops
        while (during != last or during == 0) and time.monotonic() < deadline:
            time.sleep(0.05)
            during, last = last, run._checker.ops
    assert during >= 20 and during == run.report.ops, (during, run.report.ops)
    assert run.report.errors == 0


@pytest.mark.parametrize("pause", [0.0, 0.4], ids=["right-after-a-check", "recorder-thread-asleep"])
def test_a_part_batch_goes_to_the_checker_while_ops_keep_coming(monkeypatch, pause):
    """Ops issued more slowly than a batch fills, never a whole pass of the recorder's thread
    apart and with no host synchronization (a decode loop): the part batch goes to the checker
    once it has waited a millisecond, and the checker checks it while the program still runs,
    not at the check's end. The check begins right after another (the recorder's thread still
    looking every half millisecond: it is not woken) or after a pause longer than its 0.2 s of
    looking (it sleeps, and is woken)."""
    ext = _ext()
    import torch

    def spin(seconds):  # busy: the program never pauses for a whole pass (half a millisecond)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    monkeypatch.setenv("STREAMSAN_DEFER", "all")
    with _run(threaded=True):
        ext.set_fake_stream(0xA)
        torch.ones(16).add_(1)
    time.sleep(pause)
    run = _run(threaded=True)
    with run:
        ext.set_fake_stream(0xA)
        x = torch.ones(16)
        seen, n = 0, 0
        while seen == 0 and n < 100:  # at most 100 lines (13 KiB): below a batch (16 KiB)
            x.add_(x)
            n += 1
            spin(0.0002)
            seen = run._checker.ops
    assert 0 < seen < 100 and n < 100, (seen, n)
    assert run.report.errors == 0


@pytest.mark.parametrize("sync", ["device_sync", "stream_sync", "event_sync"])
def test_a_host_synchronization_hands_what_came_before_it_to_the_checker(monkeypatch, sync):
    """A host synchronization (the program is about to wait for the GPU) starts the recorder's
    thread's pass at once: what was recorded before it is handed to the checker, which checks it
    during the wait. The thread's periodic passes are paused here (bench_ablate(32)): without
    the synchronization nothing is written before the check's end."""
    ext = _ext()
    import torch

    monkeypatch.setenv("STREAMSAN_DEFER", "all")
    run = _run(threaded=True)
    ext.bench_ablate(32)  # kResolverPaused: only a synchronization's pass runs
    try:
        with run:
            ext.set_fake_stream(0xA)
            x = torch.ones(16)
            for _ in range(20):  # 20 lines, far below a batch (16 KiB)
                x.add_(x)
            time.sleep(0.02)
            before = run._checker.ops
            assert ext.fake_gpu_trace(sync, 0xE1, 0xA)  # the check's GPU trace took it
            deadline = time.monotonic() + 10
            during = run._checker.ops
            while during == 0 and time.monotonic() < deadline:
                time.sleep(0.002)
                during = run._checker.ops
    finally:
        ext.bench_ablate(0)
    assert before == 0, before
    # Checked in one batch during the wait: the ops, the allocation, the sync; nothing after.
    assert during >= 21 and during == run.report.ops, (during, run.report.ops)
    assert run.report.errors == 0


def test_what_is_queued_at_the_end_goes_to_the_checker_batch_by_batch(monkeypatch):
    """At the check's end what is still queued is written and handed to the checker's raw sink
    as each batch fills (the checker checks the first while the rest are written), nothing of
    it through Python; the report is the one of a check written at once."""
    ext = _ext()
    import torch

    reports = {}
    for defer in ("0", "all"):
        monkeypatch.setenv("STREAMSAN_DEFER", defer)
        ext.bench_ablate(32)  # kResolverPaused: everything is left for the end (or the full queue)
        through_python = []
        run = _run(threaded=True)
        try:
            with run:
                sink = run._sink
                run._recorder.sink = lambda data: (through_python.append(len(data)), sink(data))
                kept = _program(ext, torch)
        finally:
            ext.bench_ablate(0)
        del kept
        reports[defer] = run.report.to_json()
        if defer == "all":
            assert sum(through_python) == 0, through_python
    assert reports["all"] == reports["0"]


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_child_forked_inside_a_check_leaves_it_unchecked_and_says_so(monkeypatch, backend):
    """A child that goes on after a fork inside a check, runs ops (more than a batch's worth)
    and leaves the check: the check is the parent's, so the child records nothing, leaves
    without touching the parent's checker (no wait for a thread it does not have) and is told
    so by a warning; `report` stays None there. The parent's report is whole."""
    ext = _ext()
    import warnings

    import streamsan.torch
    import torch

    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    monkeypatch.setenv("STREAMSAN_DEFER", "all")
    run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True, threaded=True)
    pid = -1
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with run:
                x = torch.ones(16)  # small: no OpenMP team, which a forked child could not use
                for _ in range(500):
                    x.add_(x)
                pid = os.fork()
                if pid == 0:
                    before = ext.counters()
                    recorded = len(run._recorder.backend.batch) if backend == "python" else 0
                    for _ in range(2000):
                        x.add_(x)
                    after = ext.counters()
                    if backend == "python":
                        recorded = len(run._recorder.backend.batch) - recorded
        if pid == 0:
            said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
            forked = [m for m in said if f"was forked inside a check begun by process {os.getppid()}" in m]
            sites = [c["sites_without_gil"] + c["sites_with_gil"] for c in (before, after)]
            nothing = sites[0] == sites[1] and recorded == 0  # a site is found for every op recorded
            os._exit(0 if run.report is None and forked and nothing else 1)
    except BaseException:
        if pid == 0:
            os._exit(3)
        raise
    finally:
        if pid == 0:
            os._exit(4)  # never back into the test session
    _wait_ok([pid], "the child forked inside the check hung")
    assert run.report is not None
    assert 500 <= run.report.ops < 2000, run.report.ops  # the parent's ops only
    assert not [w for w in caught if "was forked inside" in str(w.message)]


def test_a_child_forked_inside_a_recording_leaves_the_trace_to_the_parent(tmp_path):
    """`record()` writes the trace through a buffered file: a child forked inside it that goes on
    and ends normally must not write the parent's buffered lines a second time (nor its own)."""
    _ext()
    import torch

    if not hasattr(os, "fork"):
        pytest.skip("no fork here")

    def program(path, fork):
        import streamsan.torch

        run = streamsan.torch.Run(raise_on_hazard=False, trace=path, check=False, backend="native",
                                  _fake_device=True)
        pid = -1
        try:
            with run:
                x = torch.ones(16)
                for _ in range(300):
                    x.add_(x)
                run._sink(b"# written before the fork\n")  # a buffered file would hold it
                if fork:
                    pid = os.fork()
                    if pid == 0:
                        for _ in range(100):
                            x.add_(x)
        except BaseException:
            if pid == 0:
                os._exit(3)
            raise
        if pid == 0:
            import gc

            del run
            gc.collect()  # the child's copy of the file goes, as at a normal exit
            os._exit(0)
        if fork:
            _wait_ok([pid], "the child forked inside the recording hung")
        return path.read_bytes()

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        alone = program(tmp_path / "alone.jsonl", False)
        forked = program(tmp_path / "forked.jsonl", True)

    def ops(text):
        return [re.sub(rb'"(d|h)\d+"', b'"X"', line) for line in text.splitlines()]

    assert len(forked.splitlines()) == len(alone.splitlines()), (len(forked.splitlines()), len(alone.splitlines()))
    assert ops(forked) == ops(alone)
