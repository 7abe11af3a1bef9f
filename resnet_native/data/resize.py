"""Downscaled copies of a uint8 image set, for training the early epochs at a lower resolution (progressive resizing).

The filter is Pillow's antialiased bilinear reduction (a triangle filter whose support widens with the scale factor),
written as one (out, in) weight matrix per axis: in NumPy (the reference) a whole set is two matrix products; on the
GPU one native kernel (csrc/kernels/downscale_u8.cu) sums each output value's few nonzero terms in float64. Rounded
half up and clipped to [0, 255], the result stays uint8 and goes through the augmentation kernel unchanged.
"""

from __future__ import annotations

import numpy as np

from ..ops.images import downscale_u8


def resize_weights(out_size: int, in_size: int) -> np.ndarray:
    """The (out_size, in_size) float64 matrix of an antialiased bilinear resize along one axis; each row sums to 1."""
    if not (isinstance(out_size, int) and isinstance(in_size, int) and 0 < out_size <= in_size):
        raise ValueError(f"size: expected 0 < out_size <= in_size, got {out_size!r} from {in_size!r}")
    scale = in_size / out_size
    support = max(scale, 1.0)  # the triangle's half-width in source pixels
    centres = (np.arange(out_size) + 0.5) * scale
    source = np.arange(in_size) + 0.5
    weights = np.clip(1.0 - np.abs(source[None, :] - centres[:, None]) / support, 0.0, None)
    return weights / weights.sum(axis=1, keepdims=True)


def _rounded(values, xp):
    return xp.clip(xp.floor(values + 0.5), 0, 255).astype(xp.uint8)


def downscale_reference(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (N, H, W, 3) -> uint8 (N, size, size, 3), in NumPy: what downscale_on_gpu computes."""
    images = _checked(images)
    wy = resize_weights(size, images.shape[1])
    wx = resize_weights(size, images.shape[2])
    return _rounded(np.einsum("yh,nhwc,xw->nyxc", wy, images.astype(np.float64), wx, optimize=True), np)


def downscale_on_gpu(images, size: int, out=None):
    """uint8 (N, H, W, 3) device array -> uint8 (N, size, size, 3) device array (`out`, else a new one): one native
    kernel, each output value the float64 sum over the few source pixels its row and column weights cover, rounded
    as the reference rounds."""
    import cupy

    images = cupy.ascontiguousarray(_checked(images))
    n, h, w, c = images.shape
    shape = (n, size, size, c)
    if out is None:
        out = cupy.empty(shape, dtype=cupy.uint8)
    elif tuple(out.shape) != shape or out.dtype != cupy.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a C-contiguous uint8 array of shape {shape}, got {out.dtype} "
                         f"{tuple(out.shape)}")
    wy = cupy.asarray(resize_weights(size, h))
    wx = cupy.asarray(resize_weights(size, w))
    return downscale_u8(images, wy, wx, out)


def _checked(images):
    if images.ndim != 4 or images.shape[3] != 3 or images.dtype != np.uint8:
        raise ValueError(f"images: expected uint8 (N, H, W, 3), got {images.dtype} {tuple(images.shape)}")
    return images
