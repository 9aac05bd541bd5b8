"""The real-code suites' conventions, checked without a GPU (the programs themselves run in
test_gpu_realcode.py and gpu_realcode.sh): a buggy program marks its racing lines, every program
says what it is, and a result check made after the run (`realcode.Later`) is what the runners
judge by."""

from __future__ import annotations

import inspect
import os
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
