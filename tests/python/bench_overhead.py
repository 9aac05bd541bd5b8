"""Overhead of streamsan.torch.check and of PyTorch's CUDA sanitizer (CSAN) on two workloads.

    python tests/python/bench_overhead.py all          # every mode, each in its own process
    python tests/python/bench_overhead.py run MODE WORKLOAD [--backend B]
    python tests/python/bench_overhead.py memory --steps 10000 [--sync-every 100]
    python tests/python/bench_overhead.py paired WORKLOAD [--iters N]   # plain and checked in one process
    python tests/python/bench_overhead.py startup [--device cpu] [--between N] # a check's enter and exit
        [--flush-mib N] [--idle-ms MS]                                 # … with cold caches, an idle core
    python tests/python/bench_overhead.py floor WORKLOAD [--device cpu] # what being called costs
    python tests/python/bench_overhead.py loop WORKLOAD MODE [--device cpu] # a loop for a profiler
    python tests/python/bench_overhead.py ablate WORKLOAD [--device cpu] # each part of recording left out

Workloads: `mlp`, a small MLP training step (Linear 256→512→512→10, batch 64, SGD), `tiny`, the
same at 16→32→32→4, batch 8 (launch-bound), `streams`, a two-stream launch-bound loop
(in-place adds on two streams ordered by wait_stream), and `resnet`, a torchvision ResNet-18
training step (`paired` and `floor` only).
Modes: `plain`, `streamsan` (streamsan.torch.check, default settings), `csan`
(torch.cuda._sanitizer.enable_cuda_sanitizer()). Each mode runs in a fresh process (CSAN cannot
be turned off); each figure is the median of 5 timed blocks of ITERS iterations after a warm-up,
in microseconds per iteration, with the GPU synchronized at the end of each block.

`memory`: the MLP training step `--steps` times under streamsan.torch.check (online check, the
trace not kept: explanations read the ops back from a temporary file), and every 1,000 steps the
process's resident and peak resident memory (VmRSS, VmHWM) with what the checker keeps
(`Run.stats()`: history entries, generations, graveyard). `--sync-every N` reads the loss on the
host every N steps (`loss.item()`, as a training loop that logs it does); without it the loop never
synchronizes. The loop stops early past `--max-rss-mib` or `--max-seconds`. `flat` says whether
memory stayed flat: from step 1,000 to the last step, RSS grew by at most 16 MiB and the checker's
history, generations and graveyard by at most 2x + 4096.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from unittest import mock


def mlp(device: str = "cuda", dims=(256, 512, 10), batch: int = 64):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    din, hidden, dout = dims
    model = nn.Sequential(
        nn.Linear(din, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, dout)
    ).to(device)
    x = torch.randn(batch, din, device=device)
    y = torch.randint(0, dout, (batch,), device=device)
    return _training_step(model, x, y)


def _training_step(model, x, y):
    """One SGD step of `model` on the batch (x, y) with cross-entropy, as a function."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def streams():
    import torch

    a = torch.zeros(1024, device="cuda")
    b = torch.zeros(1024, device="cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())

    def step():
        with torch.cuda.stream(s1):
            s1.wait_stream(s2)
            a.add_(1)
        with torch.cuda.stream(s2):
            s2.wait_stream(s1)
            b.add_(a)

    return step


def tiny(device: str = "cuda"):
    """The MLP training step at a size where each op costs what launching it costs (16→32→32→4,
    batch 8): on the CPU, the launch-bound proxy of a GPU program."""
    return mlp(device, (16, 32, 4), 8)


def resnet(device: str = "cuda"):
    """A torchvision ResNet-18 training step (batch 16, 64x64 images, SGD): a real model's mix of
    ops (needs torchvision)."""
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(device)
    x = torch.randn(16, 3, 64, 64, device=device)
    y = torch.randint(0, 10, (16,), device=device)
    return _training_step(model, x, y)


WORKLOADS = {"mlp": mlp, "streams": streams, "tiny": tiny, "resnet": resnet}


def timed(step, iters: int, blocks: int = 5) -> list[float]:
    for _ in range(50):
        step()
    _sync("cuda")
    return [_block(step, iters) for _ in range(blocks)]


def run(mode: str, workload: str, backend: str, iters: int) -> dict:
    import torch

    step = WORKLOADS[workload]()
    res = {"mode": mode, "workload": workload, "iters": iters}
    if mode == "plain":
        res["us"] = timed(step, iters)
    elif mode == "csan":
        import torch.cuda._sanitizer as csan

        csan.enable_cuda_sanitizer()
        res["us"] = timed(step, iters)
    else:
        import streamsan.torch

        with streamsan.torch.check(raise_on_hazard=False, backend=backend) as r:
            res["us"] = timed(step, iters)
        res["backend"] = r.backend
        res["errors"] = r.report.errors
        res["ops"] = r.report.ops
    torch.cuda.synchronize()
    res["median_us"] = statistics.median(res["us"])
    return res


PROFILE = {"observe": "observe", "stages": "1"}  # the profiling modes of paired, floor and loop: Run(_profile=…)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _block(step, iters: int, device: str = "cuda") -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    _sync(device)
    return (time.perf_counter() - t0) / iters * 1e6


@contextlib.contextmanager
def _workload(what: str, workload: str, device: str, warmup: int):
    """The workload's step, run `warmup` times; on the CPU with one intra-op thread (the ops' own
    cost, not a thread pool's) until the block ends."""
    import torch

    if device == "cpu" and workload == "streams":
        raise SystemExit(f"{what} --device cpu: the streams workload needs a GPU")
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        step = WORKLOADS[workload](device) if device == "cpu" else WORKLOADS[workload]()
        for _ in range(warmup):
            step()
        _sync(device)
        yield step
    finally:
        torch.set_num_threads(threads)


def _checked_block(step, iters: int, device: str, profile: str) -> float:
    """`_block` inside a check of the C++ recorder (`profile`: its STREAMSAN_PROFILE), the check's
    entering and leaving not timed."""
    import streamsan.torch

    with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=device == "cpu",
                             _profile=profile):
        return _block(step, iters, device)


