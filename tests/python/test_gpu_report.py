"""What gpu_all.sh concludes from its measurements (gpu_report.py summary, bench_overhead.flat),
on made-up results: a criterion that does not hold is a FAIL line and a failing exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import bench_overhead

HERE = os.path.dirname(os.path.abspath(__file__))


def verdict(errors, kinds=(), sites=(), at_line=False):
    return {"errors": errors, "kinds": list(kinds), "sites": list(sites), "at_race_line": at_line}


def suite(python_line_ok=True):
    rows = {
        "side stream without wait": {
            "buggy": verdict(1, ["data-race"], ["programs.py:30"], True),
            "fixed": verdict(0),
            "race_lines": [30],
            "clean_program": False,
        },
        "disjoint views of one buffer": {
            "buggy": verdict(0),
            "fixed": verdict(0),
            "race_lines": [],
            "clean_program": True,
        },
    }
    python = json.loads(json.dumps(rows))
    if not python_line_ok:
        python["side stream without wait"]["buggy"] = verdict(1, ["data-race"], ["programs.py:26"], False)
    return {
        "streamsan-native": rows,
        "streamsan-python": python,
        "csan": {
            "side stream without wait": {"buggy": {"reported": True}, "fixed": {"reported": False}},
            "disjoint views of one buffer": {"buggy": {"reported": False}, "fixed": {"reported": False}},
        },
        "widen": {
            "side stream without wait": {"buggy": {"corrupted": 4, "runs": 5}, "fixed": {"corrupted": 0, "runs": 5}},
            "disjoint views of one buffer": {"buggy": {"corrupted": 0, "runs": 5}, "fixed": {"corrupted": 0, "runs": 5}},
        },
    }


def overhead(mlp_native=2000.0):
    table = {
        "mlp": {"plain": 1300.0, "streamsan-native": mlp_native, "streamsan-python": 9000.0, "csan": 7800.0},
        "streams": {"plain": 60.0, "streamsan-native": 98.0, "streamsan-python": 400.0, "csan": 250.0},
    }
    for row in table.values():
        row.update({f"{k}_ratio": round(v / row["plain"], 2) for k, v in list(row.items()) if k != "plain"})
    return {"runs": [], "table": table}


def marks(rss, history):
    return [{"step": s, "rss_mib": r, "peak_rss_mib": r, "history": h, "generations": 10, "graveyard": 5,
             "recorder_live_device_buffers": 12, "ops": s * 70, "seconds": s / 500}
            for s, r, h in zip((1000, 5000, 10000), rss, history)]


def memory(grows=False):
    good = {"steps": 10000, "sync_every": 0, "backend": "native", "marks": marks((900, 901, 902), (500, 4000, 300))}
    good.update(bench_overhead.flat(good["marks"]))
    item = dict(good, sync_every=100)
    if grows:
        item["marks"] = marks((900, 1400, 1900), (500, 90000, 200000))
        item.update(bench_overhead.flat(item["marks"]))
    return {"no_sync": good, "item_every_100": item}


def summary(tmp_path, s, o, m, pytest_tail):
    files = {}
    for name, data in (("suite", s), ("overhead", o), ("memory", m)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(data))
    (tmp_path / "pytest.txt").write_text("....\n" + pytest_tail + "\n")
    return subprocess.run(
        [sys.executable, os.path.join(HERE, "gpu_report.py"), "summary", "--suite", str(files["suite"]),
         "--overhead", str(files["overhead"]), "--memory", str(files["memory"]), "--pytest", str(tmp_path / "pytest.txt")],
        capture_output=True, text=True, timeout=300,
    )


def test_flat():
    assert bench_overhead.flat(marks((900, 901, 910), (500, 9000, 4000)))["flat"]
    v = bench_overhead.flat(marks((900, 950, 1000), (500, 900, 1000)))
    assert not v["flat"] and "RSS grew 100 MiB" in v["why"]
    v = bench_overhead.flat(marks((900, 900, 900), (100, 5000, 50000)))
    assert not v["flat"] and "history grew from 100 to 50000" in v["why"]
    assert not bench_overhead.flat(marks((900,), (1,)))["flat"]


def test_everything_holds(tmp_path):
    out = summary(tmp_path, suite(), overhead(), memory(), "===== 72 passed, 1 warning in 80.1s =====")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[FAIL]" not in out.stdout and out.stdout.count("[PASS]") == 13
    assert "race @30 ok" in out.stdout
    assert "1.54" in out.stdout and "6.00" in out.stdout  # native and CSAN ratios on the MLP
    assert "reported" in out.stdout and "FALSE ALARM" not in out.stdout


def test_what_does_not_hold_fails(tmp_path):
    out = summary(tmp_path, suite(python_line_ok=False), overhead(mlp_native=3000.0), memory(grows=True),
                  "FAILED test_x.py::test_y - AssertionError: boom\n===== 1 failed, 71 passed in 80.1s =====")
    assert out.returncode == 1
    assert "  FAILED test_x.py::test_y - AssertionError: boom" in out.stdout  # the failed test named
    fails = [line for line in out.stdout.splitlines() if line.startswith("[FAIL]")]
    assert len(fails) == 4, out.stdout
    assert any("python: side stream without wait: buggy reported at its # RACE line" in f for f in fails)
    assert any("overhead: mlp: native recorder <= 2.0x plain (2.31)" in f for f in fails)
    assert any("memory (item/100" in f and "RSS grew 1000 MiB" in f for f in fails)
    assert any("pytest" in f for f in fails)
    assert "WRONG LINE" in out.stdout


def test_a_pytest_run_stopped_before_its_summary_fails_and_says_so(tmp_path):
    out = summary(tmp_path, suite(), overhead(), memory(), "....s...." + " " * 40 + "[100%]")
    assert out.returncode == 1
    assert "pytest tests/python (STREAMSAN_REQUIRE_GPU=1): no summary line: stopped before pytest printed it" in out.stdout
    assert any("pytest" in line for line in out.stdout.splitlines() if line.startswith("[FAIL]"))


def test_missing_results_fail(tmp_path):
    s = suite()
    del s["streamsan-python"], s["csan"]
    out = summary(tmp_path, s, {"runs": [{"mode": "csan", "workload": "mlp", "failed": "x"}], "table": {}}, {}, "")
    assert out.returncode == 1
    for what in ("Python recorder measured", "CSAN measured", "overhead: mlp measured",
                 "overhead: streams measured", "memory measured", "pytest"):
        assert any(what in line for line in out.stdout.splitlines() if line.startswith("[FAIL]")), (what, out.stdout)


def graphs_suite(exception=False):
    """The graph programs' results, as gpu_report.py --set graphs writes them (files of their own)."""
    bug = verdict(1, ["reuse-race"], ["programs.py:275"], True)
    if exception:
        bug = {"errors": None, "kinds": [], "sites": [], "at_race_line": False, "result_ok": None,
               "exception": "RuntimeError: operation not permitted when stream is capturing"}
    rows = {
        "graphs sharing a pool replayed concurrently": {
            "buggy": bug, "fixed": verdict(0), "race_lines": [275], "clean_program": False},
        "one graph replayed back to back on two streams": {
            "buggy": verdict(0), "fixed": verdict(0), "race_lines": [], "clean_program": True},
    }
    return {
        "streamsan-native": rows,
        "streamsan-python": json.loads(json.dumps(rows)),
        "csan": {"graphs sharing a pool replayed concurrently": {"buggy": {"reported": False}, "fixed": {"reported": False}},
                 "one graph replayed back to back on two streams": {
                     "buggy": {"reported": False, "error": "RuntimeError"}, "fixed": {"reported": False}}},
        "widen": {"graphs sharing a pool replayed concurrently": {"buggy": {"corrupted": 5, "runs": 5}, "fixed": {"corrupted": 0, "runs": 5}},
                  "one graph replayed back to back on two streams": {
                      "buggy": {"exception": "RuntimeError: x"} if exception else {"corrupted": 0, "runs": 5},
                      "fixed": {"corrupted": 0, "runs": 5}}},
    }


