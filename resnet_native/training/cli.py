"""The trainer's command line: `python -m resnet_native.train --recipe A|B|C [options]`.

Recipes live in resnet_native/recipes/*.yaml (or pass a path). Flags override the recipe's keys (OVERRIDES says which
flag sets which key; its type and choices are the key's setting's), and the result goes through the same checks as
the recipe itself. The run folder (--out, default runs/<recipe>-<model>) is described in training/loop.py; the last
line printed is the run's summary as one line of JSON. --nproc N > 1 starts N such processes, one per GPU
(resnet_native.distributed.launch); a process that one of them, torchrun, mpirun or Slurm placed (its World) takes
its GPU and joins the job (distributed.rank.join), and rank 0 alone prints and writes the run folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import pathlib
import sys
import time

from .._core import runtime
from .._core.runtime import NoGPUError
from ..data.cifar10 import SOURCE_NAMES, cache_folder, default_data_path, search_folders
from ..data.download import download
from ..distributed.launch import launch, without_option
from ..distributed.rank import join
from ..distributed.world import world_from_launcher_env
from .config import TrainConfig, recipe_config
from .loop import Trainer
from .settings import setting_field

# Command-line flag -> the recipe key it overrides, with its help.
OVERRIDES = (
    ("--model", "model", "network (recipe default: resnet18)"),
    ("--epochs", "epochs", "number of epochs"),
    ("--batch-size", "batch_size", "training batch size (recipe: 256)"),
    ("--eval-batch-size", "eval_batch_size", "evaluation batch size (recipe: 1000)"),
    ("--eval-every", "eval_every", "evaluate on the test set every this many epochs and after the last (recipe A: 10)"),
    ("--precision", "precision", "precision of weights and activations (recipe: fp16)"),
    ("--layout", "layout", "activation layout (recipe: NHWC)"),
    ("--seed", "seed", "seed of the initial weights, subset, shuffling and augmentation"),
    ("--subset", "subset", "train on a seeded random subset of this many training images"),
    ("--warmup-epochs", "schedule.warmup_epochs", "linear learning-rate warm-up length in epochs"),
    ("--schedule", "schedule.name", "learning rate after the warm-up: cosine, onecycle, linear (to zero) or constant"),
    ("--label-smoothing", "label_smoothing", "label smoothing of the training loss"),
    ("--zero-init-residual", "zero_init_residual", "start each residual block's last batch-norm scale at zero"),
    ("--lr", "optimizer.lr", "(peak) learning rate"),
    ("--weight-decay", "optimizer.weight_decay", "weight decay"),
    ("--norm-weight-decay", "optimizer.norm_weight_decay", "weight decay of the batch-norm scales and shifts "
                                                           "(default: --weight-decay's)"),
    ("--momentum", "optimizer.momentum", "SGD's momentum"),
    ("--cutout", "augment.cutout", "Cutout square side in pixels, 0 for none"),
    ("--crop-padding", "augment.crop_padding", "random-crop padding in pixels, 0 for no crop"),
    ("--alternate-flip", "augment.alternate_flip", "flip each training image in every other epoch instead of by a "
                                                   "coin each epoch"),
    ("--tta", "tta", "test-time augmentation of the evaluation, reported beside the plain accuracy: flip (the mean "
                     "logits of each image and its mirror), flip-shift (those and their copies shifted a pixel "
                     "diagonally each way) or none"),
    ("--ema-decay", "ema.decay", "evaluate and release a moving average of the weights with this decay per update "
                                 "(0: none)"),
    ("--ema-every", "ema.every", "training steps between updates of the moving average"),
    ("--ema-start", "ema.start", "fraction of the run's steps before the moving average starts"),
    ("--lookahead-decay", "lookahead.decay", "Lookahead: the slow weights' decay per update at the run's end "
                                             "(ramped up from 0; 0: none)"),
    ("--lookahead-every", "lookahead.every", "Lookahead: training steps between updates of the slow weights"),
    ("--progressive-size", "progressive.size", "side in pixels of the early epochs' downscaled images, 0 for none"),
    ("--progressive-until", "progressive.until", "fraction of the epochs trained at --progressive-size"),
    ("--progressive-mid-size", "progressive.mid_size", "side in pixels of a second stage, after --progressive-until "
                                                       "(larger than --progressive-size; 0 for none)"),
    ("--progressive-mid-until", "progressive.mid_until", "fraction of the epochs at the end of the second stage"),
    ("--stem-init", "stem.init", "the first convolution's start: random (torchvision's) or whiten (54 of its filters a "
                                 "whitening of the training images' 3 x 3 patches)"),
    ("--stem-frozen", "stem.frozen", "never update the first convolution (its filter gradient is skipped too)"),
    ("--engine", "engine", "convolution engine: graph (cuDNN 9's graph API), legacy, or auto (both timed per "
                           "problem; the recipes: graph)"),
    ("--deterministic", "deterministic",
     "only deterministic convolution algorithms (bit-reproducible runs; may be slower)"),
    ("--cuda-graph", "cuda_graph", "capture the training step in a CUDA graph and replay it (recipe: on)"),
    ("--eval-cuda-graph", "eval_cuda_graph", "capture the per-epoch evaluation in a CUDA graph (default: on)"),
    ("--allreduce-dtype", "allreduce_dtype",
     "data parallel: the gradients' dtype in the NCCL all-reduce (bf16 halves the traffic; recipe: fp32)"),
    ("--sync-bn", "sync_bn", "data parallel: batch norm with the statistics of all ranks' batches (default: per GPU)"),
    ("--overlap-allreduce", "overlap_allreduce",
     "data parallel: start each gradient bucket's all-reduce during backward (not with --sync-bn)"),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m resnet_native.train",
        description="Train a ResNet on CIFAR-10 with resnet_native (recipe YAML + overrides).")
    p.add_argument("--recipe", default="A", help="recipe name (A, B, C) or path to a YAML file (default A)")
    for flag, key, help_text in OVERRIDES:
        f = setting_field(TrainConfig, key)
        if f.metadata["kind"] is bool:
            p.add_argument(flag, dest=key, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            choices = f.metadata["choices"]
            p.add_argument(flag, dest=key, type=f.metadata["kind"], choices=choices, help=help_text,
                           metavar=None if choices else flag[2:].replace("-", "_").upper())
    p.add_argument("--data", help="CIFAR-10 source: tar archive, image folders, python or binary batches "
                                  "(default: $RESNET_NATIVE_CIFAR10, else one found in .data/ or the cache folder)")
    p.add_argument("--download", action="store_true",
                   help="when no --data is given and none is found, fetch the official CIFAR-10 into the cache "
                        "folder and train on it")
    p.add_argument("--cache-dir", help="where the decoded data set is cached and --download puts it (default: "
                                       "next to --data, else ~/.cache/resnet_native/cifar10)")
    p.add_argument("--out", help="run folder (default runs/<recipe>-<model>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last.npz")
    p.add_argument("--algos", metavar="FILE",
                   help="convolution algorithms to use (another run's algos.json) instead of timing them: with "
                        "--deterministic and the same seed, that run is repeated bit for bit")
    p.add_argument("--aa-workers", type=int, help="AutoAugment worker processes (default: CPUs - 1)")
    p.add_argument("--checkpoint-every", type=int, default=1, metavar="N",
                   help="write last.npz every N epochs and at the end, skipping one due while the writer is a "
                        "write behind (best.npz: whenever test accuracy improves)")
    p.add_argument("--log-every", type=int, default=50, help="steps between progress-bar updates")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--no-tensorboard", action="store_true", help="no TensorBoard event files")
    p.add_argument("--stop-after", type=int, metavar="N",
                   help="stop once N epochs are complete, as if interrupted (the schedule still spans --epochs)")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="processes (GPUs) of a data-parallel run on this host, one per GPU (default 1); under "
                        "torchrun, mpirun or Slurm leave it out: their variables place each rank")
    return p


def overrides(args: argparse.Namespace) -> dict:
    """The recipe keys the command line sets, as a nested mapping ({'optimizer': {'lr': 0.05}})."""
    out = {}
    for _, key, _ in OVERRIDES:
        value = getattr(args, key)
        if value is None:
            continue
        *parents, leaf = key.split(".")
        node = out
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return out


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    """The recipe with the command line's overrides applied, checked."""
    return recipe_config(args.recipe, overrides(args))


