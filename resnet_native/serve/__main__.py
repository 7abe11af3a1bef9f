"""python -m resnet_native.serve: see resnet_native/serve/cli.py."""

import sys

from .cli import main

sys.exit(main())
