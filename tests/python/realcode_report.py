"""The real-code suite (tests/python/realcode.py, and the compiled suite of
tests/python/realcode_compiled.py) on a GPU: streamsan's verdicts under both recorders, CSAN's,
the widened runs and the cost, in one table.

    python tests/python/realcode_report.py warm --jobs 4                > warm.json   # compile once
    python tests/python/realcode_report.py streamsan --backend native   > native.json
    python tests/python/realcode_report.py streamsan --backend python   > python.json
    python tests/python/realcode_report.py csan                         > csan.json   # its own process
    python tests/python/realcode_report.py widen --runs 5               > widen.json
    python tests/python/realcode_report.py cost --runs 3                > cost.json   # plain / native / python
    python tests/python/realcode_report.py cost --csan --runs 3         > csan-cost.json   # plain, then CSAN
    python tests/python/realcode_report.py table native.json python.json csan.json widen.json cost.json csan-cost.json
    python tests/python/realcode_report.py summary FILES… [--allow-skips]

Every subcommand takes `--set realcode|compiled|extra|all` (the suite: realcode.py's programs,
the compiled ones of realcode_compiled.py, realcode_extra.py's, or all of them; default all, a
program of two once), `--only
NAME[,NAME…]` (exact names, or substrings of names), `--graphs all|without|only|last` (the
programs that capture CUDA graphs, realcode.captures(): realcode.CAPTURES and
realcode_compiled.COMPILED_CAPTURES; CSAN runs them
last, since a capture failing under it can leave the process unusable; cost runs each in a
process of its own) and `--deadline-seconds S`: no program starts once less than a few seconds
are left, and at the deadline a watchdog prints what was found so far (the program in progress
marked "timed out", every thread's stack on standard error) and exits; SIGTERM (`timeout`) does
the same. Results are JSON on standard output, progress lines on standard error. Before each run
of a program (outside any timing) a full garbage collection runs, so that what an earlier run left
in reference cycles (CUDA graphs among it) is freed then and not in the middle of a later capture
(what the imports made is frozen out of the collector's way first: `gc.freeze`). A program that
raises is a row with its exception, never the end of the run; one whose library is missing
(`RuntimeError("needs X")`) is a row "skipped: needs X".

Rows: a buggy-and-fixed program has the variants "buggy" and "fixed", a clean program the one
variant "clean" (run with fixed=True); `suite` says which suite it is of ("compiled": it
compiles, torch.compile or a Triton kernel).

Compiled programs: the C++ recorder sees the compiled code (Inductor's Triton kernels, CUDA graph
trees); the Python recorder and CSAN run it eagerly (Dynamo leaves a frame uncompiled while a
TorchDispatchMode is active): their verdicts on a compiled program are of its eager program, and
their cost is an eager run's against the compiled plain one. Their cost goal: the C++ recorder
at most COST_GOAL (1.3) times plain, shown beside the ratio (not a criterion); judged on a long
run's step (`cost --steady`) where it was measured, as the overhead goal measures every program,
else on a run that is a check of its own ("met (steady)" says which).

- `warm`: each selected program of the compiled suite (realcode.suite_of) run once, fixed,
  uninstrumented, spread over `--jobs` processes (each a `warm --child` of its share): it fills
  Inductor's and Triton's on-disk caches, so that the processes after it load what this one
  compiled. Seconds and result per program. Key `warm`.

- `streamsan`: each variant once under `streamsan.torch.check(raise_on_hazard=False,
  backend=B)`: errors, kinds, the sites reported (the hazards' `access` sites), whether one is a
  `# RACE` line of the program (`at_race_line`), the program's own verdict (`result_ok`), seconds,
  streamsan's warnings, the report's first 40 lines (`text`) when a clean or fixed variant has
  errors or a buggy one is not reported at its line, and what the run left in realcode.NOTES
  (`note`: a PyTorch bug it measured, for one); `triton_launches`, the Triton kernel launches the
  recorder saw (`run.stats()["recorder_triton_launches"]`, None where the recorder does not count
  them). Key `streamsan-BACKEND`.
- `csan`: `torch.cuda._sanitizer.enable_cuda_sanitizer()` (it cannot be turned off: run it in a
  process of its own), each variant once: reported or not. Key `csan`.
- `widen`: each variant `--runs` times with `widen=True`, uninstrumented: how many runs gave a
  wrong result (and the runs' notes, `note`). Key `widen`.
- `cost`: per program (its fixed or clean variant), one warm-up run in each mode (`warmup`:
  first-run costs are not timed), then up to `--runs` rounds of plain / check(native),
  interleaved (each round's order the last one's rotated by one), each after a garbage collection; the median seconds of each mode and the ratios to
  plain. Then the same for check(python) (`--no-python`: not), after every program's plain and
  native rounds: the Python recorder turns on torch's own GPU trace, which cannot be turned off
  (a Python call at every allocation and free from then on, plain runs included). `--profile`:
  the interleaved rounds also run the C++ recorder observing only (STREAMSAN_PROFILE=observe:
  called, recording nothing) and with its stages timed (STREAMSAN_PROFILE=1); the median round's
  stages are the row's `profile`, shown by `table` ("Where the time goes"). `--steady`: the
  rounds also time each program's third run inside one check around three, the first two
  untimed (`native-steady`: a long run's step, without the check's entry and exit), shown beside
  the per-check ratio; `summary` prints each mode's median and how many programs are within
  1.1×, 1.2× and 1.3× (`cost against plain`). A program's rounds
  stop once its share of the time left is spent (one timed round at least). The programs of realcode.CAPTURES (CUDA graphs, make_graphed_callables,
  torch.compile) run after the others, each in a process of its own (`cost --only NAME`, its
  JSON merged; `process`: its exit status and seconds): a capture that fails cannot leave the CUDA
  RNG or the allocator unusable for the other programs. A mode that raises is `failed` (the
  program's first exception printed in full on standard error, `tracebacks` in the row).
  `cost --csan` (key `cost-csan`): the plain warm-up and rounds of every program first, then CSAN
  imported (the import alone hooks every allocation: plain runs after it are nearly CSAN's) and
  enabled (it cannot be turned off), and a warm-up and the rounds under it; the CAPTURES programs
  the same, each in a process of its own; a program CSAN stops is "CSAN failed: …".
- `table FILES…`: one markdown table of all of it (cost: milliseconds and ratios to plain; a
  CSAN ratio marked * is to `cost`'s plain seconds; Triton launches the C++ recorder saw, "-"
  when unknown; the cost goal of compiled programs), then the notes and what cost did not measure.
- `summary FILES…`: a compact grid and a PASS/FAIL line per criterion: every clean program clean
  (and right) under both recorders; every buggy program reported at a `# RACE` line by both, its
  fixed variant clean; widened, every buggy variant corrupted at least once and no fixed or clean
  one ever. Under each FAIL of a clean (or fixed) variant, why in one line: the first hazard's
  first line of the report (`text`), else its exception. The notes (a PyTorch bug a program
  measured: "PyTorch bug #181723: gradients doubled (ratio 2.00), the same widened or not; not a
  synchronization bug"), the programs cost did not measure and the compiled programs' cost goal
  (met or not: not a criterion) are listed before the criteria. A
  skipped or unmeasured program fails (`--allow-skips`: a skip is a SKIP line). Exit status 0
  when every criterion passes.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
import warnings
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

START = time.monotonic()  # the deadline counts from here (imports of torch and the libraries included)
MIN_LEFT = 4.0  # seconds: a program is not started with less left before the deadline
TEXT_LINES = 40
SUITES = ("realcode", "compiled", "extra", "all")  # realcode.SUITES (that module needs torch)
COST_GOAL = 1.3  # the compiled programs' cost goal: the C++ recorder at most this times plain


def _log(msg: str) -> None:
    print(f"[realcode {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


from bench_overhead import _rotated  # noqa: E402  (the order of an interleaved round's modes)
from gpu_report import _csan_error, load, merge  # noqa: E402  (the suite report's helpers)


def _variants(clean: bool) -> list[str]:
    return ["clean"] if clean else ["buggy", "fixed"]


def _skip_reason(e: BaseException):
    """"needs X" when `e` says a program's library is missing, else None."""
    if isinstance(e, RuntimeError) and str(e).startswith("needs "):
        return str(e)[:300]
    return None


def _exc(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:800]


def _sync() -> None:
    try:
        import torch

        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        pass


def _collect() -> None:
    """A full garbage collection, between programs (never in a timed run): what an earlier run left
    in reference cycles (CUDA graphs among it) goes now, not in the middle of a later capture."""
    gc.collect()


def _versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for mod in ("torch", "torchvision", "timm", "transformers", "streamsan"):
        try:
            out[mod] = getattr(__import__(mod), "__version__", "?")
        except Exception as e:  # noqa: BLE001
            out[mod] = f"missing ({type(e).__name__})"
    try:
        import torch

        out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        pass
    return out


