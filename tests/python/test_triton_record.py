"""Triton launches recorded by a check, on the CPU: the stand-ins of test_triton_cpu.py launched
with CPU tensors standing for device memory (`_fake_device`), recorded by the C++ recorder from
the launch's arguments (`record_triton`, TritonHooks' fast path) and through the list of
(tensor, read, write) the hooks compute (`record_kernel`): the same trace either way."""

import json
import warnings
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import streamsan.torch  # noqa: E402
from test_triton_cpu import FakeDescriptor, fakes, generated_autotuner, user_kernel  # noqa: E402,F401


def _native_or_skip():
    try:
        from streamsan.torch import _native

        _native.load()
    except Exception as e:  # noqa: BLE001 - no compiler, no headers: nothing to test here
        pytest.skip(f"the C++ recorder cannot be built here: {e}")


def _launches(trace_path) -> list:
    ops = [json.loads(line) for line in open(trace_path) if line.strip()]
    return [o for o in ops if o.get("op") == "launch" and not o.get("name", "").startswith("aten::")]


answers: list = []  # what the direct entry answered, launch by launch (fast="direct")


def _record(fakes, tmp_path, tag, fast, launch, profile=None):  # noqa: F811
    """Runs `launch(args)` under a check whose hooks take the fast path, the direct one
    (`fast="direct"`; `"direct-spy"`: the same, its answers going to `answers`) or neither;
    returns the launch ops of its trace and the hooks' launch counts."""
    trace = tmp_path / f"{tag}.jsonl"
    x, y, out = torch.ones(64), torch.ones(64), torch.zeros(64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True,
                                 trace=trace, _profile=profile) as run:
            rec = run._recorder
            hooks = fakes.hooks()
            direct = rec.backend.record_triton if fast == "direct" else None
            if fast == "direct-spy":  # (a Python frame of this file: the launches' site moves here)
                record = rec.backend.record_triton

                def direct(*args):
                    answer = record(*args)
                    answers.append(answer)
                    return answer

            assert hooks.install(rec._on_kernel, rec._on_kernel_fast if fast else None, direct)
            try:
                launch(x, y, out)
            finally:
                hooks.uninstall()
    return _launches(trace), hooks.launches, run.stats()


def _same_shape(a: list, b: list) -> None:
    """The same launches: names, streams, regions (buffer names may differ between checks)."""
    def shape(ops):
        return [(o["name"], o["stream"], [(r["offset"], r["bytes"]) for r in o.get("reads", [])],
                 [(r["offset"], r["bytes"]) for r in o.get("writes", [])], o.get("site")) for o in ops]
    assert shape(a) == shape(b)


@pytest.fixture
def native():
    _native_or_skip()


def test_an_inductor_launch_is_the_same_on_the_fast_path(fakes, tmp_path, native):  # noqa: F811
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]

    def launch(x, y, out):
        at.run(x, y, out, 64, stream=0)  # in_ptr0 read, in_out_ptr0 both, out_ptr0 written

    slow, n_slow, _ = _record(fakes, tmp_path, "slow", False, launch)
    fast, n_fast, stats = _record(fakes, tmp_path, "fast", True, launch)
    assert len(fast) == 1 and n_fast == n_slow == {"inductor": 1, "triton": 0}
    _same_shape(fast, slow)
    op = fast[0]
    assert op["name"] == "triton_poi_fused_add_0"
    # x read; y (in_out_ptr0: read and written) and out written (a write covers the read)
    assert [r["bytes"] for r in op["reads"]] == [256]
    assert [r["bytes"] for r in op["writes"]] == [256, 256]
    assert stats["recorder_triton_launches"] == 1


def test_tuned_inductor_launches_are_the_same_on_the_direct_path(fakes, tmp_path, native):  # noqa: F811
    """The launches after the first of a tuned kernel go from the hooks' wrapper to the C++
    recorder directly: the same launch ops as the list path's, and counted alike; a launch the
    recorder declines (a descriptor argument) takes the list path as before."""
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]

    def launch(x, y, out):
        for stream in (0, 0, 0):
            at.run(x, y, out, 64, stream=stream)
        at.run(x, FakeDescriptor(y), out, 64, stream=0)

    slow, n_slow, _ = _record(fakes, tmp_path, "slow", False, launch)
    direct, n_direct, stats = _record(fakes, tmp_path, "direct", "direct", launch)
    assert len(direct) == 4 and n_direct == n_slow == {"inductor": 4, "triton": 0}
    _same_shape(direct, slow)
    assert stats["recorder_triton_launches"] == 4
    answers.clear()
    _record(fakes, tmp_path, "spy", "direct-spy", launch)
    # The kernel's plan, made in the first check, serves the next ones from their first launch;
    # the descriptor's launch is declined and takes the list path.
    assert answers == [1, 1, 1, -1]


