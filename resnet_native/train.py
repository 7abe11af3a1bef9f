"""Train a ResNet on CIFAR-10 from a YAML recipe: `python -m resnet_native.train --recipe A|B|C [options]`.

The command's entry point; the trainer is the package resnet_native.training (its __init__ lists the modules).
"""

from .training.builders import make_deterministic
from .training.cli import main
from .training.stopwatch import process_start

__all__ = ["main", "make_deterministic"]

if __name__ == "__main__":  # the run's wall time counts from the process's start: interpreter and imports included
    main(started_at=process_start())
