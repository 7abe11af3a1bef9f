"""PyTorch on resnet_native's own data pipeline: the rival for recipes A and B's learning curves.

Feeds torchvision's ResNet-18 (CIFAR stem, channels_last, fp16 autocast + GradScaler) with the batches of
resnet_native's data pipeline (shared through DLPack), so a difference in accuracy between the two trainers points
at the model/optimizer, not the data. Recipe A: SGD Nesterov, cosine per step, crop + flip + Cutout on the GPU.
Recipe B: AdamW (wd 0.05) with torch's own OneCycleLR (beta1 cycled), AutoAugment workers (crop -> flip ->
AutoAugment, as the trainer runs them).

    python tools/torch_reference_train.py --data .data/cifar10-jpeg.tar.xz --epochs 3
    python tools/torch_reference_train.py --data .data/cifar10-jpeg.tar.xz --recipe B --epochs 100
"""

import argparse
import json
import math
import time

import cupy as cp
import torch
import torchvision

from resnet_native.data.augment import AugmentConfig, GpuAugmenter, normalize_on_gpu
from resnet_native.data.cifar10 import load_cifar10


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--recipe", choices=["A", "B"], default="A")
    p.add_argument("--lr", type=float, help="(peak) learning rate (default: A 0.1, B 3e-4)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    data = load_cifar10(args.data)
    train_x, train_y = cp.asarray(data.train_images), cp.asarray(data.train_labels, dtype=cp.int32)
    recipe_b = args.recipe == "B"
    lr = args.lr if args.lr is not None else (3e-4 if recipe_b else 0.1)
    aa = None
    if recipe_b:
        from resnet_native.data.autoaugment import AutoAugmentWorkers

        aa = AutoAugmentWorkers(data.train_images, seed=args.seed, crop_padding=4, flip=True)
        config = AugmentConfig(crop_padding=0, flip=False, cutout=0)  # the workers cropped and flipped
    else:
        config = AugmentConfig(crop_padding=4, flip=True, cutout=16)
    aug = GpuAugmenter(train_x, train_y, batch_size=args.batch_size, layout="NCHW", dtype="fp32", config=config,
                       seed=args.seed)
    test_x = torch.from_dlpack(normalize_on_gpu(data.test_images, layout="NCHW", dtype="fp32"))
    test_x = test_x.contiguous(memory_format=torch.channels_last)
    test_y = torch.as_tensor(data.test_labels, device="cuda").long()
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = torch.nn.Identity()
    model = model.cuda().to(memory_format=torch.channels_last)
    total = args.epochs * len(aug)
    if recipe_b:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    scaler = torch.amp.GradScaler()
    loss_fn = torch.nn.CrossEntropyLoss()
    start = time.time()
    if aa is not None:
        aa.prefetch(0)
    for epoch in range(args.epochs):
        source = None
        if aa is not None:
            source = cp.ascontiguousarray(cp.asarray(aa.result(epoch)))
            if epoch + 1 < args.epochs:
                aa.prefetch(epoch + 1)
        model.train()
        tot_loss = torch.zeros((), device="cuda")
        correct = torch.zeros((), device="cuda")
        seen = 0
        for x, y in aug.epoch(epoch, images=source):
            xt = torch.from_dlpack(x).contiguous(memory_format=torch.channels_last)
            yt = torch.from_dlpack(y).long()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                out = model(xt)
                loss = loss_fn(out, yt)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
            tot_loss += loss.detach() * len(yt)
            correct += (out.argmax(1) == yt).sum()
            seen += len(yt)
        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            pred = torch.cat([model(test_x[i:i + 1000]).argmax(1) for i in range(0, len(test_x), 1000)])
        acc = (pred == test_y).float().mean().item()
        print(f"torch epoch {epoch + 1}/{args.epochs}: train loss {tot_loss.item() / seen:.4f} "
              f"acc {correct.item() / seen:.4f} | test acc {acc:.4f} | {time.time() - start:.1f}s")
    if aa is not None:
        aa.close()
    print(json.dumps({"recipe": args.recipe, "torch_test_acc": acc, "epochs": args.epochs,
                      "wall_s": time.time() - start}))


if __name__ == "__main__":
    main()
