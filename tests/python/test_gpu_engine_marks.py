"""The autograd engine's marks on a GPU (docs/pytorch.md, "What is seen"): when a backward node
on one stream hands a gradient to a node on another, the engine makes the consumer's stream wait
for the producer's and marks the gradient used on the consumer's stream
(`recordDataPtrOnStream`, torch/csrc/autograd/input_buffer.cpp), so the caching allocator keeps
its block until that stream's work is done. Freeing it then is no hazard: the C++ recorder sees
the mark (a `record_stream` op) and reports nothing; FSDP1's backward is this shape."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu


def _native_marks_or_skip(torch) -> None:
    if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) != (2, 11):
        pytest.skip("the C++ recorder sees the engine's marks with torch 2.11 only")


def _first_used_on_a_side_stream(torch, n: int):
    """A leaf `x` and `x * 2` made on a side stream that waited for it (the side stream is that
    product's backward node's, and x's AccumulateGrad's): (x, x * 2, the side stream)."""
    x = torch.randn(n, device="cuda", requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        h = x * 2
    return x, h, side


def _backward_across_streams(torch, n: int):
    """`x * 2` on a side stream (its backward node runs there), `(h * h).sum()` on the default
    stream: the backward makes h's gradient on the default stream and hands it to the side
    stream's node, which reads it; the engine frees it after that node is issued."""
    x, h, side = _first_used_on_a_side_stream(torch, n)
    torch.cuda.current_stream().wait_stream(side)
    (h * h).sum().backward()
    torch.cuda.synchronize()
    return x, x.grad


def test_a_gradient_handed_to_a_node_on_another_stream_is_marked_used_there(gpu, tmp_path):
    import streamsan.torch

    torch = gpu
    _native_marks_or_skip(torch)
    path = tmp_path / "t.jsonl"
    with streamsan.torch.check(raise_on_hazard=False, trace=path, backend="native") as run:
        x, grad = _backward_across_streams(torch, 1 << 20)
        spy = run.stats()["recorder_guard_spy"]
    assert spy is True
    assert torch.allclose(grad, 8 * x.detach())
    ops = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    marks = [o for o in ops if o["op"] == "record_stream"]
    assert marks and all(o["stream"] != "default" for o in marks), marks
    assert run.report.hazards == [], run.report.to_text()


def _gradients_summed_across_streams(torch, n: int):
    """`x` first used on a side stream (`b = x * 2`: x's AccumulateGrad takes that stream), then
    on the default stream (`a = x * 3`). The backward runs `a`'s node first (made later), on the
    default stream, then `b`'s on the side stream, and sums the two gradients of `x` on the side
    stream (the consumer's) after marking the default stream's one used there; with
    `create_graph=True` the sum is a new tensor and the default stream's gradient is freed."""
    x, b, side = _first_used_on_a_side_stream(torch, n)
    torch.cuda.current_stream().wait_stream(side)
    a = x * 3
    (a + b).sum().backward(create_graph=True)
    torch.cuda.synchronize()
    return x, x.grad.detach()


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_gradient_summed_on_another_stream_is_marked_used_there(gpu, tmp_path, backend):
    """The engine's sum of two gradients made on two streams (`InputBuffer::add`, the Nth
    producer) marks the one made on the other stream used on the summing stream before the sum,
    and the free of it after is no hazard: both recorders write the mark (the Python recorder
    from the `add` it sees right after the producer's node, see _EngineMarks), before its free."""
    import streamsan.torch

    torch = gpu
    if backend == "native":
        _native_marks_or_skip(torch)
    path = tmp_path / "t.jsonl"
    with streamsan.torch.check(raise_on_hazard=False, trace=path, backend=backend) as run:
        x, grad = _gradients_summed_across_streams(torch, 1 << 20)
    assert torch.allclose(grad, torch.full_like(grad, 5.0))
    ops = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    # The sum: the side stream's `add` of a gradient the default stream made (`a`'s node's).
    made = {w["buffer"] for o in ops if o["op"] == "launch" and o["stream"] == "default" for w in o.get("writes", [])}
    sums = [(i, r["buffer"]) for i, o in enumerate(ops)
            if o["op"] == "launch" and o["stream"] != "default" and "add" in o["name"]
            for r in o.get("reads", []) if r["buffer"] in made]
    assert sums, [o for o in ops if o["op"] == "launch"]
    at, summed = sums[0]
    marks = [i for i, o in enumerate(ops[:at]) if o["op"] == "record_stream" and o["buffer"] == summed
             and o["stream"] == ops[at]["stream"]]
    assert marks, [o for o in ops if o["op"] == "record_stream"]
    assert run.report.hazards == [], run.report.to_text()


def _residual_across_streams(torch, n: int):
    """A residual `h + f(h)` whose `f` runs on a side stream (its backward nodes run there):
    AddBackward0 hands one gradient to `h`'s node and to `f`'s last node; `f`'s first node makes
    its gradient for `h` on the side stream, and the engine sums the two in `h`'s input buffer on
    the default stream (the consumer's) after marking the side stream's one used there, which
    it then drops."""
    x = torch.randn(n, device="cuda", requires_grad=True)
    h = x * 1
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        b = (h * 2) * 3
    torch.cuda.current_stream().wait_stream(side)
    (h + b).sum().backward()
    torch.cuda.synchronize()
    return x, x.grad.detach()


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_residuals_gradients_summed_across_streams_are_marked(gpu, tmp_path, backend):
    """The residual's sum (see `_residual_across_streams`): no hazard under either recorder (the
    Python recorder takes the sum for the engine's though `f`'s last node took the residual's
    gradient before it: it is still in `h`'s buffer)."""
    import streamsan.torch

    torch = gpu
    if backend == "native":
        _native_marks_or_skip(torch)
    with streamsan.torch.check(raise_on_hazard=False, backend=backend) as run:
        x, grad = _residual_across_streams(torch, 1 << 20)
    assert torch.allclose(grad, torch.full_like(grad, 7.0))
    assert run.report.hazards == [], run.report.to_text()
