"""Float64 NumPy batch normalization with the signatures of resnet_native.ops.norm: batch_norm_train (with its fused
residual add and ReLU), batch_norm_infer and batch_norm_backward.

PyTorch's semantics, as the native ops: running = (1 - momentum) * running + momentum * batch statistic, the
running variance unbiased; save_invstd = 1 / sqrt(biased batch variance + eps). Activations (x, z, y, dy and the
outputs of their shape) are NCHW (N, C, H, W) or NHWC (N, H, W, C) arrays in one storage dtype; gamma, beta and the
statistics are (C,) float arrays (float32 on the GPU, the model's master dtype on the host). There is no reserve
space here: `reserve` is handed back as given (None when none was).
"""

import numpy as np

from .._core.names import LAYOUTS, choice
from . import storage


def _channels(x, layout) -> int:
    choice("layout", layout, LAYOUTS)
    if x.ndim != 4:
        raise ValueError(f"x: expected a 4-D {layout} activation, got shape {tuple(x.shape)}")
    return int(x.shape[1] if layout == "NCHW" else x.shape[3])


def _axes(layout) -> tuple:
    return (0, 2, 3) if layout == "NCHW" else (0, 1, 2)


def _per_channel(v, layout):
    return v.reshape((1, -1, 1, 1) if layout == "NCHW" else (1, 1, 1, -1))


def _statistic(array, name: str, c: int) -> np.ndarray:
    """A (C,) float host array (gamma, beta, a running or saved statistic)."""
    storage.host(array, name)
    if tuple(array.shape) != (c,) or array.dtype.kind != "f":
        raise ValueError(f"{name}: expected a float array of shape ({c},), got {array.dtype} {tuple(array.shape)}")
    return array


def _statistics(c: int, **arrays) -> list:
    """float64 copies of checked (C,) statistics, in the order given."""
    return [_statistic(a, name, c).astype(np.float64) for name, a in arrays.items()]


def _statistic_out(out, name: str, c: int, like) -> np.ndarray:
    return _statistic(out, name, c) if out is not None else np.empty((c,), dtype=like.dtype)


def _residual(z, x, dtype: str):
    return None if z is None else storage.decode(storage.like(z, "z", x, "x"), dtype)


def _epilogue(y, z, relu):
    if z is not None:
        y = y + z
    return np.where(y < 0, 0.0, y) if relu else y


def _normalized(xd, mean, invstd, g, b, zd, relu, layout):
    """[relu](gamma * (x - mean) * invstd + beta [+ z]) in float64."""
    return _epilogue((xd - _per_channel(mean, layout)) * _per_channel(invstd * g, layout) + _per_channel(b, layout), zd,
                     relu)


def batch_norm_train(x, gamma, beta, running_mean, running_var, *, layout, momentum=0.1, eps=1e-5, z=None,
                     relu=False, out=None, save_mean=None, save_invstd=None, reserve=None, dtype=None):
    """Training forward: y = [relu](bn(x) [+ z]) with batch statistics; updates running_mean / running_var in place.
    Returns (y, save_mean, save_invstd, reserve)."""
    dt = storage.dtype_of(x, "x", dtype)
    c = _channels(x, layout)
    g, b, rm, rv = _statistics(c, gamma=gamma, beta=beta, running_mean=running_mean, running_var=running_var)
    xd, zd = storage.decode(x, dt), _residual(z, x, dt)
    m = xd.size // c
    if m < 2:  # the unbiased running variance would be 0/0 (the GPU op and PyTorch refuse it too)
        raise ValueError(f"x: expected more than 1 value per channel when training, got N*H*W = 1 (shape "
                         f"{tuple(x.shape)})")
    mean, var = xd.mean(axis=_axes(layout)), xd.var(axis=_axes(layout))
    invstd = 1.0 / np.sqrt(var + float(eps))
    y = _normalized(xd, mean, invstd, g, b, zd, relu, layout)
    running_mean[...] = (1.0 - momentum) * rm + momentum * mean
    running_var[...] = (1.0 - momentum) * rv + momentum * var * m / (m - 1)
    save_mean = _statistic_out(save_mean, "save_mean", c, gamma)
    save_invstd = _statistic_out(save_invstd, "save_invstd", c, gamma)
    save_mean[...], save_invstd[...] = mean, invstd
    y = storage.write(storage.output(out, x.shape, x.dtype), y, dt)
    return y, save_mean, save_invstd, reserve


