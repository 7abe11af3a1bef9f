"""Fake-quant forward of an inference plan on the host: the accuracy effect of a calibration, measured in float64.

The plan (plan.py, built in fp32 so every value is a float64 host array) runs through runner.py's bind_forward,
the binding the engine uses, whose ops hand NumPy arrays to the float64 references; this module only says what
each value and weight holds, as the 8-bit engine (quantized.py) will store it. The int8 arithmetic is exact here:
int8 x int8 products summed in float64 are exact integers (below 2**53), so conv(fake-quant x, fake-quant w) is
acc * s_x * s_w[k] up to one rounding, as quantization.int8.requantize_float defines it. One Calibration serves
every quantize_from (quantization/prefix.py). Slow (NumPy convolutions): for small batches; device='gpu' runs the
same forward in strict fp32 on the GPU (what choosing a release's calibration needs), device='host-fp32' is that
arithmetic on the host, so the GPU path's code is tested without a GPU.
"""

from __future__ import annotations

import numpy as np

from .._core.names import choice, whole_number
from .._core.placement import array_module, host_copy
from ..ops import conv
from ..quantization.calibration import METHODS, QUANT_DTYPES, make_observer
from ..quantization.calibration_file import Calibration
from ..quantization.fp8 import fake_quantize_fp8, fp8_scale, round_e4m3_values
from ..quantization.int8 import INT8_MAX, fake_quantize_int8, int8_scale
from ..quantization.prefix import first_quantized_step
from .fold import conv_step_params
from .plan import build_plan
from .runner import bind_forward

INPUT_NAME = "input"
DEVICES = ("host", "host-fp32", "gpu")


def value_names(plan) -> tuple:
    """The plan's value names in value order: 'input', then each value named after the step that produces it."""
    names = {plan.input: INPUT_NAME, **{s.out: s.name for s in plan.steps}}
    return tuple(names[v] for v in range(len(plan.values)))


def quantized_steps(plan, quantize_from: str = "stem") -> list:
    """The convolutions that run quantised: from the first of `quantize_from` on (quantization/prefix.py), all but the
    classifier (the one without a BatchNorm)."""
    start = first_quantized_step(plan, quantize_from)
    return [s for s in plan.steps[start:] if s.kind == "conv" and s.bn is not None]


def quantized_values(plan, quantize_from: str = "stem") -> list:
    """The values the quantised convolutions read (x and z), in value order."""
    return sorted({v for s in quantized_steps(plan, quantize_from) for v in s.inputs})


def fake_quantize(x, scale, dtype: str, axis=None) -> np.ndarray:
    """x quantised to `dtype` ('int8' or 'fp8') at `scale` and back, float64."""
    choice("dtype", dtype, QUANT_DTYPES)
    return (fake_quantize_int8 if dtype == "int8" else fake_quantize_fp8)(x, scale, axis)


def fake_quantize_in_place(a, scale: float, dtype: str) -> None:
    """a (a host or device float array) replaced by its values quantised to `dtype` at the per-tensor `scale` and
    back, in a's own dtype: the same rounding as fake_quantize (round half to even, saturating), written with the
    ufuncs NumPy and cupy share."""
    xp = array_module(a)
    v = a / a.dtype.type(scale)
    q = xp.clip(xp.rint(v), -INT8_MAX, INT8_MAX) if dtype == "int8" else round_e4m3_values(v, xp)
    a[...] = q * a.dtype.type(scale)


def weight_scales(plan, state: dict, dtype: str) -> dict:
    """{step name: (K,) per-output-channel scales of the folded weight} for every quantised convolution."""
    return _weight_scales(plan, _float_weights(plan, state), dtype)


def _weight_scales(plan, weights: dict, dtype: str) -> dict:
    """weight_scales from the folded weights ({step name: (weight, bias)}) already at hand."""
    choice("dtype", dtype, QUANT_DTYPES)
    scale = int8_scale if dtype == "int8" else fp8_scale
    return {s.name: scale(weights[s.name][0], axis=0) for s in quantized_steps(plan)}


def _images(images) -> np.ndarray:
    x = np.asarray(images, np.float64)
    if x.ndim != 4 or x.shape[1] != 3 or x.shape[0] == 0:
        raise ValueError(f"images: expected a non-empty (N, 3, H, W) batch of normalised images, got shape {x.shape}")
    return x


def _plan(state: dict, stem: str, images: np.ndarray):
    return build_plan(state, stem, "fp32", image_size=images.shape[2:])


