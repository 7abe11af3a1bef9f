#!/usr/bin/env bash
# Throwaway (session 21, call 3): memset nodes as kernels, A/B in one process; bench vs PyTorch; old HEAD's bench.
set -u
FINAL=${OUT:-/tmp/rn_out}; mkdir -p "$FINAL"
export PATH=/opt/torch/.venv/bin:$PATH PYTHONUNBUFFERED=1 RESNET_NATIVE_CUDA_ARCHS=90
OUT=$FINAL tools/gpu_check.sh info build 2>&1 | tail -2
OUT=$FINAL PYTEST_LOG=pytest_call3.log PYTEST_ARGS="-m gpu -n 8 --dist loadfile" PYTEST_TARGETS="tests/test_captured_graph_gpu.py tests/test_kernels_gpu.py tests/test_step_capture_gpu.py tests/test_evaluation_gpu.py tests/test_inference_gpu.py tests/test_conv_capture_gpu.py tests/test_graph_conv_cache_gpu.py tests/test_queued_epochs_gpu.py" tools/gpu_check.sh test 2>&1 | tail -4
python3 ab_memset.py 2>&1 | tee "$FINAL/ab_memset.json" | head -30
OUT=$FINAL MODEL_ARGS="--dtypes fp16 --batches 512" timeout 240 tools/gpu_check.sh models 2>&1 | tail -6
python3 diag_trace.py /tmp/trace_memset.txt 2>&1 | grep -v "^epoch" | sed -n '10,22p'; cp /tmp/trace_memset.txt "$FINAL/"
mkdir -p /tmp/old && tar -xf old_406f255.tar -C /tmp/old
(cd /tmp/old && python3 -m pip install --no-build-isolation --no-deps -e . >/tmp/old_build.log 2>&1) || tail -5 /tmp/old_build.log
(cd /tmp/old && python3 benchmarks/bench_model.py --dtypes fp16 --batches 512 --imagenet "" --no-torch \
  --json "$FINAL/bench_model_old.json" 2>&1 | tail -4)