def test_tuned_launches_go_to_the_recorder_without_the_python_wrapper(fakes, tmp_path, native, monkeypatch):  # noqa: F811
    """With the C++ recorder, the patch of `CachingAutotuner.run` is its `FastRun`: a tuned
    kernel's launches after the one that made its plan go from it to the recorder, the hooks'
    Python wrapper not run (`_record_autotuner` not called), recorded as the Python wrapper
    records them and counted as the hooks' launches. What it cannot take goes to the Python
    wrapper: `benchmark_run` (not recorded), an argument the entry declines (a descriptor). A
    launch inside a taken `run` (Triton's `launch_metadata` under a launch hook) is not recorded
    again."""
    from streamsan.torch import _triton

    calls = []
    real = _triton._record_autotuner

    def counted(*args, **kwargs):
        calls.append(kwargs.get("before"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_triton, "_record_autotuner", counted)
    at = generated_autotuner(fakes, compiled=user_kernel(fakes))
    kinds = []

    def launch(x, y, out):
        kinds.append(type(type(at).__dict__["run"]).__name__)
        for _ in range(4):
            at.run(x, y, out, 64, stream=0)
        at.run(x, y, out, 64, stream=0, benchmark_run=True)
        at.run(x, FakeDescriptor(y), out, 64, stream=0)

    ops, n, stats = _record(fakes, tmp_path, "fast-run", "direct", launch)
    assert kinds == ["FastRun"]
    assert calls == [True, True]  # the first launch (its plan made) and the declined one
    assert n == {"inductor": 5, "triton": 0} and stats["recorder_triton_launches"] == 5
    assert [o["name"] for o in ops] == ["triton_poi_fused_add_0"] * 5
    calls.clear()
    monkeypatch.setattr(_triton, "_record_autotuner", real)  # (a frame of this file: the site)
    slow, n_slow, _ = _record(fakes, tmp_path, "slow", False, launch)  # no direct entry: all Python
    assert kinds[-1] == "FastRun" and n_slow == n
    # The same ops; the same sites where `counted` was not on the stack (it is a frame of this
    # file, taken for the user's): the launches taken by FastRun.
    _same_shape(ops[1:4], slow[1:4])
    def regions(o):
        return [[(r["offset"], r["bytes"]) for r in o.get(k, [])] for k in ("reads", "writes")]

    assert [(o["name"], regions(o)) for o in ops] == [(o["name"], regions(o)) for o in slow]
    # Another check listening alongside: the Python wrapper serves both.
    monkeypatch.setattr(_triton, "_record_autotuner", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True) as run:
            rec = run._recorder
            first, second = fakes.hooks(), fakes.hooks()
            assert first.install(rec._on_kernel, rec._on_kernel_fast, rec.backend.record_triton)
            assert second.install(lambda *a: None)
            try:
                x, y, out = torch.ones(64), torch.ones(64), torch.zeros(64)
                for _ in range(3):
                    at.run(x, y, out, 64, stream=0)
            finally:
                second.uninstall()
                first.uninstall()
    assert len(calls) == 3 and second.launches["inductor"] == 3


def test_fastrun_off_sends_every_launch_through_the_python_wrapper(fakes, tmp_path, native, monkeypatch):  # noqa: F811
    """STREAMSAN_TRITON_FASTRUN=0: the C++ wrapper in place passes every call on, the Python
    wrapper records them (the same launches); back on, it takes them again (the plans made
    meanwhile told to it)."""
    from streamsan.torch import _triton

    class Counted:  # the plans' cache, its lookups counted (the Python wrapper's, one a launch)
        def __init__(self, inner):
            self.inner, self.gets = inner, 0

        def get(self, key):
            self.gets += 1
            return self.inner.get(key)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    plans = Counted(_triton._AUTOTUNER_PLANS)
    monkeypatch.setattr(_triton, "_AUTOTUNER_PLANS", plans)
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]

    def launch(x, y, out):
        for _ in range(3):
            at.run(x, y, out, 64, stream=0)

    monkeypatch.setenv("STREAMSAN_TRITON_FASTRUN", "0")
    ops, n, _ = _record(fakes, tmp_path, "off", "direct", launch)
    assert len(ops) == 3 and n["inductor"] == 3
    assert plans.gets >= 3  # every launch through the Python wrapper
    monkeypatch.setenv("STREAMSAN_TRITON_FASTRUN", "1")
    plans.gets = 0
    ops, n, _ = _record(fakes, tmp_path, "on", "direct", launch)
    assert len(ops) == 3 and n["inductor"] == 3
    assert plans.gets == 0  # the plan made while off told to FastRun: every launch taken there


