"""The recorder's CUDA graph ops (streamsan.torch._graphs), without torch or a GPU.

A fake `CUDAGraph` class stands for torch's (the methods PyTorch 2.11 has, with the same pool
handles: a private pool's handle is known from `pool()` once the capture ended); the wrappers
the recorder installs on it write graph ops; the ops a backend writes between them (allocations
with their addresses, launches, events) are written here as the backends write them. Every
trace is checked by the real checker: accepted, and with the verdict of the program it stands
for (the GPU programs of tests/python/programs.py, as the recorder sees them).
"""

from __future__ import annotations

import json

import pytest

import streamsan
from streamsan.torch import _graphs
from streamsan.torch._recorder import _Patches

MB4 = 4 << 20


class _GraphBase:
    """Stands for torch._C._CUDAGraph: the C++ methods."""

    next_private = 1

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._pool = None
        self._ended = False

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.calls.append("capture_begin")
        if pool is None or not any(pool):
            pool = (_GraphBase.next_private, 0)
            _GraphBase.next_private += 1
        self._pool = tuple(pool)

    def capture_end(self):
        self.calls.append("capture_end")
        if getattr(self, "fail_end", False):
            raise RuntimeError("operation not permitted when stream is capturing")
        self._ended = True

    def replay(self):
        if not self._ended:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        self.calls.append("replay")

    def reset(self):
        self.calls.append("reset")
        self._ended = False

    def pool(self):
        if not self._ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self._pool


class CUDAGraph(_GraphBase):
    """Stands for torch.cuda.CUDAGraph, a Python subclass (the methods are inherited)."""


_handles = iter(range(1000, 2000))


def graph_pool_handle():
    return (0, next(_handles))


