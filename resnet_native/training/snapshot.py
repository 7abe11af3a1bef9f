"""Host copies of the training state taken without stalling the host, for checkpoints written in the background.

A checkpoint needs every parameter, buffer and optimizer state array on the host. Copied one synchronous `.get()`
at a time into fresh pageable NumPy memory, with the NHWC conv weights transposed to torch's layout on the spot,
that holds the training loop for tens of milliseconds per epoch. Here take() only enqueues, on the current stream,
one device-to-device copy per array into a staging buffer on the device (about 0.1 ms of device time for a
ResNet-18's 134 MB of weights and AdamW state) and returns. resolve(), on the checkpoint writer's thread, copies
the staging buffer to the host on a non-blocking stream of its own once the staging copies have run, then does the
layout conversions. So the training loop never waits for the PCIe transfer, and nothing it enqueues later (on any
stream, the legacy default stream included) waits for it either. The host buffer is ordinary pageable memory: a
copy into it blocks only the thread that resolves, and page-locking 134 MB would cost the loop more than the
transfer. Both buffers are kept from one checkpoint to the next.

Ordering: the staging copies run on the stream that is current at take(). Work that later overwrites the arrays
must be ordered after it: the same stream, or a blocking stream when the current one is the legacy default stream
(as in the trainer, whose captured step replays on a blocking stream).
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
        self._free = []  # buffers of resolved snapshots: (layout, (host uint8 array, device staging or None))
        self._lock = threading.Lock()

    def take(self, groups: dict) -> PendingSnapshot:
        entries = [(g, k, a, to_host) for g, sources in groups.items() for k, (a, to_host) in sources.items()]
        layout, nbytes = _layout(entries)
        on_device = any(_is_device(a) for _, _, a, _ in entries)
        buffers = self._buffers(layout, nbytes, on_device)
        host, staging = buffers
        staged = None
        if on_device:
            import cupy

            stream = cupy.cuda.get_current_stream()
        for (_, _, a, _), (offset, shape, dtype) in zip(entries, layout, strict=True):
            if not _is_device(a):
                np.copyto(_view(host, offset, shape, dtype), np.asarray(a), casting="no")
            elif a.size:  # a strided array's contiguous copy is freed after its copy is enqueued: same stream
                a = cupy.ascontiguousarray(a)
                cupy.cuda.runtime.memcpyAsync(staging.data.ptr + offset, a.data.ptr, a.nbytes,
                                              cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
        if on_device:
            staged = stream.record(cupy.cuda.Event(disable_timing=True))
        return PendingSnapshot(self, entries, layout, buffers, staged)

    def _buffers(self, layout, nbytes: int, on_device: bool):
        """(host buffer, device staging buffer or None) for layout: a resolved snapshot's, or new ones."""
        with self._lock:
            for i, (free_layout, _) in enumerate(self._free):
                if free_layout == layout:
                    return self._free.pop(i)[1]
        staging = None
        if on_device:
            import cupy

            staging = cupy.empty((max(nbytes, 1),), np.uint8)
        return np.empty((max(nbytes, 1),), np.uint8), staging

    def _give_back(self, layout, buffers) -> None:
        with self._lock:
            self._free.append((layout, buffers))
            del self._free[:-2]  # the trainer has at most two checkpoints in flight


class PendingSnapshot:
    """The staging copies take() enqueued. resolve() copies them to the host once they have run (blocking only its
    own thread) and returns the converted host values, each in memory of its own; the buffers then go back for the
    next take."""

    def __init__(self, owner, entries, layout, buffers, staged):
        self._owner, self._entries, self._layout = owner, entries, layout
        self._buffers, self._staged = buffers, staged

    def resolve(self) -> dict:
        if self._buffers is None:
            raise RuntimeError("this snapshot was already resolved or released")
        try:
            host, staging = self._buffers
            if staging is not None:
                _copy_to_host(staging, host, _device_runs(self._entries, self._layout), self._staged)
            out = {}
            for (group, key, _, to_host), (offset, shape, dtype) in zip(self._entries, self._layout, strict=True):
                value = to_host(_view(host, offset, shape, dtype))
                if isinstance(value, np.ndarray) and np.may_share_memory(value, host):
                    value = value.copy()
                out.setdefault(group, {})[key] = value
            return out
        finally:
            self.release()

    def release(self) -> None:
        """Give the buffers back without reading them (after the staging copies have run)."""
        if self._buffers is None:
            return
        if self._staged is not None:
            self._staged.synchronize()
        buffers, self._buffers = self._buffers, None
        self._owner._give_back(self._layout, buffers)


def _copy_to_host(staging, host, runs, staged) -> None:
    """staging's device runs into host, after the event `staged`, on a non-blocking stream of staging's device (so
    that the copy waits for nothing else, and nothing else waits for it)."""
    import cupy

    with cupy.cuda.Device(staging.device.id):
        stream = cupy.cuda.Stream(non_blocking=True)
        stream.wait_event(staged)
        for start, stop in runs:
            cupy.cuda.runtime.memcpyAsync(host.ctypes.data + start, staging.data.ptr + start, stop - start,
                                          cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()


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


def _device_runs(entries, layout) -> list:
    """[(first byte, end byte)] of the buffer, one per run of consecutive device entries: what the transfer copies
    (host entries were written into the host buffer directly)."""
    runs, extend = [], False
    for (_, _, a, _), (offset, shape, dtype) in zip(entries, layout, strict=True):
        if not _is_device(a):
            extend = False
            continue
        end = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if extend:  # the entry before was a device one: only padding lies between
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((offset, end))
        extend = True
    return runs


def _view(buffer, offset: int, shape: tuple, dtype: str) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return buffer[offset:offset + n].view(dtype).reshape(shape)
