"""AutoAugment's CIFAR-10 policy applied to a whole chunk of images at once in NumPy, equal to the PIL path
(autoaugment.apply_autoaugment) bit for bit.

Why: PIL works one 32x32 image at a time and its ImageOps build their lookup tables in Python for every image, so
AutoAugment workers could fall behind the GPU. Here each op runs once per group of images that share it (same op,
magnitude and sign) as array arithmetic that reproduces PIL's: the geometric ops are nearest-neighbour maps made by
PIL itself (_geometric_map), the enhance ops PIL's float32 blend (_blend), the rest lookup tables in ImageOps'
integer arithmetic. tests/test_data_autoaugment_cpu.py checks every op at every magnitude and sign against PIL.
"""

from __future__ import annotations

import numpy as np

from .autoaugment import CIFAR10_POLICY, OPS, apply_op, magnitude_table, op_magnitude

_GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
_SIGNED = {op: signed for op, (_, signed) in magnitude_table().items()}
_maps: dict = {}  # (op, magnitude, height, width) -> int index map into [fill pixel, image pixels...]


def _geometric_map(op: str, magnitude: float, height: int, width: int) -> np.ndarray:
    """PIL's own nearest-neighbour warp of a pixel-index image: entry i is 1 + the source pixel of output pixel i,
    or 0 where the fill shows."""
    key = (op, magnitude, height, width)
    if key not in _maps:
        from PIL import Image

        index = Image.fromarray((np.arange(height * width, dtype=np.int32) + 1).reshape(height, width))
        _maps[key] = np.asarray(apply_op(index, op, magnitude)).reshape(-1).astype(np.intp)
    return _maps[key]


def _blend(degenerate: np.ndarray, image: np.ndarray, factor: float) -> np.ndarray:
    """PIL's Image.blend(degenerate, image, factor) on uint8 arrays: float32 arithmetic, truncated, clipped."""
    alpha = np.float32(factor)
    d = degenerate.astype(np.float32)
    t = d + alpha * (image.astype(np.float32) - d)  # the difference of two uint8 values is exact in float32
    return np.clip(np.trunc(t), 0.0, 255.0).astype(np.uint8)


def _grey(x: np.ndarray) -> np.ndarray:
    """PIL's RGB -> L: (19595 R + 38470 G + 7471 B + 0x8000) >> 16, shape (k, H, W)."""
    x = x.astype(np.int32)
    return ((x[..., 0] * 19595 + x[..., 1] * 38470 + x[..., 2] * 7471 + 0x8000) >> 16).astype(np.uint8)


def _smooth(x: np.ndarray) -> np.ndarray:
    """PIL's ImageFilter.SMOOTH on (k, H, W, 3): the 3x3 kernel (1 1 1 / 1 5 1 / 1 1 1) / 13 rounded half up
    (the sum over 13 is never a tie, so this is PIL's float result), the one-pixel border unchanged."""
    s = x.astype(np.int32)
    total = 4 * s[:, 1:-1, 1:-1]
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            total += s[:, dy : dy + s.shape[1] - 2, dx : dx + s.shape[2] - 2]
    out = x.copy()
    out[:, 1:-1, 1:-1] = (total + 6) // 13
    return out


def _channel_index(x: np.ndarray) -> np.ndarray:
    """int32 (k, H, W, 3): each value's slot in a (k, 3, 256) table (image, channel, value)."""
    base = (np.arange(x.shape[0], dtype=np.int32)[:, None, None, None] * 3 + np.arange(3, dtype=np.int32)) * 256
    return base + x


