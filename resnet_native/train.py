"""Train a ResNet on CIFAR-10 from a YAML recipe: `python -m resnet_native.train --recipe A|B [options]`.

Recipes live in resnet_native/recipes/*.yaml (or pass a path); command-line flags override them. A run folder
(--out, default runs/<recipe>-<model>) receives:
  config.yaml     the resolved configuration
  metrics.csv     per-epoch lr, train/test loss and accuracy, epoch time, images/s (TensorBoard files in
                  tensorboard/ when the tensorboard package imports)
  last.npz        the state after the latest epoch: weights, optimizer, schedule, scaler, RNG, metrics (--resume)
  best.npz        the same state at the epoch with the best test accuracy (what resnet_native.release ships)
  algos.json      the convolution algorithms chosen so far (resnet_native.conv.save_algorithm_cache), rewritten
                  with every checkpoint and loaded by --resume
  curves.png      loss and accuracy curves; summary.json: the final numbers (also printed as the last line)

Exact resume: the data pipeline's randomness is a function of (seed, epoch) only (see data/augment.py), and the
checkpoint holds every other piece of state, so a run resumed after epoch k sees the same batches and performs the
same updates as one that never stopped. The convolution algorithms are part of that state (another algorithm gives
other rounding): they are saved to algos.json with each checkpoint and loaded on --resume instead of re-timed.

Host synchronisation is kept to the minimum: loss and correct counts accumulate on the device, and are read every
--log-every steps for the progress bar and once per epoch.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import pathlib
import queue
import sys
import threading
import time
import warnings

import numpy as np

from .checkpoint import atomic_write_text, load_checkpoint, save_checkpoint
from .data.augment import STREAM_SUBSET, AugmentConfig, check_labels, epoch_rng
from .names import LAYOUTS
from .names import PRECISIONS as DTYPES

RECIPES_DIR = pathlib.Path(__file__).resolve().parent / "recipes"
MODELS = {"resnet18": "ResNet18", "resnet34": "ResNet34", "resnet50": "ResNet50", "resnet101": "ResNet101",
          "resnet152": "ResNet152"}
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "onecycle", "constant")
STATE_FORMAT = "resnet_native.train/1"
NUM_CLASSES = 10
ALGOS_FILE = "algos.json"  # the conv algorithm cache, next to the checkpoints
# Keys whose change makes a resumed run differ from the interrupted one.
RESUME_KEYS = ("model", "epochs", "batch_size", "dtype", "layout", "seed", "subset", "label_smoothing", "optimizer",
               "schedule", "augment")


# ----------------------------------------------------------------------------------------------------------------
# Recipes and configuration


def available_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def load_recipe(name_or_path) -> dict:
    """A recipe by name ('A', 'B') from the package, or from a YAML file path."""
    import yaml

    p = pathlib.Path(str(name_or_path))
    if not p.suffix:
        p = RECIPES_DIR / f"{name_or_path}.yaml"
        if not p.is_file():
            raise ValueError(f"recipe: unknown recipe {name_or_path!r} (available: {available_recipes()}, "
                             "or a path to a .yaml file)")
    with open(p) as f:
        recipe = yaml.safe_load(f)
    if not isinstance(recipe, dict):
        raise ValueError(f"recipe {p}: expected a YAML mapping at the top level")
    recipe.setdefault("name", p.stem)
    return recipe


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m resnet_native.train",
        description="Train a ResNet on CIFAR-10 with resnet_native (recipe YAML + overrides).")
    p.add_argument("--recipe", default="A", help="recipe name (A, B) or path to a YAML file (default A)")
    p.add_argument("--model", choices=sorted(MODELS), help="network (recipe default: resnet18)")
    p.add_argument("--epochs", type=int, help="number of epochs")
    p.add_argument("--data", help="CIFAR-10 source: tar archive, image folders, python or binary batches "
                                  "(default: $RESNET_NATIVE_CIFAR10 or .data/)")
    p.add_argument("--cache-dir", help="where the decoded data set is cached (default: next to --data, else "
                                       "~/.cache/resnet_native)")
    p.add_argument("--batch-size", type=int, help="training batch size (recipe: 256)")
    p.add_argument("--eval-batch-size", type=int, help="evaluation batch size (recipe: 1000)")
    p.add_argument("--out", help="run folder (default runs/<recipe>-<model>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last.npz")
    p.add_argument("--dtype", choices=DTYPES, help="precision (recipe: fp16)")
    p.add_argument("--layout", choices=LAYOUTS, help="activation layout (recipe: NHWC)")
    p.add_argument("--seed", type=int, help="seed of the initial weights, subset, shuffling and augmentation")
    p.add_argument("--subset", type=int, help="train on a seeded random subset of this many training images")
    p.add_argument("--warmup-epochs", type=float, help="linear learning-rate warm-up length in epochs")
    p.add_argument("--label-smoothing", type=float, help="label smoothing of the training loss")
    p.add_argument("--lr", type=float, help="(peak) learning rate")
    p.add_argument("--weight-decay", type=float, help="weight decay")
    p.add_argument("--cutout", type=int, metavar="SIZE", help="Cutout square side in pixels, 0 for none")
    p.add_argument("--deterministic", action="store_true",
                   help="only deterministic convolution algorithms (bit-reproducible runs; may be slower)")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="capture the training step in a CUDA graph and replay it (recipe: on)")
    p.add_argument("--aa-workers", type=int, help="AutoAugment worker processes (default: CPUs - 1)")
    p.add_argument("--checkpoint-every", type=int, default=1, metavar="N",
                   help="write last.npz every N epochs and at the end (best.npz: whenever test accuracy improves)")
    p.add_argument("--log-every", type=int, default=50, help="steps between progress-bar updates (host syncs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-tensorboard", action="store_true", help="no TensorBoard event files")
    p.add_argument("--stop-after", type=int, metavar="N",
                   help="stop once N epochs are complete, as if interrupted (the schedule still spans --epochs)")
    return p


def resolve_config(args: argparse.Namespace) -> dict:
    """The recipe with the command line's overrides applied, validated."""
    cfg = copy.deepcopy(load_recipe(args.recipe))
    cfg.setdefault("optimizer", {})
    cfg.setdefault("schedule", {})
    cfg.setdefault("augment", {})
    simple = {"model": args.model, "epochs": args.epochs, "batch_size": args.batch_size,
              "eval_batch_size": args.eval_batch_size, "dtype": args.dtype, "layout": args.layout,
              "seed": args.seed, "subset": args.subset, "label_smoothing": args.label_smoothing,
              "deterministic": True if args.deterministic else None, "cuda_graph": args.cuda_graph}
    for k, v in simple.items():
        if v is not None:
            cfg[k] = v
    if args.lr is not None:
        cfg["optimizer"]["lr"] = args.lr
    if args.weight_decay is not None:
        cfg["optimizer"]["weight_decay"] = args.weight_decay
    if args.warmup_epochs is not None:
        cfg["schedule"]["warmup_epochs"] = args.warmup_epochs
    if args.cutout is not None:
        cfg["augment"]["cutout"] = args.cutout
    return validate_config(cfg)


