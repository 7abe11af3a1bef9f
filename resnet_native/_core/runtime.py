"""The Python side of the runtime: which stream ops run on, and cupy's memory pool.

Every op passes cupy's current stream to the core, which binds the cuDNN handle to it, so work is ordered with
the user's cupy work on any stream. cupy is imported lazily: `import resnet_native` works without it.
"""

from .loader import _C

NoGPUError = _C.NoGPUError
CudnnError = _C.CudnnError


def cuda_available() -> bool:
    """True when a CUDA GPU is usable (the driver loads and at least one device is present)."""
    return _C.device_count() > 0


def device_unavailable_reason() -> str:
    """Why no GPU is usable (the driver's or the runtime's words); empty when one is."""
    return _C.device_unavailable_reason()


def require_gpu() -> None:
    """Raise resnet_native.NoGPUError with the reason when no GPU is usable."""
    if not cuda_available():
        raise _C.NoGPUError(
            "resnet_native: this operation needs a CUDA GPU, but none is usable "
            f"({_C.device_unavailable_reason()})"
        )


def current_stream() -> int:
    """cupy's current stream as an integer handle (0: the legacy default stream)."""
    import cupy

    return cupy.cuda.get_current_stream().ptr


# cupy.cuda.get_current_stream, bound by the first op call that finds a GPU: op_stream() runs on every op call, so
# it skips the device_count() call and the `import cupy` of current_stream() (same value).
_get_current_stream = None


def op_stream() -> int:
    """The stream an op runs on: cupy's current stream; 0 without a GPU, where cupy cannot even name a stream and
    the op validates its arguments and then raises NoGPUError at the first device access. (A process's device
    count does not change, so the check runs until a GPU is seen.)"""
    global _get_current_stream
    if _get_current_stream is None:
        if _C.device_count() == 0:
            return 0
        import cupy

        _get_current_stream = cupy.cuda.get_current_stream
    return _get_current_stream().ptr


def _free_cupy_cache() -> None:
    try:
        import cupy
    except ImportError:
        return
    cupy.get_default_memory_pool().free_all_blocks()


# When the workspace pool's cudaMalloc fails, free cupy's cached blocks and retry once.
_C._set_out_of_memory_hook(_free_cupy_cache)
