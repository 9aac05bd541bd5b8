"""Where a checked real-code program's time goes, in Python: one program of the real-code or
compiled suite (tests/python/realcode.py, realcode_compiled.py), timed plain, under the C++
recorder observing only (`_profile="observe"`), without Triton's launch hooks, and checked, in
interleaved rounds in one process; then one checked run under cProfile, whose top functions are
printed (by own time and by cumulative time). A benchmark, not a test.

    python tests/python/profile_program.py "torch.compile nanoGPT" --rounds 5 [--top 25]
"""

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("program", help="a substring of the program's name")
    p.add_argument("--set", dest="suite", default="all", help="realcode, compiled or all")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--top", type=int, default=25)
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
    install_triton = _recorder.Recorder._install_triton

    def once(mode: str) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if mode == "plain":
            fn(True, False)
            torch.cuda.synchronize()
            return time.perf_counter() - t0
        if mode == "no-triton":
            _recorder.Recorder._install_triton = lambda self: None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with streamsan.torch.Run(raise_on_hazard=False, backend="native",
                                         _profile="observe" if mode == "observe" else "0") as run:
                    fn(True, False)
                    torch.cuda.synchronize()
        finally:
            _recorder.Recorder._install_triton = install_triton
        seconds = time.perf_counter() - t0
        if mode == "checked":
            once.stats = run.stats()
        return seconds

    modes = ["plain", "observe", "no-triton", "checked"]
    for m in modes:  # warm-up: compiles, caches
        once(m)
    samples: dict = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            samples[m].append(once(m))
    plain = statistics.median(samples["plain"])
    for m in modes:
        med = statistics.median(samples[m])
        spread = ", ".join(f"{s * 1e3:.1f}" for s in samples[m])
        print(f"{m:10s} {med * 1e3:8.1f} ms ({med / plain:.2f}x)   rounds: {spread}")
    st = getattr(once, "stats", {})
    for k in ("recorder_triton_launches", "ops", "recorder_sites_without_gil", "recorder_sites_with_gil"):
        if k in st:
            print(f"{k}: {st[k]}")

    prof = cProfile.Profile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with streamsan.torch.Run(raise_on_hazard=False, backend="native"):
            prof.enable()
            fn(True, False)
            torch.cuda.synchronize()
            prof.disable()
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.top)
        print(f"--- checked, by {key} ---")
        print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
