"""2-D convolutions on cuDNN, with algorithm search and a process-wide algorithm cache.

Activations are (N, C, H, W) arrays in the NCHW layout and (N, H, W, C) arrays in NHWC; filters are (K, C/groups,
R, S) and (K, R, S, C/groups) respectively. Every array must have the storage dtype of the spec's precision:
float32 for 'fp32' (strict FMA math) and 'tf32' (TF32 tensor cores allowed), float16 for 'fp16', and uint16 arrays
holding bfloat16 bit patterns for 'bf16' (cupy has no bfloat16); fp16 and bf16 accumulate in fp32.

Algorithm choice (ConvSpec.algo), per direction:
  'find'       time the candidates on the call's own arrays (cudnnFind*AlgorithmEx) once per problem;
  'heuristic'  cuDNN's heuristic ranking (cudnnGet*Algorithm_v7), no timing;
  a name       that algorithm, e.g. 'IMPLICIT_PRECOMP_GEMM' (forward), 'ALGO_1' (backward-data and -filter),
               or one per direction: 'fwd=IMPLICIT_PRECOMP_GEMM;bwd_data=ALGO_1;bwd_filter=heuristic'
               (directions left out use 'heuristic'); 'ENGINE_<n>' names a graph-engine engine id.
The choice is cached per problem (shapes, dtypes, layout, geometry, math, determinism, workspace cap, engine,
mode) in memory; save_algorithm_cache / load_algorithm_cache keep it across runs on the same GPU model and cuDNN
version. Outputs passed as `out=` are written in place; with out=None they are allocated with cupy first.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
import warnings
from dataclasses import dataclass, field
from functools import cache, lru_cache

import numpy as np

from . import reference
from ._loader import _C
from ._runtime import op_stream as _stream
from ._runtime import require_gpu
from .checkpoint import atomic_write_text
from .names import (
    ACTIVATIONS,
    ALGO_MODES,
    DIRECTION_ALIASES,
    DIRECTIONS,
    ENGINES,
    EPILOGUE_PARTS,
    LAYOUTS,
    PRECISIONS,
    canonical_dtype,
    choice,
)

_CACHE_FORMAT = "resnet_native.algorithm_cache"
_CACHE_VERSION = 1

# The native core's typed enums by name (their member names are the names above).
_NATIVE_LAYOUT = dict(_C.Layout.__members__)
_NATIVE_PRECISION = dict(_C.Precision.__members__)
_NATIVE_ENGINE = dict(_C.Engine.__members__)
_NATIVE_ALGO_MODE = dict(_C.AlgoMode.__members__)
_NATIVE_DIRECTION = dict(_C.Direction.__members__)
_NATIVE_DTYPE = dict(_C.DType.__members__)

_default_engine = "auto"
_fusion_enabled = True


def set_default_engine(engine: str) -> None:
    """The engine of ConvSpecs (and so of Conv2d layers) created from now on without engine=: 'auto' (the
    default: the faster engine per problem, timed once), 'legacy' or 'graph'."""
    global _default_engine
    _default_engine = choice("engine", engine, ENGINES)


def default_engine() -> str:
    return _default_engine


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _pair(value, name: str) -> tuple:
    """(int, int) from an int or a pair of ints; the native spec checks the range."""
    if _is_int(value):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(_is_int(v) for v in value):
        raise ValueError(f"{name}: expected an int or a pair of ints, got {value!r}")
    return (int(value[0]), int(value[1]))


@dataclass(frozen=True)
class ConvSpec:
    """How to convolve: geometry, layout, precision, algorithm choice, engine and determinism.

    stride, padding and dilation take an int or a pair (height, width). engine defaults to the module default
    (set_default_engine) at the time the spec is created. Every value is checked here (ValueError naming the
    field), when the native spec of each direction is built and kept on the spec; only an algorithm name that does
    not exist in a direction, or names the other engine, raises where that direction is used.
    """

    stride: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    layout: str = "NCHW"
    precision: str = "fp32"
    algo: str = "find"
    engine: str = field(default_factory=default_engine)
    deterministic: bool = False

    def __post_init__(self):
        object.__setattr__(self, "stride", _pair(self.stride, "stride"))
        object.__setattr__(self, "padding", _pair(self.padding, "padding"))
        object.__setattr__(self, "dilation", _pair(self.dilation, "dilation"))
        if not _is_int(self.groups):
            raise ValueError(f"groups: expected an int >= 1, got {self.groups!r}")
        object.__setattr__(self, "groups", int(self.groups))
        choice("layout", self.layout, LAYOUTS)
        choice("precision", self.precision, PRECISIONS)
        choice("engine", self.engine, ENGINES)
        if not isinstance(self.deterministic, bool):
            raise ValueError(f"deterministic: expected a bool, got {self.deterministic!r}")
        _parse_algo(self.algo)
        # The native specs check the ranges (geometry first, then each direction's algorithm); a direction whose
        # algorithm does not resolve raises where it is used.
        _native_spec(self, _GEOMETRY)
        for direction in DIRECTIONS:
            with contextlib.suppress(_UnresolvedAlgo):
                _native_spec(self, direction)

    def __getstate__(self):
        # The native specs kept by _native_spec are not part of a spec: never pickled or copied along.
        return {k: v for k, v in self.__dict__.items() if k != "_native_specs"}


# ----------------------------------------------------------------------------------------------------------------
# Algorithm names


@cache
def _legacy_algo_names(direction: str) -> tuple:
    return tuple(_C.conv_algo_names(_NATIVE_DIRECTION[direction]))


def _named_algo(name: str, direction: str):
    """('fixed', index, engine) for an algorithm name valid in `direction`, else None."""
    upper = name.strip().upper()
    if upper.startswith("ENGINE_") and upper[len("ENGINE_") :].isdigit():
        return ("fixed", int(upper[len("ENGINE_") :]), "graph")
    names = _legacy_algo_names(direction)
    if upper in names:
        return ("fixed", names.index(upper), "legacy")
    return None


def _algo_for(text: str, direction: str, whole: str):
    if text in ("find", "heuristic"):
        return (text, 0, None)
    named = _named_algo(text, direction)
    if named is None:
        raise ValueError(
            f"algo: {text!r} (in {whole!r}) is not 'find', 'heuristic' or a {direction} algorithm "
            f"({', '.join(_legacy_algo_names(direction))}, or ENGINE_<n> for the graph engine)"
        )
    return named


def _parse_algo(algo) -> dict:
    """{direction: (mode, fixed index, engine the name belongs to or None)}; a direction a single algorithm name
    does not exist in maps to ('invalid', 0, None) and raises when used."""
    if not isinstance(algo, str):
        raise ValueError(f"algo: expected a string, got {algo!r}")
    return _parse_algo_text(algo)


@lru_cache(maxsize=256)
def _parse_algo_text(algo: str) -> dict:
    text = algo.strip()
    if text in ("find", "heuristic"):
        return {d: (text, 0, None) for d in DIRECTIONS}
    if "=" in text:
        result = {d: ("heuristic", 0, None) for d in DIRECTIONS}
        for part in text.split(";"):
            key, sep, name = part.partition("=")
            direction = DIRECTION_ALIASES.get(key.strip())
            if not sep or direction is None or not name.strip():
                raise ValueError(
                    f"algo: expected 'direction=name' parts separated by ';' with directions fwd, bwd_data, "
                    f"bwd_filter, got {algo!r}"
                )
            result[direction] = _algo_for(name.strip(), direction, algo)
        return result
    result = {}
    for direction in DIRECTIONS:
        named = _named_algo(text, direction)
        result[direction] = named if named is not None else ("invalid", 0, None)
    if all(v[0] == "invalid" for v in result.values()):
        names = sorted({n for d in DIRECTIONS for n in _legacy_algo_names(d)})
        raise ValueError(
            f"algo: expected 'find', 'heuristic' or an algorithm name ({', '.join(names)}, ENGINE_<n>), "
            f"or one per direction like 'fwd=IMPLICIT_PRECOMP_GEMM;bwd_data=ALGO_1;bwd_filter=ALGO_1'; "
            f"got {algo!r}"
        )
    return result


def _direction(direction) -> str:
    resolved = DIRECTION_ALIASES.get(direction) if isinstance(direction, str) else None
    if resolved is None:
        raise ValueError(f"direction: expected one of {', '.join(repr(d) for d in DIRECTIONS)}, got {direction!r}")
    return resolved


def _check_spec(spec) -> ConvSpec:
    if not isinstance(spec, ConvSpec):
        raise TypeError(f"spec: expected a resnet_native.conv.ConvSpec, got {type(spec).__name__}")
    return spec


_GEOMETRY = "geometry"  # the native spec for shape arithmetic only (whatever the algorithm)


class _UnresolvedAlgo(ValueError):
    """A spec's algorithm does not resolve in one direction (raised where that direction is used)."""


