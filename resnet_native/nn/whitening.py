"""A first convolution started as a whitening of its input's patches, as fast CIFAR-10 trainers start theirs.

The k x k patches of natural images are strongly correlated: most of their variance lies along a few smooth
directions. A filter bank along the eigenvectors of the patches' second-moment matrix, each divided by the square
root of its eigenvalue, decorrelates them from the first step, which a randomly drawn stem spends early epochs
learning. Each filter comes with its negation, so a ReLU after it keeps both signs of every component.
"""

from __future__ import annotations

import numpy as np

MAX_IMAGES = 1000  # the estimate's sample: 900 k patches of a 32 x 32 set, far more than 27 x 27 moments need
_CHUNK = 100  # images whose patches are gathered and multiplied at a time, in float32 (bounded memory and error)


def patch_whitening_filters(images, kernel_size: int, *, eps: float = 5e-4,
                            max_images: int = MAX_IMAGES) -> np.ndarray:
    """Filters (2 D, C, k, k) in torch's layout, D = C k k: the eigenvectors of the k x k patches' second-moment
    matrix scaled by 1 / sqrt(eigenvalue + eps), the largest eigenvalue first, then the same filters negated.

    images: (N, H, W, C), normalised as the network sees them (the first max_images are used); eps: what keeps
    the directions of almost no variance (noise) from growing without bound. Each eigenvector's sign is fixed
    (its largest component positive), so the result does not depend on the LAPACK build.
    """
    x = np.asarray(images)
    if x.ndim != 4 or x.shape[1] < kernel_size or x.shape[2] < kernel_size or len(x) == 0:
        raise ValueError(f"images: expected (N, H, W, C) with N >= 1 and H, W >= {kernel_size}, got {x.shape}")
    if not (np.isfinite(eps) and eps > 0):
        raise ValueError(f"eps: expected a positive number, got {eps}")
    if max_images < 1:
        raise ValueError(f"max_images: expected at least 1, got {max_images}")
    x = x[:max_images]
    c = x.shape[3]
    dim = c * kernel_size * kernel_size
    moments, count = np.zeros((dim, dim)), 0
    for start in range(0, len(x), _CHUNK):
        # (n, H-k+1, W-k+1, C, k, k): each patch flattened in torch's (C, R, S) filter order. A chunk's products
        # are summed in float32 (tens of thousands of terms), the chunks' sums in float64.
        windows = np.lib.stride_tricks.sliding_window_view(
            x[start:start + _CHUNK].astype(np.float32, copy=False), (kernel_size, kernel_size), axis=(1, 2))
        patches = windows.reshape(-1, dim)
        moments += patches.T @ patches
        count += len(patches)
    if not np.all(np.isfinite(moments)):
        raise ValueError("images: hold NaN or infinite values")
    eigenvalues, eigenvectors = np.linalg.eigh(moments / count)  # ascending
    eigenvalues, eigenvectors = eigenvalues[::-1], eigenvectors[:, ::-1].T  # rows, largest first
    signs = np.sign(eigenvectors[np.arange(dim), np.argmax(np.abs(eigenvectors), axis=1)])
    filters = eigenvectors * (signs / np.sqrt(np.maximum(eigenvalues, 0.0) + eps))[:, None]
    filters = filters.reshape(dim, c, kernel_size, kernel_size)
    return np.concatenate([filters, -filters]).astype(np.float32)


def whiten_first_filters(conv, images, *, eps: float = 5e-4) -> int:
    """Overwrite the first 2 C k k filters of a Conv2d (stride and padding aside, a C -> K k x k convolution with
    K >= 2 C k k) with patch_whitening_filters(images); the others keep their values. Returns how many were
    written."""
    k, wanted = conv.kernel_size, 2 * conv.in_channels * conv.kernel_size ** 2
    if conv.groups != 1 or wanted > conv.out_channels:
        raise ValueError(f"conv: whitening needs an ungrouped convolution of at least {wanted} filters, got "
                         f"{conv.describe()}")
    if np.ndim(images) != 4 or np.shape(images)[3] != conv.in_channels:
        raise ValueError(f"images: expected (N, H, W, {conv.in_channels}), got {np.shape(images)}")
    weight = conv.state_dict()["weight"]
    weight[:wanted] = patch_whitening_filters(images, k, eps=eps)
    conv.load_state_dict({"weight": weight})
    return wanted
