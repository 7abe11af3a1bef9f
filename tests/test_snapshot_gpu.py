"""HostSnapshot of device arrays: the staging copies are enqueued on the current stream, so a kernel enqueued after
take() that overwrites an array does not reach the snapshot, and the transfer to the host runs on a side stream, so
it does not wait for work enqueued after take(); non-contiguous, empty and host arrays between device ones; the
trainer's model and optimizer state equal to state_dict()."""

import cupy as cp
import numpy as np
import pytest
from stream_spin import spin_kernel as _spin_kernel

from resnet_native.nn.models.registry import create_model
from resnet_native.optim import SGD
from resnet_native.training.snapshot import HostSnapshot

pytestmark = pytest.mark.gpu


def test_device_arrays_are_copied_as_they_were_at_take(rng):
    big = cp.asarray(rng.standard_normal((1 << 22,)).astype(np.float32))  # 16 MiB: the copy takes a while
    half = cp.asarray(rng.standard_normal((64, 3, 3, 8)).astype(np.float16))
    strided = cp.asarray(rng.standard_normal((6, 10)).astype(np.float32))[:, ::3]
    empty = cp.zeros((0, 4), cp.float32)
    host = np.arange(5, dtype=np.int64)
    expected = {"big": big.get(), "half": half.get(), "strided": strided.get(), "empty": empty.get(), "host": host}
    snaps = HostSnapshot()
    # The host array sits between device ones: the transfer must not overwrite its copy.
    arrays = {"big": big, "half": half, "host": host, "strided": strided, "empty": empty}
    pending = snaps.take({"g": {k: (a, np.asarray) for k, a in arrays.items()}})
    big.fill(np.nan)  # enqueued after the copies on the same stream
    half *= 0
    out = pending.resolve()["g"]
    for k, v in expected.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape, k
        np.testing.assert_array_equal(out[k], v, err_msg=k)
    again = snaps.take({"g": {"big": (big, np.asarray)}}).resolve()["g"]["big"]
    assert np.isnan(again).all()


def test_the_transfer_to_the_host_does_not_wait_for_work_enqueued_after_take(rng):
    a = cp.asarray(rng.standard_normal((1 << 20,)).astype(np.float32))
    expected = a.get()
    snaps = HostSnapshot()
    pending = snaps.take({"g": {"a": (a, np.asarray)}})
    _spin_kernel()((1,), (1,), (np.int64(2_000_000_000),))  # holds the current stream for 2 s
    spun = cp.cuda.get_current_stream().record()
    out = pending.resolve()["g"]["a"]
    assert not spun.done, "resolve() waited for the work enqueued after take()"
    np.testing.assert_array_equal(out, expected)
    a.fill(0)  # after the spin: the next take reuses the buffers and sees the new values
    np.testing.assert_array_equal(snaps.take({"g": {"a": (a, np.asarray)}}).resolve()["g"]["a"], 0)


def test_the_trainers_state_equals_state_dict(rng):
    model = create_model("resnet18", layout="NHWC", precision="fp16", seed=0).cuda()
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = cp.asarray(rng.standard_normal((8, 32, 32, 3)).astype(np.float16))
    y = cp.asarray(rng.integers(0, 10, 8).astype(np.int32))
    from resnet_native.ops.losses import SoftmaxCrossEntropy

    loss = SoftmaxCrossEntropy()
    model.train()
    for _ in range(2):
        opt.zero_grad()
        logits = model.forward(x, train=True)
        loss.forward(logits, y, train=True)
        model.backward(loss.backward())
        opt.step()
    snap = HostSnapshot().take({"model": model.state_sources(), "optimizer": opt.state_sources()}).resolve()
    for name, ref in (("model", model.state_dict()), ("optimizer", opt.state_dict())):
        arrays = {k: v for k, v in ref.items() if isinstance(v, np.ndarray) and k in snap[name]}
        assert arrays.keys() == snap[name].keys()
        for k, v in arrays.items():
            assert snap[name][k].dtype == v.dtype and snap[name][k].shape == v.shape, k
            np.testing.assert_array_equal(snap[name][k], v, err_msg=k)
    assert np.abs(snap["optimizer"]["momentum_buffer.0"]).max() > 0  # the state after real steps
