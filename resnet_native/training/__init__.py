"""Training CIFAR-10 ResNets: the recipe (config), the objects built from it (builders), the run (loop), the
per-epoch evaluation (evaluation), background checkpoint writes (checkpoint_writer) and the command line (cli;
`python -m resnet_native.train`)."""

from .builders import make_deterministic
from .config import TrainConfig, available_recipes, load_recipe, recipe_config
from .evaluation import Evaluation, evaluate
from .loop import STATE_FORMAT, Trainer

__all__ = ["STATE_FORMAT", "Evaluation", "TrainConfig", "Trainer", "available_recipes", "evaluate", "load_recipe",
           "make_deterministic", "recipe_config"]
