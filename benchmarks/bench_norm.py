"""Training batch norm alone: our forward and backward per dtype and variant, the path each took, against PyTorch.

    python benchmarks/bench_norm.py [--shapes 256x64x32x32,...] [--dtypes fp32,fp16,bf16,bf16-nofuse] [--json PATH]

For each NHWC activation shape (N x C x H x W), dtype and variant (bn, bn+relu, bn+add+relu) in the given order:
the training forward (batch_norm_train) and its backward (batch_norm_backward), every output preallocated, each
timed as 20 calls captured in one CUDA graph (device time only); the path each took (resnet_native.norm.last_path:
a fused *Ex call in cuDNN's persistent NHWC kernels, or the plain call plus elementwise kernels); and the effective
bandwidth against 4.3 TB/s (a device-to-device copy's rate on an H200), counting the passes the work needs at
least: forward reads x twice and writes y (plus z), backward reads x and dy twice and writes dx (plus the mask's y
and dz). PyTorch's rival: F.batch_norm (+ add, ReLU) on a channels_last tensor of the dtype with fp32 parameters,
forward and forward + backward through autograd, eager (its launches hidden behind the device time by
back-to-back calls). `bf16-nofuse` is bf16 with resnet_native.norm.set_fuse_bf16(False). Default shapes: ResNet-18's
CIFAR stages at batch 256 and the largest ResNet-50 CIFAR shape.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cupy_graphed_time, environment, format_table, torch_time, write_json  # noqa: E402

SHAPES = "256x64x32x32,256x128x16x16,256x256x8x8,256x512x4x4,256x256x32x32"
VARIANTS = {"bn": (False, False), "bn_relu": (True, False), "bn_add_relu": (True, True)}
COPY_GBS = 4300.0
COLUMNS = [("shape", "N x C x H x W"), ("dtype", "dtype"), ("variant", "variant"), ("fwd_ms", "fwd ms"),
           ("bwd_ms", "bwd ms"), ("fwd_gbs", "fwd GB/s"), ("bwd_gbs", "bwd GB/s"), ("torch_fwd_ms", "torch fwd"),
           ("torch_fwdbwd_ms", "torch fwd+bwd"), ("ratio", "torch/ours"), ("fwd_path", "forward path"),
           ("bwd_path", "backward path")]


def _short(path: dict) -> str:
    detail = path["detail"]
    return ("fused " if path["fused"] else "") + path["mode"] + ": " + detail[:90]


def time_ours(shape, dtype, relu, has_z):
    import cupy as cp

    from resnet_native.ops import kernels, norm

    n, c, h, w = shape
    store = {"fp32": cp.float32, "fp16": cp.float16, "bf16": cp.uint16}[dtype]

    def act():
        return kernels.cast(cp.random.standard_normal((n, h, w, c), dtype=cp.float32), cp.empty((n, h, w, c), store))

    x, dy, z = act(), act(), act() if has_z else None
    y, dx, dz = cp.empty_like(x), cp.empty_like(x), cp.empty_like(x) if has_z else None
    gamma, beta = cp.ones(c, cp.float32), cp.zeros(c, cp.float32)
    rm, rv, mean, invstd = (cp.zeros(c, cp.float32) for _ in range(4))
    dgamma, dbeta = cp.empty(c, cp.float32), cp.empty(c, cp.float32)
    size = norm.batch_norm_reserve_size((n, h, w, c), layout="NHWC", relu=relu, has_z=has_z, dtype=dtype)
    reserve = cp.empty((size + 3) // 4, cp.float32) if size else None  # opaque bytes, fp32-typed
    cp.cuda.Device().synchronize()  # the inputs were made on the default stream; the timing runs on its own

    def forward():
        norm.batch_norm_train(x, gamma, beta, rm, rv, layout="NHWC", z=z, relu=relu, out=y, save_mean=mean,
                              save_invstd=invstd, reserve=reserve, dtype=dtype)

    def backward():
        norm.batch_norm_backward(x, dy, gamma, beta, mean, invstd, layout="NHWC", y=y, relu=relu, has_z=has_z,
                                 reserve=reserve, dx=dx, dgamma=dgamma, dbeta=dbeta, dz=dz, dtype=dtype)

    forward()
    fwd_path = norm.last_path()
    backward()
    bwd_path = norm.last_path()
    # The timing runs on a non-blocking stream: nothing of the default stream's may still run beside it (two
    # of cuDNN's persistent batch-norm kernels running at once on one GPU is not a case they are known to handle).
    cp.cuda.Device().synchronize()
    row = {"fwd_ms": cupy_graphed_time(forward)["median_ms"]}
    forward()  # the backward's reserve must come from the forward of this problem
    cp.cuda.Device().synchronize()
    row["bwd_ms"] = cupy_graphed_time(backward)["median_ms"]
    nbytes = x.nbytes
    row["fwd_gbs"] = (3 + has_z) * nbytes / row["fwd_ms"] / 1e6
    row["bwd_gbs"] = (5 + relu + has_z) * nbytes / row["bwd_ms"] / 1e6
    row["fwd_path"], row["bwd_path"] = _short(fwd_path), _short(bwd_path)
    return row


def time_torch(torch, shape, dtype, relu, has_z):
    import torch.nn.functional as F

    n, c, h, w = shape
    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    x = torch.randn(n, c, h, w, device="cuda", dtype=dt).to(memory_format=torch.channels_last).requires_grad_()
    z = torch.randn_like(x) if has_z else None
    dy = torch.randn_like(x)
    gamma = torch.ones(c, device="cuda", requires_grad=True)
    beta = torch.zeros(c, device="cuda", requires_grad=True)
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")

    def forward():
        y = F.batch_norm(x, rm, rv, gamma, beta, training=True)
        if z is not None:
            y = y + z
        return F.relu(y) if relu else y

    def both():
        forward().backward(dy)

    return {"torch_fwd_ms": torch_time(forward)["median_ms"], "torch_fwdbwd_ms": torch_time(both)["median_ms"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--dtypes", default="fp16,bf16")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError as e:
            print(f"torch rival skipped: {e}", file=sys.stderr)
    from resnet_native.ops import norm

    rows = []
    for text in args.shapes.split(","):
        shape = tuple(int(v) for v in text.split("x"))
        for name in args.dtypes.split(","):
            dtype = name.removesuffix("-nofuse")
            norm.set_fuse_bf16(not name.endswith("-nofuse"))
            for variant in args.variants.split(","):
                relu, has_z = VARIANTS[variant]
                row = {"shape": text, "dtype": name, "variant": variant, **time_ours(shape, dtype, relu, has_z)}
                if torch is not None:
                    row.update(time_torch(torch, shape, dtype, relu, has_z))
                    row["ratio"] = row["torch_fwdbwd_ms"] / (row["fwd_ms"] + row["bwd_ms"])
                rows.append(row)
                print(format_table([row], COLUMNS), flush=True)
    norm.set_fuse_bf16(True)
    print(format_table(rows, COLUMNS, title=f"training batch norm, NHWC (bandwidth floor {COPY_GBS:.0f} GB/s)"))
    if args.json:
        write_json(args.json, {"environment": environment(), "args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
