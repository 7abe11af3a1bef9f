"""The package's one way to time GPU work: the native core's timer, which the convolution engines' searches use
too. Runs are queued back to back behind a host gate, so the host's launch gaps do not count, and the median of
the runs is returned, so one slow run (a clock change, another process) decides nothing."""

from __future__ import annotations

from .._core.loader import _C

# Holds a stream (an int handle) until released or MAX_HOLD_NS passed, so work queued behind it starts together.
HostGate = _C.HostGate


def device_time_ms(fn, stream, *, runs: int = 5, warmup: int = 1) -> float:
    """Median device milliseconds of one fn() call. fn queues its work on `stream` (a cupy Stream) and must not
    synchronise; `warmup` untimed calls come first. Synchronises once at the end; refused during a capture."""
    return float(_C.device_time_ms(fn, stream.ptr, runs, warmup))
