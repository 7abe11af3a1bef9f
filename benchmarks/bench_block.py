"""One ResNet residual block built from resnet_native's convolution ops, timed with CUDA events, next to the same
block in PyTorch in the same run.

    python benchmarks/bench_block.py                    # the default sweep (< 3 minutes on an H200)
    python benchmarks/bench_block.py --quick            # tiny shapes: a smoke run of every code path
    python benchmarks/bench_block.py --json results.json --precisions fp16,bf16 --layouts NHWC

The block is the inference form of a ResNet block (batch norm folded into a per-channel conv bias):
  BasicBlock:  y = relu(conv3x3(relu(conv3x3_s(x) + b1)) + b2 + shortcut)
  Bottleneck:  y = relu(conv1x1(relu(conv3x3_s(relu(conv1x1(x) + b1)) + b2)) + b3 + shortcut)
  shortcut = x, or conv1x1_s(x) + bp (projection) when the stride or the width changes.

Table 1 (block forward, median ms) compares, per block shape x layout x precision:
  fused             every conv+bias(+residual)+ReLU as one conv2d call: cudnnConvolutionBiasActivationForward
                    where cuDNN accepts it ("paths": F fused / U unfused per conv)
  unfused           the same calls with fusion disabled: convolution, cudnnAddTensor (bias, residual),
                    cudnnActivationForward
  add_relu_kernel   last conv + bias, then the custom add+ReLU kernel (resnet_native.kernels.add_relu)
  add_tensor_cudnn  last conv + bias, then cudnnAddTensor (kernels.add_tensor_cudnn) and the ReLU kernel
  algo find / heuristic / fixed (IMPLICIT_PRECOMP_GEMM) for the fused variant, engine legacy and graph,
  and torch: the same block in PyTorch eager (cudnn.benchmark on, channels_last for NHWC, explicit
  dtypes, TF32 only for 'tf32'). ratio = ours / torch (below 1: ours is faster); err = ||ours - torch|| / ||torch||.
Table 2 (per conv, median ms) times each conv of each block alone: forward, backward-data, backward-filter, for
each engine (algo find) and PyTorch. Two timings per cell:
  <engine>_ms          back-to-back calls between CUDA events: when a call's GPU work is shorter than its host
                       work (small convs), this is host time;
  <engine>_graphed_ms  --graph-calls calls captured once into a CUDA graph, the graph replayed between CUDA
                       events: device time only (--no-graphed skips it; a failed capture is reported as
                       <engine>_graphed_error).
Table 3 (--host-overhead, on by default) is the host's cost of one call: a tiny conv (NHWC fp16, 8x8x8x64, 1x1)
called --host-calls times without synchronising, wall clock per call, through the Python API and through the bare
_C binding (no Python wrapper), next to PyTorch's F.conv2d / convolution_backward and the device time per call.

A variant that fails (for example an algorithm cuDNN does not support for a shape) is reported with its error and
the run goes on. Sections stop starting new configurations once --budget-s seconds have passed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    Budget,
    cupy_graphed_time,
    cupy_time,
    environment,
    format_table,
    host_time_us,
    torch_graphed_time,
    torch_time,
    write_json,
)

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
LAYOUTS = ("NCHW", "NHWC")
VARIANTS = ("fused", "unfused", "add_relu_kernel", "add_tensor_cudnn")
# Algorithm modes (ConvSpec.algo); 'fixed' names IMPLICIT_PRECOMP_GEMM forward and ALGO_1 for the backward passes.
ALGOS = {
    "find": "find",
    "heuristic": "heuristic",
    "fixed": "fwd=IMPLICIT_PRECOMP_GEMM;bwd_data=ALGO_1;bwd_filter=ALGO_1",
}
CUPY_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "uint16"}
KERNEL_DTYPES = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "bf16": "bf16"}


# ----------------------------------------------------------------------------------------------------------------
# Shapes


def out_hw(hw: int, kernel: int, stride: int) -> int:
    return (hw + 2 * (kernel // 2) - kernel) // stride + 1


@dataclass(frozen=True)
class ConvShape:
    name: str
    c_in: int
    c_out: int
    kernel: int
    stride: int
    hw_in: int
    epilogue: str  # 'bias' (projection), 'relu' (bias + ReLU), 'residual' (bias + shortcut + ReLU)

    @property
    def pad(self) -> int:
        return self.kernel // 2

    @property
    def hw_out(self) -> int:
        return out_hw(self.hw_in, self.kernel, self.stride)


@dataclass(frozen=True)
class BlockShape:
    name: str
    kind: str  # 'basic' | 'bottleneck'
    n: int
    c_in: int
    c_mid: int
    c_out: int
    hw: int
    stride: int

    @property
    def hw_out(self) -> int:
        return out_hw(self.hw, 3, self.stride)

    def convs(self) -> list:
        """The projection (if any) first, then the main path in order; the last conv takes the shortcut."""
        convs = []
        if self.stride != 1 or self.c_in != self.c_out:
            convs.append(ConvShape("proj", self.c_in, self.c_out, 1, self.stride, self.hw, "bias"))
        if self.kind == "basic":
            convs.append(ConvShape("conv1", self.c_in, self.c_mid, 3, self.stride, self.hw, "relu"))
            convs.append(ConvShape("conv2", self.c_mid, self.c_out, 3, 1, self.hw_out, "residual"))
        else:
            convs.append(ConvShape("conv1", self.c_in, self.c_mid, 1, 1, self.hw, "relu"))
            convs.append(ConvShape("conv2", self.c_mid, self.c_mid, 3, self.stride, self.hw, "relu"))
            convs.append(ConvShape("conv3", self.c_mid, self.c_out, 1, 1, self.hw_out, "residual"))
        return convs


BLOCKS = {
    b.name: b
    for b in [
        BlockShape("basic_cifar_s1", "basic", 256, 64, 64, 64, 32, 1),
        BlockShape("basic_cifar_s2", "basic", 256, 64, 128, 128, 32, 2),
        BlockShape("bottleneck_in_s1", "bottleneck", 64, 256, 64, 256, 56, 1),
        BlockShape("bottleneck_in_s2", "bottleneck", 64, 256, 128, 512, 56, 2),
    ]
}
QUICK_BLOCKS = {
    b.name: b
    for b in [
        BlockShape("basic_quick_s1", "basic", 4, 16, 16, 16, 8, 1),
        BlockShape("basic_quick_s2", "basic", 4, 16, 32, 32, 8, 2),
        BlockShape("bottleneck_quick_s1", "bottleneck", 2, 32, 8, 32, 8, 1),
        BlockShape("bottleneck_quick_s2", "bottleneck", 2, 32, 16, 64, 8, 2),
    ]
}


# ----------------------------------------------------------------------------------------------------------------
# Host data in the storage types


def to_layout(a: np.ndarray, layout: str) -> np.ndarray:
    """NCHW activation / KCRS filter -> the layout's order."""
    return a if layout == "NCHW" else np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def to_device(a: np.ndarray, precision: str):
    import cupy as cp

    if precision == "bf16":
        from resnet_native.reference.bf16 import to_bf16_bits

        return cp.asarray(to_bf16_bits(a))
    return cp.asarray(a.astype(np.float16 if precision == "fp16" else np.float32))


