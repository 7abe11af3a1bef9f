"""AutoAugment's CIFAR-10 policy: the table, magnitudes, host-side sampling, each op, and the worker pool."""

import time

import numpy as np
import pytest
from PIL import Image, ImageOps

from resnet_native.data import autoaugment as aa
from resnet_native.data import autoaugment_batched as ab
from resnet_native.data import autoaugment_workers as aw
from resnet_native.data.autoaugment import CIFAR10_POLICY, OPS, apply_op, magnitude_table, sample_autoaugment

NO_MAGNITUDE = {"AutoContrast", "Equalize", "Invert"}


def test_policy_table():
    assert len(CIFAR10_POLICY) == 25
    for sub in CIFAR10_POLICY:
        assert len(sub) == 2
        for op, p, b in sub:
            assert op in OPS and 0.0 <= p <= 1.0
            assert (b is None) == (op in NO_MAGNITUDE) and (b is None or 0 <= b <= 9)
    assert CIFAR10_POLICY[0] == (("Invert", 0.1, None), ("Contrast", 0.2, 6))
    assert CIFAR10_POLICY[22] == (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3))
    assert CIFAR10_POLICY[24] == (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None))


def test_magnitude_table():
    t = magnitude_table()
    i = np.arange(10)
    np.testing.assert_allclose(t["ShearX"][0], 0.3 * i / 9, rtol=1e-6)
    np.testing.assert_allclose(t["TranslateY"][0], 150 / 331 * 32 * i / 9, rtol=1e-6)
    np.testing.assert_allclose(t["Rotate"][0], 30 * i / 9, rtol=1e-6)
    np.testing.assert_allclose(t["Sharpness"][0], 0.9 * i / 9, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(t["Solarize"][0], 255 - 255 * i / 9, rtol=1e-6)
    assert t["Posterize"][0].tolist() == [8, 8, 7, 7, 6, 6, 5, 5, 4, 4]
    assert [op for op, (_, signed) in t.items() if signed] == [
        "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"]
    assert aa.op_magnitude("TranslateX", 9, False) == pytest.approx(14.5015, abs=1e-3)
    assert aa.op_magnitude("Rotate", 2, True) == pytest.approx(-6.6667, abs=1e-3)
    assert aa.op_magnitude("Solarize", 2, True) == pytest.approx(198.3333, abs=1e-3)  # unsigned: never negated
    assert aa.op_magnitude("Equalize", None, True) == 0.0


def test_sampling_frequencies_and_reproducibility():
    n = 200_000
    c = sample_autoaugment(0, 0, n)
    assert c.shape == (n, 9) and c.dtype == np.int16
    assert not c[:, 5:].any()  # no crop, no flip unless asked
    counts = np.bincount(c[:, 0], minlength=25)
    assert abs(counts / n - 1 / 25).max() < 0.004
    probs = np.array([[s[0][1], s[1][1]] for s in CIFAR10_POLICY])
    for k in range(25):
        rows = c[c[:, 0] == k]
        for j in range(2):
            assert abs(rows[:, 1 + j].mean() - probs[k, j]) < 0.025
    assert not c[c[:, 0] == 14][:, 2].any()  # ("Invert", 0.0): never fires
    assert abs(c[:, 3:5].mean() - 0.5) < 0.01
    small = sample_autoaugment(0, 0, 1000)
    np.testing.assert_array_equal(small, sample_autoaugment(0, 0, 1000))
    assert not np.array_equal(sample_autoaugment(0, 1, 1000), small)
    assert not np.array_equal(sample_autoaugment(1, 0, 1000), small)


@pytest.fixture
def img(rng):
    return Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))


def test_pixel_ops_exact(img):
    x = np.asarray(img).astype(int)
    np.testing.assert_array_equal(np.asarray(apply_op(img, "Invert", 0.0)), 255 - x)
    np.testing.assert_array_equal(np.asarray(apply_op(img, "Posterize", 5.0)), x & 0b11111000)
    t = aa.op_magnitude("Solarize", 2, False)
    np.testing.assert_array_equal(np.asarray(apply_op(img, "Solarize", t)), np.where(x >= t, 255 - x, x))
    for op in ("Brightness", "Color", "Contrast", "Sharpness"):
        np.testing.assert_array_equal(np.asarray(apply_op(img, op, 0.0)), x)  # factor 1: unchanged
    np.testing.assert_array_equal(np.asarray(apply_op(img, "Equalize", 0.0)), np.asarray(ImageOps.equalize(img)))
    np.testing.assert_array_equal(np.asarray(apply_op(img, "AutoContrast", 0.0)),
                                  np.asarray(ImageOps.autocontrast(img)))
    darker = np.asarray(apply_op(img, "Brightness", -0.5)).astype(int)
    assert (darker <= x).all() and darker.mean() < 0.6 * x.mean()


