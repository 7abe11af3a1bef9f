"""Graph (backend) API convolution engine, CPU side: building operation graphs, validation, knob strings and the
numerical-note filter. None of this needs a GPU.

Finalizing a backend tensor makes cuDNN 9 load its engine sublibraries, which link the CUDA driver
(libcuda.so.1). On a machine without the driver that fails cleanly (CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED) and
the graph-building tests skip; they run wherever the driver library exists (the GPU machine, or a CPU machine
with the driver installed).
"""

import functools

import pytest

import resnet_native as rn
from resnet_native.ops import conv

C = rn._C

X = (2, 8, 9, 9)  # logical N, C, H, W
W = (16, 8, 3, 3)  # K, C / groups, R, S
DIRECTIONS = ["forward", "backward_data", "backward_filter"]
OP_KIND = {
    "forward": "op_conv_forward",
    "backward_data": "op_conv_backward_data",
    "backward_filter": "op_conv_backward_filter",
}
UID_X, UID_W, UID_Y, UID_Z, UID_BIAS = 1, 2, 3, 4, 5

# Numerical notes (cudnnBackendNumericalNote_t).
TENSOR_CORE, DOWN_CONVERT, REDUCED_PRECISION, FFT, NONDETERMINISTIC, WINOGRAD = 0, 1, 2, 3, 4, 5


def in_layout(shape_nchw, layout):
    """A logical NCHW activation / KCRS filter shape in the layout's order."""
    n, c, h, w = shape_nchw
    return shape_nchw if layout == "NCHW" else (n, h, w, c)


def key(direction, precision, layout, x, w, *, pad=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1,
        epilogue="none", deterministic=False):
    """The graph-engine key of a problem (logical x, w shapes), built by the ops' own validation."""
    spec = conv.ConvSpec(stride=stride, padding=pad, dilation=dilation, groups=groups, layout=layout,
                         precision=precision, algo="heuristic", engine="graph", deterministic=deterministic)
    return C.conv_key(getattr(C.Direction, direction), in_layout(x, layout), in_layout(w, layout),
                      conv._native_spec(spec, direction), epilogue)


def with_fields(text, **fields):
    """A key with some fields replaced (shapes as tuples): a problem no op would build."""
    tokens = text.split()
    for name, value in fields.items():
        value = ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)
        index = next(i for i, t in enumerate(tokens) if t.startswith(name + "="))
        tokens[index] = f"{name}={value}"
    return " ".join(tokens)


def backend_live():
    return {k: v for k, v in rn.live_descriptors().items() if k.startswith("backend.")}


def assert_flat(before, context=""):
    """Every backend descriptor kind is back to its count in `before`."""
    grown = {k: (before.get(k, 0), v) for k, v in backend_live().items() if v != before.get(k, 0)}
    assert not grown, f"backend descriptor counts changed {context}(kind: (before, after)): {grown}"


@functools.lru_cache(maxsize=1)
def backend_finalize_error():
    """None when backend descriptors finalize here, else the CudnnError status explaining why not."""
    try:
        C._testing.graph_build_operations(key("forward", "fp32", "NCHW", X, W, pad=(1, 1)))
    except rn.CudnnError as e:
        return e.status
    return None


def needs_backend_finalize():
    status = backend_finalize_error()
    if status is not None:
        pytest.skip(
            f"cuDNN cannot finalize backend descriptors here ({status}: its engine sublibraries need the "
            "CUDA driver library libcuda.so.1)"
        )


def test_plan_cache_clears_without_a_gpu():
    C.graph_clear_plans()
    assert C.graph_num_plans() == 0
    rn._drop_cached_descriptors()  # both engines' caches, the graph engine's plans among them
    assert C.graph_num_plans() == 0


def test_backend_finalize_works_or_fails_cleanly():
    before = backend_live()
    status = backend_finalize_error()
    if status is None:
        built = C._testing.graph_build_operations(key("forward", "fp16", "NHWC", X, W, pad=(1, 1)))
        assert built["num_operations"] == 1
    else:
        # Only a missing driver library is an acceptable reason on a CPU-only machine.
        assert status == "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED"
        with pytest.raises(rn.CudnnError, match="graph conv forward fp16 NHWC x=\\(2, 8, 9, 9\\)"):
            C._testing.graph_build_operations(key("forward", "fp16", "NHWC", X, W, pad=(1, 1)))
    assert_flat(before)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_build_single_convolution(direction, layout, precision):
    needs_backend_finalize()
    before = backend_live()
    built = C._testing.graph_build_operations(key(direction, precision, layout, X, W, pad=(1, 1), stride=(2, 2)))
    assert built["parts"] == {"tensor": 3, "convolution": 1, OP_KIND[direction]: 1}
    assert built["num_operations"] == 1
    assert built["io_uids"] == [UID_X, UID_W, UID_Y]
    assert f"x={X}" in built["problem"] and "y=(2, 16, 5, 5)" in built["problem"]
    assert_flat(before)