def as_float32(array, precision: str):
    """A float32 cupy copy of a storage-type cupy array."""
    import cupy as cp

    if precision == "bf16":
        return (array.astype(cp.uint32) << 16).view(cp.float32)
    return array.astype(cp.float32)


def activation_shape(n: int, c: int, hw: int, layout: str) -> tuple:
    return (n, c, hw, hw) if layout == "NCHW" else (n, hw, hw, c)


# ----------------------------------------------------------------------------------------------------------------
# The block on resnet_native


class OurBlock:
    def __init__(self, shape: BlockShape, layout: str, precision: str, rng):
        import cupy as cp

        self.shape, self.layout, self.precision = shape, layout, precision
        self.convs = shape.convs()
        self.x_host = rng.standard_normal((shape.n, shape.c_in, shape.hw, shape.hw)).astype(np.float32)
        self.host = {}
        self.w, self.b, self.out = {}, {}, {}
        for c in self.convs:
            w = rng.standard_normal((c.c_out, c.c_in, c.kernel, c.kernel)) * math.sqrt(2.0 / (c.c_in * c.kernel**2))
            b = 0.1 * rng.standard_normal(c.c_out)
            self.host[c.name] = (w.astype(np.float32), b.astype(np.float32))
            self.w[c.name] = to_device(to_layout(self.host[c.name][0], layout), precision)
            self.b[c.name] = to_device(self.host[c.name][1], precision)
            self.out[c.name] = cp.empty(activation_shape(shape.n, c.c_out, c.hw_out, layout), CUPY_DTYPES[precision])
        self.x = to_device(to_layout(self.x_host, layout), precision)
        self.specs = {}

    def spec(self, c: ConvShape, algo: str, engine: str):
        from resnet_native.conv import ConvSpec

        key = (c.name, algo, engine)
        if key not in self.specs:
            self.specs[key] = ConvSpec(stride=c.stride, padding=c.pad, layout=self.layout, precision=self.precision,
                                       algo=algo, engine=engine)
        return self.specs[key]

    def forward(self, variant: str, algo: str, engine: str):
        from resnet_native import conv

        *head, last = [c for c in self.convs if c.name != "proj"]
        shortcut = self.x
        if self.convs[0].name == "proj":
            p = self.convs[0]
            shortcut = conv.conv2d(self.x, self.w["proj"], self.spec(p, algo, engine), bias=self.b["proj"],
                                   out=self.out["proj"])
        h = self.x
        for c in head:
            h = conv.conv2d(h, self.w[c.name], self.spec(c, algo, engine), bias=self.b[c.name], activation="relu",
                            out=self.out[c.name])
        y = self.out[last.name]
        spec = self.spec(last, algo, engine)
        if variant in ("fused", "unfused"):
            conv.conv2d(h, self.w[last.name], spec, bias=self.b[last.name], z=shortcut, activation="relu", out=y)
        elif variant == "add_relu_kernel":
            from resnet_native import kernels  # written separately: imported only where used

            conv.conv2d(h, self.w[last.name], spec, bias=self.b[last.name], out=y)
            kernels.add_relu(y, shortcut, out=y, dtype=KERNEL_DTYPES[self.precision])
        elif variant == "add_tensor_cudnn":
            from resnet_native import kernels

            conv.conv2d(h, self.w[last.name], spec, bias=self.b[last.name], out=y)
            kernels.add_tensor_cudnn(y, shortcut, out=y, layout=self.layout, dtype=KERNEL_DTYPES[self.precision])
            kernels.relu(y, out=y, dtype=KERNEL_DTYPES[self.precision])
        else:
            raise ValueError(f"unknown variant {variant!r}")
        return y

    def runner(self, variant: str, algo: str, engine: str):
        from resnet_native import conv

        if variant == "unfused":

            def run():
                with conv._fusion_disabled():
                    return self.forward(variant, algo, engine)

            return run
        return lambda: self.forward(variant, algo, engine)

    def fused_paths(self, variant: str, algo: str, engine: str) -> dict:
        """Which path each conv's fused call took (as the algorithm cache records it)."""
        from resnet_native import conv

        paths = {}
        for c in self.convs:
            spec = self.spec(c, algo, engine)
            residual = c.epilogue == "residual" and variant in ("fused", "unfused")
            relu = c.epilogue == "relu" or residual
            fused = conv.fused_name(bias=True, z=residual, activation="relu" if relu else "identity")
            x_shape = activation_shape(self.shape.n, c.c_in, c.hw_in, self.layout)
            w_shape = to_layout(np.empty((c.c_out, c.c_in, c.kernel, c.kernel), np.float32), self.layout).shape
            entry = conv.last_algorithm(x_shape, w_shape, spec, fused=fused)
            paths[c.name] = {
                "path": "disabled" if variant == "unfused" else (entry or {}).get("fused_path", "?"),
                "algo": (entry or {}).get("algo_name"),
                "engine": (entry or {}).get("engine"),
            }
        return paths


