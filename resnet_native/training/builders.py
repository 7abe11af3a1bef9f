"""From a TrainConfig to the objects a run trains with: the one place that knows the constructors' signatures."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import optim
from .._core.rng import epoch_rng
from ..data.augment import STREAM_SUBSET, AugmentConfig, GpuAugmenter, normalization_lut, normalize_on_gpu
from ..data.autoaugment_workers import AutoAugmentWorkers
from ..data.tta_views import tta_views
from ..distributed.allreduce import NcclAllReduce, StoreAllReduce
from ..nn.layers import BatchNorm2d, synchronize_batch_norms
from ..nn.layers.conv2d import Conv2d
from ..nn.models.registry import create_model
from ..nn.whitening import MAX_IMAGES, whiten_first_filters
from ..ops.conv import untimed_search
from ..optim.step import TrainStep
from .config import TrainConfig


def partial_batch_search(batch: int, full_batch: int):
    """The context a batch of `batch` images runs its convolutions in: an epoch's last, partial batch runs once per
    epoch, so it takes cuDNN's heuristic choices (conv.untimed_search) rather than searches that cost as much as
    hundreds of its steps; full batches search. Called for every training step: nothing is imported here."""
    return untimed_search() if batch < full_batch else contextlib.nullcontext()


def _convolutions(model) -> list:
    """The model's convolutions. They build their ConvSpec lazily on first use, so what is set on them before the
    first forward holds."""
    return [m for _, m in model.named_modules() if isinstance(m, Conv2d)]


def make_deterministic(model) -> None:
    """Make every convolution pick only deterministic algorithms (bit-reproducible runs, e.g. to check --resume).
    Call it before the first forward."""
    for m in _convolutions(model):
        m.deterministic = True


def build_model(cfg: TrainConfig, *, initialize: bool = True):
    """The recipe's network, seeded (initialize=False: nothing drawn, for a copy whose values come from elsewhere,
    such as the weight average's, which starts as a copy of the model), on the GPU, its convolutions on the
    recipe's engine."""
    model = create_model(cfg.model, layout=cfg.layout, precision=cfg.precision, seed=cfg.seed, initialize=initialize)
    if cfg.zero_init_residual:
        model.zero_residual_scales()
    model.conv1.needs_weight_grad = not cfg.stem.frozen
    for m in _convolutions(model):
        m.engine = cfg.engine
    if cfg.deterministic:
        make_deterministic(model)
    model.cuda()
    return model


def whiten_stem(cfg: TrainConfig, model, train_images) -> None:
    """The stem's first filters as the whitening of the first training images' patches (nn/whitening.py), the
    images normalised as the network sees them (the training kernel's table, applied on the host)."""
    images = normalization_lut("fp32")[np.arange(3), train_images[:MAX_IMAGES]]
    whiten_first_filters(model.conv1, images, eps=cfg.stem.whiten_eps)


def build_optimizer(cfg: TrainConfig, model):
    """The recipe's optimizer over the model's trainable parameters (a frozen stem's filters, which build_model
    marks, are left out); with a norm_weight_decay the batch-norm scales and shifts are a group of their own."""
    o = cfg.optimizer
    params = model.trainable_parameters()
    if o.norm_weight_decay is not None:
        norm = {id(p) for _, m in model.named_modules() if isinstance(m, BatchNorm2d) for p in m.parameters()}
        params = [{"params": [p for p in params if id(p) not in norm]},
                  {"params": [p for p in params if id(p) in norm], "weight_decay": o.norm_weight_decay}]
    if o.name == "sgd":
        return optim.SGD(params, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay)
    return optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)


def warmup_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    return int(round(cfg.schedule.warmup_epochs * steps_per_epoch))


def build_schedule(cfg: TrainConfig, optimizer, steps_per_epoch: int):
    """Per-step schedule over the whole run: linear warm-up (if any), then cosine / one-cycle / linear decay to zero
    / constant (None: constant without warm-up)."""
    total = cfg.epochs * steps_per_epoch
    warm = warmup_steps(cfg, steps_per_epoch)
    main = None
    if cfg.schedule.name == "cosine":
        main = optim.CosineSchedule(optimizer, total - warm)
    elif cfg.schedule.name == "onecycle":
        main = optim.OneCycleSchedule(optimizer, total - warm)
    elif cfg.schedule.name == "linear":
        main = optim.LinearSchedule(optimizer, total - warm)
    if warm:
        return optim.WarmupSchedule(optimizer, warm, after=main)
    return main


