"""Which kernel runs each int8 convolution of a quantised engine, per batch size: cuDNN's 8-bit convolution (with,
for a block's last convolution, the residual pass after it) or one of the package's own (ops.own_conv: the
residual add and the requantisation in the convolution's epilogue, one kernel).

InferenceEngine(quantized_kernels=...):
  'auto'   every candidate timed once per problem on the engine's own arrays, the fastest kept; the choice and the
           times go into the algorithm cache file (choice_cache.kernel_key), so the next engine only runs it.
           Where an own kernel can run the layer, cuDNN's candidate takes cuDNN's heuristic plan rather than
           timing every cuDNN engine: the full search of 8-bit graphs is what makes an 8-bit build slow.
  'own'    the own kernel own_conv.select prefers, wherever one can run the layer; cuDNN elsewhere.
  'cudnn'  cuDNN everywhere, each convolution's plan found by timing (ConvSpec algo 'find').
Own kernels run int8 in and out only: FP8 engines, and the convolutions whose output is a float value, run cuDNN.
"""

from __future__ import annotations

import collections
import dataclasses

from .choice_cache import kernel_key
from .runner import CUDNN_KERNEL
from .tuning import device_ms

QUANTIZED_KERNELS = ("auto", "cudnn", "own")


class KernelChooser:
    """Chooses, per (step, batch size), the kernel of the engine's QuantizedCalls and remembers why.

    `stored`: the cache file's kernel choices ({key: {"kernel", "times_ms"}}: choice_cache.load_choices);
    `timer(call) -> ms` times one call (tuning.device_ms: device time, median of a few). After the build,
    `timed` holds the choices made by timing here ({key: (kernel, times)}), for choice_cache.store_choices."""

    def __init__(self, mode: str, stored: dict | None = None, *, deterministic: bool = False, timer=None):
        self.mode = mode
        self.deterministic = deterministic
        self.stored = stored or {}
        self.timer = timer or (lambda call: device_ms(call))
        self.timed = {}  # key -> (kernel, {candidate: ms}), this build's timings
        self.kernels = {}  # (step name, batch) -> the kernel its call runs
        self.times = {}  # (step name, batch) -> {candidate: ms}, timed or stored ('auto' only)
        self.sources = {}  # (step name, batch) -> 'timed' / 'cache' ('auto' only)

    def decide(self, name: str, batch: int, call) -> str:
        """Set `call`'s kernel (a runner.QuantizedCall of step `name` at `batch`) and run it once; returns it."""
        own = call.own_kernels() if self.mode != "cudnn" else ()
        if own and self.mode == "own":
            call.kernel = own[0]
        elif own:
            call.spec = dataclasses.replace(call.spec, algo="heuristic")
            self._choose(name, batch, call, (CUDNN_KERNEL, *own))
        else:
            call.kernel = CUDNN_KERNEL
        call()
        self.kernels[(name, batch)] = call.kernel
        return call.kernel

    def _choose(self, name: str, batch: int, call, candidates: tuple) -> None:
        key = kernel_key(call.x.shape, call.q.weight.shape, pad=call.spec.padding, stride=call.spec.stride,
                         residual=call.z is not None, relu=call.relu, out=str(call.out.dtype),
                         cudnn_algo=call.spec.algo, deterministic=self.deterministic, candidates=candidates)
        record = self.stored.get(key)
        if record is not None:
            kernel, times, source = record["kernel"], dict(record["times_ms"]), "cache"
        elif key in self.timed:  # another quantize_from candidate's build timed this problem already
            (kernel, times), source = self.timed[key], "timed"
        else:
            times = {}
            for candidate in candidates:
                call.kernel = candidate
                times[candidate] = float(self.timer(call))
            kernel, source = min(times, key=times.get), "timed"
            self.timed[key] = (kernel, times)
        call.kernel = kernel
        self.times[(name, batch)], self.sources[(name, batch)] = times, source

    def forget_steps(self) -> None:
        """Drop the per-step records (not the timings): quantize_from='auto' binds the candidates, then the winner."""
        self.kernels, self.times, self.sources = {}, {}, {}

    def summary(self) -> dict:
        """{kernel: how many (step, batch) pairs run it}."""
        return dict(sorted(collections.Counter(self.kernels.values()).items()))


__all__ = ["QUANTIZED_KERNELS", "KernelChooser"]