def _native_spec(spec: ConvSpec, direction: str):
    """The _C.ConvSpec the native ops take for one direction ('forward', 'backward_data', 'backward_filter'), or
    for shape arithmetic only (_GEOMETRY).

    Built once per spec and direction and kept on the spec (a ConvSpec is immutable): the ops call this on every
    call, and an lru_cache keyed by the spec would hash all of its fields each time.
    """
    specs = spec.__dict__.get("_native_specs")
    if specs is None:
        # Outside the dataclass fields: not part of eq / hash / repr; a frozen dataclass's __dict__ is writable.
        specs = spec.__dict__["_native_specs"] = {}
    native = specs.get(direction)
    if native is None:
        engine, mode, fixed = ("legacy", "heuristic", 0) if direction == _GEOMETRY else _resolve_algo(spec, direction)
        native = specs[direction] = _C.ConvSpec(
            stride=spec.stride, padding=spec.padding, dilation=spec.dilation, groups=spec.groups,
            layout=_NATIVE_LAYOUT[spec.layout], precision=_NATIVE_PRECISION[spec.precision],
            engine=_NATIVE_ENGINE[engine], algo_mode=_NATIVE_ALGO_MODE[mode], fixed_algo=fixed,
            deterministic=spec.deterministic,
        )
    return native