def default_out_dir(cfg: TrainConfig) -> pathlib.Path:
    return pathlib.Path("runs") / f"{cfg.name}-{cfg.model}"


def locate_data(args: argparse.Namespace, parser: argparse.ArgumentParser) -> pathlib.Path | None:
    """The CIFAR-10 source to train on: --data, else $RESNET_NATIVE_CIFAR10 or a copy found in the usual places;
    None when --download is to fetch it. Anything else is a usage error that says what to pass."""
    if args.data:
        path = pathlib.Path(args.data)
        if not path.exists():
            parser.error(f"--data: CIFAR-10 not found at {path}")
        return path
    path = default_data_path(args.cache_dir)
    if path is not None:
        if not path.exists():
            parser.error(f"$RESNET_NATIVE_CIFAR10: CIFAR-10 not found at {path}")
        return path
    if args.download:
        return None
    folders = " and ".join(f"{folder}/" for folder in search_folders(args.cache_dir))
    parser.error(f"CIFAR-10 not found: no --data, $RESNET_NATIVE_CIFAR10 is unset, and {folders} hold none of "
                 f"{', '.join(SOURCE_NAMES)}. Pass --data PATH, or --download to fetch the official CIFAR-10 into "
                 f"{cache_folder(args.cache_dir)}/")


