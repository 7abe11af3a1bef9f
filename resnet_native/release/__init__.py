"""Releases: a trained run packaged as a versioned folder (build.py, `python -m resnet_native.release`), its ONNX
export (onnx_export.py) and CIFAR10Classifier, which serves one (classifier.py). The folder's format is read by
resnet_native.formats.release_folder."""

import importlib

from .classifier import CIFAR10Classifier  # noqa: F401
from .onnx_export import export_onnx  # noqa: F401

_BUILD_NAMES = ("release", "main")


def __getattr__(name):
    # The builder loads on first use: a process that only serves a release never imports it.
    if name in _BUILD_NAMES:
        return getattr(importlib.import_module(f"{__name__}.build"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