def batch_norm_infer(x, gamma, beta, running_mean, running_var, *, layout, eps=1e-5, z=None, relu=False, out=None,
                     dtype=None):
    """Inference forward: y = [relu](bn(x) [+ z]) with the running statistics."""
    dt = storage.dtype_of(x, "x", dtype)
    c = _channels(x, layout)
    g, b, rm, rv = _statistics(c, gamma=gamma, beta=beta, running_mean=running_mean, running_var=running_var)
    scale = g / np.sqrt(rv + float(eps))
    y = (storage.decode(x, dt) - _per_channel(rm, layout)) * _per_channel(scale, layout) + _per_channel(b, layout)
    y = _epilogue(y, _residual(z, x, dt), relu)
    return storage.write(storage.output(out, x.shape, x.dtype), y, dt)


def batch_norm_backward(x, dy, gamma, beta, save_mean, save_invstd, *, layout, eps=1e-5, y=None, relu=False,
                        has_z=False, reserve=None, dx=None, dgamma=None, dbeta=None, dz=None, dtype=None,
                        accumulate=False):
    """Gradients of batch_norm_train: returns (dx, dgamma, dbeta, dz); dz (the gradient of z: dy through the ReLU
    mask) when has_z, else None. accumulate=True adds into the given dgamma / dbeta."""
    dt = storage.dtype_of(x, "x", dtype)
    c = _channels(x, layout)
    _check_grad_flags(accumulate, dgamma, dbeta, has_z, dz)
    g, _, mean, invstd = _statistics(c, gamma=gamma, beta=beta, save_mean=save_mean, save_invstd=save_invstd)
    grad = _masked_grad(x, dy, y, relu, dt)
    m = x.size // c
    xhat = _xhat(x, mean, invstd, layout, dt)
    db, dg = grad.sum(axis=_axes(layout)), (grad * xhat).sum(axis=_axes(layout))
    dx_values = _per_channel(g * invstd / m, layout) * (m * grad - _per_channel(db, layout)
                                                         - xhat * _per_channel(dg, layout))
    dgamma, dbeta = _statistic_out(dgamma, "dgamma", c, gamma), _statistic_out(dbeta, "dbeta", c, gamma)
    if accumulate:
        dg, db = dg + dgamma, db + dbeta
    dgamma[...], dbeta[...] = dg, db
    dx = storage.write(storage.output(dx, x.shape, x.dtype, "dx"), dx_values, dt)
    if has_z:
        dz = storage.write(storage.output(dz, x.shape, x.dtype, "dz"), grad, dt)
    return dx, dgamma, dbeta, dz


# ---- synchronized batch norm (resnet_native.ops.norm.sync_*): per-channel sums that the caller adds across ranks ----

def _sums_out(out, c: int, like) -> np.ndarray:
    if out is None:
        return np.empty((2, c), dtype=like.dtype)
    storage.host(out, "sums")
    if tuple(out.shape) != (2, c) or out.dtype.kind != "f":
        raise ValueError(f"sums: expected a float array of shape (2, {c}), got {out.dtype} {tuple(out.shape)}")
    return out


def _count(count, x, c: int) -> float:
    local = x.size // c
    if isinstance(count, bool) or not isinstance(count, int | float | np.integer | np.floating) or not \
            local <= count < 9.0e15 or count < 1:
        raise ValueError(f"count: expected the elements per channel over all ranks, at least this rank's {local}, "
                         f"got {count!r}")
    return float(count)


def sync_bn_sums(x, shift, *, layout, sums=None, dtype=None):
    """This rank's [sum(x - shift), sum((x - shift)^2)] per channel, as a (2, C) array (written into sums)."""
    dt = storage.dtype_of(x, "x", dtype)
    c = _channels(x, layout)
    (k,) = _statistics(c, shift=shift)
    d = storage.decode(x, dt) - _per_channel(k, layout)
    out = _sums_out(sums, c, shift)
    out[...] = np.stack([d.sum(axis=_axes(layout)), (d * d).sum(axis=_axes(layout))])
    return out


