#!/usr/bin/env bash
# Builds tools/probe_fusions*.cpp into .fe/bin/probe_fusions, the four files compiled side by side (each includes
# cudnn-frontend, the slow part), the CUDA runtime linked statically so that only libcudnn.so.9 and
# libnvrtc.so.13 are needed at run time; .fe/bin/probe_fusions.src records the sources' sha256, which the fusions
# stage of gpu_check.sh compares before reusing a carried binary.
#   CUDNN_DIR   a cuDNN 9 tree with include/ and lib/libcudnn.so.9 (pip's nvidia/cudnn)
#   NVRTC_DIR   a tree with include/nvrtc.h and lib/libnvrtc.so.13 (pip's nvidia/cu13)
#   CUDA_HOME   the toolkit for cuda_runtime.h and libcudart_static.a (default /usr/local/cuda)
# tools/build_probe_fusions.sh --hash prints the sources' sha256 and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
sources=(tools/probe_fusions.h tools/probe_fusions.cpp tools/probe_fusions_run.cpp tools/probe_fusions_specialized.cpp)
hash=$(cat "${sources[@]}" | sha256sum | cut -d' ' -f1)
if [ "${1:-}" = --hash ]; then
  echo "$hash"
  exit 0
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
flags=(-std=c++17 -O2 -DCUDNN_FRONTEND_SKIP_JSON_LIB -I.fe/include -I"$CUDNN_DIR/include" -I"$cuda/include"
  -I"$NVRTC_DIR/include")
mkdir -p .fe/bin .fe/obj
pids=()
for src in "${sources[@]:1}"; do
  g++ "${flags[@]}" -c "$src" -o ".fe/obj/$(basename "$src" .cpp).o" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
g++ .fe/obj/probe_fusions.o .fe/obj/probe_fusions_run.o .fe/obj/probe_fusions_specialized.o -o .fe/bin/probe_fusions \
  "$CUDNN_DIR/lib/libcudnn.so.9" "$NVRTC_DIR/lib/libnvrtc.so.13" -L"$cuda/lib64" -lcudart_static -lrt -ldl -lpthread \
  -static-libstdc++ -static-libgcc
echo "$hash" >.fe/bin/probe_fusions.src
