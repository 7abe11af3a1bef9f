"""The augmentation kernel on the GPU equals its NumPy reference bit for bit (every dtype and layout)."""

import math
from fractions import Fraction

import numpy as np
import pytest

from resnet_native.data import augment as aug
from resnet_native.data.augment import AugmentConfig, apply_reference, normalization_lut, sample_epoch

pytestmark = pytest.mark.gpu

CUTOUT = AugmentConfig(crop_padding=4, flip=True, cutout=16)
BITS = {2: np.uint16, 4: np.uint32}


def poisoned(cp, shape, dtype):
    """All-ones bits: NaN in fp32/fp16/bf16, so any element the kernel fails to write shows up."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return cp.full(n, 255, dtype=cp.uint8).view(dtype).reshape(shape)


def as_bits(a):
    a = np.ascontiguousarray(a)
    return a.view(BITS[a.dtype.itemsize])


@pytest.mark.parametrize("dtype", ["fp32", "tf32", "fp16", "bf16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_kernel_equals_reference(rng, dtype, layout):
    import cupy as cp

    images = rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
    table = sample_epoch(5, 1, len(images), CUTOUT)
    lut = normalization_lut(dtype)
    start, batch = 9, 37
    shape = (batch, 32, 32, 3) if layout == "NHWC" else (batch, 3, 32, 32)
    out = poisoned(cp, shape, lut.dtype)
    aug.launch_augment(cp.asarray(images), cp.asarray(table), start, batch, cp.asarray(lut), out, layout=layout,
                       crop_padding=4, cutout=16)
    got = out.get()
    want = apply_reference(images, table[:, start:start + batch], lut, layout=layout, crop_padding=4, cutout=16)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(as_bits(got), as_bits(want))
    assert (as_bits(got) != np.iinfo(as_bits(got).dtype).max).all()  # every element written


def test_kernel_non_square_images(rng):
    import cupy as cp

    images = rng.integers(0, 256, (10, 20, 28, 3), dtype=np.uint8)
    cfg = AugmentConfig(crop_padding=3, flip=True, cutout=7)
    table = sample_epoch(2, 0, 10, cfg, height=20, width=28)
    lut = normalization_lut("fp16")
    for layout in ("NHWC", "NCHW"):
        shape = (10, 20, 28, 3) if layout == "NHWC" else (10, 3, 20, 28)
        out = poisoned(cp, shape, lut.dtype)
        aug.launch_augment(cp.asarray(images), cp.asarray(table), 0, 10, cp.asarray(lut), out, layout=layout,
                           crop_padding=3, cutout=7)
        want = apply_reference(images, table, lut, layout=layout, crop_padding=3, cutout=7)
        np.testing.assert_array_equal(as_bits(out.get()), as_bits(want))


@pytest.mark.parametrize("drop_last", [True, False])
def test_gpu_augmenter_epoch(rng, drop_last):
    images = rng.integers(0, 256, (100, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 100).astype(np.int32)
    a = aug.GpuAugmenter(images, labels, batch_size=32, layout="NHWC", dtype="fp16", config=CUTOUT, seed=3,
                         drop_last=drop_last)
    assert len(a) == (3 if drop_last else 4)
    table = sample_epoch(3, 4, 100, CUTOUT)
    lut = normalization_lut("fp16")
    batches = [(x.get(), y.get()) for x, y in a.epoch(4)]
    assert len(batches) == len(a)
    for i, (x, y) in enumerate(batches):
        cols = table[:, i * 32:(i + 1) * 32]
        np.testing.assert_array_equal(as_bits(x), as_bits(apply_reference(images, cols, lut, cutout=16)))
        np.testing.assert_array_equal(y, labels[cols[aug.ROW_INDEX]])
        assert y.dtype == np.int32
    if not drop_last:
        assert batches[-1][0].shape == (4, 32, 32, 3)
    # Same seed and epoch -> the same batches from a fresh augmenter; another epoch -> different ones.
    b = aug.GpuAugmenter(images, labels, batch_size=32, layout="NHWC", dtype="fp16", config=CUTOUT, seed=3)
    x0 = next(iter(b.epoch(4)))[0].get()
    np.testing.assert_array_equal(as_bits(x0), as_bits(batches[0][0]))
    assert not np.array_equal(as_bits(next(iter(b.epoch(5)))[0].get()), as_bits(x0))


def test_gpu_augmenter_replacement_source(rng):
    import cupy as cp

    images = rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
    other = rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(64, dtype=np.int32) % 10
    a = aug.GpuAugmenter(images, labels, batch_size=64, layout="NCHW", dtype="fp32", config=CUTOUT, seed=0)
    x, _ = next(iter(a.epoch(0, images=cp.asarray(other))))
    want = apply_reference(other, sample_epoch(0, 0, 64, CUTOUT), normalization_lut("fp32"), layout="NCHW",
                           cutout=16)
    np.testing.assert_array_equal(x.get(), want)
    with pytest.raises(ValueError, match="images"):
        next(iter(a.epoch(0, images=cp.asarray(other[:10]))))


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_normalize_on_gpu_equals_host(rng, dtype, layout):
    images = rng.integers(0, 256, (50, 32, 32, 3), dtype=np.uint8)
    got = aug.normalize_on_gpu(images, layout=layout, dtype=dtype).get()
    want = aug.normalize_on_host(images, layout=layout, dtype=dtype)
    np.testing.assert_array_equal(as_bits(got), as_bits(want))


def test_launch_validates_arguments(rng):
    import cupy as cp

    images = cp.asarray(rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8))
    table = cp.asarray(sample_epoch(0, 0, 4, CUTOUT))
    lut = cp.asarray(normalization_lut("fp16"))
    out = cp.empty((4, 32, 32, 3), cp.float16)
    with pytest.raises(ValueError, match="out: expected shape"):
        aug.launch_augment(images, table, 0, 4, lut, cp.empty((4, 3, 32, 32), cp.float16))
    with pytest.raises(ValueError, match="batch"):
        aug.launch_augment(images, table, 2, 4, lut, out)
    with pytest.raises(TypeError, match="params: expected an int32"):
        aug.launch_augment(images, table.astype(cp.int64), 0, 4, lut, out)
    with pytest.raises(TypeError, match="out: expected a float32"):  # out must have lut's dtype
        aug.launch_augment(images, table, 0, 4, cp.asarray(normalization_lut("fp32")), out)
    with pytest.raises(TypeError, match="images: expected a uint8"):
        aug.launch_augment(images.astype(cp.float32), table, 0, 4, lut, out)


def test_kernel_gathers_labels_and_contains_bad_indices(rng):
    import cupy as cp

    images = rng.integers(0, 256, (30, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 30).astype(np.int32)
    table = sample_epoch(3, 4, 30, CUTOUT)
    table[aug.ROW_INDEX, 12] = 30  # outside the set
    table[aug.ROW_INDEX, 13] = -7
    lut = normalization_lut("fp16")
    out = poisoned(cp, (20, 32, 32, 3), lut.dtype)
    labels_out = cp.full(20, 12345, cp.int32)
    aug.launch_augment(cp.asarray(images), cp.asarray(table), 5, 20, cp.asarray(lut), out, crop_padding=4,
                       cutout=16, labels=cp.asarray(labels), labels_out=labels_out)
    columns = table[aug.ROW_INDEX, 5:25]
    known = (columns >= 0) & (columns < 30)
    np.testing.assert_array_equal(labels_out.get(), np.where(known, labels[np.clip(columns, 0, 29)], -1))
    good = np.flatnonzero(known)
    want = apply_reference(images, table[:, 5:25][:, good], lut, crop_padding=4, cutout=16)
    got = out.get()
    np.testing.assert_array_equal(as_bits(got[good]), as_bits(want))
    # The bad columns read nothing: black pixels (lut[c][0]) outside their Cutout square, 0 inside it.
    black = apply_reference(np.zeros((1, 32, 32, 3), np.uint8), np.where(np.arange(6)[:, None] == 0, 0,
                            table[:, 5:25][:, ~known]), lut, crop_padding=4, cutout=16)
    np.testing.assert_array_equal(as_bits(got[~known]), as_bits(black))


@pytest.mark.parametrize("size", [16, 20, 24])
def test_downscaled_copy_equals_reference(rng, size):
    import cupy as cp

    from resnet_native.data.resize import downscale_on_gpu, downscale_reference, resize_weights

    images = rng.integers(0, 256, (2003, 32, 32, 3), dtype=np.uint8)
    images[:3] = np.array([0, 255, 128], np.uint8)[:, None, None, None]  # flat images, the extremes among them
    out = cp.full((len(images), size, size, 3), 7, dtype=cp.uint8)  # poisoned: every element must be written
    assert downscale_on_gpu(cp.asarray(images), size, out=out) is out
    got = out.get()
    want = downscale_reference(images, size)
    # The same float64 weights summed in another order than NumPy's: only a value whose exact sum (of those weights)
    # is a rounding tie, k + 1/2, may round the other way. Such ties are common here (the weights are simple
    # fractions), so each differing value is checked to be one.
    diff = np.abs(got.astype(int) - want)
    assert diff.max() <= 1 and (diff != 0).mean() < 1e-2
    wy, wx = resize_weights(size, 32), resize_weights(size, 32)
    for n, y, x, ch in zip(*np.nonzero(diff), strict=True):
        exact = sum(Fraction(wy[y, h]) * Fraction(wx[x, w]) * int(images[n, h, w, ch])
                    for h in np.flatnonzero(wy[y]) for w in np.flatnonzero(wx[x]))
        assert abs(exact - (math.floor(exact) + Fraction(1, 2))) < Fraction(1, 10**9), (n, y, x, ch, float(exact))
    with pytest.raises(ValueError, match="out: expected a C-contiguous uint8 array of shape"):
        downscale_on_gpu(cp.asarray(images), size, out=out[:-1])


@pytest.mark.parametrize("replacement", [False, True])
def test_gpu_augmenter_serves_a_downscaled_epoch(rng, replacement):
    import cupy as cp

    from resnet_native.data.resize import downscale_on_gpu

    images = rng.integers(0, 256, (80, 32, 32, 3), dtype=np.uint8)
    other = rng.integers(0, 256, (80, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 80).astype(np.int32)
    a = aug.GpuAugmenter(images, labels, batch_size=32, layout="NCHW", dtype="fp16", config=CUTOUT, seed=2)
    source = other if replacement else images
    small = downscale_on_gpu(cp.asarray(source), 16).get()  # against the reference in the test above
    scaled = CUTOUT.scaled(16, 32)
    table = sample_epoch(2, 3, 80, scaled, 16, 16)
    lut = normalization_lut("fp16")
    batches = [(x.get(), y.get()) for x, y in a.epoch(3, images=cp.asarray(other) if replacement else None, size=16)]
    assert len(batches) == 2
    for i, (x, y) in enumerate(batches):
        cols = table[:, i * 32:(i + 1) * 32]
        assert x.shape == (32, 3, 16, 16)
        want = apply_reference(small, cols, lut, layout="NCHW", crop_padding=2, cutout=8)
        np.testing.assert_array_equal(as_bits(x), as_bits(want))
        np.testing.assert_array_equal(y, labels[cols[aug.ROW_INDEX]])
    # The full-size epoch after it is untouched by the smaller one's buffers.
    x, _ = next(iter(a.epoch(4)))
    assert x.shape == (32, 3, 32, 32)
    with pytest.raises(ValueError, match="size: expected an int in"):
        next(iter(a.epoch(0, size=33)))
