"""Capturing a forward into a CUDA graph, as resnet_native.step captures the training step.

The forward runs once on a capture stream with cupy's allocator pointed at the engine's own memory pool, so an
allocation no op should make (none is expected: every output is preallocated) could never hand a graph's address
to other arrays; the pool's usage is compared before and after, and the difference is reported. While any
captured graph lives, the cuDNN workspace pool holds its buffers (a growth retires the old buffer instead of
freeing it, and release_workspace refuses): WorkspaceHold takes that hold. A capture that fails ends the capture
and clears the CUDA error it leaves, so the next launch does not report it.
"""

from __future__ import annotations

import contextlib
import weakref

from .._loader import _C


class WorkspaceHold:
    """One hold on the workspace pool, released once: by release(), or when the object is collected."""

    def __init__(self):
        _C._workspace_graph_hold(True)
        self._release = weakref.finalize(self, _C._workspace_graph_hold, False)

    def release(self) -> None:
        self._release()  # a finalizer runs at most once


def capture_graph(forward, pool):
    """(graph, bytes allocated from `pool` during the capture) of forward() captured on a fresh stream.

    forward must already have run eagerly with the same arrays (algorithm searches synchronise and are refused
    during capture). Raises what forward raised, after ending the capture."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    before = pool.used_bytes()
    with stream, cupy.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        try:
            forward()
        except BaseException:
            with contextlib.suppress(Exception):  # leave capture mode; forward's error is the one to report
                stream.end_capture()
            _C._clear_cuda_error()
            raise
        graph = stream.end_capture()
        allocated = pool.used_bytes() - before
    graph.upload(stream)
    stream.synchronize()
    return graph, allocated
