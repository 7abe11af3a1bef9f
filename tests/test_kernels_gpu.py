"""The elementwise kernels (the weighted add and the scale too), cast and the cudnnAddTensor path on a GPU, against
float64 NumPy references on fresh random data: odd sizes (1, 7, 1023, 1M+3), misaligned views (scalar path), all
dtypes, poisoned outputs, in-place aliasing and a non-default stream."""

import numpy as np
import pytest
from device_values import check_close, host_values, poisoned, to_device
from fake_arrays import DLPackOnly

import resnet_native as rn
from resnet_native import reference
from resnet_native._core.names import ARRAY_DTYPES
from resnet_native.ops import kernels

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

DTYPES = ["fp32", "fp16", "bf16"]
SIZES = [1, 7, 1023, 1_000_003]


def expected(op, u, v):
    """The float64 reference of `op` on the exact input values (the result not rounded to the storage dtype)."""
    fn = getattr(reference.kernels, op)
    return fn(u) if op == "relu" else fn(u, v)


def operands(op, shape, dtype, rng):
    u = rng.standard_normal(shape) * 3.0
    v = rng.standard_normal(shape) * 3.0
    if op in ("relu_backward", "add_relu_backward"):
        v = np.maximum(v, 0.0)  # y is a ReLU output: about half zeros
    # A positive first element keeps every result nonzero somewhere, even for n == 1.
    u.flat[0], v.flat[0] = abs(u.flat[0]) + 0.5, abs(v.flat[0]) + 0.5
    du, hu = to_device(u, dtype)
    dv, hv = to_device(v, dtype)
    return du, hu, dv, hv


def run(op, du, dv, dtype, out):
    fn = getattr(kernels, op)
    if op == "relu":
        return fn(du, out=out, dtype=dtype)
    return fn(du, dv, out=out, dtype=dtype)


OPS = ["add", "add_relu", "relu", "relu_backward", "add_relu_backward"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", OPS)
def test_op_matches_reference(op, n, dtype, rng):
    du, hu, dv, hv = operands(op, (n,), dtype, rng)
    out = poisoned((n,), dtype)
    result = run(op, du, dv, dtype, out)
    assert result is out
    check_close(out, expected(op, hu, hv), dtype, f"{op} n={n}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_op_allocates_output_and_keeps_4d_shapes(op, dtype, rng):
    shape = (3, 5, 7, 11)
    du, hu, dv, hv = operands(op, shape, dtype, rng)
    out = run(op, du, dv, dtype, None)
    assert out.shape == shape and out.dtype == du.dtype
    check_close(out, expected(op, hu, hv), dtype, f"{op} 4-D")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1023, 1_000_003])
@pytest.mark.parametrize("op", OPS)
def test_misaligned_views_take_the_scalar_path(op, n, dtype, rng):
    du, hu, dv, hv = operands(op, (n + 1,), dtype, rng)
    # Views starting one element in: 4- or 2-byte offsets, never 16-byte aligned.
    u, v = du[1:], dv[1:]
    assert u.data.ptr % 16 != 0
    out_base = poisoned((n + 1,), dtype)
    out = out_base[1:]
    run(op, u, v, dtype, out)
    check_close(out, expected(op, hu[1:], hv[1:]), dtype, f"{op} misaligned n={n}")
    # Only the output misaligned: inputs aligned.
    du2, hu2, dv2, hv2 = operands(op, (n,), dtype, rng)
    out_base = poisoned((n + 1,), dtype)
    run(op, du2, dv2, dtype, out_base[1:])
    check_close(out_base[1:], expected(op, hu2, hv2), dtype, f"{op} misaligned out n={n}")
    head = host_values(out_base[:1])
    assert np.isnan(head).all(), "the element before the output view was overwritten"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_in_place_on_either_input(op, dtype, rng):
    n = 100_003
    du, hu, dv, hv = operands(op, (n,), dtype, rng)
    want = expected(op, hu, hv)
    run(op, du, dv, dtype, du)  # out is the first input
    check_close(du, want, dtype, f"{op} in place (first input)")
    if op != "relu":
        du, hu, dv, hv = operands(op, (n,), dtype, rng)
        want = expected(op, hu, hv)
        run(op, du, dv, dtype, dv)  # out is the second input
        check_close(dv, want, dtype, f"{op} in place (second input)")


