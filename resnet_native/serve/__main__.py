"""python -m resnet_native.serve: see resnet_native/serve/cli.py."""

import sys

from .cli import main

if __name__ == "__main__":  # not in a spawned --workers process
    sys.exit(main())