def _number(cfg, key, kind, where, minimum=None, allow_none=False):
    v = cfg.get(key)
    if v is None and allow_none:
        return None
    try:
        if isinstance(v, bool) or v is None:
            raise TypeError
        out = kind(v)
        if kind is int and out != v:
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError(f"{where}{key}: expected {'an int' if kind is int else 'a number'}, got {v!r}") from None
    if minimum is not None and out < minimum:
        raise ValueError(f"{where}{key}: expected >= {minimum}, got {out}")
    cfg[key] = out
    return out


def _boolean(cfg, key, where):
    """Only true/false: bool("false") is True, so a quoted YAML value or a string override must not pass."""
    v = cfg.get(key)
    if not isinstance(v, bool):
        raise ValueError(f"{where}{key}: expected true or false, got {v!r}")
    return v


def validate_config(cfg: dict) -> dict:
    """Fill defaults, coerce numbers (YAML reads 5e-4 as a string), and reject bad values with the key's name."""
    cfg = copy.deepcopy(cfg)
    cfg.setdefault("name", "custom")
    cfg.setdefault("model", "resnet18")
    cfg.setdefault("batch_size", 256)
    cfg.setdefault("eval_batch_size", 1000)
    cfg.setdefault("dtype", "fp16")
    cfg.setdefault("layout", "NHWC")
    cfg.setdefault("seed", 0)
    cfg.setdefault("subset", None)
    cfg.setdefault("label_smoothing", 0.0)
    if cfg.get("deterministic") is None:
        cfg["deterministic"] = False
    _boolean(cfg, "deterministic", "")
    cfg.setdefault("cuda_graph", True)
    _boolean(cfg, "cuda_graph", "")
    if cfg["model"] not in MODELS:
        raise ValueError(f"model: expected one of {sorted(MODELS)}, got {cfg['model']!r}")
    if cfg["dtype"] not in DTYPES:
        raise ValueError(f"dtype: expected one of {DTYPES}, got {cfg['dtype']!r}")
    if cfg["layout"] not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {cfg['layout']!r}")
    if "epochs" not in cfg:
        raise ValueError("epochs: missing (set it in the recipe or with --epochs)")
    _number(cfg, "epochs", int, "", 1)
    _number(cfg, "batch_size", int, "", 1)
    _number(cfg, "eval_batch_size", int, "", 1)
    _number(cfg, "seed", int, "", 0)
    _number(cfg, "subset", int, "", 1, allow_none=True)
    ls = _number(cfg, "label_smoothing", float, "", 0.0)
    if ls >= 1.0:
        raise ValueError(f"label_smoothing: expected < 1, got {ls}")

    o = cfg.setdefault("optimizer", {})
    o.setdefault("name", "sgd")
    if o["name"] not in OPTIMIZERS:
        raise ValueError(f"optimizer.name: expected one of {OPTIMIZERS}, got {o['name']!r}")
    if "lr" not in o:
        raise ValueError("optimizer.lr: missing")
    _number(o, "lr", float, "optimizer.", 0.0)
    if o["name"] == "sgd":
        o.setdefault("momentum", 0.9)
        o.setdefault("nesterov", False)
        o.setdefault("weight_decay", 0.0)
        _number(o, "momentum", float, "optimizer.", 0.0)
        _boolean(o, "nesterov", "optimizer.")
    else:
        o.setdefault("betas", [0.9, 0.999])
        o.setdefault("eps", 1e-8)
        o.setdefault("weight_decay", 0.01)
        betas = o["betas"]
        if not isinstance(betas, list | tuple) or len(betas) != 2:
            raise ValueError(f"optimizer.betas: expected two numbers, got {betas!r}")
        o["betas"] = [float(b) for b in betas]
        _number(o, "eps", float, "optimizer.", 0.0)
    _number(o, "weight_decay", float, "optimizer.", 0.0)

    s = cfg.setdefault("schedule", {})
    s.setdefault("name", "cosine")
    s.setdefault("warmup_epochs", 0)
    if s["name"] not in SCHEDULES:
        raise ValueError(f"schedule.name: expected one of {SCHEDULES}, got {s['name']!r}")
    w = _number(s, "warmup_epochs", float, "schedule.", 0.0)
    if w >= cfg["epochs"]:
        raise ValueError(f"schedule.warmup_epochs: {w} must be shorter than epochs ({cfg['epochs']})")

    a = cfg.setdefault("augment", {})
    a.setdefault("crop_padding", 4)
    a.setdefault("flip", True)
    a.setdefault("cutout", 0)
    a.setdefault("autoaugment", False)
    _number(a, "crop_padding", int, "augment.", 0)
    _number(a, "cutout", int, "augment.", 0)
    _boolean(a, "flip", "augment.")
    _boolean(a, "autoaugment", "augment.")
    return cfg


