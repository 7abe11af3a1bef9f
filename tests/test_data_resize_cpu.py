"""Progressive resizing's downscaled copies, checked without a GPU: the resize weights, the NumPy reference against
Pillow's antialiased bilinear reduction, and the augmentation scaled with the images (the GPU copy is compared with
the reference in tests/test_data_gpu.py)."""

import numpy as np
import pytest
from PIL import Image

from resnet_native.data.augment import AugmentConfig
from resnet_native.data.resize import downscale_reference, resize_weights


@pytest.mark.parametrize("out_size", [8, 16, 20, 24, 31, 32])
def test_resize_weights_are_a_normalised_local_filter(out_size):
    w = resize_weights(out_size, 32)
    assert w.shape == (out_size, 32) and (w >= 0).all()
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # Each output pixel draws on source pixels within the filter's support around its centre, and no others.
    scale = 32 / out_size
    for i, row in enumerate(w):
        used = np.flatnonzero(row)
        assert np.abs(used + 0.5 - (i + 0.5) * scale).max() < scale
    if out_size == 32:
        np.testing.assert_array_equal(w, np.eye(32))


@pytest.mark.parametrize("size", [16, 24, 20])
def test_downscale_equals_pillows_bilinear_reduction(rng, size):
    images = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    got = downscale_reference(images, size)
    assert got.shape == (6, size, size, 3) and got.dtype == np.uint8
    want = np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.Resampling.BILINEAR))
                     for im in images])
    # Pillow works in fixed point and rounds to 8 bits between its two passes: the two agree to one level.
    assert np.abs(got.astype(int) - want).max() <= 1


def test_downscale_keeps_flat_images_flat_and_the_range(rng):
    flat = np.full((2, 32, 32, 3), 200, np.uint8)
    np.testing.assert_array_equal(downscale_reference(flat, 16), np.full((2, 16, 16, 3), 200, np.uint8))
    extremes = np.where(rng.random((4, 32, 32, 3)) < 0.5, 0, 255).astype(np.uint8)
    out = downscale_reference(extremes, 24)
    assert out.min() >= 0 and out.max() <= 255  # a weighted mean: never outside its inputs


def test_downscale_names_what_it_refuses(rng):
    with pytest.raises(ValueError, match="images: expected uint8"):
        downscale_reference(rng.random((2, 32, 32, 3)), 16)
    with pytest.raises(ValueError, match="size: expected 0 < out_size <= in_size"):
        downscale_reference(np.zeros((1, 32, 32, 3), np.uint8), 40)
    with pytest.raises(ValueError, match="size"):
        resize_weights(0, 32)


def test_augmentation_scales_with_the_images():
    cfg = AugmentConfig(crop_padding=4, flip=True, cutout=16)
    assert cfg.scaled(32, 32) is cfg
    assert cfg.scaled(16, 32) == AugmentConfig(crop_padding=2, flip=True, cutout=8)
    assert cfg.scaled(24, 32) == AugmentConfig(crop_padding=3, flip=True, cutout=12)
    assert cfg.scaled(20, 32) == AugmentConfig(crop_padding=3, flip=True, cutout=10)  # 2.5 rounds up
    assert AugmentConfig(crop_padding=0, flip=False, cutout=0).scaled(16, 32) == AugmentConfig(0, False, 0)