def test_geometric_ops(img):
    x = np.asarray(img)
    right = np.asarray(apply_op(img, "TranslateX", 3.7))  # whole pixels: 3
    np.testing.assert_array_equal(right[:, 3:], x[:, :-3])
    assert not right[:, :3].any()
    up = np.asarray(apply_op(img, "TranslateY", -5.2))  # -5
    np.testing.assert_array_equal(up[:-5], x[5:])
    assert not up[-5:].any()
    np.testing.assert_array_equal(np.asarray(apply_op(img, "Rotate", 0.0)), x)
    np.testing.assert_array_equal(np.asarray(apply_op(img, "Rotate", 90.0)), np.rot90(x, 1))
    sheared = np.asarray(apply_op(img, "ShearX", 0.3))
    np.testing.assert_array_equal(sheared[0], x[0])  # centre (0, 0): the top row stays
    assert not np.array_equal(sheared[-1], x[-1]) and not sheared[-1, -9:].any()  # bottom row moved, black fill
    sheared_y = np.asarray(apply_op(img, "ShearY", -0.3))
    np.testing.assert_array_equal(sheared_y[:, 0], x[:, 0])
    with pytest.raises(ValueError, match="op"):
        apply_op(img, "Blur", 1.0)


def test_apply_autoaugment_follows_the_choice(img):
    x = np.asarray(img)
    no_crop = [0, 0, 0, 0]
    assert aa.apply_autoaugment(x, [0, 0, 0, 0, 0, *no_crop]) is x  # nothing fires: the image itself
    np.testing.assert_array_equal(aa.apply_autoaugment(x, [0, 1, 0, 0, 0, *no_crop]), 255 - x)  # 0: Invert
    both = aa.apply_autoaugment(x, [0, 1, 1, 0, 0, *no_crop])  # Invert then Contrast at bin 6 (negate=0 -> +)
    from PIL import ImageEnhance

    want = ImageEnhance.Contrast(ImageOps.invert(img)).enhance(1.0 + float(np.float32(0.6)))
    np.testing.assert_array_equal(both, np.asarray(want))


def test_crop_and_flip_come_first_as_in_torchvision(img):
    """crop (zero padding) -> flip -> AutoAugment: Invert then whitens the crop's black border."""
    x = np.asarray(img)
    padded = np.zeros((40, 40, 3), np.uint8)
    padded[4:36, 4:36] = x
    crop = padded[1:33, 7:39]
    np.testing.assert_array_equal(aa.crop_and_flip(x, 4, 1, 7, False), crop)
    np.testing.assert_array_equal(aa.crop_and_flip(x, 4, 1, 7, True), crop[:, ::-1])
    got = aa.apply_autoaugment(x, [0, 1, 0, 0, 0, 4, 1, 7, 1])  # sub-policy 0: Invert, after crop and flip
    np.testing.assert_array_equal(got, 255 - crop[:, ::-1])
    assert (got[:3] == 255).all()  # rows 0-2 came from the padding (row offset 1 of 4): inverted black


def test_crop_and_flip_sampling():
    n = 100_000
    c = sample_autoaugment(3, 2, n, crop_padding=4, flip=True)
    np.testing.assert_array_equal(c[:, :5], sample_autoaugment(3, 2, n)[:, :5])  # policy draws unchanged
    assert (c[:, 5] == 4).all()
    for col in (6, 7):
        counts = np.bincount(c[:, col], minlength=9)
        assert len(counts) == 9 and abs(counts / n - 1 / 9).max() < 0.01
    assert abs(c[:, 8].mean() - 0.5) < 0.01
    assert not np.array_equal(c, sample_autoaugment(3, 3, n, crop_padding=4, flip=True))
    with pytest.raises(ValueError, match="crop_padding"):
        aw.AutoAugmentWorkers(np.zeros((2, 32, 32, 3), np.uint8), workers=0, crop_padding=-1)


def test_workers_equal_serial_and_measure_throughput(rng, record_property):
    images = rng.integers(0, 256, (3000, 32, 32, 3), dtype=np.uint8)
    serial = aw.autoaugment_images(images, sample_autoaugment(5, 0, len(images)))
    assert (serial != images).any(axis=(1, 2, 3)).mean() > 0.5  # most images change
    with aw.AutoAugmentWorkers(images, seed=5, workers=2, chunk=256) as pool:
        t0 = time.perf_counter()
        got0 = pool.result(0)
        rate = len(images) / (time.perf_counter() - t0)
        np.testing.assert_array_equal(got0, serial)
        assert not got0.flags.writeable
        pool.prefetch(1)
        got1 = pool.result(1)
        assert not np.array_equal(got1, serial)
        np.testing.assert_array_equal(got1, aw.autoaugment_images(images, sample_autoaugment(5, 1, len(images))))
        pool.prefetch(2)
        with pytest.raises(RuntimeError, match="buffer"):
            pool.prefetch(4)  # slot 0 is still being filled for epoch 2
        np.testing.assert_array_equal(pool.result(2), aw.autoaugment_images(images, sample_autoaugment(5, 2, 3000)))
    with aw.AutoAugmentWorkers(images[:100], seed=5, workers=0) as inline:
        np.testing.assert_array_equal(inline.result(0), aw.autoaugment_images(images[:100],
                                                                               sample_autoaugment(5, 0, 100)))
    record_property("autoaugment_2_workers_images_per_s", round(rate))  # in --junitxml reports, not mid-dots
    assert rate > 500


