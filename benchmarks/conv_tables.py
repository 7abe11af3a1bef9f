"""Tables 2 and 3 of bench_block.py: each conv of each block alone (forward, backward-data, backward-filter; loop
and CUDA-graph timings, per engine and PyTorch), and the host's cost of one call of a tiny conv."""

from __future__ import annotations

import sys

import numpy as np
from bench_block import to_device, to_layout
from block_report import HOST_PROBE, host_probe_name
from block_table import TORCH_DTYPES, torch_settings
from common import cupy_graphed_time, cupy_time, host_time_us, torch_graphed_time, torch_time, write_json


def per_conv_section(args, blocks, engines, torch, budget, report):
    import cupy as cp

    rng = np.random.default_rng(1)
    seen = set()
    # Most informative first, in case the budget runs out: fp16 / bf16 and NHWC are what training uses.
    order = {"fp16": 0, "bf16": 1, "tf32": 2, "fp32": 3, "NHWC": 0, "NCHW": 1}
    configs = sorted(((p, lay) for p in args.per_conv_precisions for lay in args.layouts),
                     key=lambda pl: (order[pl[0]], order[pl[1]]))
    for precision, layout in configs:
        for shape in blocks.values():
            for c in shape.convs():
                problem = (shape.n, c.c_in, c.c_out, c.kernel, c.stride, c.hw_in, layout, precision)
                if problem in seen:
                    continue  # e.g. the two identical 3x3 convs of a stride-1 BasicBlock
                seen.add(problem)
                config = f"{shape.name}.{c.name} {layout} {precision}"
                if budget.exhausted():
                    report["skipped"].append(f"per-conv {config}: budget")
                    continue
                print(f"[conv] {config}", file=sys.stderr, flush=True)
                report["per_conv"].extend(conv_rows(args, shape, c, layout, precision, engines, torch, rng))
                cp.get_default_memory_pool().free_all_blocks()
                if args.json:
                    write_json(args.json, report)


def conv_ops(spec, x, w, dy, y, dx, dw) -> dict:
    """The three directions of one convolution, writing into preallocated outputs."""
    from resnet_native.ops import conv

    return {
        "forward": lambda: conv.conv2d(x, w, spec, out=y),
        "backward_data": lambda: conv.conv2d_backward_data(dy, w, spec, x.shape, out=dx),
        "backward_filter": lambda: conv.conv2d_backward_filter(x, dy, spec, w.shape, out=dw),
    }


def conv_rows(args, shape, c, layout, precision, engines, torch, rng) -> list:
    """Rows of one conv of a block: forward, backward-data, backward-filter; each engine (algo find) and torch."""
    import cupy as cp

    from resnet_native.ops import conv
    from resnet_native.ops.conv import ConvSpec

    x_host = rng.standard_normal((shape.n, c.c_in, c.hw_in, c.hw_in)).astype(np.float32)
    w_host = (rng.standard_normal((c.c_out, c.c_in, c.kernel, c.kernel)) * 0.1).astype(np.float32)
    dy_host = rng.standard_normal((shape.n, c.c_out, c.hw_out, c.hw_out)).astype(np.float32)
    x, w, dy = (to_device(to_layout(a, layout), precision) for a in (x_host, w_host, dy_host))
    y, dx, dw = (cp.empty(a.shape, a.dtype) for a in (dy, x, w))
    base = {"block": shape.name, "conv": c.name, "layout": layout, "precision": precision, "n": shape.n,
            "c_in": c.c_in, "c_out": c.c_out, "kernel": c.kernel, "stride": c.stride, "hw": c.hw_in}
    rows = {d: dict(base, direction=d) for d in ("forward", "backward_data", "backward_filter")}
    for engine in engines:
        spec = ConvSpec(stride=c.stride, padding=c.pad, layout=layout, precision=precision, algo="find",
                        engine=engine)
        for direction, fn in conv_ops(spec, x, w, dy, y, dx, dw).items():
            row = rows[direction]
            try:
                row[f"{engine}_ms"] = cupy_time(fn, warmup=args.warmup, repeats=args.repeats)["median_ms"]
                chosen = conv.last_algorithm(x.shape, w.shape, spec, direction)
                row[f"{engine}_algo"] = chosen["algo_name"] if chosen else None
            except Exception as e:  # a failing row is reported, the run goes on
                row[f"{engine}_error"] = f"{type(e).__name__}: {e}"[:300]
                continue
            if args.graphed:  # after the timing above: the search ran, the capture only replays the choice
                graphed(row, engine, lambda fn=fn: cupy_graphed_time(fn, **graphed_options(args)))
    if torch is not None:
        torch_per_conv(args, torch, c, x_host, w_host, dy_host, layout, precision, rows)
    for row in rows.values():
        for engine in engines:
            for suffix in ("", "_graphed"):
                if f"torch{suffix}_ms" in row and f"{engine}{suffix}_ms" in row:
                    row[f"{engine}{suffix}_ratio"] = row[f"{engine}{suffix}_ms"] / row[f"torch{suffix}_ms"]
    return list(rows.values())


