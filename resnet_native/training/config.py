"""The training recipe: what a run trains and how, one structure of declarative settings.

A recipe is a YAML file (resnet_native/recipes/A.yaml, B.yaml, C.yaml, or any path); command-line flags are
overrides of its keys, merged into it before the one check (TrainConfig.from_dict) that every source goes through.
Each setting's type, default and bounds are declared on its field below.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

from .._core.names import ENGINES, LAYOUTS, PRECISIONS, TTA_MODES
from ..formats.yaml_file import load_plain_yaml
from ..nn.models.registry import LEGACY_KEYS, MODEL_NAMES, rename_legacy_keys
from .settings import REQUIRED, Settings, flag, integer, number, numbers, one_of, section, text, variant

RECIPES_DIR = pathlib.Path(__file__).resolve().parent.parent / "recipes"
SCHEDULES = ("cosine", "onecycle", "linear", "constant")
FULL_SIZE = 32  # CIFAR-10's images are 32 x 32


@dataclass(frozen=True, kw_only=True)
class SGDSettings(Settings):
    name: str = one_of("sgd", ("sgd",))
    lr: float = number(REQUIRED, minimum=0.0)
    momentum: float = number(0.9, minimum=0.0, below=1.0)
    nesterov: bool = flag(False)
    weight_decay: float = number(0.0, minimum=0.0)
    norm_weight_decay: float | None = number(None, minimum=0.0, optional=True)


@dataclass(frozen=True, kw_only=True)
class AdamWSettings(Settings):
    name: str = one_of("adamw", ("adamw",))
    lr: float = number(REQUIRED, minimum=0.0)
    betas: tuple = numbers((0.9, 0.999), 2, minimum=0.0, below=1.0)
    eps: float = number(1e-8, minimum=0.0)
    weight_decay: float = number(0.01, minimum=0.0)
    norm_weight_decay: float | None = number(None, minimum=0.0, optional=True)


OPTIMIZERS = {"sgd": SGDSettings, "adamw": AdamWSettings}


@dataclass(frozen=True, kw_only=True)
class ScheduleSettings(Settings):
    """Per-step learning rate: a linear warm-up of warmup_epochs (if any), then cosine / one-cycle / linear decay to
    zero / constant."""

    name: str = one_of("cosine", SCHEDULES)
    warmup_epochs: float = number(0.0, minimum=0.0)


@dataclass(frozen=True, kw_only=True)
class AugmentSettings(Settings):
    """Random crop with zero padding (0: none), horizontal flip, Cutout square side (0: none), AutoAugment;
    alternate_flip: each image flipped in every other epoch rather than by a coin each epoch (data/augment.py)."""

    crop_padding: int = integer(4, minimum=0)
    flip: bool = flag(True)
    cutout: int = integer(0, minimum=0)
    autoaugment: bool = flag(False)
    alternate_flip: bool = flag(False)


@dataclass(frozen=True, kw_only=True)
class ProgressiveSettings(Settings):
    """Progressive resizing: the first `until` of the epochs (a fraction) train on the images downscaled to size x
    size pixels (data/resize.py), then, with a mid_size, the epochs up to `mid_until` at mid_size x mid_size, the
    rest at full size; the test set is always seen at full size. The network ends in a global average pool, so it
    takes any size; a smaller one costs less per epoch. size 0: every epoch at full size."""

    size: int = integer(0, minimum=0)
    until: float = number(0.0, minimum=0.0, below=1.0)
    mid_size: int = integer(0, minimum=0)
    mid_until: float = number(0.0, minimum=0.0, below=1.0)


@dataclass(frozen=True, kw_only=True)
class EMASettings(Settings):
    """An exponential moving average of the weights and batch-norm running statistics (optim/ema.py), evaluated,
    checkpointed and released in the trained weights' place. decay: per update, 0 for none (an average of decay 0
    is the weights themselves); every: training steps between updates; start: the fraction of the run's steps
    before which the average only follows the weights (it starts from a copy of them there)."""

    decay: float = number(0.0, minimum=0.0, below=1.0)
    every: int = integer(1, minimum=1)
    start: float = number(0.0, minimum=0.0, below=1.0)


@dataclass(frozen=True, kw_only=True)
class LookaheadSettings(Settings):
    """Lookahead (optim/lookahead.py): every `every` steps a slow copy of the weights moves toward them with a
    decay that ramps up to `decay` by the run's end, and the weights are reset to it. decay 0: none."""

    decay: float = number(0.0, minimum=0.0, below=1.0)
    every: int = integer(5, minimum=1)