def _resolve_algo(spec: ConvSpec, direction: str) -> tuple:
    """(engine, mode, fixed algorithm index) of one direction; _UnresolvedAlgo when the algorithm does not exist
    there or names the other engine."""
    mode, fixed, name_engine = _parse_algo(spec.algo)[direction]
    if mode == "invalid":
        raise _UnresolvedAlgo(
            f"algo: {spec.algo!r} is not a {direction} algorithm ({', '.join(_legacy_algo_names(direction))}); "
            f"name one per direction, e.g. 'fwd=IMPLICIT_PRECOMP_GEMM;bwd_data=ALGO_1;bwd_filter=ALGO_1'"
        )
    engine = spec.engine
    if name_engine is not None:
        if engine == "auto":
            engine = name_engine  # a fixed algorithm names its engine
        elif engine != name_engine:
            raise _UnresolvedAlgo(
                f"algo: {spec.algo!r} names a {name_engine}-engine algorithm, but engine={engine!r}"
            )
    return engine, mode, fixed


def _shape4(shape, name: str) -> tuple:
    if not isinstance(shape, (tuple, list)) or len(shape) != 4 or not all(_is_int(v) for v in shape):
        raise ValueError(f"{name}: expected a tuple of 4 ints, got {shape!r}")
    return tuple(int(v) for v in shape)


# ----------------------------------------------------------------------------------------------------------------
# Ops


def conv_output_shape(x_shape, w_shape, spec: ConvSpec) -> tuple:
    """The output shape (in the spec's layout) of convolving x_shape with w_shape; needs no GPU.

    Computed by the native core's one output-size function, after the same validation as the ops (ValueError
    naming the argument for shapes the ops would refuse).
    """
    spec = _check_spec(spec)
    return tuple(_C.conv_output_shape(_shape4(x_shape, "x_shape"), _shape4(w_shape, "w_shape"),
                                      _native_spec(spec, _GEOMETRY)))


def conv2d(x, w, spec: ConvSpec, *, bias=None, z=None, activation="identity", alpha1=1.0, alpha2=1.0, out=None):
    """y = activation(alpha1 * conv(x, w) + alpha2 * z + bias), returned (written into `out` when given).

    bias: (K,) in the storage dtype; z: a residual with y's shape; activation: 'identity' or 'relu'. With a bias
    this is one cudnnConvolutionBiasActivationForward call where cuDNN accepts it (see last_algorithm(...,
    fused=...)['fused_path'] for which path ran), else the convolution followed by cudnnAddTensor /
    cudnnActivationForward. `out` must not overlap any input.
    """
    if isinstance(x, np.ndarray) and isinstance(w, np.ndarray):  # host arrays: the float64 reference
        return reference.conv.conv2d(x, w, spec, bias=bias, z=z, activation=activation, alpha1=alpha1, alpha2=alpha2,
                                     out=out)
    spec = _check_spec(spec)
    return _C.conv_forward(x, w, out, bias, z, _native_spec(spec, "forward"), activation, float(alpha1),
                           float(alpha2), _fusion_enabled, _stream())


def conv2d_backward_data(dy, w, spec: ConvSpec, x_shape, *, out=None):
    """dx, the gradient of conv2d's input x (of shape x_shape, in the spec's layout) given dy."""
    if isinstance(dy, np.ndarray) and isinstance(w, np.ndarray):  # host arrays: the float64 reference
        return reference.conv.conv2d_backward_data(dy, w, spec, x_shape, out=out)
    spec = _check_spec(spec)
    return _C.conv_backward_data(dy, w, out, _shape4(x_shape, "x_shape"), _native_spec(spec, "backward_data"),
                                 _stream())


