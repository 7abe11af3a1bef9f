"""The release folder: <models_dir>/version_<V>/ with config.yaml, model.safetensors (or model.npz), preprocess.json,
metrics.json, model.onnx and calibration_<dtype>.json.

Reading a release lives here, below every layer that reads one (the inference engine, the classifier, the server),
so that none of them has to import the code that builds releases.
"""

from __future__ import annotations

import os
import pathlib
import sys

import numpy as np

from .._core.names import LAYOUTS, MODEL_NAMES, PRECISIONS
from ..formats.checkpoint import NpzReader
from .yaml_file import load_plain_yaml

DEFAULT_MODELS_DIR = "cifar10_models"


def models_dir_default() -> pathlib.Path:
    return pathlib.Path(os.environ.get("RESNET_NATIVE_MODELS", DEFAULT_MODELS_DIR))


def resolve_version_dir(version, models_dir=None) -> pathlib.Path:
    """'A' -> <models_dir>/version_A; a path to a version folder is used as is."""
    p = pathlib.Path(str(version))
    if p.is_dir() and (p / "config.yaml").is_file():
        return p
    root = pathlib.Path(models_dir) if models_dir is not None else models_dir_default()
    d = root / f"version_{version}"
    if not (d / "config.yaml").is_file():
        have = sorted(x.name for x in root.glob("version_*")) if root.is_dir() else []
        raise FileNotFoundError(f"CIFAR-10 model version {version!r}: no {d}/config.yaml (found: {have or 'none'})")
    return d


# Bounds of a release's config.yaml (check_release_config).
MAX_CLASSES = 100_000
MAX_CLASS_NAME = 64
STEMS = ("cifar", "imagenet")
# The safetensors dtypes NumPy has a type for (BF16 and the FP8 / FP4 types have none: reading them fails in the
# safetensors library with a TypeError or AttributeError, not naming the file).
NUMPY_SAFETENSORS_DTYPES = ("BOOL", "U8", "I8", "U16", "I16", "F16", "U32", "I32", "F32", "U64", "I64", "F64", "C64")


def _field_error(path, field: str, expected: str, got) -> ValueError:
    return ValueError(f"{path}: field {field!r}: expected {expected}, got {got!r}"[:2000])


def _is_number(v) -> bool:
    """A finite int or float that a float holds (not NaN, not infinite, no int past float's range)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and -sys.float_info.max <= v <= sys.float_info.max


def check_release_config(config, path="config.yaml") -> dict:
    """`config` (a release's config.yaml, parsed) if every field the backends read has the type and range they
    expect, else a ValueError naming `path` and the field. The one check every backend relies on (the engine,
    onnxruntime, NumPy, int8 / FP8): load_release_config calls it, and release() before writing a release. An
    older release's model.dtype is accepted for model.precision."""
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a mapping with 'model' and 'input' sections, got "
                         f"{type(config).__name__}")
    model = config.get("model")
    if not isinstance(model, dict):
        raise _field_error(path, "model", "a mapping", model)
    for field, allowed in (("name", MODEL_NAMES), ("layout", LAYOUTS), ("stem", STEMS)):
        if field in model or field != "stem":
            value = model.get(field)
            if not isinstance(value, str) or value not in allowed:
                raise _field_error(path, f"model.{field}", f"one of {', '.join(map(repr, allowed))}", value)
    key = "precision" if "precision" in model or "dtype" not in model else "dtype"  # an older release: 'dtype'
    if not isinstance(model.get(key), str) or model.get(key) not in PRECISIONS:
        raise _field_error(path, f"model.{key}", f"one of {', '.join(map(repr, PRECISIONS))}", model.get(key))
    n = model.get("num_classes")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_CLASSES:
        raise _field_error(path, "model.num_classes", f"an int in [1, {MAX_CLASSES}]", n)
    if "classes" in config:
        classes = config["classes"]
        if not isinstance(classes, list):
            raise _field_error(path, "classes", f"a list of {n} class names (model.num_classes)", classes)
        if len(classes) != n:
            raise ValueError(f"{path}: {len(classes)} class names for a model of {n} classes (field 'classes' "
                             "lists model.num_classes names)")
        for i, c in enumerate(classes):
            if not isinstance(c, str) or not 0 < len(c) <= MAX_CLASS_NAME:
                raise _field_error(path, f"classes[{i}]", f"a string of 1 to {MAX_CLASS_NAME} characters", c)
    inp = config.get("input")
    if not isinstance(inp, dict):
        raise _field_error(path, "input", "a mapping with 'mean' and 'std'", inp)
    for field in ("mean", "std"):
        v = inp.get(field)
        if not isinstance(v, list) or len(v) != 3 or not all(_is_number(x) for x in v) or (
                field == "std" and not all(x > 0 for x in v)):
            raise _field_error(path, f"input.{field}",
                               "3 finite numbers" + (" > 0" if field == "std" else ""), v)
    version = config.get("version")
    if version is not None and not isinstance(version, str | int):
        raise _field_error(path, "version", "a string", version)
    return config


def load_release_config(version_dir) -> dict:
    """A release's config.yaml: plain YAML only (bounded in size; no aliases, anchors or tags: formats/yaml_file.py),
    every field checked by check_release_config; a ValueError naming the file and the field."""
    path = pathlib.Path(version_dir) / "config.yaml"
    return check_release_config(load_plain_yaml(path, invalid="not a valid YAML file"), path)


def load_weights(version_dir) -> dict:
    """The release's state_dict, as NumPy arrays: model.safetensors (or an older release's model.npz). A tensor
    holding NaN or infinity, or of a dtype NumPy has no type for, is refused (a ValueError naming the file and the
    tensor)."""
    d = pathlib.Path(version_dir)
    if (d / "model.safetensors").is_file():
        from safetensors import SafetensorError, safe_open

        path = d / "model.safetensors"
        try:
            with safe_open(str(path), framework="np") as f:
                for name in f.keys():
                    dtype = f.get_slice(name).get_dtype()
                    if dtype not in NUMPY_SAFETENSORS_DTYPES:
                        raise ValueError(f"{path}: tensor {name!r} is of dtype {dtype}, which NumPy cannot hold "
                                         f"(expected one of {', '.join(NUMPY_SAFETENSORS_DTYPES)})")
                weights = {name: f.get_tensor(name) for name in f.keys()}
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    elif (d / "model.npz").is_file():
        # Each member's header is checked against its stored size before anything is allocated.
        path = d / "model.npz"
        with NpzReader(path) as z:
            weights = {k: z.read(k) for k in z.names}
    else:
        raise FileNotFoundError(f"{d}: neither model.safetensors nor model.npz")
    for name, w in weights.items():
        if np.asarray(w).dtype.kind in "fc" and not np.isfinite(w).all():
            raise ValueError(f"{path}: tensor {name!r} holds NaN or infinite values")
    return weights


def preprocess_values(config: dict) -> dict:
    """preprocess.json: what the standalone preprocess.py needs from a release's config."""
    return {"version": config["version"], "classes": config["classes"], "mean": config["input"]["mean"],
            "std": config["input"]["std"], "layout": config["model"]["layout"]}


def calibration_file(dtype: str) -> str:
    """The name of a release's calibration for `dtype` ('int8' or 'fp8')."""
    return f"calibration_{dtype}.json"
