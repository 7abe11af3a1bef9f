"""Batch normalization on cuDNN, with BN + add + ReLU fused into one cuDNN call where cuDNN has that kernel.

Activations: NCHW arrays of shape (N, C, H, W) or NHWC arrays of shape (N, H, W, C) in fp32, fp16 or bf16 (uint16
bits, dtype='bf16'); gamma, beta, running statistics and saved statistics are fp32 arrays of shape (C,).
Semantics are PyTorch's: running = (1 - momentum) * running + momentum * batch statistic, with the running
variance unbiased; save_invstd = 1 / sqrt(biased batch variance + eps).

Paths (see last_path()):
- NHWC fp16 (and C % 4 == 0): ONE cudnnBatchNormalizationForwardTrainingEx call computes relu(bn(x) [+ z]), or
  bn(x) alone, in cuDNN's persistent NHWC kernels, and one cudnnBatchNormalizationBackwardEx call its gradient.
  That path needs a reserve buffer kept from forward to backward: batch_norm_train returns it.
- Elsewhere (and for bn(x) + z without ReLU) the plain cuDNN call runs and the custom kernels add z and apply
  ReLU (and mask dy in backward).
Mode: SPATIAL_PERSISTENT for NHWC, SPATIAL for NCHW (cuDNN's NCHW persistent reduction can overflow to inf/NaN on
large activations); set_mode() forces one. bf16 fusion is off unless set_fuse_bf16(True): cuDNN documents its
fused kernels for fp16.

Outputs not given are allocated with cupy before the op (pass them in to reuse buffers, e.g. for CUDA graphs).
"""

import numpy as np

from . import reference
from ._loader import _C
from ._runtime import cuda_available
from .kernels import empty, resolve_dtype, shape_of, stream

_LAYOUTS = ("NCHW", "NHWC")


def _channels(shape, layout, name="x") -> int:
    if layout not in _LAYOUTS:
        raise ValueError(f"layout: expected 'NCHW' or 'NHWC', got {layout!r}")
    if len(shape) != 4:
        raise ValueError(f"{name}: expected a 4-D activation ({'N, C, H, W' if layout == 'NCHW' else 'N, H, W, C'}),"
                         f" got shape {tuple(shape)}")
    return int(shape[1] if layout == "NCHW" else shape[3])


def _stats(c):
    import cupy

    return cupy.empty((c,), dtype=cupy.float32)


def _number(value, name) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            return float(value)  # numpy scalars
        except (TypeError, ValueError):
            raise TypeError(f"{name}: expected a number, got {type(value).__name__}") from None
    return float(value)


def batch_norm_reserve_size(x_shape, *, layout, relu=False, has_z=False, dtype="fp16") -> int:
    """Bytes of reserve space batch_norm_train needs for this problem (0 when it takes the unfused path, never 0
    on the fused one)."""
    _channels(x_shape, layout, "x_shape")
    dt = resolve_dtype_name(dtype)
    return int(_C.batch_norm_reserve_size(tuple(int(s) for s in x_shape), layout, dt, bool(relu), bool(has_z),
                                          stream()))


def resolve_dtype_name(dtype) -> str:
    names = {"fp32": "fp32", "float32": "fp32", "tf32": "fp32", "fp16": "fp16", "float16": "fp16",
             "bf16": "bf16", "bfloat16": "bf16"}
    if dtype not in names:
        raise ValueError(f"dtype: expected one of 'fp32', 'fp16', 'bf16', got {dtype!r}")
    return names[dtype]


