#!/usr/bin/env bash
# Runs the prebuilt CUTLASS conv probe on the H200 (no network, no build): from the repo root,
#   bash tools/cutlass_probe/run_on_gpu.sh          (carry tools/cutlass_probe/build)
# JSON lines to $OUT/cutlass_probe.jsonl when OUT is set, else stdout; a summary table to stderr (and
# $OUT/cutlass_probe_summary.txt). If the whole run dies (a kernel fault poisons the CUDA context), each kernel and
# cuDNN are rerun in their own process so the others still report (12 s each). Budget: under 2 minutes
# (the whole run is expected to take well under a minute: 11 kernels x 10 shapes x 2 dtypes x 2 batches).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/tools/cutlass_probe/build/probe"
[[ -x "$BIN" ]] || { echo "no $BIN: build it with tools/cutlass_probe/build.sh and carry tools/cutlass_probe/build" >&2; exit 1; }

# cuDNN 9 from the venv's wheel (the binary's RUNPATH names the same directory).
for d in /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib "${CUDNN_LIB:-}"; do
  [[ -n "$d" && -f "$d/libcudnn.so.9" ]] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
done
PY=python3
[[ -x /opt/torch/.venv/bin/python ]] && PY=/opt/torch/.venv/bin/python

if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  JSONL="$OUT/cutlass_probe.jsonl"
else
  JSONL="$(mktemp /tmp/cutlass_probe.XXXXXX.jsonl)"
fi
: >"$JSONL"
ARGS=(--batches 256,1024 --iters 50 --warmup 10 --check-n 2 --samples 4096)
START=$(date +%s)

timeout 75 "$BIN" "${ARGS[@]}" --out "$JSONL.part"
rc=$?
cat "$JSONL.part" >>"$JSONL" 2>/dev/null
rm -f "$JSONL.part"
if (( rc == 127 )); then
  echo "{\"kind\":\"error\",\"fatal\":true,\"what\":\"the probe did not start (libcudnn.so.9 not found? set CUDNN_LIB)\"}" | tee -a "$JSONL" >&2
elif (( rc != 0 && rc != 1 )); then
  # Died (rc 2: a CUDA error, 124: timeout, >128: signal): one process per kernel, then cuDNN alone.
  echo "{\"kind\":\"error\",\"what\":\"whole run exited $rc; rerunning one kernel per process\"}" >>"$JSONL"
  names=$("$BIN" --batches 1 --check-n 0 --no-cudnn --shapes none --out /dev/stdout 2>/dev/null |
          sed -n 's/.*"kind":"kernel","kernel":"\([^"]*\)".*/\1/p')
  for k in $names; do
    left=$((110 - ($(date +%s) - START)))
    (( left > 5 )) || { echo "{\"kind\":\"error\",\"what\":\"out of time before $k\"}" >>"$JSONL"; break; }
    timeout $(( left < 12 ? left : 12 )) "$BIN" "${ARGS[@]}" --no-cudnn --kernels "$k" --out "$JSONL.part"
    r=$?
    grep -v '"kind":"device"' "$JSONL.part" >>"$JSONL" 2>/dev/null
    (( r == 0 || r == 1 )) || echo "{\"kind\":\"error\",\"kernel\":\"$k\",\"what\":\"exited $r\"}" >>"$JSONL"
    rm -f "$JSONL.part"
  done
  left=$((115 - ($(date +%s) - START)))
  if (( left > 5 )); then
    timeout "$left" "$BIN" "${ARGS[@]}" --kernels none --out "$JSONL.part"
    grep -v '"kind":"device"' "$JSONL.part" >>"$JSONL" 2>/dev/null
    rm -f "$JSONL.part"
  fi
fi

if [[ -n "${OUT:-}" ]]; then
  "$PY" "$ROOT/tools/cutlass_probe/summarize.py" "$JSONL" | tee "$OUT/cutlass_probe_summary.txt" >&2
else
  cat "$JSONL"
  "$PY" "$ROOT/tools/cutlass_probe/summarize.py" "$JSONL" >&2
  rm -f "$JSONL"
fi
echo "cutlass_probe: $(( $(date +%s) - START )) s, probe exit $rc" >&2
