"""CUDA graphs recorded on a GPU, by both recorders: the graph ops of `torch.cuda.graph`,
`pool=` sharing, `make_graphed_callables`, and a graph captured before the check. (The graph
programs of programs.py, buggy and fixed, are in test_gpu_programs.py.)"""

from __future__ import annotations

import json
import os
import warnings

import pytest

pytestmark = pytest.mark.gpu

BACKENDS = [b for b in os.environ.get("STREAMSAN_TEST_BACKEND", "native,python").split(",") if b]
N = 1 << 16


@pytest.fixture(autouse=True)
def _warm(request):
    """The kernels the captures use, run once outside a capture (programs._warmup)."""
    if request.node.get_closest_marker("gpu") is not None:
        import sys

        try:
            import torch
        except Exception:
            return
        if not torch.cuda.is_available():
            return
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import programs

        programs._warmup()


def _ops(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_capture_and_replay_are_graph_ops(gpu, tmp_path, backend):
    import streamsan.torch

    torch = gpu
    path = tmp_path / "g.jsonl"
    with streamsan.torch.check(raise_on_hazard=False, trace=path, backend=backend) as run:
        x = torch.full((N,), 2.0, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 3
            e = torch.empty(N, device="cuda")  # allocated in the capture, first used after it
        e.fill_(1.0)
        g.replay()
        g.replay()
        torch.cuda.synchronize()
        assert bool((y == 6).all())
    assert run.backend == backend
    assert run.report.errors == 0, run.report.to_text()
    ops = _ops(path)
    kinds = [o["op"] for o in ops]
    b, e_ = kinds.index("graph_begin"), kinds.index("graph_end")
    begin = ops[b]
    assert begin["graph"] == ops[e_]["graph"] and begin["stream"] != "default" and begin["pool"]
    in_capture = [o for o in ops[b:e_] if o["op"] == "alloc"]
    assert len(in_capture) >= 2 and all(o["stream"] == begin["stream"] for o in in_capture)
    assert any(o["op"] == "launch" and o["stream"] == begin["stream"] for o in ops[b:e_])
    launches = [o for o in ops if o["op"] == "graph_launch"]
    assert [o["graph"] for o in launches] == [begin["graph"]] * 2
    assert all(o["stream"] == "default" for o in launches)
    assert streamsan.check_trace(path).hazards == run.report.hazards


@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_sharing_names_one_pool(gpu, tmp_path, backend):
    import streamsan.torch

    torch = gpu
    path = tmp_path / "pools.jsonl"
    with streamsan.torch.check(raise_on_hazard=False, trace=path, backend=backend) as run:
        x = torch.ones(N, device="cuda")
        handle = torch.cuda.graph_pool_handle()
        gs = [torch.cuda.CUDAGraph() for _ in range(4)]
        outs = []
        for i, g in enumerate(gs):
            pool = handle if i < 2 else (gs[2].pool() if i == 3 else None)
            with torch.cuda.graph(g, pool=pool):
                outs.append(x * (i + 1))
        for g in gs:
            g.replay()
        torch.cuda.synchronize()
    assert run.report.errors == 0, run.report.to_text()
    pools = [o["pool"] for o in _ops(path) if o["op"] == "graph_begin"]
    assert len(pools) == 4
    assert pools[0] == pools[1] and pools[2] == pools[3] and pools[0] != pools[2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dropped_graphs_pool_memory_goes_to_the_next_capture(gpu, tmp_path, backend):
    """A graph dropped, then another captured in the same check: the capture's start empties
    PyTorch's cache (`torch.cuda.graph.__enter__` calls `empty_cache`), which frees the dropped
    graph's pool segments, and the new capture's allocations get their addresses back from the
    driver. The check takes that for memory that came back (the device synchronized), not for
    two pools holding the same bytes (a TraceError before), and finds nothing."""
    import gc

    import streamsan.torch

    torch = gpu
    path = tmp_path / "again.jsonl"
    side = torch.cuda.Stream()
    with streamsan.torch.check(raise_on_hazard=False, trace=path, backend=backend) as run:
        x = torch.full((N,), 2.0, device="cuda")
        results = []
        for k in range(3):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = (x * (k + 1)).sin() + 1  # temporaries and an output in the graph's pool
            g.replay()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                results.append(y.sum())
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            del g, y  # the graph and its pool's last tensor gone: the pool is freeable
            gc.collect()
        want = [((x * (k + 1)).sin() + 1).sum() for k in range(3)]
        assert all(bool(torch.isclose(a, b)) for a, b in zip(results, want))
    assert run.report.errors == 0, run.report.to_text()
    begins = [o for o in _ops(path) if o["op"] == "graph_begin"]
    assert len(begins) == 3 and len({o["pool"] for o in begins}) == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_make_graphed_callables_is_recorded(gpu, tmp_path, backend):
    import streamsan.torch

    torch = gpu
    path = tmp_path / "mgc.jsonl"
    with streamsan.torch.check(raise_on_hazard=False, trace=path, backend=backend) as run:
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sample = torch.randn(16, 64, device="cuda")
        graphed = torch.cuda.make_graphed_callables(model, (sample,))
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            out = graphed(torch.randn(16, 64, device="cuda"))
            out.square().mean().backward()
            opt.step()
        torch.cuda.synchronize()
    ops = _ops(path)
    begins = [o for o in ops if o["op"] == "graph_begin"]
    assert len(begins) == 2  # forward and backward, into one pool
    assert begins[0]["pool"] == begins[1]["pool"]
    launches = [o["graph"] for o in ops if o["op"] == "graph_launch"]
    assert sorted(set(launches)) == sorted(b["graph"] for b in begins)
    assert len(launches) == 6
    assert run.report.errors == 0, run.report.to_text()


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_captured_before_the_check_warns(gpu, backend):
    import streamsan.torch

    torch = gpu
    x = torch.ones(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x + 1
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with streamsan.torch.check(raise_on_hazard=False, backend=backend) as run:
            g.replay()
            torch.cuda.synchronize()
    assert any("captured before the check" in str(m.message) for m in w)
    assert run.report.errors == 0
    assert bool((y == 2).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_check_begun_inside_a_capture_is_refused(gpu, backend):
    """A check entered inside `torch.cuda.graph` is refused (its captured work would be recorded
    as if it ran), the capture goes on unharmed, and a check begun after it sees its replays."""
    import streamsan.torch

    torch = gpu
    x = torch.ones(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        with pytest.raises(RuntimeError, match="capturing a CUDA graph"):
            with streamsan.torch.check(backend=backend):
                pytest.fail("the block ran")
        y = x * 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph was captured before the check
        with streamsan.torch.check(raise_on_hazard=False, backend=backend) as run:
            g.replay()
            torch.cuda.synchronize()
    assert run.report.errors == 0
    assert bool((y == 5).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_patches_are_removed_after_the_check(gpu, backend):
    import streamsan.torch

    torch = gpu
    before = {m: torch.cuda.CUDAGraph.__dict__.get(m) for m in ("capture_begin", "capture_end", "replay", "reset")}
    with streamsan.torch.check(raise_on_hazard=False, backend=backend):
        assert torch.cuda.CUDAGraph.__dict__.get("replay") is not before["replay"]
    after = {m: torch.cuda.CUDAGraph.__dict__.get(m) for m in before}
    assert after == before