def short_paths(paths: dict) -> str:
    def letter(p):
        if p == "fused":
            return "F"
        if p == "disabled":
            return "-"
        return "U" if str(p).startswith("unfused") else "?"

    return " ".join(f"{name}:{letter(v['path'])}" for name, v in paths.items())


# ----------------------------------------------------------------------------------------------------------------
# The same block in PyTorch


TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def torch_settings(torch, precision: str) -> None:
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"


class TorchBlock:
    def __init__(self, ours: OurBlock, torch):
        self.torch = torch
        dtype = getattr(torch, TORCH_DTYPES[ours.precision])
        fmt = torch.channels_last if ours.layout == "NHWC" else torch.contiguous_format
        self.layers = {}
        for c in ours.convs:
            layer = torch.nn.Conv2d(c.c_in, c.c_out, c.kernel, c.stride, c.pad, bias=True)
            w, b = ours.host[c.name]
            with torch.no_grad():
                layer.weight.copy_(torch.from_numpy(w))
                layer.bias.copy_(torch.from_numpy(b))
            self.layers[c.name] = layer.to(device="cuda", dtype=dtype, memory_format=fmt).eval()
        self.x = torch.from_numpy(ours.x_host).to(device="cuda", dtype=dtype).contiguous(memory_format=fmt)
        self.names = [c.name for c in ours.convs if c.name != "proj"]
        self.has_projection = "proj" in self.layers

    def forward(self):
        torch = self.torch
        with torch.inference_mode():
            shortcut = self.layers["proj"](self.x) if self.has_projection else self.x
            h = self.x
            for name in self.names[:-1]:
                h = torch.relu_(self.layers[name](h))
            y = self.layers[self.names[-1]](h)
            y += shortcut
            return torch.relu_(y)


