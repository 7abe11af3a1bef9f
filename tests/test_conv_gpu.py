"""The legacy convolution engine (engine='legacy') on the GPU, against the float64 NumPy reference of
conv_reference.py.

Every op output is poisoned with NaN before the call and checked to be fully written, and compared norm-wise
(||got - ref|| / ||ref||) with tolerances fp32 1e-5, tf32 1e-3, fp16/bf16 1e-2.

Some combinations (odd channel counts, dilation, groups, depthwise, some fixed algorithms or elementwise ops in
bf16) may not exist in the legacy API of a given cuDNN; those cases are marked "xfail" with cuDNN's status when
cuDNN reports NOT_SUPPORTED or BAD_PARAM, so the summary lists what the library lacks. Standard shapes (channels
multiple of 8, 3x3 or 1x1, stride 1 or 2) in the common precision/layout pairs are strict: any error fails.
"""

import contextlib

import conv_reference as ref
import numpy as np
import pytest
from conv_reference import from_layout, to_layout

import resnet_native as rn
from resnet_native import conv
from resnet_native.conv import ConvSpec

pytestmark = pytest.mark.gpu

TOL = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
LAYOUTS = ("NCHW", "NHWC")


# ------------------------------------------------------------------------------------------------------------------
# Storage types on the host and the device


def representable(rng, shape, precision, scale=1.0):
    """Random float64 values that the precision's storage type holds exactly."""
    return quantize(rng.standard_normal(shape) * scale, precision)


def quantize(values, precision):
    """The nearest values the precision's storage type holds, as float64."""
    return ref.from_storage(ref.to_storage(np.asarray(values).astype(np.float32), precision), precision)


def to_device(values, precision):
    import cupy as cp

    return cp.asarray(ref.to_storage(np.asarray(values).astype(np.float32), precision))


def to_host(array, precision):
    import cupy as cp

    return ref.from_storage(cp.asnumpy(array), precision)


def poisoned(shape, precision):
    import cupy as cp

    if precision == "bf16":
        return cp.full(shape, 0x7FC0, dtype=cp.uint16)  # a bfloat16 NaN
    return cp.full(shape, np.nan, dtype=cp.float16 if precision == "fp16" else cp.float32)


def rel_err(got, expected):
    return float(np.linalg.norm(got - expected) / max(np.linalg.norm(expected), 1e-30))


def check(got_device, expected, precision, what):
    got = to_host(got_device, precision)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert np.isfinite(got).all(), f"{what}: {int((~np.isfinite(got)).sum())} of {got.size} elements not written"
    err = rel_err(got, expected)
    assert err <= TOL[precision], f"{what}: relative error {err:.3g} > {TOL[precision]:g} ({precision})"
    return err


@contextlib.contextmanager
def unsupported_is_xfail(strict):
    """Non-strict cases turn cuDNN's NOT_SUPPORTED (or a fixed algorithm's refusal) into an xfail."""
    try:
        yield
    except rn.CudnnError as e:
        # NOT_SUPPORTED (3xxx) and BAD_PARAM (2xxx: e.g. a data type an op does not take); the strict cases run
        # the same code paths, so a real bug in them still fails there.
        if not strict and getattr(e, "code", 0) // 1000 in (2, 3):
            pytest.xfail(f"cuDNN does not support this case: {getattr(e, 'status', '')}: {str(e)[:200]}")
        raise
    except ValueError as e:
        if not strict and "does not support this convolution" in str(e):
            pytest.xfail(f"fixed algorithm unsupported here: {str(e)[:160]}")
        raise


# ------------------------------------------------------------------------------------------------------------------
# Problems