def _run(plan, images: np.ndarray, weights: dict, on_value, batch_size: int, device: str = "host") -> np.ndarray:
    """Logits (float64, host) of the plan over `images` in batches on `device`; on_value(v, array) may change each
    value in place once it is produced (the input first); array is a device array on the GPU."""
    choice("device", device, DEVICES)
    if device == "host":
        xp, dtype = np, np.float64
    elif device == "host-fp32":
        xp, dtype = np, np.float32
    else:
        import cupy as xp

        dtype = np.float32
    specs = {s.name: conv.ConvSpec(stride=s.stride, padding=s.padding, layout="NCHW", precision="fp32")
             for s in plan.conv_steps()}
    if device != "host":
        weights = {k: (xp.asarray(w, dtype), xp.asarray(b, dtype)) for k, (w, b) in weights.items()}
    logits, batch_size = [], whole_number("batch_size", batch_size, 1)
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size]
        arrays = {v: xp.empty((len(chunk), *value.shape), dtype) for v, value in enumerate(plan.values)}
        forward = bind_forward(plan, len(chunk), lambda v, _n, arrays=arrays: arrays[v], weights, specs, "NCHW")
        forward.input[...] = xp.asarray(chunk, dtype)
        on_value(plan.input, arrays[plan.input])
        for step, call in zip(plan.steps, forward.calls, strict=True):
            call()
            on_value(step.out, arrays[step.out])
        logits.append(np.asarray(host_copy(forward.logits), np.float64))
    return np.concatenate(logits)


def _float_weights(plan, state: dict) -> dict:
    return {s.name: conv_step_params(s, state, "NCHW") for s in plan.conv_steps()}


def float_logits(state: dict, images, *, stem: str = "cifar", batch_size: int = 16, device: str = "host") -> np.ndarray:
    """(N, classes) logits of the float forward (BatchNorm folded), the baseline of simulate_logits."""
    images = _images(images)
    plan = _plan(state, stem, images)
    return _run(plan, images, _float_weights(plan, state), lambda v, a: None, batch_size, device)


def calibrate(state: dict, images, method: str = "entropy", *, dtype: str = "int8", stem: str = "cifar",
              percentile: float = 99.99, batch_size: int = 16, device: str = "host") -> Calibration:
    """A Calibration of the network `state` from a float forward over `images`: one observer per quantised value
    (quantization/calibration.py's `method`), weight scales from the folded weights' max |w| per output channel."""
    return calibrate_many(state, images, (method,), (dtype,), stem=stem, percentile=percentile,
                          batch_size=batch_size, device=device)[method, dtype]


def calibrate_many(state: dict, images, methods, dtypes, *, stem: str = "cifar", percentile: float = 99.99,
                   batch_size: int = 16, device: str = "host") -> dict:
    """{(method, dtype): Calibration} for every pair, from one float forward over `images`: the activations do not
    depend on the method or the dtype, so every method's observers watch the same pass (what choosing among
    methods and dtypes costs is then one calibration forward, not one per pair)."""
    methods, dtypes = tuple(methods), tuple(dtypes)
    for m in methods:
        choice("method", m, METHODS)
    for d in dtypes:
        choice("dtype", d, QUANT_DTYPES)
    images = _images(images)
    plan = _plan(state, stem, images)
    values = quantized_values(plan)
    watched = set(values)
    observers = {m: {v: make_observer(m, percentile=percentile) for v in values} for m in methods}

    def observe(v, array):
        if v in watched:
            host = array if isinstance(array, np.ndarray) else array.get()
            for per_value in observers.values():
                per_value[v].observe(host)

    weights = _float_weights(plan, state)  # folded once: the forward and the weight scales both read them
    _run(plan, images, weights, observe, batch_size, device)
    names = value_names(plan)
    out = {}
    for d in dtypes:
        w_scales = {k: tuple(float(s) for s in v) for k, v in _weight_scales(plan, weights, d).items()}
        for m in methods:
            out[m, d] = Calibration(d, m, float(percentile) if m == "percentile" else None, names,
                                    {names[v]: o.scale(d) for v, o in observers[m].items()}, w_scales)
    return out


