"""Argument validation of the elementwise kernels and cast, on any machine (fake device arrays, no GPU needed):
every check runs before any device access, and names the argument."""

import numpy as np
import pytest
from fake_arrays import FakeCudaArray, expect_device_stage, fake, transposed

import resnet_native as rn
from resnet_native.ops import kernels

BINARY = [kernels.add, kernels.add_relu, kernels.relu_backward, kernels.add_relu_backward]
FIRST_NAME = {kernels.add: "a", kernels.add_relu: "a", kernels.relu_backward: "dy", kernels.add_relu_backward: "dy"}
SECOND_NAME = {kernels.add: "b", kernels.add_relu: "b", kernels.relu_backward: "y", kernels.add_relu_backward: "y"}


def distinct(*shapes_dtypes):
    """Fakes at non-overlapping addresses."""
    return [fake(s, d) for s, d in shapes_dtypes]


@pytest.mark.parametrize("op", BINARY)
def test_binary_ops_validate_shapes_naming_both_arrays(op):
    a, b, out = distinct(((4, 5), "float32"), ((5, 4), "float32"), ((4, 5), "float32"))
    first, second = FIRST_NAME[op], SECOND_NAME[op]
    with pytest.raises(ValueError, match=rf"{first} and {second} must have the same shape.*\(4, 5\).*\(5, 4\)"):
        op(a, b, out=out)
    a, b, out = distinct(((4, 5), "float32"), ((4, 5), "float32"), ((20,), "float32"))
    with pytest.raises(ValueError, match=rf"out and {first} must have the same shape"):
        op(a, b, out=out)


@pytest.mark.parametrize("op", BINARY)
def test_binary_ops_validate_dtypes(op):
    a, b, out = distinct(((8,), "float32"), ((8,), "float16"), ((8,), "float32"))
    with pytest.raises(TypeError, match=rf"{SECOND_NAME[op]}: expected a float32 array, got float16"):
        op(a, b, out=out)
    a, b, out = distinct(((8,), "float16"), ((8,), "float16"), ((8,), "float32"))
    with pytest.raises(TypeError, match="out: expected a float16 array"):
        op(a, b, out=out)
    a, b, out = distinct(((8,), "uint16"), ((8,), "uint16"), ((8,), "uint16"))
    with pytest.raises(TypeError, match=rf"{FIRST_NAME[op]}: .*dtype='bf16'"):
        op(a, b, out=out)
    with pytest.raises(ValueError, match="dtype: expected one of"):
        op(a, b, out=out, dtype="int8")
    with expect_device_stage():
        op(a, b, out=out, dtype="bf16")  # uint16 arrays are accepted as bf16 when asked


@pytest.mark.parametrize("op", BINARY)
def test_binary_ops_reject_host_and_strided_arrays(op):
    host = np.ones((4, 5), np.float32)
    b, out = distinct(((4, 5), "float32"), ((4, 5), "float32"))
    with pytest.raises(TypeError, match=rf"{FIRST_NAME[op]}: .*host memory"):
        op(host, b, out=out)
    with pytest.raises(TypeError, match=rf"{SECOND_NAME[op]}: .*host memory"):
        op(b, host, out=out)
    with pytest.raises(TypeError, match="out: .*host memory"):
        op(b, fake((4, 5)), out=host)
    strided = transposed((4, 5))
    with pytest.raises(ValueError, match=rf"{SECOND_NAME[op]}: expected a C-contiguous array"):
        op(b, strided, out=out)
    with pytest.raises(TypeError, match=rf"{FIRST_NAME[op]}: expected a CUDA array"):
        op([1.0, 2.0], b, out=out)


@pytest.mark.parametrize("op", BINARY)
def test_binary_ops_allow_exact_in_place_but_not_partial_overlap(op):
    a, b = distinct(((64,), "float32"), ((64,), "float32"))
    with expect_device_stage():
        op(a, b, out=a)  # in place: validation passes
    shifted = FakeCudaArray((64,), ptr=a.ptr + 8)
    with pytest.raises(ValueError, match="out partially overlaps"):
        op(a, b, out=shifted)


def test_relu_validates_its_arguments():
    x, out = distinct(((3, 4), "float16"), ((4, 3), "float16"))
    with pytest.raises(ValueError, match="out and x must have the same shape"):
        kernels.relu(x, out=out)
    x, out = distinct(((3, 4), "float16"), ((3, 4), "float32"))
    with pytest.raises(TypeError, match="out: expected a float16 array"):
        kernels.relu(x, out=out)
    x, out = distinct(((3, 4), "float16"), ((3, 4), "float16"))
    with expect_device_stage():
        kernels.relu(x, out=out)


def test_cast_validates_shapes_dtypes_and_overlap():
    x, out = distinct(((6, 7), "float32"), ((7, 6), "float16"))
    with pytest.raises(ValueError, match="out and x must have the same shape"):
        kernels.cast(x, out)
    x, out = distinct(((6, 7), "float32"), ((6, 7), "int32"))
    with pytest.raises(TypeError, match="out: expected a float32, float16 or bf16"):
        kernels.cast(x, out)
    x = fake((64,), "float32")
    overlapping = FakeCudaArray((64,), "float16", ptr=x.ptr)
    with pytest.raises(ValueError, match="out partially overlaps x"):
        kernels.cast(x, overlapping)
    x, out = distinct(((6, 7), "float32"), ((6, 7), "uint16"))
    with expect_device_stage():
        kernels.cast(x, out)  # uint16 is bf16 for cast
    with pytest.raises(TypeError, match="accumulate: expected True or False"):
        kernels.cast(x, out, accumulate=1)