def build_scaler(cfg: TrainConfig):
    """fp16 needs loss scaling; the other precisions have fp32's range."""
    return optim.GradScaler() if cfg.precision == "fp16" else None


def build_train_step(cfg: TrainConfig, model, optimizer, scaler, allreduce=None):
    """allreduce: a data-parallel step's GradientAllReduce (None: a single process, whose optimizer reads the
    low-precision weight gradients where the layers wrote them)."""
    return TrainStep(model, optimizer, label_smoothing=cfg.label_smoothing, scaler=scaler,
                     cuda_graph=cfg.cuda_graph, allreduce=allreduce,
                     overlap_allreduce=cfg.overlap_allreduce and allreduce is not None,
                     direct_gradients=allreduce is None)


def build_weight_average(cfg: TrainConfig, model, steps_per_epoch: int, shadow):
    """The weights' moving average of a recipe with ema.decay > 0 (else None), kept in `shadow`, the second copy
    of the network that build_network made."""
    e = cfg.ema
    if e.decay == 0.0:
        return None
    start = int(round(e.start * cfg.epochs * steps_per_epoch))
    return optim.WeightAverage(model, shadow, e.decay, every=e.every, start_step=start)


def build_lookahead(cfg: TrainConfig, model, steps_per_epoch: int, slow):
    """Lookahead's slow weights with lookahead.decay > 0 (else None), kept in `slow`, a copy of the network that
    build_network made."""
    la = cfg.lookahead
    if la.decay == 0.0:
        return None
    return optim.Lookahead(model, slow, la.decay, every=la.every, total_steps=cfg.epochs * steps_per_epoch)


def test_set_views(cfg: TrainConfig, test_images) -> tuple[tuple, tuple]:
    """(the test set's other views for cfg.tta, each normalised, weights: the plain set's then each view's);
    ((), (1.0,)) without TTA. Made once, on the device (test_images: uint8, host or device), so that an evaluation's
    views pass is forwards alone."""
    import cupy

    views = tta_views(cfg.tta)
    images = cupy.asarray(test_images) if len(views) > 1 else None
    arrays = tuple(normalize_on_gpu(images, layout=cfg.layout, dtype=cfg.precision, view=v) for v in views[1:])
    return arrays, tuple(v.weight for v in views)


def augment_config(cfg: TrainConfig) -> AugmentConfig:
    """What the GPU kernel does. With AutoAugment the CPU workers crop and flip first (torchvision's order:
    crop -> flip -> AutoAugment), so the kernel keeps only Cutout and the normalisation."""
    a = cfg.augment
    if a.autoaugment:
        return AugmentConfig(crop_padding=0, flip=False, cutout=a.cutout)
    return AugmentConfig(crop_padding=a.crop_padding, flip=a.flip, cutout=a.cutout, alternate_flip=a.alternate_flip)


def subset_indices(n: int, subset, seed: int) -> np.ndarray:
    """The training images a --subset run uses: a seeded random choice, in data-set order."""
    if subset is None or subset >= n:
        return np.arange(n)
    return np.sort(epoch_rng(seed, 0, STREAM_SUBSET).permutation(n)[:subset])


@contextlib.contextmanager
def autoaugment_workers(cfg: TrainConfig, train_images, workers):
    """The AutoAugment worker processes of a recipe that uses it (else None), stopped on exit. They fork here and run
    NumPy only, never CUDA, so a CUDA context in this process (the warm start's) is no concern of theirs."""
    if not cfg.augment.autoaugment:
        yield None
        return

    aa = AutoAugmentWorkers(train_images, seed=cfg.seed, workers=workers, crop_padding=cfg.augment.crop_padding,
                            flip=cfg.augment.flip)
    try:
        yield aa
    finally:
        aa.close()


# The checkpoint fields of the networks a run may keep beside its model (Parts.model_copies), and what each holds.
MODEL_COPIES = {"ema": "a moving average of the weights", "lookahead": "slow weights"}


