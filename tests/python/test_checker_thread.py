"""The Checker on a thread of its own (`threaded=True`): the same report as the synchronous
Checker on every trace, a queue bounded by bytes, errors raised by a later call, the order of
batches handed over by several threads, a dead or abandoned thread that never hangs or crashes
the process, and streamsan.torch's default."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import streamsan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = sorted(
    glob.glob(os.path.join(ROOT, "tests", "conformance", "*.jsonl"))
    + glob.glob(os.path.join(ROOT, "examples", "**", "*.jsonl"), recursive=True)
)
BOUND = 64 << 10


def batches(text: str, lines_per_batch: int) -> list[str]:
    """`text` cut into batches of whole lines (0: one batch)."""
    lines = text.splitlines(keepends=True)
    if lines_per_batch <= 0:
        return [text]
    return ["".join(lines[i : i + lines_per_batch]) for i in range(0, len(lines), lines_per_batch)]


def outcome(threaded: bool, parts: list[str], **kw) -> dict:
    """Everything a caller sees of a check of `parts`: the errors raised (in order), the hazards
    returned (in order), the report in every rendering or the error that ended it."""
    c = streamsan.Checker(threaded=threaded, **kw)
    assert c.threaded == threaded
    errors, returned = [], []
    for part in parts:
        try:
            returned += c.push_lines(part)
        except streamsan.TraceError as e:
            errors.append(str(e))
    while True:  # the rest: a threaded Checker raises what it met one call later
        try:
            returned += c.drain()
            break
        except streamsan.TraceError as e:
            errors.append(str(e))
    assert c.drain() == []
    found = c.hazards
    out = {"errors": errors, "returned": returned, "found": found}
    try:
        r = c.finish()
    except (ValueError, RuntimeError) as e:  # the analysis's re-check without the ops kept
        out["finish"] = (type(e).__name__, str(e))
        return out
    out.update(
        ops=r.ops,
        json=r.to_json(),
        text=r.to_text(),
        syncs=r.syncs,
        by_site=r.syncs_by_site(),
        sarif=r.to_sarif(),
    )
    return out


@pytest.mark.parametrize("path", TRACES, ids=lambda p: os.path.relpath(p, ROOT))
def test_the_report_is_the_synchronous_one_on_every_trace(path):
    with open(path) as f:
        text = f.read()
    for per in (1, 3, 0):
        parts = batches(text, per)
        for syncs in (False, True):
            for explain in (False, True):
                kw = dict(syncs=syncs, explain=explain, name="t")
                want = outcome(False, parts, **kw)
                got = outcome(True, parts, **kw)
                assert got == want, (per, syncs, explain)
                # Every hazard is returned once, in the order found.
                assert want["returned"] == want["found"]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: os.path.relpath(p, ROOT))
def test_the_ops_kept_in_memory_or_in_a_file_give_the_same_report(path, tmp_path, monkeypatch):
    """The ops kept to explain a report stay in memory up to `_memory_bytes` (a short check
    makes no file) and go to a temporary file past it: the report, its `why:` lines and the
    synchronization verdicts (the ops left to a re-check read again from what was kept) are
    the same all three ways, on a thread or not."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with open(path) as f:
        text = f.read()
    for threaded in (False, True):
        for syncs in (False, True):
            kw = dict(syncs=syncs, explain=True, name="t")
            in_memory = outcome(threaded, [text], **kw)
            assert not spools_in(tmp_path)
            assert outcome(threaded, [text], _memory_bytes=len(text) // 2 + 1, **kw) == in_memory
            assert outcome(threaded, [text], _memory_bytes=0, **kw) == in_memory
            assert not spools_in(tmp_path)  # the files went with their reports


def test_a_short_checks_ops_stay_in_memory_and_a_long_ones_go_to_a_file(tmp_path, monkeypatch):
    """No file while the kept ops fit `_memory_bytes`; past it, one file (what memory held
    written first), removed with its report."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for threaded in (False, True):
        c = streamsan.Checker(threaded=threaded, _memory_bytes=4096)
        c.push_lines(numbered_ops(0, 10))
        c.drain()
        assert not spools_in(tmp_path)
        c.push_lines(numbered_ops(10, 200))
        c.drain()
        assert len(spools_in(tmp_path)) == 1
        r = c.finish()
        assert r.clean and r.to_dot().startswith("digraph")
        del r, c
        assert not spools_in(tmp_path)


def bench_trace(tmp_path, ops: int, drop_every: int = 0) -> str:
    """The clean pipeline of `streamsan bench`, every `drop_every`th event_wait removed (races)."""
    path = tmp_path / "bench.jsonl"
    out = subprocess.run(
        [sys.executable, "-m", "streamsan", "bench", "--ops", str(ops), "--write-trace", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    kept, waits = [], 0
    for line in path.read_text().splitlines(keepends=True):
        if '"event_wait"' in line:
            waits += 1
            if drop_every and waits % drop_every == 0:
                continue
        kept.append(line)
    return "".join(kept)


def test_a_larger_trace_with_hazards_in_several_batch_sizes(tmp_path):
    text = bench_trace(tmp_path, 30000, drop_every=40)
    reports = set()
    for per in (1000, 7, 0):
        parts = batches(text, per)
        for syncs in (False, True):
            want = outcome(False, parts, syncs=syncs, explain=True)
            got = outcome(True, parts, syncs=syncs, explain=True, queue_bytes=BOUND)
            assert got == want, (per, syncs)
            assert json.loads(want["json"])["errors"] > 10
            reports.add(want["json"])
    assert len(reports) == 2  # with and without the analysis, whatever the batches


def test_many_small_pushes_then_finish(tmp_path):
    text = bench_trace(tmp_path, 10000, drop_every=5)
    parts = batches(text, 1)
    want = outcome(False, parts, explain=False)
    got = outcome(True, parts, explain=False, queue_bytes=4096)
    assert got == want and want["errors"] == [] and len(want["found"]) > 10
    # push, one op at a time, waits for its op: the same hazards, op by op.
    sync, threaded = streamsan.Checker(explain=False), streamsan.Checker(explain=False, threaded=True)
    for line in parts[:3000]:
        assert threaded.push(line) == sync.push(line)
    assert threaded.finish().to_json() == sync.finish().to_json()


def numbered_ops(first: int, n: int, size: int = 4096) -> str:
    """Ops that only check cleanly in order: op i allocates b{i}, writes it, frees b{i-1}."""
    out = []
    for i in range(first, first + n):
        out.append('{"op":"alloc","buffer":"b%d","bytes":%d,"stream":"s"}\n' % (i, size))
        out.append('{"op":"launch","stream":"s","name":"k%d","writes":["b%d"]}\n' % (i, i))
        if i > 0:
            out.append('{"op":"free","buffer":"b%d"}\n' % (i - 1))
    return "".join(out)


def test_the_queue_is_bounded_and_the_producer_waits_for_room():
    delay = 0.02
    c = streamsan.Checker(threaded=True, explain=False, queue_bytes=BOUND, _delay=delay)
    part = numbered_ops(0, 100)
    assert 8 << 10 < len(part) < BOUND // 4
    n, waited, seen = 60, 0.0, 0
    for k in range(n):
        t = time.perf_counter()
        assert c.push_lines(numbered_ops(100 * k, 100)) == []
        waited += time.perf_counter() - t
        s = c.stats()
        assert s["queue_bytes"] <= BOUND
        seen = max(seen, s["queue_bytes"])
    # The queue filled up, then the producer waited for the thread: the batches beyond those
    # the bound holds each cost it about one batch of the thread's time.
    in_queue = BOUND // len(part)
    assert seen > BOUND // 2
    assert waited > 0.5 * (n - in_queue - 1) * delay
    assert c.stats()["ops"] < 300 * n
    assert c.drain() == []
    s = c.stats()
    assert s["queue_bytes"] == 0 and BOUND // 2 < s["queue_peak_bytes"] <= BOUND
    r = c.finish()
    assert r.clean and r.ops == 300 * n - 1


def test_a_text_larger_than_the_queue_is_taken_alone():
    c = streamsan.Checker(threaded=True, explain=False, queue_bytes=1024)
    big = numbered_ops(0, 200)
    c.push_lines(big)
    c.push_lines(numbered_ops(200, 200))
    c.drain()
    assert c.stats()["queue_peak_bytes"] == max(len(big), len(numbered_ops(200, 200)))
    assert c.finish().ops == 1199


def test_synchronous_stats_have_no_queue():
    c = streamsan.Checker(explain=False)
    c.push_lines(numbered_ops(0, 3))
    assert "queue_bytes" not in c.stats() and c.stats()["ops"] == 8 and not c.threaded


def test_stats_answer_from_what_the_thread_has_checked():
    c = streamsan.Checker(threaded=True, explain=False, _delay=0.2)
    for k in range(3):
        c.push_lines(numbered_ops(10 * k, 10))
    s = c.stats()
    assert s["ops"] < 89 and s["queue_bytes"] > 0
    assert c.ops >= s["ops"]
    c.drain()
    s = c.stats()
    assert (s["ops"], s["queue_bytes"], c.ops) == (89, 0, 89)


def wait_for(cond, limit: float = 30.0, every: float = 0.002) -> bool:
    """Waits until `cond()` holds, at most `limit` seconds; returns whether it does."""
    until = time.monotonic() + limit
    while not cond() and time.monotonic() < until:
        time.sleep(every)
    return cond()


def test_the_thread_finds_batches_by_itself_and_wakes_from_a_long_sleep():
    """A batch handed over does not wake the thread while batches are coming (it looks at the
    queue every millisecond); once it has found the queue empty for a while it sleeps until a
    batch wakes it. Either way the batch is checked without a call that waits for it."""
    c = streamsan.Checker(threaded=True, explain=False)
    c.push_lines(numbered_ops(0, 10))
    wait_for(lambda: c.stats()["ops"] >= 29)
    assert c.stats()["ops"] == 29 and c.stats()["queue_bytes"] == 0
    time.sleep(0.5)  # far past its looks: it sleeps until woken
    c.push_lines(numbered_ops(10, 10))
    wait_for(lambda: c.stats()["ops"] >= 59)
    assert c.stats()["ops"] == 59 and c.stats()["queue_bytes"] == 0
    assert c.drain() == [] and c.finish().ops == 59


def checker_threads(name: str = "streamsan-check") -> set:
    """The checker threads of this process (Linux: their names in /proc), by thread id; `name`:
    threads of that name instead."""
    out = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().strip() == name:  # names are cut to 15 bytes
                    out.add(task)
        except OSError:
            pass
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
@pytest.mark.parametrize("threaded", [False, True])
def test_finish_leaves_the_checkers_state_to_a_thread_of_its_own(threaded):
    """`finish` of a check of 2,048 ops or more returns the report without dropping the
    checker's state (every buffer's history, the names: its drop takes time in proportion to
    what was checked): one thread of the process drops it, made at the first such finish and
    kept for the next. (That the report is the one made by dropping the state at once:
    `the_report_made_apart_is_the_report` in src/analysis/run.rs.)"""
    ops = numbered_ops(0, 700)
    c = streamsan.Checker(threaded=threaded, explain=False)
    c.push_lines(ops)
    r = c.finish()
    # (A thread names itself as it starts: a new one may not be named yet.)
    assert wait_for(lambda: len(checker_threads("streamsan-drop")) == 1), checker_threads("streamsan-drop")
    droppers = checker_threads("streamsan-drop")
    assert r.ops == 2099 and r.clean
    # b699, written on stream s, read on s2 without a wait: the hazards any check reports.
    c = streamsan.Checker(threaded=threaded, explain=False)
    c.push_lines(ops + '{"op":"launch","stream":"s2","name":"late","reads":["b699"]}\n')
    r = c.finish()
    assert checker_threads("streamsan-drop") == droppers  # the same thread, again
    assert r.ops == 2100
    assert sorted((h["kind"], h["buffer"]) for h in r.hazards) == [("data-race", "b699"), ("reuse-race", "b699")]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_a_checks_thread_serves_the_next_checks_and_ends_when_idle(tmp_path):
    """A threaded Checker starts a thread when the first batch is handed over (a check that
    hands none over starts none), and its temporary copy of the ops when the first op is kept;
    `finish` does not wait for the thread: once done with the check, it waits for the next
    check's first batch (checks one after another, the program running between them, use one
    thread; two at once, two), and ends when none comes within its idle wait."""
    code = r"""
        import os, time, streamsan
        from streamsan._streamsan import _set_checker_thread_idle

        def threads():
            n = 0
            for task in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{task}/comm") as f:
                        n += f.read().strip() == "streamsan-check"
                except OSError:
                    pass
            return n

        def spools():
            return len([p for p in os.listdir(os.environ["TMPDIR"]) if p.startswith("streamsan-ops-")])

        def wait_for(cond, limit=30.0):
            until = time.monotonic() + limit
            while not cond() and time.monotonic() < until:
                time.sleep(0.002)
            return cond()

        ops = "".join('{"op":"alloc","buffer":"b%d","bytes":64,"stream":"s"}\n' % i for i in range(20))
        _set_checker_thread_idle(1.0)
        c = streamsan.Checker(threaded=True, explain=True, _memory_bytes=0)  # the ops in a file
        print("made", threads(), spools())
        c.push_lines(ops)
        assert wait_for(lambda: c.stats()["ops"] == 20)
        print("first batch", threads(), spools())
        r = c.finish()
        assert r.ops == 20 and r.clean
        del r, c
        print("finished", threads(), spools())
        for _ in range(5):
            time.sleep(0.05)  # the program between checks
            c = streamsan.Checker(threaded=True)
            c.push_lines(ops)
            assert c.finish().ops == 20
        print("five more", threads())
        time.sleep(0.05)
        a, b = streamsan.Checker(threaded=True, _delay=0.2), streamsan.Checker(threaded=True, _delay=0.2)
        a.push_lines(ops)
        b.push_lines(ops)
        assert a.finish().ops == b.finish().ops == 20
        print("two at once", threads())
        print("idle", wait_for(lambda: threads() == 0, 10.0))
        c = streamsan.Checker(threaded=True)
        c.push_lines(ops)
        assert c.finish().ops == 20
        print("again", wait_for(lambda: threads() == 1, 5.0))  # its name is set once it runs
        _set_checker_thread_idle(0)
        print("no wait", wait_for(lambda: threads() == 0, 10.0))
        c = streamsan.Checker(threaded=True, explain=True, _memory_bytes=0)
        r = c.finish()  # none handed over: no thread; the empty copy made for the report
        print("none handed over", threads(), r.ops, "digraph" in r.to_dot())
        """
    out = run_python(code, timeout=120, tmpdir=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "made 0 0",
        "first batch 1 1",
        "finished 1 0",
        "five more 1",
        "two at once 2",
        "idle True",
        "again True",
        "no wait True",
        "none handed over 0 0 True",
    ], out.stdout
    assert not spools_in(tmp_path)


def test_catching_up_while_other_threads_push_keeps_the_synchronous_report():
    """A caller that waits for the thread to catch up checks the queued batches itself when the
    thread is between batches: with four threads pushing and the main thread draining all along,
    every batch is checked once, in the order it was admitted, and the report is the
    synchronous one."""
    parts = [numbered_ops(10 * k, 10) for k in range(40)]
    lock = threading.Lock()
    order: list[str] = []
    c = streamsan.Checker(threaded=True, queue_bytes=4 << 10)
    nxt = iter(parts)

    def pusher():
        while True:
            with lock:  # the order batches are handed over in is the order they are listed
                part = next(nxt, None)
                if part is None:
                    return
                order.append(part)
                c.push_lines(part)

    threads = [threading.Thread(target=pusher) for _ in range(4)]
    for t in threads:
        t.start()
    returned = []
    while any(t.is_alive() for t in threads):
        returned += c.drain()
    for t in threads:
        t.join(timeout=60)
    returned += c.drain()
    r = c.finish()
    s = streamsan.Checker(threaded=False)
    sync_returned = []
    for part in order:
        sync_returned += s.push_lines(part)
    expected = s.finish()
    assert r.to_json() == expected.to_json() and r.ops == expected.ops
    assert returned == sync_returned


BAD = (
    '{"op":"alloc","buffer":"a","bytes":16}\n{"op":"free","buffer":"a"}\n{"op":"free","buffer":"a"}\n'
    '{"op":"bad"}\n{"op":"device_sync"}\n'
)
REJECTED = '{"op":"alloc","buffer":"x","bytes":16}\n{"op":"alloc","buffer":"x","bytes":16}\n'


def settle(c, limit: float = 30.0):
    """Waits until the thread has checked what was pushed, without raising what it met."""
    wait_for(lambda: not c.stats()["queue_bytes"], limit, every=0.01)


def test_bad_input_is_raised_by_the_next_call():
    sync = streamsan.Checker(explain=False, name="mine")
    with pytest.raises(streamsan.TraceError) as want:
        sync.push_lines(BAD)
    assert str(want.value).startswith("mine:4:")
    c = streamsan.Checker(explain=False, name="mine", threaded=True, _delay=0.05)
    # The thread has not read it yet: the call that pushed it returns.
    assert c.push_lines(BAD) == []
    settle(c)
    with pytest.raises(streamsan.TraceError) as got:
        c.push_lines('{"op":"device_sync"}\n')
    assert str(got.value) == str(want.value)
    # The hazards found before the bad line come with the next call.
    assert [h["kind"] for h in c.drain()] == ["invalid-free"]
    # A rejected op (a live name allocated again), met last: raised by finish, which stays open.
    sync.push_lines('{"op":"device_sync"}\n')
    with pytest.raises(streamsan.TraceError) as want:
        sync.push_lines(REJECTED)
    c.push_lines(REJECTED)
    with pytest.raises(streamsan.TraceError) as got:
        c.finish()
    assert str(got.value) == str(want.value) and "mine:7:" in str(got.value)
    assert not c.finished
    assert c.finish().to_json() == sync.finish().to_json()
    with pytest.raises(ValueError, match="finished"):
        c.push_lines('{"op":"device_sync"}\n')
    with pytest.raises(ValueError, match="finished"):
        c.finish()


def test_push_raises_its_own_bad_op():
    c = streamsan.Checker(explain=False, name="mine", threaded=True)
    c.push({"op": "alloc", "buffer": "a", "bytes": 16})
    with pytest.raises(streamsan.TraceError, match=r'^mine:2:7: unknown op "lanch"'):
        c.push('{"op":"lanch","stream":"s"}')
    assert c.ops == 1
    assert c.push({"op": "free", "buffer": "a"}) == []
    assert c.finish().ops == 2


def test_batches_of_two_threads_under_a_lock_keep_their_order():
    """As the recorders hand batches over: under a lock, from any thread; the thread's slowness
    makes the pushes wait for room with the lock held."""
    lock = threading.Lock()
    order: list[str] = []
    returned = []
    c = streamsan.Checker(threaded=True, explain=False, queue_bytes=16 << 10, _delay=0.002)
    nxt = [0]

    def producer():
        for _ in range(40):
            with lock:
                part = numbered_ops(nxt[0], 20)
                nxt[0] += 20
                order.append(part)
                returned.extend(c.push_lines(part))

    threads = [threading.Thread(target=producer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    returned += c.drain()
    r = c.finish()
    assert r.clean and r.ops == 3 * 1600 - 1 and returned == []
    assert c.finished


def test_callers_that_wait_for_room_keep_the_order_they_came_in():
    """Without a lock: callers that come while others wait for room go after them, in the
    order they came (the ops only check cleanly in that order)."""
    c = streamsan.Checker(threaded=True, explain=False, queue_bytes=1, _delay=0.25)
    c.push_lines(numbered_ops(0, 1))  # the thread sleeps on it; the queue is full
    threads = []
    for i in range(1, 7):
        threads.append(threading.Thread(target=c.push_lines, args=(numbered_ops(i, 1),)))
        threads[-1].start()
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert c.drain() == []
    r = c.finish()
    assert r.clean and r.ops == 20, r.to_text()


def spools_in(folder) -> list:
    """The temporary copies of the ops (a Checker's spool files) in `folder`."""
    return [p.name for p in folder.iterdir() if p.name.startswith("streamsan-ops-")]


def run_python(code: str, timeout: float = 60, tmpdir=None) -> subprocess.CompletedProcess:
    """Runs `code` in a Python of its own; `tmpdir` becomes its TMPDIR (its spool files are then
    its own, whatever else runs on the machine)."""
    env = None
    if tmpdir is not None:
        env = dict(os.environ, TMPDIR=str(tmpdir), TEMP=str(tmpdir), TMP=str(tmpdir))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_a_panic_of_the_thread_is_an_exception_not_a_crash():
    out = run_python(
        """
        import streamsan, sys
        ops = '{"op":"alloc","buffer":"a","bytes":16}\\n'
        c = streamsan.Checker(threaded=True, explain=True, _panic_at=1)
        c.push_lines(ops)
        c.push_lines('{"op":"device_sync"}\\n')
        try:
            for _ in range(1000):
                c.push_lines('{"op":"device_sync"}\\n')
        except RuntimeError as e:
            print("push:", e)
        try:
            c.drain()
        except RuntimeError as e:
            print("drain:", e)
        for _ in range(2):
            try:
                c.finish()
            except RuntimeError as e:
                print("finish:", e)
        print("finished", c.finished)
        del c
        print("done")
        """
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "done" and lines[-2] == "finished True"
    assert sum(line.startswith("finish: the checker's thread panicked") for line in lines) == 2
    assert any(line.startswith("drain: the checker's thread panicked") for line in lines)
    assert "asked for by a test" in out.stdout


@pytest.mark.parametrize("how", ["del", "exit", "exit-while-pushing"])
def test_an_abandoned_check_neither_hangs_nor_crashes(how, tmp_path):
    """A Checker dropped, or alive at exit (with a thread waiting for room), with a queue that
    would take its thread seconds to check: its thread drops the queue and ends at once."""
    code = f"""
        import glob, os, tempfile, threading, time, streamsan
        how = {how!r}
        before = set(glob.glob(os.path.join(tempfile.gettempdir(), "streamsan-ops-*")))
        c = streamsan.Checker(threaded=True, queue_bytes=1 << 18, _delay=1.0)
        ops = "".join('{{"op":"alloc","buffer":"n%d","bytes":16}}\\n' % i for i in range(2000))
        for k in range(4):
            c.push_lines(ops.replace('"n', '"n%d-' % k))
        if how == "exit-while-pushing":
            t = threading.Thread(target=c.push_lines, args=(ops.replace('"n', '"d'),), daemon=True)
            t.start()
            time.sleep(0.2)
        if how == "del":
            t = time.monotonic()
            del c
            print("dropped in", round(time.monotonic() - t, 2))
            after = set(glob.glob(os.path.join(tempfile.gettempdir(), "streamsan-ops-*")))
            print("spool left", len(after - before))
        print("exiting at", time.monotonic())
        """
    out = run_python(code, timeout=60, tmpdir=tmp_path)
    end = time.monotonic()
    assert out.returncode == 0, out.stderr
    last = out.stdout.splitlines()[-1]
    assert last.startswith("exiting at ")
    assert end - float(last.split()[-1]) < 1.5  # no wait for the queue at exit
    if how == "del":
        dropped = float(out.stdout.split("dropped in ")[1].split()[0])
        assert dropped < 1.0
        assert "spool left 0" in out.stdout
    # Dropped or alive at exit, its temporary copy of the ops is gone once the process is.
    assert not spools_in(tmp_path)


def test_exit_with_a_streamsan_torch_check_running(backend, tmp_path):
    """A script that ends inside a check (no __exit__): the process exits, status 0, and leaves
    no temporary copy of the ops behind."""
    code = f"""
        import time, torch, streamsan.torch
        run = streamsan.torch.Run(raise_on_hazard=False, backend={backend!r}, threaded=True, _fake_device=True)
        run.__enter__()
        xs = [torch.ones(256) for _ in range(8)]
        for step in range(2000):
            for x in xs:
                x.add_(1)
        print("exiting at", time.monotonic(), run._checker.threaded)
        """
    out = run_python(code, timeout=120, tmpdir=tmp_path)
    end = time.monotonic()
    assert out.returncode == 0, out.stderr
    last = out.stdout.splitlines()[-1].split()
    assert last[-1] == "True" and end - float(last[-2]) < 5
    assert not spools_in(tmp_path)


def test_bad_input_from_the_recorder_is_raised_at_exit(backend):
    """Raised at exit as the recorder's error, with the report made, on a thread or not."""
    import streamsan.torch

    messages = []
    for threaded in (False, True):
        run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, threaded=threaded, _fake_device=True)
        with pytest.raises(streamsan.TraceError, match="unknown op") as e:
            with run:
                run._recorder._sink(b'{"op":"device_sync"}\n{"op":"bogus"}\n')
        messages.append(str(e.value))
        assert run.report is not None and run.report.ops >= 1
    assert messages[0] == messages[1]


def test_streamsan_torch_checks_on_a_thread_unless_told_not_to(monkeypatch):
    import streamsan.torch

    monkeypatch.delenv("STREAMSAN_CHECK_THREAD", raising=False)
    assert streamsan.torch.Run().threaded and streamsan.torch.check().threaded
    assert not streamsan.torch.check(threaded=False).threaded
    monkeypatch.setenv("STREAMSAN_CHECK_THREAD", "0")
    assert not streamsan.torch.Run().threaded
    assert streamsan.torch.check(threaded=True).threaded


def torch_program(run, f):
    """Enough ops for several of the recorder's batches, with races on a side stream."""
    import torch

    f.stream(0)
    xs = [torch.ones(256) for _ in range(8)]
    for step in range(1000):
        f.stream(0)
        for x in xs:
            x.add_(1)
        f.stream(1, "side")
        y = xs[step % 8] * 2  # a read racing with the default stream's writes
        f.stream(0)
        del y


@pytest.mark.parametrize("syncs", [False, True])
def test_streamsan_torch_reports_are_the_same_on_a_thread(backend, syncs, tmp_path):
    """The report of a check on a thread is that of the recorded trace checked alone (two runs
    of a program on fake device memory record different traces: CPU addresses differ)."""
    import streamsan.torch
    from test_recorder_cpu import Fake

    for threaded in (False, True):
        trace = str(tmp_path / f"{threaded}.jsonl")
        run = streamsan.torch.Run(
            raise_on_hazard=False,
            backend=backend,
            trace=trace,
            syncs=syncs,
            print_syncs=False,
            threaded=threaded,
            _fake_device=True,
        )
        pushed = []
        sink = run._sink
        run._sink = lambda data: (pushed.append(data), sink(data))[1]
        with run:
            assert run._checker.threaded == threaded
            torch_program(run, Fake(run))
            during = run.stats()
            assert ("queue_bytes" in during) == threaded
        # The ops were checked (and kept) in the order the recorder handed them over.
        with open(trace, "rb") as f:
            kept = f.read()
        if backend == "native" and threaded:
            # The C++ recorder handed its batches to the checker's queue itself (its raw sink);
            # Python's sink got what was left at the end.
            assert len(kept) > 3 << 18
            assert len(pushed) <= 1 and kept.endswith(b"".join(pushed))
        else:
            assert len(pushed) >= 3
            assert kept == b"".join(pushed)
        alone = streamsan.check_trace(trace, syncs=syncs)
        assert run.report.errors > 100 and run.report.ops > 10000
        assert run.report.to_json() == alone.to_json()
        assert run.report.to_text() == alone.to_text()
        assert run.syncs == (streamsan.describe_syncs(alone) if syncs else [])
        # Run.hazards is complete after exit: every hazard of the report, in the order found.
        key = lambda h: (h["op"], h["kind"], h["buffer"])  # noqa: E731
        assert sorted(map(key, run.hazards)) == sorted(map(key, run.report.hazards))
        assert [h["op"] for h in run.hazards] == sorted(h["op"] for h in run.hazards)


def test_a_forked_child_leaves_its_parents_copies_of_the_ops(tmp_path):
    """A child forked while its parent holds a report ends normally (its `atexit`, its objects
    released): the parent's temporary copy of the ops stays for the parent's report, and goes
    when the parent exits."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    code = """
        import os, sys, streamsan
        c = streamsan.Checker(explain=True, _memory_bytes=0)
        c.push_lines('{"op":"alloc","buffer":"a","bytes":16}\\n{"op":"launch","stream":"s1","writes":["a"]}\\n')
        report = c.finish()
        def spools():
            return len([n for n in os.listdir(os.environ["TMPDIR"]) if n.startswith("streamsan-ops-")])
        print("before fork", spools())
        pid = os.fork()
        if pid == 0:
            del report
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("child status", status, "after the child", spools())
        """
    out = run_python(code, timeout=60, tmpdir=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "before fork 1" in out.stdout and "child status 0 after the child 1" in out.stdout, out.stdout
    assert not spools_in(tmp_path)


def test_a_forked_child_cannot_use_its_parents_checker_and_does_not_hang(tmp_path):
    """A child forked while the parent's checker thread is in a batch: every call of the child's
    copy raises at once (the check and its thread are the parent's; waiting for that thread
    would wait for good), the child exits normally (its copy dropped without touching what the
    parent's thread held), and the parent's check goes on to its full report."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    code = """
        import os, sys, time, streamsan
        c = streamsan.Checker(threaded=True, explain=True, _delay=0.2)
        c.push_lines('{"op":"alloc","buffer":"a","bytes":16}\\n')
        for _ in range(5):
            c.push_lines('{"op":"launch","stream":"s1","writes":["a"]}\\n')
        time.sleep(0.05)  # the thread is in its first batch's delay
        pid = os.fork()
        if pid == 0:
            said = []
            for call in (c.drain, lambda: c.push_lines('{"op":"device_sync"}\\n'),
                         lambda: c.push('{"op":"device_sync"}'), c.finish, lambda: c.ops,
                         lambda: c.finished, lambda: c.threaded, lambda: c.hazards, c.stats,
                         c._raw_sink):
                try:
                    call()
                    said.append("returned")
                except RuntimeError as e:
                    said.append("belongs to process %d" % os.getppid() in str(e))
            print("child", said, flush=True)
            sys.exit(0)
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                status = "hung"
                break
            time.sleep(0.01)
        report = c.finish()
        print("parent", status, report.ops, report.errors)
        """
    out = run_python(code, timeout=60, tmpdir=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "child [%s]" % ", ".join(["True"] * 10) in out.stdout, out.stdout + out.stderr
    assert "parent 0 6 0" in out.stdout, out.stdout + out.stderr
