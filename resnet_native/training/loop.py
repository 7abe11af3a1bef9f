"""One training run, read top to bottom in Trainer.run: check a checkpoint to resume against the configuration, load
the data, build the network, optimizer, schedule, loss scaler and training step, then per epoch train, evaluate,
log and checkpoint; last, the summary.

A run folder receives:
  config.yaml     the resolved configuration
  metrics.csv     per-epoch lr, train/test loss and accuracy, epoch time, images/s (TensorBoard files in
                  tensorboard/ when the tensorboard package imports)
  last.npz        the state after the latest epoch: weights, optimizer, schedule, scaler, RNG, metrics (--resume)
  best.npz        the same state at the epoch with the best test accuracy (what resnet_native.release ships)
  algos.json      the convolution algorithms chosen so far (resnet_native.conv.save_algorithm_cache), rewritten
                  with every checkpoint and loaded by --resume
  curves.png      loss and accuracy curves; summary.json: the final numbers

Exact resume: the data pipeline's randomness is a function of (seed, epoch) only (see data/augment.py), and the
checkpoint holds every other piece of state, so a run resumed after epoch k sees the same batches and performs the
same updates as one that never stopped. The convolution algorithms are part of that state (another algorithm gives
other rounding): they are saved to algos.json with each checkpoint and loaded on --resume instead of re-timed.

Data parallel (world: a resnet_native.distributed World of world_size > 1, with its rendezvous Store): every rank
trains on its shard of each epoch (distributed.shard_indices: the same seed and epoch everywhere, so the shards are
disjoint) with a per-rank batch of batch_size / world_size, and its TrainStep averages the gradients over the ranks
(a GradientAllReduce: NCCL on the GPU, the Store on the host) before the update; batch norm statistics stay per
rank, or (sync_bn) are those of all ranks' batches. Only rank 0 writes the run folder (and evaluates: the others'
test metrics are NaN, their train metrics those of their own shard); with --resume every rank loads rank 0's
last.npz, after a barrier. world_size 1 is the single-process run, with no store and no all-reduce unless one is
given (a one-rank NCCL run, checked on one GPU).

Host synchronisation is kept to the minimum: loss and correct counts accumulate on the device, and are read every
log_every steps for the progress bar and once per epoch.
"""

from __future__ import annotations

import contextlib
import json
import math
import pathlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..checkpoint import atomic_write_text, load_checkpoint
from ..data.augment import check_labels
from ..data.cifar10 import CIFAR10Data
from ..models.registry import NUM_CLASSES
from ..names import whole_number
from .builders import (
    augment_config,
    autoaugment_workers,
    build_model,
    build_optimizer,
    build_scaler,
    build_schedule,
    build_train_step,
    partial_batch_search,
    subset_indices,
)
from .checkpoint_writer import AlgorithmCacheFile, CheckpointWriter, load_algorithm_cache
from .config import TrainConfig, resume_differences
from .epoch_upload import EpochUpload
from .evaluation import Evaluation
from .snapshot import HostSnapshot
from .stopwatch import Stopwatch
from .warm_start import load_while_priming

STATE_FORMAT = "resnet_native.train/1"
ALGOS_FILE = "algos.json"  # the conv algorithm cache, next to the checkpoints
# Every file the run writes into its folder (their stale temporaries are removed when a run starts or resumes).
BARRIER_TIMEOUT_S = 600.0  # a rank waits this long for the others at the resume and end-of-run barriers
RUN_FILES = ("config.yaml", "metrics.csv", "last.npz", "best.npz", ALGOS_FILE, "curves.png", "summary.json")