def test_cast_accumulate_on_the_host_adds_and_rounds_once():
    grad = np.array([1.0, -2.0, 65504.0], np.float16)
    master = np.array([0.5, 0.25, 1.0], np.float32)
    assert kernels.cast(grad, master, accumulate=True) is master
    assert master.tolist() == [1.5, -1.75, 65505.0]
    low = np.array([2048.0], np.float16)
    kernels.cast(np.array([1.0], np.float32), low, accumulate=True)  # 2049 rounds to even in fp16
    assert low.tolist() == [2048.0]


def test_add_tensor_cudnn_needs_4d_arrays_and_a_layout():
    a, b, out = distinct(((2, 3, 4), "float32"), ((2, 3, 4), "float32"), ((2, 3, 4), "float32"))
    with pytest.raises(ValueError, match="a: expected a 4-D array"):
        kernels.add_tensor_cudnn(a, b, out=out)
    a, b, out = distinct(((2, 3, 4, 5), "float32"), ((2, 3, 4, 5), "float32"), ((2, 3, 4, 5), "float32"))
    with pytest.raises(ValueError, match="layout: expected 'NCHW' or 'NHWC'"):
        kernels.add_tensor_cudnn(a, b, out=out, layout="NWHC")
    with expect_device_stage():
        kernels.add_tensor_cudnn(a, b, out=out, layout="NHWC")


def test_add_scaled_and_scale_validate_alpha_and_arrays():
    a, b, out = distinct(((4, 5), "float32"), ((4, 5), "float32"), ((4, 5), "float32"))
    for bad, error in [(float("nan"), ValueError), (float("inf"), ValueError), (1e39, ValueError), ("2", TypeError),
                       (None, TypeError)]:
        with pytest.raises(error, match="alpha: expected"):
            kernels.add_scaled(a, b, bad, out=out)
        with pytest.raises(error, match="alpha: expected"):
            kernels.scale(a, bad, out=out)
    with pytest.raises(ValueError, match="a and b must have the same shape"):
        kernels.add_scaled(a, fake((5, 4)), 0.5, out=out)
    with pytest.raises(TypeError, match="b: expected a float32 array, got float16"):
        kernels.add_scaled(a, fake((4, 5), "float16"), 0.5, out=out)
    with pytest.raises(ValueError, match="out and x must have the same shape"):
        kernels.scale(a, 0.5, out=fake((20,)))
    with pytest.raises(ValueError, match="out partially overlaps b"):
        kernels.add_scaled(a, b, 0.5, out=FakeCudaArray((4, 5), ptr=b.ptr + 8))
    with expect_device_stage():
        kernels.add_scaled(a, b, 0.125, out=a)  # in place
    with expect_device_stage():
        kernels.scale(a, np.float32(0.25), out=out)


def test_the_host_versions_compute_in_float64(rng):
    a, b = rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    np.testing.assert_array_equal(kernels.add_scaled(a, b, 0.125), a + 0.125 * b)
    np.testing.assert_array_equal(kernels.scale(a, -3.0), -3.0 * a)
    with pytest.raises(ValueError, match="alpha: expected a finite"):
        kernels.add_scaled(a, b, float("nan"))


def test_downscale_validates_its_weights_and_output():
    from resnet_native.ops.images import downscale_u8

    images = fake((4, 32, 32, 3), "uint8")
    wy, wx, out = distinct(((20, 32), "float64"), ((20, 32), "float64"), ((4, 20, 20, 3), "uint8"))
    with pytest.raises(TypeError, match="wy: expected a float64 array, got float32"):
        downscale_u8(images, fake((20, 32), "float32"), wx, out)
    with pytest.raises(ValueError, match="wx: expected shape \\(20, 32\\)"):
        downscale_u8(images, wy, fake((20, 31), "float64"), out)
    with pytest.raises(ValueError, match="wy: expected between 1 and min"):
        downscale_u8(images, fake((33, 32), "float64"), fake((33, 32), "float64"), fake((4, 33, 33, 3), "uint8"))
    with pytest.raises(ValueError, match="out: expected shape \\(4, 20, 20, 3\\)"):
        downscale_u8(images, wy, wx, fake((4, 20, 20, 4), "uint8"))
    with pytest.raises(ValueError, match="images: expected \\(N, H, W, 3\\)"):
        downscale_u8(fake((4, 32, 32, 1), "uint8"), wy, wx, out)
    with pytest.raises(ValueError, match="out must not share memory with images"):
        downscale_u8(images, wy, wx, FakeCudaArray((4, 20, 20, 3), "uint8", ptr=images.ptr + 64))
    with expect_device_stage():
        downscale_u8(images, wy, wx, out)


def test_module_is_exported():
    assert rn.kernels is kernels
    assert set(kernels.__all__) == {"add", "add_relu", "add_relu_backward", "add_scaled", "add_tensor_cudnn", "cast",
                                    "relu", "relu_backward", "scale"}