# ----------------------------------------------------------------------------------------------------------------
# The batched NumPy path (what the workers run) against PIL, one image at a time


def _varied_images(rng, n=48):
    """Random images, few-valued ones (ties in every histogram), constant ones and ones with a constant channel
    (the identity tables of AutoContrast and Equalize), and low-contrast ones."""
    x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    q = n // 4
    x[q : 2 * q] = x[q : 2 * q] // 64 * 60 + 10
    x[2 * q : 2 * q + q // 2] = rng.integers(0, 256, (q // 2, 1, 1, 3), dtype=np.uint8)
    x[2 * q + q // 2 : 3 * q, :, :, 1] = 9
    x[3 * q :] = x[3 * q :] // 4 + 100
    return x


def test_batched_ops_equal_pil_at_every_magnitude_and_sign(rng):
    x = _varied_images(rng)
    table = magnitude_table()
    for op in OPS:
        values, signed = table[op]
        for b in (None,) if values is None else range(len(values)):
            for negate in (False, True) if signed else (False,):
                m = aa.op_magnitude(op, b, negate)
                want = np.stack([np.asarray(apply_op(Image.fromarray(xi), op, m)) for xi in x])
                np.testing.assert_array_equal(ab.apply_op_batch(x, op, m), want, err_msg=f"{op} magnitude {m}")
    with pytest.raises(ValueError, match="op"):
        ab.apply_op_batch(x, "Blur", 1.0)


@pytest.mark.parametrize("crop_padding,flip", [(0, False), (4, True)])
def test_batched_policy_equals_pil(rng, crop_padding, flip):
    images = np.concatenate([_varied_images(rng, 400), rng.integers(0, 256, (1600, 32, 32, 3), dtype=np.uint8)])
    choices = sample_autoaugment(11, 4, len(images), crop_padding=crop_padding, flip=flip)
    want = aa.autoaugment_images_pil(images, choices)
    out = np.empty_like(images)
    assert ab.autoaugment_batch(images, choices, out) is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(aw.autoaugment_images(images[:300], choices[:300]), want[:300])  # any split
    crops = np.stack([aa.crop_and_flip(im, *(int(v) for v in c[5:8]), bool(c[8]))
                      for im, c in zip(images, choices, strict=True)])
    np.testing.assert_array_equal(ab.crop_and_flip_batch(images, choices), crops)


def test_batched_path_refuses_mixed_crop_paddings(rng):
    images = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    choices = sample_autoaugment(0, 0, 4, crop_padding=4)
    choices[0, 5] = 2
    with pytest.raises(ValueError, match="crop padding"):
        ab.autoaugment_batch(images, choices)


# ----------------------------------------------------------------------------------------------------------------
# Against torchvision itself, where it is installed (the GPU machine has it)


def test_matches_torchvision(rng):
    tv_aa = pytest.importorskip("torchvision.transforms.autoaugment")
    InterpolationMode = pytest.importorskip("torchvision.transforms").InterpolationMode

    ref = tv_aa.AutoAugment(tv_aa.AutoAugmentPolicy.CIFAR10)
    assert [tuple(tuple(op) for op in sub) for sub in ref.policies] == [tuple(sub) for sub in CIFAR10_POLICY]
    space = ref._augmentation_space(10, [32, 32])
    mine = magnitude_table()
    for op, (values, signed) in space.items():
        if op in mine:
            assert mine[op][1] == signed, op
            if mine[op][0] is not None:
                np.testing.assert_allclose(mine[op][0], values.numpy(), rtol=1e-6, atol=1e-6, err_msg=op)
    for _ in range(20):
        img = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
        for op in OPS:
            values, signed = mine[op]
            for b in ((None,) if values is None else (1, 5, 9)):
                for negate in ((False, True) if signed else (False,)):
                    m = aa.op_magnitude(op, b, negate)
                    want = tv_aa._apply_op(img, op, m, interpolation=InterpolationMode.NEAREST, fill=None)
                    np.testing.assert_array_equal(np.asarray(apply_op(img, op, m)), np.asarray(want),
                                                  err_msg=f"{op} magnitude {m}")
