"""The one model registry: the network names the trainer, releases and the classifier know, their constructors, and
the CIFAR-10 constants every such network is built with.

A release's config.yaml describes its network with model_spec(); model_from_spec() builds it back. Neither needs the
trainer, so serving a release never imports training code.
"""

from __future__ import annotations

from ..._core.names import LAYOUTS, MODEL_NAMES, PRECISIONS, choice
from ...data.cifar10 import CLASSES
from .resnet import ResNet18, ResNet34, ResNet50, ResNet101, ResNet152

MODELS = {"resnet18": ResNet18, "resnet34": ResNet34, "resnet50": ResNet50, "resnet101": ResNet101,
          "resnet152": ResNet152}
if tuple(MODELS) != MODEL_NAMES:
    raise ImportError(f"_core.names.MODEL_NAMES {MODEL_NAMES} must list the registered networks {tuple(MODELS)}")

# CIFAR-10: ten classes of 32x32 images, hence the small-image stem (3x3 convolution, no max-pool).
NUM_CLASSES = len(CLASSES)
STEM = "cifar"

# Keys renamed since older checkpoints and releases were written: old name -> new name. The model's precision was
# called 'dtype' in a run's configuration and in a release's model section.
LEGACY_KEYS = {"dtype": "precision"}


def rename_legacy_keys(mapping: dict) -> dict:
    """A copy of a configuration read from an older checkpoint or release, with its old key names replaced."""
    out = dict(mapping)
    for old, new in LEGACY_KEYS.items():
        if old in out:
            out.setdefault(new, out.pop(old))
    return out


def create_model(name: str, *, layout: str, precision: str, seed=None, num_classes: int = NUM_CLASSES,
                 stem: str = STEM, initialize: bool = True):
    """The registered network `name`, on the host (call .cuda() to move it to the GPU); initialize=False:
    nothing drawn, the convolutions' and fc's weights zero (a copy about to receive another model's values)."""
    constructor = MODELS[choice("model", name, MODEL_NAMES)]
    return constructor(num_classes=num_classes, stem=stem, layout=choice("layout", layout, LAYOUTS),
                       precision=choice("precision", precision, PRECISIONS), seed=seed, initialize=initialize)


def model_spec(name: str, *, layout: str, precision: str) -> dict:
    """How a release describes its network (config.yaml's model section)."""
    choice("model", name, MODEL_NAMES)
    return {"name": name, "num_classes": NUM_CLASSES, "stem": STEM, "layout": layout, "precision": precision}


def model_from_spec(spec: dict):
    """The network a model_spec() describes (also an older release's, which called the precision 'dtype')."""
    spec = rename_legacy_keys(spec)
    return create_model(spec["name"], layout=spec["layout"], precision=spec["precision"],
                        num_classes=int(spec["num_classes"]), stem=spec["stem"])
