"""The C++ recorder's quiet callees (STREAMSAN_CALLEES=learn; docs/pytorch.md, "Quiet callees"):
an aten op recorded in full, once learned to issue nothing but device work on its own stream,
runs with RecordFunction off for its callees. On the CPU (fake device: CPU tensors stand for device
memory; host ops are pushed as c10's GPU trace would)."""

from __future__ import annotations

import json
import warnings

import pytest

from conftest import native_ext_or_skip, torch_or_skip


def _check(monkeypatch, tmp_path, callees: str, body, name: str):
    """`body(run)` checked with STREAMSAN_CALLEES=`callees`: the run, its trace's ops and the
    recorder's counters at the end."""
    native_ext_or_skip()
    import streamsan.torch

    monkeypatch.setenv("STREAMSAN_CALLEES", callees)
    path = tmp_path / f"{name}.jsonl"
    run = streamsan.torch.Run(raise_on_hazard=False, backend="native", trace=path, _fake_device=True)
    with run:
        body(run)
        counters = run._recorder.backend.ext.counters()
    ops = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return run, ops, counters


def _launches(ops, name):
    return [o for o in ops if o["op"] == "launch" and o["name"] == name]


def _hazards(run):
    return sorted((h["kind"], h["access"]["site"]) for h in run.report.hazards)


def _two_streams(rounds: int):
    """A side stream reads what the default stream wrote, `rounds` times, without a wait in the
    last round: `mean` (whose callees are `sum` and `div_`) on the side stream races there."""

    def body(run):
        import torch

        ext = run._recorder.backend.ext
        ext.set_fake_stream(0)
        x = torch.ones(256, 64)
        out = []
        for i in range(rounds):
            ext.set_fake_stream(0)
            x.mul_(1.0)
            if i < rounds - 1:
                ext.fake_gpu_trace("record", 0xE0 + i, 0)
                ext.fake_gpu_trace("wait", 0xE0 + i, 2)
            ext.set_fake_stream(2)
            out.append(x.mean(dim=1))  # RACE in the last round
        return out

    return body


def test_an_op_learned_to_need_nothing_of_its_callees_runs_them_unobserved(monkeypatch, tmp_path):
    """`mean` is observed whole the first time (its `sum` and `div_` written), then quiet: one
    launch of its own, reading and writing what its callees did. The hazards are the same as with
    every op observed."""
    torch_or_skip()
    every, every_ops, every_counters = _check(monkeypatch, tmp_path, "all", _two_streams(6), "all")
    learned, learned_ops, counters = _check(monkeypatch, tmp_path, "learn", _two_streams(6), "learn")
    assert every_counters["quiet_ops"] == 0
    assert counters["quiet_ops"] >= 5, counters
    # Every op observed: mean writes nothing of its own, its callees do, six times.
    assert not _launches(every_ops, "aten::mean") and len(_launches(every_ops, "aten::sum")) == 6
    # Learned (in the check above: what is learned holds for the process): each mean is written
    # whole, once, on the side stream, reading and writing what its callees did.
    means = _launches(learned_ops, "aten::mean")
    assert len(means) == 6 and not _launches(learned_ops, "aten::sum"), [o.get("name") for o in learned_ops]
    assert {m["stream"] for m in means} == {s["stream"] for s in _launches(every_ops, "aten::sum")}
    assert all(m["reads"] and m["writes"] for m in means)
    assert every.report.errors >= 1
    assert _hazards(learned) == _hazards(every)


