"""Where a training step's GPU time goes: the top kernels of one eager step, ours and PyTorch's, side by side.

    python tools/profile_step.py --model resnet50 --batch 256 [--dtype fp16|bf16] [--steps 5] [--top 25]
                                 [--optimizer sgd|adamw] [--bn-fuse-bf16 on|off] [--size 32]
                                 [--direct-gradients on|off] [--no-torch]

Why torch.profiler for our step too: CUPTI records every kernel of the process, whoever launched it (cuDNN,
our .cu kernels, cupy's elementwise kernels), so one tool measures both trainers the same way. The step is run
eagerly (kernels of a replayed CUDA graph are not attributed to it reliably by every CUPTI version); bench_model.py
shows eager and captured steps take the same time once the step is GPU-bound. Prints, per trainer, the total
kernel time per step and the kernels that take the most, with their share. The optimizer is recipe A's (SGD,
Nesterov) or recipe B's (AdamW); PyTorch's is its fused implementation of the same. --size: the images' side
(progressive resizing trains recipe C's early epochs at 20).
"""

import argparse
import collections
import functools

import cupy as cp
import torch

import resnet_native as rn


def kernel_table(prof, steps: int) -> tuple:
    """(total us per step, [(name, us per step, calls per step)] sorted by time) from a profiler's CUDA events."""
    totals, calls = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.time_range.elapsed_us()  # a kernel: its own duration
            calls[event.name] += 1
    rows = [(name, us / steps, calls[name] / steps) for name, us in totals.most_common()]
    return sum(totals.values()) / steps, rows


def profile(fn, steps: int, synchronize) -> tuple:
    for _ in range(3):  # warm-up: algorithm searches, buffers, lazy state
        fn()
    synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        synchronize()
    return kernel_table(prof, steps)


def optimizer(module, params, name):
    """Recipe A's SGD or recipe B's AdamW from `module` (rn.optim or torch.optim, with torch's fused kernels)."""
    fused = {"fused": True} if module.__name__.startswith("torch") else {}
    if name == "adamw":
        return module.AdamW(params, lr=8e-4, weight_decay=0.05, **fused)
    return module.SGD(params, lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4, **fused)


def ours(name, batch, dtype, steps, opt_name, size, direct_gradients=True):
    model = getattr(rn, name.replace("resnet", "ResNet"))(num_classes=10, stem="cifar", layout="NHWC", precision=dtype)
    opt = optimizer(rn.optim, model.parameters(), opt_name)
    step = rn.step.TrainStep(model, opt, scaler=rn.optim.GradScaler() if dtype == "fp16" else None,
                             direct_gradients=direct_gradients)
    x32 = cp.random.standard_normal((batch, size, size, 3), dtype=cp.float32)
    x = rn.kernels.cast(x32, cp.empty(x32.shape, dtype=model.input_dtype))
    y = cp.random.randint(0, 10, batch).astype(cp.int32)
    return profile(lambda: step.run(x, y), steps, cp.cuda.Device().synchronize)


def theirs(name, batch, dtype, steps, opt_name, size):
    import torchvision

    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, name)(num_classes=10)
    model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = torch.nn.Identity()
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = optimizer(torch.optim, model.parameters(), opt_name)
    scaler = torch.amp.GradScaler(enabled=dtype == "fp16")
    amp_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    x = torch.randn(batch, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp_dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return profile(step, steps, torch.cuda.synchronize)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    p.add_argument("--bn-fuse-bf16", choices=["on", "off"], help="resnet_native.norm.set_fuse_bf16 for the run")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--size", type=int, default=32, help="image side in pixels")
    p.add_argument("--direct-gradients", choices=["on", "off"], default="on",
                   help="the optimizer reads the low-precision weight gradients in place, as the trainer's step does")
    p.add_argument("--no-torch", action="store_true", help="profile ours alone")
    args = p.parse_args()
    if args.bn_fuse_bf16:
        rn.norm.set_fuse_bf16(args.bn_fuse_bf16 == "on")
    runs = [("resnet_native", functools.partial(ours, direct_gradients=args.direct_gradients == "on"))]
    runs += [] if args.no_torch else [("torch", theirs)]
    for who, run in runs:
        total, rows = run(args.model, args.batch, args.dtype, args.steps, args.optimizer, args.size)
        print(f"\n{who}: {args.model} {args.dtype} batch {args.batch} at {args.size} px {args.optimizer}: "
              f"{total / 1000:.2f} ms of kernels per step")
        print(f"{'us/step':>9} {'share':>6} {'calls':>6}  kernel")
        for name, us, n in rows[: args.top]:
            print(f"{us:9.1f} {us / total:6.1%} {n:6.1f}  {name[:110]}")


if __name__ == "__main__":
    main()