@pytest.mark.parametrize(
    "epilogue, tensors, pointwise_descs, pointwise_ops, io_uids",
    [
        ("bias", 5, 1, 1, [UID_X, UID_W, UID_Y, UID_BIAS]),
        ("relu", 4, 1, 1, [UID_X, UID_W, UID_Y]),
        ("residual", 5, 1, 1, [UID_X, UID_W, UID_Y, UID_Z]),
        ("bias+relu", 6, 2, 2, [UID_X, UID_W, UID_Y, UID_BIAS]),
        ("residual+relu", 6, 2, 2, [UID_X, UID_W, UID_Y, UID_Z]),
        ("bias+residual", 7, 1, 2, [UID_X, UID_W, UID_Y, UID_Z, UID_BIAS]),
        ("bias+residual+relu", 8, 2, 3, [UID_X, UID_W, UID_Y, UID_Z, UID_BIAS]),
    ],
)
def test_build_fused_epilogues(epilogue, tensors, pointwise_descs, pointwise_ops, io_uids):
    # Tensors: x, w, y (+ z, bias) + one virtual fp32 intermediate per operation before the last.
    needs_backend_finalize()
    built = C._testing.graph_build_operations(
        key("forward", "fp16", "NHWC", X, W, pad=(1, 1), epilogue=epilogue), alpha1=0.5, alpha2=2.0
    )
    assert built["parts"] == {
        "tensor": tensors,
        "convolution": 1,
        "op_conv_forward": 1,
        "pointwise": pointwise_descs,
        "op_pointwise": pointwise_ops,
    }
    assert built["num_operations"] == 1 + pointwise_ops
    assert built["io_uids"] == io_uids


@pytest.mark.parametrize(
    "x, w, kwargs, y",
    [
        ((1, 8, 7, 5), (6, 4, 3, 3), dict(groups=2, pad=(1, 1)), (1, 6, 7, 5)),  # grouped
        ((3, 6, 11, 9), (6, 1, 3, 3), dict(groups=6, pad=(2, 2), dilation=(2, 2)), (3, 6, 11, 9)),  # depthwise
        ((2, 5, 9, 9), (7, 5, 1, 1), dict(stride=(2, 2)), (2, 7, 5, 5)),  # 1x1 stride 2
        ((1, 3, 5, 5), (4, 3, 5, 5), dict(), (1, 4, 1, 1)),  # filter covers the image
    ],
)
def test_build_groups_dilation_strides(x, w, kwargs, y):
    needs_backend_finalize()
    for direction in DIRECTIONS:
        built = C._testing.graph_build_operations(key(direction, "fp32", "NHWC", x, w, **kwargs))
        assert f"y={y}" in built["problem"]
        assert built["parts"]["tensor"] == 3


def test_half_built_graph_is_released_at_every_point():
    needs_backend_finalize()
    before = backend_live()
    problem = key("forward", "bf16", "NHWC", X, W, pad=(1, 1), epilogue="bias+residual+relu")
    total = C._testing.graph_build_operations(problem)["num_parts"]
    assert total == 15
    for n in range(total + 1):
        with pytest.raises(rn.CudnnError, match=f"injected failure after {n} parts"):
            C._testing.graph_build_operations(problem, fail_after_parts=n)
        assert_flat(before, f"after failing at part {n} ")


def test_cudnn_rejection_mid_build_names_the_shape_and_leaks_nothing():
    # validate=False lets an inconsistent output shape reach cuDNN, which refuses the convolution operation
    # after the tensors and the convolution descriptor exist.
    needs_backend_finalize()
    before = backend_live()
    with pytest.raises(rn.CudnnError) as info:
        bad = with_fields(key("forward", "fp16", "NHWC", X, W, pad=(1, 1)), y=(2, 16, 4, 4))
        C._testing.graph_build_operations(bad, validate=False)
    assert info.value.status in ("CUDNN_STATUS_BAD_PARAM", "CUDNN_STATUS_NOT_SUPPORTED")
    assert "y=(2, 16, 4, 4)" in str(info.value) and "cudnnBackendFinalize" in str(info.value)
    assert_flat(before)


def test_repeated_builds_keep_counts_flat():
    needs_backend_finalize()
    before = backend_live()
    for _ in range(50):
        C._testing.graph_build_operations(key("forward", "fp16", "NHWC", X, W, pad=(1, 1), epilogue="bias+relu"))
        C._testing.graph_build_operations(key("backward_filter", "fp32", "NCHW", X, W, pad=(1, 1)), beta=1.0)
    assert_flat(before)


