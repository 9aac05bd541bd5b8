"""Quiet callees on a GPU (STREAMSAN_CALLEES=learn; docs/pytorch.md, "Quiet callees"): an op
whose callees ran unobserved still writes its temporaries, so a temporary that takes the block
of a tensor freed while another stream reads it is a `reuse-race` at the op's line, as with
every op observed, and the corruption is real."""

from __future__ import annotations

import json

import pytest

from conftest import marked_line

pytestmark = pytest.mark.gpu


def _program(torch, n: int, record: bool):
    """mse_loss (its callees: a subtraction into a temporary, its square, the mean) after a
    tensor the side stream still reads was freed on the default stream (without record_stream
    unless `record`): its temporary takes the freed block. Returns what the side stream summed
    and what it should have."""
    import torch.nn.functional as F

    a = torch.full((n,), 3.0, device="cuda")
    b = torch.full((n,), 1.0, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for _ in range(3):
        F.mse_loss(a, b)  # its callees learned: nothing but device work on its stream
        # Every kernel of the race loaded before it: with CUDA's lazy loading, a kernel's first
        # launch may wait for the device to be idle, the side stream's sleep included, and the
        # side stream's read would then be done before the temporary is written.
        with torch.cuda.stream(side):
            torch.cuda._sleep(1)
            a.sum()
    torch.cuda.synchronize()
    t = torch.full((n,), 1.0, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        total = t.sum()
    if record:
        t.record_stream(side)
    del t  # freed while the side stream has yet to read it
    F.mse_loss(a, b)  # RACE
    torch.cuda.synchronize()
    return float(total), float(n)


@pytest.mark.parametrize("callees", ["learn", "all"])
def test_a_temporary_of_a_quiet_op_reusing_a_block_another_stream_reads_is_reported(gpu, tmp_path, monkeypatch, callees):
    import streamsan.torch

    torch = gpu
    monkeypatch.setenv("STREAMSAN_CALLEES", callees)
    n = 1 << 22
    path = tmp_path / "t.jsonl"
    with streamsan.torch.check(raise_on_hazard=False, trace=path, backend="native") as run:
        got, want = _program(torch, n, record=False)
        quiet = run._recorder.backend.ext.counters()["quiet_ops"]
    races = [h for h in run.report.hazards if h["kind"] == "reuse-race"]
    assert races, run.report.to_text()
    assert {int(h["access"]["site"].rsplit(":", 1)[1]) for h in races} == {marked_line(__file__, "RACE")}, run.report.to_text()
    ops = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    whole = [o for o in ops if o["op"] == "launch" and o["name"] == "aten::mse_loss" and o.get("writes")]
    if callees == "learn":
        assert quiet > 0 and whole, quiet
    assert got != want  # the temporary's writes reached the side stream's read


def test_with_record_stream_the_quiet_op_is_clean(gpu, monkeypatch):
    import streamsan.torch

    torch = gpu
    monkeypatch.setenv("STREAMSAN_CALLEES", "learn")
    with streamsan.torch.check(raise_on_hazard=False, backend="native") as run:
        got, want = _program(torch, 1 << 22, record=True)
    assert run.report.errors == 0, run.report.to_text()
    assert got == want
