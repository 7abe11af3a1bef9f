"""Shared benchmark plumbing: CUDA-event timing (warm-up, then the median of repeats), a run budget, plain-text
tables and an atomically written JSON file.

Timing: `fn` is called `warmup` times (this is also where algorithm search happens), then `repeats` times between
a pair of CUDA events recorded on the current stream; each sample is divided by `inner` (the calls per event pair,
raised automatically for very short functions so that the events' own overhead does not dominate). Calls are
issued back to back, so when a call's GPU work is shorter than its host work the number is the host's time.

Device-only timing (*_graphed_time): `calls` back-to-back calls of `fn` are captured once into a CUDA graph, and
the graph is replayed between CUDA events; each sample is divided by `calls`. A replay launches every kernel
without running any of the host code, so this is the GPU's time per call (plus the gaps between kernels).

Host time per call (host_time_us): `calls` calls issued without synchronising, timed with the wall clock; with a
problem too small to keep the GPU busy, this is what one call costs the host.

Per-call latency (latency, with cupy_clock or torch_clock): one event pair around each call, issued back to back;
median, p99 and mean of the samples (bench_infer.py, bench_tta.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time

from resnet_native._core.files import atomic_write_text

# Aim for at least this much GPU time between a pair of events.
_MIN_SAMPLE_MS = 0.5
_MAX_INNER = 50


def _summary(samples: list, inner: int) -> dict:
    return {
        "median_ms": statistics.median(samples),
        "min_ms": min(samples),
        "max_ms": max(samples),
        "repeats": len(samples),
        "inner": inner,
    }


def _timed(fn, warmup: int, repeats: int, inner, new_event, elapsed_ms, synchronize) -> dict:
    for _ in range(max(warmup, 1)):
        fn()
    synchronize()
    if inner is None:  # one probe sample decides how many calls go between two events
        start, end = new_event(), new_event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        probe = max(elapsed_ms(start, end), 1e-3)
        inner = int(min(_MAX_INNER, max(1, _MIN_SAMPLE_MS // probe + 1)))
    samples = []
    for _ in range(repeats):
        start, end = new_event(), new_event()
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        samples.append(elapsed_ms(start, end) / inner)
    return _summary(samples, inner)


def cupy_time(fn, *, warmup: int = 3, repeats: int = 20, inner=None) -> dict:
    """Time `fn` (work on cupy's current stream) with cupy CUDA events; returns median/min/max in ms."""
    import cupy as cp

    return _timed(
        fn,
        warmup,
        repeats,
        inner,
        new_event=cp.cuda.Event,
        elapsed_ms=cp.cuda.get_elapsed_time,
        synchronize=lambda: cp.cuda.get_current_stream().synchronize(),
    )


def _torch_events(torch) -> dict:
    """The event factory, elapsed-time reader and synchronise of torch's CUDA events, as _timed/_graphed take them."""
    return {
        "new_event": lambda: torch.cuda.Event(enable_timing=True),
        "elapsed_ms": lambda start, end: start.elapsed_time(end),
        "synchronize": torch.cuda.synchronize,
    }


def torch_time(fn, *, warmup: int = 3, repeats: int = 20, inner=None) -> dict:
    """Time `fn` (work on torch's current stream) with torch CUDA events; returns median/min/max in ms."""
    import torch

    return _timed(
        fn,
        warmup,
        repeats,
        inner,
        **_torch_events(torch),
    )


def _graphed(launch, calls: int, warmup: int, repeats: int, new_event, elapsed_ms, synchronize) -> dict:
    """Samples of one replay of a graph of `calls` calls, divided by `calls`."""
    for _ in range(max(warmup, 1)):
        launch()
    synchronize()
    samples = []
    for _ in range(repeats):
        # An untimed replay first keeps the GPU busy while the timed one is submitted, so the host's launch
        # latency stays outside the events.
        launch()
        start, end = new_event(), new_event()
        start.record()
        launch()
        end.record()
        end.synchronize()
        samples.append(elapsed_ms(start, end) / calls)
    return _summary(samples, calls)


def cupy_graphed_time(fn, *, calls: int = 20, warmup: int = 3, repeats: int = 20) -> dict:
    """Device time per call of `fn` (work on cupy's current stream): `calls` calls captured into a CUDA graph on
    a non-blocking stream, the graph replayed between CUDA events; returns median/min/max in ms.

    `fn` must already have run (algorithm search synchronises and is refused during capture) and must not
    allocate; it runs once more on the capture stream before capturing. A capture that fails raises."""
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        try:
            for _ in range(calls):
                fn()
        except BaseException:
            with contextlib.suppress(Exception):  # the capture is invalid anyway: end it, report fn's error
                stream.end_capture()
            raise
        graph = stream.end_capture()
        return _graphed(
            lambda: graph.launch(stream),
            calls,
            warmup,
            repeats,
            new_event=cp.cuda.Event,
            elapsed_ms=cp.cuda.get_elapsed_time,
            synchronize=stream.synchronize,
        )


def torch_graphed_time(fn, *, calls: int = 20, warmup: int = 3, repeats: int = 20) -> dict:
    """Device time per call of `fn` (torch work): warmed up on a side stream, `calls` calls captured with
    torch.cuda.graph, the graph replayed between CUDA events; returns median/min/max in ms."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return _graphed(
        graph.replay,
        calls,
        warmup,
        repeats,
        **_torch_events(torch),
    )


def latency(call, *, iters: int, warmup: int, new_event, elapsed_ms, synchronize) -> dict:
    """call(i) for i = 0, 1, ... (rotate inputs with i % ROTATE): `warmup` untimed calls, then `iters` calls each
    between two events, all issued back to back; median, p99 and mean of the per-call samples in ms."""
    for i in range(warmup):
        call(i)
    synchronize()
    events = []
    for i in range(iters):
        start, end = new_event(), new_event()
        start.record()
        call(i)
        end.record()
        events.append((start, end))
    synchronize()
    samples = sorted(elapsed_ms(start, end) for start, end in events)
    return {"median_ms": statistics.median(samples), "p99_ms": samples[min(len(samples) - 1, int(0.99 * len(samples)))],
            "mean_ms": statistics.fmean(samples), "iters": iters}


def cupy_clock():
    import cupy as cp

    return {"new_event": cp.cuda.Event, "elapsed_ms": cp.cuda.get_elapsed_time,
            "synchronize": lambda: cp.cuda.get_current_stream().synchronize()}


def torch_clock(torch):
    return {"new_event": lambda: torch.cuda.Event(enable_timing=True),
            "elapsed_ms": lambda start, end: start.elapsed_time(end), "synchronize": torch.cuda.synchronize}


def host_time_us(fn, synchronize, *, calls: int = 2000, warmup: int = 20, repeats: int = 3) -> dict:
    """Wall-clock microseconds per call of `calls` calls of `fn` issued without synchronising in between (one
    synchronize at the end, inside the timing); the median of `repeats` such loops."""
    for _ in range(warmup):
        fn()
    synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return {"median_us": statistics.median(samples), "min_us": min(samples), "max_us": max(samples),
            "repeats": len(samples), "calls": calls}


class Budget:
    """Wall-clock budget of a run: optional sections check `exhausted()` before each item and skip the rest."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def exhausted(self) -> bool:
        return self.seconds > 0 and self.elapsed() > self.seconds


def environment() -> dict:
    """GPU, library versions and host: the header of a results file."""
    info = {"python": sys.version.split()[0], "platform": platform.platform()}
    try:
        import cupy as cp

        device = cp.cuda.runtime.getDevice()
        name = cp.cuda.runtime.getDeviceProperties(device)["name"]
        info["gpu"] = name.decode() if isinstance(name, bytes) else name
        info["cupy"] = cp.__version__
        info["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
    except Exception as e:  # the header must not stop a run
        info["gpu"] = f"unavailable ({e})"
    try:
        import resnet_native as rn

        info["resnet_native"] = rn.__version__
        info["cudnn"] = rn.cudnn_version()
    except Exception as e:
        info["resnet_native"] = f"unavailable ({e})"
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cudnn"] = torch.backends.cudnn.version()
    except Exception:
        info["torch"] = None
    return info


def format_table(rows: list, columns: list, title: str | None = None) -> str:
    """Rows (dicts) as an aligned text table of `columns` ((key, header) pairs); floats with 3 decimals."""

    def cell(value):
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3f}"
        return str(value)

    table = [[header for _, header in columns]] + [[cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    lines = [title] if title else []
    for i, r in enumerate(table):
        cells = (c.rjust(w) if i and _numeric(c) else c.ljust(w) for c, w in zip(r, widths, strict=True))
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: list, columns: list, digits: int = 3) -> str:
    """A markdown table of dict rows: columns [(key, header)], floats with `digits` decimals, None empty."""
    def cell(value):
        if value is None:
            return ""
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(k)) for k, _ in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def write_json(path, payload: dict) -> None:
    """Write `payload` to `path` as JSON, atomically (a temporary file in the same folder, then a rename)."""
    atomic_write_text(path, json.dumps(payload, indent=1, default=str) + "\n")


def percentile(samples, q: float):
    """Nearest-rank percentile (q in [0, 100]) of the samples; None when there are none."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100.0 * len(ordered)) - 1)]


def package_env() -> dict:
    """os.environ for a child process that must import the resnet_native this process imported, never a source
    tree in its working directory."""
    import resnet_native

    path = [os.path.dirname(os.path.dirname(os.path.realpath(resnet_native.__file__))), os.environ.get("PYTHONPATH")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
