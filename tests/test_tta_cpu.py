"""Flip test-time augmentation without a GPU: the trainer's Evaluation on a host model, and CIFAR10Classifier's CPU
backends, against the mean of the logits of each image and its mirror image computed independently here; the
engine's and the classifier's tta argument checked before any GPU work."""

import numpy as np
import pytest
from test_classifier_cpu import StubNet, no_gpu, quiet_classifier, release_dir, use_backend  # noqa: F401
from test_release_cpu import make_fake_run  # noqa: F401  (release_dir's)

import resnet_native as rn
from resnet_native.data.augment import normalize_on_host
from resnet_native.inference.flip_tta import tta_mode
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
    evaluation = Evaluation(host_model, x, labels, batch_size, x_flipped=x_flipped)
    for _ in range(2):  # the logits buffer is reused
        loss, acc, tta_loss, tta_acc, seconds = evaluation()
        assert (loss, acc) == pytest.approx(scores(plain, labels), rel=1e-12)
        assert (tta_loss, tta_acc) == pytest.approx(scores((plain + mirrored) / 2, labels), rel=1e-12)
        assert seconds >= 0.0 and evaluation.tta and not evaluation.captured
    assert evaluate(host_model, x, labels, batch_size) == pytest.approx((loss, acc), rel=1e-12)  # no TTA: 2 figures
    with pytest.raises(ValueError, match="x_flipped: expected the test set's shape"):
        Evaluation(host_model, x, labels, batch_size, x_flipped=x_flipped[:5])


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
    for bad in ("mirror", True, 1):
        with pytest.raises(ValueError, match="tta"):
            tta_mode(bad)
    with pytest.raises(ValueError, match="tta: expected one of"):  # before any GPU is needed
        rn.InferenceEngine(rn.ResNet18(num_classes=10, seed=0), tta="flop")
    with pytest.raises(ValueError, match="tta: expected one of"):
        CIFAR10Classifier("A", models_dir="/nonexistent", tta="both")
