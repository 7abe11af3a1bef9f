"""A plan bound to device memory: the buffers, operands, input stage and one Forward per batch size that an engine
captures and replays.

An engine holds one Binding per distinct choice of where its 8-bit part begins: a quantised engine with
quantize_from='auto' may serve its small batch sizes from one plan (the float plan, FLOAT, where no 8-bit part is
faster) and its large ones from another. The Binder makes them from what every candidate shares, made once per
engine: the model's state, the 8-bit operands of every convolution and the folded float weights.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._core.names import ARRAY_DTYPES, DTYPE_ALIASES, VALUE_DTYPES
from ..data.augment import normalization_lut
from ..ops import conv, kernels
from ..quantization.prefix import FLOAT
from .buffers import plan_buffers
from .fold import conv_step_params
from .input_stage import InputStage, QuantizedInputStage
from .quantized import (
    boundary_quantize,
    input_table,
    quantized_plan,
    residual_scratch_elements,
)
from .runner import bind_forward
from .simulate import quantized_steps


@dataclasses.dataclass
class Binding:
    """One plan with its device memory, for the batch sizes of `forwards` (their calls hold the 8-bit operands)."""

    plan: object
    buffers: object  # buffers.BufferAssignment
    arena: list  # one uint8 device buffer per assigned buffer, sized for the largest batch size
    input: object  # InputStage or QuantizedInputStage
    specs: dict  # conv step name -> ConvSpec
    forwards: dict  # batch size -> runner.Forward
    layout: str
    views: object = None  # tta.ViewAverage, made once the binding is kept (tta other than 'none')

    def view(self, value: int, batch: int):
        """Value `value` for a batch of `batch`: the leading bytes of its buffer, in its dtype and the layout."""
        v = self.plan.values[value]
        c, h, w = v.shape
        shape = (batch, h, w, c) if self.layout == "NHWC" else (batch, c, h, w)
        flat = self.arena[self.buffers.buffer_of[value]][: batch * v.bytes_per_sample]
        return flat.view(VALUE_DTYPES[v.dtype]).reshape(shape)


class Binder:
    """Makes Bindings of one model: `base` the plan an engine computes in (a quantised engine's: the calibration's
    fp32 plan), `float_plan` the FLOAT candidate's (quantised engines), `all_quantized` every step's 8-bit operands
    (quantized.quantized_convs), `calibration` and `precision` the 8-bit ones. conv_engine / deterministic: the
    ConvSpec fields. Folded float weights are made once per (step, precision) and shared by the Bindings."""

    def __init__(self, state: dict, base, *, precision: str, layout: str, conv_engine: str, deterministic: bool,
                 quantized: bool, float_plan=None, all_quantized=None, calibration=None):
        self.state, self.base, self.float_plan = state, base, float_plan
        self.precision, self.layout, self.is_quantized = precision, layout, quantized
        self.conv_engine, self.deterministic = conv_engine, deterministic
        self.all_quantized, self.calibration = all_quantized or {}, calibration
        self._float_weights = {}  # (step name, precision) -> device (weight, bias)

    def bind(self, quantize_from, batch_sizes) -> Binding:
        """The Binding of `quantize_from` (a quantize_from value or FLOAT; ignored by float engines) for
        `batch_sizes`, its largest Forward's input filled with a warm-up stand-in."""
        import cupy

        largest = max(batch_sizes)
        quantized = {}
        if not self.is_quantized:
            quantize_from, plan = None, self.base
        elif quantize_from == FLOAT:
            plan = self.float_plan
        else:
            plan = quantized_plan(self.base, self.precision, quantize_from)
            suffix = {s.name for s in quantized_steps(self.base, quantize_from)}
            quantized = {k: q for k, q in self.all_quantized.items() if k in suffix}
            quantize = next((s for s in plan.steps if s.kind == "quantize"), None)
            if quantize is not None:  # the float prefix's end (quantized.py: residual_requantize over zeros)
                quantized[quantize.name] = boundary_quantize(self.base, self.calibration, self.precision,
                                                             quantize_from, largest, cupy.zeros)
        buffers = plan_buffers(plan)
        weights = {s.name: self.float_weight(s) for s in plan.conv_steps() if s.name not in quantized}
        arena = [cupy.zeros(size * largest, dtype=np.uint8) for size in buffers.sizes]
        _, height, width = plan.values[plan.input].shape
        if quantize_from == "stem":  # the table of the simulation's fp32 normalised inputs
            table = input_table(self.calibration, self.precision, normalization_lut("fp32"))
            stage = QuantizedInputStage(self.precision, (height, width), cupy.asarray(table))
        else:  # the float engine's, in the dtype of the plan's input (a quantised engine's fp16 prefix)
            dtype = plan.values[plan.input].dtype
            stage = InputStage(dtype, self.layout, (height, width), cupy.asarray(normalization_lut(dtype)))
        specs = {s.name: self._spec(s, s.name in quantized) for s in plan.conv_steps()}
        binding = Binding(plan, buffers, arena, stage, specs, {}, self.layout)
        # The residual steps' fp16 scratch (quantised suffixes: quantized.py), shared: each is read at once.
        scratch = cupy.empty(residual_scratch_elements(self.base, quantize_from) * largest if quantized else 0,
                             np.float16)
        binding.forwards = {b: bind_forward(plan, b, binding.view, weights, specs, self.layout, quantized, scratch)
                            for b in batch_sizes}
        # Warm-up input like normalised images (host-generated: cupy.random would create its global generator,
        # and with it lasting memory, in the engine's pool).
        first = binding.forwards[largest].input
        noise = np.random.default_rng(0).standard_normal(first.shape, dtype=np.float32)
        if isinstance(stage, QuantizedInputStage):
            first[...] = cupy.asarray(stage.codes_of(noise))
        else:
            kernels.cast(cupy.asarray(noise), first)
        return binding

    def float_weight(self, step) -> tuple:
        """A float convolution's folded (weight, bias) on the device in its precision, made once per Binder."""
        key = (step.name, step.precision)
        if key not in self._float_weights:
            self._float_weights[key] = tuple(_to_device(a, DTYPE_ALIASES[step.precision])
                                             for a in conv_step_params(step, self.state, self.layout))
        return self._float_weights[key]

    def _spec(self, step, quantized: bool):
        """A convolution step's ConvSpec: a quantised one's on the graph engine (the only one with 8-bit kernels)."""
        return conv.ConvSpec(stride=step.stride, padding=step.padding, layout=self.layout,
                             precision=self.precision if quantized else step.precision, algo="find",
                             engine="graph" if quantized else self.conv_engine, deterministic=self.deterministic)


def _to_device(array: np.ndarray, dtype: str):
    """A float64 host array on the device in storage dtype `dtype`: rounded to float32 on the host, then (fp16,
    bf16) to the dtype by kernels.cast, the rounding every low-precision copy in the package gets."""
    import cupy

    a32 = cupy.asarray(np.ascontiguousarray(array, dtype=np.float32))
    if dtype == "fp32":
        return a32
    return kernels.cast(a32, cupy.empty(a32.shape, dtype=ARRAY_DTYPES[dtype]))


__all__ = ["Binder", "Binding"]
