"""The release folder: <models_dir>/version_<V>/ with config.yaml, model.safetensors (or model.npz), preprocess.json,
metrics.json, model.onnx and calibration_<dtype>.json.

Reading a release lives here, below every layer that reads one (the inference engine, the classifier, the server),
so that none of them has to import the code that builds releases.
"""

from __future__ import annotations

import os
import pathlib

from ..formats.checkpoint import NpzReader

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


def load_release_config(version_dir) -> dict:
    """A release's config.yaml (safe YAML only), or a ValueError naming the file."""
    import yaml

    path = pathlib.Path(version_dir) / "config.yaml"
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a valid YAML file ({e})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise ValueError(f"{path}: expected a mapping with a 'model' section, got {type(config).__name__}")
    return config


def load_weights(version_dir) -> dict:
    """The release's state_dict, as NumPy arrays: model.safetensors (or an older release's model.npz)."""
    d = pathlib.Path(version_dir)
    if (d / "model.safetensors").is_file():
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            return dict(load_file(str(d / "model.safetensors")))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{d / 'model.safetensors'}: not a readable safetensors file ({e})") from None
    if (d / "model.npz").is_file():
        # Each member's header is checked against its stored size before anything is allocated.
        with NpzReader(d / "model.npz") as z:
            return {k: z.read(k) for k in z.names}
    raise FileNotFoundError(f"{d}: neither model.safetensors nor model.npz")


def preprocess_values(config: dict) -> dict:
    """preprocess.json: what the standalone preprocess.py needs from a release's config."""
    return {"version": config["version"], "classes": config["classes"], "mean": config["input"]["mean"],
            "std": config["input"]["std"], "layout": config["model"]["layout"]}


def calibration_file(dtype: str) -> str:
    """The name of a release's calibration for `dtype` ('int8' or 'fp8')."""
    return f"calibration_{dtype}.json"