# (fields of a valid key replaced to make it invalid, extra build arguments, message); the problem is X, W
# unless the fields say otherwise.
INVALID = [
    (dict(groups=3), {}, "input channels must equal filter channels \\* groups"),
    (dict(w=(15, 4, 3, 3), y=(2, 15, 7, 7), groups=2), {}, "output channels must be divisible by groups"),
    (dict(y=(2, 16, 4, 4)), {}, "output spatial size 4 does not match"),
    (dict(y=(2, 15, 7, 7)), {}, "output must have shape"),
    (dict(stride=(0, 1)), {}, "stride and dilation >= 1"),
    (dict(pad=(-1, 0), y=(2, 16, 5, 7)), {}, "pad must be >= 0"),
    (dict(groups=0, y=(2, 16, 7, 7)), {}, "groups must be >= 1"),
    (dict(x=(2, 8, 2, 2), y=(2, 16, 1, 1)), {}, "does not match"),
    (dict(dir="bwd_data", epi="relu"), {}, "epilogues exist only for the forward direction"),
    (dict(epi="bias"), dict(beta=1.0), "beta must be 0 with a fused epilogue"),
]


@pytest.mark.parametrize("fields, kwargs, message", INVALID)
def test_invalid_problems_raise_value_error_naming_the_shape(fields, kwargs, message):
    # Validation runs before any cuDNN call, so this holds with or without the driver.
    x, w = fields.get("x", X), fields.get("w", W)
    problem = with_fields(key("forward", "fp16", "NHWC", X, W), **fields)
    before = backend_live()
    with pytest.raises(ValueError, match=message) as info:
        C._testing.graph_build_operations(problem, **kwargs)
    assert f"x={x}" in str(info.value) and f"w={w}" in str(info.value)
    assert_flat(before)


def test_bad_fields_raise_value_error():
    good = key("forward", "fp16", "NHWC", X, W)
    with pytest.raises(ValueError, match="direction"):
        C._testing.graph_build_operations(with_fields(good, dir="sideways"))
    with pytest.raises(ValueError, match="epilogue: unknown part 'gelu'"):
        C._testing.graph_build_operations(with_fields(good, epi="bias+gelu"))
    with pytest.raises(ValueError):
        C._testing.graph_build_operations(with_fields(good, prec="fp64"))
    with pytest.raises(ValueError):
        C._testing.graph_build_operations(with_fields(good, layout="CHWN"))


def test_describe_problem():
    text = C._testing.graph_describe_problem(
        key(
            "forward",
            "bf16",
            "NHWC",
            (4, 64, 32, 32),
            (128, 32, 3, 3),
            pad=(1, 1),
            stride=(2, 2),
            groups=2,
            epilogue="bias+residual+relu",
            deterministic=True,
        )
    )
    assert text == (
        "graph conv forward bf16 NHWC x=(4, 64, 32, 32) w=(128, 32, 3, 3) y=(4, 128, 16, 16) pad=(1, 1) "
        "stride=(2, 2) dilation=(1, 1) groups=2 epilogue=bias+residual+relu deterministic"
    )
    text = C._testing.graph_describe_problem(key("backward_filter", "fp32", "NCHW", X, W))
    assert text.startswith("graph conv backward-filter fp32 NCHW") and "epilogue" not in text


def test_knobs_round_trip():
    knobs = [(3, 1), (17, 0), (25, -2), (0, 123456789012)]
    text = C._testing.graph_format_knobs(knobs)
    assert text == "3=1;17=0;25=-2;0=123456789012"
    assert C._testing.graph_parse_knobs(text) == knobs
    assert C._testing.graph_parse_knobs("") == []
    assert C._testing.graph_format_knobs([]) == ""


@pytest.mark.parametrize("text", ["3", "=1", "3=", "a=1", "3=1;;", "3=1x", "-1=2", "3=1;4"])
def test_malformed_knobs_raise_value_error(text):
    with pytest.raises(ValueError, match="knobs: malformed"):
        C._testing.graph_parse_knobs(text)


def test_numerical_note_filter():
    def forbidden(precision, deterministic, notes):
        return C._testing.graph_forbidden_notes(getattr(C.Precision, precision), deterministic, notes)

    # Tensor cores on fp32 data mean TF32: only strict fp32 forbids them.
    assert "TF32" in forbidden("fp32", False, [TENSOR_CORE])
    for precision in ["tf32", "fp16", "bf16"]:
        assert forbidden(precision, False, [TENSOR_CORE]) == ""
    # Every mode promises fp32 accumulation and undegraded inputs.
    for precision in ["fp32", "tf32", "fp16", "bf16"]:
        assert "down-converts" in forbidden(precision, False, [DOWN_CONVERT])
        assert "reduced precision" in forbidden(precision, False, [REDUCED_PRECISION])
        assert forbidden(precision, False, [FFT, WINOGRAD]) == ""
    # Non-determinism only matters in deterministic mode.
    assert forbidden("fp16", False, [NONDETERMINISTIC]) == ""
    assert "non-deterministic" in forbidden("fp16", True, [NONDETERMINISTIC])
    assert forbidden("fp16", True, []) == ""
    with pytest.raises(ValueError):
        forbidden("fp16", False, [40])
