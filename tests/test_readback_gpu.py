"""DeviceValues: a read-back that waits for its own copies, not for the work queued after them on the stream."""

import time

import numpy as np
import pytest
from stream_spin import spin_kernel as _spin_kernel

from resnet_native._core.readback import DeviceValues

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def test_the_result_does_not_wait_for_later_work_on_the_stream(rng):
    values = rng.standard_normal(5)
    a, b = cp.asarray(values), cp.arange(3, dtype=cp.int32)
    spin = _spin_kernel()
    spin((1,), (1,), (np.int64(50_000_000),))  # 50 ms before the values: result() waits for these
    read = DeviceValues((a, b), lambda x, y: (x.copy(), y.copy()))
    a.fill(np.nan)  # queued after the copy: the copy keeps the values before it
    spin((1,), (1,), (np.int64(2_000_000_000),))  # holds the stream for 2 s after the copies
    t0 = time.perf_counter()
    x, y = read.result()
    waited = time.perf_counter() - t0
    assert waited < 1.0, f"result() waited {waited:.2f} s: it waited for the work queued after the copies"
    np.testing.assert_array_equal(x, values)
    np.testing.assert_array_equal(y, [0, 1, 2])
    np.testing.assert_array_equal(read.result()[0], values)  # a second result() reads the same copies
    cp.cuda.get_current_stream().synchronize()


def test_host_arrays_are_copied_at_once_and_strided_device_arrays_are_refused():
    host = np.arange(4.0)
    read = DeviceValues((host,), lambda x: x)
    host[:] = -1
    np.testing.assert_array_equal(read.result(), np.arange(4.0))
    with pytest.raises(ValueError, match="contiguous"):
        DeviceValues((cp.zeros((4, 4))[:, 1],), lambda x: x)


def test_more_values_than_one_block_of_slots_stay_apart():
    arrays = [cp.full((2,), i, cp.float64) for i in range(300)]  # 300 live read-backs: more than one block
    reads = [DeviceValues((a,), lambda x: float(x[1])) for a in arrays]
    assert [r.result() for r in reads] == list(range(300))
    del reads  # their slots go back, and serve the next ones
    assert DeviceValues((arrays[7],), lambda x: float(x[0])).result() == 7