def augment_config(cfg) -> AugmentConfig:
    """What the GPU kernel does. With AutoAugment the CPU workers crop and flip first (torchvision's order:
    crop -> flip -> AutoAugment), so the kernel keeps only Cutout and the normalisation."""
    a = cfg["augment"]
    if a["autoaugment"]:
        return AugmentConfig(crop_padding=0, flip=False, cutout=a["cutout"])
    return AugmentConfig(crop_padding=a["crop_padding"], flip=a["flip"], cutout=a["cutout"])


def subset_indices(n: int, subset, seed: int) -> np.ndarray:
    """The training images a --subset run uses: a seeded random choice, in data-set order."""
    if subset is None or subset >= n:
        return np.arange(n)
    return np.sort(epoch_rng(seed, 0, STREAM_SUBSET).permutation(n)[:subset])


def warmup_steps(cfg, steps_per_epoch: int) -> int:
    return int(round(cfg["schedule"]["warmup_epochs"] * steps_per_epoch))


# ----------------------------------------------------------------------------------------------------------------
# The adapter to the model/optimizer API (the one place that knows its constructor signatures)


def make_deterministic(model) -> None:
    """Make every convolution (Conv2d, and Linear, which runs as one) pick only deterministic algorithms
    (bit-reproducible runs, e.g. to check --resume). They build their ConvSpec lazily on first use: call this
    before the first forward."""
    from .layers.conv2d import Conv2d
    from .layers.linear import Linear

    for _, m in model.named_modules():
        if isinstance(m, Conv2d | Linear):
            m.deterministic = True


