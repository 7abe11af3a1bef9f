"""Training CIFAR-10 ResNets: the recipe (config), the objects built from it (builders), the run (loop), background
checkpoint writes (checkpoint_writer) and the command line (cli; `python -m resnet_native.train`)."""

from .builders import make_deterministic
from .config import TrainConfig, available_recipes, load_recipe, recipe_config
from .loop import STATE_FORMAT, Trainer, evaluate

__all__ = ["STATE_FORMAT", "TrainConfig", "Trainer", "available_recipes", "evaluate", "load_recipe",
           "make_deterministic", "recipe_config"]