def main(argv=None, started_at: float | None = None) -> dict:
    """The command. started_at: the time.perf_counter() reading the run's wall time counts from (the process's
    start, from `python -m resnet_native.train`); default: this call."""
    t0 = time.perf_counter() if started_at is None else started_at
    parser = build_parser()
    args = parser.parse_args(argv)
    world = check_world(args, parser)
    try:
        cfg = resolve_config(args)
    except ValueError as e:
        parser.error(str(e))
    data_path = locate_data(args, parser)
    if args.algos is not None and not pathlib.Path(args.algos).is_file():
        parser.error(f"--algos: no file {args.algos}")
    if args.nproc > 1:  # the children check the GPU and train; a download happens once, here
        child_argv = without_option(sys.argv[1:] if argv is None else argv, "--nproc")
        if data_path is None:
            child_argv += ["--data", str(fetch_data(args))]
        code = launch(args.nproc, child_argv)
        if code:
            raise SystemExit(code)
        return {"nproc": args.nproc}
    try:
        runtime.require_gpu()  # before any download, decoding or run folder
    except NoGPUError as e:
        parser.exit(1, f"{parser.prog}: {e}\n")
    if data_path is None:
        if world.world_size > 1:  # every rank of a foreign launcher's job would download at once
            parser.error(f"rank {world.rank} of {world.world_size}: no CIFAR-10 found, and the ranks of a job do "
                         f"not download; fetch it first (one process with --download) and pass --data")
        data_path = fetch_data(args)
    out = pathlib.Path(args.out) if args.out else default_out_dir(cfg)
    with contextlib.ExitStack() as job:
        store = job.enter_context(join(world)) if world.world_size > 1 else None
        trainer = Trainer(cfg, out, data_path=data_path, cache_dir=args.cache_dir,
                          progress=not args.no_progress and world.is_primary, tensorboard=not args.no_tensorboard,
                          aa_workers=args.aa_workers, log_every=args.log_every,
                          checkpoint_every=args.checkpoint_every, world=world, store=store, algorithms=args.algos)
        # The run's wall time and "seconds" count from t0: what came before the run is "start-up".
        summary = trainer.run(resume=args.resume, stop_after=args.stop_after, started_at=t0)
    if world.is_primary:  # the run folder is rank 0's
        print(summary_line(summary))
    return summary


def fetch_data(args: argparse.Namespace) -> pathlib.Path:
    """--download: the official CIFAR-10, fetched into the cache folder (once; a later run finds it there)."""
    return download(cache_folder(args.cache_dir), progress=not args.no_progress)


def check_world(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """This process's World (resnet_native.distributed.world: a single process, or one rank of a launcher's job);
    usage errors for a --nproc below 1, a --nproc > 1 inside a job, and a malformed launcher environment."""
    if args.nproc < 1:
        parser.error(f"--nproc: expected a number of processes >= 1, got {args.nproc}")
    try:
        world = world_from_launcher_env()
    except ValueError as e:
        parser.error(f"the launcher's environment: {e}")
    if world.world_size > 1 and args.nproc > 1:
        parser.error(f"--nproc {args.nproc}: this process already is rank {world.rank} of {world.world_size}")
    return world


def summary_line(summary: dict) -> str:
    """The final one-line JSON (strict JSON: NaN/inf become null)."""
    return json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()})
