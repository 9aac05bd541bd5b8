#!/usr/bin/env bash
# The measurements of docs/performance.md on a GPU machine, in parts that each fit a 10-minute
# call (a fresh machine builds the C++ recorder first, in whichever part runs first):
#
#   bash tests/python/gpu_measure.sh eager    WHEELDIR  # the eager real-code suite, then the paired MLP step
#   bash tests/python/gpu_measure.sh compiled WHEELDIR  # the compiled suite, then 10,000 checked steps' memory
#   bash tests/python/gpu_measure.sh all      WHEELDIR  # gpu_all.sh (REQUIRE_GPU pytest, program suite,
#                                                       # overhead), the paired two-stream loop, entering and
#                                                       # leaving after a synchronization, the Rust GPU tests
#   bash tests/python/gpu_measure.sh observe  WHEELDIR  # what observing costs, split (bench_observer_floor
#                                                       # --check), entering and leaving after each model's step,
#                                                       # the paired MLP step synchronizing at every step
#   bash tests/python/gpu_measure.sh profile  WHEELDIR  # the compiled decode loop and compiled AMP by mode
#                                                       # (profile_program.py: floor, observing with and without
#                                                       # the patches, checked with and without Triton's hooks),
#                                                       # after a graph's replays by wrapper (bench_replay.py);
#                                                       # entering and leaving a check under cProfile
#   bash tests/python/gpu_measure.sh kernels  WHEELDIR  # compiled ViT-Tiny inference, nanoGPT loop and SDPA
#                                                       # by mode (profile_program.py: floor, observing with and
#                                                       # without Triton's hooks and the patches, with the hooks'
#                                                       # wrapper bare or its direct entry in Python, checked with
#                                                       # and without the hooks, the recorder's stages with
#                                                       # `kernels` and its parts, the time inside its Triton
#                                                       # entries; with `perf` there, a profile of the checked
#                                                       # ViT-Tiny inference by function, perf-vit.txt)
#   bash tests/python/gpu_measure.sh threads  WHEELDIR  # eager programs by mode (profile_program.py): parts of
#                                                       # the recording left out (the ablations, written at
#                                                       # once), then with the program's thread pinned, the
#                                                       # other threads on the scheduler's CPUs, apart from its
#                                                       # core, or on it: whether the threads beside the
#                                                       # program slow it down
#   bash tests/python/gpu_measure.sh quick    WHEELDIR  # a short window's check of the recorder's changes
#                                                       # (about 5 minutes): the C++ recorder built, the
#                                                       # Triton and CUDA graph GPU tests, the C++ recorder's
#                                                       # verdicts on the compiled suite and on the eager
#                                                       # programs with pinned memory or graphs, and compiled
#                                                       # ViT-Tiny inference's cost by mode
#   bash tests/python/gpu_measure.sh sweep    WHEELDIR  # library_sweep.py on the GPU (`cuda`): torchvision's
#                                                       # models (classification, then detection, segmentation,
#                                                       # video, optical flow), timm's families, transformers'
#                                                       # architectures, torchaudio's models, PyG's GNNs and a
#                                                       # Lightning loop trained two steps, fed by a side-stream
#                                                       # prefetch, under the C++ recorder, then the Python one
#                                                       # (SWEEP_BACKENDS, SWEEP_SETS choose); SWEEP_COMPILED="tv
#                                                       # timm tvx hf": those sets' compiled models after them
#   bash tests/python/gpu_measure.sh multirank WHEELDIR  # multirank.py on a machine of NPROC (2) GPUs: DDP
#                                                       # (ResNet-18, small buckets, the fp16 hook), FSDP2, FSDP1
#                                                       # and two planted bugs of async collectives, each rank
#                                                       # checked by torchrun -m streamsan.torch under both
#                                                       # recorders, then widened (RUNS runs, 5)
#   bash tests/python/gpu_measure.sh ab WHEELDIR WHEELDIR_B  # one program's profile (profile_program.py)
#                                                       # under two wheels on the same machine, each
#                                                       # in processes of its own, alternated: a change
#                                                       # against its parent (AB_PROGRAM, default the
#                                                       # compiled decode loop; AB_SET, AB_MODES, AB_ROUNDS,
#                                                       # AB_REPEATS: the processes per wheel); AB_BENCH=startup:
#                                                       # entering and leaving a check instead (bench_overhead
#                                                       # startup --compiled, AB_N checks a process)
#
# WHEELDIR holds the wheel (built where Rust is, with maturin); results go under $OUT (default
# /tmp/gpu-measure/PART), a line per step in steps.txt. SECS overrides a suite's time budget,
# PART_SECONDS the part's (600: the steps after the first stop in time for a call that long). The
# `all` part runs .device/run-tests (the Rust GPU test executables staged by tools/device-stage)
# where it is there. PACK=FILE: at the end, everything the part wrote is packed into FILE (a .tgz:
# for a machine whose results come back as a few files, e.g. `PACK=$OUT/eager.tgz
# OUT=/tmp/gm/eager bash tests/python/gpu_measure.sh eager .device/wheels`: PACK first, so that its
# $OUT is the caller's).
set -u
part=${1:?part: eager, compiled, all, observe, profile, kernels, threads, quick, sweep, multirank or ab}
wheels=${2:?WHEELDIR}
O=${OUT:-/tmp/gpu-measure/$part}
mkdir -p "$O"
O=$(cd "$O" && pwd)  # the steps run in other folders
here=$(cd "$(dirname "$0")" && pwd)
t0=$(date +%s)
exec 3>&1  # the part's own output: a step's line goes there, not into its command's redirected output
step() {  # step NAME SECONDS COMMAND...: runs COMMAND under a timeout, logs its status and time
  local name=$1 limit=$2
  shift 2
  local t1=$(date +%s)
  timeout "$limit" "$@" 3>&-
  echo "$name exit $? in $(( $(date +%s) - t1 )) s" | tee -a "$O/steps.txt" >&3
}
left() { echo $(( ${1:-580} - 600 + ${PART_SECONDS:-600} - ($(date +%s) - t0) )); }
step_left() {  # step_left MIN MAX NAME COMMAND...: `step` for at most MAX s of the time left, if MIN s are
  local l
  l=$(left 590)
  [ "$l" -gt "$1" ] || return 0
  local limit=$(( l < $2 ? l : $2 ))
  shift 2
  step "$1" "$limit" "${@:2}"
}
site() {  # the wheel installed into /tmp/site (as gpu_realcode.sh and gpu_all.sh do)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$wheels"/*.whl >&2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} STREAMSAN_TORCH_EXT_DIR=${STREAMSAN_TORCH_EXT_DIR:-/tmp/streamsan-ext}
}
case "$part" in
  eager)
    OUT=$O/eager REALCODE_PYTHON_COST=0 REALCODE_SET=realcode REALCODE_PROFILE=1 REALCODE_STEADY=${STEADY:-1} REALCODE_SECONDS=${SECS:-480} \
      step eager-suite 560 bash "$here/gpu_realcode.sh" "$wheels" > "$O/eager-stdout.txt" 2>&1
    site
    l=$(left 575)
    [ "$l" -gt 40 ] && step paired-mlp "$l" python3 "$here/bench_overhead.py" paired mlp --device cuda --iters 100 \
      --rounds 7 > "$O/paired-mlp.json" 2> "$O/paired-mlp.err"
    tail -45 "$O/eager-stdout.txt"; tail -c 1200 "$O/paired-mlp.json"; echo
    ;;
  compiled)
    OUT=$O/compiled REALCODE_PYTHON_COST=0 REALCODE_SET=compiled REALCODE_PROFILE=1 REALCODE_STEADY=${STEADY:-1} REALCODE_SECONDS=${SECS:-520} \
      step compiled-suite 560 bash "$here/gpu_realcode.sh" "$wheels" > "$O/compiled-stdout.txt" 2>&1
    site
    l=$(left 585)
    [ "$l" -gt 20 ] && step memory "$l" python3 "$here/bench_overhead.py" memory --steps 10000 --sync-every 100 \
      --backend native --max-seconds $(( l - 10 )) > "$O/memory.json" 2> "$O/memory.err"
    tail -45 "$O/compiled-stdout.txt"; tail -c 600 "$O/memory.json"; echo
    ;;
  all)
    OUT=$O/all GPU_ALL_SECONDS=${SECS:-300} step gpu-all 370 bash "$here/gpu_all.sh" "$wheels" > "$O/all-stdout.txt" 2>&1
    site
    step paired-streams 50 python3 "$here/bench_overhead.py" paired streams --device cuda --iters 400 --rounds 9 \
      > "$O/paired-streams.json" 2> "$O/paired-streams.err"
    step startup-sync 40 python3 "$here/bench_overhead.py" startup --device cuda --between 2 --inside 5 \
      --wait-ms 0.3 --n 40 > "$O/startup-sync.json" 2> "$O/startup-sync.err"
    if [ -x "$here/../../.device/run-tests" ]; then
      STREAMSAN_REQUIRE_GPU=1 step rust-tests "$(left 585)" "$here/../../.device/run-tests" > "$O/rust-tests.txt" 2>&1
    fi
    tail -45 "$O/all/summary.txt" 2>/dev/null; grep -E "passed|failed" "$O/all/pytest.txt" 2>/dev/null | tail -3
    tail -20 "$O/rust-tests.txt" 2>/dev/null; tail -c 1000 "$O/paired-streams.json"; echo; cat "$O/startup-sync.json"
    ;;
  observe)
    site
    export STREAMSAN_BENCH_EXT_DIR=${STREAMSAN_BENCH_EXT_DIR:-/tmp/bench-ext}
    step build 300 python3 -c "from streamsan.torch import _native; _native.load()" > "$O/build.txt" 2>&1
    for w in "resnet 10 7" "mlp 100 9" "streams 400 9"; do
      set -- $w
      step "floor-$1" 150 python3 "$here/bench_observer_floor.py" --device cuda --workload "$1" --steps "$2" \
        --rounds "$3" --check --json "$O/floor-$1.json" > "$O/floor-$1.txt" 2>&1
    done
    for m in mlp resnet vit; do
      step "startup-$m" 60 python3 "$here/bench_overhead.py" startup --device cuda --model "$m" --between 2 \
        --inside 5 --wait-ms 1 --n 30 > "$O/startup-$m.json" 2> "$O/startup-$m.err"
    done
    l=$(left 580)
    [ "$l" -gt 40 ] && step paired-mlp-sync "$l" python3 "$here/bench_overhead.py" paired mlp --device cuda \
      --iters 100 --rounds 7 --sync-each > "$O/paired-mlp-sync.json" 2> "$O/paired-mlp-sync.err"
    cat "$O"/floor-*.txt; for m in mlp resnet vit; do tail -c 400 "$O/startup-$m.json"; echo; done
    tail -c 800 "$O/paired-mlp-sync.json" 2>/dev/null
    ;;
  profile)
    site
    step build 300 python3 -c "from streamsan.torch import _native; _native.load()" > "$O/build.txt" 2>&1
    step_left 20 90 replay python3 "$here/bench_replay.py" --replays 2000 --rounds 9 > "$O/replay.txt" 2>&1
    (cd "$here" && step_left 40 200 decode python3 profile_program.py "reduce-overhead LLM decode" --set compiled \
      --rounds 21 --top 30 --modes plain,floor,observe,observe-no-patches,observe-without-replay,\
observe-passthrough-replay,no-triton,checked > "$O/decode.txt" 2>&1)
    step_left 20 60 startup-profile python3 "$here/bench_overhead.py" startup --device cuda --compiled --n 40 \
      --profile 300 > "$O/startup-profile.json" 2> "$O/startup-profile.err"
    (cd "$here" && step_left 40 150 amp python3 profile_program.py "AMP" --set compiled --rounds 9 --top 30 \
      --modes plain,floor,observe,observe-no-patches,no-triton,checked > "$O/amp.txt" 2>&1)
    cat "$O/replay.txt"; head -22 "$O/decode.txt"; head -16 "$O/amp.txt" 2>/dev/null
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(k, v) for k, v in d.items() if k != 'profile']; [print(r) for r in d.get('profile', [])[:25]]" "$O/startup-profile.json" 2>&1 | head -40
    ;;
  kernels)
    site
    step build 300 python3 -c "from streamsan.torch import _native; _native.load()" > "$O/build.txt" 2>&1
    for w in "ViT-Tiny inference:vit:11" "nanoGPT:nanogpt:7" "SDPA:sdpa:11"; do
      IFS=: read -r prog key rounds <<< "$w"
      (cd "$here" && step_left 40 200 "$key" python3 profile_program.py "$prog" --set compiled --rounds "$rounds" \
        --top 0 --modes plain,floor,observe,observe-no-triton,observe-triton-bare,observe-triton-pydirect,observe-no-patches-no-triton,no-triton,checked,stages \
        > "$O/$key.txt" 2>&1)
    done
    # the same launch paths on this host's CPU, the stand-in autotuner with CPU tensors (the
    # host's speed against the project's CPU machine, where docs/performance.md has them)
    step_left 20 60 launch-cpu python3 -m pytest -q -s -p no:cacheprovider \
      "$here/bench_triton_record.py" > "$O/launch-cpu.txt" 2>&1
    # where a checked compiled program's host time goes, by function (native code included, flat:
    # no call graphs), where this machine has `perf`: ViT-Tiny inference checked, 200 rounds, so
    # that the rounds outweigh the process's start and its compilation (cached by the steps above)
    if command -v perf > /dev/null 2>&1; then
      (cd "$here" && step_left 40 120 perf-vit perf record -F 2000 -o "$O/perf-vit.data" python3 profile_program.py \
        "ViT-Tiny inference" --set compiled --rounds 200 --top 0 --modes checked > /dev/null 2>&1)
      timeout 60 perf report -i "$O/perf-vit.data" --no-children --sort dso,sym 2> /dev/null | grep "%" \
        | head -60 > "$O/perf-vit.txt"
      rm -f "$O/perf-vit.data"
    else
      echo "no perf on this machine" > "$O/perf-vit.txt"
    fi
    for key in vit nanogpt sdpa; do grep -v -i warn "$O/$key.txt" 2>/dev/null | head -40; done
    grep -E "µs|passed|failed" "$O/launch-cpu.txt" | head -12
    head -40 "$O/perf-vit.txt"
    ;;
  threads)
    site
    (lscpu; echo; lscpu -e) > "$O/lscpu.txt" 2>&1
    step build 300 python3 -c "from streamsan.torch import _native; _native.load()" > "$O/build.txt" 2>&1
    pin=${PIN_CPU:-2}
    for w in "ResNet-18 EMA:ema:15" "torchvision ResNet-18 training:resnet:11" "AMP bf16:amp:11" \
        "nanoGPT loop:nanogpt:7"; do
      IFS=: read -r prog key rounds <<< "$w"
      (cd "$here" && step_left 40 120 "$key" python3 profile_program.py "$prog" --set realcode --rounds "$rounds" \
        --top 0 --modes plain,observe,no-write,no-checker,no-site,no-allocator,at-once,checked,steady > "$O/$key.txt" 2>&1)
      (cd "$here" && step_left 40 120 "$key-pinned" python3 profile_program.py "$prog" --set realcode \
        --rounds "$rounds" --top 0 --pin "$pin" --modes plain,observe,checked,checked-apart,checked-together,steady,\
steady-apart,steady-together > "$O/$key-pinned.txt" 2>&1)
    done
    head -30 "$O/lscpu.txt"
    for f in "$O"/*.txt; do
      case "$f" in *lscpu*|*steps*|*build*) continue ;; esac
      echo "== $(basename "$f" .txt)"; grep -v -i warn "$f" | grep -E "^(program|pinned|[a-z-]+ +[0-9.]+ ms|[a-z-]+ +enter|recorder_|checker_|queue_)" | head -30
    done
    ;;
  quick)
    site
    step build 200 python3 -c "from streamsan.torch import _native; _native.load()" > "$O/build.txt" 2>&1
    (cd "$here" && STREAMSAN_REQUIRE_GPU=1 step_left 30 90 pytest python3 -m pytest -q -p no:cacheprovider \
      test_gpu_triton.py test_gpu_graphs.py > "$O/pytest.txt" 2>&1)
    step_left 30 120 compiled-verdicts python3 "$here/realcode_report.py" streamsan --backend native --set compiled \
      --only "compiled function fed,user Triton kernel output,timm ViT-Tiny inference,nanoGPT loop,triton_op,gpt-fast decode with" \
      --deadline-seconds 110 > "$O/compiled-verdicts.json" 2> "$O/compiled-verdicts.err"
    step_left 30 80 eager-verdicts python3 "$here/realcode_report.py" streamsan --backend native --set realcode \
      --only "pinned,pin_memory,graph" --deadline-seconds 70 > "$O/eager-verdicts.json" 2> "$O/eager-verdicts.err"
    (cd "$here" && step_left 30 70 vit python3 profile_program.py "ViT-Tiny inference" --set compiled --rounds 9 \
      --top 0 --modes plain,observe,observe-no-triton,observe-triton-pydirect,no-triton,checked > "$O/vit.txt" 2>&1)
    tail -4 "$O/pytest.txt"
    for f in compiled-verdicts eager-verdicts; do grep -a -E "native [0-9]+/[0-9]+ " "$O/$f.err" | cut -c1-240; done
    grep -v -i warn "$O/vit.txt" | head -30
    ;;
  multirank)
    site
    step build 300 python3 -c "from streamsan.torch import _native; _native.load()" > "$O/build.txt" 2>&1
    (cd "$here" && step multirank "$(left 590)" python3 multirank.py report --out "$O/multirank" \
      --nproc "${NPROC:-2}" --runs "${RUNS:-5}" --seconds "$(left 575)") > "$O/multirank.txt" 2>&1
    tail -40 "$O/multirank.txt"
    ;;
  sweep)
    site
    step build 200 python3 -c "from streamsan.torch import _native; _native.load()" > "$O/build.txt" 2>&1
    # every sweep at once, each a process of its own on the one GPU (the models are small; what is
    # judged is the verdicts, not the time), all cut at the part's time left (none started with
    # under 30 s left)
    l=$(left 585)
    if [ "$l" -gt 30 ]; then
      for b in ${SWEEP_BACKENDS:-native python}; do
        for w in ${SWEEP_SETS:-tv tvx timm hf misc}; do
          step "sweep-$b-$w" "$l" python3 "$here/library_sweep.py" "$b" "$w" cuda > "$O/sweep-$b-$w.txt" 2>&1 &
        done
      done
      # compiled code no one here wrote: models of each set `torch.compile`d, under the C++ recorder
      for w in ${SWEEP_COMPILED:-}; do
        step "sweep-compiled-$w" "$l" python3 "$here/library_sweep.py" native "$w" cuda compile \
          > "$O/sweep-compiled-$w.txt" 2>&1 &
      done
      wait
    else
      echo "sweep: $l s left, no sweep started" | tee -a "$O/steps.txt"
    fi
    for f in "$O"/sweep-*.txt; do
      [ -e "$f" ] || continue
      echo "== $(basename "$f" .txt): $(grep -c ' ops ' "$f") checked, $(grep -c skipped "$f") skipped"
      grep -E "FAILED|errors [1-9]|model\(s\) with reports" "$f" | head -20
    done
    ;;
  ab)
    # Timings of two wheels compare only on one machine (hosts differ by more than most changes):
    # each wheel in a folder of its own, its C++ recorder built apart, the processes alternated.
    other=${3:?ab: a second WHEELDIR}
    for x in a b; do
      d=$wheels
      [ "$x" = b ] && d=$other
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "/tmp/site-$x" "$d"/*.whl >&2
      echo "wheel $x: $d $(cat "$d/COMMIT" 2>/dev/null)" | tee -a "$O/steps.txt"
      step "build-$x" 300 env PYTHONPATH="/tmp/site-$x" STREAMSAN_TORCH_EXT_DIR="/tmp/streamsan-ext-$x" python3 -c \
        "from streamsan.torch import _native; _native.load()" > "$O/build-$x.txt" 2>&1
    done
    for i in $(seq 1 "${AB_REPEATS:-2}"); do
      order="a b"
      [ $(( i % 2 )) -eq 0 ] && order="b a"
      for x in $order; do
        [ "$(left 590)" -gt 30 ] || break 2
        if [ "${AB_BENCH:-}" = startup ]; then
          step_left 30 120 "$x-$i" env PYTHONPATH="/tmp/site-$x" STREAMSAN_TORCH_EXT_DIR="/tmp/streamsan-ext-$x" \
            python3 "$here/bench_overhead.py" startup --device cuda --compiled --between 2 --inside 5 \
            --wait-ms 0.3 --n "${AB_N:-60}" > "$O/$x-$i.json" 2> "$O/$x-$i.err"
          continue
        fi
        (cd "$here" && step_left 30 240 "$x-$i" env PYTHONPATH="/tmp/site-$x" \
          STREAMSAN_TORCH_EXT_DIR="/tmp/streamsan-ext-$x" python3 profile_program.py \
          "${AB_PROGRAM:-reduce-overhead LLM decode}" --set "${AB_SET:-compiled}" --rounds "${AB_ROUNDS:-15}" \
          --top 0 --modes "${AB_MODES:-plain,observe,checked}" > "$O/$x-$i.txt" 2>&1)
      done
    done
    for f in "$O"/[ab]-*.txt; do
      echo "== $(basename "$f" .txt)"
      grep -E "^(plain|floor|observe|no-triton|checked)" "$f"
    done
    for f in "$O"/[ab]-*.json; do
      [ -e "$f" ] || continue
      echo "== $(basename "$f" .json) $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print('enter', d.get('enter_ms'), 'exit', d.get('exit_ms'), d.get('parts_ms'))" "$f" 2>&1)"
    done
    ;;
  *)
    echo "gpu_measure.sh: unknown part '$part' (eager, compiled, all, observe, profile, kernels, threads, quick, sweep, multirank, ab)" >&2
    exit 2
    ;;
esac
if [ -n "${PACK:-}" ]; then
  mkdir -p "$(dirname "$PACK")"
  tar czf "$PACK" -C "$O" . && echo "packed $O into $PACK ($(du -h "$PACK" | cut -f1))"
fi
