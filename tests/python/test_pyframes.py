"""The C++ recorder's walk of a thread's Python frames without the GIL (csrc/pyframes.h) agrees
with the interpreter's own frames: built into a small module without torch (pyframes_probe/) and
run by this interpreter, and by each one STREAMSAN_PYFRAMES_PYTHONS lists (paths, separated by
spaces: other CPython versions, where there are)."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "pyframes_probe", "check.py")

PYTHONS = [sys.executable] + os.environ.get("STREAMSAN_PYFRAMES_PYTHONS", "").split()


@pytest.mark.parametrize("python", PYTHONS)
def test_frame_walk_without_the_gil_agrees_with_the_interpreter(python, tmp_path):
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler to build the probe")
    include = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    if not os.path.exists(os.path.join(include, "Python.h")):
        pytest.skip(f"{python}: no Python.h to build the probe against (the interpreter's headers are not installed)")
    out = subprocess.run([python, CHECK, str(tmp_path)], capture_output=True, text=True, timeout=300)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    if "no frame walk" not in out.stdout:
        assert len(lines) == 6 and all(": agree (" in line for line in lines), out.stdout
