"""The quantised convolution's host side: its float64 reference against a direct computation, y's rounding, the
spec's rules, and the engine's quantised plan, weights, epilogue parameters and input table (no GPU)."""

import numpy as np
import pytest
from test_inference_plan_cpu import randomized_state

import resnet_native as rn
from resnet_native.inference.plan import build_plan
from resnet_native.inference.quantized import INPUT_CHANNELS, input_table, quantized_convs, quantized_plan
from resnet_native.inference.simulate import calibrate, quantized_values, value_names
from resnet_native.ops import quantized_conv
from resnet_native.ops.conv import ConvSpec
from resnet_native.quantization import dequantize_int8, quantize_int8
from resnet_native.quantization.fp8 import decode_e4m3, encode_e4m3


def test_the_reference_is_scale_times_the_exact_int_sum_plus_the_epilogue(rng):
    spec = ConvSpec(padding=1, layout="NHWC", precision="int8", engine="graph")
    x = rng.integers(-127, 128, (2, 5, 5, 8)).astype(np.int8)
    w = rng.integers(-127, 128, (4, 3, 3, 8)).astype(np.int8)
    z = rng.integers(-127, 128, (2, 5, 5, 4)).astype(np.int8)
    scale, bias = np.float32([0.01, 0.02, 0.005, 0.001]), np.float32([1, -2, 3, -4])
    acc = np.zeros((2, 5, 5, 4))
    xp = np.pad(x.astype(np.int64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    for i in range(5):
        for j in range(5):
            acc[:, i, j] = np.einsum("nrsc,krsc->nk", xp[:, i:i + 3, j:j + 3], w.astype(np.int64))
    v = np.maximum(acc * scale + bias + 0.5 * z, 0)
    out = quantized_conv.conv2d(x, w, spec, scale, bias=bias, z=z, gamma=0.5, relu=True,
                                out=np.empty((2, 5, 5, 4), np.int8))
    assert np.array_equal(out, np.clip(np.rint(v), -128, 127).astype(np.int8))
    half = quantized_conv.conv2d(x, w, spec, scale, bias=bias, z=z, gamma=0.5, relu=True,
                                 out=np.empty((2, 5, 5, 4), np.float16))
    assert np.array_equal(half, v.astype(np.float16))


def test_y_is_rounded_to_nearest_even_and_saturated():
    assert quantized_conv.encode([0.5, 1.5, -0.5, 200, -200, 126.5], "int8").tolist() == [0, 2, 0, 127, -128, 126]
    codes = quantized_conv.encode([1000.0, -1000.0, 1.0], "fp8")
    assert decode_e4m3(codes).tolist() == [448.0, -448.0, 1.0]


def test_quantized_specs_need_the_graph_engine_and_nhwc():
    with pytest.raises(ValueError, match="engine='graph'"):
        ConvSpec(layout="NHWC", precision="int8", engine="auto")
    with pytest.raises(ValueError, match="layout='NHWC'"):
        ConvSpec(layout="NCHW", precision="fp8", engine="graph")
    spec = ConvSpec(layout="NHWC", precision="int8", engine="graph")
    x, w = np.zeros((1, 4, 4, 16), np.int8), np.zeros((8, 1, 1, 16), np.int8)
    with pytest.raises(TypeError, match="out: expected one of"):
        quantized_conv.conv2d(x, w, spec, np.ones(8, np.float32), out=np.zeros((1, 4, 4, 8), np.uint8))
    with pytest.raises(ValueError, match="spec: expected a ConvSpec of precision"):
        quantized_conv.conv2d(x, w, ConvSpec(layout="NHWC"), np.ones(8, np.float32), out=np.zeros((1, 4, 4, 8)))


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_the_engine_quantises_what_the_simulation_quantises(rng, dtype):
    model = rn.ResNet(18, 10, layout="NHWC", precision="fp16", seed=0)
    model.load_state_dict(randomized_state(model, rng))
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    images = rng.standard_normal((2, 3, 32, 32))
    calibration = calibrate(state, images, "max", dtype=dtype)
    plan = build_plan(state, "cifar", "fp32", 32)
    qplan = quantized_plan(plan, dtype)
    quantized = set(quantized_values(plan))
    assert qplan.values[plan.input].shape == (INPUT_CHANNELS, 32, 32)
    assert [v.dtype for v in qplan.values] == [dtype if i in quantized else plan.values[i].dtype
                                               for i in range(len(plan.values))]
    convs = quantized_convs(qplan, state, calibration, dtype, np.asarray)
    assert len(convs) == len(plan.conv_steps()) - 1  # all but the classifier
    names = value_names(plan)
    scales = calibration.activation_scales
    stem = next(s for s in plan.conv_steps() if s.x == plan.input)
    q = convs[stem.name]
    assert q.weight.shape[3] == INPUT_CHANNELS and not q.weight[..., 3:].any()  # zero-padded input channels
    s_w = np.asarray(calibration.weight_scales[stem.name])
    np.testing.assert_allclose(q.alpha, scales[names[stem.x]] * s_w / scales[names[stem.out]], rtol=1e-6)
    last = [s for s in plan.conv_steps() if s.name in convs][-1]
    assert convs[last.name].out_dtype == "fp32"  # the last block's output is read by the pool, not a quantised conv
    table = input_table(calibration, dtype, rn.data.augment.normalization_lut("fp32"))
    assert table.shape == (3, 256) and table.dtype == (np.int8 if dtype == "int8" else np.uint8)
    if dtype == "int8":
        s = scales["input"]
        lut = rn.data.augment.normalization_lut("fp32").astype(np.float64)
        assert np.array_equal(table, quantize_int8(lut, s))
        assert np.max(np.abs(dequantize_int8(table, s) - lut)) <= s / 2 + 1e-12
    else:
        assert np.array_equal(table, encode_e4m3(rn.data.augment.normalization_lut("fp32").astype(np.float64)
                                                 / scales["input"]))


def test_a_calibration_of_another_dtype_or_network_is_refused(rng):
    model = rn.ResNet(18, 10, layout="NHWC", precision="fp16", seed=0)
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    calibration = calibrate(state, rng.standard_normal((1, 3, 32, 32)), "max", dtype="int8")
    plan = quantized_plan(build_plan(state, "cifar", "fp32", 32), "fp8")
    with pytest.raises(ValueError, match="made for 'int8'"):
        quantized_convs(plan, state, calibration, "fp8", np.asarray)
    deeper = {k: np.asarray(v) for k, v in rn.ResNet(34, 10, layout="NHWC", seed=0).state_dict().items()}
    with pytest.raises(ValueError, match="do not match this network"):
        quantized_convs(quantized_plan(build_plan(deeper, "cifar", "fp32", 32), "int8"), deeper, calibration, "int8",
                        np.asarray)


def test_the_legacy_int8x32_probe_checks_its_sizes_before_the_device():
    with pytest.raises(ValueError, match="c and k multiples of 32"):
        rn._C._testing.probe_legacy_int8x32(8, 16, 8, 8, 64, 3, 1, 1, True, 5)