class Problem:
    """One convolution: logical NCHW host data in float64 (exactly representable in the storage type)."""

    def __init__(self, rng, precision, layout, n, c, h, w, k, r, s, stride=1, pad=0, dil=1, groups=1, algo="heuristic",
                 deterministic=False):
        pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
        self.precision, self.layout = precision, layout
        self.stride, self.pad, self.dil, self.groups = pair(stride), pair(pad), pair(dil), groups
        self.spec = ConvSpec(stride=self.stride, padding=self.pad, dilation=self.dil, groups=groups, layout=layout,
                             precision=precision, algo=algo, engine="legacy", deterministic=deterministic)
        self.x = representable(rng, (n, c, h, w), precision)
        self.w = representable(rng, (k, c // groups, r, s), precision)
        p = ref.output_size(h, self.pad[0], r, self.stride[0], self.dil[0])
        q = ref.output_size(w, self.pad[1], s, self.stride[1], self.dil[1])
        self.dy = representable(rng, (n, k, p, q), precision)
        self.x_shape = to_layout(self.x, layout).shape
        self.w_shape = to_layout(self.w, layout).shape
        self.y_shape = to_layout(self.dy, layout).shape

    def dev(self, a):
        return to_device(to_layout(a, self.layout), self.precision)

    def geometry(self):
        return self.stride, self.pad, self.dil, self.groups

    def forward_ref(self):
        return ref.conv2d(self.x, self.w, *self.geometry())

    def backward_data_ref(self):
        return ref.conv2d_backward_data(self.dy, self.w, self.x.shape, *self.geometry())

    def backward_filter_ref(self):
        return ref.conv2d_backward_filter(self.x, self.dy, self.w.shape, *self.geometry())

    def run_forward(self, **kwargs):
        out = poisoned(self.y_shape, self.precision)
        result = conv.conv2d(self.dev(self.x), self.dev(self.w), self.spec, out=out, **kwargs)
        assert result is out
        return out

    def run_backward_data(self):
        out = poisoned(self.x_shape, self.precision)
        assert conv.conv2d_backward_data(self.dev(self.dy), self.dev(self.w), self.spec, self.x_shape, out=out) is out
        return out

    def run_backward_filter(self):
        out = poisoned(self.w_shape, self.precision)
        result = conv.conv2d_backward_filter(self.dev(self.x), self.dev(self.dy), self.spec, self.w_shape, out=out)
        assert result is out
        return out

    def check_all(self, what):
        check(self.run_forward(), to_layout(self.forward_ref(), self.layout), self.precision, f"{what} forward")
        check(self.run_backward_data(), to_layout(self.backward_data_ref(), self.layout), self.precision,
              f"{what} backward-data")
        check(self.run_backward_filter(), to_layout(self.backward_filter_ref(), self.layout), self.precision,
              f"{what} backward-filter")


# name: (n, c, h, w, k, r, s, stride, pad, dil, groups, strict)
SHAPES = {
    "3x3": (2, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, True),
    "odd_sizes": (2, 5, 9, 11, 6, 3, 3, 1, 1, 1, 1, False),
    "stride2": (2, 8, 10, 9, 16, 3, 3, 2, 1, 1, 1, True),
    "dilation2": (2, 8, 11, 10, 8, 3, 3, 1, 2, 2, 1, False),
    "groups2": (2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 2, False),
    "depthwise": (2, 8, 9, 9, 8, 3, 3, 1, 1, 1, 8, False),
    "batch1": (1, 8, 7, 7, 8, 3, 3, 1, 0, 1, 1, True),
    "1x1": (3, 16, 6, 6, 8, 1, 1, 1, 0, 1, 1, True),
    "1x1_stride2": (2, 16, 9, 9, 32, 1, 1, 2, 0, 1, 1, True),
    "asymmetric": (2, 3, 12, 7, 4, 5, 2, (2, 1), (2, 0), (1, 2), 1, False),
}


def problem(rng, name, precision, layout, **kwargs):
    n, c, h, w, k, r, s, stride, pad, dil, groups, _ = SHAPES[name]
    return Problem(rng, precision, layout, n, c, h, w, k, r, s, stride, pad, dil, groups, **kwargs)


def fresh_cache():
    conv.clear_algorithm_cache()


@pytest.fixture(autouse=True)
def _no_workspace_cap():
    rn.set_workspace_limit(None)
    yield
    rn.set_workspace_limit(None)


# ------------------------------------------------------------------------------------------------------------------
# The reference itself (host only, but part of this file so that a GPU run covers it)


def test_reference_matches_a_direct_loop(rng):
    x, w = rng.standard_normal((2, 4, 7, 6)), rng.standard_normal((6, 2, 3, 2))
    stride, pad, dil, groups = (2, 1), (1, 2), (2, 1), 2
    y = ref.conv2d(x, w, stride, pad, dil, groups)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2)))
    for n_, k_, p_, q_ in np.ndindex(*y.shape):
        g = k_ // 3
        acc = 0.0
        for c_ in range(2):
            for i in range(3):
                for j in range(2):
                    row, col = p_ * stride[0] + i * dil[0], q_ * stride[1] + j * dil[1]
                    acc += xp[n_, g * 2 + c_, row, col] * w[k_, c_, i, j]
        assert abs(acc - y[n_, k_, p_, q_]) < 1e-12
    # The backward references are the adjoints of the forward one.
    dy = rng.standard_normal(y.shape)
    dx = ref.conv2d_backward_data(dy, w, x.shape, stride, pad, dil, groups)
    dw = ref.conv2d_backward_filter(x, dy, w.shape, stride, pad, dil, groups)
    assert np.vdot(y, dy) == pytest.approx(np.vdot(x, dx), rel=1e-12)
    assert np.vdot(y, dy) == pytest.approx(np.vdot(w, dw), rel=1e-12)


