#!/usr/bin/env bash
# Builds tools/cutlass_probe/build/probe: the CUTLASS sm90 convolution probe (sm_90a only, static cudart, cuDNN 9
# linked dynamically and found at run time through run_on_gpu.sh's LD_LIBRARY_PATH or the rpath below).
#
#   bash tools/cutlass_probe/build.sh            # all instantiations, JOBS parallel compiles (default: nproc)
#
# Inputs (environment):
#   CUTLASS_DIR  a CUTLASS source tree with include/ and tools/util/include/ (default: the nvidia-cutlass wheel,
#                pip-downloaded into build/deps/ on first use; its headers are cutlass_library/source/).
#   CUDNN_DIR    a directory with include/cudnn.h and lib/libcudnn.so.9 (default: the nvidia-cudnn-cu13 wheel of the
#                active python's site-packages, else pip-downloaded into build/deps/).
#   NVCC         (default: nvcc)   JOBS (default: nproc)
# Writes build/compile_times.jsonl: one line per translation unit with wall seconds and peak RSS (/usr/bin/time -v),
# from the build that last compiled it. Objects newer than their inputs are kept (FORCE=1 rebuilds everything).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="$HERE/build"
DEPS="$BUILD/deps"
NVCC="${NVCC:-nvcc}"
JOBS="${JOBS:-$(nproc)}"
CUTLASS_WHEEL_VERSION="4.2.0.0"
CUDNN_WHEEL_VERSION="9.19.1.2"
GPU_CUDNN_LIB="/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib"
mkdir -p "$BUILD/obj" "$DEPS"

if [[ -z "${CUTLASS_DIR:-}" ]]; then
  CUTLASS_DIR="$DEPS/cutlass/cutlass_library/source"
  if [[ ! -f "$CUTLASS_DIR/include/cutlass/conv/collective/collective_builder.hpp" ]]; then
    python3 -m pip download --no-deps --quiet "nvidia-cutlass==$CUTLASS_WHEEL_VERSION" -d "$DEPS"
    rm -rf "$DEPS/cutlass" && mkdir -p "$DEPS/cutlass"
    python3 -m zipfile -e "$DEPS"/nvidia_cutlass-"$CUTLASS_WHEEL_VERSION"-*.whl "$DEPS/cutlass"
    rm -f "$DEPS"/nvidia_cutlass-*.whl
  fi
fi
for f in cutlass/conv/collective/collective_builder.hpp cutlass/conv/kernel/conv_universal.hpp \
         cutlass/conv/device/conv_universal_adapter.hpp cutlass/version.h; do
  [[ -f "$CUTLASS_DIR/include/$f" ]] || { echo "CUTLASS_DIR=$CUTLASS_DIR lacks include/$f" >&2; exit 1; }
done
CUTLASS_VERSION="$(awk '/define CUTLASS_MAJOR/{a=$3} /define CUTLASS_MINOR/{b=$3} /define CUTLASS_PATCH/{c=$3} END{print a"."b"."c}' \
  "$CUTLASS_DIR/include/cutlass/version.h")"

if [[ -z "${CUDNN_DIR:-}" ]]; then
  site="$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__path__[0]))' 2>/dev/null || true)"
  if [[ -n "$site" && -f "$site/cudnn/include/cudnn.h" ]]; then
    CUDNN_DIR="$site/cudnn"
  else
    CUDNN_DIR="$DEPS/cudnn/nvidia/cudnn"
    if [[ ! -f "$CUDNN_DIR/include/cudnn.h" ]]; then
      python3 -m pip download --no-deps --quiet "nvidia-cudnn-cu13==$CUDNN_WHEEL_VERSION" -d "$DEPS"
      rm -rf "$DEPS/cudnn" && mkdir -p "$DEPS/cudnn"
      python3 -m zipfile -e "$DEPS"/nvidia_cudnn_cu13-"$CUDNN_WHEEL_VERSION"-*.whl "$DEPS/cudnn"
      rm -f "$DEPS"/nvidia_cudnn_cu13-*.whl
      # Linking needs only the headers and the 100 KB front library; the engines (~1 GB unpacked) load at run time.
      find "$CUDNN_DIR/lib" -type f ! -name libcudnn.so.9 -delete
    fi
  fi
