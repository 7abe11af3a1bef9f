"""Recipe C's pieces on the GPU: the engine's flip TTA against the float64 reference of both views and against two
plain calls, its flip-shift TTA against plain calls on the shifted images; the trainer's captured TTA evaluation
against the eager one and the weighted mean logits; the weights' average (one fused launch) against the float64
recurrence."""

import numpy as np
import pytest
from test_inference_gpu import _assert_close, _images, _model

import resnet_native as rn
from resnet_native.data.augment import normalize_on_gpu, normalize_on_host
from resnet_native.data.tta_views import tta_views, view_images
from resnet_native.inference import InferenceEngine
from resnet_native.optim import SGD, WeightAverage
from resnet_native.optim.ema import running_statistics
from resnet_native.optim.step import TrainStep
from resnet_native.training.builders import test_set_views as make_test_set_views  # not collected as a test
from resnet_native.training.config import TrainConfig
from resnet_native.training.evaluation import Evaluation

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")


def _host_twin(model):
    twin = rn.ResNet18(num_classes=10, layout="NHWC", precision="fp32", seed=0).to_host(np.float64)
    twin.load_state_dict(model.state_dict())
    return twin.eval()


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_the_engine_averages_the_logits_of_both_views(rng, layout):
    model = _model(rng, layout=layout)
    images = _images(rng, 21)  # split over 8s and padded
    host = cp.asnumpy(images)
    twin = _host_twin(model)
    mirrored = np.ascontiguousarray(host[:, :, ::-1])
    want = (twin.forward(normalize_on_host(host, dtype="fp32").astype(np.float64))
            + twin.forward(normalize_on_host(mirrored, dtype="fp32").astype(np.float64))) / 2
    with InferenceEngine(model, batch_sizes=(4, 8), layout=layout, deterministic=True, tta="flip") as tta, \
            InferenceEngine(model, batch_sizes=(4, 8), layout=layout, deterministic=True) as plain:
        got = tta(images)
        _assert_close(got, want, "fp16")
        two = (plain(images) + plain(cp.asarray(mirrored))) * np.float32(0.5)
        cp.testing.assert_array_equal(got, two)  # the same replays, the same fp32 arithmetic
        x = normalize_on_gpu(images, layout=layout, dtype="fp16")  # a normalised batch is mirrored alike
        cp.testing.assert_array_equal(tta(x), got)
        # A short batch replays the batch-4 plan, whose algorithms may differ from batch 8's: equal to the plain
        # engine's views at that batch size, close to the reference.
        short = tta(images[:3])
        cp.testing.assert_array_equal(short, (plain(images[:3]) + plain(cp.asarray(mirrored[:3]))) * np.float32(0.5))
        _assert_close(short, want[:3], "fp16")
        assert tta.capture_error is None and "tta='flip'" in repr(tta)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_the_engine_weighs_the_shifted_views_as_plain_calls_on_them(rng, layout):
    """Each view made from the staged input (a black pixel shifted in, as the input stage writes one) is the plain
    engine's input for the shifted uint8 images: the same replays, summed in the same fp32 order."""
    model = _model(rng, layout=layout)
    images = _images(rng, 21)
    host = cp.asnumpy(images)
    views = tta_views("flip-shift")
    with InferenceEngine(model, batch_sizes=(4, 8), layout=layout, deterministic=True, tta="flip-shift") as tta, \
            InferenceEngine(model, batch_sizes=(4, 8), layout=layout, deterministic=True) as plain:
        for n in (21, 3):  # chunks of 8 and a padded one; a short batch on the batch-4 plan
            got = tta(images[:n])
            want = plain(images[:n]) * np.float32(views[0].weight)
            for v in views[1:]:
                want = want + plain(cp.asarray(view_images(host[:n], v))) * np.float32(v.weight)
            cp.testing.assert_array_equal(got, want)
        x = normalize_on_gpu(images, layout=layout, dtype="fp16")  # a normalised batch gets the same views
        cp.testing.assert_array_equal(tta(x), tta(images))
        assert tta.capture_error is None and "tta='flip-shift'" in repr(tta)


