#!/usr/bin/env bash
# One device call: build for sm_90, run the GPU tests, run benchmarks; logs and JSON go to $OUT.
# Usage: tools/gpu_check.sh [STAGE ...]   stages: info build test bench models infer serve train-A train-B train-C
#   ablate-C norm optimizer profile reliability sanitize quant-A sweep fusions serve-v2 (default: info build test bench)
#   PYTEST_ARGS   extra pytest arguments (e.g. "-k conv -x", "-n 8"); PYTEST_TARGETS: files/dirs (default tests)
#   PYTEST_LOG    log name under $OUT (default pytest.log); INFER_ARGS: extra bench_infer.py arguments
#   BENCH_ARGS    extra bench_block.py arguments (e.g. "--quick"); MODEL_ARGS: extra bench_model.py arguments
#   TRAIN_ARGS    extra trainer arguments; NORM_ARGS: bench_norm.py arguments; PROFILE_ARGS: profile_step.py's
#   BASELINE_TAR  for the `baseline` stage: a `git archive` of the tree to compare with (built in /tmp/baseline);
#                 BASELINE_RUNS alternating runs of each tree (default 2); BASELINE_MODEL_ARGS / BASELINE_INFER_ARGS
#   RELEASE_ARGS  extra release arguments (quant-A, e.g. "--holdout-images 500"); ACCURACY_ARGS: quant_accuracy.py's
#   SEEDS         train-A/B/C: one run per seed (e.g. "0 1 2 3 4"), summaries in $OUT/train_<recipe>_seeds.json
#   FRESH=1       train-*, ablate-C: each run as on a fresh machine (an empty data cache and cupy kernel cache)
#   ABLATE_C      ablate-C: "name=ARGS;name=ARGS" trainer arguments on top of recipe C, one run each (SEED, default 0)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rn_out}
mkdir -p "$OUT"
[ -x /opt/torch/.venv/bin/python3 ] && export PATH=/opt/torch/.venv/bin:$PATH
export PYTHONUNBUFFERED=1 RESNET_NATIVE_CUDA_ARCHS=${RESNET_NATIVE_CUDA_ARCHS:-90}
# CUTLASS's headers for the own convolution kernels (the machine has no index): a carried .cutlass/ (docs/building.md).
[ -z "${CUTLASS_DIR:-}" ] && [ -d .cutlass/include ] && export CUTLASS_DIR=$PWD/.cutlass
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(info build test bench)
status=0

# FRESH=1: trainer arguments (and CUPY_CACHE_DIR) for a run that finds no decoded data set and no compiled cupy
# kernels, as on a new machine: the first run's cost, measured every time.
# Sets FRESH_ARGS (and exports CUPY_CACHE_DIR); without FRESH, FRESH_ARGS is empty.
fresh_setup() {
  FRESH_ARGS=""
  if [ "${FRESH:-0}" = 1 ]; then
    local dir; dir=$(mktemp -d "/tmp/fresh_$1_XXXX")
    export CUPY_CACHE_DIR="$dir/cupy"
    FRESH_ARGS="--cache-dir $dir/data"
  fi
}

# run_and_collect RECIPE NAME ARGS JSON LOG: one trainer run into /tmp/run_RECIPE_NAME; its summary, the process's
# wall time and the arguments appended to the list in JSON, the last lines of its output to LOG.
run_and_collect() {
  local recipe=$1 name=$2 args=$3 json=$4 log=$5 start rc
  fresh_setup "$recipe"
  start=$(date +%s.%N)
  echo "--- $name: $args" >>"$log"
  # shellcheck disable=SC2086
  timeout -s INT "${RUN_TIMEOUT:-300}" python3 -m resnet_native.train --recipe "$recipe" \
    --data .data/cifar10-jpeg.tar.xz --out "/tmp/run_${recipe}_$name" --no-progress --no-tensorboard $FRESH_ARGS $args \
    >"/tmp/run_${recipe}_$name.log" 2>&1
  rc=$?
  [ -n "$FRESH_ARGS" ] && rm -rf "${CUPY_CACHE_DIR%/cupy}"  # its decoded data set: one per fresh run
  tail -4 "/tmp/run_${recipe}_$name.log" | tee -a "$log"
  python3 - "$json" "$name" "$args" "/tmp/run_${recipe}_$name/summary.json" "$(date +%s.%N)" "$start" "$rc" <<'PY'
import json, os, sys
path, name, args, summary, end, start, rc = sys.argv[1:]
runs = json.load(open(path)) if os.path.exists(path) else []
s = json.load(open(summary)) if os.path.exists(summary) else None
runs.append({"name": name, "args": args, "exit": int(rc), "process_s": round(float(end) - float(start), 2),
             "fresh": os.environ.get("FRESH", "0") == "1", "summary": s})
json.dump(runs, open(path, "w"), indent=1)
PY
  return "$rc"
}

