"""What recording a Triton launch costs, on the CPU: the stand-in for Inductor's
CachingAutotuner (tests/python/test_triton_cpu.py) launched with CPU tensors standing for device
memory, plain, hooked with listeners that do nothing, and recorded by a check (`_fake_device`):
the C++ recorder from the launch's arguments, called by the hooks' wrapper itself (`direct`, a
tuned kernel's launches: the C++ recorder's `FastRun`, or, "native direct in python", the same
entry called from the Python wrapper) or through the recorder's Python callback (`record_triton`,
the hooks' fast path), and from the hooks' list of accesses (`record_kernel`), and the Python
recorder. A benchmark, not a test: it asserts nothing about time.

    python -m pytest -q -s tests/python/bench_triton_record.py
"""

import functools
import time
import warnings
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import streamsan.torch  # noqa: E402
from test_triton_cpu import fakes, generated_autotuner  # noqa: E402,F401

N = 20000


def _per_call(fn, n: int = N) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


@pytest.mark.parametrize("how", ["native direct", "native direct in python", "native fast", "native list", "python"])
def test_recorded_launch_cost(fakes, how):  # noqa: F811
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]
    x, y, out = (torch.ones(256) for _ in range(3))

    def launch():
        at.run(x, y, out, 256, stream=0)
        fakes.events.clear()

    plain = _per_call(launch)
    hooked = {}
    for fast in (False, True):
        hooks = fakes.hooks()
        assert hooks.install(lambda *a: None, (lambda *a: True) if fast else None)
        try:
            hooked[fast] = _per_call(launch)
        finally:
            hooks.uninstall()
    backend = how.split()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=True) as run:
            rec = run._recorder
            # On a GPU the launch's tensors name their device; CPU tensors would make the list
            # path ask torch.cuda for the current one (a failing CUDA initialization) each time.
            rec.device = lambda: 0
            hooks = fakes.hooks()
            fast = rec._on_kernel_fast if how in ("native fast", "native direct", "native direct in python") else None
            direct = rec.backend.record_triton if how == "native direct" else None
            if how == "native direct in python":  # the same entry, not the C++ wrapper's own:
                direct = functools.partial(rec.backend.record_triton)  # the Python wrapper calls it
            assert hooks.install(rec._on_kernel, fast, direct)
            try:
                n = N // 4
                recorded = _per_call(launch, n)
            finally:
                hooks.uninstall()
    assert hooks.launches["inductor"] == n + 1
    assert run.stats()["recorder_triton_launches"] >= n
    print(f"\n{how}: plain {plain:.2f} µs; hooked, listeners doing nothing: {hooked[False]:.2f} µs "
          f"(list), {hooked[True]:.2f} µs (fast); recorded {recorded:.2f} µs a launch")


@pytest.mark.parametrize("flush_mib", [0, 4, 32])
def test_direct_launch_with_cold_caches(fakes, flush_mib):  # noqa: F811
    """A launch recorded through the direct entry, and the entry's parts (`_profile="1"`: the
    arguments' regions, the user's site, the record queued), with `flush_mib` MiB written
    between launches: a real program's launch finds the recorder's code and the tensors'
    metadata evicted by what ran since (the launcher, the driver, the interpreter). Records are
    deferred as on a GPU (`STREAMSAN_DEFER=all`)."""
    import os
    from unittest import mock

    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]
    x, y, out = (torch.ones(256) for _ in range(3))
    flush = torch.zeros(flush_mib * 262144)
    n = 20000 if flush_mib == 0 else 2000 if flush_mib < 16 else 400

    def launch():
        if flush_mib:
            flush.add_(1)
        at.run(x, y, out, 256, stream=0)
        fakes.events.clear()

    with mock.patch.dict(os.environ, {"STREAMSAN_DEFER": "all"}), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True, _profile="1") as run:
            rec = run._recorder
            rec.device = lambda: 0
            hooks = fakes.hooks()
            assert hooks.install(rec._on_kernel, rec._on_kernel_fast, rec.backend.record_triton)
            try:
                launch()
                st0 = run.stats()
                launches0 = st0["recorder_triton_launches"]
                t0 = time.perf_counter()
                for _ in range(n):
                    launch()
                per = (time.perf_counter() - t0) / n * 1e6
                st = run.stats()
            finally:
                hooks.uninstall()
    assert st["recorder_triton_launches"] - launches0 == n  # every launch took the direct entry
    parts = {k: (st[f"recorder_profile_{k}_seconds"] - st0[f"recorder_profile_{k}_seconds"]) / n * 1e6
             for k in ("kernels", "kernels_regions", "kernels_site", "kernels_submit")}
    assert parts["kernels"] > 0 and all(v >= 0 for v in parts.values())
    # (the whole launch's time includes the flush, which varies by more than the entry costs:
    # only the entry's own parts are comparable between flush sizes)
    print(f"\nflush {flush_mib} MiB: {per:.2f} µs a launch with the flush; inside the entry "
          + ", ".join(f"{k} {v:.2f} µs" for k, v in parts.items()))
