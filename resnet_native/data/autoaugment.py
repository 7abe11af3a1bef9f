"""AutoAugment's CIFAR-10 policy (Cubuk et al., 2019), with torchvision's ops and magnitudes, in CPU processes.

On the CPU because the policy's 14 ops must match PIL's behaviour (nearest-neighbour warps, equalisation, PIL's
smoothing kernel, ...): apply_op / apply_autoaugment run them through PIL itself, one image at a time, as the
reference; the workers run autoaugment_batched.py, the same ops on groups of images in NumPy, equal to PIL bit for
bit. While epoch e trains, the workers build epoch e+1's augmented copy of the training set in a shared buffer and
the GPU kernel (augment.py) then applies Cutout and normalisation to it. Order is torchvision's: crop -> flip ->
AutoAugment when the workers are given the crop padding and flip (the trainer does, and the GPU kernel then skips
them), so the policy sees the crop's black borders as torchvision's pipeline does. As in augment.py the random
choices are sampled on the host per (seed, epoch) in data-set order (sample_autoaugment) and applying them is
deterministic, so the output depends neither on the number of workers nor on how the set is split between them.
"""

from __future__ import annotations

import math

import numpy as np

from .._core.rng import epoch_rng
from .augment import STREAM_AUTOAUGMENT, STREAM_AUTOAUGMENT_CROP