def error_vs_torch(ours_y, torch_y, ours: OurBlock) -> float:
    """||ours - torch|| / ||torch||, computed on the GPU in float32."""
    import cupy as cp

    t = torch_y.float()
    if ours.layout == "NHWC":
        t = t.permute(0, 2, 3, 1)
    t = cp.from_dlpack(t.contiguous())
    o = as_float32(ours_y, ours.precision)
    return float(cp.linalg.norm(o - t) / cp.linalg.norm(t))


# ----------------------------------------------------------------------------------------------------------------
# Sections


def block_section(args, blocks, engines, torch, budget, report):
    import cupy as cp

    rng = np.random.default_rng(0)
    for shape in blocks.values():
        for layout in args.layouts:
            for precision in args.precisions:
                config = f"{shape.name} {layout} {precision}"
                if budget.exhausted():
                    report["skipped"].append(f"block {config}: budget")
                    continue
                print(f"[block] {config}", file=sys.stderr, flush=True)
                ours = OurBlock(shape, layout, precision, rng)
                torch_row, torch_y = None, None
                if torch is not None:
                    torch_row = {"block": shape.name, "layout": layout, "precision": precision, "variant": "torch",
                                 "algo": "benchmark", "engine": "torch"}
                    try:
                        torch_settings(torch, precision)
                        tb = TorchBlock(ours, torch)
                        torch_row.update(torch_time(tb.forward, warmup=args.warmup, repeats=args.repeats))
                        torch_y = tb.forward()
                        torch.cuda.synchronize()
                    except Exception as e:  # a failing row is reported, the run goes on
                        torch_row["error"] = f"{type(e).__name__}: {e}"[:300]
                rows = []
                for engine in engines:
                    for variant in args.variants:
                        if engine != "legacy" and variant != "fused":
                            continue  # fusion control and the add variants concern the legacy engine
                        algos = args.algos if variant == "fused" else ["find"]
                        if engine != "legacy":
                            algos = [a for a in algos if a != "fixed"]  # fixed names legacy algorithms
                        for algo in algos:
                            rows.append(run_block_variant(args, ours, variant, algo, engine, torch_row, torch_y))
                if torch_row is not None:
                    rows.append(torch_row)
                report["block"].extend(rows)
                del ours
                cp.get_default_memory_pool().free_all_blocks()
                if torch is not None:
                    torch.cuda.empty_cache()
                if args.json:
                    write_json(args.json, report)


