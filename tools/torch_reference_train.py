"""PyTorch on resnet_native's own data pipeline: the rival for recipes A and B's learning curves.

Feeds torchvision's ResNet-18 (CIFAR stem, channels_last, fp16 autocast + GradScaler) with the batches of
resnet_native's data pipeline (shared through DLPack), so a difference in accuracy between the two trainers points
at the model/optimizer, not the data. Recipe A: SGD Nesterov, cosine per step, crop + flip + Cutout on the GPU.
Recipe B: AdamW (wd 0.05) with torch's own OneCycleLR (beta1 cycled), AutoAugment workers (crop -> flip ->
AutoAugment, as the trainer runs them). Cutout and label smoothing as in the recipe's YAML unless --cutout /
--label-smoothing say otherwise.

    python tools/torch_reference_train.py --data .data/cifar10-jpeg.tar.xz --epochs 3
    python tools/torch_reference_train.py --data .data/cifar10-jpeg.tar.xz --recipe B --epochs 100

--pipeline torchvision replaces resnet_native's data pipeline with a seed-style one (PIL images through
torchvision's RandomCrop(32, 4), RandomHorizontalFlip, AutoAugment(CIFAR10) for B, ToTensor, Normalize, in
DataLoader workers, shuffle, last partial batch kept): the other half of the comparison, same model and optimizer.
"""

import argparse
import json
import time
import types

import cupy as cp
import torch
import torchvision

from resnet_native.data.augment import MEAN, STD, AugmentConfig, GpuAugmenter, normalize_on_gpu
from resnet_native.data.cifar10 import load_cifar10
from resnet_native.training.builders import build_schedule
from resnet_native.training.config import recipe_config


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, help="(default: the recipe YAML's)")
    p.add_argument("--recipe", choices=["A", "B"], default="A")
    p.add_argument("--lr", type=float, help="(peak) learning rate (default: the recipe YAML's)")
    p.add_argument("--cutout", type=int, help="Cutout side in pixels (default: the recipe YAML's)")
    p.add_argument("--label-smoothing", type=float, help="(default: the recipe YAML's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pipeline", choices=["resnet_native", "torchvision"], default="resnet_native")
    p.add_argument("--workers", type=int, default=12, help="DataLoader workers (--pipeline torchvision)")
    args = p.parse_args()
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    data = load_cifar10(args.data)
    recipe_b = args.recipe == "B"
    recipe = recipe_config(args.recipe, {"epochs": args.epochs})
    lr = args.lr if args.lr is not None else recipe.optimizer.lr
    cutout = args.cutout if args.cutout is not None else recipe.augment.cutout
    smoothing = args.label_smoothing if args.label_smoothing is not None else recipe.label_smoothing
    batch_size = args.batch_size or recipe.batch_size
    if args.pipeline == "torchvision":
        if cutout:
            raise SystemExit("--pipeline torchvision has no Cutout: pass --cutout 0")
        batches = torchvision_batches(data, batch_size, recipe_b, args.workers, args.seed)
    else:
        batches = resnet_native_batches(data, batch_size, recipe_b, cutout, args.seed)
    test_x = torch.from_dlpack(normalize_on_gpu(data.test_images, layout="NCHW", dtype="fp32"))
    test_x = test_x.contiguous(memory_format=torch.channels_last)
    test_y = torch.as_tensor(data.test_labels, device="cuda").long()
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = torch.nn.Identity()
    model = model.cuda().to(memory_format=torch.channels_last)
    total = args.epochs * len(batches)
    if recipe_b:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
        ours = build_schedule(recipe, types.SimpleNamespace(lr=lr), len(batches))  # the trainer's, per step
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: ours.lr_at(s) / lr)
    scaler = torch.amp.GradScaler()
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=smoothing)
    start = time.time()
    best = 0.0
    for epoch in range(args.epochs):
        model.train()
        tot_loss = torch.zeros((), device="cuda")
        correct = torch.zeros((), device="cuda")
        seen = 0
        for xt, yt in batches(epoch, args.epochs):
            xt = xt.contiguous(memory_format=torch.channels_last)
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
        best = max(best, acc)
        print(f"torch epoch {epoch + 1}/{args.epochs}: train loss {tot_loss.item() / seen:.4f} "
              f"acc {correct.item() / seen:.4f} | test acc {acc:.4f} | {time.time() - start:.1f}s")
    batches.close()
    print(json.dumps({"recipe": args.recipe, "pipeline": args.pipeline, "cutout": cutout,
                      "label_smoothing": smoothing, "seed": args.seed,
                      "torch_test_acc": acc, "best_test_acc": best, "epochs": args.epochs,
                      "wall_s": time.time() - start}))


class Batches:
    """len(): steps per epoch; calling it with (epoch, epochs) yields that epoch's (x, y) CUDA tensors."""

    def __init__(self, steps, generate, close=lambda: None):
        self.steps, self.generate, self.close = steps, generate, close

    def __len__(self):
        return self.steps

    def __call__(self, epoch, epochs):
        return self.generate(epoch, epochs)


def resnet_native_batches(data, batch_size, recipe_b, cutout, seed):
    train_x, train_y = cp.asarray(data.train_images), cp.asarray(data.train_labels, dtype=cp.int32)
    aa = None
    if recipe_b:
        from resnet_native.data.autoaugment_workers import AutoAugmentWorkers

        aa = AutoAugmentWorkers(data.train_images, seed=seed, crop_padding=4, flip=True)
        aa.prefetch(0)
        config = AugmentConfig(crop_padding=0, flip=False, cutout=cutout)  # the workers cropped and flipped
    else:
        config = AugmentConfig(crop_padding=4, flip=True, cutout=cutout)
    aug = GpuAugmenter(train_x, train_y, batch_size=batch_size, layout="NCHW", dtype="fp32", config=config,
                       seed=seed)

    def generate(epoch, epochs):
        source = None
        if aa is not None:
            source = cp.ascontiguousarray(cp.asarray(aa.result(epoch)))
            if epoch + 1 < epochs:
                aa.prefetch(epoch + 1)
        for x, y in aug.epoch(epoch, images=source):
            yield torch.from_dlpack(x), torch.from_dlpack(y).long()

    return Batches(len(aug), generate, aa.close if aa is not None else lambda: None)


def torchvision_batches(data, batch_size, recipe_b, workers, seed):
    from PIL import Image
    from torchvision import transforms as T

    steps = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
    if recipe_b:
        steps.append(T.AutoAugment(T.AutoAugmentPolicy.CIFAR10))
    transform = T.Compose(steps + [T.ToTensor(), T.Normalize(MEAN, STD)])

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return len(data.train_labels)

        def __getitem__(self, i):
            return transform(Image.fromarray(data.train_images[i])), int(data.train_labels[i])

    loader = torch.utils.data.DataLoader(Images(), batch_size=batch_size, shuffle=True, num_workers=workers,
                                         pin_memory=True, persistent_workers=True,
                                         generator=torch.Generator().manual_seed(seed))

    def generate(epoch, epochs):
        for x, y in loader:
            yield x.cuda(non_blocking=True), y.cuda(non_blocking=True)

    return Batches(len(loader), generate)


if __name__ == "__main__":
    main()
