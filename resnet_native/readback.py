"""Small device values read back to the host without waiting for everything queued after them.

`float(device_array)` copies on the current stream and waits for the whole stream. When more work is already
queued behind the value (the trainer queues epoch k+1 before it reads epoch k's loss), that read would wait for
the later work too, and the GPU would then idle while the host catches up. DeviceValues queues the copies into
page-locked memory on the current stream, records an event after them, and returns at once; result() waits for
that event alone.
"""

from __future__ import annotations

import numpy as np

from .layers.placement import array_module


class DeviceValues:
    """DeviceValues(arrays, convert).result() -> convert(*host copies of arrays), the copies queued now on the
    current stream (host arrays are copied at once)."""

    def __init__(self, arrays, convert):
        self._convert = convert
        self._event = None
        if all(array_module(a) is np for a in arrays):
            self._host = [np.array(a) for a in arrays]
            return
        import cupy
        import cupyx

        stream = cupy.cuda.get_current_stream()
        self._host = []
        for a in arrays:
            if not a.flags.c_contiguous:
                raise ValueError(f"DeviceValues: expected contiguous device arrays, got strides {a.strides}")
            host = cupyx.empty_pinned(a.shape, a.dtype)
            cupy.cuda.runtime.memcpyAsync(host.ctypes.data, a.data.ptr, a.nbytes, cupy.cuda.runtime.memcpyDeviceToHost,
                                          stream.ptr)
            self._host.append(host)
        self._event = stream.record(cupy.cuda.Event(disable_timing=True))

    def result(self):
        """Waits for the copies (not for later work on their stream) and returns convert(*host arrays)."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._convert(*self._host)

    def __del__(self):
        # The page-locked blocks go back to cupy's pool with this object: a copy still in flight must land first.
        event = getattr(self, "_event", None)
        if event is not None:
            try:
                event.synchronize()
            except Exception:  # a CUDA error already raised elsewhere, or the interpreter shutting down
                pass

