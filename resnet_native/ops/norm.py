"""Batch normalization on cuDNN, with BN + add + ReLU fused into one cuDNN call where cuDNN has that kernel.

Activations: NCHW (N, C, H, W) or NHWC (N, H, W, C) in fp32, fp16 or bf16 (uint16 bits, dtype='bf16'); gamma,
beta, running and saved statistics are fp32 (C,). Semantics are PyTorch's (momentum, unbiased running variance,
save_invstd = 1 / sqrt(biased variance + eps)). NHWC takes cuDNN's *Ex calls (persistent kernels; the plain calls
pick slower generic kernels there), which in fp16 and bf16 (C % 4 == 0) compute relu(bn(x) [+ z]) and its
gradient in one call each and need a reserve buffer from forward to backward; otherwise, and for NCHW, cuDNN does
bn(x) and this package's kernels add z and apply the ReLU. Mode: persistent for NHWC, spatial for NCHW (cuDNN's
NCHW persistent reduction can overflow on large activations). last_path() says what a call ran. Outputs not given
are allocated with cupy once every argument is validated; pass them in for CUDA graphs.
"""

import numpy as np

from .. import reference
from .._core.loader import _C
from .._core.names import finite_number, flag
from .kernels import stream


def _eps(eps) -> float:
    """eps checked as the native ops check it, before either path runs (host and GPU refuse the same values)."""
    return finite_number("eps", eps, 0.0)


def _momentum(momentum) -> float:
    """momentum checked as the native ops check it (and with their message), before either path runs."""
    try:
        return finite_number("momentum", momentum, 0.0, 1.0, high_inclusive=True)
    except ValueError:
        raise ValueError(f"momentum: expected a value in [0, 1], got {momentum!r}") from None


def batch_norm_reserve_size(x_shape, *, layout, relu=False, has_z=False, dtype="fp16") -> int:
    """Bytes of reserve space batch_norm_train needs for this problem (0 when it takes the unfused path, never 0
    on the fused one)."""
    return int(_C.batch_norm_reserve_size(x_shape, layout, dtype, relu, has_z, stream()))


def batch_norm_train(x, gamma, beta, running_mean, running_var, *, layout, momentum=0.1, eps=1e-5, z=None,
                     relu=False, out=None, save_mean=None, save_invstd=None, reserve=None, dtype=None):
    """Training forward: y = [relu](bn(x) [+ z]) with batch statistics; updates running_mean / running_var in place.

    Returns (y, save_mean, save_invstd, reserve): keep them for batch_norm_backward. `reserve` is None when the
    path needs none (sized by batch_norm_reserve_size); a given `reserve` (from an earlier call of the same shape)
    is reused.
    """
    eps, momentum = _eps(eps), _momentum(momentum)
    if isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.norm.batch_norm_train(x, gamma, beta, running_mean, running_var, layout=layout,
                                               momentum=momentum, eps=eps, z=z, relu=relu, out=out,
                                               save_mean=save_mean, save_invstd=save_invstd, reserve=reserve,
                                               dtype=dtype)
    return _C.batch_norm_train(x, gamma, beta, running_mean, running_var, z, out, save_mean, save_invstd, reserve,
                               layout, dtype, momentum, eps, relu, stream())


def batch_norm_infer(x, gamma, beta, running_mean, running_var, *, layout, eps=1e-5, z=None, relu=False, out=None,
                     dtype=None):
    """Inference forward: y = [relu](bn(x) [+ z]) with the running statistics."""
    eps = _eps(eps)
    if isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.norm.batch_norm_infer(x, gamma, beta, running_mean, running_var, layout=layout, eps=eps, z=z,
                                               relu=relu, out=out, dtype=dtype)
    return _C.batch_norm_infer(x, gamma, beta, running_mean, running_var, z, out, layout, dtype, eps, relu, stream())


def batch_norm_backward(x, dy, gamma, beta, save_mean, save_invstd, *, layout, eps=1e-5, y=None, relu=False,
                        has_z=False, reserve=None, dx=None, dgamma=None, dbeta=None, dz=None, dtype=None,
                        accumulate=False):
    """Gradients of batch_norm_train: returns (dx, dgamma, dbeta, dz).

    With relu, dy is the gradient of the ReLU output and y that output (the mask). dz, the gradient of z (dy
    masked by the ReLU), is returned when has_z, else None. accumulate=True adds into the given dgamma / dbeta
    instead of overwriting them.
    """
    eps = _eps(eps)
    if isinstance(x, np.ndarray) and isinstance(dy, np.ndarray):  # host arrays: the float64 reference
        return reference.norm.batch_norm_backward(x, dy, gamma, beta, save_mean, save_invstd, layout=layout, eps=eps,
                                                  y=y, relu=relu, has_z=has_z, reserve=reserve, dx=dx, dgamma=dgamma,
                                                  dbeta=dbeta, dz=dz, dtype=dtype, accumulate=accumulate)
    return _C.batch_norm_backward(x, dy, y, gamma, beta, save_mean, save_invstd, reserve, dx, dgamma, dbeta, dz,
                                  layout, dtype, eps, relu, has_z, accumulate, stream())


