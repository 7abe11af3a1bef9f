"""One training run, read top to bottom in Trainer.run: check a checkpoint to resume against the configuration, load
the data, build the network, optimizer, schedule, loss scaler and training step, then per epoch train, evaluate,
log and checkpoint; last, the summary.

A run folder receives config.yaml, metrics.csv (and tensorboard/), last.npz (every piece of state --resume needs),
best.npz (the best test accuracy's state, what resnet_native.release ships), algos.json (the convolution
algorithms chosen so far, resnet_native.ops.conv.save_algorithm_cache), curves.png and summary.json.
Resume is exact: the data's randomness is a function of (seed, epoch) alone (data/augment.py) and the checkpoint
and algos.json hold everything else (another convolution algorithm rounds differently), so a resumed run repeats
the updates of one that never stopped. The GPU does not wait for the host between epochs: epoch k's figures are
read only once epoch k+1 is queued behind them (queued_epoch.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import pathlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .._core import runtime
from .._core.files import atomic_write_text
from .._core.names import whole_number
from ..data.augment import check_labels
from ..data.cifar10 import CIFAR10Data, load_cifar10
from ..distributed.world import World
from ..formats.checkpoint import load_checkpoint
from ..nn.models.registry import NUM_CLASSES
from ..ops import conv
from .builders import (
    MODEL_COPIES,
    Parts,
    autoaugment_workers,
    build_network,
    build_parts,
    partial_batch_search,
    subset_indices,
)
from .checkpoint_writer import AlgorithmCacheFile, CheckpointWriter, load_algorithm_cache
from .config import TrainConfig, reduced_size, resume_differences
from .epoch_upload import EpochUpload
from .evaluation import Evaluation
from .metrics_log import SIZE_COLUMN, TTA_COLUMNS, MetricsLog, plot_curves, preload_plotting
from .queued_epoch import QueuedEpoch, record_event, reserve_buffers, stage_state, state_sources
from .resumed_state import check_resumed_state
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
    processes; log_every: steps between progress-bar updates; checkpoint_every: epochs between writes
    of last.npz (best.npz is written whenever the test accuracy improves; a due write of last.npz alone is skipped
    while the writer is still writing, except the last epoch's); algorithms: an algorithm cache file (a
    run's algos.json) loaded before a run that does not resume, so a same-seed --deterministic run repeats that
    run's rounding.

    Data parallel (world: a resnet_native.distributed World of world_size > 1, with its rendezvous store): every
    rank trains on its shard of each epoch (distributed.shard_indices: same seed and epoch everywhere, so the
    shards are disjoint) with a batch of batch_size / world_size, and its TrainStep averages the gradients over the
    ranks (NCCL on the GPU, the Store on the host); batch norm statistics stay per rank unless sync_bn. Only rank 0
    writes the run folder and evaluates (the others' test metrics are NaN); with --resume every rank loads rank 0's
    last.npz after a barrier. world_size 1 has no store and no all-reduce unless one is given.
    """

    def __init__(self, cfg, out_dir, *, data=None, data_path=None, cache_dir=None, progress: bool = True,
                 tensorboard: bool = True, aa_workers=None, log_every: int = 50, checkpoint_every: int = 1,
                 world=None, store=None, allreduce=None, algorithms=None):
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

    def run(self, *, resume: bool = False, stop_after: int | None = None, started_at: float | None = None) -> dict:
        """Train up to cfg.epochs (resume: continue from out_dir/last.npz), or stop once stop_after epochs are
        complete, as if interrupted (the schedule still spans cfg.epochs). Returns the summary (summary.json).
        started_at: the time.perf_counter() the run's wall time counts from (the command's start; default now),
        what came before the call counted as "start-up"."""

        t_start = time.perf_counter()
        spent = Stopwatch()  # where this process's wall time goes (the summary's "seconds")
        if started_at is not None:
            spent.add("start-up", t_start - started_at)
            t_start = started_at
        cfg = self.cfg
        primary = self.world.is_primary
        if resume and self.store is not None:  # rank 0's last.npz is complete: its last run ended in a barrier
            self.store.barrier("resume", BARRIER_TIMEOUT_S)
        state = self._resumed_state() if resume else None
        runtime.require_gpu()  # before any data is decoded or the run folder is made
        prime = state is None and self.algorithms is None and self.world.world_size == 1
        warm_start = {}  # a fresh run's priming phases and decode seconds (warm_start.py)
        # Closed in reverse: writer, metrics log, upload, workers, the decoding child's cache write.
        with contextlib.ExitStack() as stack:
            data, network = self._load_data(spent, prime, warm_start, stack)
            if primary:
                self.out.mkdir(parents=True, exist_ok=True)
            aa = stack.enter_context(autoaugment_workers(cfg, data.train_images, self.aa_workers))
            upload = stack.enter_context(EpochUpload(aa)) if aa is not None else None
            if state is not None:  # --resume: the interrupted run's algorithms, before the first forward
                load_algorithm_cache(self.out / ALGOS_FILE)
            elif self.algorithms is not None:  # another run's: its rounding, bit for bit (with --deterministic)
                conv.load_algorithm_cache(self.algorithms)
            with spent("build"):
                parts = build_parts(cfg, data, self.world, self.store, self.allreduce, network)
            # Page-locking memory takes a while: it runs on a thread beside the rest of the set-up.
            snapshots = HostSnapshot()
            device = _current_device() if parts.model.ensure_placed().on_gpu else None
            reserving = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="reserve")).submit(
                reserve_buffers, snapshots, state_sources(parts) if primary else None, device)
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
            evaluation = Evaluation(parts.eval_model, parts.test_inputs, parts.test_labels, cfg.eval_batch_size,
                                    cuda_graph=cfg.eval_cuda_graph, x_views=parts.test_views[0],
                                    view_weights=parts.test_views[1])
            algos = AlgorithmCacheFile(self.out / ALGOS_FILE)
            reserving.result()
            skipped, between = 0, 0.0
            # The CUDA context, the AutoAugment workers' start, the metrics log and writer, the evaluation.
            spent.add_untracked("set-up", t_start)
            queued = None  # the epoch whose figures are read once the next one is queued (queued_epoch.py)
            finish = functools.partial(self._finish_epoch, parts=parts, end_epoch=end_epoch, progress=progress,
                                       log=log, writer=writer, algos=algos, spent=spent)
            try:
                for epoch in range(progress.next_epoch, end_epoch):
                    ahead = self._queue_epoch(parts, epoch, end_epoch, upload, evaluation, snapshots, spent,
                                              log.rows[-1] if log.rows else None)
                    ahead.previous_end = None if queued is None else queued.end
                    if queued is not None:
                        done, queued = queued, None
                        skipped += finish(done)
                        between += done.seconds_before()
                        if primary:  # the host is an epoch ahead now: the import has time to hide
                            preload_plotting()
                    queued = ahead
            except BaseException:
                if queued is not None:  # complete on the device, and not yet logged: keep its row and checkpoint
                    with contextlib.suppress(Exception):
                        finish(queued)
                raise
            if queued is not None:
                skipped += finish(queued)
                between += queued.seconds_before()
            plot_backend = None
            if primary and log.rows:  # while the writer's thread writes the last checkpoint
                with spent("plot"):
                    plot_backend = plot_curves(log.rows, self.out / "curves.png",
                                               title=f"recipe {cfg.name} {cfg.model} {cfg.precision}")
            t_finish = time.perf_counter()
        # Closing waits for the last checkpoint's write and stops the AutoAugment workers and the metrics log.
        spent.add("finish", time.perf_counter() - t_finish)
        if self.store is not None:  # every rank returns once rank 0's checkpoints are on disk
            self.store.barrier("run end", BARRIER_TIMEOUT_S)
        self.model = parts.model
        summary = self._summary(parts, progress, log.rows, end_epoch)
        summary["checkpoints_skipped"] = skipped
        # GPU time between one epoch's last step and the next's first: evaluations, checkpoint copies, uploads,
        # and the GPU waiting for the host.
        summary["gpu_between_epochs_s"] = round(between, 3)
        if warm_start:  # which of the priming and the decode a fresh run waited for
            summary["warm_start_s"] = {k: round(v, 3) for k, v in warm_start.items()}
        if plot_backend is not None:
            summary["plot_backend"] = plot_backend
        summary["wall_time_s"] = time.perf_counter() - t_start
        summary["seconds"] = spent.totals(wall=summary["wall_time_s"])
        if self.world.is_primary:
            atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")
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
            saved = TrainConfig.from_saved(state.get("config"))
        except ValueError as e:
            raise ValueError(f"{path}: the checkpoint's configuration is not valid here: {e}") from None
        diff = resume_differences(saved, self.cfg)
        if diff:
            raise ValueError(f"{path}: --resume: the configuration differs from the checkpoint's in {diff}; an exact "
                             "resume needs the same settings")
        check_resumed_state(state, path, saved.epochs)
        return state

    def _load_data(self, spent: Stopwatch, prime: bool, warm_start: dict, cleanup) -> tuple:
        """(the training set (the configured subset of it) and the test set, the Network built ahead or None). The
        labels are checked once, on the host, before any worker forks: on the GPU an out-of-range label would only
        skew loss and accuracy. prime: when the source has to be decoded, do the first steps' searches and build
        the network meanwhile (warm_start.py), whose phases and decode seconds go into warm_start; the wait for the
        decoding child's cache write goes on `cleanup`, an ExitStack."""
        ahead = []
        if self.data is None:
            if prime:
                def build():
                    ahead.append(build_network(self.cfg, self.world, self.store, self.allreduce))

                self.data = load_while_priming(self.cfg, self.data_path, self.cache_dir, spent, warm_start,
                                               meanwhile=build, cleanup=cleanup)
            else:
                with spent("data"):
                    self.data = load_cifar10(self.data_path, cache_dir=self.cache_dir)
        with spent("data"):
            d = self.data
            check_labels(d.train_labels, NUM_CLASSES, "train labels")
            check_labels(d.test_labels, NUM_CLASSES, "test labels")
            idx = subset_indices(len(d.train_labels), self.cfg.subset, self.cfg.seed)
            if len(idx) < self.cfg.batch_size:
                raise ValueError(f"batch_size: {self.cfg.batch_size} is larger than the {len(idx)} training images")
            if len(idx) < len(d.train_labels):  # the whole set is taken as it is: nothing writes into it
                d = CIFAR10Data(d.train_images[idx], d.train_labels[idx], d.test_images, d.test_labels,
                                source=d.source)
            return d, (ahead[0] if ahead else None)

    def _queue_epoch(self, parts: Parts, epoch: int, end_epoch: int, upload, evaluation, snapshots,
                     spent: Stopwatch, last_row: dict | None) -> QueuedEpoch:
        """Queue one epoch: its images' upload, its training steps, the read-back of their totals, and (on rank 0)
        its evaluation and its checkpoint's staging copies when they may be needed. Waits for nothing on the device:
        a progress bar counts the steps queued and shows last_row, the figures of the last epoch read back."""
        # With AutoAugment, the wait for the CPU workers' copy of this epoch is its own figure.
        with spent("autoaugment") if upload is not None else contextlib.nullcontext():
            images = upload(epoch, end_epoch) if upload is not None else None
        with spent("train"):
            lr = float(parts.optimizer.lr)
            parts.model.train()
            steps = len(parts.augmenter)
            bar = _progress_bar(steps, f"epoch {epoch + 1}/{self.cfg.epochs}", self.progress, last_row)
            start = record_event()
            size = reduced_size(self.cfg, epoch)
            for i, (x, y) in enumerate(parts.augmenter.epoch(epoch, images=images, size=size)):
                with partial_batch_search(len(y), parts.augmenter.batch_size):
                    parts.step.run(x, y)  # loss and correct count stay on the device, summed
                if parts.lookahead is not None:  # queued behind the step, as the average's update
                    parts.lookahead.after_step(parts.optimizer.step_count)
                if parts.ema is not None:  # queued behind the step: one launch or two, no wait
                    parts.ema.after_step(parts.optimizer.step_count)
                if parts.schedule is not None:
                    parts.schedule.step()
                if bar is not None and ((i + 1) % self.log_every == 0 or i + 1 == steps):
                    bar.update(i + 1 - bar.n)  # steps queued: reading the running totals would drain the queue
            if bar is not None:
                bar.close()
            totals = parts.step.take_totals()
            queued = QueuedEpoch(epoch, lr, start, record_event(), totals,
                                 image_size=size or parts.augmenter.image_size)
        if not self.world.is_primary:
            return queued
        with spent("evaluate"):
            if _due(epoch, self.cfg.eval_every, end_epoch):
                if parts.ema is not None:
                    parts.ema.before_evaluation(parts.optimizer.step_count)
                queued.test = evaluation.queue()
        if queued.test is not None or _due(epoch, self.checkpoint_every, end_epoch):
            with spent("checkpoint"):
                queued.staged, queued.host_state = stage_state(parts, snapshots)
        return queued

    def _finish_epoch(self, queued: QueuedEpoch, *, parts: Parts, end_epoch: int, progress: _Progress, log,
                      writer, algos, spent: Stopwatch) -> int:
        """Read a queued epoch's figures (waiting for its own work only), log its row and checkpoint it; 1 when a
        due checkpoint was skipped because the writer was still writing, else 0."""
        epoch, primary = queued.epoch, self.world.is_primary
        with spent("train"):
            train_loss, train_acc, epoch_time = queued.training_figures()
        with spent("evaluate"):
            test_loss, test_acc, *tta = queued.test_figures() if primary else (math.nan, math.nan)
        row = {"epoch": epoch + 1, "lr": queued.lr, "train_loss": train_loss, "train_acc": train_acc,
               "test_loss": test_loss, "test_acc": test_acc, "epoch_time_s": epoch_time,
               "images_per_s": parts.images_per_epoch / epoch_time}
        if self.cfg.tta != "none":  # the TTA figures beside the plain ones (None where not evaluated)
            row.update(zip(TTA_COLUMNS, tta or (None, None, None), strict=True))
        if self.cfg.progressive.size:
            row[SIZE_COLUMN] = queued.image_size
        with spent("log"):
            log.log_epoch(row)
            rank = f"rank {self.world.rank}: " if self.world.world_size > 1 else ""
            test = "not evaluated" if test_acc is None else f"loss {test_loss:.4f} acc {test_acc:.4f}"
            if row.get("test_acc_tta") is not None:
                test += f" tta acc {row['test_acc_tta']:.4f}"
            print(f"{rank}epoch {epoch + 1}/{self.cfg.epochs}: train loss {train_loss:.4f} acc {train_acc:.4f} | "
                  f"test {test} | {row['images_per_s']:.0f} img/s", file=sys.stderr)
        is_best = progress.record(row)
        due, skipped = _due(epoch, self.checkpoint_every, end_epoch), 0
        if primary and due and not is_best and epoch + 1 < end_epoch and writer.busy():
            due, skipped = False, 1  # still writing: skip, so the last epoch's write waits for one at most
        if not (primary and (due or is_best)):
            queued.release()
            return skipped
        with spent("checkpoint"):
            state = self._state(queued, progress, log.rows)
            algos.save()
        with spent("checkpoint wait"):  # for the writer, while the one before is still queued
            writer.submit(self.out / ("last.npz" if due else "best.npz"), state,
                          self.out / "best.npz" if due and is_best else None)
        return skipped

    def _state(self, queued: QueuedEpoch, progress: _Progress, history):
        """The checkpoint after a queued epoch, everything --resume needs to continue exactly, as a function for
        the writer's thread, which waits there for the staged copies to reach the host."""
        epoch, arrays, host = queued.epoch, queued.staged, queued.host_state
        queued.staged = None
        scalars = {"format": STATE_FORMAT, "epoch": epoch, "config": self.cfg.to_dict(),
                   "schedule": host["schedule"],
                   # The data pipeline draws from (seed, epoch) alone: these two numbers are its whole RNG state.
                   "rng": {"seed": self.cfg.seed, "next_epoch": epoch + 1},
                   "metrics": {"history": [dict(r) for r in history], "best": dict(progress.best),
                               "train_time_s": progress.train_time_s}}

        def state() -> dict:
            copies = arrays.resolve()
            scaler = None if host["scaler"] is None else {**host["scaler"], **copies["scaler"]}
            out = {**scalars, "model": copies["model"], "optimizer": {**host["optimizer"], **copies["optimizer"]},
                   "scaler": scaler}
            # The weights' average (what is evaluated and released) and Lookahead's slow weights, if kept.
            out.update({field: copies[field] for field in MODEL_COPIES if field in copies})
            return out

        return state

    def _summary(self, parts: Parts, progress: _Progress, rows, end_epoch: int) -> dict:
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
            "parameters": int(parts.model.num_parameters()) if hasattr(parts.model, "num_parameters") else None,
            "out": str(self.out), "tta": cfg.tta, "ema": parts.ema is not None,
            "progressive": cfg.progressive.to_dict() if cfg.progressive.size else None,
            "stem": cfg.stem.to_dict(),
        }
        if cfg.tta != "none":
            # The last evaluation's TTA figures, and the GPU seconds every evaluation's mirrored pass took.
            summary["test_acc_tta"], summary["test_loss_tta"] = final.get("test_acc_tta"), final.get("test_loss_tta")
            summary["tta_s"] = round(sum(r.get("tta_s") or 0.0 for r in rows), 3)
        if self.world.world_size > 1:
            summary["rank"], summary["world_size"] = self.world.rank, self.world.world_size
        return summary


def _due(epoch: int, every: int, end_epoch: int) -> bool:
    """Whether something done every `every` epochs, and after the last, is due after `epoch` (0-based)."""
    return (epoch + 1) % every == 0 or epoch + 1 == end_epoch


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


def _progress_bar(total, desc, enabled, last_row=None):
    """A bar of an epoch's steps, showing the last epoch read back (its figures are an epoch behind the bar)."""
    if not enabled:
        return None
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="step", leave=False, dynamic_ncols=True, file=sys.stderr)
    if last_row is not None:
        bar.set_postfix(last_loss=f"{last_row['train_loss']:.4f}", last_acc=f"{last_row['train_acc']:.4f}",
                        img_s=f"{last_row['images_per_s']:.0f}", refresh=False)
    return bar


def _yaml_dump(cfg: dict) -> str:
    import yaml

    return yaml.safe_dump(cfg, sort_keys=False)


def _current_device() -> int:
    import cupy

    return cupy.cuda.Device().id