def _rotated(modes: list, rnd: int) -> list:
    """The modes in the order round `rnd` runs them: the warm-up round (0) and round 1 in their
    order, each later round in the order of the one before rotated by one, so that no mode is
    always the first of a round or always the one after another given mode."""
    k = (rnd - 1) % len(modes) if rnd else 0
    return modes[k:] + modes[:k]


def _medians(samples: dict) -> dict:
    """Each mode's median µs per iteration, its ratio to `plain` (the ratio of the medians), the
    ratio paired by round (`ratio_paired`: the median, lowest and highest over the rounds of the
    mode's block against the plain block of the same round: a drift of the host's speed from
    round to round cancels), and the samples."""
    med = {m: statistics.median(v) for m, v in samples.items()}
    paired = {}
    for m, v in samples.items():
        if m == "plain" or len(v) != len(samples["plain"]) or not v:
            continue
        r = sorted(x / p for x, p in zip(v, samples["plain"]))
        paired[m] = {"median": round(statistics.median(r), 3), "low": round(r[0], 3), "high": round(r[-1], 3)}
    return {
        "us": {m: round(v, 1) for m, v in med.items()},
        "ratio": {m: round(v / med["plain"], 3) for m, v in med.items() if m != "plain"},
        "ratio_paired": paired,
        "samples_us": {m: [round(x, 1) for x in v] for m, v in samples.items()},
    }


def paired(workload: str, iters: int, rounds: int = 5, device: str = "cuda", sync_each: bool = False) -> dict:
    """Plain and checked in one process, interleaved: each round a plain block of `iters`
    iterations, then the same block under a check of its own (entered and finished in the timing:
    its set-up and report are part of the cost), then under a check whose recorder observes only
    (STREAMSAN_PROFILE=observe: called at every op, recording nothing), one with its stages
    timed (STREAMSAN_PROFILE=1), one with quiet callees (`quiet`: STREAMSAN_CALLEES=learn), and
    one writing its records on the program's thread
    (`at_once`: STREAMSAN_DEFER=0). Microseconds per iteration, the median of `rounds` rounds after a
    warm-up of each; the stages of the median timed round, per iteration. `device="cpu"`: the
    workload (mlp or tiny) on CPU tensors standing for device memory (the recorder's fake device,
    one intra-op thread), where no GPU is: the recorder's own cost per op, against CPU ops of a
    few microseconds (`tiny`: launch-bound, as a GPU program's small ops are)."""
    with _workload("paired", workload, device, warmup=20) as step:
        if sync_each:
            step = _synced(step, device)
        out = _paired(step, workload, iters, rounds, device)
        out["sync_each"] = sync_each
        return out