def test_bf16_conversion_rounds_to_nearest_even():
    a = np.array([1.0, 1.0 + 2**-8, 1.0 + 2**-7 + 2**-8, 1.0 + 2**-7 + 2**-9, -2.5], dtype=np.float32)
    assert ref.to_bf16_bits(a).tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020]  # ties go to the even neighbour
    assert ref.from_bf16_bits(ref.to_bf16_bits(a)).tolist() == [1.0, 1.0, 1.0 + 2**-6, 1.0 + 2**-7, -2.5]


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
    p.dy = quantize(p.forward_ref(), precision)
    y = from_layout(to_host(p.run_forward(), precision), layout)
    dx = from_layout(to_host(p.run_backward_data(), precision), layout)
    dw = from_layout(to_host(p.run_backward_filter(), precision), layout)
    for a in (y, dx, dw):
        assert np.isfinite(a).all()
    forward_side = np.vdot(y, p.dy)  # <conv(x, w), dy>
    data_side = np.vdot(p.x, dx)  # <x, conv_backward_data(dy, w)>
    filter_side = np.vdot(p.w, dw)  # <w, conv_backward_filter(x, dy)>
    assert forward_side > 0.1 * np.linalg.norm(y) * np.linalg.norm(p.dy)
    # Each inner product is off by at most (output error) x (other factor): bound it norm-wise.
    scale = np.linalg.norm(y) * np.linalg.norm(p.dy) + np.linalg.norm(p.x) * np.linalg.norm(dx)
    scale_w = np.linalg.norm(y) * np.linalg.norm(p.dy) + np.linalg.norm(p.w) * np.linalg.norm(dw)
    assert abs(forward_side - data_side) <= TOL[precision] * scale, (forward_side, data_side)
    assert abs(forward_side - filter_side) <= TOL[precision] * scale_w, (forward_side, filter_side)
    # Not vacuous: the identity fails for a wrong gradient (here: dx of the wrong sign pattern).
    assert abs(forward_side - np.vdot(p.x, np.flip(dx, axis=3))) > TOL[precision] * scale


# ------------------------------------------------------------------------------------------------------------------
# Fused conv + bias + residual + ReLU


