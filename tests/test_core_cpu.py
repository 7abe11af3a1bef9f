"""The native core on any machine: import, versions, descriptor accounting, errors, argument checks."""

import numpy as np
import pytest
from fake_arrays import FakeCudaArray, transposed

import resnet_native as rn
from resnet_native import _C


def test_import_and_versions():
    assert rn.cudnn_version() // 10000 == _C.CUDNN_MAJOR_COMPILED == 9
    assert isinstance(rn.cuda_available(), bool)
    assert rn.CUDNN_LIBRARY is None or rn.CUDNN_LIBRARY.endswith(".so.9")


@pytest.mark.parametrize("kind", _C._testing.descriptor_kinds())
def test_create_destroy_10k_returns_to_baseline(kind):
    before = rn.live_descriptors().get(kind, 0)
    _C._testing.create_destroy(kind, 10_000)
    assert rn.live_descriptors()[kind] == before


def test_every_kind_is_counted_while_alive():
    # The counters must move: a create/destroy loop that never counted would also "return to baseline".
    kinds = set(_C._testing.descriptor_kinds())
    assert {"tensor", "filter", "convolution", "activation", "backend.OPERATIONGRAPH"} <= kinds
    for kind in kinds:  # a kind is listed once one was made: not only after the test above ran in this process
        _C._testing.create_destroy(kind, 1)
    assert all(name in rn.live_descriptors() for name in kinds)


def test_unknown_kind_is_a_value_error():
    with pytest.raises(ValueError, match="unknown descriptor kind 'nope'"):
        _C._testing.create_destroy("nope", 1)


def test_exception_mid_construction_leaks_nothing_and_names_the_failure():
    before = rn.live_descriptors()
    with pytest.raises(rn.CudnnError) as info:
        _C._testing.failing_construction()
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.status == "CUDNN_STATUS_BAD_PARAM" and err.code == 2000
    text = str(err)
    assert "cudnnSetFilter4dDescriptor" in text and "bind_testing.cpp:" in text and "cuDNN says:" in text
    after = rn.live_descriptors()
    assert {k: v for k, v in after.items() if v != before.get(k, 0)} == {}


def test_numpy_array_is_rejected_naming_the_argument():
    with pytest.raises(TypeError, match=r"^x: expected a CUDA array.*host memory"):
        _C._testing.parse_tensor(np.zeros((2, 3), np.float32), "x", "fp32", check_device=False)


def test_none_and_plain_objects_are_rejected():
    with pytest.raises(TypeError, match="^w: expected a CUDA array, got None"):
        _C._testing.parse_tensor(None, "w", "fp32")
    with pytest.raises(TypeError, match="^w: expected a CUDA array.*got list"):
        _C._testing.parse_tensor([1.0, 2.0], "w", "fp32")


def test_wrong_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="^x: expected a float16 array, got float32"):
        _C._testing.parse_tensor(FakeCudaArray((2, 3), "float32"), "x", "fp16", check_device=False)
    with pytest.raises(TypeError, match="bfloat16 is passed as uint16"):
        _C._testing.parse_tensor(FakeCudaArray((2, 3), "float32"), "x", "bf16", check_device=False)


def test_bf16_accepts_uint16_bit_patterns():
    ptr, dtype, shape = _C._testing.parse_tensor(FakeCudaArray((4, 5), "uint16", ptr=0x10000), "x", "bf16",
                                         check_device=False)
    assert (ptr, dtype, shape) == (0x10000, "bfloat16", (4, 5))


def test_rank_empty_and_strides():
    with pytest.raises(ValueError, match=r"^x: expected a 4-D array, got shape \(2, 3\)"):
        _C._testing.parse_tensor(FakeCudaArray((2, 3)), "x", "fp32", ndim=4, check_device=False)
    with pytest.raises(ValueError, match=r"^x: empty arrays are not supported \(shape \(0, 3\)\)"):
        _C._testing.parse_tensor(FakeCudaArray((0, 3)), "x", "fp32", check_device=False)
    with pytest.raises(ValueError, match="^dy: expected a C-contiguous array"):
        _C._testing.parse_tensor(transposed((4, 6)), "dy", "fp32", check_device=False)
    # Explicit C-contiguous strides are fine; size-1 dimensions may carry any stride.
    ok = FakeCudaArray((4, 1, 6), strides=(24, 999, 4))
    assert _C._testing.parse_tensor(ok, "x", "fp32", check_device=False)[2] == (4, 1, 6)