class Trainer:
    """One training run of a TrainConfig (or a mapping of one) into the run folder out_dir.

    data: a CIFAR10Data to train on, else load_cifar10(data_path, cache_dir=cache_dir). progress: a progress bar
    per epoch; tensorboard: TensorBoard event files (when the package is installed); aa_workers: AutoAugment worker
    processes; log_every: steps between progress-bar updates (host syncs); checkpoint_every: epochs between writes
    of last.npz (best.npz is written whenever the test accuracy improves; a due write is skipped while the writer
    still has one queued, except the last epoch's); algorithms: an algorithm cache file (a
    run's algos.json) loaded before a run that does not resume, so a same-seed --deterministic run repeats that
    run's rounding.
    """

    def __init__(self, cfg, out_dir, *, data=None, data_path=None, cache_dir=None, progress: bool = True,
                 tensorboard: bool = True, aa_workers=None, log_every: int = 50, checkpoint_every: int = 1,
                 world=None, store=None, allreduce=None, algorithms=None):
        from ..distributed.world import World

        self.cfg = cfg if isinstance(cfg, TrainConfig) else TrainConfig.from_dict(cfg)
        self.world = World() if world is None else world
        if not isinstance(self.world, World):
            raise TypeError(f"world: expected a resnet_native.distributed World, got {type(world).__name__}")
        self.store = store
        self.allreduce = allreduce
        n = self.world.world_size
        if n > 1 and store is None:
            raise ValueError(f"store: rank {self.world.rank} of {n} needs the job's Store (distributed.rendezvous)")
        if self.cfg.batch_size % n:
            raise ValueError(f"batch_size: {self.cfg.batch_size} does not divide among world_size {n} ranks "
                             f"(each rank trains on batch_size / world_size images per step)")
        self.out = pathlib.Path(out_dir)
        self.data = data
        self.data_path = data_path
        self.cache_dir = cache_dir
        self.progress = progress
        self.tensorboard = tensorboard
        self.aa_workers = aa_workers
        self.log_every = max(1, whole_number("log_every", log_every))
        self.checkpoint_every = max(1, whole_number("checkpoint_every", checkpoint_every))
        self.algorithms = None if algorithms is None else pathlib.Path(algorithms)

    def run(self, *, resume: bool = False, stop_after: int | None = None) -> dict:
        """Train up to cfg.epochs (resume: continue from out_dir/last.npz), or stop once stop_after epochs are
        complete, as if interrupted (the schedule still spans cfg.epochs). Returns the summary (summary.json)."""
        import resnet_native as rn

        from ..metrics_log import MetricsLog

        t_start = time.perf_counter()
        cfg = self.cfg
        primary = self.world.is_primary
        if resume and self.store is not None:  # rank 0's last.npz is complete: its last run ended in a barrier
            self.store.barrier("resume", BARRIER_TIMEOUT_S)
        state = self._resumed_state() if resume else None
        rn.require_gpu()  # before any data is decoded or the run folder is made
        spent = Stopwatch()  # where this process's wall time goes (the summary's "seconds")
        prime = state is None and self.algorithms is None and self.world.world_size == 1
        data = self._load_data(spent, prime)
        if primary:
            self.out.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:  # closed in reverse: writer, metrics log, upload, workers
            aa = stack.enter_context(autoaugment_workers(cfg, data.train_images, self.aa_workers))
            upload = stack.enter_context(EpochUpload(aa)) if aa is not None else None
            if state is not None:  # --resume: the interrupted run's algorithms, before the first forward
                load_algorithm_cache(self.out / ALGOS_FILE)
            elif self.algorithms is not None:  # another run's: its rounding, bit for bit (with --deterministic)
                rn.conv.load_algorithm_cache(self.algorithms)
            with spent("build"):
                parts = _build(cfg, data, self.world, self.store, self.allreduce)
            progress = _Progress()
            if state is not None:
                parts.load_state_dict(state)
                progress = _Progress.from_state(state)
            if primary:
                atomic_write_text(self.out / "config.yaml", _yaml_dump(cfg.to_dict()))
            end_epoch = cfg.epochs if stop_after is None else max(progress.next_epoch, min(cfg.epochs, stop_after))
            if aa is not None and progress.next_epoch < end_epoch:
                aa.prefetch(progress.next_epoch)
            rows = state["metrics"]["history"] if state else None
            if primary:
                log = stack.enter_context(contextlib.closing(MetricsLog(self.out, rows=rows,
                                                                        tensorboard=self.tensorboard)))
                writer = stack.enter_context(CheckpointWriter(self.out, RUN_FILES))
            else:  # the other ranks keep their rows and write nothing
                log, writer = _RowsOnly(rows), None
            evaluation = Evaluation(parts.model, parts.test_inputs, parts.test_labels, cfg.eval_batch_size,
                                    cuda_graph=cfg.eval_cuda_graph)
            snapshots, algos, skipped = HostSnapshot(), AlgorithmCacheFile(self.out / ALGOS_FILE), 0
            # The CUDA context, the AutoAugment workers' start, the metrics log and writer, the evaluation.
            spent.add_untracked("set-up", t_start)
            for epoch in range(progress.next_epoch, end_epoch):
                # With AutoAugment, the wait for the CPU workers' copy of this epoch is its own figure (the
                # upload is queued on the stream, and waited for by the epoch's first synchronisation).
                with spent("autoaugment") if upload is not None else contextlib.nullcontext():
                    images = upload(epoch, end_epoch) if upload is not None else None
                lr = float(parts.optimizer.lr)
                with spent("train"):
                    train_loss, train_acc, epoch_time = self._train_epoch(parts, epoch, images)
                with spent("evaluate"):
                    if not primary:
                        test_loss, test_acc = math.nan, math.nan
                    elif _due(epoch, cfg.eval_every, end_epoch):
                        test_loss, test_acc = evaluation()
                    else:  # not evaluated this epoch: no test figures in its row
                        test_loss = test_acc = None
                row = {"epoch": epoch + 1, "lr": lr, "train_loss": train_loss, "train_acc": train_acc,
                       "test_loss": test_loss, "test_acc": test_acc, "epoch_time_s": epoch_time,
                       "images_per_s": parts.images_per_epoch / epoch_time}
                with spent("log"):
                    log.log_epoch(row)
                    rank = f"rank {self.world.rank}: " if self.world.world_size > 1 else ""
                    test = "not evaluated" if test_acc is None else f"loss {test_loss:.4f} acc {test_acc:.4f}"
                    print(f"{rank}epoch {epoch + 1}/{cfg.epochs}: train loss {train_loss:.4f} acc {train_acc:.4f} | "
                          f"test {test} | {row['images_per_s']:.0f} img/s", file=sys.stderr)
                is_best = progress.record(row)
                due = _due(epoch, self.checkpoint_every, end_epoch)
                if primary and due and not is_best and epoch + 1 < end_epoch and writer.backlogged():
                    due, skipped = False, skipped + 1  # the writer is a checkpoint behind: skip, never wait
                if primary and (due or is_best):
                    with spent("checkpoint"):
                        snapshot = self._state(parts, epoch, progress, log.rows, snapshots)
                        algos.save()
                    with spent("checkpoint wait"):  # for the writer, while the one before is still queued
                        writer.submit(self.out / ("last.npz" if due else "best.npz"), snapshot,
                                      self.out / "best.npz" if due and is_best else None)
            t_finish = time.perf_counter()
        # Closing waits for the last checkpoint's write and stops the AutoAugment workers and the metrics log.
        spent.add("finish", time.perf_counter() - t_finish)
        if self.store is not None:  # every rank returns once rank 0's checkpoints are on disk
            self.store.barrier("run end", BARRIER_TIMEOUT_S)
        self.model = parts.model
        summary = self._summary(parts, progress, log.rows, end_epoch, t_start)
        summary["seconds"] = spent.totals(wall=summary["wall_time_s"])
        summary["checkpoints_skipped"] = skipped
        return summary

    def _resumed_state(self) -> dict | None:
        """last.npz of the run folder, checked to continue this configuration; None (and a note) when absent."""
        path = self.out / "last.npz"
        if not path.is_file():
            print(f"resume: no checkpoint in {self.out}; starting from scratch", file=sys.stderr)
            return None
        state = load_checkpoint(path)
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"{path}: not a training state of this version ({state.get('format')!r})")
        try:
            saved = TrainConfig.from_saved(state["config"])
        except ValueError as e:
            raise ValueError(f"{path}: the checkpoint's configuration is not valid here: {e}") from None
        diff = resume_differences(saved, self.cfg)
        if diff:
            raise ValueError(f"--resume: the configuration differs from the checkpoint's in {diff}; an exact resume "
                             "needs the same settings")
        return state

    def _load_data(self, spent: Stopwatch, prime: bool) -> CIFAR10Data:
        """The training set (the configured subset of it) and the test set, their labels checked once, on the host,
        before any worker forks: on the GPU an out-of-range label would only skew loss and accuracy. prime: when
        the source has to be decoded, do the first steps' searches meanwhile (warm_start.py)."""
        if self.data is None:
            if prime:
                self.data = load_while_priming(self.cfg, self.data_path, self.cache_dir, spent)
            else:
                from ..data.cifar10 import load_cifar10

                with spent("data"):
                    self.data = load_cifar10(self.data_path, cache_dir=self.cache_dir)
        with spent("data"):
            d = self.data
            check_labels(d.train_labels, NUM_CLASSES, "train labels")
            check_labels(d.test_labels, NUM_CLASSES, "test labels")
            idx = subset_indices(len(d.train_labels), self.cfg.subset, self.cfg.seed)
            if len(idx) < self.cfg.batch_size:
                raise ValueError(f"batch_size: {self.cfg.batch_size} is larger than the {len(idx)} training images")
            return CIFAR10Data(d.train_images[idx], d.train_labels[idx], d.test_images, d.test_labels,
                               source=d.source)

    def _train_epoch(self, parts: _Parts, epoch: int, images) -> tuple[float, float, float]:
        """One epoch of training steps: (mean loss, accuracy, seconds)."""
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        parts.model.train()  # the step's device totals start at zero: every epoch's last read resets them
        steps = len(parts.augmenter)
        bar = _progress_bar(steps, f"epoch {epoch + 1}/{self.cfg.epochs}", self.progress)
        for i, (x, y) in enumerate(parts.augmenter.epoch(epoch, images=images)):
            with partial_batch_search(len(y), parts.augmenter.batch_size):
                parts.step.run(x, y)  # loss and correct count stay on the device, summed
            if parts.schedule is not None:
                parts.schedule.step()
            if bar is not None and ((i + 1) % self.log_every == 0 or i + 1 == steps):
                loss_sum, correct_sum, seen = parts.step.read_totals()
                bar.update(i + 1 - bar.n)
                bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc=f"{correct_sum / seen:.4f}",
                                img_s=f"{seen / (time.perf_counter() - t0):.0f}")
        loss_sum, correct_sum, seen = parts.step.read_totals(reset=True)  # waits for the epoch's steps
        seconds = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        return loss_sum / seen, correct_sum / seen, seconds

    def _state(self, parts: _Parts, epoch: int, progress: _Progress, history, snapshots: HostSnapshot):
        """The checkpoint after `epoch`, everything --resume needs to continue exactly, as a function for the
        writer's thread: the arrays' copies to the host are enqueued here and waited for there. The scalars that
        live on the device (the loss scale, AdamW's step) are read first: a small read enqueued after the
        snapshot's transfer would wait for the copy engine to finish it."""
        scalars = {"format": STATE_FORMAT, "epoch": epoch, "config": self.cfg.to_dict(),
                   "optimizer": parts.optimizer.state_header(),
                   "schedule": _state_of(parts.schedule), "scaler": _state_of(parts.scaler),
                   # The data pipeline draws from (seed, epoch) alone: these two numbers are its whole RNG state.
                   "rng": {"seed": self.cfg.seed, "next_epoch": epoch + 1},
                   "metrics": {"history": [dict(r) for r in history], "best": dict(progress.best),
                               "train_time_s": progress.train_time_s}}
        arrays = snapshots.take({"model": parts.model.state_sources(),
                                 "optimizer": parts.optimizer.state_sources()})

        def state() -> dict:
            host = arrays.resolve()
            return {**scalars, "model": host["model"], "optimizer": {**scalars["optimizer"], **host["optimizer"]}}

        return state

    def _summary(self, parts: _Parts, progress: _Progress, rows, end_epoch: int, t_start: float) -> dict:
        from ..metrics_log import plot_curves

        cfg = self.cfg
        final = rows[-1] if rows else {}
        train_time = progress.train_time_s
        summary = {
            "recipe": cfg.name, "model": cfg.model, "precision": cfg.precision, "layout": cfg.layout,
            "epochs": cfg.epochs, "epochs_done": len(rows), "completed": end_epoch >= cfg.epochs,
            "test_acc": final.get("test_acc"), "best_test_acc": progress.best["test_acc"] if rows else None,
            "best_epoch": progress.best["epoch"] if rows else None,
            "train_images": parts.augmenter.num_images, "train_time_s": train_time,
            "train_images_per_s": (len(rows) * parts.images_per_epoch / train_time) if train_time > 0 else None,
            "wall_time_s": time.perf_counter() - t_start,
            "parameters": int(parts.model.num_parameters()) if hasattr(parts.model, "num_parameters") else None,
            "out": str(self.out),
        }
        if self.world.world_size > 1:
            summary["rank"], summary["world_size"] = self.world.rank, self.world.world_size
        if not self.world.is_primary:
            return summary
        if rows:
            summary["plot_backend"] = plot_curves(rows, self.out / "curves.png",
                                                  title=f"recipe {cfg.name} {cfg.model} {cfg.precision}")
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")
        return summary


