"""The table of the PyTorch program suite (tests/python/programs.py) on a GPU.

    python tests/python/gpu_report.py streamsan [--backend native|python]  > streamsan.json
    python tests/python/gpu_report.py csan                                 > csan.json
    python tests/python/gpu_report.py widen [--runs 5]                     > widen.json
    python tests/python/gpu_report.py streamsan|csan|widen --set graphs    # the CUDA graph programs
    python tests/python/gpu_report.py table streamsan.json csan.json widen.json [--backend B]
    python tests/python/gpu_report.py summary --suite FILE… [--overhead F] [--memory F…] [--pytest F]

`streamsan`: each variant run once under streamsan.torch.check: errors, the lines reported, and
whether one of them is a `# RACE` line (key `streamsan-BACKEND`, the recorder that ran). `csan`:
the same under PyTorch's CUDA sanitizer (its own process: it cannot be turned off). `widen`:
each variant run widened, uninstrumented, and how many runs produced wrong data. `table`: the
markdown table of docs/pytorch.md. `summary`: compact tables of everything gpu_all.sh measures,
and whether each done-criterion holds. `--set`: which programs (programs.program_sets): "suite"
(default), "graphs" (CUDA graphs; run in a process of their own: a capture that fails under
CSAN must not take the other programs with it) or "all". A program that raises is a row with
its exception (`"exception"`), not the end of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _programs(which: str = "suite"):
    import programs

    bugs, clean = programs.program_sets(which)
    out = [(name, fn, False) for name, fn in bugs.items()]
    out += [(name, fn, True) for name, fn in clean.items()]
    return programs, out


def _sync() -> None:
    import torch

    try:
        torch.cuda.synchronize()
    except Exception:
        pass


def run_streamsan(backend: str, which: str = "suite") -> dict:
    import streamsan.torch

    programs, progs = _programs(which)
    rows = {}
    ran = backend
    for name, fn, clean in progs:
        lines = programs.race_lines(fn)
        file = os.path.relpath(programs.__file__)
        row = {}
        for variant in ("buggy", "fixed"):
            t0 = time.perf_counter()
            run = streamsan.torch.check(raise_on_hazard=False, backend=backend)
            try:
                with run:
                    ok = fn(variant == "fixed", False)
            except Exception as e:
                _sync()
                row[variant] = {"errors": None, "kinds": [], "sites": [], "at_race_line": False,
                                "result_ok": None, "exception": f"{type(e).__name__}: {e}"[:500],
                                "seconds": round(time.perf_counter() - t0, 3)}
                continue
            ran = run.backend
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
    return {f"streamsan-{ran}": rows}


def _csan_error(e: BaseException):
    """CSAN's error among `e` and the exceptions it was raised during (CSAN raising inside a
    capture makes the capture's end fail too: that failure is what propagates), or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        if type(e).__name__ == "CUDASanitizerErrors":
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def run_csan(which: str = "suite") -> dict:
    import torch
    import torch.cuda._sanitizer as csan

    programs, progs = _programs(which)
    csan.enable_cuda_sanitizer()
    rows = {}
    for name, fn, clean in progs:
        row = {}
        for variant in ("buggy", "fixed"):
            try:
                fn(variant == "fixed", False)
                torch.cuda.synchronize()
                row[variant] = {"reported": False}
            except Exception as e:  # CUDASanitizerErrors (or a failure of the program under it)
                reported = _csan_error(e)
                row[variant] = {"reported": reported is not None, "error": type(e).__name__,
                                "message": str(reported if reported is not None else e)[:300]}
                _sync()
        rows[name] = row
    return {"csan": rows}


def run_widen(runs: int, which: str = "suite") -> dict:
    programs, progs = _programs(which)
    rows = {}
    for name, fn, clean in progs:
        row = {}
        for variant in ("buggy", "fixed"):
            bad = 0
            try:
                for _ in range(runs):
                    if not fn(variant == "fixed", True):
                        bad += 1
            except Exception as e:
                row[variant] = {"exception": f"{type(e).__name__}: {e}"[:500]}
                _sync()
                continue
            _sync()
            row[variant] = {"corrupted": bad, "runs": runs}
        rows[name] = row
    nccl = programs._group
    return {"widen": rows, "nccl_group": bool(nccl)}


def merge(data: dict, more: dict) -> dict:
    """Adds `more` to `data`: objects under the same key are merged (the rows of two program
    sets under "streamsan-native", "csan", "widen"), anything else replaced."""
    for k, v in more.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k].update(v)
        else:
            data[k] = v
    return data


def load(files: list[str]) -> dict:
    """The JSON objects of `files`, merged (text printed before an object is skipped)."""
    data: dict = {}
    for f in files:
        with open(f) as fh:
            text = fh.read()
        try:
            merge(data, json.loads(text))
        except ValueError:
            at = text.find("\n{")
            if at < 0:
                raise
            merge(data, json.loads(text[at + 1:]))
    return data


