"""Train a ResNet on CIFAR-10 from a YAML recipe: `python -m resnet_native.train --recipe A|B|C [options]`.

The command's entry point; the trainer is the package resnet_native.training (its __init__ lists the modules).
"""

import os
import sys

from .training.builders import make_deterministic
from .training.cli import main
from .training.stopwatch import process_start

__all__ = ["main", "make_deterministic"]

if __name__ == "__main__":  # the run's wall time counts from the process's start: interpreter and imports included
    main(started_at=process_start())
    # Every file of the run is written and closed and its threads and child processes joined by now; what is left
    # is the interpreter's teardown (the CUDA context, cuDNN's handles, page-locked buffers, every object), which
    # the operating system does faster, and which a user of the command would only wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
