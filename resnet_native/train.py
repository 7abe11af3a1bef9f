"""Train a ResNet on CIFAR-10 from a YAML recipe: `python -m resnet_native.train --recipe A|B [options]`.

The command's entry point. The trainer itself is the package resnet_native.training: config.py (the recipe's
settings), builders.py (network, optimizer, schedule, scaler, step), loop.py (Trainer, the run folder),
checkpoint_writer.py, and cli.py (this command's options).
"""

from .training.builders import make_deterministic
from .training.cli import main

__all__ = ["main", "make_deterministic"]

if __name__ == "__main__":
    main()
