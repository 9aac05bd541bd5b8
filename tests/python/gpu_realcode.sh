#!/usr/bin/env bash
# The real-code suite (tests/python/realcode.py), the compiled suite
# (tests/python/realcode_compiled.py: torch.compile, CUDA graph trees, user Triton kernels) and the
# extra one (tests/python/realcode_extra.py: more library code paths) on a GPU, in one run of at
# most REALCODE_SECONDS (default 480 for REALCODE_SET=realcode, 560 for compiled, 300 for extra,
# 570 for all):
#
#   bash tests/python/gpu_realcode.sh WHEELDIR                          # every suite (REALCODE_SET=all)
#   REALCODE_SET=compiled bash tests/python/gpu_realcode.sh WHEELDIR    # the compiled suite alone
#   REALCODE_SET=extra bash tests/python/gpu_realcode.sh WHEELDIR       # the extra suite alone
#
# Both suites in one run need more than 570 s to be measured in full (each alone needs most of its
# default); under a limit of 600 s a command, run REALCODE_SET=realcode, REALCODE_SET=compiled and
# REALCODE_SET=extra as separate commands. A step the deadline cuts short still prints what it has ("not run: deadline").
# On a fresh machine the C++ recorder's build takes over a minute of that (it may take up to
# 150 s, before the cost steps' time): give such a run its defaults.
#
# WHEELDIR holds the streamsan wheel built on a machine with Rust (abi3, any CPython >= 3.9):
#   maturin build --release --strip --out .device/wheels
# The GPU machine needs python3 with torch (CUDA), torchvision, timm, transformers, ninja and a
# C++ compiler (the C++ recorder is built there, once, under /tmp/streamsan-ext); no network: the
# programs' models are random, nothing is downloaded.
#
# Steps (each under `timeout` and a deadline of its own, so every step prints what it has):
#   1. install the wheel into /tmp/site (PYTHONPATH); at the same time, build the C++ recorder
#      and run every selected program of the compiled suite once (`realcode_report.py warm`,
#      REALCODE_WARM_JOBS processes, default 4): it fills Inductor's and Triton's on-disk caches
#      for the processes after it, which then trace and load what it compiled;
#   2. at the same time: streamsan's verdicts with the native recorder, with the Python recorder,
#      CSAN's (processes of their own: the programs that capture CUDA graphs in a second one),
#      and the widened runs (REALCODE_RUNS, default 5);
#   3. alone on the machine: the cost (a warm-up, then plain / native interleaved, REALCODE_COST_RUNS
#      rounds, default 9, as many as each program's share of the time allows; then the Python
#      recorder's rounds (3 at most): it turns on torch's GPU trace for good), then CSAN's cost (plain first, then CSAN enabled, a
#      warm-up and the rounds); in both, the programs that capture CUDA graphs (realcode.captures():
#      realcode.CAPTURES, realcode_compiled.COMPILED_CAPTURES) last, each in a process of its own;
#   4. the table and the summary (PASS/FAIL per criterion; for the compiled programs, the Triton
#      launches the C++ recorder saw and the cost goal, the C++ recorder at most 1.3x plain).
#
# The Python recorder and CSAN run the compiled programs eagerly (Dynamo leaves a frame uncompiled
# while a TorchDispatchMode is active): their verdicts and costs on them are the eager program's.
#
# Environment: OUT (default /tmp/realcode-out), REALCODE_SET (all, realcode, compiled or extra: the
# suites), REALCODE_SECONDS (480 / 560 / 300 / 570 by suite), REALCODE_RUNS (5), REALCODE_COST_RUNS (9),
# REALCODE_ONLY (NAME[,NAME...]: only these programs), REALCODE_PROFILE=1 (the cost step also
# times the C++ recorder observing only and with its stages timed: `cost --profile`, the table's
# "Where the time goes"), REALCODE_AT_ONCE=1 (the cost step also times the C++ recorder writing
# its records on the program's thread: `cost --at-once`, STREAMSAN_DEFER=0; each round is longer,
# and the programs that capture CUDA graphs, timed last, may get no time), REALCODE_STEADY=1 (the
# cost step also times each program's third run inside one check around three: `cost --steady`,
# a long run's cost per step), REALCODE_PYTHON_COST=0
# (the cost step without the Python recorder),
# REALCODE_ALLOW_SKIPS=1 (a program whose
# library is missing does not fail the summary), REALCODE_WARM_JOBS (4) and
# REALCODE_COMPILE_THREADS (4: Inductor's compile workers per warm process),
# REALCODE_COST_SECONDS (120 / 150 / 150) and REALCODE_CSAN_COST_SECONDS (150 / 110 / 150): the
# time kept for step 3's two parts (each program of realcode.captures() in a process of its own
# costs its imports and CUDA set-up, 5-20 s, a compiled one its tracing too; CSAN runs are 10-40
# times slower than plain ones). About 45 s go to steps 0-1 (the warm-up of the compiled suite up
# to 240 s, cold caches), 60-120 s to step 2 (more with compiled programs: each process traces
# them again; bounded by what step 3 keeps, and 240 s); each part of step 3 has what the steps
# before it left, less what is kept for the steps after it. Under a REALCODE_SECONDS shorter than
# both parts' shares and 150 s, the shares not set shrink (the verdicts keep 150 s).
#
# Files under $OUT: realcode.json (every step's results merged), table.md, summary.txt, log.txt
# (every step's exit status and standard error). Exit status 0 when every criterion passes.
set -uo pipefail

