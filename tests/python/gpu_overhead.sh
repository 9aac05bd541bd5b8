#!/usr/bin/env bash
# What checking costs on a GPU, and where the time goes, in one run of at most OVERHEAD_SECONDS
# (default 560):
#
#   bash tests/python/gpu_overhead.sh WHEELDIR
#
# Steps (each under `timeout`, so every step prints what it has):
#   1. install the wheel into /tmp/site (PYTHONPATH) and build the C++ recorder;
#   2. `bench_overhead.py paired` for the MLP training step, the two-stream loop and the tiny
#      (launch-bound) MLP step: plain and
#      checked interleaved in one process, with the recorder observing only and with its stages
#      timed (STREAMSAN_PROFILE); then CSAN on each, in a process of its own (it cannot be
#      turned off); and what a check costs to enter and leave (bench_overhead.py startup);
#   3. unless OVERHEAD_MEMORY=0: the 10,000-step memory run (bench_overhead.py memory, the loss
#      read every 100 steps);
#   4. `realcode_report.py cost --profile --no-python` on the real-code suite's programs that
#      capture no CUDA graph (OVERHEAD_ONLY=NAME[,NAME...]: those), then CSAN's cost on them;
#   5. the table (realcode_report.py table: the cost, and "Where the time goes").
# OVERHEAD_ABLATE=1 adds, before step 2, `bench_overhead.py ablate` on the MLP step, the two-stream
# loop and ResNet-18 (and on CPU tensors: the tiny MLP step, ablated and paired); OVERHEAD_PAIRED=0
# leaves out step 2's paired runs.
# OVERHEAD_REALCODE=0 leaves out steps 4 and 5 (gpu_realcode.sh with REALCODE_PROFILE=1 measures
# the same table beside its verdicts).
#
# Files under $OUT (default /tmp/overhead-out): paired-*.json, csan-*.json, memory.json,
# cost.json, csan-cost.json, table.md, log.txt.
set -uo pipefail

wheels=${1:?usage: bash tests/python/gpu_overhead.sh WHEELDIR}
wheels=$(cd "$wheels" && pwd) || exit 2
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 2
out=${OUT:-/tmp/overhead-out}
mkdir -p "$out"
site=${STREAMSAN_SITE:-/tmp/site}
export STREAMSAN_TORCH_EXT_DIR=${STREAMSAN_TORCH_EXT_DIR:-/tmp/streamsan-ext}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
unset STREAMSAN_TORCH_BACKEND STREAMSAN_TORCH_FAKE_DEVICE STREAMSAN_TEST_BACKEND STREAMSAN_PROFILE
log=$out/log.txt
: >"$log"
deadline=$(($(date +%s) + ${OVERHEAD_SECONDS:-560}))
sel=(--graphs without)  # the real-code suite's programs that capture no CUDA graph
[ -n "${OVERHEAD_ONLY:-}" ] && sel=(--only "$OVERHEAD_ONLY")

