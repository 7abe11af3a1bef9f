"""Convolution argument validation without a GPU: every op checks its arguments before any device access (fake
arrays get as far as the device check), outputs must not overlap inputs, exact cupy arrays are read from their
attributes like their array interface describes them, and the stream is 0 without a GPU. The params key and the
algorithm cache are in test_conv_cache_cpu.py.

On a machine with a GPU these run too: fake arrays then fail the device check (TypeError) instead of raising
NoGPUError, and are never handed to cuDNN.
"""

import numpy as np
import pytest
from fake_arrays import CUPY_FAKE_BASE, cupy_at, duck_like, expect_device_stage, fake

import resnet_native as rn
from resnet_native.ops import conv
from resnet_native.ops.conv import ConvSpec

C = rn._C
SPEC = ConvSpec(stride=1, padding=1)
NHWC = ConvSpec(stride=1, padding=1, layout="NHWC", precision="fp16")


def test_valid_fake_arguments_reach_the_device_check():
    x, w = fake((2, 3, 8, 8)), fake((4, 3, 3, 3))
    with expect_device_stage():
        conv.conv2d(x, w, SPEC)
    with expect_device_stage():
        conv.conv2d(x, w, SPEC, bias=fake((4,)), z=fake((2, 4, 8, 8)), activation="relu", out=fake((2, 4, 8, 8)))
    with expect_device_stage():
        conv.conv2d(fake((2, 8, 8, 3), "fp16"), fake((4, 3, 3, 3), "fp16"), NHWC)
    with expect_device_stage():
        conv.conv2d_backward_data(fake((2, 4, 8, 8)), w, SPEC, (2, 3, 8, 8))
    with expect_device_stage():
        conv.conv2d_backward_data(fake((2, 4, 8, 8)), w, SPEC, (2, 3, 8, 8), out=fake((2, 3, 8, 8)), accumulate=True)
    with expect_device_stage():
        conv.conv2d_backward_filter(x, fake((2, 4, 8, 8)), SPEC, (4, 3, 3, 3), out=fake((4, 3, 3, 3)),
                                    accumulate=True)
    with expect_device_stage():
        conv.conv2d_backward_bias(fake((2, 4, 8, 8), "bf16"), "NCHW")


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: conv.conv2d(np.zeros((2, 3, 8, 8), np.float32), fake((4, 3, 3, 3)), SPEC), TypeError, "x"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8), "fp16"), fake((4, 3, 3, 3)), SPEC), TypeError, "x"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3), "fp16"), SPEC), TypeError, "w"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), ConvSpec(precision="bf16")), TypeError,
         "bfloat16"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), SPEC, out=np.zeros((2, 4, 8, 8), np.float32)),
         TypeError, "out"),
        (lambda: conv.conv2d(None, fake((4, 3, 3, 3)), SPEC), TypeError, "x"),
        (lambda: conv.conv2d(fake((3, 8, 8)), fake((4, 3, 3, 3)), SPEC), ValueError, "x"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3)), SPEC), ValueError, "w"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8), strides=(4, 256, 32, 4)), fake((4, 3, 3, 3)), SPEC), ValueError,
         "contiguous"),
        (lambda: conv.conv2d(fake((0, 3, 8, 8)), fake((4, 3, 3, 3)), SPEC), ValueError, "empty"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 2, 3, 3)), SPEC), ValueError, "input channels per group"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 1, 3, 3)), ConvSpec(groups=2)), ValueError, "groups"),
        (lambda: conv.conv2d(fake((2, 4, 8, 8)), fake((3, 2, 3, 3)), ConvSpec(groups=2)), ValueError, "K=3"),
        (lambda: conv.conv2d(fake((2, 3, 4, 4)), fake((4, 3, 7, 7)), ConvSpec()), ValueError, "smaller"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), ConvSpec(dilation=4)), ValueError, "smaller"),
        # An NHWC filter must be (K, R, S, C/groups): a (K, C, R, S) one is caught by its channel count.
        (lambda: conv.conv2d(fake((2, 8, 8, 3), "fp16"), fake((4, 3, 5, 5), "fp16"), NHWC), ValueError, "w"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), SPEC, out=fake((2, 4, 8, 7))), ValueError,
         "out"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), SPEC, out=fake((2, 8, 8, 4))), ValueError,
         "out"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), SPEC, bias=fake((3,))), ValueError, "bias"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), SPEC, bias=fake((4, 1))), ValueError, "bias"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), SPEC, z=fake((2, 4, 8, 9))), ValueError, "z"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), SPEC, activation="gelu"), ValueError,
         "activation"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), "NCHW"), TypeError, "spec"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), ConvSpec(algo="ALGO_1")), ValueError,
         "forward"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), ConvSpec(algo="GEMM", engine="graph")),
         ValueError, "engine"),
        (lambda: conv.conv2d(fake((2, 3, 8, 8)), fake((4, 3, 3, 3)), ConvSpec(algo="ENGINE_3", engine="legacy")),
         ValueError, "engine"),
        (lambda: conv.conv2d(fake((1, 50000, 200, 300)), fake((4, 50000, 1, 1)), ConvSpec()), ValueError,
         "32-bit"),
        (lambda: conv.conv2d_backward_data(fake((2, 4, 8, 8)), fake((4, 3, 3, 3)), SPEC, (2, 3, 8)), ValueError,
         "x_shape"),
        (lambda: conv.conv2d_backward_data(fake((2, 4, 8, 8)), fake((4, 3, 3, 3)), SPEC, (2, 3, 8, 0)), ValueError,
         "x_shape"),
        (lambda: conv.conv2d_backward_data(fake((2, 4, 8, 7)), fake((4, 3, 3, 3)), SPEC, (2, 3, 8, 8)), ValueError,
         "dy"),
        (lambda: conv.conv2d_backward_data(fake((2, 4, 8, 8)), fake((4, 3, 3, 3)), SPEC, (2, 3, 8, 8),
                                           out=fake((2, 3, 8, 9))), ValueError, "out"),
        (lambda: conv.conv2d_backward_data(fake((2, 4, 8, 8)), fake((4, 3, 3, 3)), ConvSpec(padding=1,
                                           algo="IMPLICIT_PRECOMP_GEMM"), (2, 3, 8, 8)), ValueError, "backward_data"),
        (lambda: conv.conv2d_backward_filter(fake((2, 3, 8, 8)), fake((2, 4, 8, 8)), SPEC, (4, 3, 3, 3),
                                             accumulate=True), ValueError, "accumulate"),
        (lambda: conv.conv2d_backward_data(fake((2, 4, 8, 8)), fake((4, 3, 3, 3)), SPEC, (2, 3, 8, 8),
                                           accumulate=True), ValueError, "accumulate"),
        (lambda: conv.conv2d_backward_data(fake((2, 4, 8, 8)), fake((4, 3, 3, 3)), SPEC, (2, 3, 8, 8),
                                           out=fake((2, 3, 8, 8)), accumulate="yes"), TypeError,
         "accumulate: expected True or False"),
        (lambda: conv.conv2d_backward_filter(fake((2, 3, 8, 8)), fake((2, 4, 8, 8)), SPEC, (4, 3, 3, 3),
                                             accumulate=1), TypeError, "accumulate: expected True or False"),
        (lambda: conv.conv2d_backward_filter(fake((2, 3, 8, 8)), fake((2, 5, 8, 8)), SPEC, (4, 3, 3, 3)),
         ValueError, "dy"),
        (lambda: conv.conv2d_backward_filter(fake((2, 3, 8, 8)), fake((2, 4, 8, 8)), SPEC, (4, 3, 3, 3),
                                             out=fake((4, 3, 3, 1))), ValueError, "out"),
        (lambda: conv.conv2d_backward_filter(fake((2, 3, 8, 8)), fake((2, 4, 8, 8)), SPEC, (4, 3, 3)),
         ValueError, "w_shape"),
        (lambda: conv.conv2d_backward_bias(fake((2, 4, 8, 8)), "NCHW", out=fake((8,))), ValueError, "out"),
        (lambda: conv.conv2d_backward_bias(fake((2, 8, 8, 4)), "NHWC", out=fake((8,))), ValueError, "out"),
        (lambda: conv.conv2d_backward_bias(fake((2, 4, 8)), "NCHW"), ValueError, "dy"),
        (lambda: conv.conv2d_backward_bias(fake((2, 4, 8, 8)), "NWHC"), ValueError, "layout"),
        (lambda: conv.conv2d_backward_bias(fake((2, 4, 8, 8), "fp16"), "NCHW", out=fake((4,))), TypeError, "out"),
        (lambda: conv.conv2d_backward_bias(np.zeros((2, 4, 8, 8), np.float32), "NCHW", out=fake((4,))), TypeError,
         "out: expected a NumPy array"),
    ],
)
def test_bad_arguments_raise_before_device_access(call, error, match):
    before = conv.algorithm_cache_stats()
    with pytest.raises(error, match=match):
        call()
    assert conv.algorithm_cache_stats() == before


