"""tools/epoch_timeline.py's report on a hand-made trace (no GPU, no torch): the idle gaps between GPU operations,
the pairs of operations around them, the host's lead over the GPU for graph launches."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import epoch_timeline  # noqa: E402


def op(cat, name, ts, dur, correlation):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": correlation}}


def test_gaps_are_the_idle_time_between_operations_on_any_stream():
    ops = [op("kernel", "conv", 0, 10, 1), op("kernel", "side", 2, 3, 9),  # overlapping: no gap
           op("gpu_memset", "Memset", 13, 1, 1), op("kernel", "bn", 17, 5, 1)]
    gaps, end = epoch_timeline.gaps_between(ops)
    assert end == 22
    assert [(g[0], g[1], g[2]) for g in gaps] == [(3, "conv", "Memset"), (3, "Memset", "bn")]


def test_report_counts_gaps_pairs_and_the_launch_lead():
    events = [op("kernel", "conv", 100, 10, 1), op("gpu_memset", "Memset", 113, 1, 1), op("kernel", "bn", 117, 5, 1),
              op("kernel", "conv", 122, 10, 2),
              {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 40, "dur": 20, "args": {"correlation": 1}},
              {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 60, "dur": 2, "args": {"correlation": 2}}]
    text = "\n".join(epoch_timeline.report(events))
    assert "span 0.03 ms: busy 0.03 ms, idle 0.01 ms in 2 gaps" in text
    assert "gaps 2-5 us:       2" in text
    assert "conv -> Memset" in text and "Memset -> bn" in text
    # launch 1 returned at 60, its first operation started at 100; launch 2 returned at 62, started at 122.
    assert "min 40, median 40, max 60" in text and "the launch call took median 2 us, max 20 us" in text


def test_an_empty_trace_says_so():
    assert epoch_timeline.report([]) == ["no GPU operations were traced"]
