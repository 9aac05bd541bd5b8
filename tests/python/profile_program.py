"""Where a checked real-code program's time goes, in Python: one program of the real-code or
compiled suite (tests/python/realcode.py, realcode_compiled.py), timed in interleaved rounds in
one process, in the modes `--modes` names (default: plain, observe, no-triton, checked):

- `plain`: the program alone;
- `floor`: the program under a RecordFunction observer that does nothing but ask for every op's
  inputs and outputs (the C++ recorder's `bench_floor`: no check, no tracker, no patches);
- `observe`: a check whose C++ recorder observes only (`_profile="observe"`);
- `observe-no-patches`: the same without the Python patches of torch.cuda, Tensor.tolist and
  torch.save (CUDA graph captures and replays not recorded: what they cost);
- `observe-without-A+B…`: observing without the patches of the methods named A, B, … (`replay`,
  `tolist`, `__new__`: the attribute names `_install_patches` patches), to tell them apart;
- `observe-passthrough-replay`: observing with `CUDAGraph.replay` patched for the check by a
  wrapper that only calls the original (what any Python wrapper there costs, against the
  recorder's);
- `no-triton`: a check without Triton's launch hooks; `observe-no-triton`, observing without
  them (what the hooks' Python costs when the recorder takes nothing), and
  `observe-no-patches-no-triton`, observing without either;
- `observe-triton-bare`: observing with Triton's hooks installed but listening to nothing (their
  wrapper of `CachingAutotuner.run` active, no plan looked up, nothing handed over): what an
  active wrapper's frame costs a real launch; `observe-triton-pydirect`: observing with the
  wrapper's direct entry a Python function that takes the launch and does nothing (the wrapper's
  own logic, without the C++ entry's call);
- `checked`: a check;
- `stages`: a check with the recorder's stages timed (`_profile="1"`): its `recorder_profile_*`
  counts, medians of the rounds, are printed after the times;
- `at-once`: a check whose records are written on the program's thread (STREAMSAN_DEFER=0);
- `no-write`, `no-checker`, `no-site`, `no-allocator` (and `no-all`, `gil-site`): a check with
  parts of the recording left out or done the old way (bench_overhead.py's `ablate` modes, its
  ABLATIONS: the recorder's bench_ablate mask; the trace is wrong, only the time counts):
  `no-write` takes each op's regions and writes nothing, `no-checker` writes the trace and
  drops it;
- `steady`: the program's third run inside one check around three (what a long run's step
  costs; no enter/leave split);
- with `--pin CPU` the program's thread is pinned to CPU for every mode, and the process's other
  threads (the recorder's, the checker's, PyTorch's) are placed at each run's start: on every
  CPU (the scheduler's choice) in the modes above, on every CPU but the program's core
  (`…-apart`: `checked-apart`, `steady-apart`) or on the program's core alone, its SMT siblings
  when it has any (`…-together`). Whether the threads beside the program slow it down.

The modes run in rounds, the order rotated each round (so that no mode always follows the same
one). Each checked mode's time is also split into entering the check (`__enter__`), the program's
body (from inside the `with` to its last synchronization) and leaving it (`__exit__`), medians of
the rounds: what a check costs once against what it costs per op.

Then one checked run under cProfile, whose top functions are printed (by own time and by
cumulative time), and with `--profile-plain` one plain run's. A benchmark, not a test.

    python tests/python/profile_program.py "torch.compile nanoGPT" --rounds 5 [--top 25]
    python tests/python/profile_program.py "reduce-overhead LLM decode" --set compiled --rounds 21 \
        --modes plain,floor,observe,observe-no-patches,checked
"""

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import threading
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_overhead import ABLATIONS, _rotated  # noqa: E402  (the ablated checks; a round's order)


def _install_patches_remade(remake):
    """A stand-in for the recorder's `_install_patches` in which `remake(attr, make)` decides,
    for each method the recorder patches (by attribute name), the wrapper's maker: `make` (the
    recorder's), another, or None (the method left alone)."""
    from streamsan.torch import _recorder

    install = _recorder._install_patches

    def install_some(rec):
        p = _recorder._Patches()
        for how in ("patch", "patch_inherited", "keep_inherited"):
            made = getattr(p, how)

            def patched(owner, attr, make, made=made):
                make = remake(attr, make)
                return False if make is None else made(owner, attr, make)

            setattr(p, how, patched)
        saved = _recorder._Patches
        _recorder._Patches = lambda: p
        try:
            return install(rec)
        finally:
            _recorder._Patches = saved

    return install_some


def install_patches_without(skip: set):
    """A stand-in for the recorder's `_install_patches` that makes every wrapper but those of
    the methods named in `skip` (`replay`, `tolist`, `__new__`: the attribute names)."""
    return _install_patches_remade(lambda attr, make: None if attr in skip else make)