@pytest.mark.parametrize("dtype", DTYPES)
def test_runs_on_the_current_cupy_stream(dtype, rng):
    n = 4_000_037
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        du, hu, dv, hv = operands("add_relu", (n,), dtype, rng)
        a = du * 1  # produced on `stream`: the kernel must be ordered after it
        out = kernels.add_relu(a, dv, dtype=dtype)
        out2 = kernels.relu_backward(out, out, dtype=dtype)  # consumes `out` on the same stream
        got = out.get(stream=stream)
        got2 = out2.get(stream=stream)
        stream.synchronize()
    check_close(got, expected("add_relu", hu, hv), dtype, "add_relu on a side stream")
    assert np.array_equal(host_values(got2), host_values(got))  # y > 0 ? y : 0 == y for a ReLU output


def test_nan_and_inf_propagate_like_pytorch():
    x = cp.asarray(np.array([np.nan, -1.0, 2.0, np.inf, -np.inf], np.float32))
    assert np.array_equal(cp.asnumpy(kernels.relu(x)), np.array([np.nan, 0, 2, np.inf, 0], np.float32),
                          equal_nan=True)
    dy = cp.asarray(np.array([np.inf, np.inf, 1.0, np.nan, 5.0], np.float32))
    y = cp.asarray(np.array([0.0, 1.0, np.nan, 2.0, -0.0], np.float32))
    got = cp.asnumpy(kernels.relu_backward(dy, y))
    assert np.array_equal(got, np.array([0, np.inf, 1.0, np.nan, 0], np.float32), equal_nan=True)


# ---- cast ----------------------------------------------------------------------------------------------------------
def cast_expected(source, dst):
    """What cast() must write, bit for bit, from a host storage array `source` (uint16: bf16) to dtype `dst`."""
    return reference.kernels.cast(source, np.empty(source.shape, ARRAY_DTYPES[dst]))


def accumulate_expected(x, src, out, dst):
    """What cast(x, out, accumulate=True) must leave in out, bit for bit: NumPy's float32 sum of the two host
    storage arrays' values, converted to dtype `dst`."""
    as32 = [reference.storage.decode(a, d).astype(np.float32) for a, d in ((x, src), (out, dst))]
    return cast_expected(as32[0] + as32[1], dst)


def cast_source(n, rng):
    v = rng.standard_normal(n) * 50.0
    specials = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 1e5, -1e5, 6e-8, 1e-9, 3.0e38, np.inf, -np.inf,
                         1.00390625, 1.01171875, 0.1, 1 / 3])
    v[: min(n, len(specials))] = specials[: min(n, len(specials))]
    return v


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dst", DTYPES)
@pytest.mark.parametrize("src", DTYPES)
def test_cast_is_round_to_nearest_even_bit_for_bit(src, dst, n, rng):
    dx, _ = to_device(cast_source(n, rng), src)
    out = poisoned((n,), dst)
    want = cast_expected(cp.asnumpy(dx), dst)
    kernels.cast(dx, out)
    got = cp.asnumpy(out)
    if dst == "fp32":
        assert np.array_equal(got, want), f"{src}->{dst}: {np.count_nonzero(got != want)} elements differ"
    else:
        got_bits, want_bits = got.view(np.uint16), np.asarray(want).view(np.uint16)
        assert np.array_equal(got_bits, want_bits), f"{src}->{dst}: {np.count_nonzero(got_bits != want_bits)} differ"


@pytest.mark.parametrize("dst", DTYPES)
@pytest.mark.parametrize("src", DTYPES)
def test_cast_of_misaligned_views(src, dst, rng):
    n = 100_001
    dx, _ = to_device(cast_source(n + 1, rng), src)
    out_base = poisoned((n + 1,), dst)
    kernels.cast(dx[1:], out_base[1:])
    want = cast_expected(cp.asnumpy(dx)[1:], dst)
    got = cp.asnumpy(out_base[1:])
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dst", DTYPES)
@pytest.mark.parametrize("src", DTYPES)
def test_cast_accumulate_adds_in_fp32_and_rounds_once(src, dst, n, rng):
    """out += x: both operands' exact values summed in fp32, then rounded to out's dtype (round to nearest even),
    the same bits as NumPy's float32 sum converted to out's storage."""
    dx, _ = to_device(rng.standard_normal(n) * 3.0, src)
    dout, _ = to_device(rng.standard_normal(n) * 100.0, dst)
    want = accumulate_expected(cp.asnumpy(dx), src, cp.asnumpy(dout), dst)
    assert kernels.cast(dx, dout, accumulate=True) is dout
    got = cp.asnumpy(dout)
    differ = np.count_nonzero(got.view(np.uint8) != want.view(np.uint8))
    assert differ == 0, f"{src} into {dst}: {differ} bytes differ"


@pytest.mark.parametrize("dst", DTYPES)
def test_cast_accumulate_of_misaligned_views(dst, rng):
    n = 100_001
    dx, _ = to_device(rng.standard_normal(n + 1), "fp16")
    dout, _ = to_device(rng.standard_normal(n + 1), dst)
    want = accumulate_expected(cp.asnumpy(dx)[1:], "fp16", cp.asnumpy(dout)[1:], dst)
    kernels.cast(dx[1:], dout[1:], accumulate=True)
    assert np.array_equal(cp.asnumpy(dout[1:]).view(np.uint8), want.view(np.uint8))


