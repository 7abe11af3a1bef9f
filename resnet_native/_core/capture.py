"""Capturing work into a CUDA graph: the one capture the training step (optim/step.py), the per-epoch evaluation
(training/evaluation.py) and the inference engine (inference/engine.py) share.

capture_graph(fn, stream, pool) runs fn, which must already have run eagerly with the same arrays (algorithm
searches synchronise and are refused during capture), once in capture mode with cupy's allocator pointed at `pool`,
a cupy MemoryPool the caller keeps while the graph lives, so no address the graph writes is handed to other
arrays. The native core ends the capture and instantiates the graph (_C.CapturedGraph), its memset nodes made
kernel nodes first. While any captured graph lives the cuDNN workspace pool keeps its buffers (WorkspaceHold), and
a replay is ordered with the pool's other users on other streams (launch_ordered).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, NamedTuple

from .loader import _C

# Memset nodes (cuDNN zeroes small buffers inside its calls) become kernel nodes before instantiation: a memset
# node leaves the GPU idle around it, a kernel node follows the kernel before it (csrc/core/captured_graph.h).
MEMSETS_AS_KERNELS = True


class WorkspaceHold:
    """One hold on the workspace pool, released once: by release(), or when the object is collected. While any
    hold lives, a growth of the pool retires the old buffer instead of freeing it, and release_workspace refuses."""

    def __init__(self):
        _C._workspace_graph_hold(True)
        self._release = weakref.finalize(self, _C._workspace_graph_hold, False)

    def release(self) -> None:
        self._release()  # a finalizer runs at most once


def launch_ordered(graph, stream) -> None:
    """Replay a captured graph that uses the workspace pool on `stream` (a cupy Stream), in order with the pool's
    other users: after the last one on another stream, and before the next (the ops themselves do this when they
    run eagerly; a replay does not pass through them)."""
    _C._workspace_order(stream.ptr, True)
    graph.launch(stream)
    _C._workspace_order(stream.ptr, False)


def graph_buffers(model, *others) -> list:
    """The layers' buffers a captured graph of `model` writes: every module's in its tree, and each of `others`'
    own (a loss). The graph's owner keeps them referenced, so a buffer-cache eviction cannot free them."""
    keep = [a for _, m in model.named_modules() for a in m._buffers.arrays()]
    for other in others:
        keep += other._buffers.arrays()
    return keep


class CapturedGraph(NamedTuple):
    graph: Any  # the uploaded graph (resnet_native._C.CapturedGraph: launch(stream), upload(stream))
    result: Any  # what fn returned during the capture (arrays the replays write)
    allocated_bytes: int  # allocated from the pool during the capture


def capture_graph(fn, stream, pool) -> CapturedGraph:
    """fn() captured on `stream` (a cupy Stream) with its allocations from `pool`, then uploaded to the device.

    Returns the graph, fn's result and the bytes allocated from `pool` during the capture (none is expected: every
    output is preallocated). Before the first capture (no hold yet) the workspace pool is trimmed to what the eager
    run's ops used, so the largest workspace a search tried is not kept for the graph's lifetime. A capture that
    fails (fn, ending the capture, or the upload) leaves capture mode, clears the CUDA error it leaves behind (the
    next launch would report it otherwise) and raises; when fn failed, fn's error is the one raised."""
    import cupy

    _C.trim_workspace(stream.ptr)  # no-op while other graphs hold the pool
    before = pool.used_bytes()
    try:
        with stream, cupy.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            try:
                result = fn()
            except BaseException:
                with contextlib.suppress(Exception):  # leave capture mode; fn's error is the one to report
                    stream.end_capture()
                raise
            graph = _C._end_capture(stream.ptr, MEMSETS_AS_KERNELS)
            allocated = pool.used_bytes() - before
        graph.upload(stream)
    except BaseException:
        _C._clear_cuda_error()
        raise
    return CapturedGraph(graph, result, allocated)
