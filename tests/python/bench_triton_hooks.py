"""What the Triton hooks add to a launch, on the CPU: the launch paths of
tests/python/test_triton_cpu.py's stand-ins for Inductor's CachingAutotuner and Triton's
CompiledKernel, timed plain and hooked (a listener that does nothing: the hooks' own cost, not
the recorder's). A benchmark, not a test: it asserts nothing about time.

    python -m pytest -q -s tests/python/bench_triton_hooks.py
"""

import time
from types import SimpleNamespace

from test_triton_cpu import FakeTensor, fakes, generated_autotuner, user_kernel  # noqa: F401

N = 20000


def _per_call(fn, events: list) -> float:
    fn()  # the first call computes the kernel's plan (imports, Triton's cache): not timed
    events.clear()
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    seconds = time.perf_counter() - t0
    events.clear()
    return seconds / N * 1e6


def test_launch_cost(fakes):  # noqa: F811
    x, y, out = FakeTensor("x"), FakeTensor("y"), FakeTensor("out")
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]
    k = user_kernel(fakes)
    cases = {
        "Inductor launch (CachingAutotuner.run)": lambda: at.run(x, y, out, 1000, stream=7),
        "user kernel launch (kernel[grid](...))": lambda: k[(4,)](x, y, out, 1000, 1024, stream=123),
    }
    for name, fn in cases.items():
        plain = _per_call(fn, fakes.events)
        hooks = fakes.hooks()
        assert hooks.install(lambda *a: None)
        try:
            hooked = _per_call(fn, fakes.events)
        finally:
            hooks.uninstall()
        recorded = sum(hooks.launches.values())
        assert recorded == N + 1, hooks.launches  # every launch was recorded
        print(f"\n{name}: plain {plain:.2f} µs, hooked {hooked:.2f} µs (+{hooked - plain:.2f} µs)")