def test_out_must_not_overlap_the_inputs():
    x, w = fake((2, 3, 8, 8)), fake((4, 3, 3, 3))
    out = fake((2, 4, 8, 8))
    out.__cuda_array_interface__ = dict(out.__cuda_array_interface__, data=x.__cuda_array_interface__["data"])
    with pytest.raises(ValueError, match="^out must not share memory with x"):
        conv.conv2d(x, w, SPEC, out=out)
    z = fake((2, 4, 8, 8))
    out2 = fake((2, 4, 8, 8))
    out2.__cuda_array_interface__ = dict(out2.__cuda_array_interface__,
                                         data=(z.__cuda_array_interface__["data"][0] + 64, False))
    with pytest.raises(ValueError, match="^out must not share memory with z"):
        conv.conv2d(x, w, SPEC, z=z, out=out2)


@pytest.mark.parametrize(
    "precision,dtype",
    [("fp32", "float32"), ("tf32", "float32"), ("fp16", "float16"), ("bf16", "uint16"), ("bf16", "int16")],
)
def test_cupy_arrays_parse_like_their_array_interface(precision, dtype):
    for shape, offset in (((2, 8, 8, 16), 0), ((16,), 256), ((3, 1, 5), 4096)):
        a = cupy_at(shape, dtype, offset)
        parsed = C._testing.parse_tensor(a, "x", precision, check_device=False)
        assert parsed == C._testing.parse_tensor(duck_like(a, CUPY_FAKE_BASE + offset), "x", precision,
                                         check_device=False)
        assert parsed[0] == a.data.ptr == CUPY_FAKE_BASE + offset and parsed[2] == shape