def test_the_fast_wrappers_plan_goes_with_its_autotuner(fakes, tmp_path, native):  # noqa: F811
    """The plan told to the C++ wrapper (and the launcher it keeps alive) is let go of when
    Inductor lets go of the kernel's autotuner."""
    import gc
    import weakref

    from streamsan.torch import _native

    ext = _native.load()
    class Launcher:  # (weakly referenceable, unlike a SimpleNamespace)
        cache_hash = "h0"

    at = generated_autotuner(fakes, compiled=None)
    launcher = Launcher()
    at.launchers = [launcher]
    before = ext.fast_plans_count()
    ops, _, _ = _record(fakes, tmp_path, "plan", "direct", lambda x, y, out: at.run(x, y, out, 64, stream=0))
    assert len(ops) == 1 and ext.fast_plans_count() == before + 1
    gone = weakref.ref(launcher)
    del at, launcher
    gc.collect()
    assert ext.fast_plans_count() == before and gone() is None


def test_a_user_kernel_launch_is_the_same_on_the_fast_path(fakes, tmp_path, native):  # noqa: F811
    k = user_kernel(fakes)

    def launch(x, y, out):
        k[(4,)](x, y, out, 64, 1024, stream=0)

    slow, n_slow, _ = _record(fakes, tmp_path, "slow", False, launch)
    fast, n_fast, _ = _record(fakes, tmp_path, "fast", True, launch)
    assert len(fast) == 1 and n_fast == n_slow == {"inductor": 0, "triton": 1}
    _same_shape(fast, slow)
    assert len(fast[0]["reads"]) == 2 and len(fast[0]["writes"]) == 1, fast


def test_a_descriptor_argument_falls_back_to_the_hooks_list(fakes, tmp_path, native):  # noqa: F811
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]

    def launch(x, y, out):
        at.run(x, FakeDescriptor(y), out, 64, stream=0)  # not a tensor: record_triton declines

    slow, _, _ = _record(fakes, tmp_path, "slow", False, launch)
    fast, n_fast, _ = _record(fakes, tmp_path, "fast", True, launch)
    assert n_fast == {"inductor": 1, "triton": 0}
    assert len(fast) == 1
    _same_shape(fast, slow)


def test_observing_only_records_no_launch(fakes, tmp_path, native):  # noqa: F811
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]

    def launch(x, y, out):
        at.run(x, y, out, 64, stream=0)

    for fast in (False, True):
        ops, n, stats = _record(fakes, tmp_path, f"observe{fast}", fast, launch, profile="observe")
        assert ops == [] and n["inductor"] == 1
        assert stats["recorder_triton_launches"] == 0


class _Spy:
    """Counts the hooks' list path (`_apply`) while it runs."""

    def __init__(self, monkeypatch):
        from streamsan.torch import _triton

        self.calls = 0
        original = _triton._apply

        def spied(*a, **k):
            self.calls += 1
            return original(*a, **k)

        monkeypatch.setattr(_triton, "_apply", spied)


def test_the_fast_path_takes_plain_launches(fakes, tmp_path, native, monkeypatch):  # noqa: F811
    spy = _Spy(monkeypatch)
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]
    k = user_kernel(fakes)

    def launch(x, y, out):
        at.run(x, y, out, 64, stream=0)
        k[(4,)](x, y, out, 64, 1024, stream=0)

    fast, n, _ = _record(fakes, tmp_path, "fast", True, launch)
    assert n == {"inductor": 1, "triton": 1} and len(fast) == 2
    assert spy.calls == 0  # neither launch went through the hooks' list of accesses