def build_model(cfg):
    import resnet_native as rn

    model = getattr(rn, MODELS[cfg["model"]])(num_classes=10, stem="cifar", layout=cfg["layout"], precision=cfg["dtype"],
                                              seed=cfg["seed"])
    if cfg.get("deterministic"):
        make_deterministic(model)
    model.cuda()
    return model


def build_optimizer(cfg, model):
    from . import optim

    o = cfg["optimizer"]
    if o["name"] == "sgd":
        return optim.SGD(model.parameters(), lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"],
                         weight_decay=o["weight_decay"])
    return optim.AdamW(model.parameters(), lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                       weight_decay=o["weight_decay"])


def build_schedule(cfg, optimizer, steps_per_epoch: int):
    """Per-step schedule over the whole run: linear warm-up (if any), then cosine / one-cycle / constant."""
    from . import optim

    total = cfg["epochs"] * steps_per_epoch
    warm = warmup_steps(cfg, steps_per_epoch)
    name = cfg["schedule"]["name"]
    main = None
    if name == "cosine":
        main = optim.CosineSchedule(optimizer, total - warm)
    elif name == "onecycle":
        main = optim.OneCycleSchedule(optimizer, total - warm)
    if warm:
        return optim.WarmupSchedule(optimizer, warm, after=main)
    return main


def build_scaler(cfg):
    from . import optim

    return optim.GradScaler() if cfg["dtype"] == "fp16" else None


def build_train_step(cfg, model, optimizer, scaler):
    from .step import TrainStep

    return TrainStep(model, optimizer, label_smoothing=cfg["label_smoothing"], scaler=scaler,
                     cuda_graph=cfg["cuda_graph"])


def current_lr(optimizer) -> float:
    lr = getattr(optimizer, "lr", None)
    if lr is None and hasattr(optimizer, "param_groups"):
        lr = optimizer.param_groups[0]["lr"]
    return float(lr) if lr is not None else float("nan")


