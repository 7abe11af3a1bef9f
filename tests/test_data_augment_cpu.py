"""GPU augmentation, checked without a GPU: host-side parameter sampling, the NumPy reference's properties, the
normalisation table, and the kernel's argument checks (the kernel itself, csrc/kernels/augment_u8.cu, is compared
with the reference bit for bit in tests/test_data_gpu.py)."""

import numpy as np
import pytest

from resnet_native.data import augment as aug
from resnet_native.data.augment import (
    MEAN,
    STD,
    AugmentConfig,
    apply_reference,
    cutout_box,
    identity_params,
    normalization_lut,
    sample_epoch,
)
from resnet_native.reference.bf16 import from_bf16_bits, to_bf16_bits

CUTOUT = AugmentConfig(crop_padding=4, flip=True, cutout=16)


def images_for(rng, n=12, h=32, w=32):
    # Values 1..255 so that a zero in the output can only come from padding (never from a real black pixel).
    return rng.integers(1, 256, (n, h, w, 3), dtype=np.uint8)


def raw_lut():
    """An identity 'normalisation' (pixel value as float) so that the reference output shows the source pixels."""
    return np.tile(np.arange(256, dtype=np.float32), (3, 1))


# ----------------------------------------------------------------------------------------------------------------
# (a) sampling


def test_sampling_ranges_and_permutation():
    n = 5000
    t = sample_epoch(7, 3, n, CUTOUT)
    assert t.shape == (6, n) and t.dtype == np.int32 and t.flags.c_contiguous
    assert sorted(t[aug.ROW_INDEX].tolist()) == list(range(n))
    for row in (aug.ROW_OFFSET_Y, aug.ROW_OFFSET_X):
        assert t[row].min() == 0 and t[row].max() == 8  # padding 4: offsets 0..8, all reached
        assert abs(np.bincount(t[row], minlength=9) / n - 1 / 9).max() < 0.02
    assert set(np.unique(t[aug.ROW_FLIP])) == {0, 1} and abs(t[aug.ROW_FLIP].mean() - 0.5) < 0.03
    for row in (aug.ROW_CUT_Y, aug.ROW_CUT_X):
        assert t[row].min() == 0 and t[row].max() == 31
        assert abs(t[row].mean() - 15.5) < 0.5


def test_sampling_is_reproducible_and_epoch_dependent():
    a = sample_epoch(0, 5, 1000, CUTOUT)
    np.testing.assert_array_equal(a, sample_epoch(0, 5, 1000, CUTOUT))
    assert not np.array_equal(a[aug.ROW_INDEX], sample_epoch(0, 6, 1000, CUTOUT)[aug.ROW_INDEX])
    assert not np.array_equal(a[aug.ROW_INDEX], sample_epoch(1, 5, 1000, CUTOUT)[aug.ROW_INDEX])


def test_sampling_options():
    t = sample_epoch(0, 0, 100, AugmentConfig(crop_padding=0, flip=False, cutout=0), shuffle=False)
    np.testing.assert_array_equal(t[aug.ROW_INDEX], np.arange(100))
    assert not t[aug.ROW_OFFSET_Y].any() and not t[aug.ROW_OFFSET_X].any() and not t[aug.ROW_FLIP].any()
    with pytest.raises(ValueError, match="cutout"):
        AugmentConfig(cutout=-1)
    with pytest.raises(ValueError, match="crop_padding"):
        AugmentConfig(crop_padding=1.5)


# ----------------------------------------------------------------------------------------------------------------
# The reference's properties (shapes, crop bounds, flip exactness, cutout area)