# The 25 sub-policies for CIFAR-10: ((op, probability, magnitude bin or None), (op, probability, bin or None)).
CIFAR10_POLICY = (
    (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
    (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
    (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
    (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
    (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
    (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
    (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
    (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
    (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
    (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
    (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
    (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
    (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
    (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
    (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
    (("Color", 0.9, 9), ("Equalize", 0.6, None)),
    (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
    (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
    (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
    (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
    (("Equalize", 0.8, None), ("Invert", 0.1, None)),
    (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
)

NUM_BINS = 10
OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness",
       "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")


def magnitude_table(image_size=(32, 32), num_bins: int = NUM_BINS) -> dict:
    """op -> (float32 magnitudes per bin or None, signed): the search space of torchvision's AutoAugment."""
    height, width = image_size

    def lin(a, b):
        return np.linspace(a, b, num_bins).astype(np.float32)

    return {
        "ShearX": (lin(0.0, 0.3), True),
        "ShearY": (lin(0.0, 0.3), True),
        "TranslateX": (lin(0.0, 150.0 / 331.0 * width), True),
        "TranslateY": (lin(0.0, 150.0 / 331.0 * height), True),
        "Rotate": (lin(0.0, 30.0), True),
        "Brightness": (lin(0.0, 0.9), True),
        "Color": (lin(0.0, 0.9), True),
        "Contrast": (lin(0.0, 0.9), True),
        "Sharpness": (lin(0.0, 0.9), True),
        "Posterize": ((8 - np.round(np.arange(num_bins) / ((num_bins - 1) / 4))).astype(np.int32), False),
        "Solarize": (lin(255.0, 0.0), False),
        "AutoContrast": (None, False),
        "Equalize": (None, False),
        "Invert": (None, False),
    }


_MAGNITUDES = magnitude_table()


def op_magnitude(op: str, magnitude_bin, negate: bool, table=None) -> float:
    """The signed magnitude one op is applied with (0.0 for ops without one)."""
    values, signed = (table or _MAGNITUDES)[op]
    if magnitude_bin is None or values is None:
        return 0.0
    m = float(values[magnitude_bin])
    return -m if (signed and negate) else m


def sample_autoaugment(seed: int, epoch: int, n: int, *, crop_padding: int = 0, flip: bool = False) -> np.ndarray:
    """int16 (n, 9) choices per image in data-set order: [sub-policy, op0 fires, op1 fires, op0 negated,
    op1 negated, crop padding, crop row, crop column, flipped]. An op fires when a uniform [0, 1) draw is <= its
    probability; a signed magnitude is negated when a fair coin says so (torchvision's convention). The crop
    offsets (in the zero-padded image, 0..2 * crop_padding) and the flip come from their own random stream, so
    the policy draws do not depend on them."""
    rng = epoch_rng(seed, epoch, STREAM_AUTOAUGMENT)
    policy = rng.integers(0, len(CIFAR10_POLICY), n)
    draws = rng.random((n, 2))
    negate = rng.integers(0, 2, (n, 2)) == 0
    probs = np.array([[sub[0][1], sub[1][1]] for sub in CIFAR10_POLICY])
    fires = draws <= probs[policy]
    crop_rng = epoch_rng(seed, epoch, STREAM_AUTOAUGMENT_CROP)
    offsets = crop_rng.integers(0, 2 * crop_padding + 1, (n, 2))
    flipped = crop_rng.integers(0, 2, n) == 1 if flip else np.zeros(n, bool)
    padding = np.full(n, crop_padding)
    return np.column_stack([policy, fires, negate, padding, offsets, flipped]).astype(np.int16)


def crop_and_flip(image: np.ndarray, padding: int, row: int, col: int, flipped: bool) -> np.ndarray:
    """torchvision's RandomCrop(padding, fill 0) at (row, col) of the padded image, then the horizontal flip."""
    if padding:
        h, w = image.shape[:2]
        image = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))[row : row + h, col : col + w]
    return np.ascontiguousarray(image[:, ::-1]) if flipped else image


def apply_op(img, op: str, magnitude: float):
    """One AutoAugment op on a PIL RGB image, as torchvision's PIL path applies it (nearest resampling, fill 0)."""
    from PIL import Image, ImageEnhance, ImageOps

    fill = (0,) * len(img.getbands())
    if op in ("ShearX", "ShearY"):
        # torchvision shears by the angle atan(m) and maps it back with tan(); the same round trip keeps the
        # coefficients bit-identical to its affine matrix. Centre (0, 0): the top-left corner stays put.
        s = math.tan(math.radians(math.degrees(math.atan(magnitude))))
        coeffs = (1.0, s, 0.0, 0.0, 1.0, 0.0) if op == "ShearX" else (1.0, 0.0, 0.0, s, 1.0, 0.0)
        return img.transform(img.size, Image.Transform.AFFINE, coeffs, Image.Resampling.NEAREST, fillcolor=fill)
    if op in ("TranslateX", "TranslateY"):
        # Whole pixels (int() truncates toward zero); output (x, y) reads input (x - tx, y - ty).
        t = int(magnitude)
        tx, ty = (t, 0) if op == "TranslateX" else (0, t)
        coeffs = (1.0, 0.0, float(-tx), 0.0, 1.0, float(-ty))
        return img.transform(img.size, Image.Transform.AFFINE, coeffs, Image.Resampling.NEAREST, fillcolor=fill)
    if op == "Rotate":
        return img.rotate(magnitude, Image.Resampling.NEAREST, expand=False, center=None, fillcolor=fill)
    if op == "Brightness":
        return ImageEnhance.Brightness(img).enhance(1.0 + magnitude)
    if op == "Color":
        return ImageEnhance.Color(img).enhance(1.0 + magnitude)
    if op == "Contrast":
        return ImageEnhance.Contrast(img).enhance(1.0 + magnitude)
    if op == "Sharpness":
        return ImageEnhance.Sharpness(img).enhance(1.0 + magnitude)
    if op == "Posterize":
        return ImageOps.posterize(img, int(magnitude))
    if op == "Solarize":
        return ImageOps.solarize(img, magnitude)
    if op == "AutoContrast":
        return ImageOps.autocontrast(img)
    if op == "Equalize":
        return ImageOps.equalize(img)
    if op == "Invert":
        return ImageOps.invert(img)
    raise ValueError(f"op: expected one of {OPS}, got {op!r}")


def apply_autoaugment(image: np.ndarray, choice) -> np.ndarray:
    """One uint8 (H, W, 3) image and its sampled choice row -> the cropped, flipped and augmented uint8 image."""
    from PIL import Image

    policy, fires0, fires1, neg0, neg1, padding, row, col, flipped = (int(v) for v in choice)
    image = crop_and_flip(image, padding, row, col, bool(flipped))
    fires, negate = (fires0, fires1), (neg0, neg1)
    if not (fires0 or fires1):
        return image
    img = Image.fromarray(image)
    for i, (op, _, magnitude_bin) in enumerate(CIFAR10_POLICY[policy]):
        if fires[i]:
            img = apply_op(img, op, op_magnitude(op, magnitude_bin, bool(negate[i])))
    return np.asarray(img)


def autoaugment_images_pil(images: np.ndarray, choices: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The reference: every image with its choice row, one at a time through PIL."""
    if out is None:
        out = np.empty_like(images)
    for i in range(len(images)):
        out[i] = apply_autoaugment(images[i], choices[i])
    return out