def _state(obj):
    return obj.state_dict() if obj is not None else None


# ----------------------------------------------------------------------------------------------------------------
# Evaluation


def evaluate(model, x_all, y_all, batch_size: int) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over a normalised device set, without augmentation; one host sync. The loss
    is the training loss's own code (SoftmaxCrossEntropy, no smoothing), summed on the device."""
    import cupy

    from .losses import SoftmaxCrossEntropy

    model.eval()
    loss_fn = SoftmaxCrossEntropy()
    loss_sum = cupy.zeros((), cupy.float64)
    correct_sum = cupy.zeros((), cupy.float64)
    n = len(y_all)
    for s in range(0, n, batch_size):
        y = y_all[s:s + batch_size]
        loss, correct = loss_fn.forward(model.forward(x_all[s:s + batch_size], False, copy=False), y, train=False)
        loss_sum += loss * len(y)
        correct_sum += correct
    return float(loss_sum) / n, float(correct_sum) / n


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints in the background


class CheckpointWriter:
    """Serialises and fsyncs checkpoints on a background thread so the GPU keeps training meanwhile.

    submit() takes host copies (state_dicts are NumPy) and returns at once; a later submit waits for the one before,
    and flush() for all of them. 'best' is published with a hard link to the file just written, when possible, so
    an improving epoch costs one write, not two.
    """

    def __init__(self):
        self._q = queue.Queue(maxsize=1)
        self._error = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            job = self._q.get()
            if job is None:
                self._q.task_done()
                return
            try:
                path, state, best_path = job
                save_checkpoint(path, state)
                if best_path is not None:
                    _publish_copy(path, best_path, state)
            except BaseException as e:  # reported on the next submit/flush
                self._error = e
            finally:
                self._q.task_done()

    def _raise(self):
        if self._error is not None:
            e, self._error = self._error, None
            raise RuntimeError(f"writing a checkpoint failed: {e}") from e

    def submit(self, path, state, best_path=None):
        self._raise()
        self._q.put((pathlib.Path(path), state, best_path))

    def flush(self):
        self._q.join()
        self._raise()

    def close(self):
        try:
            self.flush()
        finally:  # stop the thread even when a stored error is raised
            self._q.put(None)
            self._thread.join()


def _publish_copy(src: pathlib.Path, dst: pathlib.Path, state) -> None:
    tmp = dst.with_name(f".{dst.name}.link")
    try:
        if tmp.exists():
            tmp.unlink()
        os.link(src, tmp)
        os.replace(tmp, dst)
    except OSError:  # no hard links here: write it again
        save_checkpoint(dst, state)


# ----------------------------------------------------------------------------------------------------------------
# The convolution algorithm cache (part of what makes --resume exact)


def save_algorithm_cache(path: pathlib.Path) -> None:
    """Write the conv algorithm choices beside a checkpoint; a failure only warns (the checkpoint still counts)."""
    from . import conv

    try:
        conv.save_algorithm_cache(path)
    except Exception as e:  # the cache is an optimisation: never stop training for it
        warnings.warn(f"could not write the convolution algorithm cache {path}: {e}", RuntimeWarning, stacklevel=2)


def load_algorithm_cache(path: pathlib.Path) -> None:
    """Reuse a run's conv algorithm choices (before the first forward); a missing or unreadable file only warns,
    and the algorithms are then timed again."""
    from . import conv

    if not path.is_file():
        warnings.warn(f"--resume: no convolution algorithm cache {path}; algorithms are timed again, so the "
                      "resumed run may round differently", RuntimeWarning, stacklevel=2)
        return
    try:
        conv.load_algorithm_cache(path)
    except Exception as e:
        warnings.warn(f"--resume: could not load the convolution algorithm cache {path}: {e}", RuntimeWarning,
                      stacklevel=2)


# ----------------------------------------------------------------------------------------------------------------
# The trainer


