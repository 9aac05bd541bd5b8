#!/usr/bin/env bash
# Everything the PyTorch front end has to show on a GPU, in one run of about 4-5 minutes (at
# most GPU_ALL_SECONDS, default 330):
#
#   bash tests/python/gpu_all.sh WHEELDIR
#
# WHEELDIR holds the streamsan wheel built on a machine with Rust (abi3, any CPython >= 3.9):
#   maturin build --release --strip --out .device/wheels      (or ../shared/tools/device-stage)
# The GPU machine needs python3 with torch (CUDA), pytest, ninja and a C++ compiler (the C++
# recorder is built there, once, under /tmp/streamsan-ext); no network, no Rust.
#
# Steps (each under a time limit; output and exit status in log.txt):
#   1. install the wheel into /tmp/site (PYTHONPATH), build the C++ recorder once;
#   2. overhead: plain / streamsan.torch.check (native) / CSAN on the MLP training
#      step and the two-stream launch loop, each mode in its own process, the machine otherwise
#      idle (bench_overhead.py all);
#   3. at the same time: all Python tests with STREAMSAN_REQUIRE_GPU=1 (8 workers where
#      pytest-xdist is installed); the memory of a
#      10,000-step online-checked MLP training loop, without host syncs and with loss.item()
#      every 100 steps (bench_overhead.py memory); the program suite's verdicts under the native
#      and the Python recorder, under CSAN, and its widened runs (gpu_report.py); the same for
#      the CUDA graph programs (gpu_report.py --set graphs, in processes of their own);
#   4. the compact tables and a PASS/FAIL line per criterion (gpu_report.py summary).
#
# Files under $OUT (or /tmp/gpu-all-out): log.txt, pytest.txt, suite.json, overhead.json,
# memory.json, summary.txt. Exit status 0 when every criterion passes.
set -uo pipefail

wheels=${1:?usage: bash tests/python/gpu_all.sh WHEELDIR}
wheels=$(cd "$wheels" && pwd) || exit 2
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 2
out=${OUT:-/tmp/gpu-all-out}
mkdir -p "$out"
site=${STREAMSAN_SITE:-/tmp/site}
tmp=$(mktemp -d /tmp/gpu-all.XXXXXX)
export STREAMSAN_TORCH_EXT_DIR=${STREAMSAN_TORCH_EXT_DIR:-/tmp/streamsan-ext}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
unset STREAMSAN_TORCH_BACKEND STREAMSAN_TORCH_FAKE_DEVICE STREAMSAN_TEST_BACKEND
log=$out/log.txt
: >"$log"
deadline=$(($(date +%s) + ${GPU_ALL_SECONDS:-330}))
py=tests/python

note() { echo "== $*" | tee -a "$log"; }

