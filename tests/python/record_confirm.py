"""On a GPU: record real PyTorch programs of the suite (the buggy variants, not widened) with
`streamsan.torch`, then provoke every hazard of each recorded trace with `streamsan check
--confirm sim` and `--confirm cuda`, and print how many were confirmed, per program.

    python3 tests/python/record_confirm.py OUTDIR

Writes OUTDIR/<program>.jsonl (the recorded traces) and OUTDIR/confirm.json; exit status 1 when a
reuse hazard of `free_without_record_stream` is not confirmed on both backends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

import streamsan.torch
import programs


def confirm(path: str, backend: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "streamsan", "check", "--confirm", backend, "--attempts", "5",
         "--format", "json", path],
        capture_output=True, text=True, timeout=300,
    )
    if out.returncode not in (0, 1):
        return [{"error": out.stderr.strip()[:500]}]
    return [
        {"kind": h["kind"], "op": h["op"], "buffer": h["buffer"], "confirmation": h.get("confirmation")}
        for h in json.loads(out.stdout)["hazards"]
    ]


def main() -> int:
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    results = {}
    for name, fn in programs.PROGRAMS.items():
        path = os.path.join(outdir, f"{name}.jsonl")
        with streamsan.torch.check(raise_on_hazard=False, trace=path) as run:
            fn(False, False)
        torch.cuda.synchronize()
        results[name] = {
            "ops": run.report.ops if hasattr(run.report, "ops") else None,
            "checked": [h["kind"] for h in run.report.hazards],
            "sim": confirm(path, "sim"),
            "cuda": confirm(path, "cuda"),
        }
    with open(os.path.join(outdir, "confirm.json"), "w") as f:
        json.dump(results, f, indent=1)
    ok = True
    for name, r in results.items():
        for backend in ("sim", "cuda"):
            hs = r[backend]
            conf = sum(1 for h in hs if (h.get("confirmation") or {}).get("observed", 0) > 0)
            skipped = [h["confirmation"]["skipped"] for h in hs if "skipped" in (h.get("confirmation") or {})]
            errors = [h["error"] for h in hs if "error" in h]
            print(f"{name:40s} {backend:4s} {len(hs)} hazards, {conf} confirmed"
                  + (f"; not run: {sorted(set(skipped))}" if skipped else "")
                  + (f"; ERROR {errors}" if errors else ""))
    # The suite's programs are keyed by their titles.
    reuse = next((r for name, r in results.items() if name.startswith("free without record_stream")), {})
    for backend in ("sim", "cuda"):
        hs = [h for h in reuse.get(backend, []) if h.get("kind") == "reuse-race"]
        if not hs or not all((h.get("confirmation") or {}).get("observed", 0) > 0 for h in hs):
            print(f"[FAIL] the recorded reuse of 'free without record_stream' is not confirmed on {backend}")
            ok = False
        else:
            print(f"[PASS] the recorded reuse of 'free without record_stream' is confirmed on {backend}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
