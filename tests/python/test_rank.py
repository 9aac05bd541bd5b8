"""One report per rank under torchrun: the rank from the environment, per-rank paths, reports
and errors that name the rank, and a real `torchrun` of two ranks (CPU tensors standing for
device memory, as in test_recorder_cpu.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import torch_or_skip
from streamsan.torch._rank import Rank, current, path_for

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


def test_rank_from_the_torchrun_environment():
    assert current(TORCHRUN) == Rank(3, 4, 1)
    assert str(current(TORCHRUN)) == "rank 3 of 4 (local rank 1)"
    assert str(Rank(2, 4, 2)) == "rank 2 of 4"
    assert current({"RANK": "0", "WORLD_SIZE": "2"}) == Rank(0, 2, None)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"},  # torchrun with one process
        {"RANK": "1"},
        {"WORLD_SIZE": "2"},
        {"RANK": "x", "WORLD_SIZE": "2"},
        {"RANK": "-1", "WORLD_SIZE": "2"},
    ],
)
def test_a_single_process_has_no_rank(env):
    assert current(env) is None


def test_paths_per_rank():
    r = Rank(3, 4, 1)
    assert path_for("run.jsonl", r) == "run.rank3.jsonl"
    assert path_for("out/run.trace.jsonl", r) == os.path.join("out", "run.trace.rank3.jsonl")
    assert path_for("report", r) == "report.rank3"
    assert path_for(".jsonl", r) == ".jsonl.rank3"
    assert path_for("traces/{rank}/run.jsonl", r) == "traces/3/run.jsonl"
    # A single process keeps its paths; `{rank}` is 0 there.
    assert path_for("run.jsonl", None) == "run.jsonl"
    assert path_for("run-{rank}.jsonl", None) == "run-0.jsonl"


def _race(run):
    """A data race on fake device memory, at the line marked RACE."""
    import torch

    b = run._recorder.backend
    setf = (lambda raw: b.ext.set_fake_stream(raw)) if b.name == "native" else (lambda raw: setattr(b, "fake_stream", raw))
    setf(0)
    x = torch.ones(64)
    b.name_stream(1, "side")
    setf(1)
    x.add_(1)  # RACE


def test_check_under_torchrun_is_the_ranks_own(monkeypatch, tmp_path):
    torch_or_skip()
    import streamsan
    import streamsan.torch

    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)
    trace = tmp_path / "run.jsonl"
    run = streamsan.torch.Run(trace=trace, backend="python", _fake_device=True)
    with pytest.raises(streamsan.HazardError) as e:
        with run:
            _race(run)
    assert run.rank == Rank(3, 4, 1)
    assert run.trace == str(tmp_path / "run.rank3.jsonl")
    assert not trace.exists() and (tmp_path / "run.rank3.jsonl").exists()
    message = str(e.value)
    assert message.startswith(f"streamsan.torch: rank 3 of 4 (local rank 1), pid {os.getpid()}\n")
    assert "run.rank3.jsonl" in message and "data-race" in message
    assert e.value.header == run.header
    # The trace written for the rank checks the same.
    assert streamsan.check_trace(run.trace).hazards == run.report.hazards

    # Without a trace the report is named after the rank.
    run = streamsan.torch.Run(raise_on_hazard=False, backend="python", _fake_device=True)
    with run:
        _race(run)
    assert "<streamsan.torch rank 3>" in run.report.to_text()


def test_single_process_keeps_its_names(monkeypatch, tmp_path):
    torch_or_skip()
    import streamsan
    import streamsan.torch

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    trace = tmp_path / "run.jsonl"
    run = streamsan.torch.Run(trace=trace, backend="python", _fake_device=True)
    with pytest.raises(streamsan.HazardError) as e:
        with run:
            _race(run)
    assert run.rank is None and run.header is None and run.trace == str(trace) and trace.exists()
    assert str(e.value) == run.report.to_text()


SCRIPT = """
import os, torch, streamsan.torch._recorder as R
b = R._active.backend
setf = (lambda raw: b.ext.set_fake_stream(raw)) if b.name == "native" else (lambda raw: setattr(b, "fake_stream", raw))
setf(0)
x = torch.ones(64)
b.name_stream(1, "side")
setf(1)
if os.environ["RANK"] == "0":
    x.add_(1)
else:
    x.mul_(2)
"""
LINE_OF_RANK = {0: 10, 1: 12}


def test_python_m_streamsan_torch_under_a_torchrun_environment(tmp_path):
    torch_or_skip()
    script = tmp_path / "racy.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, STREAMSAN_TORCH_FAKE_DEVICE="1", STREAMSAN_TORCH_BACKEND="python",
               RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
    cmd = [sys.executable, "-m", "streamsan.torch", "--trace", "t.jsonl", str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 1, out.stderr
    # the report, after the line naming its rank (warnings of the run may come before)
    report = out.stderr[out.stderr.index("streamsan.torch: rank 1 of 2, pid "):]
    assert f"racy.py:{LINE_OF_RANK[1]}" in report and (tmp_path / "t.rank1.jsonl").exists()
    out = subprocess.run(cmd[:-1] + ["-o", "report.txt", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert out.returncode == 1 and "data-race" not in out.stderr, out.stderr
    text = (tmp_path / "report.rank1.txt").read_text()
    assert "data-race" in text and not (tmp_path / "report.txt").exists()


def test_torchrun_two_ranks_one_report_each(tmp_path):
    torch_or_skip()
    script = tmp_path / "racy.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, STREAMSAN_TORCH_FAKE_DEVICE="1", STREAMSAN_TORCH_BACKEND="python")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "streamsan.torch", "--trace", "t-{rank}.jsonl", "-o", "report.txt", str(script)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )
    assert out.returncode != 0, out.stdout + out.stderr  # both ranks exit 1: hazards
    for rank in (0, 1):
        text = (tmp_path / f"report.rank{rank}.txt").read_text()
        assert f"racy.py:{LINE_OF_RANK[rank]}" in text, text
        assert f"racy.py:{LINE_OF_RANK[1 - rank]}" not in text, text
        assert f"t-{rank}.jsonl" in text
        assert (tmp_path / f"t-{rank}.jsonl").exists()
    assert not (tmp_path / "report.txt").exists()


def test_a_rank_waits_for_the_other_local_ranks(tmp_path, monkeypatch):
    """A finished rank waits for its node's other ranks (torchrun stops them all at the first
    failing exit); it goes on once every rank is marked done, or after the timeout."""
    import time

    from streamsan.torch import __main__ as cli

    monkeypatch.setattr(cli.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run/1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    start = time.monotonic()
    cli._wait_for_local_ranks(timeout=0.5)
    assert time.monotonic() - start >= 0.5  # rank 1 never came
    (marker_dir,) = tmp_path.iterdir()
    assert sorted(p.name for p in marker_dir.iterdir()) == ["0.done"]
    (marker_dir / "1.done").touch()
    start = time.monotonic()
    cli._wait_for_local_ranks(timeout=30)
    assert time.monotonic() - start < 5  # everyone is done: no wait
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    start = time.monotonic()
    cli._wait_for_local_ranks(timeout=30)  # a single worker never waits
    assert time.monotonic() - start < 5