def test_alternate_flip_turns_every_image_each_epoch():
    n, alt = 4000, AugmentConfig(crop_padding=4, flip=True, cutout=16, alternate_flip=True)
    tables = [sample_epoch(3, e, n, alt) for e in range(4)]
    flips = []
    for t in tables:  # each image's flip, in image order
        f = np.empty(n, np.int32)
        f[t[aug.ROW_INDEX]] = t[aug.ROW_FLIP]
        flips.append(f)
    assert abs(flips[0].mean() - 0.5) < 0.03  # a random half first
    for e in range(1, 4):
        np.testing.assert_array_equal(flips[e], 1 - flips[e - 1])
    # Only the flips differ from the coin-per-epoch table: same order, crops and Cutout centres.
    plain = sample_epoch(3, 2, n, CUTOUT)
    rows = [r for r in range(aug.NUM_ROWS) if r != aug.ROW_FLIP]
    np.testing.assert_array_equal(tables[2][rows], plain[rows])
    assert not np.array_equal(tables[2][aug.ROW_FLIP], plain[aug.ROW_FLIP])
    # The setting survives scaling for progressive resizing.
    assert alt.scaled(20, 32).alternate_flip


def test_identity_params_reproduce_the_image(rng):
    images = images_for(rng)
    out = apply_reference(images, identity_params(len(images), CUTOUT), raw_lut(), crop_padding=4, cutout=0)
    assert out.shape == (12, 32, 32, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out, images.astype(np.float32))
    nchw = apply_reference(images, identity_params(len(images)), raw_lut(), layout="NCHW", crop_padding=0)
    assert nchw.shape == (12, 3, 32, 32)
    np.testing.assert_array_equal(nchw, images.transpose(0, 3, 1, 2).astype(np.float32))


def test_crop_is_a_shift_with_zero_padding(rng):
    images = images_for(rng, n=9 * 9)
    t = identity_params(len(images), CUTOUT)
    oy, ox = np.meshgrid(np.arange(9), np.arange(9), indexing="ij")
    t[aug.ROW_OFFSET_Y], t[aug.ROW_OFFSET_X] = oy.ravel(), ox.ravel()
    out = apply_reference(images, t, raw_lut(), crop_padding=4)
    for k in range(len(images)):
        padded = np.zeros((40, 40, 3), np.float32)
        padded[4:36, 4:36] = images[k]
        dy, dx = t[aug.ROW_OFFSET_Y, k], t[aug.ROW_OFFSET_X, k]
        np.testing.assert_array_equal(out[k], padded[dy:dy + 32, dx:dx + 32])
        # Exactly the padded rows/columns are zero (source pixels are >= 1).
        zero = abs(int(dy) - 4) * 32 + abs(int(dx) - 4) * 32 - abs(int(dy) - 4) * abs(int(dx) - 4)
        assert (out[k, ..., 0] == 0).sum() == zero


def test_flip_mirrors_the_crop(rng):
    images = images_for(rng)
    t = sample_epoch(3, 0, len(images), CUTOUT)
    t[aug.ROW_FLIP] = 0
    plain = apply_reference(images, t, raw_lut(), crop_padding=4)
    t[aug.ROW_FLIP] = 1
    flipped = apply_reference(images, t, raw_lut(), crop_padding=4)
    np.testing.assert_array_equal(flipped, plain[:, :, ::-1])


def test_cutout_area_and_value(rng):
    images = images_for(rng, n=200)
    t = identity_params(len(images), CUTOUT)
    t[aug.ROW_CUT_Y] = rng.integers(0, 32, len(images))
    t[aug.ROW_CUT_X] = rng.integers(0, 32, len(images))
    lut = normalization_lut("fp32")
    out = apply_reference(images, t, lut, crop_padding=4, cutout=16)
    base = apply_reference(images, t, lut, crop_padding=4, cutout=0)
    for k in range(len(images)):
        y0, y1, x0, x1 = cutout_box(t[aug.ROW_CUT_Y, k], t[aug.ROW_CUT_X, k], 16)
        assert 8 * 8 <= (y1 - y0) * (x1 - x0) <= 16 * 16
        changed = np.any(out[k] != base[k], axis=-1)
        expect = np.zeros((32, 32), bool)
        expect[y0:y1, x0:x1] = True
        np.testing.assert_array_equal(changed, expect)  # the clipped box, nothing else
        assert not out[k][expect].any()  # set to 0 after normalisation: the data-set mean
    # A centre in the middle gives the full 16x16 square.
    assert cutout_box(16, 16, 16) == (8, 24, 8, 24)
    assert cutout_box(0, 31, 16) == (0, 8, 23, 32)


