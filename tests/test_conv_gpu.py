"""The legacy convolution engine (engine='legacy') on the GPU against the float64 NumPy reference: forward,
backward-data and backward-filter over a sweep of shapes, layouts and precisions, every algorithm mode, the adjoint
identity, backward bias, accumulation and allocated outputs. The fused epilogue is in test_conv_fusion_gpu.py; the
algorithm cache, workspace caps, determinism, streams and descriptor lifetimes in test_conv_cache_gpu.py.

Every op output is poisoned with NaN before the call and checked to be fully written, and compared norm-wise
(||got - ref|| / ||ref||) with tolerances fp32 1e-5, tf32 1e-3, fp16/bf16 1e-2 (device_values.TOLERANCE).

Some combinations (odd channel counts, dilation, groups, depthwise, some fixed algorithms or elementwise ops in
bf16) may not exist in the legacy API of a given cuDNN; those cases are marked "xfail" with cuDNN's status when
cuDNN reports NOT_SUPPORTED or BAD_PARAM, so the summary lists what the library lacks. Standard shapes (channels
multiple of 8, 3x3 or 1x1, stride 1 or 2) in the common precision/layout pairs are strict: any error fails.
"""

import dataclasses

import numpy as np
import pytest
from device_values import TOLERANCE, host_values, poisoned, rounded, to_device
from legacy_conv_problems import SHAPES, no_workspace_cap, problem, unsupported_is_xfail  # noqa: F401 (autouse)

from resnet_native.ops import conv

pytestmark = pytest.mark.gpu

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
LAYOUTS = ("NCHW", "NHWC")


# ------------------------------------------------------------------------------------------------------------------
# Forward / backward-data / backward-filter over the sweep


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_sweep_matches_reference(rng, name, layout, precision):
    strict = SHAPES[name][-1]
    with unsupported_is_xfail(strict):
        problem(rng, name, precision, layout).check_all(f"{name} {layout} {precision}")


FIXED = "fwd=IMPLICIT_PRECOMP_GEMM;bwd_data=ALGO_1;bwd_filter=ALGO_1"


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algo", ["find", "heuristic", FIXED], ids=["find", "heuristic", "fixed"])
@pytest.mark.parametrize("name", ["3x3", "stride2"])
def test_algorithm_modes(rng, name, algo, layout, precision):
    strict = algo != FIXED or (layout == "NCHW" and precision in ("fp32", "fp16"))
    p = problem(rng, name, precision, layout, algo=algo)
    with unsupported_is_xfail(strict):
        p.check_all(f"{name} {layout} {precision} algo={algo}")
    expected_names = {"forward": "IMPLICIT_PRECOMP_GEMM", "backward_data": "ALGO_1", "backward_filter": "ALGO_1"}
    for direction in conv.DIRECTIONS:
        chosen = conv.last_algorithm(p.x_shape, p.w_shape, p.spec, direction)
        assert chosen is not None and chosen["engine"] == "legacy", (direction, chosen)
        assert chosen["search_ms"] > 0.0, chosen  # chosen in this process, and the time it took is kept
        if algo == "find":
            assert chosen["mode"] == "find" and chosen["time_ms"] is not None
        elif algo == "heuristic":
            assert chosen["mode"] == "heuristic" and chosen["time_ms"] is None
        else:
            assert chosen["mode"] == "fixed" and chosen["algo_name"] == expected_names[direction]
        if precision == "fp32":
            assert chosen["math_type_name"] == "FMA_MATH"  # strict fp32 never runs TF32 tensor cores
        if precision in ("tf32", "bf16"):
            assert chosen["math_type_name"] != "TENSOR_OP_MATH_ALLOW_CONVERSION"


# ------------------------------------------------------------------------------------------------------------------
# Gradient check: the backward ops are the adjoints of the forward op


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["3x3", "stride2", "1x1_stride2", "batch1"])
def test_adjoint_identity(rng, name, layout, precision):
    p = problem(rng, name, precision, layout)
    # dy correlated with y keeps <y, dy> of the order of ||y|| ||dy||, so the tolerance below is meaningful.
    p.dy = rounded(p.forward_ref(), precision)
    y = host_values(p.run_forward(), layout)
    dx = host_values(p.run_backward_data(), layout)
    dw = host_values(p.run_backward_filter(), layout)
    for a in (y, dx, dw):
        assert np.isfinite(a).all()
    forward_side = np.vdot(y, p.dy)  # <conv(x, w), dy>
    data_side = np.vdot(p.x, dx)  # <x, conv_backward_data(dy, w)>
    filter_side = np.vdot(p.w, dw)  # <w, conv_backward_filter(x, dy)>
    assert forward_side > 0.1 * np.linalg.norm(y) * np.linalg.norm(p.dy)
    # Each inner product is off by at most (output error) x (other factor): bound it norm-wise.
    scale = np.linalg.norm(y) * np.linalg.norm(p.dy) + np.linalg.norm(p.x) * np.linalg.norm(dx)
    scale_w = np.linalg.norm(y) * np.linalg.norm(p.dy) + np.linalg.norm(p.w) * np.linalg.norm(dw)
    assert abs(forward_side - data_side) <= TOLERANCE[precision] * scale, (forward_side, data_side)
    assert abs(forward_side - filter_side) <= TOLERANCE[precision] * scale_w, (forward_side, filter_side)
    # Not vacuous: the identity fails for a wrong gradient (here: dx of the wrong sign pattern).
    assert abs(forward_side - np.vdot(p.x, np.flip(dx, axis=3))) > TOLERANCE[precision] * scale