def test_an_op_with_a_host_op_inside_keeps_its_callees_observed(monkeypatch, tmp_path):
    """An aten op whose kernel synchronizes between the ops it calls (here `logit`'s, replaced
    by one that does) is never quiet: each of its callees and its sync are written in their
    place, as with every op observed."""
    torch = torch_or_skip()
    ext = native_ext_or_skip()
    if not ext.native_syncs() and not torch.cuda.is_available():
        # The sync is faked through c10's GPU trace: the recorder's own (native syncs), or
        # Python's callbacks, which are registered only where CUDA is.
        pytest.skip("this torch's GPU trace is recorded through Python's callbacks, and there is no CUDA")

    def logit(x, eps=None):
        import streamsan.torch._recorder as recorder

        first = torch.ops.aten.sigmoid.default(x)
        recorder._active.backend.ext.fake_gpu_trace("event_sync", 0xF0, 0)  # between its two kernels
        return torch.ops.aten.sub.Tensor(first, x)

    def body(run):
        ext = run._recorder.backend.ext
        ext.set_fake_stream(0)
        x = torch.ones(64)
        ext.fake_gpu_trace("record", 0xF0, 0)
        return [torch.logit(x) for _ in range(4)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overriding a kernel that aten registered
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("logit", logit, "CPU")
    try:
        _, every_ops, _ = _check(monkeypatch, tmp_path, "all", body, "all")
        _, learned_ops, counters = _check(monkeypatch, tmp_path, "learn", body, "learn")
    finally:
        lib._destroy()
    assert not _launches(learned_ops, "aten::logit")  # never written whole
    kinds = [(o["op"], o.get("name")) for o in learned_ops if o["op"] in ("launch", "event_sync")]
    assert kinds == [(o["op"], o.get("name")) for o in every_ops if o["op"] in ("launch", "event_sync")]
    # The sync sits between the sigmoid and the subtraction of each call.
    assert kinds[1:4] == [("launch", "aten::sigmoid"), ("event_sync", None), ("launch", "aten::sub")], kinds


def test_an_op_with_an_integer_input_keeps_its_callees_observed(monkeypatch, tmp_path):
    """Masks, indices and counts are the inputs of the ops that synchronize to learn their
    output's shape: an op given one is never quiet."""
    torch = torch_or_skip()

    def body(run):
        run._recorder.backend.ext.set_fake_stream(0)
        x = torch.ones(64, 8)
        idx = torch.arange(64) % 7
        return [torch.nn.functional.embedding_bag(idx, x, torch.tensor([0, 32])) for _ in range(4)]

    _, every_ops, _ = _check(monkeypatch, tmp_path, "all", body, "all")
    _, learned_ops, _ = _check(monkeypatch, tmp_path, "learn", body, "int")
    names = [o.get("name") for o in learned_ops if o["op"] == "launch"]
    assert "aten::embedding_bag" not in names and "aten::_embedding_bag_forward_only" in names
    assert names == [o.get("name") for o in every_ops if o["op"] == "launch"]


def test_under_autocast_no_op_is_quiet(monkeypatch, tmp_path):
    """Autocast keeps the casts of an op's arguments for its later calls (memory the op reads
    that is neither its argument nor its temporary): under it every op is observed."""
    torch = torch_or_skip()

    def body(run):
        run._recorder.backend.ext.set_fake_stream(0)
        x = torch.ones(256, 64)
        x.mean(dim=1)  # learned outside autocast
        x.mean(dim=1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return [x.mean(dim=1) for _ in range(3)]

    _, ops, _ = _check(monkeypatch, tmp_path, "learn", body, "autocast")
    names = [o.get("name") for o in ops if o["op"] == "launch"]
    # Outside autocast the second mean is quiet (written whole; the first too where an earlier
    # check of this process learned it); the three inside are not.
    assert 1 <= names.count("aten::mean") <= 2 and names.count("aten::sum") >= 3, names


def test_by_default_every_op_is_observed(monkeypatch, tmp_path):
    torch = torch_or_skip()
    native_ext_or_skip()
    import streamsan.torch

    monkeypatch.delenv("STREAMSAN_CALLEES", raising=False)
    run = streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True)
    with run:
        run._recorder.backend.ext.set_fake_stream(0)
        x = torch.ones(256, 64)
        for _ in range(4):
            x.mean(dim=1)
        counters = run._recorder.backend.ext.counters()
    assert counters["quiet_ops"] == 0


def test_under_saved_tensor_hooks_no_op_is_quiet(monkeypatch, tmp_path):
    """A pack hook runs inside the op that saves the tensor (an offloading one copies it on a
    stream of its own): under saved-tensor hooks every op is observed."""
    torch = torch_or_skip()
    w = torch.ones(64, 64, requires_grad=True)

    def body(run):
        run._recorder.backend.ext.set_fake_stream(0)
        x = torch.ones(256, 64)
        (x @ w).mean(dim=1)  # learned outside the hooks
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
            return [(x @ w).mean(dim=1) for _ in range(3)]

    _, ops, counters = _check(monkeypatch, tmp_path, "learn", body, "hooks")
    names = [o.get("name") for o in ops if o["op"] == "launch"]
    assert names.count("aten::mean") <= 1 and names.count("aten::sum") >= 3, names


@pytest.mark.parametrize("callees", ["all", "learn"])
def test_the_mlp_step_is_checked_the_same_with_callees_quiet(monkeypatch, tmp_path, callees):
    """Training steps of an MLP (linear, relu, mse, backward, SGD): the same report either way."""
    torch = torch_or_skip()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(16, 32)

    def body(run):
        run._recorder.backend.ext.set_fake_stream(0)
        for _ in range(4):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(data), torch.zeros(16, 8)).backward()
            opt.step()

    run, ops, counters = _check(monkeypatch, tmp_path, callees, body, callees)
    assert run.report.errors == 0
    assert (counters["quiet_ops"] > 0) == (callees == "learn"), counters
    assert sum(o["op"] == "launch" for o in ops) > 0