class Program:
    """What the recorder writes for a program: the backend's ops (as the backends write them)
    and the graph ops (from the wrappers, installed on the fake CUDAGraph)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.warnings: list[tuple[str, str]] = []
        self.stream = 0  # raw handle of the current stream
        self.capturing: set[int] = set()  # streams capturing (as CUDA knows them)
        self.names = {0: '"default"'}
        self.next_addr = 1 << 32
        self.bufs: dict[str, int] = {}
        self.ops = _graphs.GraphOps(self.host_op, self.stream_id, self.warn)
        self.on = True
        self.patches = _Patches()
        for attr, make in _graphs.make_wrappers(
            lambda: self.ops if self.on else None, lambda: (self.stream, 0), self.warn,
            lambda: self.stream in self.capturing,
        ).items():
            self.patches.patch_inherited(CUDAGraph, attr, make)

    def close(self) -> None:
        self.patches.restore()

    # the backend's interface
    def host_op(self, partial: str) -> None:
        self.lines.append(partial + "}\n")

    def stream_id(self, raw: int, device: int) -> str:
        return self.names.setdefault(raw, json.dumps(f"stream {raw:#x}"))

    def warn(self, key: str, message: str) -> None:
        self.warnings.append((key, message))

    # ops of the program, as a backend writes them
    def sid(self) -> str:
        return self.stream_id(self.stream, 0)

    def alloc(self, name: str, addr: int | None = None) -> None:
        if addr is None:
            addr = self.next_addr
            self.next_addr += MB4
        self.bufs[name] = addr
        self.lines.append(
            '{"op":"alloc","buffer":"%s","bytes":%d,"stream":%s,"addr":%d}\n' % (name, MB4, self.sid(), addr)
        )

    def free(self, name: str) -> None:
        self.lines.append('{"op":"free","buffer":"%s"}\n' % name)

    def launch(self, reads=(), writes=()) -> None:
        op = {"op": "launch", "stream": json.loads(self.sid())}
        if reads:
            op["reads"] = list(reads)
        if writes:
            op["writes"] = list(writes)
        self.lines.append(json.dumps(op) + "\n")

    def record_stream(self, name: str, raw: int) -> None:
        self.lines.append('{"op":"record_stream","buffer":"%s","stream":%s}\n' % (name, self.stream_id(raw, 0)))

    def wait_stream(self, waiter: int, waited: int, event: int) -> None:
        """torch.cuda.Stream.wait_stream: an event recorded on `waited`, waited on by `waiter`."""
        self.lines.append('{"op":"event_record","event":"ev %d","stream":%s}\n' % (event, self.stream_id(waited, 0)))
        self.lines.append('{"op":"event_wait","stream":%s,"event":"ev %d"}\n' % (self.stream_id(waiter, 0), event))

    def device_sync(self) -> None:
        self.lines.append('{"op":"device_sync","device":0}\n')

    def graph(self, capture_stream: int, pool=None):
        """torch.cuda.graph(g, pool=…, stream=…): a device sync, the capture stream made current,
        capture_begin, …, capture_end, the stream switched back."""
        prog = self

        class _Ctx:
            def __init__(self, g):
                self.g = g

            def __enter__(self):
                prog.device_sync()
                self.prev = prog.stream
                prog.stream = capture_stream
                self.g.capture_begin(*(() if pool is None else (pool,)), capture_error_mode="global")
                prog.capturing.add(capture_stream)

            def __exit__(self, *exc):
                try:
                    self.g.capture_end()
                finally:
                    prog.capturing.discard(capture_stream)
                    prog.stream = self.prev

        return _Ctx

    def check(self) -> streamsan.Report:
        c = streamsan.Checker(explain=False)
        c.push_lines("".join(self.lines))
        return c.finish()

    def ops_of(self, kind: str) -> list[dict]:
        return [json.loads(line) for line in self.lines if json.loads(line)["op"] == kind]


@pytest.fixture
def prog():
    p = Program()
    yield p
    p.close()


S1, S2, CAP = 0x11, 0x22, 0xCA  # two streams of the program, torch.cuda.graph's capture stream


def test_patches_wrap_inherited_methods_and_restore_them():
    assert "capture_begin" not in CUDAGraph.__dict__
    p = Program()
    try:
        for m in ("capture_begin", "capture_end", "replay", "reset"):
            assert m in CUDAGraph.__dict__
        assert "capture_end_pre" not in CUDAGraph.__dict__  # not in this torch: not invented
    finally:
        p.close()
    for m in ("capture_begin", "capture_end", "replay", "reset"):
        assert m not in CUDAGraph.__dict__
    g = CUDAGraph()
    g.capture_begin()
    g.capture_end()
    g.replay()
    assert g.calls == ["capture_begin", "capture_end", "replay"]


def test_capture_and_replays_as_graph_ops(prog):
    x = "x"
    prog.stream = S1
    prog.alloc(x)
    prog.launch(writes=[x])
    g = CUDAGraph()
    with prog.graph(CAP)(g):
        prog.alloc("t")  # on the capture stream: a pool buffer
        prog.launch(reads=[x], writes=["t"])
        prog.launch(reads=["t"], writes=[x])
        prog.free("t")
    assert prog.stream == S1
    g.replay()
    prog.stream = S2
    prog.wait_stream(S2, S1, 1)
    g.replay()
    assert g.calls == ["capture_begin", "capture_end", "replay", "replay"]
    begin, = prog.ops_of("graph_begin")
    assert begin == {"op": "graph_begin", "graph": "graph 1", "stream": "stream 0xca", "pool": "pool of graph 1"}
    assert prog.ops_of("graph_end") == [{"op": "graph_end", "graph": "graph 1"}]
    assert prog.ops_of("graph_launch") == [
        {"op": "graph_launch", "graph": "graph 1", "stream": "stream 0x11"},
        {"op": "graph_launch", "graph": "graph 1", "stream": "stream 0x22"},
    ]
    r = prog.check()
    assert r.errors == 0, r.to_text()
    assert not prog.warnings


def test_pool_handles_name_pools(prog):
    """graph_pool_handle() shared by two captures: one pool; another graph's pool() passed as
    pool=: that graph's pool; no pool: a private pool each."""
    handle = graph_pool_handle()
    gs = [CUDAGraph() for _ in range(5)]
    pools = [handle, handle, None, None, "other"]
    for g, pool in zip(gs, pools):
        if pool == "other":
            pool = gs[2].pool()
        with prog.graph(CAP, pool)(g):
            prog.launch()
    names = [op["pool"] for op in prog.ops_of("graph_begin")]
    assert names[0] == names[1]
    assert names[2] != names[3] and names[2] != names[0] and names[3] != names[0]
    assert names[4] == names[2] == "pool of graph 3"
    assert prog.check().errors == 0