def epilogue_ref(p, bias, z, activation, alpha1, alpha2):
    y = alpha1 * p.forward_ref() + bias.reshape(1, -1, 1, 1)
    if z is not None:
        y = y + alpha2 * z
    return np.maximum(y, 0.0) if activation == "relu" else y


# (case, algo, use_bias, use_z, activation, alpha1, alpha2, expected path prefix or None)
EPILOGUES = [
    ("bias_relu", "IMPLICIT_PRECOMP_GEMM", True, False, "relu", 1.0, 1.0, None),
    ("bias_z_relu", "IMPLICIT_PRECOMP_GEMM", True, True, "relu", 0.5, 0.75, None),
    ("bias_z_identity", "IMPLICIT_PRECOMP_GEMM", True, True, "identity", 1.0, -1.0, None),
    ("identity_not_ipg", "IMPLICIT_GEMM", True, True, "identity", 1.0, 1.0, "unfused: identity activation"),
    ("no_bias", "IMPLICIT_PRECOMP_GEMM", False, True, "relu", 1.0, 1.0, "unfused: cudnnConvolutionBiasActivation"),
    ("find", "find", True, True, "relu", 1.0, 1.0, None),
]


def run_epilogue(rng, precision, layout, case):
    name, algo, use_bias, use_z, activation, alpha1, alpha2, expected = case
    p = Problem(rng, precision, layout, 2, 8, 9, 9, 16, 3, 3, 1, 1, algo=algo)
    bias = representable(rng, (16,), precision)
    z = representable(rng, p.dy.shape, precision) if use_z else None
    out = poisoned(p.y_shape, precision)
    result = conv.conv2d(p.dev(p.x), p.dev(p.w), p.spec, bias=to_device(bias, precision) if use_bias else None,
                         z=p.dev(z) if use_z else None, activation=activation, alpha1=alpha1, alpha2=alpha2, out=out)
    assert result is out
    bias_ref = bias if use_bias else np.zeros(16)
    check(out, to_layout(epilogue_ref(p, bias_ref, z, activation, alpha1, alpha2), layout), precision,
          f"{name} {layout} {precision}")
    fused = conv.fused_name(bias=use_bias, z=use_z, activation=activation)
    chosen = conv.last_algorithm(p.x_shape, p.w_shape, p.spec, fused=fused)
    assert chosen is not None
    path = chosen["fused_path"]
    assert path == "fused" or path.startswith("unfused: "), path
    if expected is not None:
        assert path.startswith(expected), path
    return p, path


# Where IMPLICIT_PRECOMP_GEMM / IMPLICIT_GEMM are certain to exist: a failure there is a failure.
STRICT_FIXED = {("NCHW", "fp32"), ("NCHW", "fp16"), ("NHWC", "fp16")}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_conv_bias_act_matches_reference(rng, layout, precision):
    strict = (layout, precision) in STRICT_FIXED
    paths = {}
    for case in EPILOGUES:
        with unsupported_is_xfail(strict):
            paths[case[0]] = run_epilogue(rng, precision, layout, case)[1]
    # A second call of a refused combination runs unfused again without asking cuDNN (cached path).
    with unsupported_is_xfail(strict):
        assert run_epilogue(rng, precision, layout, EPILOGUES[3])[1] == paths["identity_not_ipg"]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_unfused_epilogue_when_fusion_is_disabled(rng, layout, precision):
    case = EPILOGUES[1]
    with unsupported_is_xfail((layout, precision) in STRICT_FIXED):
        p, path = run_epilogue(rng, precision, layout, case)
        with conv._fusion_disabled():
            p2, path2 = run_epilogue(rng, precision, layout, case)  # checked against the reference inside
        assert path2 == path  # running unfused on request is not recorded as cuDNN refusing


