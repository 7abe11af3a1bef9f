"""GPU data augmentation for CIFAR-10: random crop with zero padding, horizontal flip, Cutout, normalisation.

Split in two so each half can be checked on its own: (a) host sampling (NumPy, sample_epoch): per epoch a seeded
permutation and each image's crop offsets, flip and Cutout centre, seeded by (seed, epoch) alone so any epoch can
be rebuilt without replaying the ones before (what makes --resume exact); (b) one fused CUDA kernel per batch
(csrc/kernels/augment_u8.cu, through ops.images) that applies a slice of that table and writes the model's
layout and storage dtype; apply_reference is the same computation in NumPy. Semantics are torchvision's
RandomCrop(32, padding=4) -> RandomHorizontalFlip -> Normalize, then Cutout (DeVries & Taylor) set to 0 after
normalisation, i.e. to the data-set mean. Normalisation is a lookup table (normalization_lut), so the kernel does
no arithmetic and is bit-exact with the reference in every storage dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._core.names import LAYOUTS, PRECISION_STORAGE, PRECISIONS, choice
from .._core.rng import epoch_rng  # noqa: F401  (re-exported: the augmentation's streams)
from ..distributed.sharding import shard_indices
from ..ops.images import launch_augment  # noqa: F401  (re-exported: the augmentation kernel)
from ..reference.bf16 import to_bf16_bits
from .resize import downscale_on_gpu

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)

# Rows of the (6, N) parameter table.
ROW_INDEX, ROW_OFFSET_Y, ROW_OFFSET_X, ROW_FLIP, ROW_CUT_Y, ROW_CUT_X = range(6)
NUM_ROWS = 6

# Independent random streams derived from one seed.
STREAM_AUGMENT, STREAM_AUTOAUGMENT, STREAM_SUBSET, STREAM_AUTOAUGMENT_CROP, STREAM_FLIP = 1, 2, 3, 4, 5


@dataclass(frozen=True)
class AugmentConfig:
    """crop_padding: zero padding of the random crop (0: no crop); flip: random horizontal flip;
    cutout: side of the Cutout square (0: off); alternate_flip: each image is flipped in every other epoch (a
    seeded random half of them in even epochs, the other half in odd ones) instead of by a coin per epoch, so any
    two epochs in a row see both sides of every image."""

    crop_padding: int = 4
    flip: bool = True
    cutout: int = 0
    alternate_flip: bool = False

    def __post_init__(self):
        if not isinstance(self.crop_padding, int) or self.crop_padding < 0:
            raise ValueError(f"crop_padding: expected an int >= 0, got {self.crop_padding!r}")
        if not isinstance(self.cutout, int) or self.cutout < 0:
            raise ValueError(f"cutout: expected an int >= 0, got {self.cutout!r}")

    def scaled(self, size: int, full: int) -> AugmentConfig:
        """The same augmentation for images downscaled from full to size pixels: padding and Cutout in proportion
        (rounded half up), so a crop shifts and a Cutout hides the same share of the picture."""
        if size == full:
            return self
        k = size / full
        return AugmentConfig(crop_padding=int(self.crop_padding * k + 0.5), flip=self.flip,
                             cutout=int(self.cutout * k + 0.5), alternate_flip=self.alternate_flip)


def storage_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype that stores a precision's model inputs (bf16: uint16 bits)."""
    return PRECISION_STORAGE[choice("dtype", dtype, PRECISIONS)]


def check_labels(labels, num_classes: int, name: str = "labels") -> None:
    """ValueError naming the first label outside [0, num_classes) and its index. Run once on the host when a data set
    enters the pipeline: on the device an out-of-range label would only give a silently wrong loss and accuracy."""
    if hasattr(labels, "__cuda_array_interface__"):
        import cupy

        labels = cupy.asnumpy(cupy.asarray(labels))
    host = np.asarray(labels)
    if host.ndim != 1 or host.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integer class indices of shape (N,), got {host.dtype} {host.shape}")
    bad = np.flatnonzero((host < 0) | (host >= num_classes))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}] = {host[i]}: expected a class index in [0, {num_classes}) "
                         f"({bad.size} label(s) out of range)")


def check_layout(layout: str) -> str:
    return choice("layout", layout, LAYOUTS)