def test_string_arguments_are_validated():
    with pytest.raises(ValueError, match="dtype: expected one of"):
        _C._testing.parse_tensor(FakeCudaArray((2,)), "x", "fp64", check_device=False)


def test_workspace_limit_validation_and_roundtrip():
    old = rn.workspace_limit()
    try:
        rn.set_workspace_limit(1 << 20)
        assert rn.workspace_limit() == 1 << 20
        rn.set_workspace_limit(None)
        assert rn.workspace_limit() is None
        with pytest.raises(ValueError, match="nbytes"):
            rn.set_workspace_limit(-1)
        rn.set_workspace_limit(np.int64(4096))  # NumPy integers are ints
        assert rn.workspace_limit() == 4096
    finally:
        rn.set_workspace_limit(old)


@pytest.mark.parametrize("bad, error", [
    (True, TypeError), (False, TypeError), (1.5, TypeError), ("4096", TypeError), (np.bool_(True), TypeError),
    (2**64, ValueError),  # does not fit size_t
    (2**64 - 1, ValueError),  # SIZE_MAX, the native core's "no cap"
])
def test_workspace_limit_refuses_bools_and_out_of_range_counts(bad, error):
    """A bool is an int in Python: set_workspace_limit(True) must not become a 1-byte cap."""
    old = rn.workspace_limit()
    try:
        rn.set_workspace_limit(1 << 20)
        with pytest.raises(error, match="^nbytes: expected"):
            rn.set_workspace_limit(bad)
        assert rn.workspace_limit() == 1 << 20  # unchanged
        with pytest.raises(error, match="^nbytes: expected"):
            rn.reserve_workspace(bad)  # checked before the GPU is looked for
    finally:
        rn.set_workspace_limit(old)


@pytest.mark.skipif(rn.cuda_available(), reason="checks the no-GPU error path")
def test_gpu_ops_without_gpu_raise_a_clear_error():
    with pytest.raises(rn.NoGPUError, match="needs a CUDA GPU"):
        rn.workspace_stats()
    with pytest.raises(rn.NoGPUError, match="needs a CUDA GPU"):
        rn.trim_workspace()
    with pytest.raises(rn.NoGPUError, match="needs a CUDA GPU"):
        _C._testing.parse_tensor(FakeCudaArray((2,)), "x", "fp32")  # valid, then the device check


def test_release_handles_drops_cached_plans_first_and_leaks_nothing():
    before = rn.live_descriptors()
    rn.release_handles()
    rn.release_handles()  # idempotent
    after = rn.live_descriptors()
    assert all(after.get(k, 0) <= v for k, v in before.items())
    assert after.get("handle", 0) == 0


def test_test_hooks_live_in_the_testing_submodule():
    assert _C._testing.__name__ == "resnet_native._C._testing"
    for name in ("parse_tensor", "create_destroy", "workspace_get", "graph_build_operations", "conv_params_hash",
                 "probe_legacy_int8x32"):
        assert callable(getattr(_C._testing, name))
        assert not hasattr(_C, "_" + name) and not hasattr(_C, name)


def test_timing_arguments_are_checked_and_a_gate_needs_no_gpu():
    with pytest.raises(ValueError, match="^runs: expected runs >= 1"):
        _C.device_time_ms(lambda: None, 0, runs=0)
    with pytest.raises(ValueError, match="^runs: .*warmup >= 0"):
        _C.device_time_ms(lambda: None, 0, runs=3, warmup=-1)
    assert _C.HostGate.MAX_HOLD_NS > 0
    with _C.HostGate(0) as gate:  # without page-locked memory (no GPU) there is no gate: nothing waits
        gate.release()
    gate.release()  # idempotent


def assert_new_buffer(host, shape, dtype):
    """A new BufferCache buffer (read back to the host): NaN for floats and bf16 bits (uint16), else zeros."""
    assert host.shape == shape and host.dtype == dtype
    if dtype == np.uint16:  # bf16 bits: NaN
        assert np.isnan((host.astype(np.uint32) << 16).view(np.float32)).all()
    elif np.dtype(dtype).kind == "f":
        assert np.isnan(host).all()
    else:
        assert (host == 0).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.uint16, np.int32, np.int8])
def test_new_buffers_start_poisoned_or_zero(dtype):
    from resnet_native._core.buffers import BufferCache

    cache = BufferCache(xp=np)
    a = cache.get("x", (3, 5), dtype)
    assert cache.get("x", (3, 5), dtype) is a
    assert_new_buffer(a, (3, 5), dtype)
