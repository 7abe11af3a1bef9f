"""Test-time augmentation without a GPU: the views against their definition pixel by pixel; the trainer's
Evaluation on a host model, and CIFAR10Classifier's CPU backends, against the weighted mean of the views' logits
computed independently here; the engine's and the classifier's tta argument checked before any GPU work."""

import numpy as np
import pytest
from test_classifier_cpu import StubNet, no_gpu, quiet_classifier, release_dir, use_backend  # noqa: F401
from test_release_cpu import make_fake_run  # noqa: F401  (release_dir's)

import resnet_native as rn
from resnet_native.data.augment import normalize_on_host
from resnet_native.data.tta_views import VIEWS, View, tta_mode, tta_views, view_images, write_view
from resnet_native.reference.loss import cross_entropy_forward
from resnet_native.release.classifier import CIFAR10Classifier
from resnet_native.training.evaluation import Evaluation, evaluate


def scores(logits, labels):
    """(mean cross-entropy, accuracy) of float64 logits, by the reference loss."""
    loss, correct = np.zeros(1), np.zeros(1, np.int32)
    loss_sum, correct_sum = np.zeros(1), np.zeros(1)
    cross_entropy_forward(logits, labels, 0.0, loss, correct, loss_sum, correct_sum)
    return loss_sum[0] / len(labels), correct_sum[0] / len(labels)


@pytest.fixture(scope="module")
def host_model():
    return rn.ResNet18(num_classes=10, layout="NHWC", precision="fp32", seed=1).to_host(np.float64).eval()


