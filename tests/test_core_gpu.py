"""The native core on a GPU: handle and stream binding, workspace growth, cap, OOM hook, array parsing."""

import numpy as np
import pytest

import resnet_native as rn
from resnet_native import _C
from resnet_native._core.capture import WorkspaceHold

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


def test_handle_is_created_once_and_bound_to_each_stream():
    _C._testing.handle_stream(0)
    assert rn.live_descriptors()["handle"] >= 1
    handles = rn.live_descriptors()["handle"]
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    assert _C._testing.handle_stream(s1.ptr) == s1.ptr
    assert _C._testing.handle_stream(s2.ptr) == s2.ptr
    assert _C._testing.handle_stream(0) == 0
    assert rn.live_descriptors()["handle"] == handles  # re-bound, not re-created
    with s1:
        assert rn.current_stream() == s1.ptr


def test_device_time_ms_times_the_device_behind_a_gate():
    stream = cp.cuda.Stream(non_blocking=True)
    a = cp.ones((1 << 22,), cp.float32)
    calls = []

    def work():
        calls.append(1)
        with stream:
            a.__imul__(1.0)

    ms = _C.device_time_ms(work, stream.ptr, runs=5, warmup=2)
    assert 0 < ms < 1000 and len(calls) == 7

    def fails():
        raise KeyError("from fn")

    with pytest.raises(KeyError, match="from fn"):
        _C.device_time_ms(fails, stream.ptr)
    with _C.HostGate(stream.ptr):  # the stream waits until the gate opens, on leaving
        work()
    stream.synchronize()  # the gate opened: a failed timing or a gate left nothing holding the stream


def test_workspace_grows_only_when_needed_and_respects_the_cap():
    old = rn.workspace_limit()
    rn.release_workspace()
    try:
        rn.set_workspace_limit(None)
        base = rn.workspace_stats()
        assert base["size"] == 0
        p1 = _C._testing.workspace_get(3 << 20, 0)
        s = rn.workspace_stats()
        assert s["size"] >= 3 << 20 and s["grows"] == base["grows"] + 1
        assert _C._testing.workspace_get(1 << 20, 0) == p1  # smaller request: same buffer, no growth
        assert rn.workspace_stats()["grows"] == s["grows"]
        _C._testing.workspace_get(17 << 20, 0)
        s2 = rn.workspace_stats()
        assert s2["size"] >= 17 << 20 and s2["grows"] == s["grows"] + 1 and s2["peak_request"] >= 17 << 20
        rn.set_workspace_limit(8 << 20)
        with pytest.raises(ValueError, match="exceeds the limit"):
            _C._testing.workspace_get(9 << 20, 0)
        rn.set_workspace_limit(None)
        rn.reserve_workspace(32 << 20)
        assert rn.workspace_stats()["size"] >= 32 << 20
        rn.release_workspace()
        assert rn.workspace_stats()["size"] == 0
    finally:
        rn.set_workspace_limit(old)


def test_trim_gives_back_what_only_searches_asked_for():
    rn.release_workspace()
    try:
        _C._testing.workspace_get(3 << 20, 0)
        _C._testing.workspace_get(64 << 20, 0, search=True)  # an algorithm search's candidate
        s = rn.workspace_stats()
        assert s["size"] >= 64 << 20 and s["peak_use"] == 3 << 20 and s["peak_size"] >= 64 << 20
        hold = WorkspaceHold()
        assert rn.trim_workspace() == 0  # a captured graph keeps the buffer's address
        hold.release()
        assert rn.trim_workspace() == s["size"] - (3 << 20)
        assert rn.workspace_stats()["size"] == 3 << 20
        assert rn.trim_workspace() == 0
        rn.reserve_workspace(8 << 20)  # a reservation is a use
        assert rn.workspace_stats()["peak_use"] == 8 << 20 and rn.trim_workspace() == 0
        rn.release_workspace()
        assert rn.workspace_stats()["peak_use"] == 0
    finally:
        rn.release_workspace()


