"""A release predicts what the model it came from predicts (exactly through the eval graph, within fp16 rounding
through the InferenceEngine that serves it), and measures inference throughput."""

import json

import numpy as np
import pytest
from PIL import Image
from test_train_gpu import SHORT_RUN_ARGS, SHORT_RUN_MIN_TEST_ACC, cfg_from

from resnet_native.data.augment import normalize_on_gpu
from resnet_native.data.cifar10 import load_cifar10
from resnet_native.formats import checkpoint
from resnet_native.release import build as release
from resnet_native.release.classifier import CIFAR10Classifier, softmax
from resnet_native.training import builders, loop
from resnet_native.training.config import TrainConfig

pytestmark = [pytest.mark.gpu, pytest.mark.data]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    from conftest import cifar_path

    data = load_cifar10(cifar_path(), cache_dir=tmp_path_factory.mktemp("cifar_cache"))
    cfg = cfg_from(SHORT_RUN_ARGS)
    out = tmp_path_factory.mktemp("run")
    summary = loop.Trainer(cfg, out, data=data, progress=False, tensorboard=False).run()
    return out, summary, data


def test_release_predicts_like_its_model(trained_run, tmp_path):
    import cupy as cp

    run, summary, data = trained_run
    path = release.release(run, "T", tmp_path / "cifar10_models", benchmark=True, bench_batch_size=500)
    metrics = json.loads((path / "metrics.json").read_text())
    assert metrics["inference_images_per_s"] > 1000 and metrics["inference_device"]
    assert metrics["test_accuracy"] == summary["best_test_acc"] and metrics["parameters"] == summary["parameters"]

    # The model it came from: the best checkpoint's weights in a fresh network, fed by the trainer's GPU kernel.
    state = checkpoint.load_checkpoint(run / "best.npz")
    model = builders.build_model(TrainConfig.from_saved(state["config"]))
    model.load_state_dict(state["model"])
    model.eval()
    images = data.test_images[:1000]
    x = normalize_on_gpu(images, layout="NHWC", dtype="fp16")
    want = cp.asnumpy(model.forward(x, train=False))

    # Served by the eval graph it came from (a model passed in), the release predicts exactly what the model does.
    exact = CIFAR10Classifier("T", models_dir=tmp_path / "cifar10_models", model=model)
    np.testing.assert_allclose(exact.predict_proba(images), softmax(want), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(exact.predict(images), np.argmax(want, axis=1))

    # Served by its InferenceEngine (BN folded into the convolutions, fed the uint8 pixels): the same function in
    # other fp16 roundings. The logits agree within fp16's tolerance, and the classes wherever the top two logits
    # are further apart than twice the largest logit error (no rounding of that size can swap them).
    clf = CIFAR10Classifier("T", models_dir=tmp_path / "cifar10_models")
    assert clf.engine is not None
    got = clf.logits(images)
    error = np.abs(got - want).max()
    assert error <= 1e-2 * np.abs(want).max(), error
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * error
    np.testing.assert_array_equal(clf.predict(images)[clear], np.argmax(want, axis=1)[clear])
    assert clear.sum() >= 100  # the comparison is not vacuous
    want = got  # the single-image forms below must give the engine's batch answers

    # Single-image forms give the batch's answers.
    for i in (0, 7):
        assert clf.predict(images[i]) == int(np.argmax(want[i]))
        assert clf.predict(Image.fromarray(images[i])) == int(np.argmax(want[i]))
    Image.fromarray(images[3]).save(tmp_path / "x.png")
    assert clf.predict(str(tmp_path / "x.png")) == int(np.argmax(want[3]))
    np.testing.assert_array_equal(clf.predict([images[5], images[6]]), np.argmax(want[5:7], axis=1))

    # On the whole test set the release scores what training recorded for these weights: exactly through the eval
    # graph (1e-3: ten images, in case the optimizer's fused fp16 weight copies round differently from a fresh
    # cast); through the engine, the accuracies can differ only on the images whose top two eval-graph logits are
    # within twice the largest logit error of each other.
    exact_logits = exact.logits(data.test_images)
    acc_exact = float((np.argmax(exact_logits, axis=1) == data.test_labels).mean())
    assert abs(acc_exact - metrics["test_accuracy"]) <= 1e-3, (acc_exact, metrics["test_accuracy"])
    engine_logits = clf.logits(data.test_images)
    error = np.abs(engine_logits - exact_logits).max()
    assert error <= 1e-2 * np.abs(exact_logits).max(), error
    top2 = np.sort(exact_logits, axis=1)[:, -2:]
    swappable = float((top2[:, 1] - top2[:, 0] <= 2 * error).mean())
    acc = float((np.argmax(engine_logits, axis=1) == data.test_labels).mean())
    assert abs(acc - acc_exact) <= swappable, (acc, acc_exact, swappable)
    assert acc > SHORT_RUN_MIN_TEST_ACC  # the short run's bar (see test_train_gpu.py)
