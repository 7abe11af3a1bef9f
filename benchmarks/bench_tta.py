"""What test-time augmentation costs at inference: InferenceEngine latency with tta='none', 'flip' and 'flip-shift'.

    python benchmarks/bench_tta.py [--models resnet18,resnet50] [--batches 1,32,256,1024] [--dtype fp16]
                                   [--iters 100] [--warmup 10] [--json PATH] [--markdown PATH]

Rows per (model, batch, tta), one engine per model and mode over all batch sizes, all in one run on one device:
uint8 (N, 32, 32, 3) pixels in, CUDA events around each call after warm-up (common.latency), median and p99.
x_none: the row's median over the same model and batch without TTA (1 view, against 2 and 6 replays of the same
captured forward plus the views' copies).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from bench_infer import MODELS, ROTATE
from common import cupy_clock, environment, latency, markdown_table, write_json

from resnet_native._core.names import TTA_MODES as MODES

COLUMNS = [("model", "model"), ("batch", "batch"), ("tta", "tta"), ("median_ms", "median ms"), ("p99_ms", "p99 ms"),
           ("images_per_s", "images/s"), ("x_none", "x none")]


def add_ratios(rows: list) -> None:
    """x_none on every row whose (model, batch) has a 'none' row."""
    plain = {(r["model"], r["batch"]): r["median_ms"] for r in rows if r["tta"] == "none"}
    for r in rows:
        if (r["model"], r["batch"]) in plain:
            r["x_none"] = r["median_ms"] / plain[(r["model"], r["batch"])]


def time_engine(engine, batch: int, rng, iters: int, warmup: int) -> dict:
    import cupy as cp

    pixels = [cp.asarray(rng.integers(0, 256, (batch, 32, 32, 3), dtype=np.uint8)) for _ in range(ROTATE)]
    row = latency(lambda i: engine(pixels[i % ROTATE]), iters=iters, warmup=warmup, **cupy_clock())
    return dict(row, images_per_s=batch / row["median_ms"] * 1e3)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,resnet50", help="comma-separated: resnet18, resnet50")
    p.add_argument("--batches", default="1,32,256,1024", help="comma-separated batch sizes")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--json", default="bench_tta.json")
    p.add_argument("--markdown", help="the table as Markdown (default: the JSON path with .md)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)} (expected some of {', '.join(MODELS)})")
    batches = tuple(int(b) for b in args.batches.split(",") if b)
    import resnet_native as rn
    from resnet_native.inference import InferenceEngine

    rng = np.random.default_rng(0)
    rows = []
    for name in models:
        model = getattr(rn, MODELS[name])(num_classes=10, stem="cifar", layout="NHWC", precision=args.dtype, seed=0)
        model.cuda().eval()
        for mode in MODES:
            with InferenceEngine(model, batch_sizes=batches, precision=args.dtype, tta=mode) as engine:
                for batch in batches:
                    rows.append(dict(model=name, batch=batch, tta=mode,
                                     **time_engine(engine, batch, rng, args.iters, args.warmup)))
                    print(rows[-1], flush=True)
    add_ratios(rows)
    table = markdown_table(rows, COLUMNS)
    print(table)
    write_json(args.json, {"environment": environment(), "args": vars(args), "rows": rows})
    from resnet_native._core.files import atomic_write_text

    atomic_write_text(args.markdown or str(args.json).rsplit(".", 1)[0] + ".md", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