wheels=${1:?usage: bash tests/python/gpu_realcode.sh WHEELDIR}
wheels=$(cd "$wheels" && pwd) || exit 2
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 2
out=${OUT:-/tmp/realcode-out}
mkdir -p "$out"
site=${STREAMSAN_SITE:-/tmp/site}
tmp=$(mktemp -d /tmp/realcode.XXXXXX)
export STREAMSAN_TORCH_EXT_DIR=${STREAMSAN_TORCH_EXT_DIR:-/tmp/streamsan-ext}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/realcode-inductor}
unset STREAMSAN_TORCH_BACKEND STREAMSAN_TORCH_FAKE_DEVICE STREAMSAN_TEST_BACKEND
log=$out/log.txt
: >"$log"
start=$(date +%s)
suite=${REALCODE_SET:-all}
case "$suite" in
  realcode) def_s=480 def_cost=120 def_csan=150 warm_limit=150 ;;
  compiled) def_s=560 def_cost=150 def_csan=110 warm_limit=240 ;;
  extra) def_s=300 def_cost=90 def_csan=90 warm_limit=30 ;;
  all) def_s=570 def_cost=150 def_csan=150 warm_limit=240 ;;
  *) echo "REALCODE_SET=$suite: expected realcode, compiled, extra or all" >&2; exit 2 ;;
esac
budget=${REALCODE_SECONDS:-$def_s}
deadline=$((start + budget))
runs=${REALCODE_RUNS:-5}
cost_runs=${REALCODE_COST_RUNS:-9}
cost_s=${REALCODE_COST_SECONDS:-$def_cost}
csan_cost_s=${REALCODE_CSAN_COST_SECONDS:-$def_csan}
# The verdicts come first: a budget too short for the build, the verdicts (about 150 s together on
# a fresh machine) and both cost steps' default shares shrinks those shares (where not set), so
# that the verdict steps are not left without time.
if [ "$budget" -lt $((cost_s + csan_cost_s + 150)) ] && [ -z "${REALCODE_COST_SECONDS:-}${REALCODE_CSAN_COST_SECONDS:-}" ]; then
  spare=$((budget - 150))
  [ "$spare" -lt 40 ] && spare=40
  cost_s=$((spare * def_cost / (def_cost + def_csan)))
  csan_cost_s=$((spare - cost_s))
  echo "gpu_realcode.sh: REALCODE_SECONDS=$budget is short: the cost steps keep $cost_s s and $csan_cost_s s (the verdicts first)" >&2
