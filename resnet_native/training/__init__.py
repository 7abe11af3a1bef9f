"""Training CIFAR-10 ResNets from a recipe (`python -m resnet_native.train`), one module a concern: config and
settings (the recipe and the command's overrides, checked into a TrainConfig), builders (network, optimizer,
schedule, loss scaler and TrainStep), loop (Trainer: the run folder, the epochs, resuming), queued_epoch (epoch
k + 1 queued before epoch k's figures are read), epoch_upload (AutoAugment's epochs copied on a side stream),
evaluation (the per-epoch evaluation, captured), snapshot and checkpoint_writer (checkpoints staged on the device,
written on a thread), metrics_log (metrics.csv, TensorBoard, curves), warm_start (decode and algorithm searches
overlapped on a fresh machine), stopwatch (where the wall time went, from the process's start) and cli (the
command line).
"""

from .builders import make_deterministic
from .config import TrainConfig, available_recipes, load_recipe, recipe_config
from .evaluation import Evaluation, evaluate
from .loop import STATE_FORMAT, Trainer

__all__ = ["STATE_FORMAT", "Evaluation", "TrainConfig", "Trainer", "available_recipes", "evaluate", "load_recipe",
           "make_deterministic", "recipe_config"]