@dataclass
class Parts:
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
    test_views: tuple = ((), (1.0,))  # test_set_views: the test set's other views and the weights, for TTA
    ema: Any = None  # the weights' moving average (optim.WeightAverage)
    lookahead: Any = None  # the slow weights (optim.Lookahead)

    @property
    def model_copies(self) -> dict:
        """{checkpoint field: network} of the copies a run keeps beside the model (the weights' average, Lookahead's
        slow weights), each checkpointed and restored with it."""
        copies = {"ema": None if self.ema is None else self.ema.shadow,
                  "lookahead": None if self.lookahead is None else self.lookahead.slow}
        return {field: net for field, net in copies.items() if net is not None}

    @property
    def eval_model(self):
        """What is evaluated, checkpointed as the release's weights and released: the average when there is one."""
        return self.model if self.ema is None else self.ema.shadow

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
        for field, net in self.model_copies.items():
            if not isinstance(state.get(field), dict):
                raise ValueError(f"{field}: the run keeps {MODEL_COPIES[field]} and the checkpoint holds none (field "
                                 f"'{field}')")
            net.load_state_dict(state[field])


@dataclass
class Network:
    """What a run trains that needs no data: built while a fresh machine still decodes it (warm_start.py)."""

    model: Any
    optimizer: Any
    scaler: Any
    step: Any
    shadow: Any = None  # the moving average's copy of the network, for build_weight_average
    slow: Any = None  # Lookahead's copy of the network, for build_lookahead


def build_network(cfg: TrainConfig, world, store=None, allreduce=None) -> Network:
    """The model, optimizer, loss scaler, training step and (with ema) the average's network of a rank."""
    model = build_model(cfg)
    optimizer = build_optimizer(cfg, model)
    scaler = build_scaler(cfg)
    if world.world_size > 1 and allreduce is None:
        allreduce = default_allreduce(model, world, store, cfg.allreduce_dtype)
    if cfg.sync_bn and allreduce is not None:  # at world size 1 without an all-reduce, per-GPU is global already
        synchronize_batch_norms(model, allreduce)
    step = build_train_step(cfg, model, optimizer, scaler, allreduce=allreduce)  # a given one runs at world 1 too
    return Network(model, optimizer, scaler, step, build_model(cfg, initialize=False) if cfg.ema.decay else None,
                   build_model(cfg, initialize=False) if cfg.lookahead.decay else None)


def build_parts(cfg: TrainConfig, data, world, store=None, allreduce=None, network: Network | None = None) -> Parts:
    """Everything a rank of a run trains with, from its configuration and its CIFAR10Data (network: the part
    build_network made ahead, else built here)."""
    import cupy

    n = world.world_size
    net = build_network(cfg, world, store, allreduce) if network is None else network
    if cfg.stem.init == "whiten":  # before the weights' average and Lookahead copy the model
        whiten_stem(cfg, net.model, data.train_images)
    augmenter = GpuAugmenter(data.train_images, data.train_labels, batch_size=cfg.batch_size // n,
                             layout=cfg.layout, dtype=cfg.precision, config=augment_config(cfg), seed=cfg.seed,
                             world=world)
    test_images = cupy.asarray(data.test_images)  # uploaded once: the plain set and every TTA view are made from it
    test_inputs = normalize_on_gpu(test_images, layout=cfg.layout, dtype=cfg.precision)
    test_labels = cupy.asarray(np.asarray(data.test_labels, dtype=np.int32))  # converted on the host
    return Parts(net.model, net.optimizer, build_schedule(cfg, net.optimizer, len(augmenter)), net.scaler, net.step,
                 augmenter, test_inputs, test_labels, n, test_views=test_set_views(cfg, test_images),
                 ema=build_weight_average(cfg, net.model, len(augmenter), net.shadow),
                 lookahead=build_lookahead(cfg, net.model, len(augmenter), net.slow))


def default_allreduce(model, world, store, wire: str = "fp32"):
    """The gradient all-reduce of a model where it lives: NCCL on the GPU (gradients sent as `wire`), the Store
    on the host (float64 sums of the gradients as they are)."""
    if model.ensure_placed().on_gpu:
        return NcclAllReduce(store, world, wire=None if wire == "fp32" else wire)
    return StoreAllReduce(store, world)