def _device_sync(device: str):
    """A device synchronization as a program issues it: `torch.cuda.synchronize`, or on the CPU
    the fake device's (c10's GPU trace called as `torch.cuda.synchronize()` calls it; nothing
    while no check records)."""
    import torch

    if device != "cpu":
        return torch.cuda.synchronize
    from streamsan.torch import _native

    fake = _native.load().fake_gpu_trace
    return lambda: fake("device_sync", 0, 0)


def _synced(step, device: str):
    """`step`, then a device synchronization (`_device_sync`): a loop that waits for the GPU at
    every step, as one reading its loss with `.item()` does."""
    sync = _device_sync(device)

    def synced():
        step()
        sync()

    return synced


def _paired(step, workload: str, iters: int, rounds: int, device: str) -> dict:
    import streamsan.torch

    # Records written off the program's thread (the default; on the CPU the fake device's ops
    # too), or at once ("at_once": STREAMSAN_DEFER=0), in the same rounds.
    deferred = "all" if device == "cpu" else "1"

    def checked(mode: str):
        env = {"STREAMSAN_DEFER": "0" if mode == "at_once" else deferred,
               "STREAMSAN_CALLEES": "learn" if mode == "quiet" else "all"}
        with mock.patch.dict(os.environ, env):
            t0 = time.perf_counter()
            with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=device == "cpu",
                                     _profile=PROFILE.get(mode, "0")) as r:
                for _ in range(iters):
                    step()
                _sync(device)
                stats = r.stats()
            us = (time.perf_counter() - t0) / iters * 1e6
        return us, r, stats

    modes = ["plain", "streamsan", "quiet", "at_once", "observe", "stages"]
    samples: dict = {m: [] for m in modes}
    stages, errors = [], set()
    for rnd in range(rounds + 1):
        for m in _rotated(modes, rnd):
            if m == "plain":
                us = _block(step, iters, device)
            else:
                us, r, stats = checked(m)
                if m != "observe":
                    errors.add(r.report.errors)
                if m == "stages" and rnd:
                    stages.append({k[len("recorder_profile_"):]: v for k, v in stats.items()
                                   if k.startswith("recorder_profile_")}
                                  | {k: stats[k] for k in ("checker_busy_seconds", "queue_waited_seconds") if k in stats})
            if rnd:
                samples[m].append(us)
    stages.sort(key=lambda p: sum(v for k, v in p.items() if k.endswith("_seconds")))
    prof = stages[len(stages) // 2] if stages else {}
    unwritten = prof.pop("unwritten_ops", None)
    per_iter = {k[: -len("_seconds")]: round(v / iters * 1e6, 2) for k, v in prof.items() if k.endswith("_seconds")}
    return {
        "workload": workload,
        "device": device,
        "iters": iters,
        "rounds": rounds,
        **_medians(samples),
        "stages_us_per_iter": per_iter,
        "ops_per_iter": round(prof.get("ops", 0) / iters, 1),
        "callbacks_per_iter": round(prof.get("callbacks", 0) / iters, 1),
        "unwritten_ops": unwritten,
        "errors": sorted(errors),
    }


FLOOR_MODES = ["plain", "observer", "observer+io", "observe", "streamsan"]


def floor(workload: str, iters: int, rounds: int = 5, device: str = "cuda") -> dict:
    """Where the floor of a check goes: in one process, interleaved, the workload plain; with an
    observer that does nothing on the dispatcher alone (`observer`: no inputs or outputs asked
    for; `observer+io`: with them, as the recorder asks); under a check whose recorder observes
    only (`observe`: the observer with its inputs and outputs, c10's GPU trace, the allocator's
    tracker, the Python-level hooks); and under a full check (`streamsan`). The checks' blocks
    time the loop inside the check only (entering and leaving it are `startup`'s). Microseconds
    per iteration, the median of `rounds` rounds after a warm-up round."""
    from streamsan.torch import _native

    ext = _native.load()
    samples: dict = {m: [] for m in FLOOR_MODES}
    with _workload("floor", workload, device, warmup=20) as step:
        for rnd in range(rounds + 1):
            for m in _rotated(FLOOR_MODES, rnd):
                if m in ("observe", "streamsan"):
                    us = _checked_block(step, iters, device, PROFILE.get(m, "0"))
                else:
                    if m != "plain":
                        ext.bench_floor(True, m == "observer+io")
                    try:
                        us = _block(step, iters, device)
                    finally:
                        ext.bench_floor(False)
                if rnd:
                    samples[m].append(us)
    return {"workload": workload, "device": device, "iters": iters, "rounds": rounds, **_medians(samples)}


# What `ablate` leaves out of a check, by mode: the recorder's bench_ablate mask.
ABLATIONS = {"no-site": 1, "no-checker": 2, "no-allocator": 4, "no-write": 8, "no-all": 15, "gil-site": 16}


def ablate(workload: str, iters: int, rounds: int = 5, device: str = "cuda", micro: int = 20000) -> dict:
    """What each part of recording costs in place: in one process, interleaved, the workload
    plain, observed only, checked, and checked with one part of the recording left out (the
    recorder's bench_ablate: `no-site` takes no user frame, `no-checker` drops the batches
    instead of handing them to the checker, `no-allocator` ignores the allocator's events,
    `no-write` takes each op's regions and writes nothing, `no-all` all four; `gil-site` leaves
    nothing out but finds every op's user frame under the GIL, as the recorder did before it
    read frames without it). The ablated
    checks record a wrong trace: only their time counts. Also the recorder's building blocks on
    this host (bench_micro: ns per call of the clock, the GIL taken and dropped, the user's site,
    a mutex, a small allocation). Microseconds per iteration, the median of `rounds` rounds."""
    from streamsan.torch import _native

    ext = _native.load()
    modes = ["plain", "observe", "streamsan", *ABLATIONS]
    samples: dict = {m: [] for m in modes}
    with _workload("ablate", workload, device, warmup=20) as step:
        for rnd in range(rounds + 1):
            for m in _rotated(modes, rnd):
                if m == "plain":
                    us = _block(step, iters, device)
                else:
                    ext.bench_ablate(ABLATIONS.get(m, 0))
                    try:
                        us = _checked_block(step, iters, device, PROFILE.get(m, "0"))
                    finally:
                        ext.bench_ablate(0)
                if rnd:
                    samples[m].append(us)
    return {"workload": workload, "device": device, "iters": iters, "rounds": rounds, **_medians(samples),
            "micro_ns": dict(ext.bench_micro(micro))}


def loop(workload: str, mode: str, iters: int, device: str = "cuda") -> dict:
    """A plain loop for a profiler (valgrind --tool=callgrind, perf): 50 steps, then `iters`
    steps plain, checked (`streamsan`) or observed only (`observe`), one intra-op thread on the
    CPU; the microseconds per step inside the check (entering and leaving it are `startup`'s)."""
    with _workload("loop", workload, device, warmup=50) as step:
        if mode == "plain":
            us = _block(step, iters, device)
        else:
            us = _checked_block(step, iters, device, PROFILE.get(mode, "0"))
    return {"workload": workload, "mode": mode, "device": device, "iters": iters, "us": round(us, 1)}


def startup(device: str = "cuda", n: int = 20, profile: int = 0, compiled: bool = False,
            between: int = 0, inside: int = 0, wait_ms: float = 0.0, model: str = "mlp",
            flush_mib: int = 0, idle_ms: float = 0.0) -> dict:
    """What a check costs to enter and to leave, around one op (what a short program pays once
    per check): milliseconds, the median of `n` after three not timed. With `profile`, that many
    more checks run under cProfile: `profile` gives each function's calls and microseconds per
    check (own time and with what it calls), the 25 largest by own time. With `compiled`, a
    function is compiled with `torch.compile` and run first (Dynamo and Inductor imported,
    Triton's classes there to hook, as in a compiled program). With `between`, that many
    training steps of an MLP (1024 wide, batch 64) run unchecked before each check, then a
    collection of the young garbage, and the check runs with the collector off: the caches hold
    the program's code and data, not the check's, as in the real-code suites, whose every timed
    run is a check of its own. With `inside`, the check is around that many steps of the same
    MLP (its ops handed to the checker while they run) instead of one op. `model`: that network
    instead of the MLP (`resnet`, `vit`: see _mlp_between). With `wait_ms`, the
    program then waits that long before the check ends, after a device synchronization (on the
    CPU, the fake device's: c10's GPU trace called as `torch.cuda.synchronize()` calls it), and
    in as many more checks without one: `exit_ms` is then leaving after the synchronization,
    `exit_nosync_ms` without; the wait is not timed (a program that waits for its GPU at its
    end, as most do). With `flush_mib`, the host writes a buffer of that many MiB before each
    check (the check's code and data evicted from the CPU's caches, and nothing else done);
    with `idle_ms`, the thread sleeps that long before each check (an idle core, as a program
    waiting for its GPU leaves it). Both are untimed, like `between`."""
    import torch

    import streamsan.torch

    x = torch.ones(4, device=device)
    if compiled:
        f = torch.compile(lambda t: torch.sin(t) * 2 + 1)
        f(x)
        _sync(device)
    if between or inside:
        net, opt, data = _mlp_between(device, model)
    flush = torch.zeros(flush_mib << 18) if flush_mib else None  # float32: 4 bytes each

    def steps(k: int) -> None:
        for _ in range(k):
            opt.zero_grad()
            net(data).square().mean().backward()
            opt.step()

    def once(sync: bool = True) -> tuple:
        cold = bool(between or flush_mib or idle_ms)
        if between:
            steps(between)
            _sync(device)
        if flush is not None:
            flush.add_(1)
        if cold:
            gc.collect(1)
            gc.disable()
        if idle_ms:
            time.sleep(idle_ms / 1e3)
        try:
            return _check_once(sync)
        finally:
            if cold:
                gc.enable()

    def _check_once(sync: bool) -> tuple:
        r = streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=device == "cpu")
        t0 = time.perf_counter()
        r.__enter__()
        t1 = time.perf_counter()
        if inside:
            steps(inside)
        else:
            x.add_(1)
        if wait_ms:
            if sync:
                device_sync()
            until = time.perf_counter() + wait_ms / 1e3
            while time.perf_counter() < until:  # busy, as a synchronizing thread spins
                pass
        else:
            _sync(device)
        t2 = time.perf_counter()
        r.__exit__(None, None, None)
        return (t1 - t0) * 1e3, (time.perf_counter() - t2) * 1e3, dict(getattr(r, "phase_seconds", {}))

    device_sync = _device_sync(device)
    for _ in range(3):
        once()
    # With a wait: checks with and without the synchronization alternate (the same caches).
    runs, nosync = [], []
    for _ in range(n):
        runs.append(once())
        if wait_ms:
            nosync.append(once(sync=False))
    out = {"device": device, "compiled": compiled, "between": between, "inside": inside, "model": model,
           "flush_mib": flush_mib, "idle_ms": idle_ms,
           "enter_ms": round(statistics.median(t[0] for t in runs), 3),
           "exit_ms": round(statistics.median(t[1] for t in runs), 3), "n": n,
           # the parts of entering and leaving (Run.phase_seconds), medians
           "parts_ms": {k: round(statistics.median(t[2][k] for t in runs) * 1e3, 3)
                        for k in runs[0][2] if all(k in t[2] for t in runs)}}
    if wait_ms:
        out["wait_ms"] = wait_ms
        out["exit_nosync_ms"] = round(statistics.median(t[1] for t in nosync), 3)
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(profile):
            once()
        prof.disable()
        st = pstats.Stats(prof)
        rows = []
        for (file, line, fn), (_cc, calls, tt, ct, _callers) in st.stats.items():
            rows.append((tt, ct, calls, f"{os.path.basename(file)}:{line}({fn})" if line else fn))
        rows.sort(reverse=True)
        out["profile"] = [{"function": name, "calls_per_check": round(calls / profile, 2),
                           "own_us": round(tt / profile * 1e6, 1), "cumulative_us": round(ct / profile * 1e6, 1)}
                          for tt, ct, calls, name in rows[:25]]
    return out


