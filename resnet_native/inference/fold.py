"""Batch norm folded into the convolution before it, in float64 on the host.

In eval mode a BatchNorm is an affine map per channel, so conv then BN is one convolution with a bias:

    bn(conv(x, w)) = gamma * (conv(x, w) - mean) / sqrt(var + eps) + beta
                   = conv(x, w * scale) + (beta - mean * scale),        scale = gamma / sqrt(var + eps)

(scale multiplies filter k, i.e. row k of the (K, C, R, S) weight). The arithmetic runs in float64, and the result
is rounded once to the storage dtype when it is uploaded, so folding adds no error of its own beyond that rounding.
num_batches_tracked plays no part in eval mode and is ignored.
"""

from __future__ import annotations

import numpy as np

from .._core.names import LAYOUTS, choice

# The eps of every BatchNorm2d in the models (nn/layers/batchnorm2d.py's default, as torchvision's).
BN_EPS = 1e-5

BN_FIELDS = ("weight", "bias", "running_mean", "running_var")


def fold_batch_norm(weight, gamma, beta, mean, var, eps: float = BN_EPS) -> tuple[np.ndarray, np.ndarray]:
    """(folded weight (K, C, R, S), bias (K,)), float64, for conv weight `weight` (torch layout) followed by a
    BatchNorm with these parameters and running statistics."""
    w = np.asarray(weight, np.float64)
    if w.ndim != 4:
        raise ValueError(f"weight: expected a (K, C, R, S) array, got shape {w.shape}")
    k = w.shape[0]
    stats = {"gamma": gamma, "beta": beta, "mean": mean, "var": var}
    arrays = {}
    for name, value in stats.items():
        a = np.asarray(value, np.float64)
        if a.shape != (k,):
            raise ValueError(f"{name}: expected shape ({k},) to match the weight's {k} filters, got {a.shape}")
        arrays[name] = a
    if not np.all(arrays["var"] + eps > 0):
        raise ValueError("var: running variances must be > -eps (a negative variance is not a batch norm)")
    scale = arrays["gamma"] / np.sqrt(arrays["var"] + eps)
    return w * scale[:, None, None, None], arrays["beta"] - arrays["mean"] * scale


def fold_from_state(state: dict, conv_key: str, bn_prefix: str, eps: float = BN_EPS):
    """fold_batch_norm of state[conv_key] and the BatchNorm named bn_prefix ('layer1.0.bn1', ...)."""
    fields = [state[f"{bn_prefix}.{f}"] for f in BN_FIELDS]
    return fold_batch_norm(state[conv_key], *fields, eps=eps)


def filter_in_layout(weight: np.ndarray, layout: str) -> np.ndarray:
    """A (K, C, R, S) filter as the layout's ops read it: unchanged for NCHW, (K, R, S, C) for NHWC (contiguous)."""
    choice("layout", layout, LAYOUTS)
    w = np.asarray(weight)
    return np.ascontiguousarray(w.transpose(0, 2, 3, 1) if layout == "NHWC" else w)


def conv_step_params(step, state: dict, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """(weight in the layout's filter order, bias), float64, of a plan's ConvStep: its BatchNorm folded in, or
    for the classifier its (classes, C) weight as a (classes, C, 1, 1) filter and its own bias."""
    if step.bn is not None:
        w, b = fold_from_state(state, step.weight, step.bn)
    else:
        w = np.asarray(state[step.weight], np.float64)[:, :, None, None]
        b = np.asarray(state[step.bias], np.float64)
    return filter_in_layout(w, layout), b
