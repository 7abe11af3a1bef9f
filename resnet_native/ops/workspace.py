"""The native core's process-wide state: the cuDNN version, live descriptor counts, the per-device workspace pool
(its cap, growth before a capture, trimming) and the cuDNN handles."""

from __future__ import annotations

from .._core.loader import _C
from .._core.names import bounded_int
from .._core.runtime import current_stream, require_gpu
from .conv import _drop_cached_descriptors


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