fi
[[ -f "$CUDNN_DIR/include/cudnn.h" && -f "$CUDNN_DIR/lib/libcudnn.so.9" ]] || {
  echo "CUDNN_DIR=$CUDNN_DIR lacks include/cudnn.h or lib/libcudnn.so.9" >&2; exit 1; }

# -arch=sm_90a: SASS for sm_90a (wgmma, setmaxnreg) plus its PTX. No other architecture: the kernels are
# Hopper-only by construction.
FLAGS=(-arch=sm_90a -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG
       -I"$CUTLASS_DIR/include" -I"$CUTLASS_DIR/tools/util/include" -I"$CUDNN_DIR/include"
       "-DCUTLASS_PROBE_VERSION=\"$CUTLASS_VERSION\"")
TIME=/usr/bin/time
[[ -x $TIME ]] || TIME=""

compile() {  # compile SRC OBJ: one TU, its wall time and peak RSS appended to compile_times.jsonl
  local src="$1" obj="$2" log="$2.log"
  local start end
  start=$(date +%s.%N)
  if [[ -n $TIME ]]; then
    $TIME -v "$NVCC" "${FLAGS[@]}" -c "$src" -o "$obj" >"$log" 2>&1 || { cat "$log" >&2; return 1; }
  else
    "$NVCC" "${FLAGS[@]}" -c "$src" -o "$obj" >"$log" 2>&1 || { cat "$log" >&2; return 1; }
  fi
  end=$(date +%s.%N)
  local rss
  rss=$(awk -F: '/Maximum resident set size/{gsub(/ /,"",$2); print $2}' "$log")
  printf '{"tu":"%s","seconds":%.1f,"max_rss_mb":%s,"jobs":%s}\n' "$(basename "$src")" \
    "$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" "$(( ${rss:-0} / 1024 ))" "$JOBS" >"$obj.time.json"
}

SOURCES=("$HERE"/inst/*.cu "$HERE/probe.cu" "$HERE/instances.cpp")
START=$(date +%s)
pids=()
running=0
for src in "${SOURCES[@]}"; do
  obj="$BUILD/obj/$(basename "$src").o"
  # Up to date: the object is newer than its source, the shared headers and this script (FORCE=1 rebuilds all).
  if [[ -z "${FORCE:-}" && -f "$obj" && "$obj" -nt "$src" && "$obj" -nt "$HERE/conv_instance.cuh" && "$obj" -nt "$HERE/persistent_conv.cuh" \
        && "$obj" -nt "$HERE/../../csrc/ownconv/sm90/persistent_conv_mainloop.cuh" \
        && "$obj" -nt "$HERE/probe_api.h" && "$obj" -nt "$HERE/build.sh" ]]; then continue; fi
  compile "$src" "$obj" &
  pids+=($!)
  running=$((running + 1))
  if (( running >= JOBS )); then wait -n; running=$((running - 1)); fi
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
(( fail == 0 )) || { echo "compile failed" >&2; exit 1; }

"$NVCC" -arch=sm_90a -cudart static -o "$BUILD/probe" "$BUILD"/obj/*.o \
  -L"$CUDNN_DIR/lib" -l:libcudnn.so.9 -Xlinker -rpath="$GPU_CUDNN_LIB" -ldl -lpthread -lrt
END=$(date +%s)
cat "$BUILD"/obj/*.time.json >"$BUILD/compile_times.jsonl"
echo "built $BUILD/probe in $((END - START)) s with JOBS=$JOBS (CUTLASS $CUTLASS_VERSION, cuDNN from $CUDNN_DIR)"
cat "$BUILD/compile_times.jsonl"
ls -la "$BUILD/probe"
if command -v cuobjdump >/dev/null; then cuobjdump --list-elf "$BUILD/probe" | sort | uniq -c | head; fi
