"""The elementwise kernels, cast and the cudnnAddTensor path on a GPU, against float64 NumPy references on fresh
random data: odd sizes (1, 7, 1023, 1M+3), misaligned views (scalar path), all dtypes, poisoned outputs,
in-place aliasing and a non-default stream."""

import numpy as np
import pytest

import resnet_native as rn
from resnet_native import kernels
from resnet_native.names import ARRAY_DTYPES

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

DTYPES = ["fp32", "fp16", "bf16"]
TOL = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 1e-2}
SIZES = [1, 7, 1023, 1_000_003]
NAN_BITS = {"fp32": None, "fp16": None, "bf16": 0x7FC0}


# ---- bf16 on the host: uint16 bit patterns -------------------------------------------------------------------------
def f32_to_bf16_bits(a):
    """float32 -> bf16 bits, round to nearest even (finite and inf inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def quantize(host, dtype):
    """(device array, the exact float64 values it holds)."""
    host = np.asarray(host, dtype=np.float64)
    if dtype == "fp32":
        h = host.astype(np.float32)
        return cp.asarray(h), h.astype(np.float64)
    if dtype == "fp16":
        h = host.astype(np.float16)
        return cp.asarray(h), h.astype(np.float64)
    bits = f32_to_bf16_bits(host.astype(np.float32))
    return cp.asarray(bits), bf16_bits_to_f32(bits).astype(np.float64)


def to_host64(dev, dtype):
    h = cp.asnumpy(dev)
    return bf16_bits_to_f32(h).astype(np.float64) if dtype == "bf16" else h.astype(np.float64)


def poisoned(shape, dtype):
    out = cp.empty(shape, ARRAY_DTYPES[dtype])
    out.fill(NAN_BITS[dtype] if dtype == "bf16" else np.nan)
    return out


def rel_err(got, want):
    scale = np.linalg.norm(want)
    assert scale > 0, "reference is all zeros: the test data is degenerate"
    return np.linalg.norm(got - want) / scale


def check(got_dev, want, dtype, what):
    got = to_host64(got_dev, dtype)
    assert not np.isnan(got).any(), f"{what}: some elements were never written (NaN poison left)"
    err = rel_err(got, want)
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]}"


def reference(op, u, v):
    if op == "add":
        return u + v
    if op == "add_relu":
        return np.maximum(u + v, 0.0)
    if op == "relu":
        return np.maximum(u, 0.0)
    return np.where(v > 0, u, 0.0)  # relu_backward / add_relu_backward: (dy, y)


def operands(op, shape, dtype, rng):
    u = rng.standard_normal(shape) * 3.0
    v = rng.standard_normal(shape) * 3.0
    if op in ("relu_backward", "add_relu_backward"):
        v = np.maximum(v, 0.0)  # y is a ReLU output: about half zeros
    # A positive first element keeps every result nonzero somewhere, even for n == 1.
    u.flat[0], v.flat[0] = abs(u.flat[0]) + 0.5, abs(v.flat[0]) + 0.5
    du, hu = quantize(u, dtype)
    dv, hv = quantize(v, dtype)
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
    check(out, reference(op, hu, hv), dtype, f"{op} n={n}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_op_allocates_output_and_keeps_4d_shapes(op, dtype, rng):
    shape = (3, 5, 7, 11)
    du, hu, dv, hv = operands(op, shape, dtype, rng)
    out = run(op, du, dv, dtype, None)
    assert out.shape == shape and out.dtype == du.dtype
    check(out, reference(op, hu, hv), dtype, f"{op} 4-D")


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
    check(out, reference(op, hu[1:], hv[1:]), dtype, f"{op} misaligned n={n}")
    # Only the output misaligned: inputs aligned.
    du2, hu2, dv2, hv2 = operands(op, (n,), dtype, rng)
    out_base = poisoned((n + 1,), dtype)
    run(op, du2, dv2, dtype, out_base[1:])
    check(out_base[1:], reference(op, hu2, hv2), dtype, f"{op} misaligned out n={n}")
    head = to_host64(out_base[:1], dtype)
    assert np.isnan(head).all(), "the element before the output view was overwritten"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_in_place_on_either_input(op, dtype, rng):
    n = 100_003
    du, hu, dv, hv = operands(op, (n,), dtype, rng)
    want = reference(op, hu, hv)
    run(op, du, dv, dtype, du)  # out is the first input
    check(du, want, dtype, f"{op} in place (first input)")
    if op != "relu":
        du, hu, dv, hv = operands(op, (n,), dtype, rng)
        want = reference(op, hu, hv)
        run(op, du, dv, dtype, dv)  # out is the second input
        check(dv, want, dtype, f"{op} in place (second input)")


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
    want = np.maximum(hu + hv, 0.0)
    got = bf16_bits_to_f32(got).astype(np.float64) if dtype == "bf16" else got.astype(np.float64)
    got2 = bf16_bits_to_f32(got2).astype(np.float64) if dtype == "bf16" else got2.astype(np.float64)
    assert rel_err(got, want) <= TOL[dtype]
    assert np.array_equal(got2, got)  # y > 0 ? y : 0 == y for a ReLU output


def test_nan_and_inf_propagate_like_pytorch():
    x = cp.asarray(np.array([np.nan, -1.0, 2.0, np.inf, -np.inf], np.float32))
    assert np.array_equal(cp.asnumpy(kernels.relu(x)), np.array([np.nan, 0, 2, np.inf, 0], np.float32),
                          equal_nan=True)
    dy = cp.asarray(np.array([np.inf, np.inf, 1.0, np.nan, 5.0], np.float32))
    y = cp.asarray(np.array([0.0, 1.0, np.nan, 2.0, -0.0], np.float32))
    got = cp.asnumpy(kernels.relu_backward(dy, y))
    assert np.array_equal(got, np.array([0, np.inf, 1.0, np.nan, 0], np.float32), equal_nan=True)


# ---- cast ----------------------------------------------------------------------------------------------------------
def cast_reference_bits(values64, src, dst):
    """The exact bits cast() must produce, from the float64 values that `src` storage holds exactly."""
    f32 = values64.astype(np.float32)  # exact: every fp16 / bf16 value is an fp32 value
    if dst == "fp32":
        return f32
    if dst == "fp16":
        return f32.astype(np.float16)
    return f32_to_bf16_bits(f32)


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
    dx, hx = quantize(cast_source(n, rng), src)
    out = poisoned((n,), dst)
    kernels.cast(dx, out)
    want = cast_reference_bits(hx, src, dst)
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
    dx, hx = quantize(cast_source(n + 1, rng), src)
    out_base = poisoned((n + 1,), dst)
    kernels.cast(dx[1:], out_base[1:])
    want = np.asarray(cast_reference_bits(hx[1:], src, dst))
    got = cp.asnumpy(out_base[1:])
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_cast_in_place_same_dtype_is_a_no_op(rng):
    dx, hx = quantize(rng.standard_normal(1001), "fp16")
    kernels.cast(dx, dx)
    assert np.array_equal(cp.asnumpy(dx).astype(np.float64), hx)


# ---- cudnnAddTensor ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_add_tensor_cudnn_matches_reference(layout, dtype, rng):
    shape = (2, 6, 5, 7) if layout == "NCHW" else (2, 5, 7, 6)
    da, ha = quantize(rng.standard_normal(shape), dtype)
    db, hb = quantize(rng.standard_normal(shape), dtype)
    out = poisoned(shape, dtype)
    try:
        kernels.add_tensor_cudnn(da, db, out=out, layout=layout, dtype=dtype)
    except rn.CudnnError as e:
        if dtype == "bf16" and ("NOT_SUPPORTED" in e.status or "BAD_PARAM" in e.status):
            pytest.skip(f"cudnnAddTensor does not take bf16 here: {e.status}")
        raise
    check(out, ha + hb, dtype, "add_tensor_cudnn")
    a_before = cp.asnumpy(da).copy()
    kernels.add_tensor_cudnn(da, db, out=db, layout=layout, dtype=dtype)  # out is b
    check(db, ha + hb, dtype, "add_tensor_cudnn out=b")
    assert np.array_equal(cp.asnumpy(da), a_before)
    kernels.add_tensor_cudnn(da, out, out=da, layout=layout, dtype=dtype)  # out is a: a + (a + b)
    check(da, 2 * ha + hb, dtype, "add_tensor_cudnn out=a")


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


class DLPackOnly:
    """A cupy array seen only through DLPack (as torch or jax arrays are), as a DLPack 1.x producer or an older one
    that does not know max_version."""

    def __init__(self, array, versioned):
        self.array, self.versioned = array, versioned

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        if "max_version" in kwargs and not self.versioned:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.array.__dlpack__(**kwargs)


@pytest.mark.parametrize("versioned", [True, False])
def test_dlpack_arrays_read_and_write_like_cupy_arrays(versioned, rng):
    da, ha = quantize(rng.standard_normal((3, 1001)), "fp16")
    db, hb = quantize(rng.standard_normal((3, 1001)), "fp16")
    out = poisoned((3, 1001), "fp16")
    result = kernels.add(DLPackOnly(da, versioned), DLPackOnly(db, versioned), out=DLPackOnly(out, versioned))
    assert isinstance(result, DLPackOnly) and result.array is out
    check(out, ha + hb, "fp16", f"add through DLPack (versioned={versioned})")