def test_cupy_subclasses_take_the_array_interface():
    cupy = pytest.importorskip("cupy")

    class Relabelled(cupy.ndarray):  # a subclass may describe itself differently: only exact cupy.ndarray is read
        @property
        def __cuda_array_interface__(self):
            return {"shape": self.shape, "typestr": "<f4", "data": (CUPY_FAKE_BASE * 2, False), "strides": None,
                    "version": 3}

    a = cupy_at((2, 3), "float32", cls=Relabelled)
    assert C._testing.parse_tensor(a, "x", "fp32", check_device=False)[0] == CUPY_FAKE_BASE * 2


def test_ops_take_cupy_arrays_up_to_the_device_check():
    spec = ConvSpec(stride=2, padding=1, layout="NHWC", precision="fp16")
    x, w = cupy_at((2, 8, 8, 16), "float16"), cupy_at((32, 3, 3, 16), "float16", 1 << 16)
    y, z = cupy_at((2, 4, 4, 32), "float16", 1 << 17), cupy_at((2, 4, 4, 32), "float16", 1 << 18)
    bias, dw = cupy_at((32,), "float16", 1 << 19), cupy_at((32, 3, 3, 16), "float16", 1 << 20)
    dx = cupy_at((2, 8, 8, 16), "float16", 1 << 21)
    with expect_device_stage():
        conv.conv2d(x, w, spec, out=y)
    with expect_device_stage():
        conv.conv2d(x, w, spec, bias=bias, z=z, activation="relu", out=y)
    with expect_device_stage():
        conv.conv2d_backward_data(y, w, spec, x.shape, out=dx)
    with expect_device_stage():
        conv.conv2d_backward_filter(x, y, spec, w.shape, out=dw)
    # Read directly or not, a bad cupy argument is still named (host checks come before any device access).
    with pytest.raises(ValueError, match="^out: expected shape"):
        conv.conv2d(x, w, spec, out=dx)
    with pytest.raises(ValueError, match="^out must not share memory with x"):
        conv.conv2d(x, w, spec, out=cupy_at((2, 4, 4, 32), "float16", 64))
    with pytest.raises(ValueError, match="^bias: expected shape"):
        conv.conv2d(x, w, spec, bias=cupy_at((16,), "float16", 1 << 19), out=y)


def test_stream_is_zero_without_a_gpu():
    if rn.cuda_available():
        pytest.skip("this machine has a GPU")
    from resnet_native._core import runtime as _runtime
    from resnet_native.ops import kernels

    assert conv._stream() == 0 and conv._stream() == 0 and kernels.stream() == 0
    assert _runtime._get_current_stream is None  # cupy's stream is only bound once a GPU was seen