@dataclass
class _Parts:
    """What a run trains with, built from its configuration."""

    model: Any
    optimizer: Any
    schedule: Any
    scaler: Any
    step: Any
    augmenter: Any
    test_inputs: Any
    test_labels: Any

    world_size: int = 1

    @property
    def images_per_epoch(self) -> int:
        """Over all ranks."""
        return len(self.augmenter) * self.augmenter.batch_size * self.world_size

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.schedule is not None:
            self.schedule.load_state_dict(state["schedule"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])


def _due(epoch: int, every: int, end_epoch: int) -> bool:
    """Whether something done every `every` epochs, and after the last, is due after `epoch` (0-based)."""
    return (epoch + 1) % every == 0 or epoch + 1 == end_epoch


def _state_of(obj):
    return obj.state_dict() if obj is not None else None


def _build(cfg: TrainConfig, data: CIFAR10Data, world, store=None, allreduce=None) -> _Parts:
    import cupy

    from ..data.augment import GpuAugmenter, normalize_on_gpu

    n = world.world_size
    model = build_model(cfg)
    optimizer = build_optimizer(cfg, model)
    augmenter = GpuAugmenter(data.train_images, data.train_labels, batch_size=cfg.batch_size // n,
                             layout=cfg.layout, dtype=cfg.precision, config=augment_config(cfg), seed=cfg.seed,
                             world=world)
    schedule = build_schedule(cfg, optimizer, len(augmenter))
    scaler = build_scaler(cfg)
    if n > 1 and allreduce is None:
        allreduce = default_allreduce(model, world, store, cfg.allreduce_dtype)
    if cfg.sync_bn and allreduce is not None:  # at world size 1 without an all-reduce, per-GPU is global already
        from ..layers import synchronize_batch_norms

        synchronize_batch_norms(model, allreduce)
    step = build_train_step(cfg, model, optimizer, scaler, allreduce=allreduce)  # a given one runs at world 1 too
    test_inputs = normalize_on_gpu(data.test_images, layout=cfg.layout, dtype=cfg.precision)
    test_labels = cupy.asarray(np.asarray(data.test_labels, dtype=np.int32))  # converted on the host
    return _Parts(model, optimizer, schedule, scaler, step, augmenter, test_inputs, test_labels, n)