def install_patches_passthrough(attr: str):
    """A stand-in for the recorder's `_install_patches` whose wrapper of `attr` (the attribute
    name, as in `install_patches_without`) only calls the original."""

    def passthrough(orig):
        def call(self, *args, **kwargs):
            return orig(self, *args, **kwargs)

        return call

    return _install_patches_remade(lambda a, make: passthrough if a == attr else make)


def placements(cpu: int) -> dict:
    """The program's thread pinned to `cpu`; where the other threads may run in each placement:
    `any` every CPU this process may use, `apart` all but `cpu`'s core (it and its SMT siblings,
    as /sys lists them), `together` that core alone (its siblings, or `cpu` itself)."""
    allowed = os.sched_getaffinity(0)
    if cpu not in allowed:
        sys.exit(f"--pin: CPU {cpu} is not among this process's CPUs {sorted(allowed)}")
    core = {cpu}
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            for part in f.read().strip().split(","):
                lo, _, hi = part.partition("-")
                core |= set(range(int(lo), int(hi or lo) + 1))
    except OSError:
        pass
    siblings = (core - {cpu}) & allowed
    os.sched_setaffinity(0, {cpu})  # this thread: the program's
    return {"any": allowed, "apart": allowed - core, "together": siblings or {cpu}}


def place_others(cpus: set) -> None:
    """Every thread of this process but the calling one allowed `cpus` (threads that have gone
    since they were listed are skipped)."""
    me = threading.get_native_id()
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass


def triton_hooks_diluted(install, how: str):
    """A stand-in for the recorder's `_install_triton` that installs Triton's hooks as it does,
    then (`how`) "bare": takes them off the wrappers' listeners (each wrapper active, calling its
    original and nothing else), or "pydirect": makes their direct entry a Python function that
    takes every launch and records nothing."""

    def installed(rec) -> None:
        install(rec)
        if rec.triton is not None:
            dilute_triton_hooks(rec.triton, how)

    return installed


