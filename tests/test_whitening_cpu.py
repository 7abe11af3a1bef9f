"""The stem's whitening start (nn/whitening.py): the filters decorrelate the patches through the convolution itself
(so their layout is the one the op reads), come in sign pairs, do not depend on an eigenvector's sign, leave the
other filters alone, and refuse what they cannot whiten."""

import numpy as np
import pytest

from resnet_native.nn.layers import Conv2d
from resnet_native.nn.whitening import patch_whitening_filters, whiten_first_filters


def _correlated_images(rng, n=300, size=12):
    """Images whose neighbouring pixels and channels are correlated, as natural images' are."""
    x = rng.standard_normal((n, size, size, 3))
    x = x + np.roll(x, 1, axis=1) + 0.5 * np.roll(x, 1, axis=2)
    return x @ np.array([[1.0, 0.6, 0.2], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_the_convolution_with_the_first_filters_has_unit_uncorrelated_outputs(rng, layout):
    images = _correlated_images(rng)
    conv = Conv2d(3, 64, 3, padding=0, layout=layout, rng=rng).to_host()
    assert whiten_first_filters(conv, images, eps=1e-9) == 54
    x = images if layout == "NHWC" else images.transpose(0, 3, 1, 2)
    y = conv.forward(np.ascontiguousarray(x), train=False)
    y = (y if layout == "NHWC" else y.transpose(0, 2, 3, 1)).reshape(-1, 64)[:, :27]
    np.testing.assert_allclose(y.T @ y / len(y), np.eye(27), atol=1e-6)  # the second moments, as estimated


def test_filters_come_in_sign_pairs_largest_variance_first_and_eps_bounds_them(rng):
    images = _correlated_images(rng)
    f = patch_whitening_filters(images, 3)
    assert f.shape == (54, 3, 3, 3) and f.dtype == np.float32
    np.testing.assert_array_equal(f[27:], -f[:27])
    norms = np.linalg.norm(f[:27].reshape(27, -1), axis=1)
    assert np.all(np.diff(norms) >= 0)  # 1/sqrt(eigenvalue + eps) grows as the eigenvalues fall
    # eps caps the scale of directions of no variance: a constant channel adds eigenvalues of 0.
    flat = images.copy()
    flat[..., 2] = 0.0
    assert np.abs(patch_whitening_filters(flat, 3, eps=1e-2)).max() <= 1 / np.sqrt(1e-2) + 1e-5


def test_the_result_does_not_depend_on_an_eigenvector_s_sign_or_on_images_past_max_images(rng):
    images = _correlated_images(rng, n=40)
    f = patch_whitening_filters(images, 3, max_images=30)
    rows = f[:27].reshape(27, -1)
    assert np.all(rows[np.arange(27), np.argmax(np.abs(rows), axis=1)] > 0)  # each largest component positive
    changed = images.copy()
    changed[30:] = 1e3
    np.testing.assert_array_equal(patch_whitening_filters(changed, 3, max_images=30), f)


def test_the_other_filters_keep_their_values(rng):
    conv = Conv2d(3, 64, 3, padding=1, rng=rng)  # unplaced: its weight still on the host
    before = conv.state_dict()["weight"]
    whiten_first_filters(conv, _correlated_images(rng, n=20))
    after = conv.state_dict()["weight"]
    np.testing.assert_array_equal(after[54:], before[54:])
    assert not np.allclose(after[:54], before[:54])


def test_what_cannot_be_whitened_is_refused_by_name(rng):
    images = _correlated_images(rng, n=4, size=6)
    with pytest.raises(ValueError, match="conv: whitening needs .* at least 54 filters"):
        whiten_first_filters(Conv2d(3, 32, 3, rng=rng), images)
    with pytest.raises(ValueError, match=r"images: expected \(N, H, W, 3\)"):
        whiten_first_filters(Conv2d(3, 64, 3, rng=rng), images[..., :2])
    with pytest.raises(ValueError, match="images: expected"):
        patch_whitening_filters(images[:, :2, :2], 3)
    with pytest.raises(ValueError, match="images: expected"):
        patch_whitening_filters(images[:0], 3)
    with pytest.raises(ValueError, match="eps: expected a positive number"):
        patch_whitening_filters(images, 3, eps=0.0)
    with pytest.raises(ValueError, match="max_images: expected at least 1"):
        patch_whitening_filters(images, 3, max_images=0)
    bad = images.copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="images: hold NaN"):
        patch_whitening_filters(bad, 3)
