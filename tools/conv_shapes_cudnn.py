"""cuDNN's fastest plain fp16 / bf16 convolution on the CUTLASS probe's ResNet-18 shapes, as the package runs it:
the graph engine, algo='find', NHWC, bias + ReLU fused (the probe's epilogue), timed as CUDA-graph replays.

    python tools/conv_shapes_cudnn.py --batches 256,1024 --json out.json

The baseline the training-fusion kernels must meet: tools/cutlass_probe (run in the same device call) times the
same shapes on plain CUTLASS sm90 convolutions; its table and this one give the CUTLASS / cuDNN ratio per layer.
"""

from __future__ import annotations

import argparse
import json
import sys

import cupy as cp
import numpy as np

from resnet_native._core.capture import capture_graph
from resnet_native._core.files import atomic_write_text
from resnet_native.ops import conv, kernels
from resnet_native.ops.timing import device_time_ms

# name, H=W, C, K, R=S, stride: tools/cutlass_probe/probe.cu's shapes (its fourth column, the count in ResNet-18,
# weights its sums)
SHAPES = (("l1_3x3_32px_64", 32, 64, 64, 3, 1, 4), ("l2_3x3s2_32px_64to128", 32, 64, 128, 3, 2, 1),
          ("l2_proj1x1s2_32px_64to128", 32, 64, 128, 1, 2, 1), ("l2_3x3_16px_128", 16, 128, 128, 3, 1, 3),
          ("l3_3x3s2_16px_128to256", 16, 128, 256, 3, 2, 1), ("l3_proj1x1s2_16px_128to256", 16, 128, 256, 1, 2, 1),
          ("l3_3x3_8px_256", 8, 256, 256, 3, 1, 3), ("l4_3x3s2_8px_256to512", 8, 256, 512, 3, 2, 1),
          ("l4_proj1x1s2_8px_256to512", 8, 256, 512, 1, 2, 1), ("l4_3x3_4px_512", 4, 512, 512, 3, 1, 3))
STORAGE = {"fp16": np.float16, "bf16": np.uint16}


def time_shape(shape, batch: int, precision: str, calls: int) -> dict:
    name, hw, c, k, r, stride, count = shape
    pad = r // 2
    spec = conv.ConvSpec(stride=stride, padding=pad, layout="NHWC", precision=precision, algo="find",
                         engine="graph")
    rng = np.random.default_rng(0)
    x32 = cp.asarray(rng.standard_normal((batch, hw, hw, c), dtype=np.float32))
    w32 = cp.asarray((rng.standard_normal((k, r, r, c)) / np.sqrt(r * r * c)).astype(np.float32))
    b32 = cp.asarray(rng.standard_normal(k, dtype=np.float32))
    x, w, b = (kernels.cast(a, cp.empty(a.shape, STORAGE[precision])) for a in (x32, w32, b32))
    oh = (hw + 2 * pad - r) // stride + 1
    out = cp.empty((batch, oh, oh, k), STORAGE[precision])
    conv.conv2d(x, w, spec, bias=b, activation="relu", out=out)  # the search, outside the capture
    stream = cp.cuda.Stream(non_blocking=True)
    pool = cp.cuda.MemoryPool()

    def many():
        for _ in range(calls):
            conv.conv2d(x, w, spec, bias=b, activation="relu", out=out)

    graph = capture_graph(many, stream, pool).graph
    ms = device_time_ms(lambda: graph.launch(stream), stream, runs=7, warmup=2) / calls
    entry = conv.last_algorithm(x.shape, w.shape, spec, fused=conv.fused_name(bias=True, activation="relu"))
    flops = 2.0 * batch * oh * oh * k * r * r * c
    return {"layer": name, "count": count, "batch": batch, "precision": precision, "ms": ms,
            "tflops": flops / ms / 1e9, "algo": entry.get("algo_name") if entry else None,
            "fused_path": entry.get("fused_path") if entry else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="256,1024")
    p.add_argument("--precisions", default="fp16,bf16")
    p.add_argument("--calls", type=int, default=20, help="convolutions per captured graph")
    p.add_argument("--json", help="write the rows to PATH")
    args = p.parse_args(argv)
    rows = []
    for precision in args.precisions.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for shape in SHAPES:
                row = time_shape(shape, batch, precision, args.calls)
                rows.append(row)
                print(f"{row['layer']:28s} {batch:5d} {precision} {row['ms']:.4f} ms {row['tflops']:6.1f} TFLOP/s "
                      f"{row['algo']} {row['fused_path'] or 'fused'}", flush=True)
            total = sum(r["count"] * r["ms"] for r in rows if r["batch"] == batch and r["precision"] == precision)
            print(f"ResNet-18 convolutions after the stem, {precision} n={batch}: sum of count x ms {total:.3f}")
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