fi
only=()
[ -n "${REALCODE_ONLY:-}" ] && only=(--only "$REALCODE_ONLY")
sets=(--set "$suite")
report=tests/python/realcode_report.py

note() { echo "== $* ($(($(date +%s) - start)) s)" | tee -a "$log"; }

# run NAME LIMIT STDOUT CMD...: CMD under `timeout`, at most until the deadline less RESERVE
# seconds (kept for the steps after it); an argument @DEADLINE@ becomes the seconds the command
# has, less a margin, for its own --deadline-seconds. Standard error and the status go to
# $tmp/NAME.*.
RESERVE=0
run() {
  local name=$1 limit=$2 stdout=$3 left t0 rc arg
  shift 3
  left=$((deadline - RESERVE - $(date +%s)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 15 ]; then
    echo "$name: not run, no time left" >"$tmp/$name.status"
    : >"$stdout"
    return 124
  fi
  local cmd=()
  for arg in "$@"; do
    [ "$arg" = "@DEADLINE@" ] && arg=$((limit - 10))
    cmd+=("$arg")
  done
  t0=$(date +%s%N)
  timeout -k 5 "$limit" "${cmd[@]}" >"$stdout" 2>"$tmp/$name.err"
  rc=$?
  echo "$name: exit $rc in $((($(date +%s%N) - t0) / 1000000)) ms (limit ${limit}s): ${cmd[*]}" >"$tmp/$name.status"
  return $rc
}

# Appends finished steps' status and standard error to the log.
logged() {
  local name
  for name in "$@"; do
    cat "$tmp/$name.status" >>"$log" 2>/dev/null
    if [ -s "$tmp/$name.err" ]; then
      echo "-- $name: standard error (last 300 lines)" >>"$log"
      tail -n 300 "$tmp/$name.err" >>"$log"
    fi
  done
}

note "machine (suites: $suite)"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 - <<'PY' 2>&1
import sys
print("python", sys.version.split()[0])
for m in ("torch", "torchvision", "timm", "transformers", "triton"):
    try:
        mod = __import__(m)
        print(m, mod.__version__, *(["cuda", mod.version.cuda, "available", mod.cuda.is_available()] if m == "torch" else []))
    except Exception as e:
        print(m, "MISSING", type(e).__name__, e)
PY
  echo "wheels: $(ls "$wheels")"
} | tee -a "$log"

note "install the wheel into $site"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$wheels"/*.whl >>"$log" 2>&1 \
  || echo "pip install failed" | tee -a "$log"
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import streamsan, streamsan.torch; print("streamsan", streamsan.__version__, "from", streamsan.__file__)' 2>&1 | tee -a "$log"

note "build the C++ recorder (in $STREAMSAN_TORCH_EXT_DIR) and run the compiled programs ($suite) once"
# The build before the cost steps' time: without it the C++ recorder's steps build it
# themselves, each inside its own limit (a fresh machine takes over a minute).
RESERVE=60
run build 150 "$tmp/build.out" python3 -c 'from streamsan.torch import _native; print(_native.load(verbose=True).__file__)' &
p_build=$!
RESERVE=$((cost_s + csan_cost_s + 70)) # the verdicts need a minute at least
# every selected program of the compiled suite once, uninstrumented (realcode's set: the compiled
# LLM decode alone): Inductor's and Triton's caches filled for the processes of steps 2 and 3
run warm "$warm_limit" "$tmp/warm.json" env TORCHINDUCTOR_COMPILE_THREADS="${REALCODE_COMPILE_THREADS:-4}" \
  python3 $report warm --jobs "${REALCODE_WARM_JOBS:-4}" --deadline-seconds @DEADLINE@ "${sets[@]}" "${only[@]}" &
p_warm=$!
wait $p_build $p_warm
cat "$tmp/build.out" >>"$log" 2>/dev/null
logged build warm

