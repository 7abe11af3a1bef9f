"""Host copies of the training state taken without stalling the host, for checkpoints written in the background.

Copying each array with a synchronous `.get()` into fresh pageable memory would hold the training loop every
epoch. Instead take() queues, on the current stream, one device-to-device copy per array into a staging buffer,
then the copy of that buffer into page-locked host memory on a side stream of its own, and returns: the next
epoch's steps wait only for the staging copies, and the PCIe transfer overlaps them. resolve(), on the checkpoint
writer's thread, waits for the transfer and converts layouts (NHWC conv weights to torch's) there. Both buffers are
kept from one checkpoint to the next. Work that later overwrites the arrays must be ordered after take(): the same
stream, or a blocking one when the current stream is the legacy default stream (as in the trainer); the side
stream is non-blocking, so later default-stream work does not wait for the transfer either.
"""

from __future__ import annotations

import threading

import numpy as np

from .._core.placement import array_module

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
        self._keep = 2  # free buffers kept
        self._lock = threading.Lock()
        self._transfer_stream = None  # the side stream of the device-to-host copies (made at the first take)

    def reserve(self, groups: dict, count: int) -> None:
        """Allocate `count` buffers for takes of groups' layout now, and keep that many free from then on.
        Allocating page-locked or device memory synchronises with the device: a take that allocates drains the
        queue, which a caller queuing work ahead (the trainer) must avoid."""
        layout, nbytes = _layout(_entries(groups))
        buffers = [self._allocate(nbytes, on_device=True) for _ in range(count)]
        with self._lock:
            self._keep = max(self._keep, count)
            self._free.extend((layout, b) for b in buffers)

    def take(self, groups: dict) -> PendingSnapshot:
        entries = _entries(groups)
        layout, nbytes = _layout(entries)
        on_device = any(_is_device(a) for _, _, a, _ in entries)
        buffers = self._buffers(layout, nbytes, on_device)
        host, staging = buffers
        event = None
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
            event = self._transfer(staging, host, _device_runs(entries, layout))
        return PendingSnapshot(self, entries, layout, buffers, event)

    def _transfer(self, staging, host, runs):
        """The device-to-host copies of staging's device runs, on the side stream after the current stream's staging
        copies; the event that marks their end."""
        import cupy

        if self._transfer_stream is None:
            self._transfer_stream = cupy.cuda.Stream(non_blocking=True)
        side = self._transfer_stream
        side.wait_event(cupy.cuda.get_current_stream().record())
        for start, stop in runs:
            cupy.cuda.runtime.memcpyAsync(host.ctypes.data + start, staging.data.ptr + start, stop - start,
                                          cupy.cuda.runtime.memcpyDeviceToHost, side.ptr)
        return side.record(cupy.cuda.Event(disable_timing=True))

    def _buffers(self, layout, nbytes: int, on_device: bool):
        """(host buffer, device staging buffer or None) for layout: a resolved snapshot's, or new ones."""
        with self._lock:
            for i, (free_layout, _) in enumerate(self._free):
                if free_layout == layout:
                    return self._free.pop(i)[1]
        return self._allocate(nbytes, on_device)

    @staticmethod
    def _allocate(nbytes: int, on_device: bool):
        if on_device:
            import cupy
            import cupyx

            return cupyx.empty_pinned((max(nbytes, 1),), np.uint8), cupy.empty((max(nbytes, 1),), np.uint8)
        return np.empty((max(nbytes, 1),), np.uint8), None

    def _give_back(self, layout, buffers) -> None:
        with self._lock:
            self._free.append((layout, buffers))
            del self._free[:-self._keep]


class PendingSnapshot:
    """The copies take() enqueued. resolve() waits for them (a host sync on their event only) and returns the
    converted host values, each in memory of its own; the buffer then goes back for the next take."""

    def __init__(self, owner, entries, layout, buffers, event):
        self._owner, self._entries, self._layout = owner, entries, layout
        self._buffers, self._event = buffers, event

    def resolve(self) -> dict:
        if self._buffers is None:
            raise RuntimeError("this snapshot was already resolved or released")
        try:
            if self._event is not None:
                self._event.synchronize()
            host = self._buffers[0]
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
        """Give the buffer back without reading it (after the copies have run)."""
        if self._buffers is None:
            return
        if self._event is not None:
            self._event.synchronize()
        buffers, self._buffers = self._buffers, None
        self._owner._give_back(self._layout, buffers)


def _is_device(a) -> bool:
    return array_module(a) is not np


def _entries(groups: dict) -> list:
    """[(group, name, array, to_host)] of {group: {name: (array, to_host)}}, in order."""
    return [(g, k, a, to_host) for g, sources in groups.items() for k, (a, to_host) in sources.items()]


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
        end = offset + _nbytes(shape, dtype)
        if extend:  # the entry before was a device one: only padding lies between
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((offset, end))
        extend = True
    return runs


def _nbytes(shape: tuple, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _view(buffer, offset: int, shape: tuple, dtype: str) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = _nbytes(shape, dtype)
    return buffer[offset:offset + n].view(dtype).reshape(shape)
