"""The softmax cross-entropy without a GPU: the native ops' argument checks (fakes), the float64 reference's
properties (running totals, label smoothing, NaN for a bad label, scale), and SoftmaxCrossEntropy's dispatch."""

import numpy as np
import pytest
from fake_arrays import FakeCudaArray, expect_device_stage, fake

from resnet_native import _C
from resnet_native.ops.losses import SoftmaxCrossEntropy
from resnet_native.reference import loss as ref


def _forward(**over):
    args = dict(logits=fake((4, 10)), labels=fake((4,), "int32"), label_smoothing=0.1, loss=fake((1,)),
                correct=fake((1,), "int32"), loss_sum=fake((1,), "float64"), correct_sum=fake((1,), "float64"),
                stream=0)
    args.update(over)
    return _C.cross_entropy_forward(**args)


def _backward(**over):
    args = dict(logits=fake((4, 10)), labels=fake((4,), "int32"), label_smoothing=0.0, scale=None,
                grad=fake((4, 10)), stream=0)
    args.update(over)
    return _C.cross_entropy_backward(**args)


def test_forward_checks_every_argument():
    with expect_device_stage():
        _forward()
    with expect_device_stage():
        _forward(loss=None, correct=None, loss_sum=None)
    cases = [
        (dict(logits=fake((4, 10), "float16")), TypeError, "logits: expected a float32"),
        (dict(logits=fake((40,))), ValueError, "logits: expected a 2-D array"),
        (dict(labels=fake((4,), "int64")), TypeError, "labels: expected an int32"),
        (dict(labels=fake((5,), "int32")), ValueError, "labels: expected shape \\(4,\\)"),
        (dict(label_smoothing=1.0), ValueError, "label_smoothing: expected a value in \\[0, 1\\)"),
        (dict(label_smoothing="0.1"), TypeError, "label_smoothing"),
        (dict(loss=fake((2,))), ValueError, "loss: expected shape \\(1,\\)"),
        (dict(loss=fake((1,), "float64")), TypeError, "loss: expected a float32"),
        (dict(correct=fake((1,), "float32")), TypeError, "correct: expected an int32"),
        (dict(loss_sum=fake((1,), "float32")), TypeError, "loss_sum: expected a float64"),
        (dict(correct_sum=fake((1,), "float64", readonly=True)), ValueError, "correct_sum"),
        (dict(loss=None, correct=None, loss_sum=None, correct_sum=None), ValueError, "loss, correct, loss_sum"),
    ]
    for over, error, message in cases:
        with pytest.raises(error, match=message):
            _forward(**over)


def test_forward_refuses_outputs_sharing_memory():
    logits = FakeCudaArray((4, 10))
    with pytest.raises(ValueError, match="loss must not share memory with logits"):
        _forward(logits=logits, loss=FakeCudaArray((1,), ptr=logits.ptr))
    total = FakeCudaArray((1,), "float64")
    with pytest.raises(ValueError, match="correct_sum must not share memory with loss_sum"):
        _forward(loss_sum=total, correct_sum=FakeCudaArray((1,), "float64", ptr=total.ptr))


def test_backward_checks_every_argument():
    with expect_device_stage():
        _backward()
    with expect_device_stage():
        _backward(scale=256.0)
    with expect_device_stage():
        _backward(scale=fake((1,)))
    logits = FakeCudaArray((4, 10))
    with expect_device_stage():  # in place
        _backward(logits=logits, grad=logits)
    cases = [
        (dict(scale=fake((2,))), ValueError, "scale: expected shape \\(1,\\)"),
        (dict(scale="2"), TypeError, "scale: expected a number or a float32 device array"),
        (dict(scale=True), TypeError, "scale"),
        (dict(grad=fake((4, 11))), ValueError, "grad and logits must have the same shape"),
        (dict(grad=fake((4, 10), "float16")), TypeError, "grad: expected a float32"),
        (dict(logits=logits, grad=FakeCudaArray((4, 10), ptr=logits.ptr + 4)), ValueError, "grad"),
    ]
    for over, error, message in cases:
        with pytest.raises(error, match=message):
            _backward(**over)


def _direct(z, labels, s):
    """The loss written out per row, in float64."""
    n, c = z.shape
    logp = z - z.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    t = np.full((n, c), s / c)
    t[np.arange(n), labels] += 1 - s
    return -(t * logp).sum(1)


def test_reference_totals_accumulate_and_bad_labels_give_nan(rng):
    z = rng.standard_normal((6, 5)) * 4
    labels = rng.integers(0, 5, 6)
    loss, correct = np.full(1, np.nan), np.zeros(1, np.int32)
    loss_sum, correct_sum = np.array([1.5]), np.array([2.0])
    ref.cross_entropy_forward(z, labels, 0.2, loss, correct, loss_sum, correct_sum)
    rows = _direct(z, labels, 0.2)
    hits = int((z.argmax(1) == labels).sum())
    assert np.isclose(loss[0], rows.mean(), rtol=1e-13) and correct[0] == hits
    assert np.isclose(loss_sum[0], 1.5 + rows.sum(), rtol=1e-13) and correct_sum[0] == 2.0 + hits
    bad = labels.copy()
    bad[2] = 5
    grad = np.zeros_like(z)
    ref.cross_entropy_forward(z, bad, 0.0, loss)
    ref.cross_entropy_backward(z, bad, 0.0, np.array([4.0]), grad)
    assert np.isnan(loss[0]) and np.isnan(grad[2]).all() and np.isfinite(np.delete(grad, 2, 0)).all()


def test_host_loss_adds_to_totals_and_device_labels_must_be_int32(rng):
    z = rng.standard_normal((4, 3))
    labels = np.array([0, 2, 1, 1], np.int32)
    totals = (np.zeros(1), np.zeros(1))
    lossf = SoftmaxCrossEntropy()
    for _ in range(2):
        loss, correct = lossf.forward(z, labels, train=False, totals=totals)
    assert np.isclose(totals[0][0], 2 * 4 * float(loss)) and totals[1][0] == 2 * int(correct)
    with pytest.raises(TypeError, match="labels: expected int32 device labels, got int64"):
        SoftmaxCrossEntropy().forward(FakeLogits((4, 3)), FakeLabels((4,)))


class FakeLogits(FakeCudaArray):
    ndim = 2


class FakeLabels(FakeCudaArray):
    def __init__(self, shape):
        super().__init__(shape, "int64")