note "verdicts: native, python, CSAN and the widened runs (at the same time)"
RESERVE=$((cost_s + csan_cost_s + 10))
run native 240 "$tmp/native.json" python3 $report streamsan --backend native --deadline-seconds @DEADLINE@ "${sets[@]}" "${only[@]}" &
p1=$!
run python 240 "$tmp/python.json" python3 $report streamsan --backend python --deadline-seconds @DEADLINE@ "${sets[@]}" "${only[@]}" &
p2=$!
run csan 240 "$tmp/csan.json" python3 $report csan --graphs without --deadline-seconds @DEADLINE@ "${sets[@]}" "${only[@]}" &
p3=$!
# the programs that capture CUDA graphs in a CSAN process of their own: a capture that fails
# under CSAN can leave the process unusable
run csan-graphs 240 "$tmp/csan-graphs.json" python3 $report csan --graphs only --deadline-seconds @DEADLINE@ "${sets[@]}" "${only[@]}" &
p5=$!
run widen 240 "$tmp/widen.json" python3 $report widen --runs "$runs" --deadline-seconds @DEADLINE@ "${sets[@]}" "${only[@]}" &
p4=$!
wait $p1 $p2 $p3 $p4 $p5
logged native python csan csan-graphs widen

# What else runs on the GPU and the host before a cost step (a cost measured while another
# process computes is not the program's): to the log.
machine_state() {
  {
    echo "-- before $1: load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null); GPU processes:"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1
    nvidia-smi --query-gpu=utilization.gpu,clocks.sm,temperature.gpu --format=csv,noheader 2>&1
  } >>"$log"
}

note "cost (alone on the machine)"
# each cost step has what the steps before it left, less what is kept for the steps after it
RESERVE=$((csan_cost_s + 10))
machine_state cost
cost_flags=()
[ "${REALCODE_PROFILE:-0}" = 1 ] && cost_flags+=(--profile)
[ "${REALCODE_AT_ONCE:-0}" = 1 ] && cost_flags+=(--at-once)
[ "${REALCODE_STEADY:-0}" = 1 ] && cost_flags+=(--steady)
[ "${REALCODE_PYTHON_COST:-1}" = 0 ] && cost_flags+=(--no-python)
run cost 600 "$tmp/cost.json" python3 $report cost --runs "$cost_runs" "${cost_flags[@]}" --deadline-seconds @DEADLINE@ "${sets[@]}" "${only[@]}"
logged cost
RESERVE=10
machine_state csan-cost
run csan-cost 600 "$tmp/csan-cost.json" python3 $report cost --csan --runs "$cost_runs" --deadline-seconds @DEADLINE@ "${sets[@]}" "${only[@]}"
logged csan-cost

note "results"
python3 - "$tmp" "$out" <<'PY' 2>&1 | tee -a "$log"
import json, os, sys
sys.path.insert(0, "tests/python")
from realcode_report import load, merge

tmp, out = sys.argv[1:3]
data = {}
for name in ("warm", "native", "python", "csan", "csan-graphs", "widen", "cost", "csan-cost"):
    try:
        merge(data, load([os.path.join(tmp, name + ".json")]))
    except (OSError, ValueError) as e:
        print(f"{name}: no result ({type(e).__name__}: {e})")
with open(os.path.join(out, "realcode.json"), "w") as f:
    json.dump(data, f, indent=1)
PY
python3 $report table "$out/realcode.json" >"$out/table.md" 2>>"$log"
skips=()
[ "${REALCODE_ALLOW_SKIPS:-0}" = 1 ] && skips=(--allow-skips)
python3 $report summary "$out/realcode.json" "${skips[@]}" >"$out/summary.txt" 2>&1
rc=$?
{
  echo
  cat "$tmp"/*.status
  echo
  cat "$out/table.md"
  echo
  cat "$out/summary.txt"
  echo "total: $(($(date +%s) - start)) s"
} | tee -a "$log"
rm -rf "$tmp"
exit $rc