def _mlp_between(device: str, model: str = "mlp"):
    """The program `startup --between` runs between checks (and `--inside` in them): by default
    an MLP 1024→1024→1024, batch 64, SGD, on `device` (about 8 MiB of parameters); `resnet`:
    torchvision's ResNet-18, `vit`: timm's ViT-Tiny (64×64 images), batch 4, AdamW (each step's
    loss is the output's mean square)."""
    import torch

    torch.manual_seed(0)
    if model == "resnet":
        import torchvision

        net = torchvision.models.resnet18(num_classes=10).to(device)
    elif model == "vit":
        import timm

        net = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=64).to(device)
    else:
        net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).to(device)
        return net, torch.optim.SGD(net.parameters(), lr=1e-3), torch.randn(64, 1024, device=device)
    return net, torch.optim.AdamW(net.parameters()), torch.randn(4, 3, 64, 64, device=device)


def _vm() -> dict:
    """Resident and peak resident memory of this process, MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) // 1024
    return {"rss_mib": out.get("VmRSS"), "peak_rss_mib": out.get("VmHWM")}


COUNTERS = ("history", "generations", "graveyard")


def flat(rows: list) -> dict:
    """Whether memory stayed flat from the first mark (step 1,000) to the last."""
    if len(rows) < 2:
        return {"flat": False, "why": "fewer than two marks"}
    a, b = rows[0], rows[-1]
    why = []
    if b["rss_mib"] - a["rss_mib"] > 16:
        why.append(f"RSS grew {b['rss_mib'] - a['rss_mib']} MiB from step {a['step']} to {b['step']}")
    for k in COUNTERS:
        if k in a and k in b and b[k] > 2 * a[k] + 4096:
            why.append(f"{k} grew from {a[k]} to {b[k]}")
    return {"flat": not why, "why": "; ".join(why)}


def memory(steps: int, backend: str, sync_every: int = 0, device: str = "cuda",
           max_rss_mib: int = 12288, max_seconds: float = 120.0) -> dict:
    import streamsan.torch

    fake = device == "cpu"
    step = mlp(device)
    rows = []
    stopped = None
    t0 = time.perf_counter()
    run = streamsan.torch.Run(raise_on_hazard=False, backend=backend, _fake_device=fake)
    with run:
        base = {"step": 0, **_vm(), **run.stats()}
        for i in range(1, steps + 1):
            loss = step()
            if sync_every and i % sync_every == 0:
                loss.item()
                if fake:
                    # On the CPU, .item() waits for nothing: the synchronization a GPU's .item()
                    # makes goes through the GPU trace as CUDA's would.
                    _device_sync(device)()
            if i % 100 and i != steps:
                continue
            vm = _vm()
            seconds = time.perf_counter() - t0
            if vm["rss_mib"] > max_rss_mib:
                stopped = f"RSS {vm['rss_mib']} MiB > {max_rss_mib} MiB at step {i}"
            elif seconds > max_seconds:
                stopped = f"{seconds:.1f} s > {max_seconds} s at step {i}"
            if i % 1000 == 0 or i == steps or stopped:
                rows.append({"step": i, "seconds": round(seconds, 2), **vm, **run.stats()})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # progress, should it be killed
            if stopped:
                break
    verdict = flat([r for r in rows if r["step"] >= 1000 and (r["step"] % 1000 == 0 or r["step"] == steps)])
    if stopped:
        verdict = {"flat": False, "why": "stopped: " + stopped}
    return {
        "steps": steps,
        "sync_every": sync_every,
        "device": device,
        "backend": run.backend,
        "ops": run.report.ops,
        "errors": run.report.errors,
        "start": base,
        "marks": rows,
        "stopped": stopped,
        **verdict,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["all", "run", "memory", "paired", "startup", "floor", "loop", "ablate"])
    p.add_argument("mode", nargs="?")
    p.add_argument("workload", nargs="?")
    p.add_argument("--backend", default="auto")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--sync-every", type=int, default=0, help="memory: loss.item() every N steps")
    p.add_argument("--device", default="cuda",
                   help="memory, paired, floor, loop, ablate: cpu runs on CPU tensors standing for device memory")
    p.add_argument("--rounds", type=int, default=5, help="paired, floor, ablate: timed rounds")
    p.add_argument("--max-rss-mib", type=int, default=12288)
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--no-python", action="store_true", help="leave out the pure-Python recorder")
    p.add_argument("--profile", type=int, default=0, help="startup: that many more checks under cProfile")
    p.add_argument("--compiled", action="store_true", help="startup: a torch.compile'd function run first")
    p.add_argument("--between", type=int, default=0,
                   help="startup: that many unchecked training steps of an MLP before each check (cold caches)")
    p.add_argument("--inside", type=int, default=0,
                   help="startup: the check around that many training steps of the MLP, not one op")
    p.add_argument("--wait-ms", type=float, default=0.0,
                   help="startup: the program waits that long at the check's end, after a device "
                        "synchronization (exit_ms) and, alternating, without one (exit_nosync_ms)")
    p.add_argument("--flush-mib", type=int, default=0,
                   help="startup: the host writes a buffer of that many MiB before each check (cold caches)")
    p.add_argument("--idle-ms", type=float, default=0.0,
                   help="startup: the thread sleeps that long before each check (an idle core)")
    p.add_argument("--n", type=int, default=20, help="startup: checks timed (each way)")
    p.add_argument("--model", choices=["mlp", "resnet", "vit"], default="mlp",
                   help="startup: the network of --between and --inside (resnet: torchvision, vit: timm)")
    p.add_argument("--sync-each", action="store_true",
                   help="paired: a device synchronization after every step (fake on the CPU)")
    a = p.parse_args()
    if a.what == "run":
        print(json.dumps(run(a.mode, a.workload, a.backend, a.iters)))
        return
    if a.what == "startup":
        print(json.dumps(startup(a.device, n=a.n, profile=a.profile, compiled=a.compiled, between=a.between,
                                 inside=a.inside, wait_ms=a.wait_ms, model=a.model, flush_mib=a.flush_mib,
                                 idle_ms=a.idle_ms), indent=1))
        return
    if a.what == "paired":
        print(json.dumps(paired(a.mode or "mlp", a.iters, a.rounds, a.device, a.sync_each)))
        return
    if a.what == "floor":
        print(json.dumps(floor(a.mode or "mlp", a.iters, a.rounds, a.device)))
        return
    if a.what == "ablate":
        print(json.dumps(ablate(a.mode or "mlp", a.iters, a.rounds, a.device)))
        return
    if a.what == "loop":
        if a.workload not in ("plain", "streamsan", "observe"):
            p.error("loop WORKLOAD MODE: MODE is plain, streamsan or observe")
        print(json.dumps(loop(a.mode or "mlp", a.workload, a.iters, a.device)))
        return
    if a.what == "memory":
        print(json.dumps(memory(a.steps, a.backend, a.sync_every, a.device, a.max_rss_mib, a.max_seconds)))
        return
    results = []
    modes = [("plain", "auto"), ("streamsan", a.backend), ("csan", "auto")]
    if a.backend != "python" and not a.no_python:
        modes.append(("streamsan", "python"))
    for workload in ("mlp", "streams", "tiny"):
        for mode, backend in modes:
            out = subprocess.run(
                [sys.executable, __file__, "run", mode, workload, "--backend", backend, "--iters", str(a.iters)],
                capture_output=True, text=True,
            )
            if out.returncode != 0:
                results.append({"mode": mode, "workload": workload, "backend": backend, "failed": out.stderr[-2000:]})
                continue
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    table = {}
    for r in results:
        if "median_us" in r:
            key = r["mode"] if r["mode"] != "streamsan" else f"streamsan-{r.get('backend')}"
            table.setdefault(r["workload"], {})[key] = r["median_us"]
    for w, row in table.items():
        plain = row.get("plain")
        if plain:
            row.update({f"{k}_ratio": round(v / plain, 2) for k, v in list(row.items()) if k != "plain"})
    print(json.dumps({"runs": results, "table": table}, indent=1))


if __name__ == "__main__":
    main()
