"""Every own int8 kernel that runs a layer, timed on the GPU: which wins a shape, and by how much (one device call).

    python tools/own_conv_timing.py [--batches 256,1024] [--json PATH]

For each shape (ResNet-18 / ResNet-50 CIFAR layers, with and without the residual) and batch size: each kernel
of ops.own_conv.kernels() that supports it, median device ms of one call (resnet_native.inference.tuning's
device_ms), int8 TOP/s, and the ratio to the fastest. Outputs are compared with the first kernel's, bit for bit
(the kernels share one arithmetic), so a fast wrong kernel cannot win silently.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

# (name, H, C, K, filter, stride): the layers the int8 engine runs on its own kernels at 32x32 and below.
SHAPES = [
    ("l1.3x3 64", 32, 64, 64, 3, 1),
    ("l2.3x3 128", 16, 128, 128, 3, 1),
    ("l3.3x3 256", 8, 256, 256, 3, 1),
    ("r50.l1.1x1 64-256", 32, 64, 256, 1, 1),
    ("r50.l1.1x1 256-64", 32, 256, 64, 1, 1),
    ("r50.l2.1x1 128-512", 16, 128, 512, 1, 1),
]


def time_shape(cp, own_conv, device_ms, shape, batch, residual, rng):
    name, hw, c, k, r, stride = shape
    pad = r // 2
    p = (hw + 2 * pad - r) // stride + 1
    x = cp.asarray(rng.integers(-127, 128, (batch, hw, hw, c), dtype=np.int8))
    w = cp.asarray(rng.integers(-127, 128, (k, r, r, c), dtype=np.int8))
    alpha = cp.full(k, 127.0 / (2 * np.sqrt(c * r * r) * 64 * 64), cp.float32)
    bias = cp.zeros(k, cp.float32)
    z = cp.asarray(rng.integers(-127, 128, (batch, p, p, k), dtype=np.int8)) if residual else None
    out = cp.empty((batch, p, p, k), cp.int8)
    names = [
        kk["name"]
        for kk in own_conv.kernels()
        if kk["residual"] == residual
        and own_conv.supports(x.shape, w.shape, pad=pad, stride=stride, residual=residual, kernel=kk["name"])
    ]
    macs = batch * p * p * k * c * r * r
    rows, first = [], None
    for kernel in names:

        def call(kernel=kernel):
            own_conv.conv2d_s8(
                x,
                w,
                out,
                alpha=alpha,
                bias=bias,
                pad=pad,
                stride=stride,
                residual=z,
                beta=0.5 if residual else 0.0,
                relu=True,
                kernel=kernel,
            )

        out.fill(99)
        call()
        got = out.get()
        first = got if first is None else first
        same = bool(np.array_equal(got, first))
        ms = device_ms(call, samples=15)
        rows.append(
            {
                "layer": name,
                "batch": batch,
                "residual": residual,
                "kernel": kernel,
                "ms": ms,
                "tops": 2 * macs / ms / 1e9,
                "same_bits": same,
            }
        )
    best = min((row["ms"] for row in rows), default=None)
    for row in rows:
        row["x_best"] = row["ms"] / best
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="256,1024")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import cupy as cp

    from resnet_native.inference.tuning import device_ms
    from resnet_native.ops import own_conv

    rng = np.random.default_rng(0)
    rows = []
    print("| layer | batch | residual | kernel | ms | TOP/s | x best | same bits |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for batch in (int(b) for b in args.batches.split(",")):
            for residual in (False, True):
                for row in time_shape(cp, own_conv, device_ms, shape, batch, residual, rng):
                    rows.append(row)
                    print(
                        f"| {row['layer']} | {batch} | {residual} | {row['kernel']} | {row['ms']:.4f} | "
                        f"{row['tops']:.0f} | {row['x_best']:.2f} | {row['same_bits']} |",
                        flush=True,
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
