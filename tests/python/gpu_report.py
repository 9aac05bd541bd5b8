"""The table of the PyTorch program suite (tests/python/programs.py) on a GPU.

    python tests/python/gpu_report.py streamsan [--backend native|python]  > streamsan.json
    python tests/python/gpu_report.py csan                                 > csan.json
    python tests/python/gpu_report.py widen [--runs 5]                     > widen.json
    python tests/python/gpu_report.py table streamsan.json csan.json widen.json

`streamsan`: each variant run once under streamsan.torch.check: errors, the lines reported, and
whether one of them is a `# RACE` line. `csan`: the same under PyTorch's CUDA sanitizer (its
own process: it cannot be turned off). `widen`: each variant run widened, uninstrumented, and
how many runs produced wrong data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _programs():
    import programs

    out = [(name, fn, False) for name, fn in programs.PROGRAMS.items()]
    out += [(name, fn, True) for name, fn in programs.CLEAN.items()]
    return programs, out


def run_streamsan(backend: str) -> dict:
    import streamsan.torch

    programs, progs = _programs()
    rows = {}
    for name, fn, clean in progs:
        lines = programs.race_lines(fn)
        file = os.path.relpath(programs.__file__)
        row = {}
        for variant in ("buggy", "fixed"):
            t0 = time.perf_counter()
            with streamsan.torch.check(raise_on_hazard=False, backend=backend) as run:
                ok = fn(variant == "fixed", False)
            hazards = run.report.hazards
            sites = sorted({h["access"]["site"] for h in hazards if h.get("access") and h["access"].get("site")})
            at_line = any(s.rsplit(":", 1)[0].endswith(os.path.basename(file)) and int(s.rsplit(":", 1)[1]) in lines
                          for s in sites if ":" in s)
            row[variant] = {
                "errors": run.report.errors,
                "kinds": sorted({h["kind"] for h in hazards}),
                "sites": sites,
                "at_race_line": at_line,
                "result_ok": ok,
                "backend": run.backend,
                "seconds": round(time.perf_counter() - t0, 3),
            }
            if variant == "buggy" and run.report.errors and not at_line:
                row[variant]["text"] = run.report.to_text()
            if variant == "fixed" and run.report.errors:
                row[variant]["text"] = run.report.to_text()
        row["race_lines"] = sorted(lines)
        row["clean_program"] = clean
        rows[name] = row
    return {"streamsan": rows}


def run_csan() -> dict:
    import torch
    import torch.cuda._sanitizer as csan

    programs, progs = _programs()
    csan.enable_cuda_sanitizer()
    rows = {}
    for name, fn, clean in progs:
        row = {}
        for variant in ("buggy", "fixed"):
            try:
                fn(variant == "fixed", False)
                torch.cuda.synchronize()
                row[variant] = {"reported": False}
            except Exception as e:  # CUDASanitizerErrors
                row[variant] = {"reported": True, "error": type(e).__name__, "message": str(e)[:300]}
                torch.cuda.synchronize()
        rows[name] = row
    return {"csan": rows}


def run_widen(runs: int) -> dict:
    import torch

    programs, progs = _programs()
    rows = {}
    for name, fn, clean in progs:
        row = {}
        for variant in ("buggy", "fixed"):
            bad = 0
            for _ in range(runs):
                if not fn(variant == "fixed", True):
                    bad += 1
            torch.cuda.synchronize()
            row[variant] = {"corrupted": bad, "runs": runs}
        rows[name] = row
    nccl = programs._group
    return {"widen": rows, "nccl_group": bool(nccl)}


def table(files: list[str]) -> str:
    data = {}
    for f in files:
        with open(f) as fh:
            data.update(json.load(fh))
    s = data.get("streamsan", {})
    c = data.get("csan", {})
    w = data.get("widen", {})
    out = [
        "| program | streamsan buggy | line reported | streamsan fixed | corrupted buggy | corrupted fixed | CSAN buggy | CSAN fixed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in s.items():
        b, f = row["buggy"], row["fixed"]
        wb = w.get(name, {}).get("buggy", {})
        wf = w.get(name, {}).get("fixed", {})
        cb = c.get(name, {}).get("buggy", {})
        cf = c.get(name, {}).get("fixed", {})
        verdict = lambda r: f"{r['errors']} errors ({', '.join(r['kinds'])})" if r["errors"] else "clean"  # noqa: E731
        out.append(
            f"| {name} | {verdict(b)} | {'yes' if b['at_race_line'] else 'no'}: {', '.join(b['sites'][:3])} | {verdict(f)} "
            f"| {wb.get('corrupted', '?')}/{wb.get('runs', '?')} | {wf.get('corrupted', '?')}/{wf.get('runs', '?')} "
            f"| {'reported' if cb.get('reported') else 'missed' if cb else '?'} | {'false alarm' if cf.get('reported') else 'clean' if cf else '?'} |"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["streamsan", "csan", "widen", "table"])
    p.add_argument("files", nargs="*")
    p.add_argument("--backend", default="auto")
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    if a.what == "table":
        print(table(a.files))
        return
    res = {"streamsan": lambda: run_streamsan(a.backend), "csan": run_csan, "widen": lambda: run_widen(a.runs)}[a.what]()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