# ----------------------------------------------------------------------------------------------------------------
# (a) host-side sampling


def sample_epoch(seed: int, epoch: int, n: int, config: AugmentConfig, height: int = 32, width: int = 32,
                 shuffle: bool = True) -> np.ndarray:
    """The int32 (6, n) parameter table of one epoch; column j describes the epoch's j-th image:
    source index (a permutation of 0..n-1), crop offsets in [0, 2*padding] (offset == padding: no shift),
    flip (0/1), Cutout centre (y in [0, height), x in [0, width)). The crop reads the image padded with black
    (normalised like any black pixel), the flip mirrors the crop, and the Cutout square (side config.cutout, centre
    uniform over the output image) is clipped at the borders. With config.alternate_flip an image's flip is its
    seeded coin (drawn once per seed) in even epochs and the opposite in odd ones; the other rows are the same
    either way."""
    rng = epoch_rng(seed, epoch, STREAM_AUGMENT)
    p = config.crop_padding
    table = np.empty((NUM_ROWS, n), np.int32)
    table[ROW_INDEX] = rng.permutation(n) if shuffle else np.arange(n)
    table[ROW_OFFSET_Y] = rng.integers(0, 2 * p + 1, n)
    table[ROW_OFFSET_X] = rng.integers(0, 2 * p + 1, n)
    table[ROW_FLIP] = rng.integers(0, 2, n) if config.flip else 0
    if config.flip and config.alternate_flip:
        coin = epoch_rng(seed, 0, STREAM_FLIP).integers(0, 2, n)
        table[ROW_FLIP] = coin[table[ROW_INDEX]] ^ (epoch & 1)
    table[ROW_CUT_Y] = rng.integers(0, height, n)
    table[ROW_CUT_X] = rng.integers(0, width, n)
    return table


def identity_params(n: int, config: AugmentConfig | None = None, start: int = 0) -> np.ndarray:
    """A table that applies no augmentation (evaluation): images start..start+n-1 in order, centred, unflipped."""
    p = config.crop_padding if config is not None else 0
    table = np.zeros((NUM_ROWS, n), np.int32)
    table[ROW_INDEX] = np.arange(start, start + n)
    table[ROW_OFFSET_Y] = p
    table[ROW_OFFSET_X] = p
    return table


def cutout_box(cy: int, cx: int, size: int, height: int = 32, width: int = 32) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1), the half-open rows/columns of a Cutout square centred at (cy, cx), clipped to the image."""
    y0, x0 = cy - size // 2, cx - size // 2
    return max(y0, 0), min(y0 + size, height), max(x0, 0), min(x0 + size, width)


# ----------------------------------------------------------------------------------------------------------------
# Normalisation table


def normalization_lut(dtype: str, mean=MEAN, std=STD) -> np.ndarray:
    """(3, 256) table: lut[c, v] = (v / 255 - mean[c]) / std[c], computed in float64, stored in the dtype's
    storage type (bf16: uint16 bits, rounded via float32)."""
    values = (np.arange(256, dtype=np.float64)[None, :] / 255.0 - np.asarray(mean)[:, None]) / np.asarray(std)[:, None]
    st = storage_dtype(dtype)
    if st == np.uint16:
        return to_bf16_bits(values)
    return values.astype(st)


# ----------------------------------------------------------------------------------------------------------------
# NumPy reference of the kernel


def apply_reference(images: np.ndarray, params: np.ndarray, lut: np.ndarray, *, layout: str = "NHWC",
                    crop_padding: int = 4, cutout: int = 0) -> np.ndarray:
    """What the kernel computes, in NumPy: params is a (6, B) slice of a parameter table, images the uint8
    (N, H, W, 3) source. Returns (B, H, W, 3) (NHWC) or (B, 3, H, W) (NCHW) in lut's dtype."""
    check_layout(layout)
    params = np.asarray(params)
    _, h, w, _ = images.shape
    b = params.shape[1]
    y = np.arange(h)[None, :, None]
    x = np.arange(w)[None, None, :]
    col = lambda row: params[row][:, None, None]  # noqa: E731
    xs = np.where(col(ROW_FLIP) != 0, w - 1 - x, x)
    sy = y + col(ROW_OFFSET_Y) - crop_padding
    sx = xs + col(ROW_OFFSET_X) - crop_padding
    inside = (sy >= 0) & (sy < h) & (sx >= 0) & (sx < w)
    y0 = col(ROW_CUT_Y) - cutout // 2
    x0 = col(ROW_CUT_X) - cutout // 2
    in_cut = (cutout > 0) & (y >= y0) & (y < y0 + cutout) & (x >= x0) & (x < x0 + cutout)
    idx = np.broadcast_to(col(ROW_INDEX), (b, h, w))
    pixels = images[idx, np.clip(sy, 0, h - 1), np.clip(sx, 0, w - 1)]  # (B, H, W, 3)
    pixels = np.where(inside[..., None], pixels, 0)
    out = lut[np.arange(3)[None, None, None, :], pixels]
    out = np.where(in_cut[..., None], np.zeros((), lut.dtype), out)
    return np.ascontiguousarray(out if layout == "NHWC" else out.transpose(0, 3, 1, 2))