class Out:
    """What a subcommand found so far. Printed once: at its end, or, with what it has, by the
    watchdog at the deadline or on SIGTERM."""

    def __init__(self, key: str, deadline_seconds: float | None, meta: dict) -> None:
        self.key = key
        self.data = {key: {}, f"meta-{key}": dict(meta)}
        self.rows = self.data[key]
        self.meta = self.data[f"meta-{key}"]
        self.t0 = START
        self.pid = os.getpid()
        self.deadline = self.t0 + deadline_seconds if deadline_seconds else None
        self.current: tuple[str, str] | None = None
        self.child: subprocess.Popen | None = None  # a program run in a process of its own (cost)
        self.children: list = []  # processes of ours running at the same time (warm's)
        self.lock = threading.Lock()
        self.printed = False
        self.snapshot = json.dumps(self.data, indent=1)
        # what is alive now (torch and the libraries, imported) is never garbage: out of the
        # collector's way, so that the collections between programs and rounds are quick
        gc.collect()
        gc.freeze()
        if self.deadline is not None:
            threading.Thread(target=self._watchdog, daemon=True).start()
        try:
            signal.signal(signal.SIGTERM, lambda *_: self._stop("terminated (SIGTERM)"))
        except ValueError:  # not the main thread
            pass

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def publish(self) -> None:
        """Takes a snapshot of the rows: what the watchdog prints should it fire."""
        self.meta["seconds"] = round(time.monotonic() - self.t0, 2)
        self.snapshot = json.dumps(self.data, indent=1)

    def emit(self, why: str | None = None) -> bool:
        with self.lock:
            if self.printed:
                return False
            self.printed = True
        if why is None:
            self.publish()
            text = self.snapshot
        else:
            data = json.loads(self.snapshot)
            data[f"meta-{self.key}"]["stopped"] = why
            if self.current is not None:
                name, variant = self.current
                row = data[self.key].setdefault(name, {})
                row[variant] = {"exception": f"timed out: {why}", "timed_out": True}
            text = json.dumps(data, indent=1)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return True

    def _stop(self, why: str) -> None:
        if os.getpid() != self.pid:  # a forked DataLoader worker: not ours to report
            os._exit(1)
        _log(f"stopping: {why}; in progress: {self.current}")
        for child in [self.child, *self.children]:
            if child is not None and child.poll() is None:
                try:
                    child.kill()
                except OSError:
                    pass
        try:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        except Exception:  # noqa: BLE001
            pass
        if self.emit(why):
            os._exit(3)

    def _watchdog(self) -> None:
        while True:
            left = self.left()
            if left <= 0:
                break
            time.sleep(min(left, 1.0))
        if not self.printed:
            self._stop(f"deadline of {self.deadline - self.t0:.0f} s reached")


def _progs(a, graphs: str | None = None):
    """(realcode, the programs `a` selects): --set, --only, and --graphs (or `graphs`)."""
    import realcode

    names = [n.strip() for n in a.only.split(",") if n.strip()] if a.only else None
    progs = realcode.programs(names or None, graphs or a.graphs, suite=a.suite)
    realcode.compiled_programs()  # realcode_compiled (and triton) imported now: before any check or CSAN
    return realcode, progs


def _row(out: Out, realcode, name: str, fn, clean: bool, **more) -> dict:
    """out.rows[name], made with what every subcommand's row says: clean or not, and its suite."""
    return out.rows.setdefault(name, {"clean_program": clean, "suite": realcode.suite_of(fn), **more})


def _not_run(out: Out, name: str, clean: bool, why: str) -> None:
    row = out.rows.setdefault(name, {"clean_program": clean})
    for v in _variants(clean):
        row.setdefault(v, {"not_run": why})


# ----------------------------------------------------------------------------------------------
# streamsan


def _sites(hazards: list, field: str = "access") -> list[str]:
    out = set()
    for h in hazards:
        entries = h.get(field)
        if isinstance(entries, dict):
            entries = [entries]
        for a in entries or []:
            if isinstance(a, dict) and a.get("site"):
                out.add(a["site"])
    return sorted(out)


def _line_of(site: str, file: str):
    """The line of `site` ("path:line") when it is in `file` (compared by base name), else None."""
    if ":" not in site:
        return None
    path, line = site.rsplit(":", 1)
    if not path.endswith(os.path.basename(file)) or not line.isdigit():
        return None
    return int(line)


def _triton_launches(run):
    """The Triton launches the check's recorder saw, or None where it does not count them."""
    try:
        n = run.stats().get("recorder_triton_launches")
    except Exception:  # noqa: BLE001
        return None
    return n if isinstance(n, int) else None