def _progress(total, desc, enabled):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="step", leave=False, dynamic_ncols=True, file=sys.stderr)


def _compatible(saved: dict, cfg: dict) -> list[str]:
    return [k for k in RESUME_KEYS if saved.get(k) != cfg.get(k)]


class Trainer:
    """One training run: data on the GPU, model, optimizer, schedule, scaler, logging and checkpoints."""

    def __init__(self, cfg: dict, out_dir, *, data=None, data_path=None, cache_dir=None, progress: bool = True,
                 tensorboard: bool = True, aa_workers=None, log_every: int = 50, checkpoint_every: int = 1):
        self.cfg = validate_config(cfg)
        self.out = pathlib.Path(out_dir)
        self.data = data
        self.data_path = data_path
        self.cache_dir = cache_dir
        self.progress = progress
        self.tensorboard = tensorboard
        self.aa_workers = aa_workers
        self.log_every = max(1, int(log_every))
        self.checkpoint_every = max(1, int(checkpoint_every))

    def _load_data(self):
        if self.data is None:
            from .data.cifar10 import load_cifar10

            self.data = load_cifar10(self.data_path, cache_dir=self.cache_dir)
        d = self.data
        # Once, on the host, before any worker forks: an out-of-range label only skews loss/accuracy on the GPU.
        check_labels(d.train_labels, NUM_CLASSES, "train labels")
        check_labels(d.test_labels, NUM_CLASSES, "test labels")
        idx = subset_indices(len(d.train_labels), self.cfg["subset"], self.cfg["seed"])
        return d.train_images[idx], d.train_labels[idx], d.test_images, d.test_labels

    def run(self, *, resume: bool = False, stop_after: int | None = None) -> dict:
        t_start = time.perf_counter()
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        last_path, best_path = self.out / "last.npz", self.out / "best.npz"
        state = None
        if resume:
            if last_path.is_file():
                state = load_checkpoint(last_path)
                if state.get("format") != STATE_FORMAT:
                    raise ValueError(f"{last_path}: not a training state of this version ({state.get('format')!r})")
                diff = _compatible(state["config"], cfg)
                if diff:
                    raise ValueError(f"--resume: the configuration differs from the checkpoint's in {diff}; "
                                     "an exact resume needs the same settings")
            else:
                print(f"resume: no checkpoint in {self.out}; starting from scratch", file=sys.stderr)
        train_x, train_y, test_x, test_y = self._load_data()

        # Worker processes fork before this process touches CUDA.
        aa = None
        if cfg["augment"]["autoaugment"]:
            from .data.autoaugment import AutoAugmentWorkers

            a = cfg["augment"]
            aa = AutoAugmentWorkers(train_x, seed=cfg["seed"], workers=self.aa_workers,
                                    crop_padding=a["crop_padding"], flip=a["flip"])
        try:
            return self._run(state, train_x, train_y, test_x, test_y, aa, stop_after, t_start, last_path, best_path)
        finally:
            if aa is not None:
                aa.close()

    def _run(self, state, train_x, train_y, test_x, test_y, aa, stop_after, t_start, last_path, best_path):
        import cupy

        import resnet_native as rn

        from .data.augment import GpuAugmenter, normalize_on_gpu
        from .metrics_log import MetricsLog, plot_curves

        rn.require_gpu()
        cfg = self.cfg
        algos_path = self.out / ALGOS_FILE
        if state is not None:  # --resume: the interrupted run's algorithms, before the first forward
            load_algorithm_cache(algos_path)
        epochs = cfg["epochs"]
        model = build_model(cfg)
        optimizer = build_optimizer(cfg, model)
        augmenter = GpuAugmenter(train_x, train_y, batch_size=cfg["batch_size"], layout=cfg["layout"],
                                 dtype=cfg["dtype"], config=augment_config(cfg), seed=cfg["seed"])
        steps_per_epoch = len(augmenter)
        if steps_per_epoch == 0:
            raise ValueError(f"batch_size {cfg['batch_size']} is larger than the {len(train_y)} training images")
        schedule = build_schedule(cfg, optimizer, steps_per_epoch)
        scaler = build_scaler(cfg)
        train_step = build_train_step(cfg, model, optimizer, scaler)
        test_inputs = normalize_on_gpu(test_x, layout=cfg["layout"], dtype=cfg["dtype"])
        test_labels = cupy.asarray(test_y, dtype=cupy.int32)

        start_epoch, history = 0, []
        best = {"test_acc": -1.0, "epoch": -1}
        train_time = 0.0
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            if schedule is not None:
                schedule.load_state_dict(state["schedule"])
            if scaler is not None:
                scaler.load_state_dict(state["scaler"])
            start_epoch = int(state["epoch"]) + 1
            history = list(state["metrics"]["history"])
            best = dict(state["metrics"]["best"])
            train_time = float(state["metrics"]["train_time_s"])

        atomic_write_text(self.out / "config.yaml", _yaml_dump(cfg))
        log = MetricsLog(self.out, rows=history, tensorboard=self.tensorboard)
        writer = CheckpointWriter()
        end_epoch = epochs if stop_after is None else max(start_epoch, min(epochs, stop_after))
        n_per_epoch = steps_per_epoch * cfg["batch_size"]
        if aa is not None and start_epoch < end_epoch:
            aa.prefetch(start_epoch)
        try:
            for epoch in range(start_epoch, end_epoch):
                source = None
                if aa is not None:
                    # One host-to-device copy of this epoch's AutoAugmented set; the workers then start on the next.
                    source = cupy.ascontiguousarray(cupy.asarray(aa.result(epoch)))
                    if epoch + 1 < end_epoch:
                        aa.prefetch(epoch + 1)
                lr_start = current_lr(optimizer)
                cupy.cuda.get_current_stream().synchronize()
                t0 = time.perf_counter()
                model.train()  # the step's device totals start at zero: every epoch's last read resets them
                bar = _progress(steps_per_epoch, f"epoch {epoch + 1}/{epochs}", self.progress)
                for i, (x, y) in enumerate(augmenter.epoch(epoch, images=source)):
                    train_step.run(x, y)  # loss and correct count stay on the device, summed
                    if schedule is not None:
                        schedule.step()
                    if bar is not None and ((i + 1) % self.log_every == 0 or i + 1 == steps_per_epoch):
                        loss_sum, correct_sum, seen = train_step.read_totals()
                        bar.update(i + 1 - bar.n)
                        bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc=f"{correct_sum / seen:.4f}",
                                        img_s=f"{seen / (time.perf_counter() - t0):.0f}")
                loss_sum, correct_sum, seen = train_step.read_totals(reset=True)  # waits for the epoch's steps
                train_loss, train_acc = loss_sum / seen, correct_sum / seen
                epoch_time = time.perf_counter() - t0
                if bar is not None:
                    bar.close()
                train_time += epoch_time
                test_loss, test_acc = evaluate(model, test_inputs, test_labels, cfg["eval_batch_size"])
                row = {"epoch": epoch + 1, "lr": lr_start, "train_loss": train_loss, "train_acc": train_acc,
                       "test_loss": test_loss, "test_acc": test_acc, "epoch_time_s": epoch_time,
                       "images_per_s": n_per_epoch / epoch_time}
                log.log_epoch(row)
                is_best = test_acc > best["test_acc"]
                if is_best:
                    best = {"test_acc": test_acc, "epoch": epoch + 1}
                print(f"epoch {epoch + 1}/{epochs}: train loss {train_loss:.4f} acc {train_acc:.4f} | test loss "
                      f"{test_loss:.4f} acc {test_acc:.4f} | {row['images_per_s']:.0f} img/s", file=sys.stderr)
                due = (epoch + 1) % self.checkpoint_every == 0 or epoch + 1 == end_epoch
                if not (due or is_best):
                    continue
                state = {
                    "format": STATE_FORMAT,
                    "epoch": epoch,
                    "config": cfg,
                    "model": model.state_dict(),
                    "optimizer": _state(optimizer),
                    "schedule": _state(schedule),
                    "scaler": _state(scaler),
                    # The data pipeline draws from (seed, epoch) alone: these two numbers are its whole RNG state.
                    "rng": {"seed": cfg["seed"], "next_epoch": epoch + 1},
                    "metrics": {"history": [dict(r) for r in log.rows], "best": dict(best),
                                "train_time_s": train_time},
                }
                if due:
                    writer.submit(last_path, state, best_path if is_best else None)
                else:
                    writer.submit(best_path, state)
                save_algorithm_cache(algos_path)
            writer.flush()
        except BaseException:
            # The training error is the one to report: a checkpoint-write failure the writer still holds is only
            # logged, not raised over it.
            try:
                writer.close()
            except Exception as e:
                print(f"warning: {e} (while handling the error below)", file=sys.stderr)
            raise
        else:
            writer.close()
        finally:
            log.close()

        completed = end_epoch >= epochs
        rows = log.rows
        final = rows[-1] if rows else {}
        summary = {
            "recipe": cfg["name"], "model": cfg["model"], "dtype": cfg["dtype"], "layout": cfg["layout"],
            "epochs": epochs, "epochs_done": len(rows), "completed": completed,
            "test_acc": final.get("test_acc"), "best_test_acc": best["test_acc"] if rows else None,
            "best_epoch": best["epoch"] if rows else None,
            "train_images": int(len(train_y)), "train_time_s": train_time,
            "train_images_per_s": (len(rows) * n_per_epoch / train_time) if train_time > 0 else None,
            "wall_time_s": time.perf_counter() - t_start,
            "parameters": int(model.num_parameters()) if hasattr(model, "num_parameters") else None,
            "out": str(self.out),
        }
        if rows:
            summary["plot_backend"] = plot_curves(rows, self.out / "curves.png",
                                                  title=f"recipe {cfg['name']} {cfg['model']} {cfg['dtype']}")
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")
        self.model = model
        return summary


