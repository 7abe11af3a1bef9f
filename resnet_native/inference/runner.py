"""A plan bound to arrays: one callable per step, for one batch size.

bind_forward takes where each value lives (view(value, batch) -> array) and the convolutions' weights and specs.
The engine passes views into its device buffers; CPU tests pass host views, which the same op functions hand to
their float64 NumPy references (resnet_native.reference), so the binding runs the plan against the model's eval
graph without a GPU.
"""

from __future__ import annotations

import dataclasses
import functools

from ..ops import conv, kernels, own_conv, pool, quantized_conv


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


CUDNN_KERNEL = "cudnn"
OWN_PREFIX = "own:"  # 'own:<name>': ops.own_conv's kernel <name>


@dataclasses.dataclass
class QuantizedCall:
    """One quantised convolution with its arrays bound; call() runs it on `kernel`: 'cudnn' (cuDNN's 8-bit
    convolution with the epilogue, a residual one into the fp16 `scratch` and then the residual pass) or
    'own:<name>' (one ops.own_conv kernel, the residual and the requantisation in its epilogue; int8 out only)."""

    q: object  # quantized.QuantizedConv
    spec: object
    x: object
    out: object
    z: object
    relu: bool
    scratch: object  # the fp16 view a residual step's cuDNN convolution writes, else None
    kernel: str = CUDNN_KERNEL

    def __call__(self) -> None:
        q = self.q
        if self.kernel != CUDNN_KERNEL:
            own = q.own
            own_conv.conv2d_s8(self.x, q.weight, self.out, alpha=own.alpha, bias=own.bias, pad=self.spec.padding,
                               stride=self.spec.stride, residual=self.z, beta=own.beta, relu=self.relu,
                               kernel=self.kernel[len(OWN_PREFIX):])
        elif q.residual is None:
            quantized_conv.conv2d(self.x, q.weight, self.spec, q.alpha, bias=q.beta, relu=self.relu, out=self.out)
        else:
            r = q.residual
            quantized_conv.conv2d(self.x, q.weight, self.spec, q.alpha, bias=q.beta, out=self.scratch)
            quantized_conv.residual_requantize(self.scratch, self.z, self.spec.precision, s_z=r.s_z,
                                               inv_s_y=r.inv_s_y, relu=r.relu, out=self.out)

    def own_kernels(self) -> tuple:
        """The own kernels that can run this call, the one own_conv.select prefers first: none for an FP8 or
        float-output convolution, or where the build or the GPU has none."""
        if self.q.own is None or not own_conv.available():
            return ()
        shapes = (tuple(self.x.shape), tuple(self.q.weight.shape))
        kwargs = dict(pad=self.spec.padding, stride=self.spec.stride, residual=self.z is not None)
        names = [k["name"] for k in own_conv.kernels() if own_conv.supports(*shapes, **kwargs, kernel=k["name"])]
        if not names:
            return ()
        first = own_conv.select(*shapes, **kwargs)
        return tuple(OWN_PREFIX + name for name in sorted(names, key=lambda name: name != first))


class Forward:
    """The forward of one batch size: its input and logits arrays and the bound steps, in plan order."""

    def __init__(self, batch, input_array, logits, calls, conv_calls, quantized_calls=None):
        self.batch = batch
        self.input = input_array
        self.logits = logits  # (batch, num_classes)
        self.calls = calls  # one callable per plan step
        self.conv_calls = conv_calls  # step name -> ConvCall (the warm-up times them)
        self.quantized_calls = quantized_calls or {}  # step name -> QuantizedCall (the warm-up picks their kernels)

    def run(self) -> None:
        for call in self.calls:
            call()


def bind_forward(plan, batch: int, view, weights: dict, specs: dict, layout: str, quantized=None,
                 scratch=None) -> Forward:
    """The Forward of `plan` for `batch`: view(value, batch) gives a value's array in the layout, weights[name] a
    conv step's (weight, bias), specs[name] its ConvSpec; quantized[name] a quantised step's QuantizedConv
    (quantized.py: such steps are QuantizedCalls, on cuDNN until the warm-up chooses, and not in conv_calls), and
    a residual one writes into the flat fp16 `scratch` first; quantized[name] of a 'quantize' step is its
    BoundaryQuantize."""
    calls, conv_calls, quantized_calls, quantized = [], {}, {}, quantized or {}
    for s in plan.steps:
        x, out = view(s.x, batch), view(s.out, batch)
        dtype = plan.values[s.x].dtype
        if s.kind == "conv" and s.name in quantized:
            z = None if s.z is None else view(s.z, batch)
            q = quantized[s.name]
            v = None if q.residual is None else scratch[: out.size].reshape(out.shape)
            quantized_calls[s.name] = call = QuantizedCall(q, specs[s.name], x, out, z, s.relu, v)
            calls.append(call)
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
    return Forward(batch, view(plan.input, batch), logits, calls, conv_calls, quantized_calls)


def _quantize_call(q, x, out, precision: str):
    """The float prefix's end: out = encode(x / s) in the 8-bit `precision`, as residual_requantize computes it
    with a zero residual (s_z = 0 over q.zeros: 0 * 0 adds nothing, and no NaN code can reach the sum)."""
    zeros = q.zeros[: out.size].reshape(out.shape)
    return functools.partial(quantized_conv.residual_requantize, x, zeros, precision, s_z=0.0, inv_s_y=q.inv_scale,
                             relu=False, out=out)