def test_mempool_and_zero_handle():
    class MemPool:
        id = (0, 77)

    assert _graphs.pool_key(MemPool()) == (0, 77)
    assert _graphs.pool_key((0, 0)) is None
    assert _graphs.pool_key(None) is None
    assert _graphs.pool_key([3, 0]) == (3, 0)


def test_shared_pool_replayed_concurrently_is_a_reuse_race(prog):
    """programs.py's shared-pool program: g1's temporary, freed in its capture, is the block of
    g2's temporary (same pool); g1 on s1 and g2 on s2 run at the same time."""
    handle = graph_pool_handle()
    prog.stream = S1
    prog.alloc("x1")
    prog.alloc("x2")
    g1, g2 = CUDAGraph(), CUDAGraph()
    with prog.graph(CAP, handle)(g1):
        prog.alloc("t1", addr=1 << 40)
        prog.launch(reads=["x1"], writes=["t1"])
        prog.alloc("o1", addr=(1 << 40) + MB4)
        prog.launch(reads=["t1"], writes=["o1"])
        prog.free("t1")
    with prog.graph(CAP, handle)(g2):
        prog.alloc("t2", addr=1 << 40)  # the pool hands out t1's block again
        prog.launch(reads=["x2"], writes=["t2"])
        prog.alloc("o2", addr=(1 << 40) + 2 * MB4)
        prog.launch(reads=["t2"], writes=["o2"])
        prog.free("t2")
    prog.wait_stream(S2, S1, 1)  # the inputs are ready on both streams
    g1.replay()
    prog.stream = S2
    fixed = prog.lines[:]
    g2.replay()  # not ordered after g1's replay
    r = prog.check()
    assert [h["kind"] for h in r.hazards] == ["reuse-race"], r.to_text()
    # fixed: s2 waits for s1 after g1's replay
    prog.lines = fixed
    prog.wait_stream(S2, S1, 2)
    g2.replay()
    assert prog.check().errors == 0


def test_private_pools_replayed_concurrently_are_clean(prog):
    prog.stream = S1
    g1, g2 = CUDAGraph(), CUDAGraph()
    with prog.graph(CAP)(g1):
        prog.alloc("t1", addr=1 << 40)
        prog.launch(writes=["t1"])
        prog.free("t1")
    with prog.graph(CAP)(g2):
        prog.alloc("t2", addr=2 << 40)
        prog.launch(writes=["t2"])
        prog.free("t2")
    g1.replay()
    prog.stream = S2
    g2.replay()
    r = prog.check()
    assert r.errors == 0, r.to_text()


def test_static_input_copied_on_a_side_stream_during_a_replay(prog):
    prog.stream = S1
    prog.alloc("x")
    prog.alloc("src")
    prog.launch(writes=["x"])
    prog.launch(writes=["src"])
    prog.wait_stream(S2, S1, 0)  # the side stream may read src from now on
    g = CUDAGraph()
    with prog.graph(CAP)(g):
        prog.alloc("y", addr=1 << 40)
        prog.launch(reads=["x"], writes=["y"])
    g.replay()
    before = prog.lines[:]

    def rest(fixed):
        if fixed:
            prog.wait_stream(S2, S1, 2)
        prog.stream = S2
        prog.launch(reads=["src"], writes=["x"])  # x.copy_(src) on the side stream
        prog.stream = S1
        prog.wait_stream(S1, S2, 3)
        g.replay()
        return prog.check()

    r = rest(False)
    assert {h["kind"] for h in r.hazards} == {"data-race"}, r.to_text()
    assert r.hazards[0]["buffer"] == "x"
    prog.lines = before
    assert rest(True).errors == 0


def test_static_output_read_on_another_stream(prog):
    prog.stream = S1
    prog.alloc("x")
    prog.launch(writes=["x"])
    g = CUDAGraph()
    with prog.graph(CAP)(g):
        prog.alloc("y", addr=1 << 40)
        prog.launch(reads=["x"], writes=["y"])
    g.replay()
    before = prog.lines[:]
    prog.stream = S2
    prog.alloc("z")
    prog.launch(reads=["y"], writes=["z"])
    r = prog.check()
    assert [(h["kind"], h["buffer"]) for h in r.hazards] == [("data-race", "y")], r.to_text()
    prog.lines = before
    prog.wait_stream(S2, S1, 1)
    prog.stream = S2
    prog.alloc("z")
    prog.launch(reads=["y"], writes=["z"])
    assert prog.check().errors == 0