# step NAME LIMIT STDOUT CMD...: runs CMD under `timeout` (at most LIMIT s and what is left).
step() {
  local name=$1 limit=$2 stdout=$3 left t0 rc
  shift 3
  left=$((deadline - $(date +%s)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    echo "$name: not run, no time left" | tee -a "$log"
    return 124
  fi
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$stdout" 2>>"$log"
  rc=$?
  echo "$name: exit $rc in $(($(date +%s) - t0)) s (limit ${limit}s)" | tee -a "$log"
  return $rc
}

python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$wheels"/*.whl >>"$log" 2>&1 \
  || echo "pip install failed" | tee -a "$log"
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
step build 300 "$out/build.txt" python3 -c "from streamsan.torch import _native; e = _native.load(); print('native syncs', e.native_syncs())"
cat "$out/build.txt"

bench=tests/python/bench_overhead.py
if [ "${OVERHEAD_ABLATE:-0}" != 0 ]; then
  # What each part of recording costs in place (bench_overhead.py ablate), on the GPU and, for
  # the same code on CPU tensors, on this host's CPU (to set beside the machine without a GPU).
  for w in mlp streams resnet; do
    iters=200; [ "$w" = resnet ] && iters=20; [ "$w" = streams ] && iters=400
    step "ablate $w" 120 "$out/ablate-$w.json" python3 $bench ablate "$w" --iters $iters --rounds 3
    cat "$out/ablate-$w.json"
  done
  step "ablate tiny (cpu)" 120 "$out/ablate-tiny-cpu.json" python3 $bench ablate tiny --device cpu --iters 300 --rounds 3
  cat "$out/ablate-tiny-cpu.json"
  step "paired tiny (cpu)" 120 "$out/paired-tiny-cpu.json" python3 $bench paired tiny --device cpu --iters 300 --rounds 3
  cat "$out/paired-tiny-cpu.json"
fi
[ "${OVERHEAD_PAIRED:-1}" = 0 ] && workloads=() || workloads=(mlp streams tiny)
for w in "${workloads[@]}"; do
  step "paired $w" 90 "$out/paired-$w.json" python3 $bench paired "$w" --iters 200
  cat "$out/paired-$w.json"
  step "csan $w" 60 "$out/csan-$w.json" python3 $bench run csan "$w" --iters 100
  step "plain $w (own process)" 60 "$out/plain-$w.json" python3 $bench run plain "$w" --iters 200
done
step startup 60 "$out/startup.json" python3 $bench startup
cat "$out/startup.json"
if [ "${#workloads[@]}" -gt 0 ]; then
python3 - "$out" <<'PY' | tee "$out/bench.md"
import json, os, sys
d = sys.argv[1]
print("| workload | plain µs | streamsan µs (×) | observe only µs (×) | CSAN µs (×, own process vs own-process plain) | ops/iter | stages µs/iter |")
print("|---|---|---|---|---|---|---|")
for w in ("mlp", "streams", "tiny"):
    try:
        p = json.load(open(os.path.join(d, f"paired-{w}.json")))
    except Exception as e:
        print(f"| {w} | failed: {e} |"); continue
    try:
        c = json.load(open(os.path.join(d, f"csan-{w}.json")))["median_us"]
        pl = json.load(open(os.path.join(d, f"plain-{w}.json")))["median_us"]
        csan = f"{c:.1f} ({c / pl:.2f}×)"
    except Exception:
        csan = "-"
    us, r = p["us"], p["ratio"]
    st = ", ".join(f"{k} {v}" for k, v in p["stages_us_per_iter"].items())
    print(f"| {w} | {us['plain']} | {us['streamsan']} ({r['streamsan']}×) | {us['observe']} ({r['observe']}×) | {csan} "
          f"| {p['ops_per_iter']} | {st} |")
PY
fi

if [ "${OVERHEAD_MEMORY:-1}" != 0 ]; then
  step memory 150 "$out/memory.json" python3 $bench memory --steps 10000 --sync-every 100 --backend native --max-seconds 120
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print('memory:', {k: m.get(k) for k in ('steps','flat','why','ops','errors','seconds','stopped')}); print('first', m['marks'][0] if m['marks'] else None); print('last', m['marks'][-1] if m['marks'] else None)" "$out/memory.json" 2>&1 | tee -a "$log"
fi

[ "${OVERHEAD_REALCODE:-1}" = 0 ] && exit 0
report=tests/python/realcode_report.py
left=$((deadline - $(date +%s)))
step cost $((left * 6 / 10)) "$out/cost.json" python3 $report cost --profile --no-python --runs 3 --set realcode "${sel[@]}" --deadline-seconds $((left * 6 / 10 - 10))
left=$((deadline - $(date +%s)))
step csan-cost $((left - 15)) "$out/csan-cost.json" python3 $report cost --csan --runs 2 --set realcode "${sel[@]}" --deadline-seconds $((left - 25))
python3 $report table "$out/cost.json" "$out/csan-cost.json" >"$out/table.md" 2>>"$log"
cat "$out/table.md"
