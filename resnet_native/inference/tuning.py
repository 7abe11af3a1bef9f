"""Fused or unfused, per convolution and batch size: both timed once, the faster kept, and the choice kept in the
algorithm cache so that a process that loads the cache file does not time again.

Fusion is not always faster: cudnnConvolutionBiasActivationForward may narrow the algorithms cuDNN can use, so
the best plain convolution plus separate bias / residual / ReLU calls can win. The two contenders are
  fused    conv2d(..., bias, z, activation) on the engine's spec (for engine='auto', whichever engine won the
           fused call's own search);
  unfused  the legacy engine's separate calls (the convolution with its cached algorithm, then cudnnAddTensor for
           bias and residual, then cudnnActivationForward), which is what the C++ dispatcher runs for a fused key
           whose cached fused_path starts with "unfused".
When unfused wins, the legacy choice is written into the engine's fused key with fused_path UNFUSED_FASTER, and
from then on every call of that key (a captured graph's included) takes the separate calls without asking cuDNN.

A fused key whose entry already has a fused_path was decided before (in this process, or in a loaded cache file):
it is only run. Its fused_path is '' only while no fused call has completed (a call that fell back for lack of
workspace memory records nothing), and then the timing waits for a later warm-up.

Timing is device time: each sample is queued behind a 1 ms spin kernel, so the host has issued the whole call
before the GPU reaches it and the events measure the GPU alone (a replayed graph pays no host time either).
"""

from __future__ import annotations

import dataclasses

from .._core.runtime import CudnnError
from ..ops import algo_cache, conv
from ..ops.timing import device_time_ms

UNFUSED_FASTER = "unfused: the separate calls timed faster than the fused call"
TIMED_SAMPLES = 5

def device_ms(fn, samples: int = TIMED_SAMPLES) -> float:
    """The median device time in ms of one call of fn (work on cupy's current stream), after an untimed call.
    Synchronises: never call it during capture."""
    import cupy

    return device_time_ms(fn, cupy.cuda.get_current_stream(), runs=samples, warmup=1)


def decide_fusion(call, spec, *, tune: bool = True) -> dict:
    """Run `call` (a runner.ConvCall) once on `spec` (searching on a cache miss) and, with tune and nothing
    decided yet, time it fused and unfused and keep the faster. Returns the key's cache entry afterwards."""
    decided = call.cached(spec)
    call(spec)
    if decided is not None and decided["fused_path"]:
        return decided
    entry = call.cached(spec)
    if not tune or entry is None or entry["fused_path"] != "fused":
        return entry  # cuDNN refused the fused call (it runs unfused anyway), or nothing completed yet
    legacy = dataclasses.replace(spec, engine="legacy")
    fused_ms = device_ms(lambda: call(spec))
    try:
        with conv.fusion_disabled():
            unfused_ms = device_ms(lambda: call(legacy))
    except (CudnnError, ValueError):
        return entry  # the legacy engine cannot run this problem: fused it stays
    if unfused_ms >= fused_ms:
        return entry
    separate = call.cached(legacy)
    if separate is None:
        return entry
    choice = {k: separate[k] for k in ("engine", "mode", "algo", "math_type", "knobs", "workspace")}
    algo_cache.insert_choice(entry["key"], dict(choice, fused_path=UNFUSED_FASTER, time_ms=float(unfused_ms)))
    call(spec)  # leaves the output as the chosen path computes it
    return call.cached(spec)