def test_cast_in_place_same_dtype_is_a_no_op(rng):
    dx, hx = to_device(rng.standard_normal(1001), "fp16")
    kernels.cast(dx, dx)
    assert np.array_equal(cp.asnumpy(dx).astype(np.float64), hx)


# ---- cudnnAddTensor ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_add_tensor_cudnn_matches_reference(layout, dtype, rng):
    shape = (2, 6, 5, 7) if layout == "NCHW" else (2, 5, 7, 6)
    da, ha = to_device(rng.standard_normal(shape), dtype)  # shapes and values in the layout's order
    db, hb = to_device(rng.standard_normal(shape), dtype)
    out = poisoned(shape, dtype)
    try:
        kernels.add_tensor_cudnn(da, db, out=out, layout=layout, dtype=dtype)
    except rn.CudnnError as e:
        if dtype == "bf16" and ("NOT_SUPPORTED" in e.status or "BAD_PARAM" in e.status):
            pytest.skip(f"cudnnAddTensor does not take bf16 here: {e.status}")
        raise
    a_plus_b = reference.kernels.add(ha, hb)
    check_close(out, a_plus_b, dtype, "add_tensor_cudnn")
    a_before = cp.asnumpy(da).copy()
    kernels.add_tensor_cudnn(da, db, out=db, layout=layout, dtype=dtype)  # out is b
    check_close(db, a_plus_b, dtype, "add_tensor_cudnn out=b")
    assert np.array_equal(cp.asnumpy(da), a_before)
    kernels.add_tensor_cudnn(da, out, out=da, layout=layout, dtype=dtype)  # out is a: a + (a + b)
    check_close(da, reference.kernels.add(ha, a_plus_b), dtype, "add_tensor_cudnn out=a")


def test_errors_with_real_device_arrays():
    a = cp.zeros((4, 5), cp.float32) + 1
    with pytest.raises(ValueError, match="a and b must have the same shape"):
        kernels.add(a, cp.ones((5, 4), cp.float32))
    with pytest.raises(TypeError, match="b: .*host memory"):
        kernels.add(a, np.ones((4, 5), np.float32))
    with pytest.raises(ValueError, match="b: expected a C-contiguous"):
        kernels.add(a, cp.ones((5, 4), cp.float32).T)
    with pytest.raises(ValueError, match="out partially overlaps a"):
        flat = cp.ones(21, cp.float32)
        kernels.add(flat[:20], flat[:20], out=flat[1:])


@pytest.mark.parametrize("versioned", [True, False])
def test_dlpack_arrays_read_and_write_like_cupy_arrays(versioned, rng):
    da, ha = to_device(rng.standard_normal((3, 1001)), "fp16")
    db, hb = to_device(rng.standard_normal((3, 1001)), "fp16")
    out = poisoned((3, 1001), "fp16")
    result = kernels.add(DLPackOnly(da, versioned), DLPackOnly(db, versioned), out=DLPackOnly(out, versioned))
    assert isinstance(result, DLPackOnly) and result.array is out
    check_close(out, reference.kernels.add(ha, hb), "fp16", f"add through DLPack (versioned={versioned})")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("alpha", [0.125, -1.7])
def test_add_scaled_and_scale_match_the_reference(n, dtype, alpha, rng):
    du, hu, dv, hv = operands("add", (n,), dtype, rng)
    out = poisoned((n,), dtype)
    assert kernels.add_scaled(du, dv, alpha, out=out, dtype=dtype) is out
    check_close(out, hu + alpha * hv, dtype, f"add_scaled n={n}")
    out = poisoned((n,), dtype)
    assert kernels.scale(du, alpha, out=out, dtype=dtype) is out
    check_close(out, alpha * hu, dtype, f"scale n={n}")
    kernels.add_scaled(du, dv, alpha, out=du, dtype=dtype)  # in place, as the evaluation sums its views' logits
    check_close(du, hu + alpha * hv, dtype, f"add_scaled in place n={n}")


def test_add_scaled_in_fp32_rounds_once(rng):
    # fp32 math with one rounding (a fused multiply-add): bit for bit the float64 result rounded to fp32.
    a, b = rng.standard_normal(4099).astype(np.float32), rng.standard_normal(4099).astype(np.float32)
    got = kernels.add_scaled(cp.asarray(a), cp.asarray(b), 0.3).get()
    want = (a.astype(np.float64) + np.float64(np.float32(0.3)) * b.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
