"""The network: layers (Conv2d, BatchNorm2d, ...), models (ResNet and its blocks, the registry) and parameters."""

from . import layers, models, params  # noqa: F401