def _streamsan_rows(data: dict, backend: str = "native") -> dict:
    for key in (f"streamsan-{backend}", "streamsan"):
        if key in data:
            return data[key]
    return next((v for k, v in data.items() if k.startswith("streamsan-")), {})


def table(files: list[str], backend: str = "native") -> str:
    data = load(files)
    s = _streamsan_rows(data, backend)
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
        verdict = lambda r: (f"raised {r['exception'].split(':')[0]}" if r.get("exception")  # noqa: E731
                             else f"{r['errors']} errors ({', '.join(r['kinds'])})" if r["errors"] else "clean")
        out.append(
            f"| {name} | {verdict(b)} | {'yes' if b['at_race_line'] else 'no'}: {', '.join(b['sites'][:3])} | {verdict(f)} "
            f"| {wb.get('corrupted', '?')}/{wb.get('runs', '?')} | {wf.get('corrupted', '?')}/{wf.get('runs', '?')} "
            f"| {'reported' if cb.get('reported') else 'missed' if cb else '?'} | {'false alarm' if cf.get('reported') else 'clean' if cf else '?'} |"
        )
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# summary: what gpu_all.sh prints at the end


def _verdict(r: dict) -> str:
    if r is None:
        return "?"
    if r.get("exception"):
        return "RAISED " + r["exception"].split(":")[0]
    if not r.get("errors"):
        return "clean"
    kinds = ",".join(k.replace("data-race", "race").replace("reuse-race", "reuse").replace("unsafe-free", "free")
                     for k in r["kinds"])
    lines = ",".join(s.rsplit(":", 1)[-1] for s in r["sites"][:3])
    return f"{kinds} @{lines}" + (" ok" if r.get("at_race_line") else " WRONG LINE")


