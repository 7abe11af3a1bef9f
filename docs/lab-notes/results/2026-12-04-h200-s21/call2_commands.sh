#!/usr/bin/env bash
# Throwaway (session 21, call 2): fresh recipe B first, then tests, bench, a cached recipe B and a timeline.
set -u
FINAL=${OUT:-/tmp/rn_out}; mkdir -p "$FINAL"
export PATH=/opt/torch/.venv/bin:$PATH PYTHONUNBUFFERED=1
OUT=$FINAL tools/gpu_check.sh info build 2>&1 | tail -3
OUT=/tmp/o tools/gpu_check.sh train-B 2>&1 | grep -v "^epoch" | tail -4
cp /tmp/o/B_summary.json "$FINAL/fresh_B_summary.json"; cp /tmp/o/train_B.log "$FINAL/fresh_B_train.log"
cat /tmp/o/train_B_process.txt
OUT=$FINAL PYTEST_LOG=pytest_subset.log PYTEST_ARGS="-m gpu -n 8 --dist loadfile" PYTEST_TARGETS="tests/test_kernels_gpu.py tests/test_norm_gpu.py tests/test_layers_gpu.py tests/test_models_gpu.py tests/test_optim_gpu.py tests/test_step_capture_gpu.py tests/test_sync_norm_gpu.py tests/test_multi_tensor_gpu.py" tools/gpu_check.sh test 2>&1 | tail -5
OUT=$FINAL MODEL_ARGS="--dtypes fp16 --batches 512" timeout 240 tools/gpu_check.sh models 2>&1 | tail -7
python3 -m resnet_native.train --recipe B --data .data/cifar10-jpeg.tar.xz --out /tmp/run_B2 --no-progress 2>&1 | tail -1 | cut -c1-300
cp /tmp/run_B2/summary.json "$FINAL/cached_B_summary.json"
python3 diag_trace.py /tmp/trace_new.txt 2>&1 | grep -v "^epoch" | sed -n '1,12p'; cp /tmp/trace_new.txt "$FINAL/"
