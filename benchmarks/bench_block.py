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
import os
import sys

import numpy as np

# The modules beside this file: block_shapes (what is timed), block_table (Table 1), conv_tables (Tables 2 and 3),
# block_report (the summary, the columns, the printout), common (timing, budget, tables, JSON).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from block_report import (  # noqa: E402, F401  (host_probe_name and the columns: part of this module's API)
    fusion_summary,
    host_overhead_columns,
    host_probe_name,
    per_conv_columns,
    print_report,
)
from block_shapes import BLOCKS, QUICK_BLOCKS  # noqa: E402
from common import Budget, environment, write_json  # noqa: E402

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
# Command line and run


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
    from resnet_native.ops import conv

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
    # Imported here: the sections take this module's storage helpers above.
    from block_table import block_section
    from conv_tables import host_overhead_section, per_conv_section

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
    print_report(report, engines, args.host_calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