def test_what_the_fast_path_declines_goes_through_the_list(fakes, tmp_path, native, monkeypatch):  # noqa: F811
    spy = _Spy(monkeypatch)
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]

    def launch(x, y, out):
        at.run(x, y, out, xnumel=64, stream=0)  # a parameter by name: the list path
        at.run(x, (y,), out, 64, stream=0)  # a tuple in a pointer's place: declined by C++

    fast, n, _ = _record(fakes, tmp_path, "fast", True, launch)
    assert spy.calls == 2 and n == {"inductor": 2, "triton": 0}
    slow, _, _ = _record(fakes, tmp_path, "slow", False, launch)
    _same_shape(fast, slow)


def test_the_fast_path_agrees_on_extra_tensors_and_objects(fakes, tmp_path, native, monkeypatch):  # noqa: F811
    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]
    extra = torch.ones(8)

    def launch(x, y, out):
        # an object in xnumel's place (no memory: skipped), a tensor past the parameters (read
        # and written: its role is not known), None and a float among them
        at.run(x, y, out, SimpleNamespace(), None, 1.5, extra, stream=0)

    slow, _, _ = _record(fakes, tmp_path, "slow", False, launch)
    spy = _Spy(monkeypatch)
    fast, _, _ = _record(fakes, tmp_path, "fast", True, launch)
    assert spy.calls == 0
    _same_shape(fast, slow)
    assert [r["bytes"] for r in fast[0]["writes"]] == [256, 256, 32]  # y, out, extra


@pytest.mark.parametrize("how", ["bare", "pydirect"])
def test_profile_programs_diluted_hooks_record_no_launch(fakes, tmp_path, native, how):  # noqa: F811
    """profile_program.py's `observe-triton-bare` and `observe-triton-pydirect`: the hooks'
    wrapper runs each launch (the stand-in's `run` still launches), and nothing is recorded
    once the kernel's plan is made (the first launch of a check that has no plan yet makes it,
    through the fast path); a check after them records as before."""
    from profile_program import dilute_triton_hooks

    at = generated_autotuner(fakes, compiled=None)
    at.launchers = [SimpleNamespace(cache_hash="h0")]
    x, y, out = torch.ones(64), torch.ones(64), torch.zeros(64)
    at.run(x, y, out, 64, stream=0)  # a launch before any check
    before = len(fakes.events)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for round_ in range(2):
            with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True) as run:
                rec = run._recorder
                hooks = fakes.hooks()
                assert hooks.install(rec._on_kernel, rec._on_kernel_fast, rec.backend.record_triton)
                dilute_triton_hooks(hooks, how)
                try:
                    for _ in range(3):
                        at.run(x, y, out, 64, stream=0)
                finally:
                    hooks.uninstall()
            recorded = run.stats()["recorder_triton_launches"]
            taken = hooks.launches["inductor"]
            if how == "bare":
                assert recorded == 0 and taken == 0
            else:  # the plan made by the first check's first launch, the rest taken and dropped
                assert recorded == (1 if round_ == 0 else 0)
                assert taken == 3
    assert len(fakes.events) > before  # the launches went on
    ops, n, _ = _record(fakes, tmp_path, "after", "direct", lambda x, y, out: at.run(x, y, out, 64, stream=0))
    assert len(ops) == 1 and n["inductor"] == 1



def test_a_launch_keeps_its_plan_while_code_it_runs_replaces_the_plans(tmp_path, native):
    """Code a launch runs while the C++ wrapper records it (an argument's `__getattr__`, here)
    may clear and put plans: the launch records with its own plan, whole."""
    from streamsan.torch import _native

    ext = _native.load()

    class Autotuner:
        pass

    class Launcher:
        pass

    at, launcher = Autotuner(), Launcher()
    at.launchers = [launcher]
    ext.fast_plan_put(at, launcher, "k" * 100, bytes([1]) + bytes(39) + bytes([1]))
    others = []

    class Meddler:  # in a touched position: the entry looks for a `base` attribute
        def __getattr__(self, name):
            if not others:
                ext.fast_plans_clear()
                for _ in range(50):
                    o = Autotuner()
                    o.launchers = [launcher]
                    others.append(o)
                    ext.fast_plan_put(o, launcher, "Q" * 100, bytes([2] * 41))
            raise AttributeError(name)

    fast = ext.FastRun(lambda self, *a, **k: "original", lambda self, *a, **k: "fallback")
    fast.set_on(True)
    trace = tmp_path / "t.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True, trace=trace):
            x = torch.ones(64)
            assert fast(at, Meddler(), *([0] * 39), x, stream=0) == "original"
            assert fast.take() == 1
    assert [o["name"] for o in _launches(trace)] == ["k" * 100]
    ext.fast_plans_clear()