# ----------------------------------------------------------------------------------------------------------------
# (b) the CUDA kernel (csrc/kernels/augment_u8.cu, compiled with the extension)


class GpuAugmenter:
    """The whole uint8 training set on the GPU, served as augmented, normalised batches.

    for x, y in augmenter.epoch(e): ...   # x: (B, H, W, 3) / (B, 3, H, W) in the storage dtype; y: int32 (B,)
    Each epoch uploads one (6, N) int32 table (one host-to-device copy); each batch is one kernel launch into
    reused image and label buffers (stream order keeps the previous step's reads ahead of the next write).
    epoch(e, size=s) serves the epoch at s x s pixels (progressive resizing): from a copy of the set downscaled once
    (data/resize.py, kept for later epochs), with the crop padding and Cutout scaled alike (AugmentConfig.scaled).
    drop_last: skip the final partial batch so every step has the same shape.
    num_classes: labels must lie in [0, num_classes) (checked once, here).
    """

    def __init__(self, images, labels, *, batch_size: int, layout: str = "NHWC", dtype: str = "fp16",
                 config: AugmentConfig = AugmentConfig(), seed: int = 0, drop_last: bool = True,
                 num_classes: int = 10, world=None):
        import cupy

        self.layout = check_layout(layout)
        self.dtype = dtype
        self.config = config
        self.seed = int(seed)
        self.batch_size = int(batch_size)
        self.drop_last = drop_last
        # Data parallel (a resnet_native.distributed World of world_size > 1): each epoch this rank serves only its
        # share of the epoch's table, the columns distributed.shard_indices gives it (disjoint between ranks).
        self.world = world if world is not None and world.world_size > 1 else None
        images = np.asarray(images) if not hasattr(images, "__cuda_array_interface__") else images
        if images.ndim != 4 or images.shape[3] != 3 or images.dtype != np.uint8:
            raise ValueError(f"images: expected uint8 (N, H, W, 3), got {images.dtype} {images.shape}")
        if len(labels) != len(images):
            raise ValueError(f"labels: {len(labels)} labels for {len(images)} images")
        check_labels(labels, num_classes)
        if self.batch_size <= 0:
            raise ValueError(f"batch_size: expected > 0, got {batch_size}")
        self.images = cupy.ascontiguousarray(cupy.asarray(images))
        self.labels = cupy.asarray(labels, dtype=cupy.int32)
        self.lut = cupy.asarray(normalization_lut(dtype))
        self._out = {}
        self._downscaled = {}  # size -> the resident set at that size

    def __len__(self):
        n = self.epoch_images
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def num_images(self) -> int:
        return int(len(self.labels))

    @property
    def epoch_images(self) -> int:
        """The images this process serves per epoch (its share when sharded)."""
        n = self.num_images
        return n if self.world is None else n // self.world.world_size

    @property
    def image_size(self) -> int:
        """The resident images' side in pixels (CIFAR-10: 32)."""
        return int(self.images.shape[1])

    def _buffers(self, batch, h, w):
        """The (images, labels) output buffers of a batch size and image size, reused by every such batch."""
        import cupy

        key = (batch, h, w)
        if key not in self._out:
            shape = (batch, h, w, 3) if self.layout == "NHWC" else (batch, 3, h, w)
            self._out[key] = (cupy.empty(shape, dtype=self.lut.dtype), cupy.empty((batch,), dtype=cupy.int32))
        return self._out[key]

    def _source(self, images, size):
        """The epoch's uint8 source at `size` pixels: the resident set (or the given copy, e.g. AutoAugmented,
        checked to match it), downscaled when size is below the resident size."""
        if images is not None and tuple(images.shape) != tuple(self.images.shape):
            raise ValueError(f"images: expected {tuple(self.images.shape)}, got {tuple(images.shape)}")
        full = self.image_size
        if size is None or size == full:
            return self.images if images is None else images
        if not isinstance(size, int) or not 0 < size < full or self.images.shape[2] != full:
            raise ValueError(f"size: expected an int in (0, {full}] for square {full} x {full} images, got {size!r}")
        if images is not None:  # a new copy each epoch: downscaled each epoch
            return downscale_on_gpu(images, size)
        if size not in self._downscaled:
            self._downscaled[size] = downscale_on_gpu(self.images, size)
        return self._downscaled[size]

    def epoch(self, epoch: int, images=None, size: int | None = None):
        """Yield (x, labels) for every batch of the epoch. images: a replacement uint8 source of the same shape
        (e.g. this epoch's AutoAugmented copy), indexed like the resident set; size: the side of the epoch's
        images in pixels (default: the resident size), downscaled from the source."""
        import cupy

        src = self._source(images, size)
        _, h, w, _ = src.shape
        config = self.config.scaled(h, self.image_size)
        table = sample_epoch(self.seed, epoch, self.num_images, config, h, w)
        if self.world is not None:
            table = np.ascontiguousarray(table[:, shard_indices(self.num_images, self.world, epoch, self.seed)])
        table = cupy.asarray(table)
        for i in range(len(self)):
            start = i * self.batch_size
            batch = min(self.batch_size, self.epoch_images - start)
            out, labels = self._buffers(batch, h, w)
            launch_augment(src, table, start, batch, self.lut, out, layout=self.layout,
                           crop_padding=config.crop_padding, cutout=config.cutout, labels=self.labels,
                           labels_out=labels)
            yield out, labels