def check_variant(realcode, fn, variant: str, backend: str) -> dict:
    """One run of a variant under streamsan.torch.check: its row."""
    import inspect

    import streamsan.torch

    lines = realcode.race_lines(fn)
    file = inspect.getsourcefile(fn) or realcode.__file__  # its `# RACE` lines are all in its file
    realcode.take_note(fn)
    _collect()
    t0 = time.perf_counter()
    res: dict = {}
    run = streamsan.torch.check(raise_on_hazard=False, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with run:
                got = fn(variant != "buggy", False)
                _sync()
            res["seconds"] = round(time.perf_counter() - t0, 3)
            res["result_ok"] = realcode.judged(got)  # a `Later` runs its reference outside the check
        except Exception as e:  # noqa: BLE001
            skip = _skip_reason(e)
            if skip:
                return {"skipped": skip}
            res["exception"] = _exc(e)
            res["traceback"] = traceback.format_exc()[-3000:]
            res["result_ok"] = None
            _sync()
    res.setdefault("seconds", round(time.perf_counter() - t0, 3))
    res["backend"] = run.backend
    res["triton_launches"] = _triton_launches(run)
    note = realcode.take_note(fn)
    if note is not None:
        res["note"] = note
    notes = []
    for w in caught:
        msg = str(w.message)
        if "streamsan" in msg and msg not in notes:
            notes.append(msg[:300])
    if notes:
        res["streamsan_warnings"] = notes[:8]
    report = run.report
    if report is None:
        res.update({"errors": None, "kinds": [], "sites": [], "at_race_line": False})
        return res
    hazards = report.hazards
    sites = _sites(hazards)
    at = [_line_of(s, file) for s in sites]
    res.update({
        "errors": report.errors,
        "warnings": report.warnings,
        "ops": report.ops,
        "kinds": sorted({h["kind"] for h in hazards}),
        "sites": sites,
        "conflict_sites": _sites(hazards, "conflicts")[:8],
        "at_race_line": any(line in lines for line in at if line is not None),
        "all_at_race_lines": bool(sites) and all(line in lines for line in at),
    })
    wrong = (variant != "buggy" and report.errors) or (variant == "buggy" and not res["at_race_line"]) \
        or "exception" in res
    if wrong and (report.errors or report.warnings):
        text = report.to_text().splitlines()
        res["text"] = "\n".join(text[:TEXT_LINES]) + (f"\n… ({len(text) - TEXT_LINES} more lines)"
                                                      if len(text) > TEXT_LINES else "")
    return res


def _brief(r: dict) -> str:
    if "skipped" in r:
        return r["skipped"]
    if "exception" in r:
        return "RAISED " + r["exception"][:120]
    if not r.get("errors"):
        s = "clean"
    else:
        s = f"{r['errors']} errors ({', '.join(r['kinds'])}) at {', '.join(x.rsplit(':', 1)[-1] for x in r['sites'][:4])}"
        s += " [RACE line]" if r.get("at_race_line") else " [not a RACE line]"
    if r.get("result_ok") is False:
        s += ", result wrong"
    if r.get("triton_launches") is not None:
        s += f", {r['triton_launches']} Triton launches"
    return s + f", {r.get('seconds', '?')} s"


def run_streamsan(a) -> Out:
    realcode, progs = _progs(a)
    out = Out(f"streamsan-{a.backend}", a.deadline_seconds, {"backend": a.backend, **_versions()})
    for i, (name, fn, clean) in enumerate(progs, 1):
        row = _row(out, realcode, name, fn, clean, race_lines=sorted(realcode.race_lines(fn)))
        for variant in _variants(clean):
            if out.left() < MIN_LEFT:
                row[variant] = {"not_run": "deadline"}
                continue
            out.current = (name, variant)
            r = check_variant(realcode, fn, variant, a.backend)
            out.current = None
            row[variant] = r
            if r.get("backend"):
                out.meta["ran"] = r["backend"]
            out.publish()
            _log(f"{a.backend} {i}/{len(progs)} {name} [{variant}]: {_brief(r)}")
            if "skipped" in r:
                for v in _variants(clean):
                    row.setdefault(v, {"skipped": r["skipped"]})
                break
    return out


# ----------------------------------------------------------------------------------------------
# CSAN


def run_csan(a) -> Out:
    import torch
    import torch.cuda._sanitizer as csan

    realcode, progs = _progs(a, "last" if a.graphs == "all" else None)
    out = Out("csan", a.deadline_seconds, _versions())
    csan.enable_cuda_sanitizer()
    for i, (name, fn, clean) in enumerate(progs, 1):
        row = _row(out, realcode, name, fn, clean)
        for variant in _variants(clean):
            if out.left() < MIN_LEFT:
                row[variant] = {"not_run": "deadline"}
                continue
            out.current = (name, variant)
            _collect()
            t0 = time.perf_counter()
            try:
                got = fn(variant != "buggy", False)
                torch.cuda.synchronize()
                seconds = round(time.perf_counter() - t0, 3)
                r = {"reported": False, "result_ok": realcode.judged(got), "seconds": seconds}
            except Exception as e:  # noqa: BLE001  CUDASanitizerErrors, or the program failing under it
                skip = _skip_reason(e)
                reported = _csan_error(e)
                if reported is None and "CSAN detected a possible data race" in str(e):
                    reported = e  # raised in an autograd hook: the engine re-raised it as another type
                if skip and reported is None:
                    r = {"skipped": skip}
                else:
                    r = {"reported": reported is not None, "error": type(e).__name__,
                         "message": str(reported if reported is not None else e)[:600]}
                _sync()
            r.setdefault("seconds", round(time.perf_counter() - t0, 3))  # the program's, not its reference's
            out.current = None
            row[variant] = r
            out.publish()
            what = r.get("skipped") or ("reported" if r.get("reported") else f"raised {r['error']}" if r.get("error") else "clean")
            _log(f"csan {i}/{len(progs)} {name} [{variant}]: {what}, {r['seconds']} s")
            if "skipped" in r:
                break
    return out


# ----------------------------------------------------------------------------------------------
# widened runs


def run_widen(a) -> Out:
    realcode, progs = _progs(a)
    out = Out("widen", a.deadline_seconds, {"runs": a.runs, **_versions()})
    for i, (name, fn, clean) in enumerate(progs, 1):
        row = _row(out, realcode, name, fn, clean)
        for variant in _variants(clean):
            if out.left() < MIN_LEFT:
                row[variant] = {"not_run": "deadline"}
                continue
            out.current = (name, variant)
            t0 = time.perf_counter()
            bad = done = 0
            r: dict = {}
            notes: list = []
            realcode.take_note(fn)
            try:
                for _ in range(a.runs):
                    if done and out.left() < MIN_LEFT / 2:
                        r["cut_short"] = "deadline"
                        break
                    _collect()
                    got = fn(variant != "buggy", True)
                    _sync()
                    ok = realcode.judged(got)
                    done += 1
                    bad += not ok
                    note = realcode.take_note(fn)
                    if note is not None:
                        notes.append(note)
                r.update({"corrupted": bad, "runs": done})
            except Exception as e:  # noqa: BLE001
                skip = _skip_reason(e)
                r = {"skipped": skip} if skip else {"exception": _exc(e), "corrupted": bad, "runs": done,
                                                     "traceback": traceback.format_exc()[-3000:]}
                _sync()
            r["seconds"] = round(time.perf_counter() - t0, 3)
            if notes:  # the last run's note, with every run's ratio
                r["note"] = {**notes[-1], "ratios": [n.get("ratio") for n in notes]}
            out.current = None
            row[variant] = r
            out.publish()
            what = r.get("skipped") or (f"RAISED {r['exception'][:120]}" if "exception" in r else f"{r['corrupted']}/{r['runs']} corrupted")
            _log(f"widen {i}/{len(progs)} {name} [{variant}]: {what}, {r['seconds']} s")
            if "skipped" in r:
                break
    return out


# ----------------------------------------------------------------------------------------------
# warm: the compiled suite compiled once, before the processes that check and time it


def _warm_one(out: Out, realcode, name: str, fn, clean: bool) -> None:
    """One uninstrumented run of program `fn` (its fixed or clean variant) into out.rows."""
    row = _row(out, realcode, name, fn, clean)
    variant = _variants(clean)[-1]
    if out.left() < MIN_LEFT:
        row[variant] = {"not_run": "deadline"}
        return
    out.current = (name, variant)
    _collect()
    t0 = time.perf_counter()
    r: dict = {}
    try:
        got = fn(True, False)
        _sync()
        seconds = round(time.perf_counter() - t0, 2)
        r["result_ok"] = realcode.judged(got)
        r["seconds"] = seconds
    except Exception as e:  # noqa: BLE001
        skip = _skip_reason(e)
        r = {"skipped": skip} if skip else {"exception": _exc(e), "traceback": traceback.format_exc()[-3000:]}
        _sync()
    r.setdefault("seconds", round(time.perf_counter() - t0, 2))
    realcode.take_note(fn)
    out.current = None
    row[variant] = r
    out.publish()
    what = r.get("skipped") or (f"RAISED {r['exception'][:160]}" if "exception" in r
                                else "result right" if r["result_ok"] else "result WRONG")
    _log(f"warm {name}: {what}, {r['seconds']} s")


# rough compile times of the compiled suite's programs, relative (a name's substring -> weight; 1
# else): warm's processes get shares of about the same weight
WARM_WEIGHTS = {"ResNet": 6, "nanoGPT": 3, "AMP": 3, "ViT": 2, "SDPA": 2, "LLM decode": 2, "gpt-fast": 2}


def _warm_shares(progs: list, jobs: int) -> list:
    """`progs` in `jobs` shares of about the same weight (WARM_WEIGHTS), heaviest first."""
    def weight(p):
        return max([w for k, w in WARM_WEIGHTS.items() if k.lower() in p[0].lower()] or [1])

    shares: list = [[] for _ in range(jobs)]
    loads = [0] * jobs
    for p in sorted(progs, key=weight, reverse=True):
        j = loads.index(min(loads))
        shares[j].append(p)
        loads[j] += weight(p)
    return [sh for sh in shares if sh]


def run_warm(a) -> Out:
    """`warm`: the selected programs of the compiled suite once each, in `--jobs` processes."""
    realcode, progs = _progs(a)
    progs = [p for p in progs if realcode.suite_of(p[1]) == "compiled"]
    out = Out("warm", a.deadline_seconds, {"jobs": a.jobs, **({"child": True} if a.child else _versions())})
    jobs = max(1, min(a.jobs, len(progs)))
    if a.child or jobs == 1:
        for name, fn, clean in progs:
            _warm_one(out, realcode, name, fn, clean)
        return out
    procs = []
    for share in _warm_shares(progs, jobs):
        cmd = [sys.executable, os.path.abspath(__file__), "warm", "--child", "--set", a.suite,
               "--only", ",".join(n for n, _, _ in share)]
        if out.deadline is not None:
            cmd += ["--deadline-seconds", f"{max(out.left() - MIN_LEFT, 1.0):.0f}"]
        _log(f"warm: {len(share)} programs in a process of their own: {', '.join(n for n, _, _ in share)}")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # standard error: ours
        out.children.append(proc)
        procs.append((share, proc))
    for share, proc in procs:
        try:
            stdout, _ = proc.communicate(timeout=None if out.deadline is None else max(out.left(), 1.0) + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, _ = proc.communicate()
        data = _first_json(stdout or "")
        got = data.get("warm", {}) if isinstance(data, dict) else {}
        for name, fn, clean in share:
            if isinstance(got.get(name), dict):
                out.rows[name] = got[name]
            else:
                row = _row(out, realcode, name, fn, clean)
                why = f"its process (exit {proc.returncode}) printed no results"
                row.setdefault(_variants(clean)[-1], {"exception": why})
        out.publish()
    return out


# ----------------------------------------------------------------------------------------------
# cost


# The profiling modes of `cost --profile`: the C++ recorder with its profile (Run(_profile=…), as
# STREAMSAN_PROFILE) set to this
# (`observe`: its callbacks return at once, nothing is recorded: the cost of being called at all;
# `1`: each stage's time counted, Run.stats()'s recorder_profile_*)
PROFILE_MODES = {"native-observe": "observe", "native-stages": "1"}
# And the C++ recorder writing its records on the program's thread (STREAMSAN_DEFER=0), against
# its default (records written by its own thread), in the same rounds.
AT_ONCE = "native-at-once"
# And the program checked the way a long run is (`cost --steady`): one check around three runs,
# the first two under it untimed, the third timed — what each run costs once the check is
# entered and has seen the program (the check's entry and exit, and the first run's first sight
# of every buffer and line, are not in it). The run is timed to its last synchronization, as
# plain is.
STEADY = "native-steady"
STEADY_WARM_RUNS = 2

# Timed rounds of the Python recorder in `cost` (at most; `--runs` bounds the others).
PYTHON_COST_RUNS = 3


def _once(fn, mode: str) -> tuple[float, dict]:
    """Seconds of one run of `fn(True, False)` in `mode` (plain, native, python, csan, or a
    PROFILE_MODES one), with the garbage collector off, as `timeit` times (a collection that
    the allocations of earlier runs set off would land in whichever run crossed the threshold);
    the young garbage of the run is collected after it. A result check the program returned as
    a `Later` (its reference) is not run: what is timed is the program."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _once_timed(fn, mode)
    finally:
        if enabled:
            gc.enable()
        gc.collect(1)


def _once_timed(fn, mode: str) -> tuple[float, dict]:
    import torch

    info: dict = {}
    if mode in ("plain", "csan"):
        t0 = time.perf_counter()
        fn(True, False)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, info
    import streamsan.torch

    backend = "native" if mode in PROFILE_MODES or mode in (AT_ONCE, STEADY) else mode
    with mock.patch.dict(os.environ):
        os.environ.pop("STREAMSAN_DEFER", None)
        if mode == AT_ONCE:
            os.environ["STREAMSAN_DEFER"] = "0"
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with streamsan.torch.Run(raise_on_hazard=False, backend=backend,
                                     _profile=PROFILE_MODES.get(mode, "0")) as run:
                for _ in range(STEADY_WARM_RUNS if mode == STEADY else 0):  # untimed, under the check
                    fn(True, False)
                    torch.cuda.synchronize()
                t1 = time.perf_counter()
                fn(True, False)
                torch.cuda.synchronize()
                stats = run.stats() if mode in PROFILE_MODES else {}
                t2 = time.perf_counter()
        t3 = time.perf_counter()
    if mode == STEADY:  # the run alone (its "enter" would hold the untimed runs: no phases)
        return t2 - t1, {"errors": run.report.errors if run.report is not None else None, "backend": run.backend}
    seconds = t3 - t0
    # entering the check, the program in it, leaving it (what the checker had left to check,
    # the report), and the parts of entering and leaving (Run.phase_seconds)
    phases = {"enter": t1 - t0, "body": t2 - t1, "exit": t3 - t2, **getattr(run, "phase_seconds", {})}
    if mode == "native-observe":
        return seconds, {"phases": phases}  # nothing was checked: no verdict
    info = {"errors": run.report.errors if run.report is not None else None, "backend": run.backend,
            "phases": phases}
    if mode == "native-stages":
        info["profile"] = {k[len("recorder_profile_"):]: v for k, v in stats.items() if k.startswith("recorder_profile_")}
        for k in ("checker_busy_seconds", "queue_waited_seconds", "ops"):
            if k in stats:
                info["profile"][k if k != "ops" else "checked_ops"] = stats[k]
    return seconds, info


def _fail_text(e: BaseException, mode: str) -> str:
    if mode == "csan":
        if _csan_error(e) is not None or "CSAN detected a possible data race" in str(e):
            return "CSAN failed: it reported a data race (the run stopped there)"
        return "CSAN failed: " + _exc(e)
    return _skip_reason(e) or _exc(e)


def _cost_rows(out: Out, progs, modes: list[str], runs: int, until: float | None = None,
               field: str = "seconds", freeze_after_warmup: bool = False) -> None:
    """Measures `modes` of every program of `progs` into out.rows[name][field][mode]: a warm-up
    run in each mode first (its seconds under "warmup": first-run costs, cuDNN's and cuBLAS's
    set-up, lazy imports, compilation), then up to `runs` rounds of the modes interleaved (each
    round in the order of the last rotated by one), each round after a garbage collection. A program's rounds stop once its share of the time left
    (until `until`, monotonic, or the deadline; the share is that time over the programs left) is
    spent, after one timed round at least. The first exception of each program is printed in full
    on standard error."""
    for i, (name, fn, clean) in enumerate(progs):
        row = out.rows.setdefault(name, {"clean_program": clean})
        end = min(out.deadline if out.deadline is not None else math.inf, until if until is not None else math.inf)
        left = end - time.monotonic()
        if out.left() < MIN_LEFT or left <= 0:
            row.setdefault("not_run", []).append(f"{'/'.join(modes)}: deadline")
            continue
        share = left / (len(progs) - i)
        samples: dict = {m: [] for m in modes}
        profiles: list = []
        warm: dict = {}
        failed: dict = {}
        phase_samples: dict = {}
        started = t0 = time.monotonic()
        out.current = (name, "cost")
        for rnd in range(runs + 1):  # round 0 is the warm-up
            if rnd:
                now = time.monotonic()
                if out.left() < MIN_LEFT / 2:
                    row["cut_short"] = "deadline"
                    break
                if rnd > 1 and now - t0 > share:
                    row["cut_short"] = f"its share of the time ({share:.1f} s) spent"
                    break
            _collect()
            # Each timed round starts with another mode (the modes rotated): none is always the
            # one run right after the collection, or right after another given mode.
            for m in _rotated(modes, rnd):
                if m in failed:
                    continue
                try:
                    s, info = _once(fn, m)
                except Exception as e:  # noqa: BLE001
                    failed[m] = _fail_text(e, m)
                    tb = traceback.format_exc()
                    row.setdefault("tracebacks", {})[m] = tb[-3000:]
                    if len(failed) == 1:
                        _log(f"cost {name} [{m}] raised (its first exception here, in full):\n{tb}")
                    _sync()
                    continue
                if rnd:
                    samples[m].append(s)
                    if "profile" in info:
                        profiles.append(info["profile"])
                    if "phases" in info:
                        phase_samples.setdefault(m, []).append(info["phases"])
                else:
                    warm[m] = round(s, 5)
                if info.get("errors"):
                    row.setdefault("errors_under_check", {})[m] = info["errors"]
            if rnd == 0 and freeze_after_warmup:
                gc.collect()  # the warm-up's imports (torchvision, Dynamo) out of the collector's way
                gc.freeze()
            if rnd == 0:
                # The share is for the timed rounds: a warm-up that compiles (Dynamo, Inductor,
                # cuDNN's autotuning) must not leave a program a single timed round.
                t0 = time.monotonic()
        out.current = None
        cell = row.setdefault(field, {})
        for m in modes:
            if samples[m]:
                cell[m] = round(statistics.median(samples[m]), 5)
                row.setdefault("samples", {})[m] = [round(x, 5) for x in samples[m]]
        if warm:
            row.setdefault("warmup", {}).update(warm)
        for m, ph in phase_samples.items():  # medians, ms (the parts where every round has them)
            keys = [k for k in ph[0] if all(k in p for p in ph)]
            row.setdefault("phases_ms", {})[m] = {
                k: round(statistics.median(p[k] for p in ph) * 1e3, 3) for k in keys}
        if profiles:  # the stages of the median round (by the recorder's total)
            profiles.sort(key=lambda p: sum(v for k, v in p.items() if k.endswith("_seconds")))
            row["profile"] = {k: round(v, 6) if isinstance(v, float) else v
                              for k, v in profiles[len(profiles) // 2].items()}
        if failed:
            row.setdefault("failed", {}).update(failed)
        plain = cell.get("plain")
        if plain:
            for m in modes:
                if m != "plain" and m in cell:
                    cell[f"{m}_ratio"] = round(cell[m] / plain, 2)
                    if "plain" in samples and len(samples[m]) == len(samples["plain"]):
                        # each round's run against the plain run of the same round, the median:
                        # a drift of the machine's speed from round to round cancels
                        cell[f"{m}_ratio_paired"] = round(statistics.median(
                            x / p for x, p in zip(samples[m], samples["plain"])), 2)
        out.publish()
        _log(f"cost {i + 1}/{len(progs)} {name}: " + ", ".join(
            f"{m} {cell[m] * 1e3:.1f} ms (warm-up {warm[m] * 1e3:.0f} ms, {len(samples[m])} rounds)"
            for m in modes if m in cell)
             + (f"; failed {failed}" if failed else "") + f" ({time.monotonic() - started:.1f} s)")


# seconds kept for each program of realcode.captures(), run in a process of its own (its imports, its
# CUDA context, a warm-up and the rounds), by the subcommand's key (at most half the time left is
# kept for them all; the last, torch.compile's, takes what is left); a program of the compiled suite
# is kept CHILD_COMPILE_SECONDS more (Dynamo traces it again in its process, Inductor loads it).
# A process of the eager suite's needs about 9 s before its first timed round with `--profile
# --steady` (on an H100 at c2569fb: imports, then five warm-ups, the first, plain, 4.1-4.5 s of
# cuBLAS's and cuDNN's first use): kept 10 s, the four got none.
CHILD_SECONDS = {"cost": 16.0, "cost-csan": 14.0}
CHILD_COMPILE_SECONDS = 12.0


def _child_seconds(key: str, suite: str) -> float:
    return CHILD_SECONDS[key] + (CHILD_COMPILE_SECONDS if suite == "compiled" else 0.0)


def _first_json(text: str):
    """The first JSON document in `text` (what a child printed on standard output), or None."""
    for at in [0] + [i + 1 for i, c in enumerate(text) if c == "\n" and text[i + 1:i + 2] == "{"]:
        try:
            return json.JSONDecoder().raw_decode(text[at:].lstrip())[0]
        except ValueError:
            continue
    return None


def _cost_child(out: Out, a, name: str, clean: bool, mine: float, later: float) -> None:
    """The cost of program `name` measured by `realcode_report.py cost --only NAME` in a process of
    its own (a capture failing there cannot take other programs with it), its row merged into
    out.rows; it is kept `mine` seconds (`_child_seconds`), the programs still to run after it
    `later` seconds in all: it has its share of the time left, or all but theirs if more."""
    row = out.rows.setdefault(name, {"clean_program": clean})
    seconds = None
    if out.deadline is not None:
        left = out.left() - MIN_LEFT
        seconds = max(left * mine / (mine + later), left - later)
        if seconds < 2 * MIN_LEFT:
            row.setdefault("not_run", []).append("deadline")
            return
    cmd = [sys.executable, os.path.abspath(__file__), "cost", "--only", name, "--runs", str(a.runs), "--child",
           "--set", a.suite]
    if a.csan:
        cmd.append("--csan")
    if getattr(a, "profile", False):
        cmd.append("--profile")
    if getattr(a, "at_once", False):
        cmd.append("--at-once")
    if getattr(a, "steady", False):
        cmd.append("--steady")
    if getattr(a, "no_python", False):
        cmd.append("--no-python")
    if seconds is not None:
        cmd += ["--deadline-seconds", f"{seconds:.0f}"]
    _log(f"cost {name}: in a process of its own" + (f" (at most {seconds:.0f} s)" if seconds else ""))
    t0 = time.monotonic()
    out.current = (name, "cost")
    stdout = ""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # standard error: ours
        out.child = proc
        try:
            stdout, _ = proc.communicate(timeout=None if seconds is None else seconds + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, _ = proc.communicate()
        rc = proc.returncode
    except OSError as e:
        rc = f"not started: {e}"
    finally:
        out.child = None
        out.current = None
    data = _first_json(stdout or "")
    got = data.get(out.key, {}).get(name) if isinstance(data, dict) else None
    if not isinstance(got, dict):
        row.setdefault("failed", {})["process"] = f"its process (exit {rc}) printed no results"
    else:
        for k, v in got.items():
            if isinstance(v, dict) and isinstance(row.get(k), dict):
                row[k].update(v)
            else:
                row[k] = v
        stopped = data.get(f"meta-{out.key}", {}).get("stopped")
        if stopped:
            row["process_stopped"] = stopped
    row["process"] = {"exit": rc, "seconds": round(time.monotonic() - t0, 2)}
    out.publish()


def run_cost(a) -> Out:
    """`cost` and `cost --csan`: the programs of realcode.captures() each in a process of its own,
    after the others (unless this is such a process, `--child`)."""
    realcode, progs = _progs(a)
    caps = realcode.captures(a.suite)
    key = "cost-csan" if a.csan else "cost"
    meta = {"runs": a.runs, **({"child": True} if a.child else _versions())}
    try:
        meta["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    out = Out(key, a.deadline_seconds, meta)
    out.meta["start_seconds"] = round(time.monotonic() - START, 2)  # imports, CUDA not yet
    for name, fn, clean in progs:
        _row(out, realcode, name, fn, clean)
    if a.child:
        own, kids = progs, []
    else:
        own = [p for p in progs if p[1] not in caps]
        kids = [p for p in progs if p[1] in caps]
    kept = [_child_seconds(key, realcode.suite_of(fn)) for _, fn, _ in kids]
    end = None
    if out.deadline is not None:
        end = out.deadline - min(sum(kept), 0.5 * out.left())
    if not a.csan:
        # The Python recorder last: it turns on torch's own GPU trace, which cannot be turned off
        # (a Python call at every allocation and free from then on, plain runs included); the C++
        # recorder puts back what it found.
        modes = (["plain", "native"] + (list(PROFILE_MODES) if a.profile else [])
                 + ([AT_ONCE] if getattr(a, "at_once", False) else [])
                 + ([STEADY] if getattr(a, "steady", False) else []))
        python_end = end
        if not a.no_python and end is not None:
            end = time.monotonic() + 0.75 * (end - time.monotonic())
        _cost_rows(out, own, modes, a.runs, until=end, freeze_after_warmup=a.child)
        if not a.no_python:
            # a few rounds: it is 3-20x slower, and its cost is not the one with a goal
            _cost_rows(out, own, ["python"], min(a.runs, PYTHON_COST_RUNS), until=python_end)
    elif own:
        # the plain rounds first (a quarter of the time at most), then CSAN, which cannot be
        # turned off. Not even imported before: importing torch.cuda._sanitizer makes its dispatch
        # mode, which turns on PyTorch's GPU trace and hooks every allocation, free, event and
        # synchronization (a Python call each, a stack trace per allocation) though the mode is not
        # entered: "plain" runs after the import are nearly as slow as CSAN's.
        plain_end = None if end is None else time.monotonic() + 0.25 * (end - time.monotonic())
        _cost_rows(out, own, ["plain"], a.runs, until=plain_end, freeze_after_warmup=a.child)
        import torch.cuda._sanitizer as csan

        csan.enable_cuda_sanitizer()
        _cost_rows(out, own, ["csan"], a.runs, until=end)
    for j, (name, _fn, clean) in enumerate(kids):
        _cost_child(out, a, name, clean, kept[j], sum(kept[j + 1:]))
    if a.csan:
        for row in out.rows.values():
            cell = row.get("seconds", {})
            if cell.get("plain") and cell.get("csan"):
                cell["csan_ratio"] = round(cell["csan"] / cell["plain"], 2)
    return out


# ----------------------------------------------------------------------------------------------
# table and summary


def _names(data: dict) -> list[str]:
    """Program names in suite order (realcode's, where importable), then any others seen."""
    seen: list[str] = []
    try:
        import realcode

        seen = [n for n, _, _ in realcode.programs(suite="all")]
    except Exception:  # noqa: BLE001  (no torch here: the files' order)
        pass
    for k, v in data.items():
        if isinstance(v, dict) and not k.startswith("meta-"):
            seen += [n for n in v if n not in seen]
    present = {n for k, v in data.items() if isinstance(v, dict) and not k.startswith("meta-") for n in v}
    return [n for n in seen if n in present]


def _is_compiled(data: dict, name: str) -> bool:
    """Whether `name` is a program of the compiled suite (its rows' `suite`, else realcode's)."""
    for k, v in data.items():
        if isinstance(v, dict) and not k.startswith("meta-") and isinstance(v.get(name), dict) \
                and "suite" in v[name]:
            return v[name]["suite"] == "compiled"
    try:
        import realcode

        return any(n == name and realcode.suite_of(f) == "compiled" for n, f, _ in realcode.programs(suite="all"))
    except Exception:  # noqa: BLE001
        return False


def _triton_word(r: dict | None) -> str:
    n = (r or {}).get("triton_launches")
    return "-" if n is None else str(n)


def _triton_cell(row: dict | None, clean: bool) -> str:
    """The Triton launches the native recorder saw, per variant ("-": unknown)."""
    if not row:
        return "-"
    if clean:
        return _triton_word(row.get("clean"))
    return f"{_triton_word(row.get('buggy'))} / {_triton_word(row.get('fixed'))}"


def _goal(row: dict | None, compiled: bool) -> str:
    """A compiled program's cost goal (the C++ recorder at most COST_GOAL times plain): "met",
    "NOT met" or "unmeasured"; "" for the others (no goal). Judged on a long run's step (the
    `native-steady` mode of `cost --steady`: the check entered, the program seen twice, its third
    run timed) where that was measured, as the overhead goal measures every program; else on a
    run that is a check of its own (entering and leaving included). The cell says which, and, for
    a goal not met by a program whose plain rounds spread several-fold, their range and the
    round-by-round ratio (`_spread_note`): the verdict is the ratio of medians' all the same."""
    if not compiled:
        return ""
    seconds = (row or {}).get("seconds", {})
    steady = seconds.get(f"{STEADY}_ratio")
    ratio = steady if steady is not None else seconds.get("native_ratio")
    if ratio is None:
        return "unmeasured"
    verdict = "met" if ratio <= COST_GOAL else "NOT met"
    notes = ["steady"] if steady is not None else []
    if verdict == "NOT met":
        notes += _spread_note(row or {}, STEADY if steady is not None else "native")
    return f"{verdict} ({'; '.join(notes)})" if notes else verdict


# A program's plain rounds spread at least this many times (slowest over fastest): a ratio of
# medians says little of what checking costs it, and its goal cell says so.
PLAIN_SPREAD = 3.0


def _spread_note(row: dict, mode: str) -> list:
    """["plain rounds A-B ms, round by round R"] when the program's plain rounds spread
    PLAIN_SPREAD times or more and the round-by-round ratio of `mode` (each checked run against
    the plain run of its round) was measured; else []."""
    plain = [x for x in (row.get("samples") or {}).get("plain", []) if isinstance(x, (int, float)) and x > 0]
    paired = (row.get("seconds") or {}).get(f"{mode}_ratio_paired")
    if len(plain) < 2 or paired is None or max(plain) < PLAIN_SPREAD * min(plain):
        return []
    return [f"plain rounds {min(plain) * 1e3:.1f}-{max(plain) * 1e3:.1f} ms, round by round {paired:.2f}x"]


def _goal_key(goal: str) -> str:
    """The goal's verdict alone ("met", "NOT met", "unmeasured")."""
    return goal.split(" (")[0]


def _is_clean(data: dict, name: str) -> bool:
    for k, v in data.items():
        if isinstance(v, dict) and not k.startswith("meta-") and isinstance(v.get(name), dict) \
                and "clean_program" in v[name]:
            return bool(v[name]["clean_program"])
    return False


def _verdict(r: dict | None, short: bool = False) -> str:
    if not r:
        return "?"
    if "skipped" in r:
        return "skipped"
    if "not_run" in r:
        return "not run"
    if "exception" in r and r.get("errors") is None:
        return "RAISED " + r["exception"].split(":")[0]
    if not r.get("errors"):
        s = "clean"
    else:
        kinds = ",".join(k.replace("data-race", "race").replace("reuse-race", "reuse").replace("unsafe-free", "free")
                         for k in r.get("kinds", []))
        lines = ",".join(x.rsplit(":", 1)[-1] for x in r.get("sites", [])[:3])
        s = f"{kinds} @{lines}" + ("" if short else (" ok" if r.get("at_race_line") else " WRONG LINE"))
    if "exception" in r:
        s += " +RAISED"
    if r.get("result_ok") is False:
        s += " (result wrong)"
    return s


def _streamsan_cell(row: dict | None, clean: bool) -> str:
    if not row:
        return "?"
    if clean:
        return _verdict(row.get("clean"), True)
    return f"buggy: {_verdict(row.get('buggy'))}; fixed: {_verdict(row.get('fixed'))}"


def _csan_word(r: dict | None, bad: bool) -> str:
    if not r:
        return "?"
    if "skipped" in r:
        return "skipped"
    if "not_run" in r:
        return "not run"
    if r.get("reported"):
        return "reported" if bad else "FALSE ALARM"
    if r.get("error"):
        return f"raised {r['error']}"
    return "missed" if bad else "clean"


def _widen_word(r: dict | None) -> str:
    if not r:
        return "?"
    if "skipped" in r:
        return "skipped"
    if "not_run" in r:
        return "not run"
    if "exception" in r:
        return f"RAISED after {r.get('corrupted', 0)}/{r.get('runs', 0)}"
    return f"{r['corrupted']}/{r['runs']}"


def _ratio_value(row: dict | None, field: str, mode: str, base: float | None = None) -> tuple:
    """`mode`'s ratio to plain in a cost row, and whether it is to `base` (plain seconds measured
    elsewhere, used where the row has no ratio); (None, False) without either."""
    cell = (row or {}).get(field, {})
    ratio = cell.get(f"{mode}_ratio")
    if isinstance(ratio, (int, float)):
        return ratio, False
    if base and cell.get(mode):
        return cell[mode] / base, True
    return None, False


def _ratio(row: dict | None, field: str, mode: str, base: float | None = None) -> str:
    """`mode`'s ratio to plain in a cost row; without one, to `base` (plain seconds measured
    elsewhere), marked *."""
    ratio, elsewhere = _ratio_value(row, field, mode, base)
    if elsewhere:
        return f"{ratio:.2f}x*"
    if ratio is None:
        failed = (row or {}).get("failed", {})
        return "failed" if failed.get(mode) or failed.get("process") else "?"
    return f"{ratio:.2f}x"


def _ms(row: dict | None, mode: str, base: float | None = None) -> str:
    """A cost row's median milliseconds of `mode`, with its ratio to plain (or to `base`, *)."""
    cell = (row or {}).get("seconds", {})
    v = cell.get(mode)
    if v is None:
        failed = (row or {}).get("failed", {})
        return "failed" if failed.get(mode) or failed.get("process") else "?"
    if mode == "plain":
        return f"{v * 1e3:.1f}"
    return f"{v * 1e3:.1f} ({_ratio(row, 'seconds', mode, base)})"


def _plain(row: dict | None):
    return (row or {}).get("seconds", {}).get("plain")


def _note_text(data: dict, name: str) -> str | None:
    """The notes the program's runs left (realcode.NOTES), as one line: what was measured, its
    ratio unwidened (streamsan's runs) and widened, and whether it is a synchronization bug."""
    base, plain, wide = None, [], []
    for key, rows in data.items():
        if key.startswith("meta-") or not isinstance(rows, dict) or not isinstance(rows.get(name), dict):
            continue
        for variant in ("clean", "buggy", "fixed"):
            r = rows[name].get(variant)
            note = r.get("note") if isinstance(r, dict) else None
            if not isinstance(note, dict):
                continue
            base = base or note
            ratios = note.get("ratios") or [note.get("ratio")]
            (wide if key == "widen" or note.get("widened") else plain).extend(x for x in ratios if x is not None)
    if base is None:
        return None
    text = f"{base.get('title', 'note')}: {base.get('what', '')}".rstrip(": ")
    allr = plain + wide
    if allr:
        same = max(allr) - min(allr) <= 1e-3
        if same:
            text += f" (ratio {allr[0]:.2f})"
            if plain and wide:
                text += ", the same widened or not"
        else:
            fmt = lambda xs: "/".join(f"{x:.2f}" for x in sorted(set(xs)))  # noqa: E731
            text += f" (ratio {fmt(plain) or '?'} unwidened, {fmt(wide) or '?'} widened)"
    if base.get("sync_bug") is False:
        text += "; not a synchronization bug"
    return text


def _first_hazard(r: dict | None) -> str | None:
    """Why a clean (or fixed) variant failed, in one line: the first hazard's first line of the
    report's text, else the exception, else the wrong result."""
    if not r:
        return None
    for line in (r.get("text") or "").splitlines():
        if line.startswith(("error[", "warning[")):
            return line[:300]
    if r.get("exception"):
        return "raised " + r["exception"].splitlines()[0][:300]
    if r.get("errors"):
        return f"{r['errors']} errors ({', '.join(r.get('kinds', []))}) at {', '.join(r.get('sites', [])[:3])}"
    if r.get("result_ok") is False:
        return "the program's own check of its result failed"
    return None


def table(files: list[str]) -> str:
    data = load(files)
    native, python = data.get("streamsan-native", {}), data.get("streamsan-python", {})
    c, w = data.get("csan", {}), data.get("widen", {})
    cost, ccost = data.get("cost", {}), data.get("cost-csan", {})
    out = ["| program | streamsan native | streamsan python | CSAN | corrupted widened (buggy/fixed or clean) "
           "| Triton launches (native) | plain ms | native ms (×) | steady ms (×) | python ms (×) | CSAN ms (×) "
           f"| cost goal (compiled: native ≤ {COST_GOAL}×) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes, failures, starred, any_compiled = [], [], False, False
    for name in _names(data):
        clean = _is_clean(data, name)
        compiled = _is_compiled(data, name)
        any_compiled = any_compiled or compiled
        eager = " (eager)" if compiled else ""
        if clean:
            csan = _csan_word(c.get(name, {}).get("clean"), False)
            wid = _widen_word(w.get(name, {}).get("clean"))
        else:
            csan = f"{_csan_word(c.get(name, {}).get('buggy'), True)} / {_csan_word(c.get(name, {}).get('fixed'), False)}"
            wid = f"{_widen_word(w.get(name, {}).get('buggy'))} / {_widen_word(w.get(name, {}).get('fixed'))}"
        crow, ccrow = cost.get(name), ccost.get(name)
        csan_ms = _ms(ccrow, "csan", _plain(crow))
        starred = starred or "*" in csan_ms
        out.append(f"| {name}{'' if clean else ' (bug)'}{' †' if compiled else ''} "
                   f"| {_streamsan_cell(native.get(name), clean)} "
                   f"| {_streamsan_cell(python.get(name), clean)}{eager} | {csan}{eager} | {wid} "
                   f"| {_triton_cell(native.get(name), clean)} "
                   f"| {_ms(crow, 'plain')} | {_ms(crow, 'native')} | {_ms(crow, STEADY)} | {_ms(crow, 'python')}{eager} "
                   f"| {csan_ms}{eager} "
                   f"| {_goal(crow, compiled)} |")
        note = _note_text(data, name)
        if note:
            notes.append(f"- {name}: {note}")
        for what, row in (("cost", crow), ("CSAN cost", ccrow)):
            for mode, why in ((row or {}).get("failed") or {}).items():
                failures.append(f"- {name}: {what} {mode}: {str(why).splitlines()[0][:200]}")
    if starred:
        out.append("\n\\* CSAN's ratio to `cost`'s plain seconds (its own process measured none).")
    if any_compiled:
        out.append("\n† compiled (tests/python/realcode_compiled.py): the C++ recorder checks the compiled code "
                   "(Inductor's Triton kernels, CUDA graph trees); the Python recorder and CSAN run it eagerly "
                   "(Dynamo leaves a frame uncompiled while a TorchDispatchMode is active): \"(eager)\" verdicts "
                   "are of the eager program, and their cost is an eager run's against the compiled plain one. "
                   f"Cost goal: the C++ recorder at most {COST_GOAL}× plain.")
    if notes:
        out.append("\nNotes:\n" + "\n".join(notes))
    if failures:
        out.append("\nCost not measured:\n" + "\n".join(failures))
    prof = profile_table(cost)
    if prof:
        out.append("\n" + prof)
    return "\n".join(out)


# The recorder's stages (STREAMSAN_PROFILE=1), `callbacks`: all the time inside its dispatcher
# callbacks (the stages there, and the ops it passes by), and `kernels`: all the time inside its
# entries for Triton's launches (`record_triton`, `record_kernel`; "-" before they were timed), and
# its parts: the arguments' regions, the user's site, the record queued
PROFILE_STAGES = ("regions", "site", "serialize", "allocator", "syncs", "handover", "callbacks", "kernels",
                  "kernels_regions", "kernels_site", "kernels_submit", "resolver")


def profile_table(cost: dict) -> str:
    """Where the C++ recorder's time goes (`cost --profile`): per program, plain and checked
    milliseconds, the recorder called but recording nothing (`observe`), and the stages' time of
    one run with them timed (the median round), in milliseconds and in microseconds per op
    written; the checker's own thread's time (off the program's thread) and the time the program
    waited for it."""
    rows = [(n, r) for n, r in cost.items() if isinstance(r, dict) and r.get("profile")]
    if not rows:
        return ""
    head = ("| program | plain ms | checked ms (×) | written at once ms (×) | observe only ms (×) | ops | "
            + " | ".join(f"{st} ms (µs/op)" for st in PROFILE_STAGES)
            + " | checker thread ms | program waited ms |")
    out = ["Where the time goes (C++ recorder; `cost --profile`: STREAMSAN_PROFILE=observe and =1, one run "
           "each round, the median round's stages):", "", head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in rows:
        sec, p = r.get("seconds") or {}, r["profile"]
        ops = p.get("ops") or 0

        def stage(k: str) -> str:
            v = p.get(f"{k}_seconds")
            if v is None:
                return "-"
            per = f" ({v / ops * 1e6:.2f})" if ops else ""
            return f"{v * 1e3:.1f}{per}"

        def ms(m: str) -> str:
            v, base = sec.get(m), sec.get("plain")
            if v is None:
                return "-"
            return f"{v * 1e3:.1f}" + (f" ({v / base:.2f}×)" if base and m != "plain" else "")

        out.append(f"| {name} | {ms('plain')} | {ms('native')} | {ms(AT_ONCE)} | {ms('native-observe')} | {ops} | "
                   + " | ".join(stage(k) for k in PROFILE_STAGES)
                   + f" | {p.get('checker_busy_seconds', 0) * 1e3:.1f} | {p.get('queue_waited_seconds', 0) * 1e3:.1f} |")
    return "\n".join(out)


def cost_overview(cost: dict, csan_cost: dict | None = None) -> str:
    """One line per mode measured (`native`, `native-steady`, observing only, and CSAN from
    `csan_cost`: its ratio, or its seconds over `cost`'s plain ones where its process timed no
    plain run): the median of the programs' ratios to plain, the range, and how many are within
    1.1×, 1.2× and 1.3×; "" when no program has a ratio."""

    def ratios_of(rows: dict, mode: str, base=lambda name: None) -> list:
        ratios = (_ratio_value(r, "seconds", mode, base(n))[0] for n, r in rows.items() if isinstance(r, dict))
        return [x for x in ratios if x is not None]

    series = [("checked (each run a check of its own)", ratios_of(cost, "native")),
              ("checked, a long run's step (the third run in one check)", ratios_of(cost, STEADY)),
              ("observing only", ratios_of(cost, "native-observe")),
              ("CSAN", ratios_of(csan_cost or {}, "csan", lambda name: _plain(cost.get(name))))]
    lines = []
    for what, ratios in series:
        if not ratios:
            continue
        ratios.sort()
        within = ", ".join(f"{sum(x <= g for x in ratios)} within {g}x" for g in (1.1, 1.2, 1.3))
        lines.append(f"  {what}: median {statistics.median(ratios):.3f}x, {ratios[0]:.2f}-{ratios[-1]:.2f}x, "
                     f"{within} (of {len(ratios)})")
    return "cost against plain (median rounds):\n" + "\n".join(lines) if lines else ""


def errors_under_cost_checks(cost: dict) -> str:
    """The errors the cost step's checks reported (each program's fixed or clean variant; the
    steady mode's check runs it three times), by program and mode: "" when none did. The
    verdicts are the `streamsan` step's; these say whether a variant judged clean there was
    clean in every timed check too."""
    lines = [f"  {name}: " + ", ".join(f"{m} {n}" for m, n in sorted(r["errors_under_check"].items()))
             for name, r in cost.items() if isinstance(r, dict) and r.get("errors_under_check")]
    # A checked mode that raised (a TraceError, an exception of the recorder) on a program the
    # `streamsan` step ran cleanly: a failure of the tool on real code, not a missing time.
    raised = [f"  {name}: {mode}: {str(why).splitlines()[0][:200]}"
              for name, r in cost.items() if isinstance(r, dict)
              for mode, why in sorted((r.get("failed") or {}).items()) if mode not in CHECKLESS_MODES]
    out = []
    if lines:
        out.append("errors under the cost step's checks (the last round that had any):\n" + "\n".join(lines))
    if raised:
        out.append("checks that raised in the cost step:\n" + "\n".join(raised))
    return "\n".join(out)


# The cost step's modes that are not a check (their failures say nothing of the tool), and the
# failure of a program's whole cost process (its time ran out, it crashed: see `_cost_rows`).
CHECKLESS_MODES = frozenset({"plain", "csan", "process"})


def _grid(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append("  ".join(str(x).ljust(wd) for x, wd in zip(r, widths)).rstrip())
        if j == 0:
            out.append("  ".join("-" * wd for wd in widths))
    return "\n".join(out)


def summary(files: list[str], allow_skips: bool = False) -> tuple[str, bool]:
    data = {}
    notes = []
    for f in files:
        try:
            merge(data, load([f]))
        except (OSError, ValueError) as e:
            notes.append(f"{f}: unreadable ({e})")
    checks: list[tuple[str, str, str | None]] = []  # (PASS|FAIL|SKIP, what, why: shown under a FAIL)

    def check(what: str, ok: bool, skipped: str | None = None, why: str | None = None) -> None:
        if skipped and allow_skips:
            checks.append(("SKIP", f"{what} ({skipped})", None))
        else:
            checks.append(("PASS" if ok and not skipped else "FAIL", what + (f" ({skipped})" if skipped else ""), why))

    def why_not(r: dict | None) -> str | None:
        if not r:
            return "not measured"
        if "skipped" in r:
            return r["skipped"]
        if "not_run" in r:
            return f"not run: {r['not_run']}"
        return None

    backends = ("native", "python")
    for b in backends:
        if f"streamsan-{b}" not in data:
            checks.append(("FAIL", f"streamsan {b} recorder: no results", None))
    if "widen" not in data:
        checks.append(("FAIL", "widened runs: no results", None))
    for m in ("meta-warm", "meta-streamsan-native", "meta-streamsan-python", "meta-csan", "meta-widen", "meta-cost",
              "meta-cost-csan"):
        if data.get(m, {}).get("stopped"):
            notes.append(f"{m[5:]} stopped early: {data[m]['stopped']}")
    head = ["program", "native", "python", "CSAN", "widened", "triton", "native x", "steady x", "goal", "python x",
            "CSAN x"]
    grid = [head]
    goals: dict = {"met": [], "NOT met": [], "unmeasured": []}
    any_compiled = False
    for name in _names(data):
        clean = _is_clean(data, name)
        compiled = _is_compiled(data, name)
        any_compiled = any_compiled or compiled
        for b in backends:
            rows = data.get(f"streamsan-{b}")
            if rows is None:
                continue
            row = rows.get(name, {})
            who = f"{b} (eager)" if compiled and b == "python" else b
            if clean:
                r = row.get("clean")
                skip = why_not(r)
                ok = bool(r) and r.get("errors") == 0 and "exception" not in r and r.get("result_ok") is True
                check(f"{who}: {name}: clean and right ({_verdict(r, True)})", ok, skip, _first_hazard(r))
            else:
                bug, fix = row.get("buggy"), row.get("fixed")
                check(f"{who}: {name}: buggy reported at a # RACE line ({_verdict(bug)})",
                      bool(bug) and bool(bug.get("errors")) and bool(bug.get("at_race_line")), why_not(bug))
                check(f"{who}: {name}: fixed clean and right ({_verdict(fix)})",
                      bool(fix) and fix.get("errors") == 0 and "exception" not in fix and fix.get("result_ok") is True,
                      why_not(fix), _first_hazard(fix))
        if "widen" in data:
            wr = data["widen"].get(name, {})
            if clean:
                r = wr.get("clean")
                check(f"widened: {name}: never corrupted ({_widen_word(r)})",
                      bool(r) and "exception" not in r and r.get("runs", 0) > 0 and r.get("corrupted") == 0, why_not(r))
            else:
                bug, fix = wr.get("buggy"), wr.get("fixed")
                check(f"widened: {name}: buggy corrupted at least once ({_widen_word(bug)})",
                      bool(bug) and "exception" not in bug and bug.get("corrupted", 0) > 0, why_not(bug))
                check(f"widened: {name}: fixed never corrupted ({_widen_word(fix)})",
                      bool(fix) and "exception" not in fix and fix.get("runs", 0) > 0 and fix.get("corrupted") == 0,
                      why_not(fix))
        cr = data.get("csan", {}).get(name, {})
        if clean:
            cells = [_verdict(data.get("streamsan-native", {}).get(name, {}).get("clean"), True),
                     _verdict(data.get("streamsan-python", {}).get(name, {}).get("clean"), True),
                     _csan_word(cr.get("clean"), False), _widen_word(data.get("widen", {}).get(name, {}).get("clean"))]
        else:
            sn = data.get("streamsan-native", {}).get(name, {})
            sp = data.get("streamsan-python", {}).get(name, {})
            cells = [f"{_verdict(sn.get('buggy'))} | {_verdict(sn.get('fixed'), True)}",
                     f"{_verdict(sp.get('buggy'))} | {_verdict(sp.get('fixed'), True)}",
                     f"{_csan_word(cr.get('buggy'), True)} | {_csan_word(cr.get('fixed'), False)}",
                     f"{_widen_word(data.get('widen', {}).get(name, {}).get('buggy'))} | "
                     f"{_widen_word(data.get('widen', {}).get(name, {}).get('fixed'))}"]
        cost, ccost = data.get("cost", {}).get(name), data.get("cost-csan", {}).get(name)
        goal = _goal(cost, compiled)
        if compiled and "cost" in data:
            goals[_goal_key(goal)].append(
                f"{name} ({_ratio(cost, 'seconds', 'native')}; steady {_ratio(cost, 'seconds', STEADY)})")
        grid.append([name[:48] + ("" if clean else " (bug)") + (" †" if compiled else ""), *cells,
                     _triton_cell(data.get("streamsan-native", {}).get(name), clean),
                     _ratio(cost, "seconds", "native"), _ratio(cost, "seconds", STEADY), goal,
                     _ratio(cost, "seconds", "python"), _ratio(ccost, "seconds", "csan", _plain(cost))])
        note = _note_text(data, name)
        if note:
            notes.append(f"note: {name}: {note}")
        for key, row, modes in (("cost", cost, ("plain", "native", "python")), ("cost-csan", ccost, ("plain", "csan"))):
            missing = [m for m in modes if m not in ((row or {}).get("seconds") or {})]
            if key in data and missing:
                failed = (row or {}).get("failed") or {}
                why = "; ".join(f"{m}: {str(v).splitlines()[0][:160]}" for m, v in failed.items())
                why = why or ", ".join((row or {}).get("not_run") or []) or "not measured"
                notes.append(f"{key}: {name}: no {'/'.join(missing)} seconds ({why})")
    parts = []
    if len(grid) > 1:
        legend = ("real-code suite (verdicts: kinds @lines, buggy | fixed; widened: corrupted/runs; triton: the "
                  "Triton launches the native recorder saw, buggy / fixed, - unknown; cost: median time under the "
                  "check / plain)")
        if any_compiled:
            legend += (f"\n† compiled (realcode_compiled.py): the native recorder checks the compiled code; the "
                       "python recorder and CSAN run it eagerly (Dynamo leaves a frame uncompiled while a "
                       "TorchDispatchMode is active), so their verdicts and costs on it are the eager program's "
                       f"(\"python (eager)\" below); goal: native at most {COST_GOAL}x plain (not a criterion)")
        parts.append(legend + "\n" + _grid(grid))
    overview = cost_overview(data.get("cost", {}), data.get("cost-csan", {}))
    if overview:
        notes.append(overview)
    under = errors_under_cost_checks(data.get("cost", {}))
    if under:
        notes.append(under)
    if any(goals.values()):
        lines = [f"cost goal of the compiled programs (native at most {COST_GOAL}x plain, a long run's step where "
                 "measured, else a run checked on its own; not a criterion): "
                 f"{len(goals['met'])} met, {len(goals['NOT met'])} not met, {len(goals['unmeasured'])} unmeasured"]
        lines += [f"  {what}: {', '.join(names)}" for what, names in goals.items() if names and what != "met"]
        notes.append("\n".join(lines))
    if notes:
        parts.append("\n".join(notes))
    lines = []
    for st, what, why in checks:
        lines.append(f"[{st}] {what}")
        if st == "FAIL" and why:
            lines.append(f"       first: {why}")
    parts.append("\n".join(lines))
    fails = sum(c[0] == "FAIL" for c in checks)
    passes = sum(c[0] == "PASS" for c in checks)
    skips = sum(c[0] == "SKIP" for c in checks)
    parts.append(f"{passes} criteria passed, {fails} failed" + (f", {skips} skipped" if skips else ""))
    return "\n\n".join(parts), bool(checks) and fails == 0


# ----------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["warm", "streamsan", "csan", "widen", "cost", "table", "summary"])
    p.add_argument("files", nargs="*", help="table/summary: the JSON files of the other subcommands")
    p.add_argument("--backend", default="native", help="streamsan: native, python or auto")
    p.add_argument("--runs", type=int, default=None, help="widen: runs per variant (5); cost: rounds (3)")
    p.add_argument("--csan", action="store_true", help="cost: plain, then under CSAN (its own process)")
    p.add_argument("--profile", action="store_true",
                   help="cost: also the C++ recorder observing only and with its stages timed (STREAMSAN_PROFILE)")
    p.add_argument("--at-once", action="store_true",
                   help="cost: also the C++ recorder writing its records on the program's thread (STREAMSAN_DEFER=0)")
    p.add_argument("--steady", action="store_true",
                   help="cost: also each program's third run inside one check around three (the check's entry, exit "
                        "and first run not in it: a long run's cost per step)")
    p.add_argument("--no-python", action="store_true", help="cost: not the Python recorder")
    p.add_argument("--set", dest="suite", default="all", choices=SUITES,
                   help="the suite: realcode.py's programs, realcode_compiled.py's, or both (all)")
    p.add_argument("--only", default="", help="NAME[,NAME...]: only these programs (exact names or substrings)")
    p.add_argument("--jobs", type=int, default=4, help="warm: processes compiling at the same time (4)")
    p.add_argument("--deadline-seconds", type=float, default=None,
                   help="stop starting programs near it; at it, print what was found and exit")
    p.add_argument("--graphs", default="all", choices=["all", "without", "only", "last"],
                   help="the programs that capture CUDA graphs: with the others (csan: last), without them, "
                        "only them, or last")
    p.add_argument("--allow-skips", action="store_true", help="summary: a skipped program does not fail")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # cost: one program, spawned by cost
    a = p.parse_args()
    if a.what == "table":
        print(table(a.files))
        return
    if a.what == "summary":
        text, ok = summary(a.files, a.allow_skips)
        print(text)
        sys.exit(0 if ok else 1)
    if a.runs is None:
        a.runs = 5 if a.what == "widen" else 3
    out = {"warm": run_warm, "streamsan": run_streamsan, "csan": run_csan, "widen": run_widen,
           "cost": run_cost}[a.what](a)
    out.emit()
    sys.stdout.flush()
    # Leave at once: interpreter teardown with CUDA, NCCL and forked DataLoader workers about can
    # hang or crash after the results are out.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
