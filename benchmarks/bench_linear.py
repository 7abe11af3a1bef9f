"""The classifier layer's step: forward, weight and input gradients of (N, C) fp16 features and a (K, C) fp32 weight.

    python benchmarks/bench_linear.py [--batches 336,512,1000] [--features 512] [--outputs 10] [--json PATH]

Three ways, each captured in a CUDA graph and replayed between CUDA events (common.cupy_graphed_time /
torch_graphed_time), in one process: `own` (ops/linear.py, what nn.layers.Linear runs); `cudnn`, the route it
replaced (the features cast to fp32, then cuDNN's fp32 1x1 convolutions with the bias in the forward's epilogue,
the gradient cast back); `torch` (F.linear on fp32 features and its autograd backward, cuBLAS). The bias's
gradient (the same per-channel sum in each of ours) is left out.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from common import cupy_graphed_time, environment, format_table, markdown_table, torch_graphed_time, write_json

COLUMNS = [("batch", "batch"), ("way", "way"), ("median_ms", "median ms"), ("x_own", "x own")]


def ours(n: int, c: int, k: int, rng) -> dict:
    """{way: step function} of our two routes, on device arrays made once (no allocation in a step)."""
    import cupy as cp

    from resnet_native.ops import conv, kernels
    from resnet_native.ops.linear import linear_backward_data, linear_backward_weight, linear_forward

    x = cp.asarray(rng.standard_normal((n, c)), dtype=cp.float16)
    w = cp.asarray(rng.standard_normal((k, c)) / np.sqrt(c), dtype=cp.float32)
    b = cp.asarray(rng.standard_normal(k), dtype=cp.float32)
    dy = cp.asarray(rng.standard_normal((n, k)), dtype=cp.float32)
    y, dw, dx = cp.empty((n, k), cp.float32), cp.empty((k, c), cp.float32), cp.empty((n, c), cp.float16)
    x32, dx32 = cp.empty((n, c), cp.float32), cp.empty((n, c), cp.float32)
    spec = conv.ConvSpec(layout="NHWC", precision="fp32", algo="find", engine="graph")
    x4, dy4, w4 = x32.reshape(n, 1, 1, c), dy.reshape(n, 1, 1, k), w.reshape(k, 1, 1, c)

    def own():
        linear_forward(x, w, b, out=y)
        linear_backward_weight(x, dy, out=dw)
        linear_backward_data(dy, w, dx)

    def cudnn():
        kernels.cast(x, x32)
        conv.conv2d(x4, w4, spec, bias=b, out=y.reshape(n, 1, 1, k))
        conv.conv2d_backward_filter(x4, dy4, spec, (k, 1, 1, c), out=dw.reshape(k, 1, 1, c))
        conv.conv2d_backward_data(dy4, w4, spec, (n, 1, 1, c), out=dx32.reshape(n, 1, 1, c))
        kernels.cast(dx32, dx)

    return {"own": own, "cudnn": cudnn}


def torch_step(n: int, c: int, k: int, rng):
    import torch

    x = torch.tensor(rng.standard_normal((n, c)), dtype=torch.float16, device="cuda")
    w = torch.tensor(rng.standard_normal((k, c)) / np.sqrt(c), dtype=torch.float32, device="cuda",
                     requires_grad=True)
    b = torch.zeros(k, device="cuda", requires_grad=True)
    dy = torch.tensor(rng.standard_normal((n, k)), dtype=torch.float32, device="cuda")

    def step():
        xf = x.float().requires_grad_()
        y = torch.nn.functional.linear(xf, w, b)
        w.grad = xf.grad = None
        y.backward(dy)
        return xf.grad.half()

    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="336,512,1000", help="comma-separated batch sizes")
    p.add_argument("--features", type=int, default=512)
    p.add_argument("--outputs", type=int, default=10)
    p.add_argument("--json", default="bench_linear.json")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    try:
        import torch  # noqa: F401  (the rival, where installed)
    except ImportError:
        torch = None
    rows = []
    for n in [int(v) for v in args.batches.split(",") if v]:
        timed = {}
        for way, fn in ours(n, args.features, args.outputs, rng).items():
            fn()  # the convolutions' algorithm searches, before capture
            timed[way] = cupy_graphed_time(fn)["median_ms"]
        if torch is not None:
            timed["torch"] = torch_graphed_time(torch_step(n, args.features, args.outputs, rng))["median_ms"]
        rows += [{"batch": n, "way": way, "median_ms": ms, "x_own": ms / timed["own"]} for way, ms in timed.items()]
    print(format_table(rows, COLUMNS, f"classifier step, C={args.features}, K={args.outputs}, fp16 features"))
    write_json(args.json, {"environment": environment(), "features": args.features, "outputs": args.outputs,
                           "rows": rows})
    print(markdown_table(rows, COLUMNS), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
