"""ResNet models on the native ops."""

from .blocks import BasicBlock, Bottleneck
from .resnet import ResNet, ResNet18, ResNet34, ResNet50, ResNet101, ResNet152

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "ResNet18", "ResNet34", "ResNet50", "ResNet101", "ResNet152"]