# summarize_runs JSON: one line per run (plain and TTA accuracy, wall time) and the mean and minimum over them.
summarize_runs() {
  python3 - "$1" <<'PY'
import json, statistics, sys
runs = json.load(open(sys.argv[1]))
acc = lambda s, k: None if not s or s.get(k) is None else 100 * s[k]
rows = []
for r in runs:
    s = r["summary"]
    rows.append((r["name"], acc(s, "test_acc"), acc(s, "test_acc_tta"), s and s.get("wall_time_s"), r["process_s"]))
    print(f"{r['name']:>14}  acc {rows[-1][1]}  tta {rows[-1][2]}  wall {rows[-1][3]}  process {r['process_s']}  "
          f"[{r['args']}]")
for i, what in ((1, "acc"), (2, "tta acc"), (3, "wall s")):
    values = [row[i] for row in rows if row[i] is not None]
    if values:
        print(f"{what}: mean {statistics.mean(values):.3f} min {min(values):.3f} max {max(values):.3f} "
              f"over {len(values)}")
PY
}
for stage in "${stages[@]}"; do
  echo "=== $stage $(date -u +%H:%M:%S)"
  case "$stage" in
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/info.txt"
      python3 -c "import cupy, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__)" | tee -a "$OUT/info.txt"
      python3 -m pip show nvidia-cudnn-cu13 2>/dev/null | grep -E '^(Name|Version)' | tee -a "$OUT/info.txt" ;;
    build)
      start=$(date +%s)
      # The log stays out of $OUT (at most 8 files come back); its tail is printed on failure.
      python3 -m pip install --no-build-isolation --no-deps -e . >/tmp/rn_build.log 2>&1 || { tail -50 /tmp/rn_build.log; exit 1; }
      echo "build seconds: $(( $(date +%s) - start ))" | tee -a "$OUT/info.txt"
      python3 -c "import resnet_native as rn; print('cudnn', rn.cudnn_version(), rn.CUDNN_LIBRARY, 'gpu', rn.cuda_available())" | tee -a "$OUT/info.txt" ;;
    test)
      # shellcheck disable=SC2086
      python3 -m pytest -q -rfEs --durations=15 -p no:cacheprovider ${PYTEST_ARGS:-} ${PYTEST_TARGETS:-tests} 2>&1 | tee "$OUT/${PYTEST_LOG:-pytest.log}" | tail -60
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    bench)
      # shellcheck disable=SC2086
      python3 benchmarks/bench_block.py --json "$OUT/bench_block.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_block.txt" | tail -80
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    models)
      # shellcheck disable=SC2086
      python3 benchmarks/bench_model.py --json "$OUT/bench_model.json" ${MODEL_ARGS:-} 2>&1 | tee "$OUT/bench_model.txt" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    infer)
      # shellcheck disable=SC2086
      python3 benchmarks/bench_infer.py --json "$OUT/bench_infer.json" --markdown "$OUT/bench_infer.md" ${INFER_ARGS:-} \
        2>&1 | tee "$OUT/bench_infer.txt" | tail -60
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    baseline)
      # bench_model.py and bench_infer.py on the baseline tree and this one, alternating, in this call; then the
      # per-row ratio of the medians (tools/compare_trees.py). The baseline is built in place in /tmp/baseline
      # and run with its own source first on PYTHONPATH.
      rm -rf /tmp/baseline && mkdir -p /tmp/baseline && tar -xf "$BASELINE_TAR" -C /tmp/baseline
      (cd /tmp/baseline && python3 setup.py build_ext --inplace >/tmp/rn_baseline_build.log 2>&1) \
        || { tail -30 /tmp/rn_baseline_build.log; exit 1; }
      model_args=${BASELINE_MODEL_ARGS:---models resnet18,resnet50 --batches 256,512 --dtypes fp16,bf16 --imagenet "" --no-torch}
      infer_args=${BASELINE_INFER_ARGS:---models resnet18,resnet50 --batches 1,32,256,1024 --dtypes fp16 --quant-dtypes "" --no-torch --iters 100 --warmup 10}
      for run in $(seq 1 "${BASELINE_RUNS:-2}"); do
        for tree in baseline current; do
          dir=$PWD; [ "$tree" = baseline ] && dir=/tmp/baseline
          # shellcheck disable=SC2086
          (cd "$dir" && PYTHONPATH=$dir eval python3 benchmarks/bench_model.py $model_args --json "$OUT/model_${tree}_$run.json") 2>&1 | tail -3
          # shellcheck disable=SC2086
          (cd "$dir" && PYTHONPATH=$dir eval python3 benchmarks/bench_infer.py $infer_args --json "$OUT/infer_${tree}_$run.json" --markdown /tmp/infer_${tree}_$run.md) 2>&1 | tail -3
        done
      done
      python3 tools/compare_trees.py --baseline "$OUT"/model_baseline_*.json "$OUT"/infer_baseline_*.json \
        --current "$OUT"/model_current_*.json "$OUT"/infer_current_*.json --json "$OUT/compare_trees.json" \
        | tee "$OUT/compare_trees.txt" || status=1 ;;
    norm)
      # shellcheck disable=SC2086
      python3 benchmarks/bench_norm.py --json "$OUT/bench_norm.json" ${NORM_ARGS:-} 2>&1 | tee "$OUT/bench_norm.txt" | tail -30
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    optimizer)
      python3 benchmarks/bench_optimizer.py --json "$OUT/bench_optimizer.json" 2>&1 | tee "$OUT/bench_optimizer.txt" | tail -30
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    profile)
      # shellcheck disable=SC2086
      python3 tools/profile_step.py ${PROFILE_ARGS:-} 2>&1 | tee -a "$OUT/profile.txt" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    reliability)
      # The GPU half of the reliability sweep (tools/reliability.py): leak soak, memory pressure, SIGKILLed trainer.
      # shellcheck disable=SC2086
      for what in ${RELIABILITY:-soak pressure kill}; do
        extra=""; [ "$what" = kill ] && extra="--data .data/cifar10-jpeg.tar.xz"
        python3 tools/reliability.py "$what" $extra --json "$OUT/reliability_$what.json" 2>&1 | tail -25
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    sanitize)
      # compute-sanitizer memcheck, racecheck and initcheck over the custom kernels' tests, and memcheck and
      # initcheck over a few captured training steps (one log per tool). Racecheck cannot run the step: cuDNN's own
      # convolution kernels fault under it even when left out of its instrumentation (KNOWN_ISSUES 20).
      # SANITIZER_TESTS: the tests that launch our kernels (cast, elementwise, multi-tensor, pooling, the
      # augmenter, the loss, residual requantisation, sync-BN; the uint8 input stage is in the engine tests, too
      # slow here).
      sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
      tests=${SANITIZER_TESTS:-tests/test_kernels_gpu.py tests/test_multi_tensor_gpu.py tests/test_pool_gpu.py \
        tests/test_data_gpu.py tests/test_loss_gpu.py tests/test_quantized_conv_gpu.py::test_the_residual_requantization_matches_its_reference \
        tests/test_sync_norm_gpu.py::test_two_simulated_ranks_match_the_whole_batch}
      for tool in ${SANITIZER_TOOLS:-memcheck racecheck initcheck}; do
        # shellcheck disable=SC2086
        { "$sanitizer" --tool "$tool" --error-exitcode 99 python3 -m pytest -q -p no:cacheprovider $tests \
          && { [ "$tool" = racecheck ] || "$sanitizer" --tool "$tool" --error-exitcode 99 python3 -X faulthandler \
            tools/reliability.py step --algo heuristic; }; } >"$OUT/sanitize_$tool.log" 2>&1
        rc=$?; echo "compute-sanitizer $tool: exit $rc"; tail -5 "$OUT/sanitize_$tool.log"
        [ "$rc" -eq 0 ] || status=1
      done ;;
    quant-A)
      # The 8-bit engines' accuracy: recipe A trained (or /tmp/run_A reused), released with its int8 and FP8
      # calibrations, then the test set through the float, int8 and FP8 engines.
      [ -f /tmp/run_A/best.npz ] || python3 -m resnet_native.train --recipe A --data .data/cifar10-jpeg.tar.xz \
        --out /tmp/run_A --no-progress ${TRAIN_ARGS:-} 2>&1 | tail -5
      # shellcheck disable=SC2086
      python3 -m resnet_native.release --run /tmp/run_A --version A --out /tmp/models --int8 --fp8 \
        --data .data/cifar10-jpeg.tar.xz --no-benchmark --calibrate-on gpu ${RELEASE_ARGS:-} 2>&1 | tail -5
      cp /tmp/models/version_A/metrics.json "$OUT/quant_A_metrics.json" 2>/dev/null
      python3 tools/quant_accuracy.py --release /tmp/models/version_A --data .data/cifar10-jpeg.tar.xz \
        --json "$OUT/quant_A_accuracy.json" ${ACCURACY_ARGS:-} 2>&1 | tee "$OUT/quant_A_accuracy.txt" | tail -10
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    serve)
      # Loopback load test of the HTTP server: batched, unbatched, and one engine call per image.
      for m in ${SERVE_MODELS:-resnet18 resnet50}; do
        # shellcheck disable=SC2086
        python3 benchmarks/bench_serve.py --model "$m" --out "$OUT/bench_serve_$m.json" ${SERVE_ARGS:-} \
          2>&1 | tee "$OUT/bench_serve_$m.txt" | tail -20
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    serve-v2)
      # The KServe v2 load test (benchmarks/bench_serve_v2.py) on a release of an untrained ResNet-18 (the engine's
      # speed does not depend on its weights): one JSON per SERVE_V2 entry ("name=ARGS;name=ARGS").
      # Wheels carried in .gpu/wheels (tritonclient and its HTTP client's dependencies) are installed first.
      ls .gpu/wheels/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps --no-index .gpu/wheels/*.whl
      python3 - <<'PY'
import pathlib, sys
sys.path.insert(0, "tests")
from test_release_cpu import make_fake_run
from resnet_native.release.build import release
make_fake_run(pathlib.Path("/tmp/serve_run"))
print(release("/tmp/serve_run", "bench", "/tmp/serve_models", benchmark=False))
PY
      IFS=';' read -ra runs <<<"${SERVE_V2:-w8=--workers 8}"
      for run in "${runs[@]}"; do
        name=${run%%=*}; args=${run#*=}
        # shellcheck disable=SC2086
        python3 benchmarks/bench_serve_v2.py --release /tmp/serve_models/version_bench $args \
          --out "$OUT/serve_v2_$name.json" 2>&1 | tee "/tmp/serve_v2_$name.txt" | grep -v "^[-a-z]" | tail -30
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    sweep)
      # Short trainer runs, one per entry of SWEEP ("name=ARGS;name=ARGS", each ARGS trainer arguments, e.g.
      # "e100s0=--epochs 100 --seed 0"), each within SWEEP_TIMEOUT seconds; every run's summary goes into one
      # $OUT/sweep.json (at most 8 files come back).
      IFS=';' read -ra runs <<<"${SWEEP:?set SWEEP}"
      for run in "${runs[@]}"; do
        name=${run%%=*}; args=${run#*=}
        # shellcheck disable=SC2086
        timeout -s INT "${SWEEP_TIMEOUT:-150}" python3 -m resnet_native.train --recipe "${SWEEP_RECIPE:-A}" \
          --data .data/cifar10-jpeg.tar.xz --out "/tmp/sweep_$name" --no-progress --no-tensorboard $args 2>&1 | tail -2
        python3 - "$OUT/sweep.json" "$name" "$args" "/tmp/sweep_$name/summary.json" <<'PY'
import json, os, sys
path, name, args, summary = sys.argv[1:]
runs = json.load(open(path)) if os.path.exists(path) else []
runs.append({"name": name, "args": args, "summary": json.load(open(summary)) if os.path.exists(summary) else None})
json.dump(runs, open(path, "w"), indent=1)
PY
      done ;;
    train-A|train-B|train-C)
      recipe=${stage#train-}
      if [ -z "${SEEDS:-}" ]; then
        # The run folder (checkpoints included) stays on the machine; its summary, curves and CSV come back, and the
        # whole process's wall time (interpreter start and imports included) in train_<recipe>_process.txt.
        fresh_setup "$recipe"
        start=$(date +%s.%N)
        # shellcheck disable=SC2086
        python3 -m resnet_native.train --recipe "$recipe" --data .data/cifar10-jpeg.tar.xz --out "/tmp/run_$recipe" \
          --no-progress $FRESH_ARGS ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train_$recipe.log" | tail -40
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        python3 -c "print(f'process seconds: {$(date +%s.%N) - $start:.2f}')" | tee "$OUT/train_${recipe}_process.txt"
        for f in summary.json metrics.csv curves.png; do
          [ -f "/tmp/run_$recipe/$f" ] && cp "/tmp/run_$recipe/$f" "$OUT/${recipe}_$f"
        done
      else
        # One run per seed; every summary (with the process's wall time) in one $OUT/train_<recipe>_seeds.json, the
        # logs' tails in one train_<recipe>_seeds.log (at most 8 files come back).
        for seed in $SEEDS; do
          name="s$seed"
          # shellcheck disable=SC2086
          run_and_collect "$recipe" "$name" "--seed $seed ${TRAIN_ARGS:-}" "$OUT/train_${recipe}_seeds.json" \
            "$OUT/train_${recipe}_seeds.log" || status=1
        done
        summarize_runs "$OUT/train_${recipe}_seeds.json"
      fi ;;
    ablate-C)
      # Recipe C with each entry of ABLATE_C ("name=ARGS;name=ARGS", trainer arguments on top of the recipe) for one
      # seed (SEED, default 0); every run's summary (plain and TTA accuracy, the wall-time split) goes into one
      # $OUT/ablate_C.json, the logs' tails into ablate_C.log.
      IFS=';' read -ra runs <<<"${ABLATE_C:?set ABLATE_C}"
      for run in "${runs[@]}"; do
        name=${run%%=*}; args=${run#*=}
        run_and_collect C "$name" "--seed ${SEED:-0} $args" "$OUT/ablate_C.json" "$OUT/ablate_C.log" || status=1
      done
      summarize_runs "$OUT/ablate_C.json" ;;
    fusions)
      # tools/probe_fusions*.cpp: the graph-API fusions of the MLPerf ResNet pattern, per layer, against the plain
      # convolution. It needs cudnn-frontend's headers, carried in .fe/include (git-ignored; on a machine with
      # PyPI: pip download --no-deps nvidia-cudnn-frontend, then unzip the wheel's include/ into .fe/). A binary
      # built elsewhere may be carried as .fe/bin/probe_fusions with .fe/bin/probe_fusions.src, the sha256 of the
      # sources it was built from (tools/build_probe_fusions.sh writes both); else, or if the sources differ, it is
      # built here (about a minute).
      # PROBE: "MODEL:BATCH:DTYPE[:PATTERNS[:DEADLINE_S]]" entries separated by spaces (empty PATTERNS: the default
      # list). FUSIONS_ENUM=all: every heuristics mode and every engine cuDNN offers per graph (the probe's header
      # lists FUSIONS_MAX_PLANS, FUSIONS_MAX_RTC, FUSIONS_GRAPH_S); DEADLINE_S bounds one probe's run.
      site=$(python3 -c "import nvidia.cudnn, os; print(os.path.dirname(list(nvidia.cudnn.__path__)[0]))")
      nvrtc_lib=$(find "$site" -name 'libnvrtc.so.13*' | head -1)
      [ -n "$nvrtc_lib" ] || nvrtc_lib=$(find "$site" -name 'libnvrtc.so.*' | head -1)
      export CUDNN_DIR="$site/cudnn" NVRTC_DIR=$(dirname "$(dirname "$nvrtc_lib")")
      export LD_LIBRARY_PATH="$CUDNN_DIR/lib:$NVRTC_DIR/lib:${LD_LIBRARY_PATH:-}"
      bin=.fe/bin/probe_fusions
      # (The binary exits 2 after its usage line: `|| true` keeps pipefail from failing the test.)
      if ! { "$bin" 2>&1 || true; } | grep -q usage \
        || [ "$(cat "$bin.src" 2>/dev/null)" != "$(tools/build_probe_fusions.sh --hash)" ]; then
        tools/build_probe_fusions.sh || { status=1; continue; }
      fi
      # The enumeration's per-plan lines (megabytes) go to fusions_plans.jsonl, gzipped at the end.
      rm -f "$OUT/fusions_plans.jsonl" "$OUT/fusions_plans.jsonl.gz"
      export FUSIONS_PLANS="$OUT/fusions_plans.jsonl"
      for cfg in ${PROBE:-resnet50:512:fp16}; do
        IFS=: read -r model batch dtype patterns deadline <<<"$cfg"
        timeout "${PROBE_TIMEOUT:-300}" "$bin" "$model" "$batch" "$dtype" "$patterns" "$deadline" \
          >>"$OUT/fusions.jsonl" 2>>"$OUT/fusions.err" || { echo "probe $cfg: exit $?"; status=1; }
      done
      plans=()
      if [ -s "$FUSIONS_PLANS" ]; then
        gzip -f "$FUSIONS_PLANS"
        plans=(--plans "$FUSIONS_PLANS.gz")
      else
        rm -f "$FUSIONS_PLANS"
      fi
      python3 tools/fusion_report.py "$OUT/fusions.jsonl" ${plans[@]+"${plans[@]}"} | tee "$OUT/fusions.txt" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
exit $status
