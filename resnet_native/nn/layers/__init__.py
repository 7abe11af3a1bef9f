"""The layers of the Python graph: small classes with explicit forward(x, train) and backward(dy), placed on the GPU
or the host with their model (_core/placement.py)."""

from ...ops.losses import SoftmaxCrossEntropy
from .add import Add
from .batchnorm2d import BatchNorm2d, synchronize_batch_norms
from .conv2d import Conv2d
from .global_avg_pool import GlobalAvgPool
from .linear import Linear
from .maxpool2d import MaxPool2d
from .module import Module
from .relu import ReLU
from .sequential import Sequential

__all__ = [
    "Add",
    "BatchNorm2d",
    "Conv2d",
    "GlobalAvgPool",
    "Linear",
    "MaxPool2d",
    "Module",
    "ReLU",
    "Sequential",
    "SoftmaxCrossEntropy",
    "synchronize_batch_norms",
]
