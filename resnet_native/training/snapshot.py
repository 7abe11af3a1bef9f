"""Host copies of the training state taken without stalling the host, for checkpoints written in the background.

A checkpoint needs every parameter, buffer and optimizer state array on the host. Copied one synchronous `.get()`
at a time into fresh pageable NumPy memory, with the NHWC conv weights transposed to torch's layout on the spot,
that holds the training loop for tens of milliseconds per epoch. Here take() only enqueues one asynchronous
device-to-host copy per array into page-locked buffers kept from one checkpoint to the next, on the current
stream, and returns; resolve() (on the checkpoint writer's thread) waits for those copies and does the layout
conversions there.

Ordering: the copies run on the stream that is current at take(). Work that later overwrites the arrays must be
ordered after it: the same stream, or a blocking stream when the current one is the legacy default stream (as in
the trainer, whose captured step replays on a blocking stream).
"""

from __future__ import annotations

import threading

import numpy as np

from ..layers.placement import array_module

_ALIGN = 64  # bytes between entries of a buffer: every view is aligned for any dtype


class HostSnapshot:
    """take({group: {name: (array, to_host)}}) -> PendingSnapshot, whose resolve() gives
    {group: {name: to_host(host copy of array)}}.

    Arrays may be device (cupy) or host (NumPy) arrays; host ones are copied at take(). Buffers are reused by
    later takes once their snapshot is resolved or released; a take that finds none free allocates another, so it
    never waits.
    """

    def __init__(self):
        self._free = []  # buffers of resolved snapshots: (layout, host uint8 array)
        self._lock = threading.Lock()

    def take(self, groups: dict) -> PendingSnapshot:
        entries = [(g, k, a, to_host) for g, sources in groups.items() for k, (a, to_host) in sources.items()]
        layout, nbytes = _layout(entries)
        on_device = any(_is_device(a) for _, _, a, _ in entries)
        buffer = self._buffer(layout, nbytes, on_device)
        keep, event = [], None
        if on_device:
            import cupy

            stream = cupy.cuda.get_current_stream()
        for (_, _, a, _), (offset, shape, dtype) in zip(entries, layout, strict=True):
            view = _view(buffer, offset, shape, dtype)
            if not _is_device(a):
                np.copyto(view, np.asarray(a), casting="no")
                continue
            if not a.flags.c_contiguous:
                a = cupy.ascontiguousarray(a)
                keep.append(a)  # alive until its copy has run
            if a.nbytes:
                cupy.cuda.runtime.memcpyAsync(view.ctypes.data, a.data.ptr, a.nbytes,
                                              cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        if on_device:
            event = cupy.cuda.Event(disable_timing=True)
            event.record(stream)
        return PendingSnapshot(self, entries, layout, buffer, event, keep)

    def _buffer(self, layout, nbytes: int, pinned: bool):
        with self._lock:
            for i, (free_layout, _) in enumerate(self._free):
                if free_layout == layout:
                    return self._free.pop(i)[1]
        if pinned:
            import cupyx

            return cupyx.empty_pinned((max(nbytes, 1),), np.uint8)
        return np.empty((max(nbytes, 1),), np.uint8)

    def _give_back(self, layout, buffer) -> None:
        with self._lock:
            self._free.append((layout, buffer))
            del self._free[:-2]  # the trainer has at most two checkpoints in flight


class PendingSnapshot:
    """The copies take() enqueued. resolve() waits for them (a host sync on their event only) and returns the
    converted host values, each in memory of its own; the buffer then goes back for the next take."""

    def __init__(self, owner, entries, layout, buffer, event, keep):
        self._owner, self._entries, self._layout = owner, entries, layout
        self._buffer, self._event, self._keep = buffer, event, keep

    def resolve(self) -> dict:
        if self._buffer is None:
            raise RuntimeError("this snapshot was already resolved or released")
        try:
            if self._event is not None:
                self._event.synchronize()
            out = {}
            for (group, key, _, to_host), (offset, shape, dtype) in zip(self._entries, self._layout, strict=True):
                value = to_host(_view(self._buffer, offset, shape, dtype))
                if isinstance(value, np.ndarray) and np.may_share_memory(value, self._buffer):
                    value = value.copy()
                out.setdefault(group, {})[key] = value
            return out
        finally:
            self.release()

    def release(self) -> None:
        """Give the buffer back without reading it (after the copies have run)."""
        if self._buffer is None:
            return
        if self._event is not None:
            self._event.synchronize()
        buffer, self._buffer, self._keep = self._buffer, None, None
        self._owner._give_back(self._layout, buffer)


def _is_device(a) -> bool:
    return array_module(a) is not np


def _layout(entries) -> tuple:
    """((offset, shape, dtype) per entry, total bytes)."""
    layout, offset = [], 0
    for _, _, a, _ in entries:
        dtype = np.dtype(a.dtype)
        layout.append((offset, tuple(a.shape), dtype.str))
        offset += -(-int(a.size) * dtype.itemsize // _ALIGN) * _ALIGN
    return tuple(layout), offset


def _view(buffer, offset: int, shape: tuple, dtype: str) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return buffer[offset:offset + n].view(dtype).reshape(shape)
