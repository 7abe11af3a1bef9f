"""Pooling on a GPU against float64 NumPy references on fresh random data: max pooling forward/backward
(cuDNN) and global average pooling forward/backward (custom kernels), both layouts, all dtypes, poisoned outputs."""

import numpy as np
import pytest
from test_kernels_gpu import TOL, poisoned, quantize, rel_err, to_host64

from resnet_native import pool

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

DTYPES = ["fp32", "fp16", "bf16"]
LAYOUTS = ["NCHW", "NHWC"]


def to_layout(a, layout):
    return np.ascontiguousarray(a if layout == "NCHW" else a.transpose(0, 2, 3, 1))


def from_layout(a, layout):
    return a if layout == "NCHW" else a.transpose(0, 3, 1, 2)


def pair(v):
    return v if isinstance(v, tuple) else (v, v)


def max_pool_ref(x, dy, kernel, stride, padding):
    """Forward and backward of max pooling in float64, NCHW, -inf padding; dy: (N, C, P, Q) or None."""
    (kh, kw), (sh, sw), (ph, pw) = pair(kernel), pair(stride), pair(padding)
    n, c, h, w = x.shape
    padded = np.full((n, c, h + 2 * ph, w + 2 * pw), -np.inf)
    padded[:, :, ph:ph + h, pw:pw + w] = x
    p_out, q_out = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    y = np.empty((n, c, p_out, q_out))
    dpadded = np.zeros_like(padded)
    nn, cc = np.meshgrid(np.arange(n), np.arange(c), indexing="ij")
    for i in range(p_out):
        for j in range(q_out):
            window = padded[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw].reshape(n, c, -1)
            y[:, :, i, j] = window.max(axis=-1)
            if dy is not None:
                di, dj = np.divmod(window.argmax(axis=-1), kw)
                np.add.at(dpadded, (nn, cc, i * sh + di, j * sw + dj), dy[:, :, i, j])
    return y, dpadded[:, :, ph:ph + h, pw:pw + w]


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
    x, hx = quantize(to_layout(distinct_planes(rng, nchw), layout), dtype)
    hx = from_layout(hx, layout)
    y_shape = pool.max_pool2d_output_shape(x.shape, kernel=kernel, stride=stride, padding=padding, layout=layout)
    y = poisoned(y_shape, dtype)
    assert pool.max_pool2d(x, kernel=kernel, stride=stride, padding=padding, layout=layout, out=y,
                           dtype=dtype) is y
    dy, hdy = quantize(rng.standard_normal(y_shape), dtype)
    hdy = from_layout(hdy, layout)
    y_ref, dx_ref = max_pool_ref(hx, hdy, kernel, stride, padding)
    got_y = from_layout(to_host64(y, dtype), layout)
    assert np.array_equal(got_y, y_ref), "max pooling must return input values exactly"
    dx = poisoned(x.shape, dtype)
    pool.max_pool2d_backward(dy, x, y, kernel=kernel, stride=stride, padding=padding, layout=layout, out=dx,
                             dtype=dtype)
    got_dx = from_layout(to_host64(dx, dtype), layout)
    assert not np.isnan(got_dx).any(), "dx: some elements were never written"
    assert rel_err(got_dx, dx_ref) <= TOL[dtype]


def test_max_pool_padding_never_wins_and_allocates_outputs():
    # All-negative input: a zero-padded window would report 0 at the border.
    x = -cp.arange(1, 2 * 3 * 5 * 5 + 1, dtype=cp.float32).reshape(2, 3, 5, 5)
    y = pool.max_pool2d(x, kernel=3, stride=2, padding=1, layout="NCHW")
    assert y.shape == (2, 3, 3, 3)
    y_ref, _ = max_pool_ref(cp.asnumpy(x).astype(np.float64), None, 3, 2, 1)
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
    x, hx = quantize(to_layout(rng.standard_normal(nchw) + 0.5, layout), dtype)
    hx = from_layout(hx, layout)
    n, c = nchw[:2]
    y = poisoned((n, c), dtype)
    assert pool.global_avg_pool(x, layout=layout, out=y, dtype=dtype) is y
    got = to_host64(y, dtype)
    assert not np.isnan(got).any()
    assert rel_err(got, hx.mean(axis=(2, 3))) <= TOL[dtype]
    dy, hdy = quantize(rng.standard_normal((n, c)), dtype)
    dx = poisoned(x.shape, dtype)
    assert pool.global_avg_pool_backward(dy, x.shape, layout=layout, out=dx, dtype=dtype) is dx
    want = np.broadcast_to((hdy / (nchw[2] * nchw[3]))[:, :, None, None], nchw)
    got_dx = from_layout(to_host64(dx, dtype), layout)
    assert not np.isnan(got_dx).any()
    assert rel_err(got_dx, want) <= TOL[dtype]


def test_global_avg_pool_allocates_and_runs_on_the_current_stream(rng):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x, hx = quantize(rng.standard_normal((8, 7, 7, 256)), "fp16")
        x = x * 1  # produced on the stream just before the op
        y = pool.global_avg_pool(x, layout="NHWC")
        dx = pool.global_avg_pool_backward(y, x.shape, layout="NHWC")
        got_y, got_dx = to_host64(y, "fp16"), to_host64(dx, "fp16")
        stream.synchronize()
    assert y.shape == (8, 256) and y.dtype == cp.float16 and dx.shape == x.shape
    want = hx.mean(axis=(1, 2))
    assert rel_err(got_y, want) <= TOL["fp16"]
    assert rel_err(got_dx, np.broadcast_to((got_y / 49.0)[:, None, None, :], x.shape)) <= TOL["fp16"]