@pytest.mark.parametrize("batch_size", [4, 5])  # whole batches, and a last partial one
def test_the_evaluation_scores_the_mean_logits_of_both_views(host_model, rng, batch_size):
    images = rng.integers(0, 256, (10, 8, 8, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 10).astype(np.int32)
    x = normalize_on_host(images, layout="NHWC", dtype="fp32").astype(np.float64)
    x_flipped = normalize_on_host(np.ascontiguousarray(images[:, :, ::-1]), layout="NHWC", dtype="fp32")
    x_flipped = x_flipped.astype(np.float64)
    np.testing.assert_array_equal(x_flipped, x[:, :, ::-1])  # normalising commutes with the mirror
    plain = np.array(host_model.forward(x, train=False))
    mirrored = np.array(host_model.forward(x_flipped, train=False))
    evaluation = Evaluation(host_model, x, labels, batch_size, x_views=[x_flipped])
    for _ in range(2):  # the logits buffer is reused
        loss, acc, tta_loss, tta_acc, seconds = evaluation()
        assert (loss, acc) == pytest.approx(scores(plain, labels), rel=1e-12)
        assert (tta_loss, tta_acc) == pytest.approx(scores((plain + mirrored) / 2, labels), rel=1e-12)
        assert seconds >= 0.0 and evaluation.tta and not evaluation.captured
    assert evaluate(host_model, x, labels, batch_size) == pytest.approx((loss, acc), rel=1e-12)  # no TTA: 2 figures
    with pytest.raises(ValueError, match=r"x_views\[0\]: expected the test set's shape"):
        Evaluation(host_model, x, labels, batch_size, x_views=[x_flipped[:5]])
    for weights in ((0.5,), (0.7, 0.7), (1.5, -0.5)):
        with pytest.raises(ValueError, match="view_weights: expected 2 positive weights"):
            Evaluation(host_model, x, labels, batch_size, x_views=[x_flipped], view_weights=weights)


def test_the_classifier_on_a_model_averages_both_views(release_dir, rng):  # noqa: F811
    images = rng.integers(0, 256, (7, 32, 32, 3), dtype=np.uint8)
    plain = CIFAR10Classifier("A", models_dir=release_dir.parent, model=StubNet(), batch_size=3)
    tta = CIFAR10Classifier("A", models_dir=release_dir.parent, model=StubNet(), batch_size=3, tta="flip")
    want = (plain.logits(images).astype(np.float64) + plain.logits(images[:, :, ::-1])) / 2
    np.testing.assert_array_equal(tta.logits(images), want.astype(np.float32))
    assert tta.tta == "flip" and plain.tta == "none"
    single = tta.logits(images[2])
    assert single.shape == (10,)  # a batch of one: BLAS may block the sums differently, hence the tolerance
    np.testing.assert_allclose(single, tta.logits(images)[2], rtol=1e-5, atol=1e-6)
    assert tta.logits([]).shape == (0, 10)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_the_cpu_backends_average_both_views(release_dir, rng, monkeypatch, no_gpu, backend):  # noqa: F811
    """The reference backend (and onnxruntime) with TTA: the mean of the logits of x and x[:, :, ::-1], each
    computed by a classifier without it."""
    use_backend(backend, monkeypatch)
    images = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    plain = quiet_classifier("A", models_dir=release_dir.parent, batch_size=2)
    tta = quiet_classifier("A", models_dir=release_dir.parent, batch_size=2, tta="flip")
    assert plain.backend == tta.backend == backend
    first, second = plain.logits(images), plain.logits(np.ascontiguousarray(images[:, :, ::-1]))
    want = ((first.astype(np.float64) + second) / 2).astype(np.float32)
    np.testing.assert_array_equal(tta.logits(images), want)
    assert not np.array_equal(first, second)  # the mirror images are other inputs
    assert tta.predict(images).tolist() == np.argmax(want, axis=1).tolist()


def test_the_tta_argument_is_checked_first():
    assert tta_mode(None) == "none" and tta_mode("flip") == "flip" and tta_mode("none") == "none"
    assert tta_mode("flip-shift") == "flip-shift"
    for bad in ("mirror", True, 1):
        with pytest.raises(ValueError, match="tta"):
            tta_mode(bad)
    with pytest.raises(ValueError, match="tta: expected one of"):  # before any GPU is needed
        rn.InferenceEngine(rn.ResNet18(num_classes=10, seed=0), tta="flop")
    with pytest.raises(ValueError, match="tta: expected one of"):
        CIFAR10Classifier("A", models_dir="/nonexistent", tta="both")


def view_by_definition(images, view: View, fill):
    """out[n, y, x] = images[n, y + dy, m(x) + dx], `fill` outside: the docstring's formula, one pixel at a time."""
    n, height, width, _ = images.shape
    out = np.empty_like(images)
    for y in range(height):
        for x in range(width):
            sy, sx = y + view.dy, (width - 1 - x if view.mirror else x) + view.dx
            out[:, y, x] = images[:, sy, sx] if 0 <= sy < height and 0 <= sx < width else fill
    return out


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_each_view_is_its_definition(rng, layout):
    images = rng.integers(0, 256, (3, 5, 7, 3), dtype=np.uint8)  # not square: the axes cannot be confused
    fill = np.array([-1.5, 0.25, 2.0])  # a normalised black pixel: one value a channel
    values = images.astype(np.float64)
    views = {v for mode in VIEWS.values() for v in mode} | {View(2, -3, True, 0.5), View(-1, 2, False, 0.5)}
    for view in views:
        want = view_by_definition(values, view, fill)
        src = values
        if layout == "NCHW":
            src, want = values.transpose(0, 3, 1, 2).copy(), want.transpose(0, 3, 1, 2)
        out = np.full_like(src, np.nan)  # poisoned: every element must be written
        write_view(src, out, view, layout=layout, fill=fill[:, None, None] if layout == "NCHW" else fill)
        np.testing.assert_array_equal(out, want, err_msg=str(view))
        np.testing.assert_array_equal(view_images(images, view), view_by_definition(images, view, 0))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_the_augmentation_table_of_a_view_writes_that_view(rng, layout):
    # The trainer's test-set views come from the augmentation kernel (a crop of the zero-padded image, then a
    # flip); its reference, given view_params' table, must equal the view normalised.
    images = rng.integers(0, 256, (4, 6, 9, 3), dtype=np.uint8)
    views = {v for mode in VIEWS.values() for v in mode} | {View(2, -3, True, 0.5), View(-1, 2, False, 0.5)}
    for view in views:
        for dtype in ("fp32", "fp16"):
            want = normalize_on_host(view_images(images, view), layout=layout, dtype=dtype)
            np.testing.assert_array_equal(normalize_on_host(images, layout=layout, dtype=dtype, view=view), want,
                                          err_msg=f"{view} {dtype}")


def test_the_modes_views_and_weights():
    assert tta_views(None) == tta_views("none") == (View(0, 0, False, 1.0),)
    assert [v.mirror for v in tta_views("flip")] == [False, True]
    shift = tta_views("flip-shift")
    assert [(v.dy, v.dx, v.mirror) for v in shift] == [(0, 0, False), (0, 0, True), (-1, -1, False),
                                                        (-1, -1, True), (1, 1, False), (1, 1, True)]
    assert [v.weight for v in shift] == [0.25, 0.25, 0.125, 0.125, 0.125, 0.125]
    with pytest.raises(ValueError, match="tta: expected one of"):
        tta_views("shift")


def test_the_evaluation_weighs_every_view(host_model, rng):
    images = rng.integers(0, 256, (9, 8, 8, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 9).astype(np.int32)

    def normalised(pixels):
        return normalize_on_host(pixels, layout="NHWC", dtype="fp32").astype(np.float64)

    views = tta_views("flip-shift")
    sets = [normalised(view_images(images, v)) for v in views]
    want = sum(v.weight * np.array(host_model.forward(x, train=False)) for v, x in zip(views, sets, strict=True))
    evaluation = Evaluation(host_model, sets[0], labels, 4, x_views=sets[1:], view_weights=[v.weight for v in views])
    for _ in range(2):
        loss, acc, tta_loss, tta_acc, _ = evaluation()
        assert (tta_loss, tta_acc) == pytest.approx(scores(want, labels), rel=1e-12)
        assert (loss, acc) == pytest.approx(scores(np.array(host_model.forward(sets[0], train=False)), labels))


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_the_cpu_backends_weigh_the_shifted_views(release_dir, rng, monkeypatch, no_gpu, backend):  # noqa: F811
    use_backend(backend, monkeypatch)
    images = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    plain = quiet_classifier("A", models_dir=release_dir.parent, batch_size=2)
    tta = quiet_classifier("A", models_dir=release_dir.parent, batch_size=2, tta="flip-shift")
    views = tta_views("flip-shift")
    want = sum(v.weight * plain.logits(view_images(images, v)).astype(np.float64) for v in views)
    np.testing.assert_array_equal(tta.logits(images), want.astype(np.float32))
    assert tta.predict(images).tolist() == np.argmax(want, axis=1).tolist()