def _grid(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def suite_summary(data: dict, checks: list) -> str:
    c = data.get("csan", {})
    w = data.get("widen", {})
    backends = [k[len("streamsan-"):] for k in data if k.startswith("streamsan-")]
    for what, there in (("native recorder", "native" in backends), ("Python recorder", "python" in backends),
                        ("CSAN", bool(c)), ("widened runs", bool(w))):
        if not there:
            checks.append((f"program suite: {what} measured", False))
    names = list(next((data[f"streamsan-{b}"] for b in backends), {}) or w or c)
    head = ["program"]
    for b in backends:
        head += [f"{b} buggy", f"{b} fixed"]
    head += ["corrupted buggy", "fixed", "CSAN buggy", "fixed"]
    rows = [head]
    for name in names:
        row = [name[:38]]
        clean_program = False
        for b in backends:
            r = data[f"streamsan-{b}"].get(name, {})
            clean_program = r.get("clean_program", clean_program)
            row += [_verdict(r.get("buggy")), _verdict(r.get("fixed"))]
            bug, fix = r.get("buggy") or {}, r.get("fixed") or {}
            if clean_program:
                checks.append((f"{b}: {name}: clean in both variants", bug.get("errors") == 0 and fix.get("errors") == 0))
            else:
                checks.append((f"{b}: {name}: buggy reported at its # RACE line", bool(bug.get("errors")) and bool(bug.get("at_race_line"))))
                checks.append((f"{b}: {name}: fixed clean", fix.get("errors") == 0))
        wb, wf = w.get(name, {}).get("buggy", {}), w.get(name, {}).get("fixed", {})
        row += [f"{wb.get('corrupted', '?')}/{wb.get('runs', '?')}", f"{wf.get('corrupted', '?')}/{wf.get('runs', '?')}"]
        if "corrupted" in wb and "corrupted" in wf:
            agree = wf["corrupted"] == 0 and ((wb["corrupted"] == 0) if clean_program else (wb["corrupted"] > 0))
            checks.append((f"widened: {name}: corruption agrees with the verdict", agree))
        elif "exception" in wb or "exception" in wf:
            checks.append((f"widened: {name}: ran ({wb.get('exception') or wf.get('exception')})", False))
        cb, cf = c.get(name, {}).get("buggy"), c.get(name, {}).get("fixed")
        csan = lambda r, bad: "?" if r is None else (("reported" if bad else "FALSE ALARM") if r.get("reported") else f"raised {r['error']}" if r.get("error") else ("missed" if bad else "clean"))  # noqa: E731
        row += [csan(cb, not clean_program), csan(cf, False)]
        rows.append(row)
    return _grid(rows)


def overhead_summary(data: dict, checks: list) -> str:
    table = data.get("table", {})
    for wl in ("mlp", "streams"):
        if "plain" not in table.get(wl, {}):
            checks.append((f"overhead: {wl} measured", False))
    rows = [["workload", "plain us", "native us", "x", "python us", "x", "CSAN us", "x"]]
    for wl, r in table.items():
        def cell(key):
            v = r.get(key)
            ratio = r.get(f"{key}_ratio")
            return ("?" if v is None else f"{v:.1f}"), ("?" if ratio is None else f"{ratio:.2f}")

        n, p, c = cell("streamsan-native"), cell("streamsan-python"), cell("csan")
        rows.append([wl, f"{r['plain']:.1f}" if "plain" in r else "?", *n, *p, *c])
        ratio = r.get("streamsan-native_ratio")
        checks.append((f"overhead: {wl}: native recorder <= 2.0x plain ({ratio})", ratio is not None and ratio <= 2.0))
    failed = [f"{x['mode']}/{x['workload']}/{x.get('backend', '')}" for x in data.get("runs", []) if "failed" in x]
    out = _grid(rows)
    if failed:
        out += "\nfailed runs: " + ", ".join(failed)
    return out


def memory_summary(runs: list, checks: list) -> str:
    rows = [["loop", "step", "RSS MiB", "peak MiB", "history", "generations", "graveyard", "live bufs", "ops", "s"]]
    for m in runs:
        label = "no sync" if not m.get("sync_every") else f"item/{m['sync_every']}"
        for r in m.get("marks", []):
            if r["step"] in (1000, 5000, 10000) or r is m["marks"][-1]:
                rows.append([label, r["step"], r.get("rss_mib"), r.get("peak_rss_mib"), r.get("history"),
                             r.get("generations"), r.get("graveyard"), r.get("recorder_live_device_buffers"),
                             r.get("ops"), r.get("seconds")])
        checks.append((f"memory ({label}, {m.get('backend')}): flat over {m.get('steps')} steps"
                       + ("" if m.get("flat") else f" -- {m.get('why')}"), bool(m.get("flat"))))
    return _grid(rows)


def summary(a) -> int:
    checks: list = []
    parts = []
    if a.pytest:
        last: list = []
        try:
            with open(a.pytest) as f:
                last = [line.strip() for line in f if line.strip()]
            tail = next((line for line in reversed(last) if " in " in line and ("passed" in line or "failed" in line or "error" in line)),
                        "no summary line: stopped before pytest printed it (its time limit? see log.txt)" if last else "no output")
        except OSError as e:
            tail = f"no pytest output ({e})"
        # with the tests that failed or raised, by name (pytest's `-rfE` lines)
        parts.append("\n".join(["pytest tests/python (STREAMSAN_REQUIRE_GPU=1): " + tail.strip("= ")]
                               + ["  " + line for line in last if line.startswith(("FAILED ", "ERROR "))]))
        checks.append(("pytest: all Python tests pass on the GPU", "passed" in tail and "failed" not in tail and "error" not in tail))
    if a.suite:
        data = {}
        for f in a.suite:
            try:
                merge(data, load([f]))
            except (OSError, ValueError) as e:
                parts.append(f"{f}: unreadable ({e})")
        parts.append("program suite (verdicts: kinds @lines; corrupted: widened runs with wrong data)\n" + suite_summary(data, checks))
    if a.overhead:
        try:
            parts.append("overhead, median us per iteration\n" + overhead_summary(load([a.overhead]), checks))
        except (OSError, ValueError) as e:
            parts.append(f"overhead: unreadable ({e})")
            checks.append(("overhead measured", False))
    if a.memory:
        runs = []
        for f in a.memory:
            try:
                d = load([f])
            except (OSError, ValueError) as e:
                parts.append(f"{f}: unreadable ({e})")
                d = {}
            # one run, or several by name (gpu_all.sh's memory.json)
            runs.extend([d] if "marks" in d else [v for v in d.values() if isinstance(v, dict) and "marks" in v])
        if runs:
            parts.append("memory of an online-checked MLP training loop\n" + memory_summary(runs, checks))
        else:
            checks.append(("memory measured", False))
    parts.append("\n".join(f"[{'PASS' if ok else 'FAIL'}] {what}" for what, ok in checks))
    print("\n\n".join(parts))
    return 0 if checks and all(ok for _, ok in checks) else 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["streamsan", "csan", "widen", "table", "summary"])
    p.add_argument("files", nargs="*")
    p.add_argument("--backend", default="auto")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--set", default="suite", choices=["suite", "graphs", "all"], help="which programs")
    p.add_argument("--suite", nargs="*", default=[], help="summary: JSON files of streamsan/csan/widen")
    p.add_argument("--overhead", help="summary: bench_overhead.py all's JSON")
    p.add_argument("--memory", nargs="*", default=[], help="summary: bench_overhead.py memory's JSON files")
    p.add_argument("--pytest", help="summary: pytest's output")
    a = p.parse_args()
    if a.what == "table":
        print(table(a.files, "native" if a.backend == "auto" else a.backend))
        return
    if a.what == "summary":
        sys.exit(summary(a))
    res = {
        "streamsan": lambda: run_streamsan(a.backend, a.set),
        "csan": lambda: run_csan(a.set),
        "widen": lambda: run_widen(a.runs, a.set),
    }[a.what]()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
