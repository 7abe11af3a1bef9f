#!/usr/bin/env bash
set -u
OUT=${OUT:-/tmp/rn_out}; mkdir -p "$OUT"
export PATH=/opt/torch/.venv/bin:$PATH PYTHONUNBUFFERED=1
tools/gpu_check.sh info build 2>&1 | tail -4
python3 -c "from resnet_native.data.cifar10 import load_cifar10; load_cifar10('.data/cifar10-jpeg.tar.xz')"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 500 > "$OUT/clocks.csv" &
smi=$!
python3 diag_variants.py "$OUT/variants.json" 2>&1 | tail -20
python3 diag_trace.py /tmp/trace_base.txt 2>&1 | grep -v "^epoch" | tail -40; cp /tmp/trace_base.txt "$OUT/"
python3 diag_trace.py /tmp/trace_noaa.txt --recipe /tmp/B_noaa.yaml 2>&1 | grep -v "^epoch" | tail -12; cp /tmp/trace_noaa.txt "$OUT/"
kill $smi
MODEL_ARGS="--dtypes fp16 --batches 512" timeout 240 tools/gpu_check.sh models 2>&1 | tail -8