def test_the_trainers_test_set_views_are_made_on_the_device_as_on_the_host(rng):
    host = rng.integers(0, 256, (37, 32, 32, 3), dtype=np.uint8)
    cfg = TrainConfig.from_dict({"epochs": 1, "optimizer": {"lr": 0.1}, "tta": "flip-shift", "precision": "fp16",
                                 "layout": "NHWC"})
    arrays, weights = make_test_set_views(cfg, host)
    views = tta_views("flip-shift")
    assert weights == tuple(v.weight for v in views) and len(arrays) == len(views) - 1
    for v, got in zip(views[1:], arrays, strict=True):
        device = view_images(cp.asarray(host), v)
        np.testing.assert_array_equal(cp.asnumpy(device), view_images(host, v))
        np.testing.assert_array_equal(cp.asnumpy(got), normalize_on_host(view_images(host, v), dtype="fp16"))


def test_the_captured_tta_evaluation_replays_the_eager_one(rng):
    model = _model(rng)
    images = _images(rng, 2500)
    host = cp.asnumpy(images)
    x = normalize_on_gpu(images)
    views = tta_views("flip-shift")
    x_views = [normalize_on_gpu(view_images(host, v)) for v in views[1:]]
    weights = [v.weight for v in views]
    labels = cp.asarray(rng.integers(0, 10, 2500).astype(np.int32))
    eager = Evaluation(model, x, labels, 1000, x_views=x_views, view_weights=weights)
    captured = Evaluation(model, x, labels, 1000, cuda_graph=True, x_views=x_views, view_weights=weights)
    logits = sum(w * model.forward(v, train=False) for w, v in zip(weights, [x, *x_views], strict=True))
    want_acc = float((cp.argmax(logits, axis=1) == labels).mean())
    for round_ in range(3):  # warm-up, capture, replay
        a, b = eager(), captured()
        assert a[:4] == b[:4] and b[4] > 0, (round_, a, b)
        assert b[3] == pytest.approx(want_acc, abs=1.5e-4)  # ties aside: the mean logits' accuracy
        assert captured.captured == (round_ >= 1) and captured.capture_error is None
    captured.reset()


def test_the_average_on_the_gpu_follows_the_float64_recurrence(rng):
    model = rn.ResNet18(num_classes=10, precision="fp16", seed=0).cuda()
    shadow = rn.ResNet18(num_classes=10, precision="fp16", seed=1).cuda()
    opt = SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = TrainStep(model, opt, scaler=rn.optim.GradScaler(), cuda_graph=True)
    average = WeightAverage(model, shadow, 0.9)
    want = {n: cp.asnumpy(p.data).astype(np.float64) for n, p in model.named_parameters()}
    stats = [cp.asnumpy(a).astype(np.float64) for a in running_statistics(model)]
    x = cp.asarray(rng.standard_normal((64, 32, 32, 3)).astype(np.float16))
    y = cp.asarray(rng.integers(0, 10, 64).astype(np.int32))
    for _ in range(4):
        step.run(x, y)
        average.after_step(opt.step_count)
        want = {n: 0.9 * want[n] + 0.1 * cp.asnumpy(p.data) for n, p in model.named_parameters()}
        stats = [0.9 * s + 0.1 * cp.asnumpy(a) for s, a in zip(stats, running_statistics(model), strict=True)]
    for n, p in shadow.named_parameters():
        np.testing.assert_allclose(cp.asnumpy(p.data), want[n], rtol=1e-5, atol=1e-6, err_msg=n)
        cp.testing.assert_array_equal(p.low, p.data.astype(cp.float16))  # the kernel rounds its fp32 result
    for got, s in zip(running_statistics(shadow), stats, strict=True):
        np.testing.assert_allclose(cp.asnumpy(got), s, rtol=1e-5, atol=1e-6)
    step.reset_graphs()


def test_the_warm_start_primes_recipe_c_steps_views_and_downscaling():
    from resnet_native.training.warm_start import prime_first_steps

    cfg = TrainConfig.from_dict({"epochs": 4, "optimizer": {"lr": 0.1}, "tta": "flip-shift", "precision": "fp16",
                                 "layout": "NHWC", "batch_size": 256, "eval_batch_size": 3000, "subset": 1000,
                                 "progressive": {"size": 20, "until": 0.5}})
    seconds = prime_first_steps(cfg)
    # a step per batch shape at each size (1000 = 3 x 256 + 232), an evaluation of both test batch shapes
    want = {"step 256 at 20 px", "step 232 at 20 px", "step 256", "step 232", "downscale to 20 px",
            "evaluation 3000+1000"}
    assert want <= set(seconds) and all(v >= 0 for v in seconds.values()), seconds