@dataclass(frozen=True, kw_only=True)
class StemSettings(Settings):
    """The first convolution: init 'random' (torchvision's draw) or 'whiten' (its first 54 filters a whitening of the
    training images' 3 x 3 patches and their negations, nn/whitening.py; whiten_eps bounds the scale of the
    directions of least variance); frozen: never updated (its filter gradient is not computed either)."""

    init: str = one_of("random", ("random", "whiten"))
    whiten_eps: float = number(5e-4, above=0.0)
    frozen: bool = flag(False)


@dataclass(frozen=True, kw_only=True)
class TrainConfig(Settings):
    """A training run's hyperparameters. seed seeds the initial weights, the subset, shuffling and augmentation;
    engine: the convolutions' engine ('graph': cuDNN 9's graph API; 'legacy'; 'auto': both searched and timed,
    the faster kept per problem); deterministic: only deterministic convolution algorithms; cuda_graph: capture the
    training step and replay it;
    eval_cuda_graph: capture the per-epoch evaluation and replay it; eval_every: evaluate on the test set after
    every this many epochs and after the last (the epochs between log no test figures);
    allreduce_dtype: what a data-parallel run's gradients travel as (bf16: half the bytes, bf16 rounding); sync_bn:
    batch norm with the statistics of all ranks' batches (per-GPU statistics otherwise); overlap_allreduce: each
    gradient bucket's all-reduce starts during backward (not with sync_bn); tta: test-time augmentation of the
    evaluation ('flip': the mean logits of each test image and its mirror; 'flip-shift': also their copies shifted
    a pixel, data/tta_views.py; reported beside the plain figures);
    zero_init_residual: each residual block's last batch-norm scale starts at zero (the block starts as its
    shortcut); ema: the weights' moving average (EMASettings); lookahead: slow weights the trained ones are reset to
    (LookaheadSettings); progressive: the early epochs at a lower resolution (ProgressiveSettings); stem: how the
    first convolution starts and whether it trains (StemSettings)."""

    RENAMED = LEGACY_KEYS

    name: str = text("custom")
    model: str = one_of("resnet18", MODEL_NAMES)
    epochs: int = integer(REQUIRED, minimum=1, hint="set it in the recipe or with --epochs")
    batch_size: int = integer(256, minimum=1)
    eval_batch_size: int = integer(1000, minimum=1)
    eval_every: int = integer(1, minimum=1)
    precision: str = one_of("fp16", PRECISIONS)
    layout: str = one_of("NHWC", LAYOUTS)
    seed: int = integer(0, minimum=0)
    subset: int | None = integer(None, minimum=1, optional=True)
    label_smoothing: float = number(0.0, minimum=0.0, below=1.0)
    zero_init_residual: bool = flag(False)
    engine: str = one_of("auto", ENGINES)
    deterministic: bool = flag(False)
    cuda_graph: bool = flag(True)
    eval_cuda_graph: bool = flag(True)
    allreduce_dtype: str = one_of("fp32", ("fp32", "bf16"))
    sync_bn: bool = flag(False)
    overlap_allreduce: bool = flag(False)
    tta: str = one_of("none", TTA_MODES)
    optimizer: SGDSettings | AdamWSettings = variant(OPTIMIZERS, default="sgd")
    schedule: ScheduleSettings = section(ScheduleSettings)
    augment: AugmentSettings = section(AugmentSettings)
    ema: EMASettings = section(EMASettings)
    lookahead: LookaheadSettings = section(LookaheadSettings)
    progressive: ProgressiveSettings = section(ProgressiveSettings)
    stem: StemSettings = section(StemSettings)

    def check(self) -> None:
        p = self.progressive
        if p.size and not 8 <= p.size < FULL_SIZE:
            raise ValueError(f"progressive.size: expected 0 (off) or a size in [8, {FULL_SIZE}) pixels, got {p.size}")
        if p.mid_size and not (p.size and p.size < p.mid_size < FULL_SIZE and p.until < p.mid_until):
            raise ValueError(f"progressive.mid_size: expected 0 (off) or, after a progressive.size stage, a size in "
                             f"({p.size}, {FULL_SIZE}) pixels until a later fraction than progressive.until "
                             f"({p.until}); got mid_size {p.mid_size}, mid_until {p.mid_until}")
        if self.augment.alternate_flip and (self.augment.autoaugment or not self.augment.flip):
            raise ValueError("augment.alternate_flip: needs augment.flip, and not with augment.autoaugment (whose "
                             "workers flip by a coin)")
        if self.sync_bn and self.overlap_allreduce:
            raise ValueError("overlap_allreduce: not with sync_bn (both would use the NCCL communicator at once)")
        if self.schedule.warmup_epochs >= self.epochs:
            raise ValueError(f"schedule.warmup_epochs: {self.schedule.warmup_epochs} must be shorter than epochs "
                             f"({self.epochs}); for a run this short pass --warmup-epochs 0")

    @classmethod
    def from_saved(cls, config: dict) -> TrainConfig:
        """The configuration a checkpoint stored (an older checkpoint's too, with its old key names); what is no
        mapping goes to from_dict as it is, which refuses it."""
        return cls.from_dict(rename_legacy_keys(config) if isinstance(config, dict) else config)


