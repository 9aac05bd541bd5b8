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


def _backward_across_streams(torch, n: int):
    """`x * 2` on a side stream (its backward node runs there), `(h * h).sum()` on the default
    stream: the backward makes h's gradient on the default stream and hands it to the side
    stream's node, which reads it; the engine frees it after that node is issued."""
    x = torch.randn(n, device="cuda", requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        h = x * 2
    torch.cuda.current_stream().wait_stream(side)
    (h * h).sum().backward()
    torch.cuda.synchronize()
    return x, x.grad


def test_a_gradient_handed_to_a_node_on_another_stream_is_marked_used_there(gpu, tmp_path):
    import streamsan.torch

    torch = gpu
    if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) != (2, 11):
        pytest.skip("the C++ recorder sees the engine's marks with torch 2.11 only")
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
