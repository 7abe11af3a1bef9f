"""A plan bound to arrays: one callable per step, for one batch size.

bind_forward takes where each value lives (view(value, batch) -> array) and the convolutions' weights and specs.
The engine passes views into its device buffers; CPU tests pass host views, which the same op functions hand to
their float64 NumPy references (resnet_native.reference), so the binding runs the plan against the model's eval
graph without a GPU.
"""

from __future__ import annotations

import dataclasses
import functools

from ..ops import conv, kernels, pool, quantized_conv


@dataclasses.dataclass
class ConvCall:
    """One convolution of the plan with its arrays bound: call(spec) runs it with that spec."""

    x: object
    w: object
    bias: object
    z: object
    out: object
    relu: bool

    def __call__(self, spec) -> None:
        conv.conv2d(self.x, self.w, spec, bias=self.bias, z=self.z, activation="relu" if self.relu else "identity",
                    out=self.out)

    def fused(self) -> str:
        return conv.fused_name(bias=self.bias is not None, z=self.z is not None,
                               activation="relu" if self.relu else "identity")

    def cached(self, spec):
        """The algorithm-cache entry of this call's fused key under `spec` (a dict with its 'key'), or None."""
        return conv.last_algorithm(tuple(self.x.shape), tuple(self.w.shape), spec, fused=self.fused())


class Forward:
    """The forward of one batch size: its input and logits arrays and the bound steps, in plan order."""

    def __init__(self, batch, input_array, logits, calls, conv_calls):
        self.batch = batch
        self.input = input_array
        self.logits = logits  # (batch, num_classes)
        self.calls = calls  # one callable per plan step
        self.conv_calls = conv_calls  # step name -> ConvCall (the warm-up times them)

    def run(self) -> None:
        for call in self.calls:
            call()


def bind_forward(plan, batch: int, view, weights: dict, specs: dict, layout: str, quantized=None,
                 scratch=None) -> Forward:
    """The Forward of `plan` for `batch`: view(value, batch) gives a value's array in the layout, weights[name] a
    conv step's (weight, bias), specs[name] its ConvSpec; quantized[name] a quantised step's QuantizedConv
    (quantized.py: such steps run quantized_conv.conv2d and are not in conv_calls), and a residual one writes
    into the flat fp16 `scratch` first; quantized[name] of a 'quantize' step is its BoundaryQuantize."""
    calls, conv_calls, quantized = [], {}, quantized or {}
    for s in plan.steps:
        x, out = view(s.x, batch), view(s.out, batch)
        dtype = plan.values[s.x].dtype
        if s.kind == "conv" and s.name in quantized:
            z = None if s.z is None else view(s.z, batch)
            calls.append(_quantized_call(quantized[s.name], specs[s.name], x, out, z, s.relu, scratch))
        elif s.kind == "conv":
            w, b = weights[s.name]
            z = None if s.z is None else view(s.z, batch)
            conv_calls[s.name] = call = ConvCall(x, w, b, z, out, s.relu)
            calls.append(functools.partial(call, specs[s.name]))
        elif s.kind == "maxpool":
            calls.append(functools.partial(pool.max_pool2d, x, kernel=s.kernel, stride=s.stride, padding=s.padding,
                                           layout=layout, out=out, dtype=dtype))
        elif s.kind == "avgpool":  # (N, C) out, as the op writes it
            calls.append(functools.partial(pool.global_avg_pool, x, layout=layout, out=out.reshape(batch, -1),
                                           dtype=dtype))
        elif s.kind == "quantize":
            calls.append(_quantize_call(quantized[s.name], x, out, plan.values[s.out].dtype))
        elif s.kind == "cast":
            calls.append(functools.partial(kernels.cast, x.reshape(batch, -1), out.reshape(batch, -1)))
        else:
            raise ValueError(f"plan: unknown step kind {s.kind!r} ({s.name})")
    logits = view(plan.output, batch).reshape(batch, plan.num_classes)
    return Forward(batch, view(plan.input, batch), logits, calls, conv_calls)


def _quantized_call(q, spec, x, out, z, relu: bool, scratch):
    """One quantised convolution as one callable: the convolution with its epilogue, or (residual) the
    convolution into fp16 scratch, then the residual add that requantises into out."""
    conv_into = functools.partial(quantized_conv.conv2d, x, q.weight, spec, q.alpha, bias=q.beta)
    if q.residual is None:
        return functools.partial(conv_into, relu=relu, out=out)
    v, r = scratch[: out.size].reshape(out.shape), q.residual

    def conv_then_add():
        conv_into(out=v)
        quantized_conv.residual_requantize(v, z, spec.precision, s_z=r.s_z, inv_s_y=r.inv_s_y, relu=r.relu, out=out)

    return conv_then_add


def _quantize_call(q, x, out, precision: str):
    """The float prefix's end: out = encode(x / s) in the 8-bit `precision`, as residual_requantize computes it
    with a zero residual (s_z = 0 over q.zeros: 0 * 0 adds nothing, and no NaN code can reach the sum)."""
    zeros = q.zeros[: out.size].reshape(out.shape)
    return functools.partial(quantized_conv.residual_requantize, x, zeros, precision, s_z=0.0, inv_s_y=q.inv_scale,
                             relu=False, out=out)
