# Session measurement script (not committed): fresh recipe B, warm-start timing, fast GPU tests, cached A/B.
set -u
export OUT
D=$PWD/.data/cifar10-jpeg.tar.xz
tools/gpu_check.sh build train-B > "$OUT/stages.txt" 2>&1; tail -3 "$OUT/stages.txt"
grep "warm start" "$OUT/train_B.log"; cat "$OUT/train_B_process.txt"
mv "$OUT/B_summary.json" "$OUT/B_fresh_summary.json"; rm -f "$OUT/B_curves.png" "$OUT/B_metrics.csv" "$OUT/train_B_process.txt"
for a in "--cold-libraries" "--cold-libraries --readahead" ""; do
  # shellcheck disable=SC2086
  CUPY_CACHE_DIR=$(mktemp -d) python3 tools/warm_start_timing.py --data "$D" --decode plain --context-first $a 2>&1 | tail -1
done | tee "$OUT/warm_start_timing.txt"
PYTEST_ARGS="-n 8 --dist loadfile" PYTEST_TARGETS="tests/test_queued_epochs_gpu.py tests/test_readback_gpu.py \
 tests/test_epoch_upload_gpu.py tests/test_train_gpu.py tests/test_evaluation_gpu.py tests/test_snapshot_gpu.py \
 tests/test_step_capture_gpu.py" tools/gpu_check.sh test 2>&1 | tail -8
ab() {  # name dir: a cached recipe-B run from dir, its summary and a few epoch lines into ab.txt
  (cd "$2" && python3 -m resnet_native.train --recipe B --data "$D" --out "/tmp/ab_$1" --no-progress 2>"/tmp/ab_$1.log" | tail -1) \
    | sed "s/^/$1 /" >> "$OUT/ab.txt"
  grep -E "epoch (1|2|45|90)/" "/tmp/ab_$1.log" | sed "s/^/$1 /" >> "$OUT/ab.txt"
}
ab new "$PWD"
mkdir -p /tmp/old && tar -xf old_444c14f.tar -C /tmp/old
(cd /tmp/old && python3 -m pip install --no-build-isolation --no-deps -e . >/tmp/old_build.log 2>&1) || tail -5 /tmp/old_build.log
ab old /tmp/old
cat "$OUT/ab.txt"
