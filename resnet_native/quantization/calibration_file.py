"""A calibration and its JSON file: what the int8 / FP8 engine needs besides the weights.

    {"format": "resnet_native.calibration", "version": 1,
     "dtype": "int8" | "fp8", "method": "max" | "percentile" | "entropy", "percentile": number | null,
     "values": [the plan's value names, in plan order],
     "activation_scales": {value name: scale > 0},      the inputs of the quantised convolutions
     "weight_scales": {conv step name: [scale > 0 per output channel]}}

The value names (simulate.value_names: 'input', then each value named after the step producing it) tie the scales
to one network: loading against another plan fails on them. Loading checks every field (a ValueError naming the
file and the field); json reads only data, and NaN, Infinity and duplicate keys are refused. Writes are atomic.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from .._core.files import atomic_write_text
from .calibration import METHODS, QUANT_DTYPES

FORMAT = "resnet_native.calibration"
VERSION = 1
FIELDS = ("format", "version", "dtype", "method", "percentile", "values", "activation_scales", "weight_scales")


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Scales for one plan: activation_scales by value name, weight_scales (one per output channel) by step."""

    dtype: str
    method: str
    percentile: float | None
    values: tuple
    activation_scales: dict
    weight_scales: dict

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "dtype": self.dtype, "method": self.method,
                "percentile": self.percentile, "values": list(self.values),
                "activation_scales": {k: float(v) for k, v in self.activation_scales.items()},
                "weight_scales": {k: [float(s) for s in v] for k, v in self.weight_scales.items()}}


class _Fields:
    """Checks of one file's fields; every error names the file and the field."""

    def __init__(self, path):
        self.path = path

    def error(self, field: str, expected: str, got) -> ValueError:
        return ValueError(f"{self.path}: field {field!r}: expected {expected}, got {got!r}")

    def scale(self, field: str, value) -> float:
        # Compared with float's range, not math.isfinite: that raises OverflowError for an int of 400 digits.
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= sys.float_info.max:
            raise self.error(field, "a finite number > 0", value)
        return float(value)

    def names(self, field: str, value) -> tuple:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise self.error(field, "a non-empty list of non-empty strings", value)
        if len(set(value)) != len(value):
            raise self.error(field, "distinct names", value)
        return tuple(value)


def _reject_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate keys {sorted({k for k in keys if keys.count(k) > 1})}")
    return dict(pairs)


def calibration_from_json(data, path="<calibration>") -> Calibration:
    """The Calibration a parsed file holds, every field checked (ValueError naming `path` and the field)."""
    f = _Fields(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    missing, unknown = [k for k in FIELDS if k not in data], sorted(set(data) - set(FIELDS))
    if missing or unknown:
        raise ValueError(f"{path}: expected exactly the fields {', '.join(FIELDS)} (missing {missing}, unknown "
                         f"{unknown})")
    if data["format"] != FORMAT:
        raise f.error("format", repr(FORMAT), data["format"])
    if isinstance(data["version"], bool) or data["version"] != VERSION:
        raise f.error("version", str(VERSION), data["version"])
    for field, allowed in (("dtype", QUANT_DTYPES), ("method", METHODS)):
        if data[field] not in allowed:
            raise f.error(field, f"one of {', '.join(map(repr, allowed))}", data[field])
    percentile = data["percentile"]
    if data["method"] == "percentile":
        if isinstance(percentile, bool) or not isinstance(percentile, int | float) or not 0 < percentile <= 100:
            raise f.error("percentile", "a number in (0, 100] for method 'percentile'", percentile)
        percentile = float(percentile)
    elif percentile is not None:
        raise f.error("percentile", f"null for method {data['method']!r}", percentile)
    values = f.names("values", data["values"])
    acts = data["activation_scales"]
    if not isinstance(acts, dict) or not acts:
        raise f.error("activation_scales", "a non-empty object of value name: scale", acts)
    for name in acts:
        if name not in values:
            raise f.error("activation_scales", "names from 'values'", name)
    activation_scales = {k: f.scale(f"activation_scales.{k}", v) for k, v in acts.items()}
    weights = data["weight_scales"]
    if not isinstance(weights, dict) or not weights:
        raise f.error("weight_scales", "a non-empty object of layer name: [scale, ...]", weights)
    weight_scales = {}
    for name, scales in weights.items():
        if not isinstance(scales, list) or not scales:
            raise f.error(f"weight_scales.{name}", "a non-empty list of scales", scales)
        weight_scales[name] = tuple(f.scale(f"weight_scales.{name}[{i}]", s) for i, s in enumerate(scales))
    return Calibration(data["dtype"], data["method"], percentile, values, activation_scales, weight_scales)


def save_calibration(calibration: Calibration, path) -> pathlib.Path:
    """Write `calibration` to `path` as JSON, atomically (checked as load_calibration checks it, first)."""
    if not isinstance(calibration, Calibration):
        raise TypeError(f"calibration: expected a Calibration, got {type(calibration).__name__}")
    data = calibration.to_json()
    calibration_from_json(data, "calibration")
    path = pathlib.Path(path)
    atomic_write_text(path, json.dumps(data, indent=2, allow_nan=False) + "\n")
    return path


def load_calibration(path, dtype: str | None = None) -> Calibration:
    """The Calibration in the JSON file at `path`; ValueError naming the file and the field if malformed, nested
    too deeply, or (dtype given) made for another dtype than `dtype`."""
    path = pathlib.Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant,
                          object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not a calibration JSON file ({e})") from None
    except RecursionError:
        raise ValueError(f"{path}: not a calibration JSON file (nested too deeply)") from None
    calibration = calibration_from_json(data, path)
    if dtype is not None and calibration.dtype != dtype:
        raise ValueError(f"{path}: field 'dtype': made for {calibration.dtype!r}, but {dtype!r} was asked for")
    return calibration