def graphed_options(args) -> dict:
    # Each sample already averages --graph-calls calls: fewer samples than the loop timing need.
    return {"calls": args.graph_calls, "warmup": 2, "repeats": max(3, min(args.repeats, 10))}


def graphed(row: dict, who: str, measure) -> None:
    """row[<who>_graphed_ms] from `measure` (a *_graphed_time call), or row[<who>_graphed_error]."""
    try:
        row[f"{who}_graphed_ms"] = measure()["median_ms"]
    except Exception as e:  # a failed capture is reported in the row, the run goes on
        row[f"{who}_graphed_error"] = f"{type(e).__name__}: {e}"[:300]


def torch_per_conv(args, torch, c, x_host, w_host, dy_host, layout, precision, rows):
    torch_settings(torch, precision)
    dtype = getattr(torch, TORCH_DTYPES[precision])
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    x, w, dy = (torch.from_numpy(a).to(device="cuda", dtype=dtype).contiguous(memory_format=fmt)
                for a in (x_host, w_host, dy_host))
    stride, pad = [c.stride, c.stride], [c.pad, c.pad]
    backward = torch.ops.aten.convolution_backward

    def forward():
        return torch.nn.functional.conv2d(x, w, None, stride, pad)

    def backward_data():
        return backward(dy, x, w, None, stride, pad, [1, 1], False, [0, 0], 1, [True, False, False])

    def backward_filter():
        return backward(dy, x, w, None, stride, pad, [1, 1], False, [0, 0], 1, [False, True, False])

    with torch.inference_mode():
        for direction, fn in (("forward", forward), ("backward_data", backward_data),
                              ("backward_filter", backward_filter)):
            try:
                rows[direction]["torch_ms"] = torch_time(fn, warmup=args.warmup, repeats=args.repeats)["median_ms"]
            except Exception as e:  # a failing row is reported, the run goes on
                rows[direction]["torch_error"] = f"{type(e).__name__}: {e}"[:300]
                continue
            if args.graphed:
                graphed(rows[direction], "torch", lambda fn=fn: torch_graphed_time(fn, **graphed_options(args)))


# ----------------------------------------------------------------------------------------------------------------
# Host overhead of one call