# ---- synchronized batch norm: the statistics of every rank's batch; the caller all-reduces `sums` in between ----
#   sums = sync_bn_sums(x, running_mean)              (2, C): this rank's sums about the running mean
#   ... sums summed over the ranks, in place ...
#   y, save_mean, save_invstd = sync_bn_forward(x, sums, gamma, beta, running_mean, running_var, count=...)
#   sums, dgamma, dbeta, dz = sync_bn_grad_sums(x, dy, save_mean, save_invstd, ...)   (dgamma, dbeta: local)
#   ... sums summed over the ranks, in place ...
#   dx = sync_bn_backward(x, dy, gamma, save_mean, save_invstd, sums, count=...)
# count: elements per channel over all ranks (world_size * N * H * W when every rank has the same batch).
# Custom kernels (csrc/norm/sync_batch_norm.cu), fp64 partial sums added into fp32 with atomics: not
# bit-reproducible run to run.

def sync_bn_sums(x, shift, *, layout, sums=None, dtype=None):
    """This rank's [sum(x - shift), sum((x - shift)^2)] per channel: a (2, C) fp32 array (written into sums)."""
    if isinstance(x, np.ndarray):
        return reference.norm.sync_bn_sums(x, shift, layout=layout, sums=sums, dtype=dtype)
    return _C.sync_batch_norm_sums(x, shift, sums, layout, dtype, stream())


def sync_bn_forward(x, sums, gamma, beta, running_mean, running_var, *, count, layout, momentum=0.1, eps=1e-5,
                    z=None, relu=False, out=None, save_mean=None, save_invstd=None, dtype=None):
    """y = [relu](bn(x) [+ z]) with the statistics of all ranks (sums: every rank's sync_bn_sums about running_mean,
    added); updates the running statistics in place. Returns (y, save_mean, save_invstd)."""
    eps, momentum = _eps(eps), _momentum(momentum)
    if isinstance(x, np.ndarray):
        return reference.norm.sync_bn_forward(x, sums, gamma, beta, running_mean, running_var, count=count,
                                              layout=layout, momentum=momentum, eps=eps, z=z, relu=relu, out=out,
                                              save_mean=save_mean, save_invstd=save_invstd, dtype=dtype)
    return _C.sync_batch_norm_forward(x, z, sums, gamma, beta, running_mean, running_var, out, save_mean, save_invstd,
                                      count, layout, dtype, momentum, eps, relu, stream())


def sync_bn_grad_sums(x, dy, save_mean, save_invstd, *, layout, y=None, relu=False, has_z=False, sums=None,
                      dgamma=None, dbeta=None, dz=None, dtype=None, accumulate=False):
    """This rank's [sum(g), sum(g * xhat)] (g: dy through the ReLU mask of y) into sums; dgamma and dbeta from
    them ((+)=, this rank's share); dz = g when has_z. Returns (sums, dgamma, dbeta, dz)."""
    if isinstance(x, np.ndarray) and isinstance(dy, np.ndarray):
        return reference.norm.sync_bn_grad_sums(x, dy, save_mean, save_invstd, layout=layout, y=y, relu=relu,
                                                has_z=has_z, sums=sums, dgamma=dgamma, dbeta=dbeta, dz=dz,
                                                dtype=dtype, accumulate=accumulate)
    return _C.sync_batch_norm_grad_sums(x, dy, y, save_mean, save_invstd, sums, dgamma, dbeta, dz, layout, dtype,
                                        relu, has_z, accumulate, stream())


def sync_bn_backward(x, dy, gamma, save_mean, save_invstd, sums, *, count, layout, y=None, relu=False, dx=None,
                     dtype=None):
    """dx from the all-ranks gradient sums (every rank's sync_bn_grad_sums, added)."""
    if isinstance(x, np.ndarray) and isinstance(dy, np.ndarray):
        return reference.norm.sync_bn_backward(x, dy, gamma, save_mean, save_invstd, sums, count=count,
                                               layout=layout, y=y, relu=relu, dx=dx, dtype=dtype)
    return _C.sync_batch_norm_backward(x, dy, y, gamma, save_mean, save_invstd, sums, dx, count, layout, dtype, relu,
                                       stream())


def last_path() -> dict:
    """What this thread's last batch-norm call ran: {'op': 'train'|'infer'|'backward', 'fused': bool (one cuDNN
    call did the whole op), 'ex': bool (a *Ex call: cuDNN's persistent NHWC kernels), 'mode': 'persistent'|'spatial',
    'detail': the cuDNN call(s) and kernels, and why it was not fused}."""
    return dict(_C.batch_norm_last_path())


def set_mode(mode: str) -> None:
    """'auto' (persistent for NHWC, spatial for NCHW), 'persistent' or 'spatial' for every later call."""
    _C.set_batch_norm_mode(mode)


def mode() -> str:
    return _C.batch_norm_mode()


def set_fuse_bf16(enabled: bool) -> None:
    """Whether NHWC bf16 takes cuDNN's fused BN + add + ReLU calls (on by default; off: the BN-only *Ex call and the
    elementwise kernels). A shape cuDNN refuses falls back by itself either way."""
    _C.set_batch_norm_fuse_bf16(flag("enabled", enabled))


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
    "sync_bn_backward",
    "sync_bn_forward",
    "sync_bn_grad_sums",
    "sync_bn_sums",
]