def test_fused_and_unfused_paths_both_run(rng):
    """Both paths exist: cuDNN fuses conv + bias + residual + ReLU with IMPLICIT_PRECOMP_GEMM in at least one of
    the classic configurations, and identity without IMPLICIT_PRECOMP_GEMM always runs unfused."""
    fused = []
    for precision, layout in [("fp32", "NCHW"), ("fp16", "NHWC"), ("fp16", "NCHW"), ("fp32", "NHWC")]:
        try:
            fused.append(run_epilogue(rng, precision, layout, EPILOGUES[1])[1])
        except ValueError as e:
            if "does not support this convolution" not in str(e):
                raise
    assert "fused" in fused, fused
    assert run_epilogue(rng, "fp32", "NCHW", EPILOGUES[3])[1].startswith("unfused")


# ------------------------------------------------------------------------------------------------------------------
# Backward bias and accumulation


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_bias(rng, layout, precision):
    dy = representable(rng, (3, 24, 7, 9), precision)
    out = poisoned((24,), precision)
    with unsupported_is_xfail(precision != "bf16"):
        assert conv.conv2d_backward_bias(to_device(to_layout(dy, layout), precision), layout, out=out) is out
    check(out, dy.sum(axis=(0, 2, 3)), precision, f"backward bias {layout} {precision}")
    allocated = conv.conv2d_backward_bias(to_device(to_layout(dy, layout), precision), layout)
    check(allocated, dy.sum(axis=(0, 2, 3)), precision, "backward bias (allocated)")