def default_allreduce(model, world, store, wire: str = "fp32"):
    """The gradient all-reduce of a model where it lives: NCCL on the GPU (gradients sent as `wire`), the Store
    on the host (float64 sums of the gradients as they are)."""
    from ..distributed.allreduce import NcclAllReduce, StoreAllReduce

    if model.ensure_placed().on_gpu:
        return NcclAllReduce(store, world, wire=None if wire == "fp32" else wire)
    return StoreAllReduce(store, world)


class _RowsOnly:
    """A rank other than 0's stand-in for MetricsLog: it keeps the rows and writes nothing."""

    def __init__(self, rows=None):
        self.rows = [dict(r) for r in (rows or [])]

    def log_epoch(self, row: dict) -> None:
        self.rows.append(dict(row))


@dataclass
class _Progress:
    """How far a run has come: the next epoch, the best test accuracy so far and the training time."""

    next_epoch: int = 0
    best: dict = field(default_factory=lambda: {"test_acc": -1.0, "epoch": -1})
    train_time_s: float = 0.0

    @classmethod
    def from_state(cls, state: dict) -> _Progress:
        m = state["metrics"]
        return cls(int(state["epoch"]) + 1, dict(m["best"]), float(m["train_time_s"]))

    def record(self, row: dict) -> bool:
        """Count an epoch's row; True when its test accuracy is the best so far."""
        self.next_epoch = row["epoch"]
        self.train_time_s += row["epoch_time_s"]
        if row["test_acc"] is not None and row["test_acc"] > self.best["test_acc"]:
            self.best = {"test_acc": row["test_acc"], "epoch": row["epoch"]}
            return True
        return False


def _progress_bar(total, desc, enabled):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", leave=False, dynamic_ncols=True, file=sys.stderr)


def _yaml_dump(cfg: dict) -> str:
    import yaml

    return yaml.safe_dump(cfg, sort_keys=False)