def _fork_join(prog, fixed):
    prog.stream = S1
    prog.alloc("x")
    prog.alloc("y")
    prog.launch(writes=["x", "y"])
    g = CUDAGraph()
    with prog.graph(CAP)(g):
        prog.wait_stream(S2, CAP, 1)  # side.wait_stream(capture stream): s2 joins the capture
        prog.stream = S2
        prog.launch(reads=["x"], writes=["y"])
        prog.stream = CAP
        if fixed:
            prog.wait_stream(CAP, S2, 2)
        prog.alloc("out", addr=1 << 40)
        prog.launch(reads=["y"], writes=["out"])
        if not fixed:
            prog.wait_stream(CAP, S2, 2)
    g.replay()
    return prog.check()


def test_fork_join_inside_a_capture(prog):
    r = _fork_join(prog, False)
    assert [(h["kind"], h["buffer"]) for h in r.hazards] == [("data-race", "y")], r.to_text()
    assert r.hazards[0]["op"] == len(prog.lines) - 1  # reported at the replay
    prog.lines = []
    assert _fork_join(prog, True).errors == 0


def _temp_freed(prog, fixed):
    prog.stream = S1
    prog.alloc("x")
    prog.launch(writes=["x"])
    g = CUDAGraph()
    with prog.graph(CAP)(g):
        prog.alloc("t", addr=1 << 40)
        prog.launch(reads=["x"], writes=["t"])
        prog.wait_stream(S2, CAP, 1)
        prog.stream = S2
        prog.alloc("y", addr=(1 << 40) + MB4)
        prog.launch(reads=["t"], writes=["y"])
        prog.stream = CAP
        if fixed:
            prog.record_stream("t", S2)
        prog.free("t")
        # without record_stream, the pool hands t's block out again in this capture
        prog.alloc("u", addr=(1 << 40) + (2 * MB4 if fixed else 0))
        prog.launch(writes=["u"])
        prog.wait_stream(CAP, S2, 2)
    g.replay()
    return prog.check()


def test_temporary_freed_in_capture_without_record_stream(prog):
    r = _temp_freed(prog, False)
    assert [(h["kind"], h["buffer"]) for h in r.hazards] == [("reuse-race", "u")], r.to_text()
    prog.lines = []
    assert _temp_freed(prog, True).errors == 0


def test_one_graph_back_to_back_on_two_streams_is_clean(prog):
    prog.stream = S1
    prog.alloc("acc")
    prog.launch(writes=["acc"])
    g = CUDAGraph()
    with prog.graph(CAP)(g):
        prog.alloc("tmp", addr=1 << 40)
        prog.launch(reads=["acc"], writes=["tmp"])
        prog.launch(reads=["tmp"], writes=["acc"])
        prog.free("tmp")
    g.replay()
    prog.stream = S2
    g.replay()
    prog.stream = S1
    prog.wait_stream(S1, S2, 1)
    prog.launch(reads=["acc"])
    r = prog.check()
    assert r.errors == 0, r.to_text()


def test_replay_of_a_graph_captured_before_the_check(prog):
    prog.on = False
    g = CUDAGraph()
    g.capture_begin()
    g.capture_end()
    prog.on = True
    prog.stream = S1
    g.replay()
    assert g.calls[-1] == "replay"
    assert prog.ops_of("graph_launch") == []
    assert [k for k, _ in prog.warnings] == ["graph-replay-outside"]
    assert prog.check().errors == 0


