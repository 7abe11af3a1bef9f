"""Whole-model training throughput: resnet_native against the strongest PyTorch step, same device, same run.

    python benchmarks/bench_model.py [--models resnet18,resnet50] [--batches 256,512] [--dtypes fp16,bf16]
                                     [--imagenet 256,128] [--steps 30] [--warmup 5] [--peak-tflops 790]
                                     [--no-torch] [--bn-fuse-bf16 on|off] [--json PATH] [--markdown PATH]

One row per (model, image size, dtype, batch). A step is forward, softmax cross-entropy, backward and SGD Nesterov
(weight decay 5e-4) on random data, NHWC / channels_last:
  ours_eager, ours_graph    resnet_native.step.TrainStep, eagerly and replayed from its CUDA graph; fp16 with
                            the dynamic GradScaler (its checks run inside the graph), bf16 without one
  torch_eager               torchvision's ResNet (CIFAR rows: conv1 3x3/1, maxpool = Identity), channels_last,
                            autocast, cudnn.benchmark; fp16 with torch.amp.GradScaler
  torch_graph               the same step (forward, backward, optimizer) captured whole in torch.cuda.graph, as
                            PyTorch's CUDA-graph documentation shows; fp16 with a static loss scale (GradScaler's
                            inf check synchronises and cannot be captured), bf16 without one
CIFAR rows are 32x32 with the CIFAR stem and 10 classes; --imagenet rows are ResNet-50 at 224x224 with the ImageNet
stem and 1000 classes. Times are CUDA-event medians of single steps after warm-up. `speedup` is torch_graph over
the faster of ours (above 1: ours is faster). TFLOP/s count 3x the forward's convolution FLOPs (forward, data
gradient, weight gradient; 2*N*K*C*R*S*P*Q, the classifier included) and `mfu` is that against --peak-tflops (the
dense fp16/bf16 rate an H200 reaches, 790). Memory, what each side's allocators hold at their peak: ours the
cupy pools (the default pool, which holds the model, its buffers and the batch, and each captured step's private
pool) plus the cuDNN workspace pool; PyTorch's caching allocator's peak reserved bytes (its cuDNN workspace and
graph pools included), and its peak allocated bytes beside it.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import environment, format_table, markdown_table, write_json  # noqa: E402

MODELS = {"resnet18": "ResNet18", "resnet50": "ResNet50", "resnet101": "ResNet101"}
STATIC_LOSS_SCALE = 1024.0
COLUMNS = [("model", "model"), ("image", "image"), ("dtype", "dtype"), ("batch", "batch"),
           ("ours_eager_ms", "ours eager"), ("ours_graph_ms", "ours graph"), ("torch_eager_ms", "torch eager"),
           ("torch_graph_ms", "torch graph"), ("images_per_s", "img/s"), ("speedup", "speedup"),
           ("tflops", "TFLOP/s"), ("mfu_pct", "MFU %"), ("torch_mfu_pct", "torch MFU %"),
           ("ours_mem_gib", "ours GiB"), ("workspace_gib", "ours workspace GiB"),
           ("workspace_peak_gib", "ours workspace peak GiB"), ("torch_mem_gib", "torch GiB"),
           ("torch_peak_alloc_gib", "torch alloc GiB")]


def median_ms(fn, warmup: int, steps: int, new_event, elapsed_ms) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start, end = new_event(), new_event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(elapsed_ms(start, end))
    return statistics.median(times)


# ------------------------------------------------------------------------------------------------------------
# Ours


def build_ours(config):
    import cupy as cp

    import resnet_native as rn
    from resnet_native.ops import kernels

    model = getattr(rn, MODELS[config["model"]])(num_classes=config["classes"], stem=config["stem"], layout="NHWC",
                                                  precision=config["dtype"], seed=0)
    opt = rn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scaler = rn.optim.GradScaler() if config["dtype"] == "fp16" else None
    size, batch = config["image"], config["batch"]
    x32 = cp.random.standard_normal((batch, size, size, 3), dtype=cp.float32)
    x = kernels.cast(x32, cp.empty(x32.shape, dtype=model.input_dtype))  # the storage dtype: no cast in the step
    y = cp.random.randint(0, config["classes"], batch).astype(cp.int32)
    model.train()
    return model, opt, scaler, x, y


def time_ours(config, warmup, steps) -> dict:
    import cupy as cp

    import resnet_native as rn
    from resnet_native.inference.plan import build_plan

    # The last row's arrays are freed by now (its steps held them until time_ours returned): hand their cached
    # blocks back first, or this row would reuse them and seem to need nothing.
    gc.collect()
    default_pool = cp.get_default_memory_pool()
    default_pool.free_all_blocks()
    before = default_pool.total_bytes()
    model, opt, scaler, x, y = build_ours(config)
    flops = 3 * build_plan(model.state_dict(), config["stem"], config["dtype"], config["image"]).conv_flops(
        config["batch"])
    row = {"flops": flops}
    steps_kept = []
    for name, graph in (("ours_eager_ms", False), ("ours_graph_ms", True)):
        step = rn.step.TrainStep(model, opt, scaler=scaler, cuda_graph=graph,
                                 direct_gradients=config["direct_gradients"])
        row[name] = median_ms(lambda step=step, x=x, y=y: step.run(x, y), warmup, steps, cp.cuda.Event,
                              cp.cuda.get_elapsed_time)
        if graph and step.capture_error:
            print(f"{config['model']}: capture failed: {step.capture_error}", file=sys.stderr)
            row[name] = float("nan")
        steps_kept.append(step)
    cp.cuda.Device().synchronize()
    pools = default_pool.total_bytes() - before + sum(p.total_bytes() for s in steps_kept for p in s._pools.values())
    # The pool after the captured step (trimmed to what the chosen algorithms use) and the largest it was while
    # the algorithm searches tried candidates (PyTorch's peak reserved includes its own search's workspace).
    row["workspace_gib"] = rn.workspace_stats()["size"] / 2**30
    row["workspace_peak_gib"] = rn.workspace_stats()["peak_size"] / 2**30
    row["ours_mem_gib"] = pools / 2**30 + row["workspace_gib"]
    for step in steps_kept:
        step.reset_graphs()
    del model, opt, scaler, x, y, steps_kept, step
    gc.collect()
    default_pool.free_all_blocks()
    rn.release_workspace()
    return row


# ------------------------------------------------------------------------------------------------------------
# PyTorch


def torch_step(torch, config):
    """(eager step, graph-capturable step, cleanup) for torchvision's model in this configuration."""
    import torchvision

    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, config["model"])(num_classes=config["classes"])
    if config["stem"] == "cifar":
        model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        model.maxpool = torch.nn.Identity()
    model = model.cuda().to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
    amp_dtype = torch.float16 if config["dtype"] == "fp16" else torch.bfloat16
    size, batch = config["image"], config["batch"]
    x = torch.randn(batch, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, config["classes"], (batch,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler(enabled=config["dtype"] == "fp16")
    params = list(model.parameters())

    def eager():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp_dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    scale = STATIC_LOSS_SCALE if config["dtype"] == "fp16" else 1.0

    def capturable():
        with torch.autocast("cuda", dtype=amp_dtype, cache_enabled=False):
            loss = loss_fn(model(x), y)
        (loss * scale).backward()
        if scale != 1.0:
            torch._foreach_mul_([p.grad for p in params], 1.0 / scale)
        opt.step()

    return eager, capturable, opt


def time_torch(torch, config, warmup, steps) -> dict:
    events = {"new_event": lambda: torch.cuda.Event(enable_timing=True), "elapsed_ms": lambda a, b: a.elapsed_time(b)}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    eager, capturable, opt = torch_step(torch, config)
    row = {"torch_eager_ms": median_ms(eager, warmup, steps, **events)}
    # Whole-step capture as torch.cuda.graph's documentation shows it: warm up on a side stream, grads set to
    # None so the captured backward allocates them from the graph's pool, then replay.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            capturable()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        capturable()
    row["torch_graph_ms"] = median_ms(graph.replay, warmup, steps, **events)
    torch.cuda.synchronize()
    row["torch_mem_gib"] = torch.cuda.max_memory_reserved() / 2**30
    row["torch_peak_alloc_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del graph, eager, capturable, opt
    gc.collect()
    torch.cuda.empty_cache()
    return row


# ------------------------------------------------------------------------------------------------------------


def with_rates(row: dict, peak_tflops: float) -> dict:
    ours = min(v for v in (row["ours_eager_ms"], row["ours_graph_ms"]) if v == v)  # nan-safe
    row["images_per_s"] = row["batch"] / ours * 1e3
    row["tflops"] = row["flops"] / ours / 1e9
    row["mfu_pct"] = 100.0 * row["tflops"] / peak_tflops
    if "torch_graph_ms" in row:
        row["speedup"] = row["torch_graph_ms"] / ours
        row["torch_mfu_pct"] = 100.0 * row["flops"] / row["torch_graph_ms"] / 1e9 / peak_tflops
    return row


def configs(args) -> list:
    out = [dict(model=m, image=32, stem="cifar", classes=10, dtype=d, batch=b)
           for m in args.models for d in args.dtypes for b in args.batches]
    out += [dict(model="resnet50", image=224, stem="imagenet", classes=1000, dtype=d, batch=b)
            for d in args.dtypes for b in args.imagenet]
    direct = args.direct_gradients == "on"
    return [dict(c, direct_gradients=direct) for c in out]


def _csv(kind):
    return lambda text: [kind(v) for v in text.split(",") if v]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=_csv(str), default=["resnet18", "resnet50"])
    p.add_argument("--batches", type=_csv(int), default=[256, 512])
    p.add_argument("--dtypes", type=_csv(str), default=["fp16", "bf16"])
    p.add_argument("--imagenet", type=_csv(int), default=[256, 128], help="ResNet-50 224x224 batches ('' for none)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--bn-fuse-bf16", choices=["on", "off"], help="resnet_native.norm.set_fuse_bf16 for the run")
    p.add_argument("--direct-gradients", choices=["on", "off"], default="on",
                   help="our optimizer reads the low-precision weight gradients in place, as the trainer's step does")
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args(argv)
    for m in args.models:
        if m not in MODELS:
            p.error(f"--models: {m!r} is not one of {sorted(MODELS)}")
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError as e:
            print(f"torch rival skipped: {e}", file=sys.stderr)
    if args.bn_fuse_bf16:
        from resnet_native.ops import norm

        norm.set_fuse_bf16(args.bn_fuse_bf16 == "on")
    rows = []
    for config in configs(args):
        row = dict(config, **time_ours(config, args.warmup, args.steps))
        if torch is not None:
            row.update(time_torch(torch, config, args.warmup, args.steps))
        rows.append(with_rates(row, args.peak_tflops))
        print(format_table(rows[-1:], COLUMNS), flush=True)
    print(format_table(rows, COLUMNS, title="training step, ms (median)"))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown_table(rows, COLUMNS) + "\n")
    if args.json:
        write_json(args.json, {"environment": environment(), "args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
