"""Triton kernels on a GPU: user `@triton.jit` kernels launched eagerly (both recorders) and
Inductor's kernels of `torch.compile` (the C++ recorder: the Python recorder's dispatch mode makes
Dynamo run compiled frames eagerly), recorded as launches on their stream, each tensor argument
read or written as the kernel's IR (or Inductor) says, at the user's line.

The planted bugs in compiled code, widened, are in realcode_compiled.py (gpu_realcode.sh)."""

from __future__ import annotations

import json
import os

import pytest

from conftest import marked_line

pytestmark = pytest.mark.gpu

BACKENDS = [b for b in os.environ.get("STREAMSAN_TEST_BACKEND", "native,python").split(",") if b]
N = 1 << 16


def _ops(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]



def _site(marker: str) -> str:
    """The site of this file's line that ends in `# marker`, as the recorders write it: the file
    relative to the working directory when it lies under it, else its absolute path."""
    path = os.path.abspath(__file__)
    cwd = os.getcwd().rstrip(os.sep) + os.sep
    shown = path[len(cwd) :] if path.startswith(cwd) else path
    return f"{shown}:{marked_line(__file__, marker)}"


def _triton():
    try:
        import triton
        import triton.language as tl
    except ImportError as e:
        if os.environ.get("STREAMSAN_REQUIRE_GPU") == "1":
            raise
        pytest.skip(f"needs triton ({e})")
    return triton, tl


_KERNELS: dict = {}


def _kernels():
    """(add, scale_, atomic_sum): out = x + y; x *= s in place; acc += sum(x) with an unused
    pointer argument."""
    if not _KERNELS:
        triton, tl = _triton()

        @triton.jit
        def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)

        @triton.jit
        def scale_kernel(x_ptr, s, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) * s, mask=m)

        @triton.jit
        def sum_kernel(x_ptr, acc_ptr, unused_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.atomic_add(acc_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), 0))

        _KERNELS.update(add=add_kernel, scale=scale_kernel, sum=sum_kernel)
    return _KERNELS


def _grid(n: int, block: int = 1024):
    return ((n + block - 1) // block,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_kernels_are_launches_with_the_roles_of_their_ir(gpu, tmp_path, backend):
    import streamsan.torch

    torch = gpu
    k = _kernels()
    x = torch.rand(N, device="cuda")
    y = torch.rand(N, device="cuda")
    out = torch.empty(N, device="cuda")
    acc = torch.zeros(1, device="cuda")
    spare = torch.zeros(4, device="cuda")
    for _ in range(2):  # compiled before the check: the launches are what is recorded
        k["add"][_grid(N)](x, y, out, N, BLOCK=1024)
        k["scale"][_grid(N)](out, 2.0, N, BLOCK=1024)
        k["sum"][_grid(N)](out, acc, spare, N, BLOCK=1024)
    torch.cuda.synchronize()
    path = tmp_path / "t.jsonl"
    with streamsan.torch.check(raise_on_hazard=False, trace=path, backend=backend) as run:
        a = torch.rand(N, device="cuda")
        b = torch.rand(N, device="cuda")
        c = torch.empty(N, device="cuda")
        total = torch.zeros(1, device="cuda")
        k["add"][_grid(N)](a, b, c, N, BLOCK=1024)  # ADD
        k["scale"][_grid(N)](c, 2.0, N, BLOCK=1024)
        k["sum"][_grid(N)](c, total, spare, N, BLOCK=1024)
        torch.cuda.synchronize()
        want = ((a + b) * 2).sum()
        assert torch.allclose(total[0], want, rtol=1e-4)
    assert run.report.errors == 0, run.report.to_text()
    assert run.stats().get("recorder_triton_launches") == 3
    ops = _ops(path)
    names = {}
    for o in ops:
        if o["op"] == "alloc":
            names.setdefault(o["buffer"], o)
    launches = {o["name"]: o for o in ops if o["op"] == "launch" and o.get("name") in ("add_kernel", "scale_kernel", "sum_kernel")}
    assert set(launches) == {"add_kernel", "scale_kernel", "sum_kernel"}, [o.get("name") for o in ops]

    def bufs(o, key):
        return sorted(r["buffer"] for r in o.get(key, []))

    add, scale, sm = launches["add_kernel"], launches["scale_kernel"], launches["sum_kernel"]
    assert len(bufs(add, "reads")) == 2 and len(bufs(add, "writes")) == 1
    c_buf = bufs(add, "writes")[0]
    assert bufs(scale, "writes") == [c_buf] and bufs(scale, "reads") == []  # read + written: written
    assert bufs(sm, "reads") == [c_buf] and len(bufs(sm, "writes")) == 1  # the unused pointer: nothing
    assert add["site"] == _site("ADD")
    assert add["stream"] == "default"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fixed", [False, True])
def test_user_kernel_on_a_side_stream_races_with_a_reader(gpu, backend, fixed):
    import streamsan.torch

    torch = gpu
    k = _kernels()
    side = torch.cuda.Stream()
    x = torch.rand(N, device="cuda")
    out = torch.empty(N, device="cuda")
    k["add"][_grid(N)](x, x, out, N, BLOCK=1024)
    torch.cuda.synchronize()
    with streamsan.torch.check(raise_on_hazard=False, backend=backend) as run:
        a = torch.rand(N, device="cuda")
        c = torch.empty(N, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            k["add"][_grid(N)](a, a, c, N, BLOCK=1024)
        if fixed:
            torch.cuda.current_stream().wait_stream(side)
        s = c.sum()  # READ
        torch.cuda.synchronize()
        float(s)
    if fixed:
        assert run.report.errors == 0, run.report.to_text()
        return
    races = [h for h in run.report.hazards if h["kind"] == "data-race"]
    assert races, run.report.to_text()
    assert races[0]["access"]["site"] == _site("READ")
    assert "add_kernel" in run.report.to_text()


def _compiled(torch):
    if "f" not in _KERNELS:
        _triton()

        def f(x, y):
            return (x * y).sin() + 1

        _KERNELS["f"] = torch.compile(f)
    return _KERNELS["f"]


@pytest.mark.parametrize("fixed", [False, True])
def test_compiled_function_consuming_a_side_stream_tensor(gpu, tmp_path, fixed):
    """Inductor's Triton kernel reads `x` written on a side stream: without the wait it races
    (reported at the line that called the compiled function, the kernel named); with it, clean."""
    import streamsan.torch

    torch = gpu
    f = _compiled(torch)
    side = torch.cuda.Stream()
    x = torch.rand(N, device="cuda")
    y = torch.rand(N, device="cuda")
    f(x, y)  # compiled before the check
    torch.cuda.synchronize()
    path = tmp_path / "t.jsonl"
    with streamsan.torch.check(raise_on_hazard=False, trace=path, backend="native") as run:
        a = torch.empty(N, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            a.copy_(y)
        if fixed:
            torch.cuda.current_stream().wait_stream(side)
        out = f(a, y)  # CALL
        torch.cuda.synchronize()
        assert torch.allclose(out, (y * y).sin() + 1)
    assert run.stats().get("recorder_triton_launches", 0) >= 1
    launches = [o for o in _ops(path) if o["op"] == "launch" and str(o.get("name", "")).startswith("triton_")]
    assert launches, "no Inductor launch recorded"
    assert all(o.get("site") == _site("CALL") for o in launches), launches
    if fixed:
        assert run.report.errors == 0, run.report.to_text()
        return
    races = [h for h in run.report.hazards if h["kind"] == "data-race"]
    assert races, run.report.to_text()
    assert races[0]["access"]["site"] == _site("CALL")
    assert "triton_" in run.report.to_text()