def test_replay_of_an_unknown_graph_asks_cuda_nothing():
    """A replay of a graph whose capture the check did not see (cudagraph trees' graphs, captured
    in an earlier check) is warned about once per check, without asking for the current stream
    or whether it captures (CUDA calls at every replay) and without looking the graph up in the
    check's table; a recorded graph's replay asks both."""
    asked: list = []
    ops = _graphs.GraphOps(lambda partial: None, lambda raw, device: '"s"', lambda key, message: asked.append(key))
    looked_up: list = []
    get = ops._get
    ops._get = lambda graph: looked_up.append(graph) or get(graph)
    # The wrapper's own test of the check's ids: an unknown graph's replay calls neither.
    slow: list = []
    ops.knows = lambda g: slow.append("knows") or _graphs.GraphOps.knows(ops, g)
    ops.replay = lambda *a, **k: slow.append("replay") or _graphs.GraphOps.replay(ops, *a, **k)
    on = [False]

    def stream():
        asked.append("stream")
        return (S1, 0)

    def capturing():
        asked.append("capturing")
        return False

    patches = _Patches()
    for attr, make in _graphs.make_wrappers(lambda: ops if on[0] else None, stream, ops.warn, capturing).items():
        patches.patch_inherited(CUDAGraph, attr, make)
    try:
        before = CUDAGraph()
        before.capture_begin()
        before.capture_end()
        on[0] = True
        before.replay()
        before.replay()
        assert asked == ["graph-replay-outside"]
        assert looked_up == []
        assert slow == []
        asked.clear()
        seen = CUDAGraph()
        seen.capture_begin()
        seen.capture_end()
        looked_up.clear()
        seen.replay()
        assert asked == ["stream", "stream", "capturing"]  # the capture's stream, then the replay's
        assert looked_up[:1] == [seen]
        assert slow == ["knows", "replay"]
        before.replay()  # still not known, still said once
        assert asked == ["stream", "stream", "capturing"]
        # An id the table has seen, taken by another object (its graph gone): looked up, not known.
        ops.ids.add(id(before))
        looked_up.clear()
        before.replay()
        assert looked_up and looked_up[0] is before
        assert asked == ["stream", "stream", "capturing"]
    finally:
        patches.restore()


def test_capture_begun_before_the_check_is_not_ended_in_it(prog):
    prog.on = False
    g = CUDAGraph()
    g.capture_begin()
    prog.on = True
    g.capture_end()
    assert prog.lines == []
    assert [k for k, _ in prog.warnings] == ["graph-capture-outside"]


def test_reset_then_capture_again_is_a_new_graph(prog):
    prog.stream = S1
    g = CUDAGraph()
    for _ in range(2):
        with prog.graph(CAP)(g):
            prog.launch()
        g.replay()
        g.reset()
    assert [op["graph"] for op in prog.ops_of("graph_launch")] == ["graph 1", "graph 2"]
    assert prog.check().errors == 0


def test_failed_capture_end_raises_and_writes_no_graph_end(prog):
    g = CUDAGraph()
    g.fail_end = True
    with pytest.raises(RuntimeError, match="not permitted"):
        with prog.graph(CAP)(g):
            prog.launch()
    assert prog.ops_of("graph_end") == []
    assert [k for k, _ in prog.warnings] == ["graph-capture-failed"]
    assert not prog.ops.capturing


def test_recording_failure_is_a_warning_not_an_error(prog):
    def broken(raw, device):
        raise KeyError("no such stream")

    prog.ops.stream_id = broken
    g = CUDAGraph()
    with prog.graph(CAP)(g):
        pass
    g.replay()
    assert g.calls == ["capture_begin", "capture_end", "replay"]
    assert {k for k, _ in prog.warnings} <= {"graph-error", "graph-capture-outside", "graph-replay-outside"}
    assert "graph-error" in {k for k, _ in prog.warnings}


def test_replay_inside_a_capture_is_not_a_launch(prog):
    """A replay on a capturing stream becomes a node of the graph being captured (a launch on a
    capturing stream is bad input in the trace format): not written, and a warning says so."""
    prog.stream = S1
    inner, outer = CUDAGraph(), CUDAGraph()
    with prog.graph(CAP)(inner):
        prog.launch()
    with prog.graph(0xCB)(outer):
        inner.replay()
    assert inner.calls == ["capture_begin", "capture_end", "replay"]
    assert prog.ops_of("graph_launch") == []
    assert [k for k, _ in prog.warnings] == ["graph-replay-in-capture"]
    assert prog.check().errors == 0