def activation_scales(plan, calibration: Calibration, quantize_from: str = "stem") -> dict:
    """{value index: scale} of every value the quantised convolutions read (those of `quantize_from`'s suffix),
    from `calibration`; ValueError when it was made for another network (its value names differ) or lacks a
    scale."""
    if not isinstance(calibration, Calibration):
        raise TypeError(f"calibration: expected a Calibration, got {type(calibration).__name__}")
    names = value_names(plan)
    if tuple(calibration.values) != names:
        raise ValueError("calibration: its value names do not match this network's plan (calibrated for another "
                         "network or image size)")
    scales = {}
    for v in quantized_values(plan, quantize_from):
        if names[v] not in calibration.activation_scales:
            raise ValueError(f"calibration: no activation scale for value {names[v]!r}")
        scales[v] = float(calibration.activation_scales[names[v]])
    return scales


def check_calibration_fits(calibration: Calibration, state: dict, stem: str, where="calibration") -> Calibration:
    """`calibration` if it has a scale for every layer (one per output channel) and value of the network `state` (a
    32x32 plan, quantised from the stem, which covers every quantize_from) and none for a layer it does not have;
    else a ValueError naming `where` (the file) and the layer. Every scale is finite and > 0 already
    (calibration_from_json)."""
    plan = build_plan(state, stem, "fp32", image_size=(32, 32))
    names = value_names(plan)
    if tuple(calibration.values) != names:
        extra = [v for v in calibration.values if v not in names]
        missing = [v for v in names if v not in calibration.values]
        raise ValueError(f"{where}: field 'values': not this network's values (unknown {extra[:5]}, missing "
                         f"{missing[:5]}): calibrated for another network")
    steps = quantized_steps(plan)
    layers = {s.name for s in steps}
    for name in calibration.weight_scales:
        if name not in layers:
            raise ValueError(f"{where}: field 'weight_scales': layer {name!r} is not a quantised convolution of this "
                             "network")
    for step in steps:
        if step.name not in calibration.weight_scales:
            raise ValueError(f"{where}: field 'weight_scales': no scales for layer {step.name!r}")
        k, n = plan.values[step.out].shape[0], len(calibration.weight_scales[step.name])
        if n != k:
            raise ValueError(f"{where}: field 'weight_scales.{step.name}': expected {k} scales (one per output "
                             f"channel), got {n}")
    for v in quantized_values(plan):
        if names[v] not in calibration.activation_scales:
            raise ValueError(f"{where}: field 'activation_scales': no scale for value {names[v]!r}")
    return calibration


def step_weight_scales(calibration: Calibration, step, k: int) -> np.ndarray:
    """The (k,) per-output-channel weight scales of quantised convolution `step`; ValueError for another count."""
    s_w = np.asarray(calibration.weight_scales.get(step.name, ()), np.float64)
    if s_w.shape != (k,):
        raise ValueError(f"calibration: weight_scales[{step.name!r}]: expected {k} scales (one per output channel), "
                         f"got {s_w.size}")
    return s_w


def simulate_logits(state: dict, images, calibration: Calibration, *, stem: str = "cifar",
                    batch_size: int = 16, device: str = "host", quantize_from: str = "stem") -> np.ndarray:
    """(N, classes) logits of the fake-quant forward: weights and activations quantised as `calibration` says,
    from `quantize_from` on (before it, the float forward: quantization/prefix.py).

    Every quantised convolution (all but the classifier, which stays fp32) reads its folded weight quantised per
    output channel (int8: max|w_k| / 127, FP8: max|w_k| / 448) and its x and z quantised per tensor. Each value is
    quantised once, when it is produced, as the engine stores it, so a value read by two convolutions (a block's
    input, read by conv1 and the downsample) has one scale. The bias stays float, as the fp32 bias of the
    requantisation; values no quantised convolution reads (the last block's output, the pooled features, the
    logits) stay float. With a float prefix, its first quantised value (the boundary) is quantised once when the
    prefix writes it."""
    images = _images(images)
    plan = _plan(state, stem, images)
    scales = activation_scales(plan, calibration, quantize_from)
    weights = _float_weights(plan, state)
    for s in quantized_steps(plan, quantize_from):
        w, b = weights[s.name]
        s_w = step_weight_scales(calibration, s, w.shape[0])
        weights[s.name] = (fake_quantize(w, s_w, calibration.dtype, axis=0), b)

    def quantize(v, array):
        if v in scales:
            if device == "host":
                array[...] = fake_quantize(array, scales[v], calibration.dtype)
            else:
                fake_quantize_in_place(array, scales[v], calibration.dtype)

    return _run(plan, images, weights, quantize, batch_size, device)
