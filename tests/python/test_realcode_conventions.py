"""The real-code suites' conventions, checked without a GPU (the programs themselves run in
test_gpu_realcode.py and gpu_realcode.sh): a buggy program marks its racing lines, every program
says what it is, and a result check made after the run (`realcode.Later`) is what the runners
judge by."""

from __future__ import annotations

import gc
import inspect
import os
import signal
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import realcode  # noqa: E402

SUITES = ("realcode", "compiled", "extra")


def _sets(suite):
    try:
        return realcode.program_sets("all" if suite == "realcode" else suite)
    except ImportError as e:  # a suite module whose imports are missing here
        pytest.skip(f"{suite}: {e}")


@pytest.mark.parametrize("suite", SUITES)
def test_every_buggy_program_marks_its_racing_lines(suite):
    bugs, _ = _sets(suite)
    for name, fn in bugs.items():
        assert realcode.race_lines(fn), f"{name}: no line marked # RACE"


@pytest.mark.parametrize("suite", SUITES)
def test_every_program_says_what_it_is_and_takes_fixed_and_widen(suite):
    bugs, clean = _sets(suite)
    assert bugs or clean
    for name, fn in {**bugs, **clean}.items():
        assert (fn.__doc__ or "").strip(), f"{name}: no docstring"
        assert list(inspect.signature(fn).parameters)[:2] == ["fixed", "widen"], name


def test_a_later_is_judged_by_calling_it():
    calls = []

    def right(x):
        calls.append(x)
        return x == 2

    later = realcode.Later(right, 2)
    assert calls == []  # made, not run
    assert realcode.judged(later) is True and calls == [2]
    assert realcode.judged(realcode.Later(right, 3)) is False
    assert realcode.judged(True) is True and realcode.judged(0) is False


def test_the_compiled_programs_leave_their_eager_reference_to_after_the_run():
    """The compiled programs compared with the eager model return that comparison as a `Later`
    (their source says so: the cost of checking a compiled program is the compiled program's)."""
    bugs, clean = _sets("compiled")
    later = {name for name, fn in {**bugs, **clean}.items() if "Later(" in inspect.getsource(fn)}
    for name in ("torch.compile ResNet-18 training", "torch.compile timm ViT-Tiny inference",
                 "torch.compile nanoGPT loop with pinned batches", "gpt-fast decode (reduce-overhead) 64 tokens"):
        assert name in later, name
    assert "Later(" in inspect.getsource(realcode.compiled_llm_decode)


def test_cost_rounds_of_a_mode_measured_apart_from_plain_are_ratioed(monkeypatch):
    # `cost --csan` times the plain rounds first and CSAN's in a second pass (importing CSAN's
    # module slows plain runs down): the second pass has no plain samples of its own, and its
    # ratio is the medians'.
    import realcode_report as rr

    times = {"plain": 0.010, "csan": 0.100}
    monkeypatch.setattr(rr, "_once", lambda fn, mode: (times[mode], {}))
    monkeypatch.setattr(rr, "_collect", lambda: None)
    out = rr.Out("cost-csan", None, {})
    progs = [("prog", lambda *a: None, True)]
    rr._cost_rows(out, progs, ["plain"], 3)
    rr._cost_rows(out, progs, ["csan"], 3)
    cell = out.rows["prog"]["seconds"]
    assert cell["plain"] == 0.01 and cell["csan"] == 0.1
    assert cell["csan_ratio"] == 10.0
    assert "csan_ratio_paired" not in cell


def test_the_cost_rounds_rotate_the_modes(monkeypatch):
    """`cost` runs the modes of a program in a warm-up round in their order, then each timed round
    in the order of the one before rotated by one: no mode is always first after the collection
    or always after the same mode. The medians and the paired ratios are of those rounds."""
    import realcode_report

    calls = []
    seconds = {"plain": 1.0, "native": 1.5, "native-observe": 1.25}

    def once(fn, mode):
        calls.append(mode)
        return seconds[mode], {}

    monkeypatch.setattr(realcode_report, "_once", once)
    monkeypatch.setattr(realcode_report, "_collect", lambda: None)
    term = signal.getsignal(signal.SIGTERM)
    try:
        out = realcode_report.Out("cost", None, {})  # (it takes SIGTERM, and freezes the heap)
    finally:
        signal.signal(signal.SIGTERM, term)
        gc.unfreeze()
    modes = ["plain", "native", "native-observe"]
    realcode_report._cost_rows(out, [("prog", lambda *a: None, True)], modes, runs=4)
    rounds = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    assert rounds == [
        modes,  # the warm-up
        ["plain", "native", "native-observe"],
        ["native", "native-observe", "plain"],
        ["native-observe", "plain", "native"],
        ["plain", "native", "native-observe"],
    ]
    cell = out.rows["prog"]["seconds"]
    assert cell["plain"] == 1.0 and cell["native_ratio"] == 1.5 and cell["native_ratio_paired"] == 1.5
    assert out.rows["prog"]["samples"]["native-observe"] == [1.25] * 4