def test_torch_cuda_graph_is_wrapped_while_a_check_runs():
    """With torch installed (any device): the recorder wraps the methods this torch's
    torch.cuda.CUDAGraph has, and puts the originals back."""
    from conftest import torch_or_skip

    torch = torch_or_skip()
    from streamsan.torch import _recorder

    G = getattr(torch.cuda, "CUDAGraph", None)
    if G is None or not callable(getattr(G, "replay", None)):
        pytest.skip("this torch has no CUDA graphs")

    class Rec:
        on = True
        graphs = None
        backend = None
        graph_hooks_missing: list = []

        def warn(self, key, message):
            raise AssertionError(message)

        def device(self):
            return 0

    before = {m: G.__dict__.get(m) for m in ("capture_begin", "capture_end", "capture_end_pre", "replay", "reset")}
    p = _recorder._Patches()
    rec = Rec()
    _recorder._install_graph_patches(rec, p, torch)
    assert rec.graph_hooks_missing == []
    for m in ("capture_begin", "capture_end", "replay", "reset"):
        assert G.__dict__.get(m) is not None and G.__dict__.get(m) is not before[m], m
        assert G.__dict__[m].__name__ == m
    p.restore()
    assert {m: G.__dict__.get(m) for m in before} == before
    assert _graphs.pool_key(torch.cuda.graph_pool_handle()) is not None


@pytest.mark.parametrize("backend", ["python", "native"])
def test_real_ops_in_a_capture_through_the_recorder(backend):
    """The recorder's backends (CPU tensors standing for device memory, as in
    test_recorder_cpu.py) with the graph wrappers on the fake CUDAGraph: a capture whose stream
    reads what a forked stream writes before joining it. The replay is reported, at the
    `replay()` line of this file; with the join first, nothing is."""
    from conftest import torch_or_skip

    torch_or_skip()
    import torch

    import streamsan.torch
    from test_recorder_cpu import Fake

    if backend == "native":
        from conftest import native_ext_or_skip

        native_ext_or_skip()

    def run_once(fixed: bool):
        run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True)
        cur = [0]
        with run:
            f = Fake(run)
            rec = run._recorder
            patches = _Patches()
            for attr, make in _graphs.make_wrappers(lambda: rec.graphs, lambda: (cur[0], 0), rec.warn).items():
                patches.patch_inherited(CUDAGraph, attr, make)

            def stream(raw, name=None):
                cur[0] = raw
                f.stream(raw, name)

            try:
                stream(0)
                x = torch.ones(1024)
                y = torch.zeros(1024)
                g = CUDAGraph()
                stream(0xCA, "capture")
                g.capture_begin()
                f.record(1, 0xCA)
                f.wait(0x22, 1)
                stream(0x22, "side")
                torch.mul(x, 2, out=y)
                stream(0xCA)
                if fixed:
                    f.record(2, 0x22)
                    f.wait(0xCA, 2)
                out = y + 1
                if not fixed:
                    f.record(2, 0x22)
                    f.wait(0xCA, 2)
                g.capture_end()
                stream(0)
                g.replay()  # REPLAY
                del out
            finally:
                patches.restore()
        return run

    buggy = run_once(False)
    hazards = buggy.report.hazards
    assert [(h["kind"], h["buffer"]) for h in hazards] == [("data-race", hazards[0]["buffer"])], buggy.report.to_text()
    h = hazards[0]
    with open(__file__) as src:
        replay_line = next(i for i, line in enumerate(src, 1) if line.rstrip().endswith("# REPLAY"))
    assert h["access"]["site"].endswith(f"test_graphs_recorder.py:{replay_line}"), h
    assert "captured" in h["access"] and h["access"]["participant"].endswith("/capture")
    assert run_once(True).report.errors == 0