def dilute_triton_hooks(hooks, how: str) -> None:
    """Installed Triton hooks made to listen to nothing ("bare": off their wrappers' listeners,
    which call the originals alone) or to take every tuned launch in a Python function that
    records nothing ("pydirect": their direct entry). Uninstalling them puts things back."""
    if how == "bare":
        for patch in list(getattr(hooks, "_attached", [])):
            patch.listeners = tuple(h for h in patch.listeners if h is not hooks)
    elif how == "pydirect":
        hooks._direct = lambda name, stream, roles, args: 0
    else:
        raise ValueError(f"dilute_triton_hooks: unknown {how!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("program", help="a substring of the program's name")
    p.add_argument("--set", dest="suite", default="all", help="realcode, compiled or all")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--modes", default="plain,observe,no-triton,checked",
                   help="comma-separated: plain, floor, observe, observe-no-patches, observe-no-triton, "
                   "observe-no-patches-no-triton, observe-without-A+B…, observe-passthrough-replay, no-triton, "
                   "checked, stages")
    p.add_argument("--profile-plain", action="store_true", help="also profile one plain run")
    p.add_argument("--pin", type=int, default=None, metavar="CPU",
                   help="the program's thread pinned to CPU; the other threads placed per mode (-apart, -together)")
    args = p.parse_args()

    import torch

    import realcode
    import streamsan.torch
    from streamsan.torch import _recorder

    progs = realcode.programs([args.program], suite=args.suite)
    if not progs:
        sys.exit(f"no program matches {args.program!r}")
    name, fn, _clean = progs[0]
    print(f"program: {name}", flush=True)
    from streamsan.torch import _native

    install_triton = _recorder.Recorder._install_triton
    install_patches = _recorder._install_patches
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = {"plain", "floor", "observe", "observe-no-patches", "observe-passthrough-replay", "no-triton", "checked",
             "stages", "observe-no-triton", "observe-no-patches-no-triton", "at-once", "steady", *ABLATIONS,
             "observe-triton-bare", "observe-triton-pydirect",
             *(m + s for m in ("checked", "steady") for s in ("-apart", "-together"))}
    if args.pin is not None:
        places = placements(args.pin)
        print(f"pinned: the program to CPU {args.pin}; apart: {sorted(places['apart'])}; "
              f"together: {sorted(places['together'])}", flush=True)
    elif any(m.endswith(("-apart", "-together")) for m in modes):
        sys.exit("--modes: -apart and -together need --pin")
    if not modes or {m for m in modes if not m.startswith("observe-without-")} - known:
        sys.exit(f"--modes: expected some of {', '.join(sorted(known))}")
    if "plain" not in modes:
        modes.insert(0, "plain")

    parts: dict = {}  # mode -> (enter, body, leave) seconds of each round
    stages: list = []  # the recorder's stage counts of each `stages` run

    def once(mode: str) -> float:
        if args.pin is not None:
            place_others(places[next((k for k in ("apart", "together") if mode.endswith("-" + k)), "any")])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if mode in ("plain", "floor"):
            ext = _native.load() if mode == "floor" else None
            if ext is not None:
                ext.bench_floor(True, True)
            try:
                fn(True, False)
                torch.cuda.synchronize()
            finally:
                if ext is not None:
                    ext.bench_floor(False, True)
            return time.perf_counter() - t0
        if mode.endswith("no-triton"):
            _recorder.Recorder._install_triton = lambda self: None
        if mode in ("observe-triton-bare", "observe-triton-pydirect"):
            _recorder.Recorder._install_triton = triton_hooks_diluted(install_triton, mode.rsplit("-", 1)[1])
        if mode.startswith("observe-no-patches"):
            _recorder._install_patches = lambda rec: _recorder._Patches()
        if mode.startswith("observe-without-"):
            _recorder._install_patches = install_patches_without(set(mode[len("observe-without-"):].split("+")))
        if mode == "observe-passthrough-replay":
            _recorder._install_patches = install_patches_passthrough("replay")
        ext = _native.load() if mode in ABLATIONS else None
        saved_defer = os.environ.pop("STREAMSAN_DEFER", None)
        if mode == "at-once":
            os.environ["STREAMSAN_DEFER"] = "0"
        steady = mode.startswith("steady")
        try:
            if ext is not None:
                ext.bench_ablate(ABLATIONS[mode])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                observe = mode.startswith("observe")
                run = streamsan.torch.Run(raise_on_hazard=False, backend="native",
                                          _profile="observe" if observe else "1" if mode == "stages" else "0")
                with run:
                    for _ in range(2 if steady else 0):  # untimed, under the check
                        fn(True, False)
                        torch.cuda.synchronize()
                    t1 = time.perf_counter()
                    fn(True, False)
                    torch.cuda.synchronize()
                    t2 = time.perf_counter()
                    if mode == "stages":
                        stages.append({k: v for k, v in run.stats().items() if k.startswith("recorder_profile_")})
        finally:
            if ext is not None:
                ext.bench_ablate(0)
            os.environ.pop("STREAMSAN_DEFER", None)
            if saved_defer is not None:
                os.environ["STREAMSAN_DEFER"] = saved_defer
            _recorder.Recorder._install_triton = install_triton
            _recorder._install_patches = install_patches
        seconds = time.perf_counter() - t0
        if steady:  # the third run alone: its phases are not a check's
            return t2 - t1
        parts.setdefault(mode, []).append((t1 - t0, t2 - t1, t0 + seconds - t2))
        if mode == "checked":
            once.stats = run.stats()
        return seconds

    for m in modes:  # warm-up: compiles, caches
        once(m)
    parts.clear()
    stages.clear()
    samples: dict = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in _rotated(modes, r + 1):
            samples[m].append(once(m))
    plain = statistics.median(samples["plain"])
    for m in modes:
        med = statistics.median(samples[m])
        spread = ", ".join(f"{s * 1e3:.1f}" for s in samples[m])
        print(f"{m:10s} {med * 1e3:8.1f} ms ({med / plain:.2f}x)   rounds: {spread}")
    for m in modes:
        if m in parts:
            enter, body, leave = (statistics.median(r[i] for r in parts[m]) * 1e3 for i in range(3))
            print(f"{m:10s} enter {enter:6.3f} ms  body {body:7.3f} ms ({body / plain * 1e-3:.2f}x plain)  "
                  f"leave {leave:6.3f} ms")
    st = getattr(once, "stats", {})
    for k in ("recorder_triton_launches", "ops", "recorder_sites_without_gil", "recorder_sites_with_gil",
              "recorder_queue_caught_up", "checker_busy_seconds", "queue_waited_seconds"):
        if k in st:
            print(f"{k}: {st[k]}")
    if stages:  # medians over the `stages` rounds: ms for the times, counts as they are
        print(f"stages (medians of {len(stages)} runs; ms where `_seconds`):")
        for k in stages[0]:
            vals = [s[k] for s in stages if isinstance(s.get(k), (int, float))]
            if vals:
                v = statistics.median(vals)
                shown = f"{v * 1e3:.3f} ms" if k.endswith("_seconds") else f"{v:g}"
                print(f"  {k[len('recorder_profile_'):]}: {shown}")

    def show(prof: cProfile.Profile, what: str) -> None:
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.top)
            print(f"--- {what}, by {key} ---")
            print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:6000])

    if args.profile_plain:
        prof = cProfile.Profile()
        prof.enable()
        fn(True, False)
        torch.cuda.synchronize()
        prof.disable()
        show(prof, "plain")
    prof = cProfile.Profile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with streamsan.torch.Run(raise_on_hazard=False, backend="native"):
            prof.enable()
            fn(True, False)
            torch.cuda.synchronize()
            prof.disable()
    show(prof, "checked")


if __name__ == "__main__":
    main()
