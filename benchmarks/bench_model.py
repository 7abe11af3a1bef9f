"""Whole-model training and inference throughput: resnet_native vs PyTorch, same device, same run.

    python benchmarks/bench_model.py [--models resnet18,resnet50] [--batch 256] [--steps 30] [--json PATH]

Training: one full step (forward, loss, backward, optimizer) on random CIFAR-sized data, SGD Nesterov; ours through
resnet_native.step.TrainStep, eager (train_ms) and replayed from a CUDA graph (train_graph_ms), PyTorch's through
torchvision's ResNet with the CIFAR stem, channels_last and autocast
(fp16) + GradScaler, cudnn.benchmark on. Inference: forward in eval mode. Times are CUDA-event medians after warm-up.
"""

import argparse
import json
import statistics
import sys

import cupy as cp
import numpy as np

import resnet_native as rn


def median_ms(fn, warmup, steps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def ours(name, batch, dtype, layout, warmup, steps):
    """(eager train step, CUDA-graph train step, inference) in ms."""
    model = getattr(rn, name.replace("resnet", "ResNet"))(num_classes=10, stem="cifar", layout=layout, precision=dtype)
    opt = rn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scaler = rn.optim.GradScaler() if dtype == "fp16" else None
    np_dtype = np.float16 if dtype == "fp16" else np.float32
    shape = (batch, 32, 32, 3) if layout == "NHWC" else (batch, 3, 32, 32)
    x = cp.random.standard_normal(shape, dtype=cp.float32).astype(np_dtype)
    y = cp.random.randint(0, 10, batch).astype(cp.int32)
    model.train()
    times = []
    for cuda_graph in (False, True):
        step = rn.step.TrainStep(model, opt, label_smoothing=0.0, scaler=scaler, cuda_graph=cuda_graph)
        times.append(median_ms(lambda step=step: step.run(x, y), warmup, steps))
        if cuda_graph and step.capture_error:
            print(f"{name}: capture failed: {step.capture_error}", file=sys.stderr)
            times[-1] = float("nan")
        step.reset_graphs()
    model.eval()
    infer = median_ms(lambda: model.forward(x, train=False), warmup, steps)
    return times[0], times[1], infer


def torch_rival(name, batch, dtype, layout, warmup, steps):
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, name)(num_classes=10)
    model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = torch.nn.Identity()
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    model = model.cuda().to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
    amp = dtype in ("fp16", "bf16")
    amp_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler(enabled=dtype == "fp16")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    x = torch.randn(batch, 3, 32, 32, device="cuda").to(memory_format=fmt)
    y = torch.randint(0, 10, (batch,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    def infer():
        with torch.no_grad(), torch.autocast("cuda", dtype=amp_dtype, enabled=amp):
            model(x)

    model.train()
    train = median_ms(step, warmup, steps)
    model.eval()
    return train, median_ms(infer, warmup, steps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dtype", default="fp16", choices=["fp32", "tf32", "fp16", "bf16"])
    parser.add_argument("--layout", default="NHWC", choices=["NHWC", "NCHW"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        row = {"model": name, "batch": args.batch, "dtype": args.dtype, "layout": args.layout}
        row["train_ms"], row["train_graph_ms"], row["infer_ms"] = ours(
            name, args.batch, args.dtype, args.layout, args.warmup, args.steps
        )
        if not args.no_torch:
            try:
                row["torch_train_ms"], row["torch_infer_ms"] = torch_rival(
                    name, args.batch, args.dtype, args.layout, args.warmup, args.steps
                )
            except ImportError as e:
                print(f"torch rival skipped: {e}", file=sys.stderr)
        rows.append(row)
    print(f"{'model':10} {'batch':>5} {'train ms':>9} {'graph ms':>9} {'img/s':>8} {'torch ms':>9} {'ratio':>6} "
          f"{'g.ratio':>7} {'infer ms':>9} {'torch ms':>9} {'ratio':>6}")
    nan = float("nan")
    for r in rows:
        tt, ti, tg = r.get("torch_train_ms"), r.get("torch_infer_ms"), r["train_graph_ms"]
        print(f"{r['model']:10} {r['batch']:5d} {r['train_ms']:9.2f} {tg:9.2f} {r['batch'] / tg * 1e3:8.0f} "
              f"{tt or nan:9.2f} {r['train_ms'] / tt if tt else nan:6.2f} {tg / tt if tt else nan:7.2f} "
              f"{r['infer_ms']:9.2f} {ti or nan:9.2f} {r['infer_ms'] / ti if ti else nan:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