def host_overhead_section(args, engines, torch, report):
    """Per direction: µs per call through conv.* ('<engine>_us') and through the bare _C binding with the spec
    tuple and stream computed once ('<engine>_bare_us'), device µs per call ('<engine>_device_us', CUDA graph
    replay), and the same for PyTorch. A call's cost minus its device time is host time."""
    import cupy as cp

    from resnet_native.ops.conv import ConvSpec

    p = HOST_PROBE
    rng = np.random.default_rng(2)
    x_host = rng.standard_normal((p["n"], p["c"], p["hw"], p["hw"])).astype(np.float32)
    w_host = (rng.standard_normal((p["k"], p["c"], p["kernel"], p["kernel"])) * 0.1).astype(np.float32)
    dy_host = rng.standard_normal((p["n"], p["k"], p["hw"], p["hw"])).astype(np.float32)
    x, w, dy = (to_device(to_layout(a, p["layout"]), p["precision"]) for a in (x_host, w_host, dy_host))
    y, dx, dw = (cp.empty(a.shape, a.dtype) for a in (dy, x, w))
    rows = {d: {"direction": d, "problem": host_probe_name(), "calls": args.host_calls}
            for d in ("forward", "backward_data", "backward_filter")}
    synchronize = cp.cuda.get_current_stream().synchronize
    for engine in engines:
        spec = ConvSpec(layout=p["layout"], precision=p["precision"], algo="find", engine=engine)
        bare = bare_conv_ops(spec, x, w, dy, y, dx, dw)
        for direction, fn in conv_ops(spec, x, w, dy, y, dx, dw).items():
            row = rows[direction]
            try:
                row[f"{engine}_us"] = host_time_us(fn, synchronize, calls=args.host_calls)["median_us"]
                row[f"{engine}_bare_us"] = host_time_us(bare[direction], synchronize,
                                                        calls=args.host_calls)["median_us"]
                row[f"{engine}_device_us"] = 1e3 * cupy_graphed_time(fn, **graphed_options(args))["median_ms"]
            except Exception as e:  # a failing row is reported, the run goes on
                row[f"{engine}_error"] = f"{type(e).__name__}: {e}"[:300]
    if torch is not None:
        torch_host_overhead(args, torch, x_host, w_host, dy_host, rows)
    report["host_overhead"] = list(rows.values())
    if args.json:
        write_json(args.json, report)


def bare_conv_ops(spec, x, w, dy, y, dx, dw) -> dict:
    """conv_ops without the Python wrapper: the _C bindings called with the native specs and the stream computed
    once (private API, for this measurement only)."""
    import resnet_native as rn
    from resnet_native.ops import conv

    C, stream = rn._C, rn.current_stream()
    fwd, bwd_data, bwd_filter = (conv._native_spec(spec, d) for d in ("forward", "backward_data", "backward_filter"))
    return {
        "forward": lambda: C.conv_forward(x, w, y, None, None, fwd, "identity", 1.0, 1.0, True, stream),
        "backward_data": lambda: C.conv_backward_data(dy, w, dx, x.shape, False, bwd_data, stream),
        "backward_filter": lambda: C.conv_backward_filter(x, dy, dw, w.shape, False, bwd_filter, stream),
    }


def torch_host_overhead(args, torch, x_host, w_host, dy_host, rows):
    p = HOST_PROBE
    torch_settings(torch, p["precision"])
    dtype = getattr(torch, TORCH_DTYPES[p["precision"]])
    x, w, dy = (torch.from_numpy(a).to(device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
                for a in (x_host, w_host, dy_host))
    backward = torch.ops.aten.convolution_backward
    fns = {
        "forward": lambda: torch.nn.functional.conv2d(x, w),
        "backward_data": lambda: backward(dy, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                          [True, False, False]),
        "backward_filter": lambda: backward(dy, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                            [False, True, False]),
    }
    with torch.inference_mode():
        for direction, fn in fns.items():
            row = rows[direction]
            try:
                row["torch_us"] = host_time_us(fn, torch.cuda.synchronize, calls=args.host_calls)["median_us"]
                row["torch_device_us"] = 1e3 * torch_graphed_time(fn, **graphed_options(args))["median_ms"]
            except Exception as e:  # a failing row is reported, the run goes on
                row["torch_error"] = f"{type(e).__name__}: {e}"[:300]