def _yaml_dump(cfg) -> str:
    import yaml

    return yaml.safe_dump(cfg, sort_keys=False)


def default_out_dir(cfg) -> pathlib.Path:
    return pathlib.Path("runs") / f"{cfg['name']}-{cfg['model']}"


def main(argv=None) -> dict:
    t0 = time.perf_counter()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = resolve_config(args)
    except ValueError as e:
        parser.error(str(e))
    from .data.cifar10 import default_data_path

    data_path = args.data or default_data_path()
    if data_path is None or not pathlib.Path(data_path).exists():
        where = data_path or "no --data, no $RESNET_NATIVE_CIFAR10, nothing in .data/"
        parser.error(f"--data: CIFAR-10 not found ({where}); pass --data PATH, or fetch it with "
                     "python -c 'import resnet_native.data as d; d.download()'")
    out = pathlib.Path(args.out) if args.out else default_out_dir(cfg)
    trainer = Trainer(cfg, out, data_path=data_path, cache_dir=args.cache_dir, progress=not args.no_progress,
                      tensorboard=not args.no_tensorboard, aa_workers=args.aa_workers, log_every=args.log_every,
                      checkpoint_every=args.checkpoint_every)
    summary = trainer.run(resume=args.resume, stop_after=args.stop_after)
    summary["wall_time_s"] = time.perf_counter() - t0  # the whole command, imports and data loading included
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    print(summary_line(summary))
    return summary


def summary_line(summary: dict) -> str:
    """The final one-line JSON (strict JSON: NaN/inf become null)."""
    return json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()})


if __name__ == "__main__":
    main()
