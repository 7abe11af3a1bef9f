"""CIFAR-10 data: readers and cache (cifar10), download, GPU augmentation (augment), AutoAugment (autoaugment)."""

from .augment import MEAN, STD, AugmentConfig, GpuAugmenter, normalize_on_gpu, normalize_on_host, sample_epoch
from .cifar10 import CLASSES, CIFAR10Data, decode_source, default_data_path, detect_format, load_cifar10
from .download import download

__all__ = [
    "CLASSES",
    "MEAN",
    "STD",
    "AugmentConfig",
    "CIFAR10Data",
    "GpuAugmenter",
    "decode_source",
    "default_data_path",
    "detect_format",
    "download",
    "load_cifar10",
    "normalize_on_gpu",
    "normalize_on_host",
    "sample_epoch",
]
