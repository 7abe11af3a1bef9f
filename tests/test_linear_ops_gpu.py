"""The fully connected layer's kernels on the GPU (ops/linear.py) against float64 products on fresh random data:
every output poisoned first, fp32 sums within 1e-5 of the exact ones (the dx of fp16/bf16 features within their
rounding), bitwise repeatable, and captured in a CUDA graph as the training step captures them."""

import cupy as cp
import numpy as np
import pytest
from device_values import TOLERANCE, check_close, host_values, poisoned, to_device

from resnet_native.ops.linear import linear_backward_data, linear_backward_weight, linear_forward

pytestmark = pytest.mark.gpu

# (N, C, K): ResNet-18's classifier at recipe C's batch and its partial batch, an evaluation batch, odd sizes (a
# C under a warp's width, a K over the 16 outputs a pass holds at once).
SHAPES = [(512, 512, 10), (336, 512, 10), (1000, 512, 10), (5, 37, 3), (70, 1000, 17), (3, 20, 33)]


@pytest.mark.parametrize("n,c,k", SHAPES)
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_the_three_products_match_float64(rng, n, c, k, precision):
    x, x64 = to_device(rng.standard_normal((n, c)), precision)
    w, w64 = to_device(rng.standard_normal((k, c)) / np.sqrt(c), "fp32")
    b, b64 = to_device(rng.standard_normal(k), "fp32")
    dy, dy64 = to_device(rng.standard_normal((n, k)), "fp32")
    y = linear_forward(x, w, b, out=poisoned((n, k), "fp32"))
    check_close(y, x64 @ w64.T + b64, 1e-5, "y")
    dw = linear_backward_weight(x, dy, out=poisoned((k, c), "fp32"))
    check_close(dw, dy64.T @ x64, 1e-5, "dw")
    dx = poisoned((n, c), precision)
    assert linear_backward_data(dy, w, dx) is dx
    check_close(dx, dy64 @ w64, 1e-5 if precision == "fp32" else TOLERANCE[precision], "dx")
    cp.cuda.get_current_stream().synchronize()
    again = linear_backward_weight(x, dy)  # allocated: the same sums in the same order
    np.testing.assert_array_equal(host_values(again), host_values(dw))


def test_the_products_replay_from_a_cuda_graph(rng):
    x, x64 = to_device(rng.standard_normal((512, 512)), "fp16")
    w, w64 = to_device(rng.standard_normal((10, 512)) / 20, "fp32")
    b, b64 = to_device(rng.standard_normal(10), "fp32")
    dy, dy64 = to_device(rng.standard_normal((512, 10)), "fp32")
    y, dw, dx = poisoned((512, 10), "fp32"), poisoned((10, 512), "fp32"), poisoned((512, 512), "fp16")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        linear_forward(x, w, b, out=y)
        linear_backward_weight(x, dy, out=dw)
        linear_backward_data(dy, w, dx)
        graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    check_close(y, x64 @ w64.T + b64, 1e-5, "y")
    check_close(dw, dy64.T @ x64, 1e-5, "dw")
    check_close(dx, dy64 @ w64, TOLERANCE["fp16"], "dx")