def view_params(n: int, view=None) -> tuple[np.ndarray, int]:
    """(table, crop_padding) that make the augmentation kernel write test-time view `view` (a data.tta_views.View:
    shifted by (dy, dx) after an optional mirror, black outside) of images 0..n-1, or each image itself (None): the
    view is the crop at offset padding + shift of the image zero-padded by the largest shift, then flipped."""
    if view is None:
        return identity_params(n), 0
    padding = max(abs(view.dy), abs(view.dx))
    table = identity_params(n, AugmentConfig(crop_padding=padding, flip=False, cutout=0))
    table[ROW_OFFSET_Y] += view.dy
    table[ROW_OFFSET_X] += view.dx
    table[ROW_FLIP] = int(view.mirror)
    return table, padding


def normalize_on_gpu(images, *, layout: str = "NHWC", dtype: str = "fp16", out=None, view=None):
    """Normalise a whole uint8 (N, H, W, 3) set without augmentation (evaluation), with the training kernel; with
    `view` (data.tta_views.View), that test-time view of each image, in the same single pass."""
    import cupy

    images = cupy.ascontiguousarray(cupy.asarray(images, dtype=cupy.uint8))
    n, h, w, _ = images.shape
    lut = cupy.asarray(normalization_lut(dtype))
    if out is None:
        out = cupy.empty((n, h, w, 3) if layout == "NHWC" else (n, 3, h, w), dtype=lut.dtype)
    table, padding = view_params(n, view)
    launch_augment(images, cupy.asarray(table), 0, n, lut, out, layout=layout, crop_padding=padding, cutout=0)
    return out


def normalize_on_host(images: np.ndarray, *, layout: str = "NHWC", dtype: str = "fp32", view=None) -> np.ndarray:
    """NumPy twin of normalize_on_gpu (bit-identical): uint8 (N, H, W, 3) -> storage dtype, in the layout."""
    images = np.ascontiguousarray(images, dtype=np.uint8)
    table, padding = view_params(len(images), view)
    return apply_reference(images, table, normalization_lut(dtype), layout=layout, crop_padding=padding, cutout=0)
