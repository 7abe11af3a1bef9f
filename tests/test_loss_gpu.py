"""The native softmax cross-entropy kernels against the float64 reference on fresh random data: loss, argmax hits,
running totals and gradient, one-lane rows (C <= 64) and warp rows (C > 64), label smoothing, a device loss
scale, in place, ties and NaN in the argmax, bad labels, and bitwise determinism. Outputs start poisoned."""

import numpy as np
import pytest
from device_values import check_close

from resnet_native import _C
from resnet_native.ops.losses import SoftmaxCrossEntropy
from resnet_native.reference import loss as ref

pytestmark = pytest.mark.gpu

SHAPES = [(8, 10, 0.0), (512, 10, 0.1), (5000, 10, 0.0), (37, 64, 0.1), (37, 65, 0.0), (64, 1000, 0.2),
          (3, 1, 0.0), (2049, 100, 0.1)]


def _outputs(cp):
    return (cp.full(1, np.nan, cp.float32), cp.full(1, -1, cp.int32), cp.full(1, 0.25, cp.float64),
            cp.full(1, 3.0, cp.float64))


def _forward(cp, z, labels, s):
    loss, correct, loss_sum, correct_sum = _outputs(cp)
    zd, yd = cp.asarray(z), cp.asarray(labels)
    for _ in range(2):  # the sums accumulate
        _C.cross_entropy_forward(zd, yd, s, loss, correct, loss_sum, correct_sum, cp.cuda.get_current_stream().ptr)
    return [a.get()[0] for a in (loss, correct, loss_sum, correct_sum)]


@pytest.mark.parametrize("n,c,s", SHAPES)
def test_forward_and_backward_equal_the_reference(rng, n, c, s):
    import cupy as cp

    z = (4 * rng.standard_normal((n, c))).astype(np.float32)
    labels = rng.integers(0, c, n).astype(np.int32)
    loss, correct, loss_sum, correct_sum = _forward(cp, z, labels, s)
    want = np.full(1, np.nan), np.zeros(1, np.int32), np.array([0.25]), np.array([3.0])
    for _ in range(2):
        ref.cross_entropy_forward(z, labels, s, *want[:2], *want[2:])
    assert abs(loss - want[0][0]) <= 1e-5 * abs(want[0][0]), (loss, want[0][0])
    assert correct == want[1][0] == int((z.argmax(1) == labels).sum())
    assert abs(loss_sum - want[2][0]) <= 1e-5 * abs(want[2][0]) and correct_sum == want[3][0]

    grad = cp.full((n, c), np.nan, cp.float32)
    scale = cp.asarray([512.0], cp.float32)
    _C.cross_entropy_backward(cp.asarray(z), cp.asarray(labels), s, scale, grad, cp.cuda.get_current_stream().ptr)
    if c > 1:
        check_close(grad, ref.cross_entropy_backward(z, labels, s, 512.0, np.empty((n, c))), 1e-5, "grad")
    else:  # one class: softmax is 1, the target is 1, the gradient is exactly 0
        assert (grad.get() == 0).all()


def test_backward_in_place_and_number_scale(rng):
    import cupy as cp

    z = rng.standard_normal((100, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 100).astype(np.int32)
    zd = cp.asarray(z)
    out = _C.cross_entropy_backward(zd, cp.asarray(labels), 0.1, 2.0, zd, cp.cuda.get_current_stream().ptr)
    assert out.data.ptr == zd.data.ptr
    check_close(zd, ref.cross_entropy_backward(z, labels, 0.1, 2.0, np.empty(z.shape)), 1e-5, "in-place grad")
    allocated = _C.cross_entropy_backward(cp.asarray(z), cp.asarray(labels), 0.0, None, None, 0)
    check_close(allocated, ref.cross_entropy_backward(z, labels, 0.0, None, np.empty(z.shape)), 1e-5, "grad")


def test_argmax_ties_nan_and_bad_labels():
    import cupy as cp

    z = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, np.nan, 5, np.nan], [7, 1, 1, 1], [0, 0, 1, 0]], np.float32)
    labels = np.array([1, 0, 1, 0, 9], np.int32)  # the last label is outside [0, 4)
    loss, correct = cp.full(1, 0.0, cp.float32), cp.full(1, -1, cp.int32)
    _C.cross_entropy_forward(cp.asarray(z), cp.asarray(labels), 0.0, loss, correct, None, None, 0)
    # Hits: row 0 (first of the tied 3s is index 1), row 1 (first of four ties), row 2 (first NaN is index 1),
    # row 3; row 4's label is bad.
    assert int(correct.get()[0]) == 4
    assert np.isnan(loss.get()[0])
    grad = _C.cross_entropy_backward(cp.asarray(z[3:]), cp.asarray(labels[3:]), 0.0, None, None, 0).get()
    assert np.isfinite(grad[0]).all() and np.isnan(grad[1]).all()


def test_results_are_bitwise_deterministic(rng):
    import cupy as cp

    z = cp.asarray((3 * rng.standard_normal((5000, 10))).astype(np.float32))
    labels = cp.asarray(rng.integers(0, 10, 5000).astype(np.int32))
    runs = []
    for _ in range(3):
        loss, total = cp.zeros(1, cp.float32), cp.zeros(1, cp.float64)
        _C.cross_entropy_forward(z, labels, 0.1, loss, None, total, None, 0)
        runs.append((loss.get().tobytes(), total.get().tobytes()))
    assert runs[0] == runs[1] == runs[2]


def test_softmax_cross_entropy_object_on_device(rng):
    import cupy as cp

    z = (3 * rng.standard_normal((64, 10))).astype(np.float32)
    labels = rng.integers(0, 10, 64).astype(np.int32)
    lossf = SoftmaxCrossEntropy(0.1)
    totals = (cp.zeros(1, cp.float64), cp.zeros(1, cp.float64))
    loss, correct = lossf.forward(cp.asarray(z), cp.asarray(labels), train=True, totals=totals)
    assert loss.shape == () and loss.dtype == np.float32 and correct.shape == () and correct.dtype == np.int32
    want = np.full(1, np.nan), np.zeros(1, np.int32)
    ref.cross_entropy_forward(z, labels, 0.1, *want)
    assert abs(float(loss) - want[0][0]) <= 1e-5 * abs(want[0][0]) and int(correct) == want[1][0]
    assert abs(float(totals[0][0]) - 64 * want[0][0]) <= 1e-5 * 64 * abs(want[0][0])
    scale = cp.asarray([64.0], cp.float32)
    check_close(lossf.backward(scale), ref.cross_entropy_backward(z, labels, 0.1, 64.0, np.empty(z.shape)), 1e-5,
                "dlogits")
    with pytest.raises(RuntimeError, match="call forward"):
        lossf.backward()
    with pytest.raises(TypeError, match="labels: expected int32 device labels"):
        lossf.forward(cp.asarray(z), cp.asarray(labels.astype(np.int64)))
