"""Shared fixtures of the Python tests.

Tests marked `gpu` need a CUDA GPU and torch. Without them they are skipped with a notice, and
they fail instead when STREAMSAN_REQUIRE_GPU=1 (the GPU machine sets it: a missing GPU there is
a broken setup, not a reason to skip).
"""

from __future__ import annotations

import os

import pytest


def marked_line(path: str, marker: str) -> int:
    """The number of the line of the file `path` that ends with the comment `# marker`: how a
    test names the line a report must point at."""
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if line.rstrip().endswith("# " + marker) and "marked_line(" not in line:
                return i
    raise AssertionError(marker)


def _cuda() -> str | None:
    """None when a CUDA GPU and torch are usable, else why not."""
    try:
        import torch
    except Exception as e:  # not installed
        return f"torch is not installed ({e})"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and torch")


def pytest_collection_modifyitems(config, items):
    why = _cuda()
    if why is None:
        return
    require = os.environ.get("STREAMSAN_REQUIRE_GPU") == "1"
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        if not require:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {why}"))


@pytest.fixture
def gpu(request):
    """Fails the test when STREAMSAN_REQUIRE_GPU=1 and there is no GPU (else it was skipped)."""
    why = _cuda()
    if why is not None:
        pytest.fail(f"STREAMSAN_REQUIRE_GPU=1 but {why}")
    import torch

    torch.cuda.synchronize()
    yield torch
    torch.cuda.synchronize()


def torch_or_skip():
    try:
        import torch

        return torch
    except Exception:
        pytest.skip("torch is not installed (the recorder's CPU tests need it)")


def native_ext_or_skip():
    """The C++ recorder's module, built if needed; the test skips where it cannot be built."""
    torch_or_skip()
    from streamsan.torch import _native

    try:
        return _native.load()
    except RuntimeError as e:
        pytest.skip(str(e))


@pytest.fixture(params=["python", "native"])
def backend(request):
    """Each recorder in turn (the C++ one skipped where it cannot be built)."""
    torch_or_skip()
    if request.param == "native":
        native_ext_or_skip()
    return request.param
