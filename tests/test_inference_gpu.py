"""InferenceEngine on the GPU: its logits against the model's eval-mode graph (random weights and BatchNorms far
from the identity) for every captured batch size, each dtype, both stems and both layouts; replays after the input
changes and after the caller reuses its input buffer; the uint8 path bit for bit against the normalised one;
padding and splitting of odd batches; input forms; the fused-or-unfused choice kept in the algorithm-cache file;
and descriptors, workspace holds and device memory flat after 100 engines come and go."""

import gc
import json
import os

import numpy as np
import pytest
from device_values import poisoned, to_device
from fake_arrays import DLPackOnly
from test_inference_plan_cpu import randomized_state

import resnet_native as rn
from resnet_native.data.augment import normalization_lut, normalize_on_gpu
from resnet_native.inference import InferenceEngine, normalize_u8, tuning
from resnet_native.ops import conv

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

# Largest |engine - eval graph| over the largest |eval graph| logit: both round every activation to the dtype, the
# engine its folded weights and biases too, so they differ by a few roundings per layer.
TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 6e-2}
IMAGE_SIZE = {"cifar": 32, "imagenet": 64}


def _model(rng, depth=18, stem="cifar", dtype="fp16", layout="NHWC", num_classes=10):
    model = rn.ResNet(depth, num_classes, stem=stem, layout=layout, precision=dtype, seed=0)
    model.load_state_dict(randomized_state(model, rng))
    return model.cuda().eval()


def _batch(rng, n, size, layout, dtype):
    shape = (n, size, size, 3) if layout == "NHWC" else (n, 3, size, size)
    return to_device(rng.standard_normal(shape), dtype)[0]  # values in the layout's order, as stored


def _images(rng, n, size=32):
    return cp.asarray(rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8))


def _assert_close(actual, expected, dtype):
    actual, expected = cp.asnumpy(actual), cp.asnumpy(expected)
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    assert np.all(np.isfinite(actual))
    scale = float(np.abs(expected).max())
    assert scale > 0 and float(np.std(expected)) > 1e-3 * scale  # a network that still tells inputs apart
    error = float(np.abs(actual - expected).max()) / scale
    assert error <= TOLERANCE[dtype], error


def _assert_captured(engine):
    assert engine.capture_error is None
    assert engine.num_graphs == len(engine.batch_sizes)
    assert engine.capture_allocated_bytes == 0
    assert all(path for path in engine.fused_paths.values())  # every convolution ran its fused key


# ------------------------------------------------------------------------------------------------------------
# Against the eval graph