@pytest.mark.parametrize("algo", ["find", "heuristic"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_backward_filter_accumulates(rng, algo, precision):
    fresh_cache()
    p = problem(rng, "3x3", precision, "NHWC", algo=algo)
    dw0 = representable(rng, p.w.shape, precision)
    out = p.dev(dw0)
    conv.conv2d_backward_filter(p.dev(p.x), p.dev(p.dy), p.spec, p.w_shape, out=out, accumulate=True)
    # The search must not have clobbered dw (find searches on scratch space when accumulating).
    check(out, to_layout(dw0 + p.backward_filter_ref(), "NHWC"), precision, f"accumulate {algo} {precision}")


def test_outputs_are_allocated_when_out_is_none(rng):
    p = problem(rng, "stride2", "fp16", "NHWC")
    y = conv.conv2d(p.dev(p.x), p.dev(p.w), p.spec)
    dx = conv.conv2d_backward_data(p.dev(p.dy), p.dev(p.w), p.spec, p.x_shape)
    dw = conv.conv2d_backward_filter(p.dev(p.x), p.dev(p.dy), p.spec, p.w_shape)
    assert y.shape == p.y_shape and str(y.dtype) == "float16"
    check(y, to_layout(p.forward_ref(), "NHWC"), "fp16", "allocated forward")
    check(dx, to_layout(p.backward_data_ref(), "NHWC"), "fp16", "allocated backward-data")
    check(dw, to_layout(p.backward_filter_ref(), "NHWC"), "fp16", "allocated backward-filter")
    bf = problem(rng, "3x3", "bf16", "NCHW")
    y16 = conv.conv2d(bf.dev(bf.x), bf.dev(bf.w), bf.spec)
    assert str(y16.dtype) == "uint16"
    check(y16, bf.forward_ref(), "bf16", "allocated bf16 forward")


# ------------------------------------------------------------------------------------------------------------------
# The algorithm cache


def test_cache_hits_do_not_rerun_find(rng, tmp_path):
    fresh_cache()
    p = Problem(rng, "fp16", "NHWC", 4, 16, 12, 12, 24, 3, 3, 1, 1, algo="find")
    s0 = conv.algorithm_cache_stats()
    p.check_all("first")  # one search per direction
    s1 = conv.algorithm_cache_stats()
    assert s1["finds"] - s0["finds"] == 3 and s1["misses"] - s0["misses"] == 3
    for _ in range(3):
        q = Problem(rng, "fp16", "NHWC", 4, 16, 12, 12, 24, 3, 3, 1, 1, algo="find")  # same shapes, new data
        q.check_all("again")
    s2 = conv.algorithm_cache_stats()
    assert s2["finds"] == s1["finds"], "a cache hit ran Find again"
    assert s2["hits"] - s1["hits"] == 9

    # A fused forward of the same problem reuses the plain forward's search.
    bias = to_device(representable(rng, (24,), "fp16"), "fp16")
    conv.conv2d(p.dev(p.x), p.dev(p.w), p.spec, bias=bias, activation="relu")
    assert conv.algorithm_cache_stats()["finds"] == s2["finds"]

    # Saved, cleared and loaded: still no search, and the same choices.
    saved = {e["key"]: e for e in conv.algorithm_cache_entries()}
    path = tmp_path / "algos.json"
    assert conv.save_algorithm_cache(path) == len(saved)
    conv.clear_algorithm_cache()
    assert conv.load_algorithm_cache(path) == len(saved)
    p.check_all("after reload")
    s3 = conv.algorithm_cache_stats()
    assert s3["finds"] == s2["finds"]
    for direction in conv.DIRECTIONS:
        entry = conv.last_algorithm(p.x_shape, p.w_shape, p.spec, direction)
        assert entry["algo"] == saved[entry["key"]]["algo"]
        assert entry["math_type"] == saved[entry["key"]]["math_type"]


def test_loading_a_cache_from_another_gpu_is_ignored(rng, tmp_path):
    fresh_cache()
    p = problem(rng, "3x3", "fp32", "NCHW", algo="heuristic")
    p.check_all("populate")
    path = tmp_path / "algos.json"
    conv.save_algorithm_cache(path)
    import json

    payload = json.loads(path.read_text())
    payload["gpu"] = "Some Other GPU"
    path.write_text(json.dumps(payload))
    conv.clear_algorithm_cache()
    with pytest.warns(UserWarning, match="ignored"):
        assert conv.load_algorithm_cache(path) == 0
    assert conv.algorithm_cache_entries() == []


def test_workspace_cap_forces_algorithms_without_workspace(rng):
    fresh_cache()
    try:
        rn.set_workspace_limit(0)
        for algo in ("find", "heuristic"):
            p = problem(rng, "3x3", "fp32", "NCHW", algo=algo)
            p.check_all(f"cap 0 {algo}")
            for direction in conv.DIRECTIONS:
                chosen = conv.last_algorithm(p.x_shape, p.w_shape, p.spec, direction)
                assert chosen["workspace"] == 0 and " ws=0" in chosen["key"], chosen
    finally:
        rn.set_workspace_limit(None)


def test_fixed_algorithm_falls_back_when_its_workspace_is_capped(rng):
    fresh_cache()
    p = None
    for name in ("FFT_TILING", "FFT", "GEMM", "WINOGRAD_NONFUSED", "IMPLICIT_PRECOMP_GEMM"):
        candidate = problem(rng, "3x3", "fp32", "NCHW", algo=name)
        try:
            check(candidate.run_forward(), candidate.forward_ref(), "fp32", f"fixed {name}")
        except ValueError as e:
            if "does not support" in str(e):
                continue
            raise
        except rn.CudnnError as e:
            if getattr(e, "code", 0) // 1000 in (2, 3):  # refused when run: try the next one
                continue
            raise
        chosen = conv.last_algorithm(candidate.x_shape, candidate.w_shape, candidate.spec)
        assert chosen["mode"] == "fixed" and chosen["algo_name"] == name
        if chosen["workspace"] > 0:
            p = candidate
            break
    if p is None:
        pytest.skip("no fixed forward algorithm needs workspace for this problem")
    try:
        rn.set_workspace_limit(0)
        check(p.run_forward(), p.forward_ref(), "fp32", "fixed algorithm under a zero workspace cap")
        chosen = conv.last_algorithm(p.x_shape, p.w_shape, p.spec)
        assert chosen["workspace"] == 0 and chosen["mode"] == "heuristic" and chosen["algo_name"] != name, chosen
    finally:
        rn.set_workspace_limit(None)


# ------------------------------------------------------------------------------------------------------------------
# Determinism, streams, descriptor counts, errors


@pytest.mark.parametrize("algo", ["find", "heuristic"])
@pytest.mark.parametrize("precision,layout", [("fp32", "NCHW"), ("fp16", "NHWC")])
def test_deterministic_mode(rng, algo, precision, layout):
    fresh_cache()
    p = Problem(rng, precision, layout, 8, 32, 16, 16, 32, 3, 3, 1, 1, algo=algo, deterministic=True)
    results = []
    for _ in range(2):
        dx, dw = p.run_backward_data(), p.run_backward_filter()
        results.append((to_host(dx, precision), to_host(dw, precision)))
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])
    check(dw, to_layout(p.backward_filter_ref(), layout), precision, "deterministic backward-filter")
    for direction in ("backward_data", "backward_filter"):
        chosen = conv.last_algorithm(p.x_shape, p.w_shape, p.spec, direction)
        assert " det=1 " in chosen["key"]
        assert rn._C.conv_algo_is_deterministic(getattr(rn._C.Direction, direction), chosen["algo"]), chosen


