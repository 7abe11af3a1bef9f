"""Pooling on a GPU against float64 NumPy references on fresh random data: max pooling forward/backward
(cuDNN) and global average pooling forward/backward (custom kernels), both layouts, all dtypes, poisoned outputs."""

import numpy as np
import pytest
from device_values import check_close, host_values, poisoned, random_device, to_device

from resnet_native import reference
from resnet_native.ops import pool
from resnet_native.reference.layout import shape_to_nchw

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

DTYPES = ["fp32", "fp16", "bf16"]
LAYOUTS = ["NCHW", "NHWC"]


def distinct_planes(rng, nchw):
    """Values distinct within every (n, c) plane and exact in fp16 and bf16 (k / 8 with |k| <= 128), so each
    window has one maximum and the backward reference is unambiguous."""
    n, c, h, w = nchw
    assert h * w <= 256
    planes = np.stack([rng.permutation(h * w) for _ in range(n * c)]).astype(np.float64)
    return ((planes - (h * w) // 2) / 8.0).reshape(nchw)


@pytest.mark.parametrize(
    "nchw, kernel, stride, padding",
    [((2, 3, 9, 9), 3, 2, 1), ((2, 4, 16, 16), 3, 2, 1), ((1, 5, 8, 8), 2, 2, 0), ((3, 2, 7, 7), 3, 1, 1),
     ((2, 3, 7, 10), (3, 2), (2, 1), (1, 0)), ((4, 8, 1, 1), 1, 1, 0)],
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_max_pool_forward_and_backward(layout, dtype, nchw, kernel, stride, padding, rng):
    window = dict(kernel=kernel, stride=stride, padding=padding)
    x, hx = to_device(distinct_planes(rng, nchw), dtype, layout)
    y_shape = pool.max_pool2d_output_shape(x.shape, **window, layout=layout)
    y = poisoned(y_shape, dtype)  # y_shape as it is: already in the layout's order
    assert pool.max_pool2d(x, **window, layout=layout, out=y, dtype=dtype) is y
    dy, hdy = random_device(rng, shape_to_nchw(y_shape, layout), dtype, layout)
    y_ref = reference.pool.max_pool2d(hx, **window, layout="NCHW")
    dx_ref = reference.pool.max_pool2d_backward(hdy, hx, y_ref, **window, layout="NCHW")
    got_y = host_values(y, layout)
    assert np.array_equal(got_y, y_ref), "max pooling must return input values exactly"
    dx = poisoned(x.shape, dtype)
    pool.max_pool2d_backward(dy, x, y, **window, layout=layout, out=dx, dtype=dtype)
    check_close(dx, dx_ref, dtype, "dx", layout)


def test_max_pool_padding_never_wins_and_allocates_outputs():
    # All-negative input: a zero-padded window would report 0 at the border.
    x = -cp.arange(1, 2 * 3 * 5 * 5 + 1, dtype=cp.float32).reshape(2, 3, 5, 5)
    y = pool.max_pool2d(x, kernel=3, stride=2, padding=1, layout="NCHW")
    assert y.shape == (2, 3, 3, 3)
    y_ref = reference.pool.max_pool2d(cp.asnumpy(x).astype(np.float64), kernel=3, stride=2, padding=1, layout="NCHW")
    assert np.array_equal(cp.asnumpy(y), y_ref)
    assert (cp.asnumpy(y) < 0).all()


def test_max_pool_propagates_nan():
    x = cp.asarray(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    x[0, 0, 0, 0] = np.nan
    y = cp.asnumpy(pool.max_pool2d(x, kernel=2, stride=2, padding=0, layout="NCHW"))
    assert np.isnan(y[0, 0, 0, 0]) and not np.isnan(y[0, 0, 1, 1])


@pytest.mark.parametrize("nchw", [(2, 3, 5, 7), (4, 512, 4, 4), (2, 64, 56, 56), (1, 1, 1, 1), (3, 2048, 7, 7)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_global_avg_pool_forward_and_backward(layout, dtype, nchw, rng):
    x, hx = to_device(rng.standard_normal(nchw) + 0.5, dtype, layout)
    n, c = nchw[:2]
    y = poisoned((n, c), dtype)
    assert pool.global_avg_pool(x, layout=layout, out=y, dtype=dtype) is y
    check_close(y, reference.pool.global_avg_pool(hx, layout="NCHW"), dtype, "y")
    dy, hdy = random_device(rng, (n, c), dtype)
    dx = poisoned(x.shape, dtype)
    assert pool.global_avg_pool_backward(dy, x.shape, layout=layout, out=dx, dtype=dtype) is dx
    check_close(dx, reference.pool.global_avg_pool_backward(hdy, nchw, layout="NCHW"), dtype, "dx", layout)


def test_global_avg_pool_allocates_and_runs_on_the_current_stream(rng):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x, hx = to_device(rng.standard_normal((8, 7, 7, 256)), "fp16")  # values in NHWC order, as stored
        x = x * 1  # produced on the stream just before the op
        y = pool.global_avg_pool(x, layout="NHWC")
        dx = pool.global_avg_pool_backward(y, x.shape, layout="NHWC")
        got_y, got_dx = host_values(y), host_values(dx)
        stream.synchronize()
    assert y.shape == (8, 256) and y.dtype == cp.float16 and dx.shape == x.shape
    check_close(got_y, reference.pool.global_avg_pool(hx, layout="NHWC"), "fp16", "y on a side stream")
    check_close(got_dx, reference.pool.global_avg_pool_backward(got_y, x.shape, layout="NHWC"), "fp16",
                "dx on a side stream")