def sync_bn_forward(x, sums, gamma, beta, running_mean, running_var, *, count, layout, momentum=0.1, eps=1e-5,
                    z=None, relu=False, out=None, save_mean=None, save_invstd=None, dtype=None):
    """y = [relu](bn(x) [+ z]) with the statistics of all ranks: `sums` is the all-ranks sum of sync_bn_sums about
    running_mean over `count` elements per channel. Updates the running statistics; returns (y, save_mean,
    save_invstd)."""
    dt = storage.dtype_of(x, "x", dtype)
    c = _channels(x, layout)
    g, b, rm, rv = _statistics(c, gamma=gamma, beta=beta, running_mean=running_mean, running_var=running_var)
    s = np.asarray(_sums_out(sums, c, gamma), np.float64)
    n = _count(count, x, c)
    offset = s[0] / n
    var = np.maximum(s[1] / n - offset * offset, 0.0)
    mean, invstd = rm + offset, 1.0 / np.sqrt(var + float(eps))
    y = _normalized(storage.decode(x, dt), mean, invstd, g, b, _residual(z, x, dt), relu, layout)
    running_mean[...] = (1.0 - momentum) * rm + momentum * mean
    running_var[...] = (1.0 - momentum) * rv + momentum * (var * n / (n - 1) if n > 1 else var)
    save_mean = _statistic_out(save_mean, "save_mean", c, gamma)
    save_invstd = _statistic_out(save_invstd, "save_invstd", c, gamma)
    save_mean[...], save_invstd[...] = mean, invstd
    return storage.write(storage.output(out, x.shape, x.dtype), y, dt), save_mean, save_invstd


def _check_grad_flags(accumulate, dgamma, dbeta, has_z, dz) -> None:
    if accumulate and (dgamma is None or dbeta is None):
        raise ValueError("accumulate: needs dgamma and dbeta to accumulate into")
    if not has_z and dz is not None:
        raise ValueError("dz: given but has_z is False")


def _masked_grad(x, dy, y, relu, dt):
    if relu and y is None:
        raise ValueError("y: the forward output is required with relu=True (the ReLU mask)")
    grad = storage.decode(storage.like(dy, "dy", x, "x"), dt)
    if relu:
        grad = np.where(storage.decode(storage.like(y, "y", x, "x"), dt) <= 0, 0.0, grad)
    return grad


def _xhat(x, mean, invstd, layout, dt):
    return (storage.decode(x, dt) - _per_channel(mean, layout)) * _per_channel(invstd, layout)


def sync_bn_grad_sums(x, dy, save_mean, save_invstd, *, layout, y=None, relu=False, has_z=False, sums=None,
                      dgamma=None, dbeta=None, dz=None, dtype=None, accumulate=False):
    """This rank's [sum(g), sum(g * xhat)] (g: dy through the ReLU mask) into sums; dgamma, dbeta (+)= those local
    sums; dz = g when has_z. Returns (sums, dgamma, dbeta, dz)."""
    dt = storage.dtype_of(x, "x", dtype)
    c = _channels(x, layout)
    _check_grad_flags(accumulate, dgamma, dbeta, has_z, dz)
    mean, invstd = _statistics(c, save_mean=save_mean, save_invstd=save_invstd)
    grad = _masked_grad(x, dy, y, relu, dt)
    db, dg = grad.sum(axis=_axes(layout)), (grad * _xhat(x, mean, invstd, layout, dt)).sum(axis=_axes(layout))
    out = _sums_out(sums, c, save_mean)
    out[...] = np.stack([db, dg])
    dgamma, dbeta = _statistic_out(dgamma, "dgamma", c, save_mean), _statistic_out(dbeta, "dbeta", c, save_mean)
    if accumulate:
        dg, db = dg + dgamma, db + dbeta
    dgamma[...], dbeta[...] = dg, db
    if has_z:
        dz = storage.write(storage.output(dz, x.shape, x.dtype, "dz"), grad, dt)
    return out, dgamma, dbeta, dz


def sync_bn_backward(x, dy, gamma, save_mean, save_invstd, sums, *, count, layout, y=None, relu=False, dx=None,
                     dtype=None):
    """dx = gamma * invstd * (g - sums[0] / count - xhat * sums[1] / count), from the all-ranks gradient sums."""
    dt = storage.dtype_of(x, "x", dtype)
    c = _channels(x, layout)
    g, mean, invstd = _statistics(c, gamma=gamma, save_mean=save_mean, save_invstd=save_invstd)
    s = np.asarray(_sums_out(sums, c, gamma), np.float64)
    n = _count(count, x, c)
    grad = _masked_grad(x, dy, y, relu, dt)
    xhat = _xhat(x, mean, invstd, layout, dt)
    values = _per_channel(g * invstd, layout) * (grad - _per_channel(s[0] / n, layout)
                                                 - xhat * _per_channel(s[1] / n, layout))
    return storage.write(storage.output(dx, x.shape, x.dtype, "dx"), values, dt)


__all__ = ["batch_norm_backward", "batch_norm_infer", "batch_norm_train", "sync_bn_backward", "sync_bn_forward",
           "sync_bn_grad_sums", "sync_bn_sums"]