@pytest.mark.parametrize("backend", ["python", "native"])
def test_a_checks_graph_ops_are_made_when_first_read(backend):
    """A check makes the GraphOps of its graph ops when they are first read (most checks have
    none): one, whichever thread reads it first, writing on the check's backend."""
    import threading

    from conftest import torch_or_skip

    torch_or_skip()
    import streamsan.torch

    if backend == "native":
        from conftest import native_ext_or_skip

        native_ext_or_skip()
    run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True)
    with run:
        rec = run._recorder
        assert "graphs" not in vars(rec)
        seen = []
        threads = [threading.Thread(target=lambda: seen.append(rec.graphs)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(seen) == 4 and all(ops is seen[0] for ops in seen)
        assert vars(rec)["graphs"] is seen[0] and rec.graphs is seen[0]
        assert seen[0].stream_id == rec.backend.stream_id and seen[0].warn is rec.warn
    with pytest.raises(AttributeError, match="no attribute 'no_such_attribute'"):
        rec.no_such_attribute


def test_graphs_are_named_after_their_capture_site():
    lines: list[str] = []
    sites = iter(["train.py:42", "train.py:42", None, "eval.py:7"])
    ops = _graphs.GraphOps(lambda p: lines.append(p + "}"), lambda raw, dev: '"s"', lambda k, m: None,
                           lambda: next(sites))
    gs = [CUDAGraph() for _ in range(4)]
    for g in gs:
        ops.capture_begin(g, None, 1, 0)
    begins = [json.loads(line) for line in lines]
    assert [b["graph"] for b in begins] == ["graph train.py:42", "graph train.py:42#2", "graph 3", "graph eval.py:7"]
    assert [b["pool"] for b in begins] == ["pool of " + b["graph"] for b in begins]


def _native_run_or_skip(**kw):
    from conftest import native_ext_or_skip

    native_ext_or_skip()
    import streamsan.torch

    return streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True, **kw)


def test_native_pool_allocations_outside_a_capture_name_their_pool(tmp_path):
    """The C++ recorder's tracker sees which pool each allocation comes from. Inside a recorded
    capture the checker puts it in the capture's pool; outside one (cudagraph trees' warm-up under
    `_use_cuda_memory_pool_manager`, `torch.cuda.use_mem_pool`) the `alloc` names its pool: a
    graph_pool_handle() seen first in an allocation is "pool (A, B)", and a later capture given
    the same handle captures into that same pool; a pool the graph recorder named first keeps
    its name."""
    path = tmp_path / "t.jsonl"
    run = _native_run_or_skip(trace=path)
    with run:
        b, ops = run._recorder.backend, run._recorder.graphs
        b.fake_trace(True, 1 << 40, 4096, 0xCB, pool=(0, 7))  # warm-up: before any capture
        g = CUDAGraph()
        ops.capture_begin(g, (0, 7), 0xCA, 0)  # a capture given the same handle
        b.fake_trace(True, 2 << 40, 4096, 0xCA, pool=(0, 7))  # in the capture: the checker's
        g.capture_end()
        ops.capture_end(g, g.pool())
        h = CUDAGraph()
        ops.capture_begin(h, (0, 9), 0xCA, 0)  # a handle the graph recorder names first
        h.capture_end()
        ops.capture_end(h, h.pool())
        b.fake_trace(True, 3 << 40, 4096, 0xCB, pool=(0, 9))
        b.fake_trace(True, 4 << 40, 4096, 0xCB)  # plain
        assert run.stats()["recorder_pool_allocations_outside_capture"] == 2
    assert run.report.errors == 0, run.report.to_text()
    allocs = [json.loads(x) for x in path.read_text().splitlines() if '"alloc"' in x]
    begins = [json.loads(x) for x in path.read_text().splitlines() if '"graph_begin"' in x]
    assert [a.get("pool") for a in allocs] == ["pool (0, 7)", None, "pool 1", None]
    assert [x["pool"] for x in begins] == ["pool (0, 7)", "pool 1"]


def test_native_warm_up_frees_into_their_pool_are_not_unsafe(tmp_path):
    """A pool buffer allocated outside a capture (cudagraph trees' warm-up) and read by another
    stream goes back to its pool when freed, not to its stream: only a later allocation in that
    pool can take it, and that reuse is what is checked. The same program with a plain
    allocation is an unsafe free (the block goes back to the owning stream, which has not
    waited for the reader)."""
    from conftest import torch_or_skip

    torch = torch_or_skip()
    verdicts = {}
    for pool in ((0, 7), (0, 0)):
        run = _native_run_or_skip(trace=tmp_path / f"t{pool[1]}.jsonl")
        with run:
            ext = run._recorder.backend.ext
            ext.set_active(False)
            t = torch.ones(1024)
            ext.set_active(True)
            base = t.untyped_storage().data_ptr()
            ext.set_fake_stream(0xCB)
            run._recorder.backend.fake_trace(True, base, t.untyped_storage().nbytes(), 0xCB, pool=pool)
            ext.set_fake_stream(0xCC)
            t.sum()  # another stream reads it, unordered with the owner
            run._recorder.backend.fake_trace(False, base, 0, 0xCB)
        verdicts[pool] = sorted(h["kind"] for h in run.report.hazards)
    assert verdicts == {(0, 7): [], (0, 0): ["unsafe-free"]}, verdicts