def test_deterministic_mode_refuses_a_non_deterministic_fixed_algorithm(rng):
    p = Problem(rng, "fp32", "NCHW", 2, 8, 8, 8, 8, 3, 3, 1, 1, algo="bwd_filter=ALGO_0", deterministic=True)
    with pytest.raises(ValueError, match="non-deterministic"):
        p.run_backward_filter()


def test_ops_run_on_cupys_current_stream(rng):
    import cupy as cp

    p = problem(rng, "3x3", "fp32", "NCHW")
    x = cp.full(p.x_shape, np.nan, dtype=cp.float32)
    w, dy = p.dev(p.w), p.dev(p.dy)
    new_x = p.dev(p.x)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        big = cp.ones((4096, 4096), dtype=cp.float32)
        for _ in range(3):
            big = big @ big * (1.0 / 4096)  # keeps the stream busy for a few milliseconds
        x[...] = new_x * big[0, 0]  # big[0, 0] == 1: x becomes valid only after the busy work, in stream order
        y = poisoned(p.y_shape, "fp32")
        conv.conv2d(x, w, p.spec, out=y)
        dw = poisoned(p.w_shape, "fp32")
        conv.conv2d_backward_filter(x, dy, p.spec, p.w_shape, out=dw)
        assert rn._C._handle_stream(stream.ptr) == stream.ptr
    stream.synchronize()
    check(y, p.forward_ref(), "fp32", "forward on a side stream")
    check(dw, p.backward_filter_ref(), "fp32", "backward-filter on a side stream")


def test_descriptor_counts_return_to_baseline(rng):
    def live():
        return {k: v for k, v in rn.live_descriptors().items() if k != "handle" and v != 0}

    rn._drop_cached_descriptors()
    before = live()
    for precision in PRECISIONS:
        p = problem(rng, "stride2", precision, "NHWC")
        p.check_all(precision)
        if precision in ("fp32", "fp16"):
            run_epilogue(rng, precision, "NCHW", EPILOGUES[1])
    assert live() != before  # descriptor groups are cached...
    rn._drop_cached_descriptors()
    assert live() == before  # ...and all of them are released


def test_shape_errors_name_the_problem(rng):
    p = problem(rng, "3x3", "fp32", "NCHW")
    with pytest.raises(ValueError, match="dy"):
        conv.conv2d_backward_data(p.dev(p.x), p.dev(p.w), p.spec, p.x_shape)  # x where dy belongs
    with pytest.raises(TypeError, match="x"):
        conv.conv2d(p.dev(p.x).astype("float16"), p.dev(p.w), p.spec)