def test_a_trimmed_pool_still_runs_every_chosen_convolution_without_growing():
    from resnet_native.ops import conv

    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal((64, 32, 32, 64)), dtype=cp.float16)
    w = cp.asarray(rng.standard_normal((64, 3, 3, 64)) * 0.05, dtype=cp.float16)
    spec = conv.ConvSpec(padding=1, layout="NHWC", precision="fp16", algo="find", deterministic=True)
    rn.release_workspace()
    try:
        first = conv.conv2d(x, w, spec)
        dy = cp.ones_like(first)
        dw = conv.conv2d_backward_filter(x, dy, spec, w.shape)
        rn.trim_workspace()
        s = rn.workspace_stats()
        assert s["size"] <= max(s["peak_use"] + (1 << 20), 1 << 20)
        again = conv.conv2d(x, w, spec)
        dw_again = conv.conv2d_backward_filter(x, dy, spec, w.shape)
        cp.cuda.Device().synchronize()
        assert rn.workspace_stats()["grows"] == s["grows"]  # the chosen algorithms fit what was kept
        assert cp.array_equal(again, first) and cp.array_equal(dw_again, dw)
    finally:
        rn.release_workspace()


def test_out_of_memory_frees_cupy_cache_once_then_raises():
    calls = []
    _C._set_out_of_memory_hook(lambda: calls.append(1))
    try:
        with pytest.raises(rn.CudaError, match="could not allocate"):
            _C._testing.workspace_get(1 << 50, 0)  # 1 PiB: no card has it
        assert calls == [1]
    finally:
        from resnet_native._core import runtime as _runtime

        _C._set_out_of_memory_hook(_runtime._free_cupy_cache)
        rn.release_workspace()


def test_workspace_growth_during_capture_is_refused():
    rn.release_workspace()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(ValueError, match="during CUDA-graph capture"):
                _C._testing.workspace_get(1 << 20, stream.ptr)
        finally:
            stream.end_capture()


def test_cupy_arrays_parse_and_bad_ones_are_named():
    x = cp.arange(24, dtype=cp.float32).reshape(2, 3, 4)
    ptr, dtype, shape = _C._testing.parse_tensor(x, "x", "fp32")
    assert ptr == x.data.ptr and dtype == "float32" and shape == (2, 3, 4)
    with pytest.raises(ValueError, match="^x: expected a C-contiguous array"):
        _C._testing.parse_tensor(x.transpose(2, 1, 0), "x", "fp32")
    with pytest.raises(TypeError, match="^x: expected a float16 array"):
        _C._testing.parse_tensor(x, "x", "fp16")
    assert _C._testing.parse_tensor(x[1], "x", "fp32")[0] == x.data.ptr + 12 * 4  # offset views keep their pointer


def test_dlpack_arrays_parse_and_cpu_tensors_are_refused():
    torch = pytest.importorskip("torch")
    t = torch.randn(2, 3, device="cuda")
    assert _C._testing.parse_tensor(t, "t", "fp32")[0] == t.data_ptr()
    b = torch.zeros(5, dtype=torch.bfloat16, device="cuda")
    assert _C._testing.parse_tensor(b, "b", "bf16")[1] == "bfloat16"
    with pytest.raises(TypeError, match="^t: expected a CUDA array"):
        _C._testing.parse_tensor(torch.randn(2, 3), "t", "fp32")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.uint16, np.int32])
def test_new_device_buffers_start_poisoned_or_zero(dtype):
    from test_core_cpu import assert_new_buffer

    from resnet_native._core.buffers import BufferCache

    cache = BufferCache(xp=cp)
    a = cache.get("x", (3, 1000), dtype)
    assert cache.get("x", (3, 1000), dtype) is a
    assert_new_buffer(cp.asnumpy(a), (3, 1000), dtype)
