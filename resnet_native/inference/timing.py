"""The median time of one forward, as the engine serves it: used to choose where the 8-bit part of a quantised
engine begins (InferenceEngine(quantize_from='auto')).

Replays of the captured graph (eager runs when capture is off or fails), timed by ops.timing after a few warm-up
replays: the median, so one slow replay does not decide the choice.
"""

from __future__ import annotations

from .._core.capture import WorkspaceHold, capture_graph, launch_ordered
from ..ops.timing import device_time_ms

WARMUP_REPLAYS = 3
TIMED_REPLAYS = 10


def forward_ms(forward, pool, cuda_graph: bool, *, warmup: int = WARMUP_REPLAYS,
               replays: int = TIMED_REPLAYS) -> float:
    """Median milliseconds of forward.run(): replays of its CUDA graph (captured here, dropped after) when
    cuda_graph, else eager runs."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    hold, graph = None, None
    if cuda_graph:
        hold = WorkspaceHold()
        try:
            graph = capture_graph(forward.run, stream, pool).graph
        except Exception:  # the engine's own capture reports this; time the eager forward instead
            hold.release()
            hold = None

    def once():
        if graph is not None:
            launch_ordered(graph, stream)
        else:
            with stream:
                forward.run()

    try:
        return device_time_ms(once, stream, runs=replays, warmup=warmup)
    finally:
        stream.synchronize()
        graph = None  # the captured graph goes before the workspace hold
        if hold is not None:
            hold.release()


__all__ = ["TIMED_REPLAYS", "WARMUP_REPLAYS", "forward_ms"]
