"""Deprecated import paths, kept for one release: the modules and names that moved when the package's folders
became its layers. `import resnet_native.conv` still works (it is resnet_native.ops.conv, with a
DeprecationWarning), and so does `from resnet_native.quantization import calibrate`."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_PACKAGE = __name__.rpartition(".")[0]

# Old module (relative to the package) -> its new home. A package's entry covers its submodules.
MOVED_MODULES = {
    "_loader": "_core.loader",
    "_runtime": "_core.runtime",
    "names": "_core.names",
    "cuda_graph": "_core.capture",
    "readback": "_core.readback",
    "layers.placement": "_core.placement",
    "layers.buffers": "_core.buffers",
    "checkpoint": "formats.checkpoint",
    "conv": "ops.conv",
    "conv_spec": "ops.conv_spec",
    "norm": "ops.norm",
    "pool": "ops.pool",
    "kernels": "ops.kernels",
    "multi_tensor": "ops.multi_tensor",
    "quantized_conv": "ops.quantized_conv",
    "losses": "ops.losses",
    "layers": "nn.layers",
    "models": "nn.models",
    "params": "nn.params",
    "step": "optim.step",
    "metrics_log": "training.metrics_log",
    "quantization.simulate": "inference.simulate",
    "quantization.selection": "inference.calibration_choice",
    "classifier": "release.classifier",
    "onnx_export": "release.onnx_export",
}

# Names a package re-exported from a module that now sits above it: package -> {name: new module}.
MOVED_NAMES = {
    "quantization": {
        **dict.fromkeys(("calibrate", "calibrate_many", "float_logits", "simulate_logits", "value_names"),
                        "inference.simulate"),
        **dict.fromkeys(("choose_calibration", "choose_calibrations"), "inference.calibration_choice"),
    },
}


def new_name(old: str) -> str | None:
    """The new relative name of an old relative module name, or None when it did not move."""
    if old in MOVED_MODULES:
        return MOVED_MODULES[old]
    parent, _, last = old.rpartition(".")
    if parent:
        moved = new_name(parent)
        return f"{moved}.{last}" if moved else None
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        # The import system set the alias's spec on the shared module object: give it back its own.
        module.__spec__ = sys.modules[self.target].__spec__


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_PACKAGE + "."):
            return None
        moved = new_name(fullname[len(_PACKAGE) + 1:])
        if moved is None:
            return None
        target_name = f"{_PACKAGE}.{moved}"
        warnings.warn(f"{fullname} moved to {target_name}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _AliasLoader(target_name))


def _moved_attribute(package: str, names: dict):
    def __getattr__(name):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        target = f"{_PACKAGE}.{names[name]}"
        warnings.warn(f"{package}.{name} moved to {target}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(target), name)

    return __getattr__


def install() -> None:
    """Put the finder of moved modules on sys.meta_path and the moved names on their old packages."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())  # first: an old package path must not load a second copy
    for package, names in MOVED_NAMES.items():
        module = importlib.import_module(f"{_PACKAGE}.{package}")
        module.__getattr__ = _moved_attribute(module.__name__, names)
