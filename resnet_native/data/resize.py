"""Downscaled copies of a uint8 image set, for training the early epochs at a lower resolution (progressive resizing).

The filter is Pillow's antialiased bilinear reduction (a triangle filter whose support widens with the scale factor),
written as one (out, in) weight matrix per axis, so a whole set is two matrix products: on the GPU (cupy, float64) and
in NumPy (the reference) alike. Rounded half up and clipped to [0, 255], the result stays uint8 and goes through the
augmentation kernel unchanged.
"""

from __future__ import annotations

import numpy as np

CHUNK = 8192  # images per matrix product on the GPU: float64 temporaries of a few hundred MiB at most


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


def downscale_on_gpu(images, size: int):
    """uint8 (N, H, W, 3) device array -> a new uint8 (N, size, size, 3) device array, in chunks of CHUNK images."""
    import cupy

    images = _checked(images)
    n, h, w, _ = images.shape
    wy = cupy.asarray(resize_weights(size, h))
    wx = cupy.asarray(resize_weights(size, w))
    out = cupy.empty((n, size, size, 3), dtype=cupy.uint8)
    for start in range(0, n, CHUNK):
        chunk = images[start:start + CHUNK].astype(cupy.float64)
        rows = cupy.einsum("yh,nhwc->nywc", wy, chunk)
        out[start:start + CHUNK] = _rounded(cupy.einsum("nywc,xw->nyxc", rows, wx), cupy)
    return out


def _checked(images):
    if images.ndim != 4 or images.shape[3] != 3 or images.dtype != np.uint8:
        raise ValueError(f"images: expected uint8 (N, H, W, 3), got {images.dtype} {tuple(images.shape)}")
    return images