def conv2d_backward_filter(x, dy, spec: ConvSpec, w_shape, *, out=None, accumulate=False):
    """dw, the gradient of conv2d's filter (of shape w_shape, in the spec's layout); with accumulate=True it is
    added to `out` (which must then be given) instead of overwriting it."""
    if isinstance(x, np.ndarray) and isinstance(dy, np.ndarray):  # host arrays: the float64 reference
        return reference.conv.conv2d_backward_filter(x, dy, spec, w_shape, out=out, accumulate=accumulate)
    spec = _check_spec(spec)
    if not isinstance(accumulate, bool):
        raise ValueError(f"accumulate: expected a bool, got {accumulate!r}")
    return _C.conv_backward_filter(x, dy, out, _shape4(w_shape, "w_shape"), accumulate,
                                   _native_spec(spec, "backward_filter"), _stream())


# Array typestrs / dtype names -> the dtype an op takes (bf16 arrives as 16-bit integer or void bit patterns).
_TYPESTR_DTYPES = {"f4": "fp32", "f2": "fp16", "u2": "bf16", "uint16": "bf16", "i2": "bf16", "V2": "bf16"}


def _storage_dtype_of(array):
    """The native dtype of dy's elements; unknown: fp32, so that the op's own check reports what the argument is."""
    iface = getattr(array, "__cuda_array_interface__", None)
    if isinstance(iface, dict) and isinstance(iface.get("typestr"), str):
        key = iface["typestr"][1:]
    else:
        key = str(getattr(array, "dtype", "")).replace("torch.", "")
    name = _TYPESTR_DTYPES.get(key)
    if name is None:
        try:
            name = canonical_dtype(key)
        except ValueError:
            name = "fp32"
    return _NATIVE_DTYPE[name]


def conv2d_backward_bias(dy, layout, *, out=None):
    """db = sum of dy over N, H and W, of shape (K,) in dy's dtype (cudnnConvolutionBackwardBias)."""
    choice("layout", layout, LAYOUTS)
    return _C.conv_backward_bias(dy, out, _NATIVE_LAYOUT[layout], _storage_dtype_of(dy), _stream())


@contextlib.contextmanager
def _fusion_disabled():
    """Within the block, forward epilogues run as separate cuDNN calls (for the benchmark's unfused variant)."""
    global _fusion_enabled
    previous, _fusion_enabled = _fusion_enabled, False
    try:
        yield
    finally:
        _fusion_enabled = previous


# ----------------------------------------------------------------------------------------------------------------
# Algorithm cache


def _epilogue(fused) -> str:
    if fused is None or fused == "" or fused == "none":
        return "none"
    if not isinstance(fused, str):
        raise ValueError(f"fused: expected None or a '+'-joined subset of bias, residual, relu, got {fused!r}")
    parts = fused.split("+")
    if any(p not in EPILOGUE_PARTS for p in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"fused: expected None or a '+'-joined subset of bias, residual, relu, got {fused!r}")
    return "+".join(p for p in EPILOGUE_PARTS if p in parts)


def fused_name(*, bias=False, z=False, activation="identity") -> str | None:
    """The `fused` argument of last_algorithm that matches a conv2d call's bias / z / activation."""
    choice("activation", activation, ACTIVATIONS)
    parts = [n for n, on in (("bias", bias), ("residual", z), ("relu", activation == "relu")) if on]
    return "+".join(parts) or None


def last_algorithm(x_shape, w_shape, spec: ConvSpec, direction="forward", fused=None):
    """What the algorithm cache holds for this problem now (as an op would key it: current device and workspace
    limit), or None when nothing was chosen yet.

    x_shape / w_shape are in the spec's layout. `fused` names a forward epilogue: None for a plain convolution,
    else a '+'-joined subset of 'bias', 'residual', 'relu' (fused_name() builds it from conv2d's arguments).
    Returns a dict: engine, mode (what produced the choice), algo, algo_name, math_type, math_type_name, knobs,
    workspace (bytes), time_ms (None when not timed), fused_path ('fused', 'unfused: <why>' or '' when no fused
    call ran yet) and key.
    """
    spec = _check_spec(spec)
    direction = _direction(direction)
    key = _C.conv_key(_NATIVE_DIRECTION[direction], _shape4(x_shape, "x_shape"), _shape4(w_shape, "w_shape"),
                      _native_spec(spec, direction), _epilogue(fused))
    found = _C.algo_cache_lookup(key)
    if found is None:
        return None
    found["key"] = key
    return found


