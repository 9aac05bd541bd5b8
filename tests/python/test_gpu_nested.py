"""Nested tensors on a GPU: `nn.TransformerEncoder`'s inference fast path turns a padded batch
with a padding mask into a nested tensor (`torch._nested_tensor_from_mask`), whose sizes and
strides raise when read. Both recorders take its region as its whole buffer: the program runs
as it does unchecked, every op recorded, and it is clean; a side stream reading the nested
activations without a wait is a race."""

from __future__ import annotations

import os
import warnings

import pytest

pytestmark = pytest.mark.gpu

BACKENDS = [b for b in os.environ.get("STREAMSAN_TEST_BACKEND", "native,python").split(",") if b]


def _encoder(torch):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).cuda().eval()
    x = torch.randn(8, 32, 64, device="cuda")
    pad = torch.zeros(8, 32, dtype=torch.bool, device="cuda")
    pad[:, 20:] = True  # the last 12 positions of every sequence are padding
    return enc, x, pad


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_transformer_encoders_nested_fast_path_is_clean(gpu, backend):
    import streamsan.torch

    torch = gpu
    enc, x, pad = _encoder(torch)
    with torch.no_grad():
        want = enc(x, src_key_padding_mask=pad)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with streamsan.torch.check(raise_on_hazard=False, backend=backend) as run:
                got = enc(x, src_key_padding_mask=pad)
                torch.cuda.synchronize()
    assert torch.equal(got, want)
    assert run.report.hazards == [], run.report.to_text()
    assert run.report.ops > 20
    assert not [w for w in caught if "could not be recorded" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nested_tensor_read_on_a_side_stream_without_a_wait_is_a_race(gpu, backend, tmp_path):
    """On CUDA `_nested_tensor_from_mask` synchronizes the default stream (it reads the mask's
    lengths on the host: a `stream_sync` in the trace), so the side stream reading its output
    would be ordered after it; `* 2` makes a nested tensor on the default stream with no sync
    after it, and that one, read on the side stream without a wait, is a race at the read."""
    import json

    import streamsan.torch

    torch = gpu
    x = torch.randn(8, 32, 64, device="cuda")
    keep = torch.ones(8, 32, dtype=torch.bool, device="cuda")
    keep[:, 20:] = False
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    trace = tmp_path / "t.jsonl"
    with torch.no_grad():
        with streamsan.torch.check(raise_on_hazard=False, backend=backend, trace=trace) as run:
            n = torch._nested_tensor_from_mask(x, keep, mask_check=False) * 2
            with torch.cuda.stream(side):
                padded = torch.nested.to_padded_tensor(n, 0.0)  # NESTED READ: no wait
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
    assert padded.shape[0] == 8
    ops = [json.loads(line) for line in trace.read_text().splitlines()]
    read = next(o for o in ops if o.get("name") == "aten::to_padded_tensor")
    assert read["reads"][0]["bytes"] == 8 * 20 * 64 * 4  # the whole buffer: its 8 x 20 tokens
    races = [h for h in run.report.hazards if h["kind"] == "data-race"]
    assert races, run.report.to_text()
    assert any(h["access"]["site"].endswith(f":{_line_of('NESTED READ')}") for h in races), run.report.to_text()


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if f"# {marker}" in line)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("wait", [True, False])
def test_two_streams_on_one_jagged_nested_tensor(gpu, backend, wait):
    """A jagged nested tensor (a wrapper subclass: values and offsets) made on the default
    stream, then `nt * 2` on one side stream and `nt + 1` on another. With both waiting for the
    default stream it is clean: the results share `nt`'s offsets and neither op writes them.
    Without the waits, each side stream's read of `nt`'s values races with the default stream's
    write of them."""
    import streamsan.torch

    torch = gpu
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    with streamsan.torch.check(raise_on_hazard=False, backend=backend) as run:
        a = torch.randn(300, 64, device="cuda")
        b = torch.randn(500, 64, device="cuda")
        # Made from a list, its offsets are copied from host memory (a blocking copy: the host
        # waits for the default stream); `* 3` is the default stream's write after that.
        nt = torch.nested.nested_tensor([a, b], layout=torch.jagged) * 3
        if wait:
            s1.wait_stream(torch.cuda.current_stream())
            s2.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s1):
            y = nt * 2  # JAGGED S1
        with torch.cuda.stream(s2):
            z = nt + 1  # JAGGED S2
        torch.cuda.current_stream().wait_stream(s1)
        torch.cuda.current_stream().wait_stream(s2)
        got = (y.values().sum() + z.values().sum()).item()
    found = {(h["kind"], int(h["access"]["site"].rsplit(":", 1)[1])) for h in run.report.hazards if h["access"]}
    if wait:
        assert run.report.hazards == [], run.report.to_text()
        want = 3 * nt.values().sum().item() + nt.values().numel()
        assert abs(got - want) < 1e-3 * nt.values().numel(), (got, want)
    else:
        assert ("data-race", _line_of("JAGGED S1")) in found, run.report.to_text()
        assert ("data-race", _line_of("JAGGED S2")) in found, run.report.to_text()
        assert {k for k, _ in found} == {"data-race"}, run.report.to_text()