def test_normalization_table():
    for dtype, np_dtype in (("fp32", np.float32), ("tf32", np.float32), ("fp16", np.float16), ("bf16", np.uint16)):
        lut = normalization_lut(dtype)
        assert lut.shape == (3, 256) and lut.dtype == np_dtype
    exact = (np.arange(256)[None] / 255.0 - np.array(MEAN)[:, None]) / np.array(STD)[:, None]
    np.testing.assert_allclose(normalization_lut("fp32"), exact, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(normalization_lut("fp16").astype(np.float64), exact, rtol=1e-3, atol=1e-3)
    bf = from_bf16_bits(normalization_lut("bf16")).astype(np.float64)
    np.testing.assert_allclose(bf, exact, rtol=8e-3, atol=8e-3)
    # The bf16 table is the package's bf16 rounding (to nearest even, of the float32 value) of the exact values.
    np.testing.assert_array_equal(normalization_lut("bf16"), to_bf16_bits(exact))
    assert to_bf16_bits(np.float32(1.0 + 2**-8)).item() == 0x3F80  # tie -> even (down)
    assert to_bf16_bits(np.float32(1.0 + 3 * 2**-8)).item() == 0x3F82  # tie -> even (up)
    assert to_bf16_bits(np.float32(-2.5)).item() == 0xC020


def test_normalize_on_host_matches_the_formula(rng):
    images = images_for(rng)
    x = aug.normalize_on_host(images, layout="NCHW", dtype="fp32")
    want = ((images / 255.0 - np.array(MEAN)) / np.array(STD)).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# Labels are checked once, on the host, when a data set enters the pipeline


def test_check_labels_names_the_first_bad_label():
    aug.check_labels(np.arange(10, dtype=np.int32), 10)
    with pytest.raises(ValueError, match=r"labels\[5\] = 10: expected a class index in \[0, 10\) \(2 label"):
        aug.check_labels(np.array([0, 1, 2, 3, 4, 10, 6, 11]), 10)
    with pytest.raises(ValueError, match=r"y\[2\] = -1"):
        aug.check_labels(np.array([0, 9, -1], np.int64), 10, "y")
    with pytest.raises(ValueError, match=r"labels\[0\] = 4294967296"):  # would wrap to 0 as int32
        aug.check_labels(np.array([2**32], np.int64), 10)
    with pytest.raises(ValueError, match="integer class indices"):
        aug.check_labels(np.array([0.5, 1.0]), 10)


def test_gpu_augmenter_rejects_out_of_range_labels(rng, monkeypatch):
    import sys
    import types

    # The augmenter's cupy calls on NumPy, so that a bad label can only be caught by the check itself.
    fake = types.SimpleNamespace(asarray=np.asarray, ascontiguousarray=np.ascontiguousarray, int32=np.int32,
                                 asnumpy=np.asarray)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    images = images_for(rng, n=8)
    labels = np.arange(8, dtype=np.int32)
    a = aug.GpuAugmenter(images, labels, batch_size=4)
    assert a.num_images == 8
    labels[6] = 10
    with pytest.raises(ValueError, match=r"labels\[6\] = 10"):
        aug.GpuAugmenter(images, labels, batch_size=4)
    aug.GpuAugmenter(images, np.arange(8) % 7, batch_size=4, num_classes=7)
    with pytest.raises(ValueError, match=r"labels\[7\] = 7: expected a class index in \[0, 7\)"):
        aug.GpuAugmenter(images, np.arange(8), batch_size=4, num_classes=7)


# ----------------------------------------------------------------------------------------------------------------
# The kernel's arguments, checked before any device access (fakes: no GPU needed)


def _augment_args(**over):
    from fake_arrays import fake

    args = dict(images=fake((4, 8, 8, 3), "uint8"), params=fake((6, 5), "int32"), batch_start=1, batch=3,
                lut=fake((3, 256), "float16"), out=fake((3, 8, 8, 3), "float16"), layout="NHWC", crop_padding=2,
                cutout=0, labels=fake((4,), "int32"), labels_out=fake((3,), "int32"))
    args.update(over)
    return args


def _launch(**over):
    aug.launch_augment(**{k: v for k, v in _augment_args(**over).items()})


def test_launch_augment_checks_every_argument():
    from fake_arrays import expect_device_stage, fake

    with expect_device_stage():
        _launch()
    with expect_device_stage():
        _launch(labels=None, labels_out=None)
    with expect_device_stage():  # NCHW output, bf16 bits
        _launch(lut=fake((3, 256), "uint16"), out=fake((3, 3, 8, 8), "uint16"), layout="NCHW")
    cases = [
        (dict(images=fake((4, 8, 8, 4), "uint8")), ValueError, "images: expected \\(N, H, W, 3\\)"),
        (dict(images=fake((4, 8, 8, 3), "float32")), TypeError, "images: expected a uint8"),
        (dict(params=fake((5, 5), "int32")), ValueError, "params: expected an int32 \\(6, M\\)"),
        (dict(params=fake((6, 5), "int64")), TypeError, "params: expected an int32"),
        (dict(batch_start=3), ValueError, "batch: \\[3, 6\\) is outside the table's 5 columns"),
        (dict(batch_start=-1), ValueError, "batch_start: expected an int >= 0"),
        (dict(batch=0), ValueError, "batch: expected an int >= 1"),
        (dict(batch=2**40), ValueError, "batch"),
        (dict(crop_padding=-2), ValueError, "crop_padding"),
        (dict(cutout=True), TypeError, "cutout"),
        (dict(lut=fake((256, 3), "float16")), ValueError, "lut: expected shape \\(3, 256\\)"),
        (dict(lut=fake((3, 256), "int32")), TypeError, "lut: expected a float32, float16 or bf16"),
        (dict(out=fake((3, 8, 8, 3), "float32")), TypeError, "out: expected a float16"),
        (dict(out=fake((3, 3, 8, 8), "float16")), ValueError, "out: expected shape \\(3, 8, 8, 3\\)"),
        (dict(layout="NCWH"), ValueError, "layout"),
        (dict(labels=None), ValueError, "labels: expected an int32 array of the images' labels"),
        (dict(labels_out=None), ValueError, "labels_out: expected an int32 array of shape \\(batch,\\)"),
        (dict(labels=fake((5,), "int32")), ValueError, "labels: expected shape \\(4,\\)"),
        (dict(labels_out=fake((4,), "int32")), ValueError, "labels_out: expected shape \\(3,\\)"),
        (dict(labels_out=fake((3,), "int32", readonly=True)), ValueError, "labels_out"),
    ]
    for over, error, message in cases:
        with pytest.raises(error, match=message):
            _launch(**over)


def test_launch_augment_refuses_overlapping_outputs():
    from fake_arrays import FakeCudaArray

    images = FakeCudaArray((4, 8, 8, 3), "uint8")
    with pytest.raises(ValueError, match="out must not share memory with images"):
        _launch(images=images, out=FakeCudaArray((3, 8, 8, 3), "float16", ptr=images.ptr))
    labels = FakeCudaArray((4,), "int32")
    with pytest.raises(ValueError, match="labels_out must not share memory with labels"):
        _launch(labels=labels, labels_out=FakeCudaArray((3,), "int32", ptr=labels.ptr))
