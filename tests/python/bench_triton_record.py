"""What recording a Triton launch costs, on the CPU: the stand-in for Inductor's
CachingAutotuner (tests/python/test_triton_cpu.py) launched with CPU tensors standing for device
memory, plain, hooked with a listener that does nothing, and recorded by a check with the C++
recorder (`_fake_device`). A benchmark, not a test: it asserts nothing about time.

    python -m pytest -q -s tests/python/bench_triton_record.py
"""

import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import streamsan.torch  # noqa: E402
from test_triton_cpu import fakes, generated_autotuner  # noqa: E402,F401

N = 20000


def _per_call(fn) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    return (time.perf_counter() - t0) / N * 1e6


@pytest.mark.parametrize("backend", ["native", "python"])
def test_recorded_launch_cost(fakes, backend):  # noqa: F811
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]
    x, y, out = (torch.ones(256) for _ in range(3))

    def launch():
        at.run(x, y, out, 256, stream=0)
        fakes.events.clear()

    plain = _per_call(launch)
    hooks = fakes.hooks()
    assert hooks.install(lambda *a: None)
    try:
        hooked = _per_call(launch)
    finally:
        hooks.uninstall()
    try:
        import streamsan.torch._recorder as R
    except ImportError:
        pytest.skip("no recorder")
    run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True)
    with run:
        rec = run._recorder
        hooks = fakes.hooks()
        assert hooks.install(rec._on_kernel)
        try:
            n = N // 4
            t0 = time.perf_counter()
            for _ in range(n):
                launch()
            recorded = (time.perf_counter() - t0) / n * 1e6
        finally:
            hooks.uninstall()
    assert hooks.launches["inductor"] == n
    print(f"\n{backend}: plain {plain:.2f} µs, hooked {hooked:.2f} µs, recorded {recorded:.2f} µs a launch")