def test_a_steady_round_times_the_third_run_inside_one_check(monkeypatch):
    """`cost --steady` enters one check, runs the program twice untimed, and times the third run
    alone (a long run's step: not the check's entry or exit, nor the first run under it)."""
    import time

    import torch

    import realcode_report
    import streamsan.torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    runs = []
    entered = []
    real_enter = streamsan.torch.Run.__enter__

    def enter(self):
        entered.append(len(runs))
        return real_enter(self)

    monkeypatch.setattr(streamsan.torch.Run, "__enter__", enter)

    def program(fixed, widen):
        runs.append((fixed, widen))
        time.sleep(0.3 if len(runs) <= 2 else 0.05)  # the untimed runs are the slow ones

    seconds, info = realcode_report._once(program, realcode_report.STEADY)
    assert runs == [(True, False)] * 3
    assert entered == [0]  # one check, entered before the first run
    assert 0.05 <= seconds < 0.25  # the third run, and only it
    assert info["errors"] == 0 and info["backend"] in ("native", "python")


def _cost_row(native, steady=None):
    """A program's row of the cost step: its ratio as a check of its own and (`steady`) in a long
    run's step."""
    import realcode_report as rr

    sec = {"plain": 0.01, "native_ratio": native}
    if steady is not None:
        sec[f"{rr.STEADY}_ratio"] = steady
    return {"seconds": sec}


def test_the_cost_overview_counts_the_programs_within_each_bound():
    import realcode_report as rr

    row = _cost_row
    cost = {"a": row(1.05, 1.02), "b": row(1.15, 1.08), "c": row(1.25, 1.19), "d": row(1.4)}
    # CSAN's ratio, or (its process timed no plain run) its seconds over the cost step's plain ones
    text = rr.cost_overview(cost, {"a": {"seconds": {"csan": 0.095, "csan_ratio": 9.5}}, "b": {"seconds": {"csan": 0.1}}})
    lines = text.splitlines()
    assert lines[0] == "cost against plain (median rounds):"
    assert "each run a check of its own): median 1.200x, 1.05-1.40x, 1 within 1.1x, 2 within 1.2x, " \
           "3 within 1.3x (of 4)" in lines[1]
    assert "long run's step" in lines[2] and "median 1.080x, 1.02-1.19x, 2 within 1.1x, 3 within 1.2x" in lines[2]
    assert "CSAN: median 9.750x, 9.50-10.00x" in lines[3] and "(of 2)" in lines[3]
    assert rr.cost_overview({}) == ""


def test_errors_under_the_cost_steps_checks_are_listed():
    import realcode_report as rr

    cost = {"a": {"seconds": {}}, "b": {"errors_under_check": {"native-steady": 27, "native": 9}}}
    assert rr.errors_under_cost_checks(cost) == (
        "errors under the cost step's checks (the last round that had any):\n  b: native 9, native-steady 27")
    assert rr.errors_under_cost_checks({"a": {"seconds": {}}}) == ""
    # A checked mode that raised is listed; plain, CSAN and the process's own failures are not.
    failed = {"a": {"failed": {"native-steady": "TraceError: overlaps a pool\n  more", "csan": "CSAN failed",
                               "plain": "x", "process": "timed out"}}}
    assert rr.errors_under_cost_checks(failed) == (
        "checks that raised in the cost step:\n  a: native-steady: TraceError: overlaps a pool")
    both = rr.errors_under_cost_checks({**cost, **failed})
    assert both.startswith("errors under the cost step's checks") and both.endswith("TraceError: overlaps a pool")


def test_a_compiled_programs_cost_goal_is_judged_on_a_long_runs_step_where_measured():
    import realcode_report as rr

    row = _cost_row

    assert rr._goal(row(1.35, 1.05), True) == "met (steady)"  # entering and leaving not counted
    assert rr._goal(row(1.10, 1.31), True) == "NOT met (steady)"  # the step itself over the goal
    assert rr._goal(row(1.29), True) == "met"  # no steady rounds: the run checked on its own
    assert rr._goal(row(1.31), True) == "NOT met"
    assert rr._goal(None, True) == "unmeasured" and rr._goal(row(2.0, 2.0), False) == ""
    assert [rr._goal_key(g) for g in ("met (steady)", "NOT met (steady)", "unmeasured")] == [
        "met", "NOT met", "unmeasured"]


def test_a_goal_not_met_by_a_program_whose_plain_rounds_spread_says_so():
    import realcode_report as rr

    def spread(plain, paired, steady=2.11):
        r = _cost_row(2.58, steady)
        r["samples"] = {"plain": plain}
        r["seconds"][f"{rr.STEADY}_ratio_paired"] = paired
        r["seconds"]["native_ratio_paired"] = 1.06
        return r

    wide = [0.0326, 0.0144, 0.1189, 0.0912]  # 14.4-118.9 ms
    goal = rr._goal(spread(wide, 0.89), True)
    assert goal == "NOT met (steady; plain rounds 14.4-118.9 ms, round by round 0.89x)"
    assert rr._goal_key(goal) == "NOT met"  # still judged on the ratio of medians
    # no steady rounds: the run checked on its own, its own round-by-round ratio
    assert rr._goal(spread(wide, 0.89, steady=None), True) == (
        "NOT met (plain rounds 14.4-118.9 ms, round by round 1.06x)")
    # plain rounds within 3x of each other, a goal met, or no round-by-round ratio: no note
    assert rr._goal(spread([0.030, 0.040, 0.085], 0.89), True) == "NOT met (steady)"
    assert rr._goal(spread(wide, 0.89, steady=1.2), True) == "met (steady)"
    no_pairs = spread(wide, 0.89)
    del no_pairs["seconds"][f"{rr.STEADY}_ratio_paired"]
    assert rr._goal(no_pairs, True) == "NOT met (steady)"