def _per_channel_lut(luts: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The images whose _channel_index is `index`, through luts (k, 3, 256): one table per image and channel."""
    return luts.reshape(-1)[index]


def _histograms(index: np.ndarray, k: int) -> np.ndarray:
    """(k, 3, 256) per-image, per-channel histograms from _channel_index's slots."""
    return np.bincount(index.reshape(-1), minlength=k * 3 * 256).reshape(k, 3, 256)


def _autocontrast(x: np.ndarray) -> np.ndarray:
    """ImageOps.autocontrast (no cutoff): per channel, [lo, hi] stretched to [0, 255] by int(i * scale + offset)."""
    index = _channel_index(x)
    present = _histograms(index, x.shape[0]) > 0
    lo = np.argmax(present, axis=-1).astype(np.float64)[..., None]
    hi = (255 - np.argmax(present[..., ::-1], axis=-1)).astype(np.float64)[..., None]
    scale = 255.0 / np.maximum(hi - lo, 1.0)
    lut = np.clip((np.arange(256.0) * scale + -lo * scale).astype(np.int64), 0, 255)  # int() truncates
    lut = np.where(hi <= lo, np.arange(256), lut).astype(np.uint8)
    return _per_channel_lut(lut, index)


def _equalize(x: np.ndarray) -> np.ndarray:
    """ImageOps.equalize: per channel, step = (pixels - count of the highest value present) // 255 and
    lut[i] = (step // 2 + pixels below i) // step; the identity when step is 0 or one value is present."""
    index = _channel_index(x)
    h = _histograms(index, x.shape[0])
    present = h > 0
    last = 255 - np.argmax(present[..., ::-1], axis=-1)
    step = (h.sum(axis=-1) - np.take_along_axis(h, last[..., None], -1)[..., 0]) // 255
    below = np.cumsum(h, axis=-1) - h
    lut = (step[..., None] // 2 + below) // np.maximum(step, 1)[..., None]
    identity = (step == 0) | (present.sum(axis=-1) <= 1)
    lut = np.where(identity[..., None], np.arange(256), np.minimum(lut, 255)).astype(np.uint8)
    return _per_channel_lut(lut, index)


def apply_op_batch(x: np.ndarray, op: str, magnitude: float) -> np.ndarray:
    """One AutoAugment op on uint8 (k, H, W, 3) images; equal to autoaugment.apply_op on each."""
    k, height, width, _ = x.shape
    if op in _GEOMETRIC:
        src = np.concatenate([np.zeros((k, 1, 3), np.uint8), x.reshape(k, height * width, 3)], axis=1)
        return src[:, _geometric_map(op, magnitude, height, width)].reshape(x.shape)
    if op == "Brightness":
        return _blend(np.zeros_like(x), x, 1.0 + magnitude)
    if op == "Color":
        return _blend(np.repeat(_grey(x)[..., None], 3, axis=-1), x, 1.0 + magnitude)
    if op == "Contrast":
        grey = _grey(x).reshape(k, -1)
        mean = (grey.sum(axis=1, dtype=np.int64) / grey.shape[1] + 0.5).astype(np.uint8)  # ImageStat's mean
        return _blend(np.broadcast_to(mean[:, None, None, None], x.shape), x, 1.0 + magnitude)
    if op == "Sharpness":
        return _blend(_smooth(x), x, 1.0 + magnitude)
    if op == "Posterize":
        return x & np.uint8((0xFF << (8 - int(magnitude))) & 0xFF)
    if op == "Solarize":
        i = np.arange(256)
        return np.where(i < magnitude, i, 255 - i).astype(np.uint8)[x]
    if op == "AutoContrast":
        return _autocontrast(x)
    if op == "Equalize":
        return _equalize(x)
    if op == "Invert":
        return 255 - x
    raise ValueError(f"op: expected one of {OPS}, got {op!r}")


def crop_and_flip_batch(images: np.ndarray, choices: np.ndarray) -> np.ndarray:
    """Every image's torchvision RandomCrop (zero padding) at its choice row's offsets, then its flip: a new array.
    One slice per crop offset that occurs (at most (2 * padding + 1)^2), not a per-pixel gather."""
    n, height, width, _ = images.shape
    padding = int(choices[:, 5].max(initial=0))
    if (choices[:, 5] != padding).any():
        raise ValueError("choices: every row must have the same crop padding")
    if padding:
        padded = np.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
        out = np.empty_like(images)
        offsets = choices[:, 6].astype(np.intp) * (2 * padding + 1) + choices[:, 7]
        order = np.argsort(offsets, kind="stable")
        bounds = np.flatnonzero(np.diff(offsets[order])) + 1
        for group in np.split(order, bounds):
            r, c = int(choices[group[0], 6]), int(choices[group[0], 7])
            out[group] = padded[group, r : r + height, c : c + width]
    else:
        out = images.copy()
    flipped = np.flatnonzero(choices[:, 8])
    out[flipped] = out[flipped, :, ::-1]
    return out


def autoaugment_batch(images: np.ndarray, choices: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Every image with its choice row (sample_autoaugment's), into `out` (allocated when None): crop and flip,
    then each sub-policy's first op, then its second, each applied once per group that shares op, magnitude and
    sign."""
    choices = np.asarray(choices)
    x = crop_and_flip_batch(images, choices)
    policy = choices[:, 0]
    for slot in (0, 1):
        fires, negate = choices[:, 1 + slot].astype(bool), choices[:, 3 + slot].astype(bool)
        groups: dict = {}
        for p, sub in enumerate(CIFAR10_POLICY):
            op, _, magnitude_bin = sub[slot]
            signed = _SIGNED[op] and magnitude_bin is not None
            for neg in (False, True) if signed else (False,):
                selected = (policy == p) & fires & ((negate == neg) if signed else True)
                key = (op, op_magnitude(op, magnitude_bin, neg))
                groups[key] = groups[key] | selected if key in groups else selected
        for (op, magnitude), selected in groups.items():
            index = np.flatnonzero(selected)
            if index.size:
                x[index] = apply_op_batch(x[index], op, magnitude)
    if out is None:
        return x
    out[...] = x
    return out


def warm_maps(height: int = 32, width: int = 32) -> None:
    """Make every geometric map of the policy now (a worker pool that forks afterwards inherits them)."""
    for sub in CIFAR10_POLICY:
        for op, _, magnitude_bin in sub:
            if op in _GEOMETRIC:
                for neg in (False, True):
                    _geometric_map(op, op_magnitude(op, magnitude_bin, neg), height, width)
