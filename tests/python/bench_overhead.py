"""Overhead of streamsan.torch.check and of PyTorch's CUDA sanitizer (CSAN) on two workloads.

    python tests/python/bench_overhead.py all          # every mode, each in its own process
    python tests/python/bench_overhead.py run MODE WORKLOAD [--backend B]
    python tests/python/bench_overhead.py memory --steps 10000

Workloads: `mlp`, a small MLP training step (Linear 256→512→512→10, batch 64, SGD), and
`streams`, a two-stream launch-bound loop (in-place adds on two streams ordered by wait_stream).
Modes: `plain`, `streamsan` (streamsan.torch.check, default settings), `csan`
(torch.cuda._sanitizer.enable_cuda_sanitizer()). Each mode runs in a fresh process (CSAN cannot
be turned off); each figure is the median of 5 timed blocks of ITERS iterations after a warm-up,
in microseconds per iteration, with the GPU synchronized at the end of each block.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def mlp():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

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


WORKLOADS = {"mlp": mlp, "streams": streams}


def timed(step, iters: int, blocks: int = 5) -> list[float]:
    import torch

    for _ in range(50):
        step()
    torch.cuda.synchronize()
    out = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / iters * 1e6)
    return out


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


def memory(steps: int, backend: str) -> dict:
    import torch

    import streamsan.torch

    step = mlp()
    rss = []
    t0 = time.perf_counter()
    with streamsan.torch.check(raise_on_hazard=False, backend=backend) as r:
        for i in range(1, steps + 1):
            step()
            if i % 1000 == 0:
                torch.cuda.synchronize()
                rss.append((i, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024))
    return {
        "steps": steps,
        "backend": r.backend,
        "ops": r.report.ops,
        "errors": r.report.errors,
        "max_rss_mib_by_step": rss,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["all", "run", "memory"])
    p.add_argument("mode", nargs="?")
    p.add_argument("workload", nargs="?")
    p.add_argument("--backend", default="auto")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--no-python", action="store_true", help="leave out the pure-Python recorder")
    a = p.parse_args()
    if a.what == "run":
        print(json.dumps(run(a.mode, a.workload, a.backend, a.iters)))
        return
    if a.what == "memory":
        print(json.dumps(memory(a.steps, a.backend)))
        return
    results = []
    modes = [("plain", "auto"), ("streamsan", a.backend), ("csan", "auto")]
    if a.backend != "python" and not a.no_python:
        modes.append(("streamsan", "python"))
    for workload in WORKLOADS:
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
