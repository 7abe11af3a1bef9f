"""The median time of one forward, as the engine serves it: used to choose where the 8-bit part of a quantised
engine begins (InferenceEngine(quantize_from='auto')).

CUDA events around each replay of the captured graph (eager runs when capture is off or fails: then the host's
launch cost counts too, as it does when such an engine serves), after a few warm-up replays, median of the rest:
one slow replay (a clock change, another process) does not decide the choice.
"""

from __future__ import annotations

import statistics

from ..cuda_graph import WorkspaceHold, capture_graph, launch_ordered

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
        for _ in range(warmup):
            once()
        times = []
        for _ in range(replays):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            once()
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end))
        return float(statistics.median(times))
    finally:
        stream.synchronize()
        graph = None  # the captured graph goes before the workspace hold
        if hold is not None:
            hold.release()


__all__ = ["TIMED_REPLAYS", "WARMUP_REPLAYS", "forward_ms"]