# run NAME LIMIT STDOUT CMD...: CMD under `timeout`, at most until the deadline (less RESERVE
# seconds, for what must still run after it); stderr and the status go to $tmp/NAME.*.
RESERVE=0
run() {
  local name=$1 limit=$2 stdout=$3 left t0 rc
  shift 3
  left=$((deadline - RESERVE - $(date +%s)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    echo "$name: not run, no time left" >"$tmp/$name.status"
    : >"$stdout"
    return 124
  fi
  t0=$(date +%s%N)
  timeout -k 5 "$limit" "$@" >"$stdout" 2>"$tmp/$name.err"
  rc=$?
  echo "$name: exit $rc in $((($(date +%s%N) - t0) / 1000000)) ms (limit ${limit}s): $*" >"$tmp/$name.status"
  return $rc
}

# Appends a finished step's status and standard error to the log.
logged() {
  local name
  for name in "$@"; do
    cat "$tmp/$name.status" >>"$log" 2>/dev/null
    if [ -s "$tmp/$name.err" ]; then
      echo "-- $name: standard error (last 150 lines)" >>"$log"
      tail -n 150 "$tmp/$name.err" >>"$log"
    fi
  done
}

note "machine"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
  echo "wheels: $(ls "$wheels")"
} | tee -a "$log"

note "install the wheel into $site"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$wheels"/*.whl >>"$log" 2>&1 \
  || echo "pip install failed" | tee -a "$log"
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import streamsan, streamsan.torch; print("streamsan", streamsan.__version__, "from", streamsan.__file__)' 2>&1 | tee -a "$log"

note "build the C++ recorder (once, in $STREAMSAN_TORCH_EXT_DIR)"
run build 180 "$tmp/build.out" python3 -c 'from streamsan.torch import _native; print(_native.load(verbose=True).__file__)'
cat "$tmp/build.out" >>"$log"
logged build

note "overhead (alone on the machine)"
RESERVE=120 # seconds kept for what follows (the Python tests take about 100 s on 8 workers)
run overhead 150 "$out/overhead.json" python3 $py/bench_overhead.py all --backend native --no-python --iters 100
logged overhead

note "pytest, memory and the program suite (at the same time)"
RESERVE=15
# the real-code suite's verdicts are gpu_realcode.sh's (too long for this step's limit)
xdist=()  # the suite takes longer than this step's limit on one core: spread it where xdist is
python3 -c "import xdist" 2>/dev/null && xdist=(-n 8)
run pytest 240 "$out/pytest.txt" env STREAMSAN_REQUIRE_GPU=1 python3 -m pytest tests/python -rfEs -p no:cacheprovider \
  "${xdist[@]}" --ignore=tests/python/test_gpu_realcode.py &
p_pytest=$!
run memory-nosync 150 "$tmp/memory-nosync.json" python3 $py/bench_overhead.py memory --steps 10000 --backend native --max-seconds 100 &
p_mem1=$!
run memory-item 150 "$tmp/memory-item.json" python3 $py/bench_overhead.py memory --steps 10000 --sync-every 100 --backend native --max-seconds 100 &
p_mem2=$!
(
  run native 90 "$tmp/native.json" python3 $py/gpu_report.py streamsan --backend native
  run python 120 "$tmp/python.json" python3 $py/gpu_report.py streamsan --backend python
  run csan 90 "$tmp/csan.json" python3 $py/gpu_report.py csan
  run widen 90 "$tmp/widen.json" python3 $py/gpu_report.py widen --runs 5
) &
p_suite=$!
(
  run graphs-native 60 "$tmp/graphs-native.json" python3 $py/gpu_report.py streamsan --backend native --set graphs
  run graphs-python 60 "$tmp/graphs-python.json" python3 $py/gpu_report.py streamsan --backend python --set graphs
  run graphs-csan 60 "$tmp/graphs-csan.json" python3 $py/gpu_report.py csan --set graphs
  run graphs-widen 60 "$tmp/graphs-widen.json" python3 $py/gpu_report.py widen --runs 5 --set graphs
) &
p_graphs=$!
wait $p_pytest $p_mem1 $p_mem2 $p_suite $p_graphs
logged pytest memory-nosync memory-item native python csan widen graphs-native graphs-python graphs-csan graphs-widen

note "results"
RESERVE=0
python3 - "$tmp" "$out" <<'PY' 2>&1 | tee -a "$log"
import json, os, sys
sys.path.insert(0, "tests/python")
from gpu_report import load, merge

tmp, out = sys.argv[1:3]
suite = {}
for name in ("native", "python", "csan", "widen", "graphs-native", "graphs-python", "graphs-csan", "graphs-widen"):
    try:
        merge(suite, load([os.path.join(tmp, name + ".json")]))
    except (OSError, ValueError) as e:
        print(f"{name}: no result ({type(e).__name__}: {e})")
with open(os.path.join(out, "suite.json"), "w") as f:
    json.dump(suite, f, indent=1)
memory = {}
for key, name in (("no_sync", "memory-nosync"), ("item_every_100", "memory-item")):
    try:
        memory[key] = load([os.path.join(tmp, name + ".json")])
    except (OSError, ValueError) as e:
        print(f"{name}: no result ({type(e).__name__}: {e})")
with open(os.path.join(out, "memory.json"), "w") as f:
    json.dump(memory, f, indent=1)
PY
python3 $py/gpu_report.py summary --suite "$out/suite.json" --overhead "$out/overhead.json" \
  --memory "$out/memory.json" --pytest "$out/pytest.txt" >"$out/summary.txt" 2>&1
rc=$?
{
  echo
  cat "$tmp"/*.status
  echo
  cat "$out/summary.txt"
} | tee -a "$log"
rm -rf "$tmp"
exit $rc