def run_block_variant(args, ours, variant, algo, engine, torch_row, torch_y):
    row = {"block": ours.shape.name, "layout": ours.layout, "precision": ours.precision, "variant": variant,
           "algo": algo, "engine": engine}
    if variant in ("add_relu_kernel", "add_tensor_cudnn") and not kernels_available():
        row["error"] = "skipped: resnet_native.kernels is not available"
        return row
    try:
        fn = ours.runner(variant, ALGOS[algo], engine)
        row.update(cupy_time(fn, warmup=args.warmup, repeats=args.repeats))
        paths = ours.fused_paths(variant, ALGOS[algo], engine)
        row["paths"] = short_paths(paths)
        row["conv_paths"] = paths
        if torch_row is not None and "median_ms" in torch_row:
            row["torch_ms"] = torch_row["median_ms"]
            row["ratio"] = row["median_ms"] / torch_row["median_ms"]
        if torch_y is not None:
            row["err"] = error_vs_torch(fn(), torch_y, ours)
    except Exception as e:  # a failing row is reported, the run goes on
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def kernels_available() -> bool:
    try:
        from resnet_native import kernels

        return hasattr(kernels, "add_relu") and hasattr(kernels, "add_tensor_cudnn") and hasattr(kernels, "relu")
    except ImportError:
        return False


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
    from resnet_native import conv

    return {
        "forward": lambda: conv.conv2d(x, w, spec, out=y),
        "backward_data": lambda: conv.conv2d_backward_data(dy, w, spec, x.shape, out=dx),
        "backward_filter": lambda: conv.conv2d_backward_filter(x, dy, spec, w.shape, out=dw),
    }


def conv_rows(args, shape, c, layout, precision, engines, torch, rng) -> list:
    """Rows of one conv of a block: forward, backward-data, backward-filter; each engine (algo find) and torch."""
    import cupy as cp

    from resnet_native import conv
    from resnet_native.conv import ConvSpec

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


# Small enough that the GPU finishes each call long before the host has issued the next one.
HOST_PROBE = {"n": 8, "hw": 8, "c": 64, "k": 64, "kernel": 1, "layout": "NHWC", "precision": "fp16"}


def host_probe_name() -> str:
    p = HOST_PROBE
    return (f"{p['layout']} {p['precision']} x=({p['n']}, {p['hw']}, {p['hw']}, {p['c']}) "
            f"w=({p['k']}, {p['kernel']}, {p['kernel']}, {p['c']})")