def batch_norm_train(x, gamma, beta, running_mean, running_var, *, layout, momentum=0.1, eps=1e-5, z=None,
                     relu=False, out=None, save_mean=None, save_invstd=None, reserve=None, dtype=None):
    """Training forward: y = [relu](bn(x) [+ z]) with batch statistics; updates running_mean / running_var in place.

    Returns (y, save_mean, save_invstd, reserve): keep them for batch_norm_backward. `reserve` is None when the
    path needs none; a given `reserve` (from an earlier call of the same shape) is reused.
    """
    if isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.norm.batch_norm_train(x, gamma, beta, running_mean, running_var, layout=layout,
                                               momentum=momentum, eps=eps, z=z, relu=relu, out=out,
                                               save_mean=save_mean, save_invstd=save_invstd, reserve=reserve,
                                               dtype=dtype)
    dt = resolve_dtype(x, "x", dtype)
    shape = shape_of(x)
    c = _channels(shape, layout)
    momentum = _number(momentum, "momentum")
    eps = _number(eps, "eps")
    if out is None:
        out = empty(shape, dt)
    if save_mean is None:
        save_mean = _stats(c)
    if save_invstd is None:
        save_invstd = _stats(c)
    if reserve is None and cuda_available():  # without a GPU the op only validates, then raises NoGPUError
        nbytes = batch_norm_reserve_size(shape, layout=layout, relu=relu, has_z=z is not None, dtype=dt)
        if nbytes:  # 0: the plain path. Never 0 on the fused path: the buffer is also backward's token of it
            import cupy

            reserve = cupy.empty(((nbytes + 3) // 4,), dtype=cupy.float32)  # opaque bytes (float32 for tensor_arg)
    _C.batch_norm_train(x, gamma, beta, running_mean, running_var, z, out, save_mean, save_invstd, reserve, layout,
                        dt, momentum, eps, bool(relu), stream())
    return out, save_mean, save_invstd, reserve


def batch_norm_infer(x, gamma, beta, running_mean, running_var, *, layout, eps=1e-5, z=None, relu=False, out=None,
                     dtype=None):
    """Inference forward: y = [relu](bn(x) [+ z]) with the running statistics."""
    if isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.norm.batch_norm_infer(x, gamma, beta, running_mean, running_var, layout=layout, eps=eps, z=z,
                                               relu=relu, out=out, dtype=dtype)
    dt = resolve_dtype(x, "x", dtype)
    shape = shape_of(x)
    _channels(shape, layout)
    eps = _number(eps, "eps")
    if out is None:
        out = empty(shape, dt)
    _C.batch_norm_infer(x, gamma, beta, running_mean, running_var, z, out, layout, dt, eps, bool(relu),
                        stream())
    return out


def batch_norm_backward(x, dy, gamma, beta, save_mean, save_invstd, *, layout, eps=1e-5, y=None, relu=False,
                        has_z=False, reserve=None, dx=None, dgamma=None, dbeta=None, dz=None, dtype=None,
                        accumulate=False):
    """Gradients of batch_norm_train: returns (dx, dgamma, dbeta, dz).

    With relu, dy is the gradient of the ReLU output and y that output (the mask). dz, the gradient of z (dy
    masked by the ReLU), is returned when has_z, else None. accumulate=True adds into the given dgamma / dbeta
    instead of overwriting them.
    """
    if isinstance(x, np.ndarray) and isinstance(dy, np.ndarray):  # host arrays: the float64 reference
        return reference.norm.batch_norm_backward(x, dy, gamma, beta, save_mean, save_invstd, layout=layout, eps=eps,
                                                  y=y, relu=relu, has_z=has_z, reserve=reserve, dx=dx, dgamma=dgamma,
                                                  dbeta=dbeta, dz=dz, dtype=dtype, accumulate=accumulate)
    dt = resolve_dtype(x, "x", dtype)
    shape = shape_of(x)
    c = _channels(shape, layout)
    eps = _number(eps, "eps")
    if accumulate and (dgamma is None or dbeta is None):
        raise ValueError("accumulate: needs dgamma and dbeta to accumulate into")
    if relu and y is None:
        raise ValueError("y: the forward output is required with relu=True (the ReLU mask)")
    if dx is None:
        dx = empty(shape, dt)
    if dgamma is None:
        dgamma = _stats(c)
    if dbeta is None:
        dbeta = _stats(c)
    if has_z and dz is None:
        dz = empty(shape, dt)
    if not has_z and dz is not None:
        raise ValueError("dz: given but has_z is False")
    _C.batch_norm_backward(x, dy, y, gamma, beta, save_mean, save_invstd, reserve, dx, dgamma, dbeta, dz, layout, dt,
                           eps, bool(relu), bool(has_z), bool(accumulate), stream())
    return dx, dgamma, dbeta, dz


def last_path() -> dict:
    """What this thread's last batch-norm call ran: {'op': 'train'|'infer'|'backward', 'fused': bool,
    'mode': 'persistent'|'spatial', 'detail': the cuDNN call(s) and kernels, and why it was not fused}."""
    return dict(_C.batch_norm_last_path())


def set_mode(mode: str) -> None:
    """'auto' (persistent for NHWC, spatial for NCHW), 'persistent' or 'spatial' for every later call."""
    _C.set_batch_norm_mode(mode)


def mode() -> str:
    return _C.batch_norm_mode()


def set_fuse_bf16(enabled: bool) -> None:
    """Let NHWC bf16 try cuDNN's fused kernels (documented for fp16; a refusal falls back to the unfused path)."""
    _C.set_batch_norm_fuse_bf16(bool(enabled))


def fuse_bf16() -> bool:
    return _C.batch_norm_fuse_bf16()


def clear_refusals() -> None:
    """Forget the shapes cuDNN refused to fuse, so they are tried again."""
    _C.clear_batch_norm_refusals()


__all__ = [
    "batch_norm_backward",
    "batch_norm_infer",
    "batch_norm_reserve_size",
    "batch_norm_train",
    "clear_refusals",
    "fuse_bf16",
    "last_path",
    "mode",
    "set_fuse_bf16",
    "set_mode",
]
