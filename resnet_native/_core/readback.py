"""Small device values read back to the host without waiting for everything queued after them.

`float(device_array)` copies on the current stream and waits for the whole stream. When more work is already
queued behind the value (the trainer queues epoch k+1 before it reads epoch k's loss), that read would wait for
the later work too, and the GPU would then idle while the host catches up. DeviceValues queues the copies into
page-locked memory on the current stream, records an event after them, and returns at once; result() waits for
that event alone.
"""

from __future__ import annotations

import threading

import numpy as np

from .placement import array_module

_SLOT_BYTES = 256  # a read-back value of up to this size takes a slot; larger ones allocate
_SLOTS_PER_BLOCK = 256


class _PinnedSlots:
    """Small page-locked buffers, handed out and taken back without allocating. Growing cupy's page-locked pool
    (cudaHostAlloc) synchronises with the device, which would drain the very queue a read-back is meant to
    leave running; the slots come from one block, allocated once (reserve() lets a caller do it up front)."""

    def __init__(self):
        self._free, self._blocks, self._lock = [], [], threading.Lock()

    def reserve(self) -> None:
        with self._lock:
            if not self._free:
                import cupyx

                block = cupyx.empty_pinned((_SLOT_BYTES * _SLOTS_PER_BLOCK,), np.uint8)
                self._blocks.append(block)
                self._free.extend(block[i * _SLOT_BYTES:(i + 1) * _SLOT_BYTES] for i in range(_SLOTS_PER_BLOCK))

    def take(self, nbytes: int):
        if nbytes > _SLOT_BYTES:
            import cupyx

            return cupyx.empty_pinned((nbytes,), np.uint8), False
        self.reserve()
        with self._lock:
            return self._free.pop(), True

    def give_back(self, slots) -> None:
        with self._lock:
            self._free.extend(slots)


_SLOTS = _PinnedSlots()


def reserve_slots() -> None:
    """Allocate the read-back slots now (one page-locked block; a device synchronisation), not in a loop."""
    _SLOTS.reserve()


class DeviceValues:
    """DeviceValues(arrays, convert).result() -> convert(*host copies of arrays), the copies queued now on the
    current stream (host arrays are copied at once). convert receives views into reused page-locked memory: it
    returns values (numbers, copies), never the views themselves."""

    def __init__(self, arrays, convert):
        self._convert = convert
        self._event = None
        self._slots = []
        if all(array_module(a) is np for a in arrays):
            self._host = [np.array(a) for a in arrays]
            return
        import cupy

        for a in arrays:
            if not a.flags.c_contiguous:
                raise ValueError(f"DeviceValues: expected contiguous device arrays, got strides {a.strides}")
        stream = cupy.cuda.get_current_stream()
        self._host = []
        for a in arrays:
            buffer, slot = _SLOTS.take(a.nbytes)
            if slot:
                self._slots.append(buffer)
            host = buffer[:a.nbytes].view(a.dtype).reshape(a.shape)
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
        # The slots go back for reuse with this object: a copy still in flight must land first.
        try:
            if getattr(self, "_event", None) is not None:
                self._event.synchronize()
            if getattr(self, "_slots", None):
                _SLOTS.give_back(self._slots)
        except Exception:  # a CUDA error already raised elsewhere, or the interpreter shutting down
            pass