def test_program_sets_merge(tmp_path):
    import gpu_report

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(suite()))
    b.write_text("some output first\n" + json.dumps(graphs_suite()))
    data = gpu_report.load([str(a), str(b)])
    assert set(data["streamsan-native"]) == {"side stream without wait", "disjoint views of one buffer",
                                             "graphs sharing a pool replayed concurrently",
                                             "one graph replayed back to back on two streams"}
    assert set(data["widen"]) == set(data["csan"]) == set(data["streamsan-native"])


def test_graph_rows_in_the_summary(tmp_path):
    s = gpu_report_merge(suite(), graphs_suite())
    out = summary(tmp_path, s, overhead(), memory(), "===== 72 passed in 80.1s =====")
    assert out.returncode == 0, out.stdout
    assert "reuse @275 ok" in out.stdout
    assert "raised RuntimeError" in out.stdout  # CSAN failed on the program: neither clean nor reported


def test_a_program_that_raised_fails(tmp_path):
    s = gpu_report_merge(suite(), graphs_suite(exception=True))
    out = summary(tmp_path, s, overhead(), memory(), "===== 72 passed in 80.1s =====")
    assert out.returncode == 1
    fails = [line for line in out.stdout.splitlines() if line.startswith("[FAIL]")]
    assert any("native: graphs sharing a pool replayed concurrently: buggy reported" in f for f in fails), out.stdout
    assert "RAISED RuntimeError" in out.stdout
    assert any("widened: one graph replayed back to back on two streams: ran (RuntimeError: x)" in f for f in fails)


def gpu_report_merge(*parts):
    import gpu_report

    data: dict = {}
    for p in parts:
        gpu_report.merge(data, json.loads(json.dumps(p)))
    return data


def test_csan_error_found_behind_a_failed_capture_end():
    import gpu_report

    class CUDASanitizerErrors(Exception):
        pass

    try:
        try:
            raise CUDASanitizerErrors("race")
        finally:
            raise RuntimeError("operation would make the legacy stream depend on a capturing blocking stream")
    except RuntimeError as e:
        assert str(gpu_report._csan_error(e)) == "race"
    assert gpu_report._csan_error(RuntimeError("x")) is None


def test_the_benchmarks_rounds_rotate_the_modes():
    """bench_overhead's interleaved rounds: the warm-up and the first timed round in the modes'
    order, each later one rotated by one; every mode first in as many rounds as the others."""
    modes = ["plain", "streamsan", "observe"]
    assert bench_overhead._rotated(modes, 0) == modes
    assert bench_overhead._rotated(modes, 1) == modes
    assert bench_overhead._rotated(modes, 2) == ["streamsan", "observe", "plain"]
    assert bench_overhead._rotated(modes, 3) == ["observe", "plain", "streamsan"]
    firsts = [bench_overhead._rotated(modes, r)[0] for r in range(1, 10)]
    assert all(firsts.count(m) == 3 for m in modes)
