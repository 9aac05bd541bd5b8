"""What leaving a check costs when it found hazards, against the same program without them
(docs/performance.md, "Leaving a check that found hazards").

    python tests/python/bench_check_end.py [--hazards 12] [--ops 2000] [--checks 16] [--no-explain]

The program runs on the fake device (CPU tensors standing for device memory, no GPU needed):
`--hazards` tensors written on one stream, `--ops` pairs of small ops on it (a temporary made
and scaled), then, in the checks with hazards, each tensor written on a second stream without a
wait (a data race apiece). Checks with and without the races alternate, the collector off; prints
the medians of `Run.phase_seconds`' parts of leaving (`exit_report`: the checker's report made)
as JSON, then reads each report's text once (where the hazards are explained) and times that.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hazards", type=int, default=12)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--checks", type=int, default=16)
    ap.add_argument("--no-explain", action="store_true", help="Run(explain=False): no copy of the ops kept")
    args = ap.parse_args()

    import torch

    import streamsan.torch
    from test_recorder_cpu import Fake

    def body(f: Fake, races: bool) -> None:
        f.stream(1, "main")
        f.stream(2, "side")
        f.stream(1)
        xs = [torch.ones(256) for _ in range(args.hazards)]
        for x in xs:
            x.add_(1)
        for _ in range(args.ops):
            t = torch.ones(64)
            t.mul_(2)
            del t
        if races:
            f.stream(2)
            for x in xs:
                x.mul_(3)  # no wait for the main stream's add_
            f.stream(1)

    parts = ("exit_recorder", "exit_drain", "exit_report")
    times: dict = {True: {p: [] for p in parts + ("text",)}, False: {p: [] for p in parts + ("text",)}}
    found = {True: 0, False: 0}
    for i in range(args.checks + 2):
        for races in (True, False):
            gc.collect()
            gc.disable()
            run = streamsan.torch.Run(raise_on_hazard=False, backend="native", _fake_device=True,
                                      explain=not args.no_explain)
            with run:
                body(Fake(run), races)
            t0 = time.perf_counter()
            run.report.to_text()
            text = time.perf_counter() - t0
            gc.enable()
            if i < 2:
                continue  # warm-up
            for p in parts:
                times[races][p].append(run.phase_seconds[p])
            times[races]["text"].append(text)
            found[races] = run.report.errors
    out = {"hazards": args.hazards, "ops_per_check": run.report.ops, "explain": not args.no_explain}
    for races in (True, False):
        key = "with_hazards" if races else "clean"
        out[key] = {f"{p}_ms": round(statistics.median(v) * 1e3, 3) for p, v in times[races].items()}
        out[key]["errors"] = found[races]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