# ------------------------------------------------------------------------------------------------------------------
# Backward bias, accumulation, allocated outputs


# NCHW shapes: a convolution's, the fully connected layer's (N, K, 1, 1), and channels over two blocks of 32.
BIAS_SHAPES = {"conv": (3, 24, 7, 9), "fc": (512, 10, 1, 1), "wide": (5, 70, 3, 2)}
# One rounding of the float64 sum to float32, then (16-bit dtypes) one more to the storage dtype.
BIAS_ROUNDING = {"fp32": 2.0**-24, "fp16": 2.0**-11 + 2.0**-24, "bf16": 2.0**-8 + 2.0**-24}


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", list(BIAS_SHAPES))
def test_backward_bias(rng, shape, layout, precision):
    dy = rounded(rng.standard_normal(BIAS_SHAPES[shape]), precision)
    expected = dy.sum(axis=(0, 2, 3))  # the reference's definition (test_reference_cpu checks it is the adjoint)
    device_dy = to_device(dy, precision, layout)[0]
    out = poisoned((dy.shape[1],), precision)
    assert conv.conv2d_backward_bias(device_dy, layout, out=out) is out
    got = host_values(out)
    # Within one rounding of the exact sum, every channel (NaN left by the poison fails the comparison).
    bound = BIAS_ROUNDING[precision] * np.abs(expected) + 1e-12 * np.abs(dy).sum(axis=(0, 2, 3))
    assert (np.abs(got - expected) <= bound).all(), (shape, layout, precision, got - expected)
    allocated = conv.conv2d_backward_bias(device_dy, layout)
    np.testing.assert_array_equal(host_values(allocated), got)  # a fixed summation order: the same bits again


@pytest.mark.parametrize("algo", ["find", "heuristic"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_backward_filter_accumulates(rng, algo, precision):
    conv.clear_algorithm_cache()
    p = problem(rng, "3x3", precision, "NHWC", algo=algo)
    dw0 = p.values(p.w.shape)
    out = p.dev(dw0)
    conv.conv2d_backward_filter(p.dev(p.x), p.dev(p.dy), p.spec, p.w_shape, out=out, accumulate=True)
    # The search must not have clobbered dw (find searches on scratch space when accumulating).
    p.check(out, dw0 + p.backward_filter_ref(), f"accumulate {algo} {precision}")


@pytest.mark.parametrize("engine", ["legacy", "graph", "auto"])
@pytest.mark.parametrize("algo", ["find", "heuristic"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_backward_data_accumulates(rng, engine, algo, precision):
    """dx += conv_backward_data (a residual block's two input gradients summed by the convolution, beta = 1), both
    for a fresh search (which must not time on dx itself) and for a choice cached by a non-accumulating call."""
    conv.clear_algorithm_cache()
    for cached in (False, True):
        p = problem(rng, "stride2", precision, "NHWC", algo=algo)
        p.spec = dataclasses.replace(p.spec, engine=engine)
        if cached:
            conv.conv2d_backward_data(p.dev(p.dy), p.dev(p.w), p.spec, p.x_shape)
        before = p.values(p.x.shape)
        out = p.dev(before)
        with unsupported_is_xfail(precision != "bf16"):
            assert conv.conv2d_backward_data(p.dev(p.dy), p.dev(p.w), p.spec, p.x_shape, out=out,
                                             accumulate=True) is out
        p.check(out, before + p.backward_data_ref(), f"accumulate {engine} {algo} {precision} cached={cached}")


def test_outputs_are_allocated_when_out_is_none(rng):
    p = problem(rng, "stride2", "fp16", "NHWC")
    y = conv.conv2d(p.dev(p.x), p.dev(p.w), p.spec)
    dx = conv.conv2d_backward_data(p.dev(p.dy), p.dev(p.w), p.spec, p.x_shape)
    dw = conv.conv2d_backward_filter(p.dev(p.x), p.dev(p.dy), p.spec, p.w_shape)
    assert y.shape == p.y_shape and str(y.dtype) == "float16"
    p.check(y, p.forward_ref(), "allocated forward")
    p.check(dx, p.backward_data_ref(), "allocated backward-data")
    p.check(dw, p.backward_filter_ref(), "allocated backward-filter")
    bf = problem(rng, "3x3", "bf16", "NCHW")
    y16 = conv.conv2d(bf.dev(bf.x), bf.dev(bf.w), bf.spec)
    assert str(y16.dtype) == "uint16"
    bf.check(y16, bf.forward_ref(), "allocated bf16 forward")
