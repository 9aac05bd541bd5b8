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
def test_a_nested_tensor_read_on_a_side_stream_without_a_wait_is_a_race(gpu, backend):
    import streamsan.torch

    torch = gpu
    x = torch.randn(8, 32, 64, device="cuda")
    keep = torch.ones(8, 32, dtype=torch.bool, device="cuda")
    keep[:, 20:] = False
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.no_grad():
        with streamsan.torch.check(raise_on_hazard=False, backend=backend) as run:
            n = torch._nested_tensor_from_mask(x, keep, mask_check=False)
            with torch.cuda.stream(side):
                padded = torch.nested.to_padded_tensor(n, 0.0)  # no wait for the default stream
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
    assert padded.shape[0] == 8
    kinds = {h["kind"] for h in run.report.hazards}
    assert "data-race" in kinds, run.report.to_text()