@pytest.mark.parametrize("stem", ["cifar", "imagenet"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_engine_equals_the_eval_graph_at_every_captured_batch_size(rng, dtype, stem):
    model = _model(rng, stem=stem, dtype=dtype)
    size = IMAGE_SIZE[stem]
    with InferenceEngine(model, batch_sizes=(1, 8, 32), precision=dtype, image_size=size) as engine:
        _assert_captured(engine)
        for n in engine.batch_sizes:
            x = _batch(rng, n, size, "NHWC", dtype)
            _assert_close(engine(x), model.forward(x), dtype)


@pytest.mark.parametrize(("depth", "layout"), [(18, "NCHW"), (50, "NHWC"), (50, "NCHW")])
def test_engine_equals_the_eval_graph_for_resnet50_and_nchw(rng, depth, layout):
    model = _model(rng, depth=depth, layout=layout)
    with InferenceEngine(model, batch_sizes=(1, 32), layout=layout) as engine:
        _assert_captured(engine)
        for n in engine.batch_sizes:
            x = _batch(rng, n, 32, layout, "fp16")
            _assert_close(engine(x), model.forward(x), "fp16")


def test_replays_follow_the_inputs_contents(rng):
    model = _model(rng)
    with InferenceEngine(model, batch_sizes=(8,), deterministic=True) as engine:
        x1, x2 = _batch(rng, 8, 32, "NHWC", "fp16"), _batch(rng, 8, 32, "NHWC", "fp16")
        first, second = engine(x1), engine(x2)
        _assert_close(second, model.forward(x2), "fp16")
        assert not cp.array_equal(first, second)
        cp.testing.assert_array_equal(engine(x1), first)  # the graph reads the new contents every time
        buffer = x1.copy()
        cp.testing.assert_array_equal(engine(buffer), first)
        buffer[...] = x2  # the caller reuses its input buffer
        cp.testing.assert_array_equal(engine(buffer), second)


def test_eager_and_graphed_engines_agree_bit_for_bit(rng):
    model = _model(rng)
    x = _batch(rng, 8, 32, "NHWC", "fp16")
    with InferenceEngine(model, batch_sizes=(8,), deterministic=True) as graphed, \
            InferenceEngine(model, batch_sizes=(8,), deterministic=True, cuda_graph=False) as eager:
        assert graphed.num_graphs == 1 and eager.num_graphs == 0
        cp.testing.assert_array_equal(graphed(x), eager(x))


# ------------------------------------------------------------------------------------------------------------
# Inputs


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_uint8_images_give_the_normalised_inputs_bit_for_bit(rng, dtype, layout):
    images = _images(rng, 5)
    expected = normalize_on_gpu(images, layout=layout, dtype=dtype)
    out = poisoned(expected.shape, dtype)
    normalize_u8(images, cp.asarray(normalization_lut(dtype)), out, layout=layout, dtype=dtype)
    cp.testing.assert_array_equal(out.view(cp.uint8), expected.view(cp.uint8))

    model = _model(rng, dtype=dtype, layout=layout)
    with InferenceEngine(model, batch_sizes=(8,), precision=dtype, layout=layout, deterministic=True) as engine:
        cp.testing.assert_array_equal(engine(images), engine(expected))
        cp.testing.assert_array_equal(engine(cp.asnumpy(images)), engine(expected))  # host pixels are uploaded


def test_odd_batches_are_padded_or_split(rng):
    model = _model(rng)
    x = _batch(rng, 21, 32, "NHWC", "fp16")
    reference = model.forward(x)
    with InferenceEngine(model, batch_sizes=(4, 8), deterministic=True) as engine:
        for n in (1, 3, 5, 8, 19, 21):
            _assert_close(engine(x[:n]), reference[:n], "fp16")
        # Rows are independent: the last chunk of a split batch is what that chunk alone gives.
        cp.testing.assert_array_equal(engine(x[:19])[16:], engine(x[16:19]))
        out = cp.full((13, 10), np.nan, dtype=cp.float32)
        assert engine(x[:13], out=out) is out
        _assert_close(out, reference[:13], "fp16")
        assert engine(x[:0]).shape == (0, 10)
    with InferenceEngine(model, batch_sizes=(4, 8), split=False) as engine:
        _assert_close(engine(x[:8]), reference[:8], "fp16")
        with pytest.raises(ValueError, match="batch of 9 is over the largest captured batch size 8"):
            engine(x[:9])


def test_input_forms_streams_and_errors(rng):
    model = _model(rng)
    x16 = _batch(rng, 4, 32, "NHWC", "fp16")
    with InferenceEngine(model, batch_sizes=(4,), deterministic=True) as engine:
        expected = engine(x16)
        cp.testing.assert_array_equal(engine(DLPackOnly(x16)), expected)
        cp.testing.assert_array_equal(engine(cp.asnumpy(x16)), expected)
        cp.testing.assert_array_equal(engine(x16.astype(cp.float32)), expected)  # cast: fp16 values are exact
        cp.testing.assert_array_equal(engine(cp.concatenate([x16, x16], axis=3)[..., :3]), expected)  # strided
        with cp.cuda.Stream(non_blocking=True) as stream:
            on_stream = engine(x16)
            stream.synchronize()
        cp.testing.assert_array_equal(on_stream, expected)
        with pytest.raises(ValueError, match=r"x: expected a NHWC batch of shape \(N, 32, 32, 3\)"):
            engine(cp.zeros((4, 3, 32, 32), cp.float16))
        with pytest.raises(TypeError, match="x: expected uint8 images or a float32"):
            engine(cp.zeros((4, 32, 32, 3), cp.int32))
        with pytest.raises(TypeError, match="x: expected a cupy array"):
            engine([[1, 2]])
        with pytest.raises(ValueError, match=r"out: expected a C-contiguous float32 array of shape \(4, 10\)"):
            engine(x16, out=cp.zeros((4, 10), cp.float16))
        assert engine.memory_bytes > 0
    with pytest.raises(RuntimeError, match="closed"):
        engine(x16)


# ------------------------------------------------------------------------------------------------------------
# The fused-or-unfused choice and the algorithm-cache file


def test_fusion_choice_is_timed_once_and_kept_in_the_cache_file(rng, tmp_path, monkeypatch):
    model = _model(rng)
    path = tmp_path / "algos.json"
    conv.clear_algorithm_cache()  # every fused key undecided
    # Pretend the separate calls always win (they are timed with fusion disabled).
    monkeypatch.setattr(tuning, "device_ms", lambda fn, samples=5: (fn(), 2.0 if conv._fusion_enabled else 1.0)[1])
    x = _batch(rng, 8, 32, "NHWC", "fp16")
    with InferenceEngine(model, batch_sizes=(1, 8), algorithm_cache=path) as engine:
        unfused = {k for k, p in engine.fused_paths.items() if p == tuning.UNFUSED_FASTER}
        assert len(unfused) >= len(engine.fused_paths) // 2  # legacy runs every conv here (a few may be refused)
        _assert_captured(engine)
        _assert_close(engine(x), model.forward(x), "fp16")  # the captured separate calls are right too
    saved = json.loads(path.read_text())["entries"]
    assert sum(e["fused_path"] == tuning.UNFUSED_FASTER for e in saved) >= len(unfused) // 2

    conv.clear_algorithm_cache()
    finds = conv.algorithm_cache_stats()["finds"]
    monkeypatch.setattr(tuning, "device_ms", lambda *a, **k: pytest.fail("timed again after loading the cache"))
    with InferenceEngine(model, batch_sizes=(1, 8), algorithm_cache=path) as again:
        assert again.fused_paths == engine.fused_paths
        assert conv.algorithm_cache_stats()["finds"] == finds  # no search either
        _assert_close(again(x), model.forward(x), "fp16")
    conv.clear_algorithm_cache()  # later tests choose for themselves


# ------------------------------------------------------------------------------------------------------------
# Resources


def _resources():
    gc.collect()
    free, _ = cp.cuda.runtime.memGetInfo()
    live = {k: v for k, v in rn.live_descriptors().items() if k != "handle"}
    return live, cp.get_default_memory_pool().used_bytes(), free, rn.workspace_stats()["graph_holds"]


def test_descriptors_memory_and_holds_stay_flat_over_100_engines(rng):
    model = _model(rng)
    x = _images(rng, 2)
    InferenceEngine(model, batch_sizes=(1, 2)).close()  # searches and plans are made once, for every engine
    live, used, free, holds = _resources()
    for i in range(100):
        engine = InferenceEngine(model, batch_sizes=(1, 2))
        engine(x)
        if i % 2:
            engine.close()  # half closed explicitly, half only dropped
        del engine
    after_live, after_used, after_free, after_holds = _resources()
    assert after_live == live
    assert after_holds == holds
    assert after_used == used
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") != "1":
        pytest.skip("the device's free memory is shared with other pytest-xdist workers; run this test alone")
    assert abs(after_free - free) <= 64 * 2**20, (free, after_free)