# The settings whose change makes a resumed run differ from the interrupted one.
RESUME_KEYS = ("model", "epochs", "batch_size", "precision", "layout", "seed", "subset", "label_smoothing",
               "zero_init_residual", "optimizer", "schedule", "augment", "ema", "lookahead",
               "progressive", "stem")


def reduced_size(cfg: TrainConfig, epoch: int) -> int | None:
    """The side in pixels a (0-based) epoch's training images are downscaled to under progressive resizing; None
    for full size."""
    p = cfg.progressive
    for size, until in ((p.size, p.until), (p.mid_size, p.mid_until)):
        if size and epoch < int(until * cfg.epochs + 0.5):
            return size
    return None


def train_image_sizes(cfg: TrainConfig) -> tuple:
    """Every training image side a CIFAR-10 run meets, in order."""
    return tuple(dict.fromkeys(reduced_size(cfg, e) or FULL_SIZE for e in range(cfg.epochs)))


def resume_differences(saved: TrainConfig, cfg: TrainConfig) -> list[str]:
    """The RESUME_KEYS in which two configurations differ."""
    a, b = saved.to_dict(), cfg.to_dict()
    return [k for k in RESUME_KEYS if a[k] != b[k]]


def available_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def recipe_path(name_or_path) -> pathlib.Path:
    """The file of a recipe: a name ('A', 'B', 'C') in the package's recipes folder, or a path."""
    p = pathlib.Path(str(name_or_path))
    if not p.suffix:
        p = RECIPES_DIR / f"{name_or_path}.yaml"
        if not p.is_file():
            raise ValueError(f"recipe: unknown recipe {name_or_path!r} (available: {available_recipes()}, "
                             "or a path to a .yaml file)")
    return p


def load_recipe(name_or_path) -> dict:
    """A recipe's YAML mapping, by name ('A', 'B', 'C') from the package or from a file path; 'name' defaults to the
    file's stem. Read as plain data only (formats/yaml_file.py: at most 1 MiB, no Python objects, anchors,
    aliases or tags); ValueError naming the file when it cannot be read, is not YAML, or is not a mapping."""
    p = recipe_path(name_or_path)
    recipe = load_plain_yaml(p, label="recipe ")
    if not isinstance(recipe, dict):
        raise ValueError(f"recipe {p}: expected a YAML mapping at the top level, got "
                         f"{'nothing' if recipe is None else type(recipe).__name__}")
    recipe.setdefault("name", p.stem)
    return recipe


def merge(base: dict, overrides: dict) -> dict:
    """base with overrides applied, nested blocks merged key by key (neither argument is changed)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            value = merge(out[key], value)
        out[key] = value
    return out


def _keys(tree: dict, prefix: str = "") -> set:
    """The dotted keys of a nested mapping ({'optimizer': {'lr': 1}} -> {'optimizer', 'optimizer.lr'})."""
    out = set()
    for key, value in tree.items():
        out.add(prefix + str(key))
        if isinstance(value, dict):
            out |= _keys(value, prefix + str(key) + ".")
    return out


def recipe_config(name_or_path, overrides: dict | None = None) -> TrainConfig:
    """A recipe with overrides ({'epochs': 3, 'optimizer': {'lr': 0.05}}) applied, checked. An error in a value
    the recipe file gave names the file as well as the key; one in an override names the key."""
    overrides = overrides or {}
    recipe = load_recipe(name_or_path)
    try:
        return TrainConfig.from_dict(merge(recipe, overrides))
    except ValueError as e:
        key = re.split(r"[:\[ ]", str(e), maxsplit=1)[0]
        if key in _keys(overrides):
            raise
        raise ValueError(f"recipe {recipe_path(name_or_path)}: {e}") from None
