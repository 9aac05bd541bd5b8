"""multirank.py's driver on the CPU (gloo, two ranks): each rank checked by `torchrun -m
streamsan.torch`, its report and its result read back per rank, then a widened run. CPU tensors
are not device memory (nothing to report): what is tested is the driver, which a GPU machine of
several GPUs runs for real (docs/pytorch.md, "Several ranks")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import native_ext_or_skip

HERE = Path(__file__).resolve().parent


def test_the_multirank_driver_reads_every_ranks_report_and_result(tmp_path):
    native_ext_or_skip()
    env = dict(os.environ, MULTIRANK_DEVICE="cpu")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    out = subprocess.run(
        [sys.executable, str(HERE / "multirank.py"), "report", "--out", str(tmp_path), "--nproc", "2",
         "--runs", "1", "--only", "ddp-mlp-buckets", "--backends", "native", "--timeout", "200",
         "--seconds", "260"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[PASS] native: ddp-mlp-buckets: every rank clean and right [0, 0 hazards; exit 0]" in out.stdout, out.stdout
    assert "[PASS] widened: ddp-mlp-buckets: never wrong ([0, 0] of 1 a rank)" in out.stdout, out.stdout
    for rank in (0, 1):
        report = json.loads((tmp_path / f"ddp-mlp-buckets-native.rank{rank}.json").read_text())
        assert report["hazards"] == []
        result = json.loads((tmp_path / f"ddp-mlp-buckets-native.result.rank{rank}").read_text())
        assert (result["rank"], result["right"], result["runs"]) == (rank, 1, 1)
    data = json.loads((tmp_path / "multirank.json").read_text())
    assert [ok for ok, _ in data["checks"]] == [True, True]
