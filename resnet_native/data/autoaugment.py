"""AutoAugment's CIFAR-10 policy (Cubuk et al., 2019), with torchvision's ops and magnitudes, in CPU processes.

Why on the CPU: the policy's 14 ops must match PIL's behaviour (nearest-neighbour affine warps, histogram
equalisation, PIL's smoothing kernel for Sharpness, ...). Here `apply_op` / `apply_autoaugment` run them through PIL
itself, one image at a time: that is the reference. The workers run autoaugment_batched.py instead, the same ops on
whole groups of images in NumPy, equal to PIL bit for bit and several times faster (PIL builds ImageOps' tables
in Python for every 32x32 image). While epoch e trains, the workers build epoch e+1's augmented copy of the
training set in a shared buffer; the GPU kernel (augment.py) then applies crop/flip/Cutout/normalisation to that
copy.

Order: torchvision's, random crop -> flip -> AutoAugment, when the workers are given the crop padding and flip
(the trainer does so, and then the GPU kernel skips its own crop and flip): the policy's ops then see the crop's
black borders exactly as they do in torchvision's pipeline (Invert whitens them, Equalize and AutoContrast count
them). With crop_padding=0 and flip=False the workers apply AutoAugment alone.

Like augment.py: the random choices (sub-policy, whether each op fires, sign) are sampled on the host per
(seed, epoch) in data-set order (sample_autoaugment), and applying them is deterministic, so the output does not
depend on the number of workers or on how the set is split between them.
"""

from __future__ import annotations

import math
import mmap
import multiprocessing
import os

import numpy as np

from ..names import whole_number
from .augment import STREAM_AUTOAUGMENT, STREAM_AUTOAUGMENT_CROP, epoch_rng

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


def autoaugment_images(images: np.ndarray, choices: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Every image with its choice row, batched in NumPy (equal to autoaugment_images_pil)."""
    from .autoaugment_batched import autoaugment_batch

    return autoaugment_batch(images, choices, out)


# ----------------------------------------------------------------------------------------------------------------
# Worker pool

_worker_state = {}  # set in each worker by fork inheritance: source images and the two output buffers


def _worker_chunk(args):
    slot, start, stop, choices = args
    images = _worker_state["images"]
    out = np.frombuffer(_worker_state["buffers"][slot], np.uint8).reshape(images.shape)
    autoaugment_images(images[start:stop], choices, out[start:stop])
    return stop - start


class AutoAugmentWorkers:
    """Produces each epoch's AutoAugmented copy of a uint8 (N, H, W, 3) set in worker processes, one epoch ahead.

        aa = AutoAugmentWorkers(train_images, seed=0)
        aa.prefetch(0)
        images_e = aa.result(0)   # blocks until ready; a read-only view, valid until prefetch(e + 2)
        aa.prefetch(1)            # overlaps epoch 0's training
        ...
        aa.close()

    Two shared-memory buffers alternate (epoch e uses slot e % 2), so epoch e + 1 can be built while epoch e's copy
    is still being uploaded. workers=0 runs in the calling process (no pool).
    The pool forks: its workers inherit the source array and the buffers without copying, and never touch CUDA.
    """

    def __init__(self, images: np.ndarray, *, seed: int = 0, workers: int | None = None, chunk: int | None = None,
                 crop_padding: int = 0, flip: bool = False):
        images = np.ascontiguousarray(images, dtype=np.uint8)
        self.crop_padding, self.flip = whole_number("crop_padding", crop_padding, 0), bool(flip)
        if images.ndim != 4 or images.shape[3] != 3:
            raise ValueError(f"images: expected uint8 (N, H, W, 3), got {images.shape}")
        self.images = images
        self.seed = int(seed)
        self._buffers = [mmap.mmap(-1, max(images.nbytes, 1)) for _ in range(2)]
        self._pending = {}
        if workers is None:
            workers = max(1, min(len(os.sched_getaffinity(0)) - 1, 32))
        self.workers = int(workers)
        # Two tasks per worker by default: large enough groups for the batched ops, some balance between workers.
        self.chunk = int(chunk) if chunk else max(256, -(-len(images) // max(1, 2 * self.workers)))
        self._pool = None
        from .autoaugment_batched import warm_maps

        warm_maps(*images.shape[1:3])  # the geometric maps, made once here and inherited by the forked workers
        if self.workers > 0:
            _worker_state["images"] = images
            _worker_state["buffers"] = self._buffers
            self._pool = multiprocessing.get_context("fork").Pool(self.workers)

    def _view(self, slot):
        return np.frombuffer(self._buffers[slot], np.uint8, count=self.images.size).reshape(self.images.shape)

    def slots(self) -> list:
        """The two shared buffers the epochs alternate between, as read-only arrays (to page-lock them for the
        upload; what a slot holds is only valid between result() and the prefetch that reuses it)."""
        views = [self._view(slot) for slot in range(2)]
        for view in views:
            view.flags.writeable = False
        return views

    def prefetch(self, epoch: int) -> None:
        """Start building epoch's copy (no-op when already started)."""
        if epoch in self._pending:
            return
        slot = epoch % 2
        if any(e % 2 == slot for e in self._pending):
            raise RuntimeError(f"epoch {epoch}: its buffer is still in use by an earlier epoch; call result() first")
        choices = sample_autoaugment(self.seed, epoch, len(self.images), crop_padding=self.crop_padding,
                                     flip=self.flip)
        n = len(self.images)
        tasks = [(slot, s, min(s + self.chunk, n), choices[s:min(s + self.chunk, n)]) for s in range(0, n, self.chunk)]
        if self._pool is None:
            autoaugment_images(self.images, choices, self._view(slot))
            self._pending[epoch] = None
        else:
            self._pending[epoch] = self._pool.map_async(_worker_chunk, tasks)

    def result(self, epoch: int) -> np.ndarray:
        """epoch's augmented images (starting the work first if needed)."""
        self.prefetch(epoch)
        job = self._pending.pop(epoch)
        if job is not None:
            job.get()
        view = self._view(epoch % 2)
        view.flags.writeable = False
        return view

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        self._pending.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
