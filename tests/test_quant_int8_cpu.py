"""int8 quantisation on the host: round trips within half a step, saturation at +-127 (never -128), ties to even,
per-channel scales, and the kernel's fp32 requantisation multiplier against the float formula."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resnet_native import reference
from resnet_native.ops.conv import ConvSpec
from resnet_native.quantization.int8 import (
    INT8_MAX,
    dequantize_int8,
    fake_quantize_int8,
    int8_scale,
    quantize_int8,
    requant_params,
    requantize,
    requantize_float,
)

# Magnitudes below 1e-200 are left out: their scale (amax / 127) would be a subnormal float64, with fewer bits.
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False).filter(lambda v: v == 0 or abs(v) > 1e-200)


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=64))
def test_round_trip_within_half_a_step(values):
    x = np.array(values)
    s = int8_scale(x)
    q = quantize_int8(x, s)
    assert q.dtype == np.int8 and q.min() >= -INT8_MAX
    assert np.all(np.abs(dequantize_int8(q, s) - x) <= s / 2 * (1 + 1e-12))


@settings(max_examples=200, deadline=None)
@given(st.lists(finite, min_size=1, max_size=64))
def test_symmetric_odd_and_max_on_the_end_code(values):
    x = np.array(values)
    s = int8_scale(x)
    assert np.array_equal(quantize_int8(-x, s), -quantize_int8(x, s))
    if np.abs(x).max() >= INT8_MAX * np.finfo(np.float32).tiny:  # below it the scale is 1 and every code 0
        assert np.abs(quantize_int8(x, s)).max() == INT8_MAX
    else:
        assert s == 1.0 and not quantize_int8(x, s).any()


def test_saturation_and_no_minus_128():
    q = quantize_int8(np.array([-1e9, -128.0, -127.6, 127.6, 1e9, np.inf, -np.inf]), 1.0)
    assert q.tolist() == [-127, -127, -127, 127, 127, 127, -127]


def test_round_half_to_even():
    assert quantize_int8(np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5]), 1.0).tolist() == [0, 2, 2, 0, -2, -2]


def test_per_channel_scales_one_per_output_channel(rng):
    w = rng.standard_normal((6, 3, 3, 3)) * np.arange(1, 7)[:, None, None, None]
    s = int8_scale(w, axis=0)
    assert s.shape == (6,)
    assert np.allclose(s, np.abs(w).reshape(6, -1).max(axis=1) / 127)
    q = quantize_int8(w, s, axis=0)
    assert np.all(np.abs(q).reshape(6, -1).max(axis=1) == 127)  # every channel uses its whole range
    assert np.all(np.abs(dequantize_int8(q, s, axis=0) - w) <= s[:, None, None, None] / 2 * (1 + 1e-12))


def test_zero_tensor_scale_is_one_and_bad_arguments_are_named():
    assert int8_scale(np.zeros(5)) == 1.0
    with pytest.raises(ValueError, match="scale: expected shape"):
        quantize_int8(np.ones((2, 3)), np.ones(2), axis=1)
    with pytest.raises(ValueError, match="scale: expected finite scales > 0"):
        quantize_int8(np.ones(3), 0.0)
    with pytest.raises(ValueError, match="x: expected no NaN"):
        quantize_int8(np.array([np.nan]), 1.0)
    with pytest.raises(TypeError, match="q: expected an int8"):
        dequantize_int8(np.ones(3), 1.0)
    with pytest.raises(TypeError, match="axis"):
        int8_scale(np.ones(3), axis=True)


def _int8_conv_problem(rng, residual: bool):
    x = rng.standard_normal((2, 4, 6, 6))
    w = rng.standard_normal((5, 4, 3, 3)) * rng.uniform(0.2, 2, 5)[:, None, None, None]
    bias = rng.uniform(-1, 1, 5)
    s_x, s_w = int8_scale(x), int8_scale(w, axis=0)
    qx, qw = quantize_int8(x, s_x), quantize_int8(w, s_w, axis=0)
    spec = ConvSpec(padding=1)
    # int8 x int8 products summed in float64 are exact integers: the int32 accumulator.
    acc = reference.conv.conv2d(qx.astype(np.float64), qw.astype(np.float64), spec).astype(np.int32)
    z = rng.standard_normal(acc.shape) if residual else None
    s_z = int8_scale(z) if residual else None
    qz = quantize_int8(z, s_z) if residual else None
    float_y = reference.conv.conv2d(dequantize_int8(qx, s_x), dequantize_int8(qw, s_w, axis=0), spec,
                                    bias=bias, z=None if z is None else dequantize_int8(qz, s_z), activation="relu")
    return acc, s_x, s_w, bias, qz, s_z, float_y


@pytest.mark.parametrize("residual", [False, True])
def test_requant_float_formula_is_the_fake_quant_convolution(rng, residual):
    acc, s_x, s_w, bias, qz, s_z, float_y = _int8_conv_problem(rng, residual)
    s_y = int8_scale(float_y)
    y = requantize_float(acc, s_x, s_w, bias, s_y, relu=True, z=qz, s_z=s_z)
    assert y.min() >= 0
    # The same value up to float64 rounding: the codes agree but for values within 1e-9 of a rounding boundary.
    v = float_y / s_y
    near_tie = np.abs(v - np.floor(v) - 0.5) < 1e-9
    assert np.array_equal(y[~near_tie], quantize_int8(float_y, s_y)[~near_tie])
    assert np.allclose(dequantize_int8(y, s_y)[~near_tie], fake_quantize_int8(float_y, s_y)[~near_tie])


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_fp32_multiplier_equals_the_float_formula(rng, residual, relu):
    acc, s_x, s_w, bias, qz, s_z, float_y = _int8_conv_problem(rng, residual)
    s_y = int8_scale(float_y) / 2  # half the range: some outputs saturate
    expected = requantize_float(acc, s_x, s_w, bias, s_y, relu=relu, z=qz, s_z=s_z)
    alpha, beta, gamma = requant_params(s_x, s_w, bias, s_y, s_z)
    assert alpha.dtype == beta.dtype == np.float32 and np.allclose(alpha, s_x * s_w / s_y, rtol=1e-7)
    y = requantize(acc, alpha, beta, relu=relu, z=qz, gamma=gamma)
    # fp32 arithmetic moves a value by < 1e-4 here (|v| < 1000, 2**-23 relative per operation): only codes whose
    # exact value is that close to a rounding boundary may differ, by one.
    v = (acc * s_x * s_w[:, None, None] + bias[:, None, None] + (0 if qz is None else qz * s_z)) / s_y
    near_tie = np.abs(np.abs(v - np.floor(v)) - 0.5) < 1e-4
    assert np.array_equal(y[~near_tie], expected[~near_tie])
    assert np.abs(y.astype(int) - expected).max() <= 1
    assert np.abs(y).max() == 127  # saturated somewhere


def test_requant_arguments_are_checked():
    acc = np.zeros((1, 2, 1, 1), np.int32)
    with pytest.raises(TypeError, match="acc: expected"):
        requantize_float(acc.astype(np.int64), 1.0, np.ones(2), np.zeros(2), 1.0, relu=False)
    with pytest.raises(ValueError, match="s_w, bias"):
        requantize_float(acc, 1.0, np.ones(3), np.zeros(3), 1.0, relu=False)
    with pytest.raises(ValueError, match="z, s_z"):
        requantize_float(acc, 1.0, np.ones(2), np.zeros(2), 1.0, relu=False, z=np.zeros((1, 2, 1, 1), np.int8))
    with pytest.raises(ValueError, match="s_y"):
        requantize_float(acc, 1.0, np.ones(2), np.zeros(2), -1.0, relu=False)
    with pytest.raises(TypeError, match="relu"):
        requantize_float(acc, 1.0, np.ones(2), np.zeros(2), 1.0, relu=1)
    with pytest.raises(TypeError, match="alpha, beta"):
        requantize(acc, np.ones(2), np.zeros(2, np.float32), relu=False)