def host_overhead_section(args, engines, torch, report):
    """Per direction: µs per call through conv.* ('<engine>_us') and through the bare _C binding with the spec
    tuple and stream computed once ('<engine>_bare_us'), device µs per call ('<engine>_device_us', CUDA graph
    replay), and the same for PyTorch. A call's cost minus its device time is host time."""
    import cupy as cp

    from resnet_native.conv import ConvSpec

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
    from resnet_native import conv

    C, stream = rn._C, rn.current_stream()
    fwd, bwd_data, bwd_filter = (conv._native_spec(spec, d) for d in ("forward", "backward_data", "backward_filter"))
    return {
        "forward": lambda: C.conv_forward(x, w, y, None, None, fwd, "identity", 1.0, 1.0, True, stream),
        "backward_data": lambda: C.conv_backward_data(dy, w, dx, x.shape, bwd_data, stream),
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


# ----------------------------------------------------------------------------------------------------------------
# Summaries and output


def fusion_summary(block_rows: list) -> list:
    """Per configuration: unfused / fused and add_tensor_cudnn / add_relu_kernel (above 1: the first is slower)."""
    by_config = {}
    for r in block_rows:
        if "median_ms" in r and r["engine"] == "legacy" and r["algo"] == "find":
            by_config.setdefault((r["block"], r["layout"], r["precision"]), {})[r["variant"]] = r["median_ms"]
    out = []
    for (block, layout, precision), t in by_config.items():
        row = {"block": block, "layout": layout, "precision": precision}
        if "fused" in t and "unfused" in t:
            row["unfused_over_fused"] = t["unfused"] / t["fused"]
        if "add_relu_kernel" in t and "add_tensor_cudnn" in t:
            row["cudnn_add_over_kernel_add"] = t["add_tensor_cudnn"] / t["add_relu_kernel"]
        if "fused" in t and "add_relu_kernel" in t:
            row["kernel_add_over_fused"] = t["add_relu_kernel"] / t["fused"]
        out.append(row)
    return out


BLOCK_COLUMNS = [("block", "block"), ("layout", "layout"), ("precision", "prec"), ("variant", "variant"),
                 ("algo", "algo"), ("engine", "engine"), ("median_ms", "ms"), ("torch_ms", "torch_ms"),
                 ("ratio", "ours/torch"), ("err", "err_vs_torch"), ("paths", "paths"), ("error", "error")]
FUSION_COLUMNS = [("block", "block"), ("layout", "layout"), ("precision", "prec"),
                  ("unfused_over_fused", "unfused/fused"), ("cudnn_add_over_kernel_add", "cudnnAdd/kernelAdd"),
                  ("kernel_add_over_fused", "kernelAdd/fused")]


def per_conv_columns(engines: list) -> list:
    cols = [("block", "block"), ("conv", "conv"), ("layout", "layout"), ("precision", "prec"),
            ("direction", "direction")]
    for engine in engines:
        cols += [(f"{engine}_ms", f"{engine}_ms"), (f"{engine}_graphed_ms", f"{engine}_graphed"),
                 (f"{engine}_algo", f"{engine}_algo")]
    cols += [("torch_ms", "torch_ms"), ("torch_graphed_ms", "torch_graphed")]
    cols += [(f"{engine}_ratio", f"{engine}/torch") for engine in engines]
    cols += [(f"{engine}_graphed_ratio", f"{engine}/torch graphed") for engine in engines]
    return cols


def host_overhead_columns(engines: list) -> list:
    cols = [("direction", "direction")]
    for engine in engines:
        cols += [(f"{engine}_us", f"{engine}_us"), (f"{engine}_bare_us", f"{engine}_bare_C_us"),
                 (f"{engine}_device_us", f"{engine}_device_us")]
    return cols + [("torch_us", "torch_us"), ("torch_device_us", "torch_device_us")]


def parse_list(text: str, allowed, name: str) -> list:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise SystemExit(f"--{name}: expected a comma-separated subset of {', '.join(allowed)}, got {text!r}")
    return items


def parse_args(argv=None):
    """The command line, with --quick's defaults applied (no GPU needed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few repeats: a smoke run of every path")
    parser.add_argument("--json", metavar="PATH", help="write every row (and the environment) to PATH as JSON")
    parser.add_argument("--blocks", help=f"comma-separated block shapes (default: all of {', '.join(BLOCKS)})")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated layouts (default: both)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated precisions")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated block variants")
    parser.add_argument("--algos", default=",".join(ALGOS), help="algorithm modes compared on the fused variant")
    parser.add_argument("--engines", help="comma-separated engines: legacy, graph (default: legacy, plus graph "
                        "when built in)")
    parser.add_argument("--per-conv-precisions", help="precisions of the per-conv table (default: --precisions)")
    parser.add_argument("--no-per-conv", action="store_true", help="skip the per-conv table")
    parser.add_argument("--no-torch", action="store_true", help="do not time PyTorch even when it imports")
    parser.add_argument("--warmup", type=int, help="calls before timing (default 3; --quick 1)")
    parser.add_argument("--repeats", type=int, help="timed samples, the median is reported (default 20; --quick 3)")
    parser.add_argument("--budget-s", type=float, help="stop starting new configurations after this many seconds "
                        "(default 150; --quick: no limit; 0: no limit)")
    parser.add_argument("--algo-cache", metavar="PATH", help="load the algorithm cache from PATH first (if it "
                        "exists) and save it there at the end: autotune once, reuse across runs")
    parser.add_argument("--graphed", action=argparse.BooleanOptionalAction, default=True,
                        help="also time every per-conv cell replayed from a CUDA graph (device time only)")
    parser.add_argument("--graph-calls", type=int, help="calls captured per CUDA graph (default 20; --quick 5)")
    parser.add_argument("--host-overhead", action=argparse.BooleanOptionalAction, default=True,
                        help="time the host's cost of one call of a tiny conv (Table 3)")
    parser.add_argument("--host-calls", type=int,
                        help="calls per host-overhead sample (default 2000; --quick 200)")
    args = parser.parse_args(argv)

    block_table = QUICK_BLOCKS if args.quick else BLOCKS
    if args.blocks:
        every = {**BLOCKS, **QUICK_BLOCKS}
        block_table = {name: every[name] for name in parse_list(args.blocks, list(every), "blocks")}
    args.layouts = parse_list(args.layouts, LAYOUTS, "layouts")
    args.precisions = parse_list(args.precisions, PRECISIONS, "precisions")
    args.variants = parse_list(args.variants, VARIANTS, "variants")
    args.algos = parse_list(args.algos, list(ALGOS), "algos")
    args.per_conv_precisions = (parse_list(args.per_conv_precisions, PRECISIONS, "per-conv-precisions")
                                if args.per_conv_precisions else args.precisions)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.repeats = args.repeats if args.repeats is not None else (3 if args.quick else 20)
    args.graph_calls = args.graph_calls if args.graph_calls is not None else (5 if args.quick else 20)
    args.host_calls = args.host_calls if args.host_calls is not None else (200 if args.quick else 2000)
    if args.graph_calls < 1 or args.host_calls < 1:
        parser.error("--graph-calls and --host-calls must be >= 1")
    args.block_table = block_table
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    block_table = args.block_table
    budget = Budget(args.budget_s if args.budget_s is not None else (0 if args.quick else 150))

    import resnet_native as rn
    from resnet_native import conv

    if not rn.cuda_available():
        print(f"bench_block.py needs a CUDA GPU: {rn._C.device_unavailable_reason()}", file=sys.stderr)
        return 2
    engines = parse_list(args.engines, ["legacy", "graph"], "engines") if args.engines else ["legacy", "graph"]
    torch = None
    if not args.no_torch:
        with contextlib.suppress(ImportError):
            import torch
    if args.algo_cache and os.path.exists(args.algo_cache):
        print(f"loaded {conv.load_algorithm_cache(args.algo_cache)} cached algorithm choices", file=sys.stderr)

    report = {"environment": environment(),
              "args": {k: v for k, v in vars(args).items() if k != "block_table"}, "engines": engines,
              "block": [], "per_conv": [], "host_overhead": [], "skipped": []}
    if args.host_overhead:  # first: cheap, and the question of this table does not depend on the budget
        print("[host overhead]", file=sys.stderr, flush=True)
        host_overhead_section(args, engines, torch, report)
    block_section(args, block_table, engines, torch, budget, report)
    if not args.no_per_conv:
        per_conv_section(args, block_table, engines, torch, budget, report)
    report["fusion_summary"] = fusion_summary(report["block"])
    report["algorithm_cache_stats"] = conv.algorithm_cache_stats()
    report["elapsed_s"] = budget.elapsed()
    if args.algo_cache:
        conv.save_algorithm_cache(args.algo_cache)
    if args.json:
        write_json(args.json, report)

    env = report["environment"]
    print(f"GPU {env.get('gpu')}, cuDNN {env.get('cudnn')}, torch {env.get('torch')} (cuDNN {env.get('torch_cudnn')}),"
          f" engines {', '.join(engines)}, {report['elapsed_s']:.0f} s")
    print(format_table(report["block"], BLOCK_COLUMNS, "\nBlock forward (median ms; ratio = ours / torch)"))
    print(format_table(report["fusion_summary"], FUSION_COLUMNS,
                       "\nFusion (time ratios, legacy engine, algo find; above 1: the first is slower)"))
    if report["per_conv"]:
        print(format_table(report["per_conv"], per_conv_columns(engines),
                           "\nPer conv (median ms, algo find; ratio = engine / torch; graphed = replayed from a "
                           "CUDA graph, device time only)"))
    if report["host_overhead"]:
        print(format_table(report["host_overhead"], host_overhead_columns(engines),
                           f"\nHost cost of one call ({host_probe_name()}, {args.host_calls} calls without "
                           "synchronising; us per call; device_us from a CUDA graph replay)"))
    if report["skipped"]:
        print(f"\nskipped ({len(report['skipped'])}): " + "; ".join(report["skipped"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
