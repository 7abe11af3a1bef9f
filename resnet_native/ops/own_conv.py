"""Convolutions on the package's own kernels (csrc/ownconv/: CUTLASS's sm90 implicit GEMM, compiled at build time
for sm_90a), beside the cuDNN path of ops.conv / ops.quantized_conv.

    y = own_conv.conv2d_s8(x, w, alpha=a, bias=b, pad=1, stride=1, residual=z, beta=g, relu=True, out=y)

int8 NHWC x (N, H, W, C), KRSC w (K, R, S, C), int8 residual and out (N, P, Q, K); alpha and bias fp32 (K,): per
output channel alpha = s_x * s_w[k] / s_y and bias = b[k] / s_y, beta = s_r / s_y for the residual
(quantization.int8.requant_params). One kernel sums the products exactly in int32 and applies the whole epilogue:

    out = sat(rne(clamp(alpha[k] * acc + bias[k] [+ beta * residual], 0 if relu else -127, 127)))

in fp32 fused multiply-adds (alpha * acc + bias first, then beta * residual + that; beta an fp32 scalar), rounding
to nearest even: the package's symmetric int8 requantisation (quantization.int8.requantize_float) with one fp32
rounding per step.
C and K must be multiples of 16 and every array 16-byte aligned (TMA). NumPy arrays run the float64 reference.

Whether the kernels exist: build_info()["own_conv_kernels"] (not built without nvcc >= 12, sm_90 among the build's
archs and CUTLASS's headers), and available() for this GPU (their code is sm_90a: H100 / H200 only); elsewhere
the cuDNN path serves.
"""

from __future__ import annotations

import numpy as np

from .._core.loader import _C
from .._core.names import flag
from .._core.runtime import op_stream as _stream
from ..quantization.int8 import INT8_MAX
from . import quantized_conv
from .conv_spec import ConvSpec


def kernels() -> list[dict]:
    """The compiled kernels (name, dtype, epilogue, residual, tile, cluster, stages, persistent, gemm_1x1, preferred,
    smem_bytes, threads, channel_multiple, address_alignment, sm); empty in a build without them. 'gemm_1x1'
    ('s8_1x1_*'): GEMMs for 1x1 filters at stride 1 without padding; persistent: those, the 's8_p_*' / 's8_pp_*'
    convolutions and the halo-window ones ('s8_halo_*'); preferred: what select('auto') takes first where it runs
    (the 64-channel halo-window kernels, faster than the general ones at every batch measured)."""
    return list(_C.own_conv_kernels())


def available() -> bool:
    """Whether the kernels are built and the current GPU runs their code (False without a GPU)."""
    return unavailable_reason() == ""


def unavailable_reason() -> str:
    """Why available() is False ('' when it is True): the build's reason, no GPU, or the GPU's."""
    names = [k["name"] for k in kernels()]
    if not names:
        return f"not built: {_C.build_info()['own_conv_kernels']['reason']}"
    if _C.device_count() == 0:
        return "no CUDA device"
    return _C.own_conv_device_mismatch(names[0])


def select(x_shape, w_shape, *, pad, stride, residual: bool = False, kernel: str = "auto") -> str:
    """The kernel conv2d_s8 runs for these shapes: `kernel` checked, or for 'auto' the preferred one that can.
    ValueError says why none can (RuntimeError in a build without kernels). No GPU needed."""
    return _C.own_conv_select(tuple(x_shape), tuple(w_shape), pad, stride, flag("residual", residual), kernel)


def supports(x_shape, w_shape, *, pad, stride, residual: bool = False, kernel: str = "auto") -> bool:
    """Whether select() finds a kernel (False in a build without kernels)."""
    try:
        select(x_shape, w_shape, pad=pad, stride=stride, residual=residual, kernel=kernel)
    except (ValueError, RuntimeError):
        return False
    return True


def conv2d_s8(x, w, out=None, *, alpha, bias, pad, stride, residual=None, beta=0.0, relu=True, kernel="auto"):
    """out = sat(rne(clamp(alpha * conv(x, w) + bias [+ beta * residual], 0 if relu else -127, 127))) (see the
    module doc); returns out (allocated when None). `kernel`: 'auto' or a name from kernels()."""
    relu = flag("relu", relu)
    if isinstance(x, np.ndarray) and isinstance(w, np.ndarray):  # host arrays: the float64 reference
        return reference_conv2d_s8(x, w, out, alpha=alpha, bias=bias, pad=pad, stride=stride, residual=residual,
                                   beta=beta, relu=relu)
    return _C.own_conv_s8(x, w, out, alpha=alpha, bias=bias, pad=pad, stride=stride, residual=residual, beta=beta,
                          relu=relu, kernel=kernel, stream=_stream())


def reference_conv2d_s8(x, w, out=None, *, alpha, bias, pad, stride, residual=None, beta=0.0, relu=True):
    """conv2d_s8 in float64 on host arrays: quantized_conv's reference (exact sums, the epilogue in float64, one
    rounding to nearest even) clamped to the symmetric [-127, 127]. beta is taken as the kernel takes it, an fp32
    scalar (alpha and bias are fp32 arrays)."""
    x, w = np.asarray(x), np.asarray(w)
    if residual is None and float(beta) != 0.0:
        raise ValueError("beta: a residual scale without a residual")
    spec = ConvSpec(stride=stride, padding=pad, layout="NHWC", precision="int8", engine="graph")
    if out is None:
        (n, h, wd, _), (k, r, s, _) = x.shape, w.shape
        (sh, sw), (ph, pw) = spec.stride, spec.padding
        out = np.empty((n, (h + 2 * ph - r) // sh + 1, (wd + 2 * pw - s) // sw + 1, k), np.int8)
    quantized_conv.reference_conv2d(x, w, spec, np.asarray(alpha, np.float32), bias=np.asarray(bias, np.float32),
                                    z=residual, gamma=float(np.float32(beta)), relu=flag("relu", relu), out=out)
    np.maximum(out, np.int8(-INT8_MAX), out=out)
    return out


__all__ = ["available", "conv2d_s8", "kernels", "reference_conv2d_s8", "select", "supports",
           "unavailable_reason"]