def algorithm_cache_entries() -> list:
    """Every cached choice, as last_algorithm's dicts (each with its key)."""
    return [dict(entry, key=key) for key, entry in _C.algo_cache_entries()]


def clear_algorithm_cache() -> None:
    """Forget every cached choice (the next call of each problem searches again). Counters are kept."""
    _C.algo_cache_clear()


def algorithm_cache_stats() -> dict:
    """hits and misses of cache lookups, finds (timed searches run) and the number of entries."""
    return dict(_C.algo_cache_stats())


def _device_identity() -> tuple:
    """(GPU name, cuDNN version loaded, current device index): the header of a cache file."""
    require_gpu()
    import cupy

    device = cupy.cuda.runtime.getDevice()
    name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
    if isinstance(name, bytes):
        name = name.decode()
    return name, _C.cudnn_version(), device


_CHOICE_FIELDS = {"engine": str, "mode": str, "algo": int, "math_type": int, "workspace": int}


def _check_entry(entry, index: int) -> None:
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        raise ValueError(f"algorithm cache file: entry {index} is not an object with a 'key'")
    for name, kind in _CHOICE_FIELDS.items():
        if not isinstance(entry.get(name), kind) or isinstance(entry.get(name), bool):
            raise ValueError(f"algorithm cache file: entry {index} lacks a valid {name!r}")
    if entry["engine"] not in ("legacy", "graph") or entry["mode"] not in ALGO_MODES:
        raise ValueError(f"algorithm cache file: entry {index} has an unknown engine or mode")
    try:
        _C._conv_params_roundtrip(entry["key"])
    except ValueError as e:
        raise ValueError(f"algorithm cache file: entry {index}: {e}") from None


def save_algorithm_cache(path) -> int:
    """Write every cached choice to `path` (JSON, replaced atomically), headed by the GPU name and the cuDNN
    version; returns the number of entries written."""
    gpu, cudnn, _ = _device_identity()
    entries = []
    for e in algorithm_cache_entries():
        entries.append({k: e[k] for k in ("key", "engine", "mode", "algo", "algo_name", "math_type", "knobs",
                                          "workspace", "time_ms", "fused_path")})
    payload = {"format": _CACHE_FORMAT, "version": _CACHE_VERSION, "gpu": gpu, "cudnn_version": cudnn,
               "entries": entries}
    atomic_write_text(path, json.dumps(payload, indent=1))
    return len(entries)


def load_algorithm_cache(path) -> int:
    """Add the choices saved in `path` to the cache (replacing entries of the same problems) and return how many.

    A file written on another GPU model or cuDNN version is ignored with a warning (returns 0): its timings say
    nothing about this machine. Entries are re-keyed to the current device. A malformed file raises ValueError
    and adds nothing.
    """
    with open(os.fspath(path)) as f:
        try:
            payload = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"algorithm cache file {path}: not JSON ({e})") from None
    if not isinstance(payload, dict) or payload.get("format") != _CACHE_FORMAT:
        raise ValueError(f"algorithm cache file {path}: not a resnet_native algorithm cache")
    if payload.get("version") != _CACHE_VERSION:
        raise ValueError(f"algorithm cache file {path}: format version {payload.get('version')!r} is not supported")
    entries = payload.get("entries")
    if not isinstance(entries, list):
        raise ValueError(f"algorithm cache file {path}: 'entries' is not a list")
    gpu, cudnn, device = _device_identity()
    if payload.get("gpu") != gpu or payload.get("cudnn_version") != cudnn:
        warnings.warn(
            f"algorithm cache {path} ignored: it was written on {payload.get('gpu')!r} with cuDNN "
            f"{payload.get('cudnn_version')!r}, this is {gpu!r} with cuDNN {cudnn}",
            UserWarning,
            stacklevel=2,
        )
        return 0
    for i, entry in enumerate(entries):
        _check_entry(entry, i)
    for entry in entries:
        _C.algo_cache_insert(entry["key"], entry, device)
    return len(entries)


def _drop_cached_descriptors() -> None:
    """Destroy every cached cuDNN descriptor and execution plan (both engines); rebuilt on demand."""
    _C.drop_cached_descriptors()


__all__ = [
    "ACTIVATIONS",
    "ConvSpec",
    "DIRECTIONS",
    "ENGINES",
    "LAYOUTS",
    "PRECISIONS",
    "algorithm_cache_entries",
    "algorithm_cache_stats",
    "clear_algorithm_cache",
    "conv2d",
    "conv2d_backward_bias",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "conv_output_shape",
    "default_engine",
    "fused_name",
    "last_algorithm",
    "load_algorithm_cache",
    "save_algorithm_cache",
    "set_default_engine",
]
