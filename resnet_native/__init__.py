"""resnet_native: ResNets on cuDNN, called directly from a small C++/CUDA core.

Arrays are cupy arrays (or anything with __cuda_array_interface__ / DLPack).
See README.md and ARCHITECTURE.md.
"""

from . import kernels, multi_tensor, norm, pool  # noqa: F401  (native ops: kernels, BN, pooling)
from ._loader import _C, CUDNN_LIBRARY, build_info
from ._runtime import cuda_available, current_stream, require_gpu
from .classifier import CIFAR10Classifier  # released CIFAR-10 models (resnet_native.release)
from .conv import ConvSpec, _drop_cached_descriptors, conv2d, conv_output_shape  # noqa: F401
from .inference import InferenceEngine  # the serving engine (resnet_native.inference)
from .models import ResNet, ResNet18, ResNet34, ResNet50, ResNet101, ResNet152
from .names import bounded_int
from .onnx_export import export_onnx  # ONNX export (needs the extra: pip install "resnet_native[onnx]")
from .optim import SGD, AdamW, GradScaler  # resnet_native.optim: also schedules
from .step import TrainStep

__version__ = "0.1.0"

CudnnError = _C.CudnnError
CudaError = _C.CudaError
NoGPUError = _C.NoGPUError


def cudnn_version() -> int:
    """Version of the cuDNN library loaded at run time, e.g. 91900 for 9.19.0."""
    return _C.cudnn_version()


def live_descriptors() -> dict:
    """{kind: live count} of cuDNN handles and descriptors, read from the C++ counters."""
    return dict(_C.live_descriptors())


# The native core keeps byte counts as size_t, and SIZE_MAX means "no cap".
_MAX_BYTES = 2**64 - 2


def _byte_count(value, name: str, *, none_ok: bool = False):
    """An int number of bytes (None too with none_ok); bools are refused (True would be a 1-byte cap)."""
    return None if value is None and none_ok else bounded_int(name, value, 0, _MAX_BYTES, "bytes")


def set_workspace_limit(nbytes) -> None:
    """Cap the workspace that choices may trade for speed at `nbytes` (None: no cap): convolution algorithm search
    picks among those that fit, batch norm takes its plain call when the fused one's workspace does not. Scratch
    an op cannot run without (batch norm's masked gradient and parameter-gradient scratch) is taken regardless."""
    _C.set_workspace_limit(_byte_count(nbytes, "nbytes", none_ok=True))


def workspace_limit():
    return _C.workspace_limit()


def workspace_stats() -> dict:
    """The current device's workspace pool: size, peak_request (searches included), peak_use (what ops and
    chosen algorithms asked for since the last release), peak_size, limit, grows, requests, graph_holds,
    retired, stream_waits."""
    require_gpu()
    return dict(_C.workspace_stats())


def reserve_workspace(nbytes: int) -> None:
    """Grow the workspace pool to `nbytes` now, e.g. before capturing a CUDA graph."""
    nbytes = _byte_count(nbytes, "nbytes")
    require_gpu()
    _C.reserve_workspace(nbytes, current_stream())


def trim_workspace() -> int:
    """Shrink the current device's workspace pool to what ops and chosen algorithms have used, giving back what
    only algorithm searches needed; returns the bytes freed. Does nothing (returns 0) while captured graphs hold
    the pool. TrainStep and InferenceEngine call it before they capture."""
    require_gpu()
    return int(_C.trim_workspace(current_stream()))


def release_handles() -> None:
    """Destroy the cuDNN handles (re-created on next use), after the cached plans that were built on them."""
    _drop_cached_descriptors()
    _C._release_handles()


def release_workspace() -> None:
    """Free the current device's workspace buffer; it is re-allocated on demand."""
    require_gpu()
    _C.release_workspace()


__all__ = [
    "CUDNN_LIBRARY",
    "build_info",
    "CudaError",
    "CudnnError",
    "NoGPUError",
    "cuda_available",
    "cudnn_version",
    "current_stream",
    "live_descriptors",
    "release_handles",
    "release_workspace",
    "require_gpu",
    "reserve_workspace",
    "trim_workspace",
    "set_workspace_limit",
    "workspace_limit",
    "workspace_stats",
    "ResNet", "ResNet18", "ResNet34", "ResNet50", "ResNet101", "ResNet152", "SGD", "AdamW", "GradScaler",
    "TrainStep",
    "InferenceEngine",
    "CIFAR10Classifier",
    "export_onnx",
]
