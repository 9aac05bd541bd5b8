"""Instructions the C++ recorder's RecordFunction callbacks execute per op, counted by callgrind
(a count that does not depend on the machine's load, unlike a time; docs/performance.md).

    python tests/python/bench_callback_instructions.py [--model resnet|vit|mlp] [--steps 2] [--steady 10]

Runs `--steps` training steps of bench_overhead.py's model on the fake device (CPU tensors
standing for device memory; records deferred, as on a GPU), twice, each time in a check of its
own after one unchecked step, under `valgrind --tool=callgrind`, counting only inside the
recorder's `on_start` and `on_end` callbacks, less what they do for the recorder's thread when
they find the queue full (`queued`, all its calls: under valgrind the threads run one at a time,
so the program's thread catches up far more often than it does on its own). Prints the
instructions counted, the ops observed and those recorded in full (calls of `on_start`; of the
record's builder in `on_end`), and the instructions per op observed (its start and end callbacks
together) and per op recorded. A short check's count holds what its first ops pay once (each
op's kind and each line's site found the slow way); `--steady N` runs N steps a check as well and
prints what each step beyond the first `--steps` adds, in all and by function: what a long run
pays a step. Needs valgrind, torch and the model's package (torchvision, timm); takes a few
minutes a run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

TOGGLES = [
    "(anonymous namespace)::on_start(at::RecordFunction const&)",
    "(anonymous namespace)::on_end(at::RecordFunction const&, at::ObserverContext*)",
]
# What a callback does for the recorder's thread when it finds the queue full: left out.
QUEUED = "(anonymous namespace)::queued(unsigned long, bool)"


def child(model: str, steps: int) -> None:
    sys.path.insert(0, HERE)
    import bench_overhead as bo

    import streamsan.torch

    net, opt, data = bo._mlp_between("cpu", model)

    def run(k: int) -> None:
        for _ in range(k):
            opt.zero_grad()
            net(data).square().mean().backward()
            opt.step()

    run(1)
    for _ in range(2):
        with streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True) as r:
            run(steps)
    print(f"ops checked in the last check: {r.report.ops}")


def calls(tree: str, function: str, caller_of: str | None = None) -> int:
    """Calls of `function` (as callgrind_annotate --tree=caller lists its callers)."""
    total = 0
    block: list[str] = []
    for line in tree.splitlines() + [""]:
        if line.strip():
            block.append(line)
            continue
        if block and "*" in block[-1] and (caller_of or function) in block[-1]:
            for b in block[:-1]:
                if function in b and re.search(r"%\)\s+<", b):
                    m = re.search(r"\(([\d,]+)x\)", b)
                    if m:
                        total += int(m.group(1).replace(",", ""))
        block = []
    return total


def count(model: str, steps: int) -> dict:
    """One run under callgrind: the instructions in the callbacks (less the queue's catching up),
    the ops observed and recorded, and each function's own instructions."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "callgrind.out")
        env = dict(os.environ, STREAMSAN_DEFER="all", OMP_NUM_THREADS="1")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no"]
        cmd += [f"--toggle-collect={t}" for t in TOGGLES]
        cmd += [sys.executable, os.path.abspath(__file__), "--child", "--model", model, "--steps", str(steps)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"bench_callback_instructions: valgrind failed:\n{done.stderr[-2000:]}")
        m = re.search(r"Collected : (\d+)", done.stderr)
        if not m:
            raise SystemExit("bench_callback_instructions: no count in valgrind's output")
        collected = int(m.group(1))
        tree = subprocess.run(["callgrind_annotate", "--tree=caller", out], capture_output=True, text=True,
                              timeout=600).stdout
        inclusive = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                                   capture_output=True, text=True, timeout=600).stdout
        flat = subprocess.run(["callgrind_annotate", "--threshold=100", out], capture_output=True, text=True,
                              timeout=600).stdout
    queued = 0
    for line in inclusive.splitlines():
        if QUEUED in line:
            queued = int(line.split()[0].replace(",", ""))
            break
    own = {}
    for line in flat.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+\S*?:(.*?)(?: \[.*\])?$", line)
        if m and "PROGRAM TOTALS" not in line:
            own[m.group(2)] = own.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return {
        "collected": collected,
        "queued": queued,
        "total": collected - queued,
        # (on_start calls on_start_guarded, into which the compiler may fold on_start_impl)
        "observed": calls(tree, "::on_start(at::RecordFunction const&)", "on_start_guarded")
        or calls(tree, "::on_start(at::RecordFunction const&)", "on_start_impl"),
        "recorded": calls(tree, "::on_end_impl(", "{lambda((anonymous namespace)::Rec&)#1}::operator()"),
        "own": own,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet", choices=["resnet", "vit", "mlp"])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--steady", type=int, metavar="N",
                   help="also run N steps a check (N > --steps) and print what each step past the first "
                        "--steps costs: the difference of the two runs, by function (what a long run pays "
                        "a step, without what a check's first ops pay once)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.model, a.steps)
        return
    if a.steady is not None and a.steady <= a.steps:
        raise SystemExit("bench_callback_instructions: --steady must be more than --steps")
    c = count(a.model, a.steps)
    total, callbacks, recorded = c["total"], c["observed"], c["recorded"]
    print(f"{a.model}, 2 checks of {a.steps} steps: {total:,} instructions in the callbacks "
          f"({c['collected']:,} with the {c['queued']:,} of the queue's catching up)")
    if callbacks:
        print(f"  {callbacks:,} ops observed: {total / callbacks:,.0f} instructions each (its start and end)")
    if recorded:
        print(f"  {recorded:,} ops recorded in full: {total / recorded:,.0f} instructions each")
    if a.steady is None:
        return
    d = count(a.model, a.steady)
    steps = 2 * (a.steady - a.steps)
    per = (d["total"] - total) / steps
    obs = (d["observed"] - callbacks) / steps
    rec = (d["recorded"] - recorded) / steps
    print(f"{a.model}, 2 checks of {a.steady} steps: {d['total']:,} instructions; each step past the first "
          f"{a.steps}: {per:,.0f} instructions, {obs:,.0f} ops observed ({per / max(obs, 1):,.0f} each), "
          f"{rec:,.0f} recorded in full ({per / max(rec, 1):,.0f} each); what each check's first {a.steps} "
          f"steps paid beyond that: {(total - 2 * a.steps * per) / 2:,.0f} a check")
    rows = sorted(((d["own"].get(k, 0) - c["own"].get(k, 0), k) for k in set(c["own"]) | set(d["own"])),
                  reverse=True)
    for n, k in rows[:20]:
        if n > 0:
            print(f"  {n / steps:10,.0f} a step {100 * n / max(d['total'] - total, 1):5.1f}%  {k[:110]}")


if __name__ == "__main__":
    main()
