"""What creating and finishing a Checker costs, by how it is made (docs/performance.md, "Entering
and leaving a check"): threaded or not, keeping the ops for explanations (a temporary spool file)
or not. Each combination is made, drained and finished `--n` times around no ops; prints the
median microseconds of the creation and of drain + finish, as JSON.

    python tests/python/bench_checker_start.py [--n 300]

`--trace FILE`: instead, a Checker (threaded or not, keeping the ops) is handed the whole trace
FILE, then drained and finished, `--n` times: the median milliseconds of `finish` alone (what is
left of leaving a check once every op is checked) and of the drain before it.

    python tests/python/bench_checker_start.py --trace t.jsonl --n 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--trace", help="time finish after a whole trace (JSON Lines) instead")
    a = p.parse_args()
    from streamsan import Checker

    if a.trace:
        with open(a.trace, "rb") as f:
            data = f.read()
        out = {}
        for threaded in (False, True):
            drained, finished = [], []
            for _ in range(a.n):
                c = Checker(explain=True, name=a.trace, threaded=threaded)
                c.push_lines(data)
                t0 = time.perf_counter()
                c.drain()
                t1 = time.perf_counter()
                r = c.finish()
                t2 = time.perf_counter()
                ops = r.ops
                del r
                drained.append(t1 - t0)
                finished.append(t2 - t1)
            out[f"threaded={threaded}"] = {"ops": ops, "drain_ms": round(statistics.median(drained) * 1e3, 3),
                                           "finish_ms": round(statistics.median(finished) * 1e3, 3)}
        print(json.dumps(out, indent=1))
        return

    out = {}
    for rnd in range(2):  # the second round is the one reported (the first warms the caches)
        for threaded in (False, True):
            for explain in (False, True):
                made, ended = [], []
                for _ in range(a.n):
                    t0 = time.perf_counter()
                    c = Checker(explain=explain, name="x", threaded=threaded)
                    t1 = time.perf_counter()
                    c.drain()
                    r = c.finish()
                    del r
                    t2 = time.perf_counter()
                    made.append(t1 - t0)
                    ended.append(t2 - t1)
                out[f"threaded={threaded} explain={explain}"] = {
                    "create_us": round(statistics.median(made) * 1e6, 1),
                    "drain_finish_us": round(statistics.median(ended) * 1e6, 1),
                }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
