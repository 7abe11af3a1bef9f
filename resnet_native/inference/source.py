"""What an inference engine is built from: a ResNet's weights and architecture fields, from a model or a release.

A model contributes its state_dict (torchvision names and shapes) and its `stem` and `num_classes`; a release
folder (or a version name looked up like CIFAR10Classifier does) its config.yaml and weights file. Nothing else of
the model is used, so any network with those names and shapes serves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..formats.release_folder import calibration_file, load_release_config, load_weights, resolve_version_dir
from ..nn.models import ResNet
from ..quantization import load_calibration
from .simulate import check_calibration_fits


@dataclass(frozen=True)
class ModelSource:
    state: dict  # {torchvision name: host array}
    stem: str
    num_classes: int
    description: str
    name: str = "resnet"  # the architecture's name ('resnet18', ...)
    config: dict | None = None  # a release's config.yaml (classes, input normalisation, version); None for a model


def model_source(model_or_release, models_dir=None) -> ModelSource:
    """A ModelSource from a resnet_native ResNet, a release folder, or a release version name ('A', ...)."""
    if isinstance(model_or_release, ResNet):
        m = model_or_release
        state = {k: np.asarray(v) for k, v in m.state_dict().items()}
        return ModelSource(state, m.stem, int(m.num_classes), f"ResNet-{m.depth}", f"resnet{m.depth}")
    if isinstance(model_or_release, (str, os.PathLike)):
        # version_X is a link a new release re-points: read config and weights from one release folder.
        folder = resolve_version_dir(model_or_release, models_dir).resolve()
        config = load_release_config(folder)
        model = config.get("model") if isinstance(config, dict) else None
        if not isinstance(model, dict) or "stem" not in model or "num_classes" not in model:
            raise ValueError(f"{folder}/config.yaml: expected a 'model' section with 'stem' and 'num_classes'")
        state = {k: np.asarray(v) for k, v in load_weights(folder).items()}
        name = str(model.get("name", "resnet"))
        # The release's own name: the folder read may be the hidden one a version_X link points to.
        version = config.get("version")
        label = f"version_{version}" if isinstance(version, str) and version else folder.name
        return ModelSource(state, str(model["stem"]), int(model["num_classes"]), f"release {label} ({name})",
                           name, config)
    raise TypeError(f"model_or_release: expected a resnet_native ResNet, a release folder or a version name, got "
                    f"{type(model_or_release).__name__}")


def release_calibration(model_or_release, models_dir, dtype: str, source: ModelSource | None = None):
    """The calibration_<dtype>.json of a release (release --int8 / --fp8), checked to be for `dtype` and to fit the
    release's network (a scale for each of its layers, none for another's); ValueError for a model, which has
    none. source: the release's ModelSource when the caller has read it already (else it is read here)."""
    if not isinstance(model_or_release, (str, os.PathLike)):
        raise ValueError(f"calibration: a {dtype} engine of a model needs calibration= (quantization.calibrate); "
                         "a release carries its own")
    path = resolve_version_dir(model_or_release, models_dir).resolve() / calibration_file(dtype)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: this release has no {dtype} calibration; make one with `python -m "
                                f"resnet_native.release --run RUN --version VERSION --{dtype} --data CIFAR10`")
    calibration = load_calibration(path, dtype)  # a file made for another dtype is refused, naming both
    source = source if source is not None else model_source(model_or_release, models_dir)
    return check_calibration_fits(calibration, source.state, source.stem, path)
