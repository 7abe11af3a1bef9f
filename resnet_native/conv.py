"""2-D convolutions on cuDNN, with algorithm search and a process-wide algorithm cache.

Activations are (N, C, H, W) arrays in the NCHW layout and (N, H, W, C) arrays in NHWC; filters are (K, C/groups,
R, S) and (K, R, S, C/groups) respectively. Every array must have the storage dtype of the spec's precision:
float32 for 'fp32' (strict FMA math) and 'tf32' (TF32 tensor cores allowed), float16 for 'fp16', and uint16 arrays
holding bfloat16 bit patterns for 'bf16' (cupy has no bfloat16); fp16 and bf16 accumulate in fp32.

How to convolve is a ConvSpec (conv_spec.py: geometry, layout, precision, engine, and the algorithm choice per
direction: 'find', 'heuristic' or an algorithm name; untimed_search() makes 'find' 'heuristic' within it). The
choice is cached per problem (shapes, dtypes, layout, geometry, math, determinism, workspace cap, engine, mode)
in memory; save_algorithm_cache / load_algorithm_cache keep it across runs on the same GPU model and cuDNN
version. The cache and the graph engine's execution plans are bounded, the least recently used evicted first
(set_algorithm_cache_capacity, set_plan_cache_capacity). Outputs passed as `out=` are written in place; with
out=None they are allocated with cupy first.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings

import numpy as np

from . import reference
from ._loader import _C
from ._runtime import op_stream as _stream
from ._runtime import require_gpu
from .checkpoint import atomic_write_text
from .conv_spec import (  # noqa: F401  (default_engine, set_default_engine, _native_spec: part of conv's API)
    _GEOMETRY,
    _NATIVE_DIRECTION,
    _NATIVE_LAYOUT,
    ConvSpec,
    _check_spec,
    _direction,
    _native_spec,
    _shape4,
    default_engine,
    set_default_engine,
    untimed_search,
)
from .names import (
    ACTIVATIONS,
    ALGO_MODES,
    DIRECTIONS,
    ENGINES,
    EPILOGUE_PARTS,
    LAYOUTS,
    PRECISIONS,
    bounded_int,
    canonical_dtype,
    choice,
    flag,
)

_CACHE_FORMAT = "resnet_native.algorithm_cache"
_CACHE_VERSION = 1
_MAX_CAPACITY = 2**63 - 1  # the native core takes an int64

_NATIVE_DTYPE = dict(_C.DType.__members__)

_fusion_enabled = True


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


def conv2d_backward_data(dy, w, spec: ConvSpec, x_shape, *, out=None, accumulate=False):
    """dx, the gradient of conv2d's input x (of shape x_shape, in the spec's layout) given dy; with accumulate=True
    it is added to `out` (which must then be given), as a residual block sums its two input gradients."""
    if isinstance(dy, np.ndarray) and isinstance(w, np.ndarray):  # host arrays: the float64 reference
        return reference.conv.conv2d_backward_data(dy, w, spec, x_shape, out=out, accumulate=accumulate)
    spec = _check_spec(spec)
    return _C.conv_backward_data(dy, w, out, _shape4(x_shape, "x_shape"), flag("accumulate", accumulate),
                                 _native_spec(spec, "backward_data"), _stream())


def conv2d_backward_filter(x, dy, spec: ConvSpec, w_shape, *, out=None, accumulate=False):
    """dw, the gradient of conv2d's filter (of shape w_shape, in the spec's layout); with accumulate=True it is
    added to `out` (which must then be given) instead of overwriting it."""
    if isinstance(x, np.ndarray) and isinstance(dy, np.ndarray):  # host arrays: the float64 reference
        return reference.conv.conv2d_backward_filter(x, dy, spec, w_shape, out=out, accumulate=accumulate)
    spec = _check_spec(spec)
    return _C.conv_backward_filter(x, dy, out, _shape4(w_shape, "w_shape"), flag("accumulate", accumulate),
                                   _native_spec(spec, "backward_filter"), _stream())


# Array typestrs / dtype names -> the dtype an op takes (bf16 arrives as 16-bit integer or void bit patterns).
_TYPESTR_DTYPES = {"f4": "fp32", "f2": "fp16", "u2": "bf16", "uint16": "bf16", "i2": "bf16", "V2": "bf16"}


def _storage_dtype_of(array):
    """The native dtype of dy's elements; unknown: fp32, so that the op's own check reports what the argument is."""
    try:  # as in the native parser, an interface that cannot be read is no interface
        iface = getattr(array, "__cuda_array_interface__", None)
    except Exception:
        iface = None
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
    parts = fused.split("+") if isinstance(fused, str) else None
    if parts is None or any(p not in EPILOGUE_PARTS for p in parts) or len(set(parts)) != len(parts):
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
    call ran yet), search_ms (the host's wall time spent choosing it: the search, and with engine='auto' both
    engines' searches and timing; 0 for a choice loaded from a file) and key.
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
    """Every cached choice, as last_algorithm's dicts (each with its key), the least recently used first."""
    return [dict(entry, key=key) for key, entry in _C.algo_cache_entries()]


def clear_algorithm_cache() -> None:
    """Forget every cached choice (the next call of each problem searches again). Counters are kept."""
    _C.algo_cache_clear()


def algorithm_cache_stats() -> dict:
    """hits and misses of cache lookups, finds (timed searches run), the number of entries, the capacity and
    evictions (entries dropped to stay within it)."""
    return dict(_C.algo_cache_stats())


def _capacity(value, name: str) -> int:
    return bounded_int(name, value, 1, _MAX_CAPACITY, "entries")


def set_algorithm_cache_capacity(capacity) -> None:
    """Keep at most `capacity` choices (4096 by default). Past it, a new choice evicts the least recently used one:
    every op's lookup makes its problem the most recently used (last_algorithm and algorithm_cache_entries do
    not). A smaller capacity evicts at once. An evicted problem is searched again on its next call, which algo='find'
    refuses during CUDA-graph capture."""
    _C.algo_cache_set_capacity(_capacity(capacity, "capacity"))


def algorithm_cache_capacity() -> int:
    """The most choices the algorithm cache keeps (set_algorithm_cache_capacity)."""
    return _C.algo_cache_capacity()


def set_plan_cache_capacity(capacity) -> None:
    """Keep at most `capacity` graph-engine execution plans (1024 by default), evicting the least recently run past
    it, and at once when the capacity shrinks; an evicted plan is rebuilt from its cached choice on its next call
    (no search). Plans run during a CUDA-graph capture are pinned (a captured graph may launch their kernels):
    never evicted, so they may exceed the capacity; only _drop_cached_descriptors / release_handles drop them."""
    _C.graph_set_plan_cache_capacity(_capacity(capacity, "capacity"))


def plan_cache_capacity() -> int:
    """The most graph-engine execution plans kept besides pinned ones (set_plan_cache_capacity)."""
    return _C.graph_plan_cache_stats()["capacity"]


def plan_cache_stats() -> dict:
    """The graph engine's execution plans: plans (held now), capacity, evictions (plans dropped to stay within it)
    and pinned (run during a CUDA-graph capture: never evicted)."""
    return dict(_C.graph_plan_cache_stats())


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
# cudnnMathType_t: DEFAULT_MATH, TENSOR_OP_MATH, TENSOR_OP_MATH_ALLOW_CONVERSION, FMA_MATH. The graph engine stores
# no math type (0).
_MATH_TYPES = range(4)
# The graph engine stores a cuDNN engine's global index; cuDNN 9 has well under a hundred per operation graph.
_GRAPH_ENGINE_IDS = range(1 << 16)
# No GPU has a terabyte of memory: a workspace claim beyond that is a damaged file, not a choice.
_MAX_WORKSPACE = 1 << 40
_KEY_DIRECTIONS = {"fwd": "forward", "bwd_data": "backward_data", "bwd_filter": "backward_filter"}


def _key_fields(key: str) -> dict:
    """The fields of a key the native parser accepted: {'dir': 'fwd', 'x': (8, 64, 32, 32), 'ws': None, ...}."""
    fields = dict(token.split("=", 1) for token in key.split()[1:])
    for name in ("x", "w", "y", "pad", "stride", "dil"):
        fields[name] = tuple(int(v) for v in fields[name].split(","))
    for name in ("groups", "fixed"):
        fields[name] = int(fields[name])
    fields["ws"] = None if fields["ws"] == "none" else int(fields["ws"])
    return fields


def _check_entry(entry, index: int, path="algorithm cache file") -> None:
    """ValueError naming the file, the entry and the field for anything save_algorithm_cache cannot have
    written: unknown engines or modes, algorithms outside the direction's list (legacy) or engine ids outside
    any cuDNN's (graph), unknown math types, negative or absurd workspaces, workspaces above the key's cap, and
    keys whose geometry is not a convolution (stride, dilation or groups below 1, an output that does not
    follow)."""
    where = f"algorithm cache file {path}: entry {index}"
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        raise ValueError(f"{where} is not an object with a 'key'")
    for name, kind in _CHOICE_FIELDS.items():
        if not isinstance(entry.get(name), kind) or isinstance(entry.get(name), bool):
            raise ValueError(f"{where} lacks a valid {name!r}")
    if entry["engine"] not in ("legacy", "graph"):
        raise ValueError(f"{where}: 'engine' {entry['engine']!r} is not 'legacy' or 'graph'")
    if entry["mode"] not in ALGO_MODES:
        raise ValueError(f"{where}: 'mode' {entry['mode']!r} is not one of {', '.join(ALGO_MODES)}")
    for name in ("knobs", "fused_path", "algo_name"):
        if name in entry and not isinstance(entry[name], str):
            raise ValueError(f"{where}: {name!r} is not a string")
    time_ms = entry.get("time_ms")
    if time_ms is not None and (isinstance(time_ms, bool) or not isinstance(time_ms, int | float)
                                or not 0 <= time_ms < float("inf")):
        raise ValueError(f"{where}: 'time_ms' {time_ms!r} is not a duration")
    try:
        _C._conv_key_check(entry["key"])  # parses, and the geometry is a convolution's (csrc/conv/conv_geometry.h)
    except ValueError as e:
        raise ValueError(f"{where}: 'key': {e}") from None
    key = _key_fields(entry["key"])
    algo = entry["algo"]
    if entry["engine"] == "legacy":
        direction = _NATIVE_DIRECTION[_KEY_DIRECTIONS[key["dir"]]]
        names = _C.conv_algo_names(direction)
        if not 0 <= algo < len(names):
            raise ValueError(f"{where}: 'algo' {algo} is not a {_KEY_DIRECTIONS[key['dir']]} algorithm "
                             f"(0 to {len(names) - 1})")
        if entry["math_type"] not in _MATH_TYPES:
            raise ValueError(f"{where}: 'math_type' {entry['math_type']} is not a cuDNN math type "
                             f"(0 to {len(_MATH_TYPES) - 1})")
    else:
        if algo not in _GRAPH_ENGINE_IDS:
            raise ValueError(f"{where}: 'algo' {algo} is not a graph engine id (0 to {len(_GRAPH_ENGINE_IDS) - 1})")
        if entry["math_type"] != 0:
            raise ValueError(f"{where}: 'math_type' {entry['math_type']} (the graph engine stores 0)")
    workspace = entry["workspace"]
    cap = _MAX_WORKSPACE if key["ws"] is None else min(key["ws"], _MAX_WORKSPACE)
    if not 0 <= workspace <= cap:
        raise ValueError(f"{where}: 'workspace' {workspace} is outside 0 to {cap} bytes"
                         + (" (the key's workspace cap)" if key["ws"] is not None and key["ws"] < _MAX_WORKSPACE
                            else ""))


# What a save writes anew; any other top-level field is another module's section, kept by a save.
_OWN_FIELDS = ("format", "version", "gpu", "cudnn_version", "entries")


def _read_cache_file(path) -> dict:
    """The JSON object of a cache file, its format and version checked (ValueError naming the file)."""
    with open(os.fspath(path)) as f:
        try:
            payload = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"algorithm cache file {path}: not JSON ({e})") from None
    if not isinstance(payload, dict) or payload.get("format") != _CACHE_FORMAT:
        raise ValueError(f"algorithm cache file {path}: not a resnet_native algorithm cache")
    version = payload.get("version")
    if isinstance(version, bool) or version != _CACHE_VERSION:  # true == 1 in Python
        raise ValueError(f"algorithm cache file {path}: format version {version!r} is not supported")
    return payload


def _written_here(payload: dict) -> bool:
    """Whether a cache file's header names this GPU model and cuDNN version: its timings hold here."""
    gpu, cudnn, _ = _device_identity()
    return payload.get("gpu") == gpu and payload.get("cudnn_version") == cudnn


def _kept_sections(path) -> dict:
    """The other modules' sections (inference/choice_cache.py) of the cache of this GPU and cuDNN at `path`, as
    read; none from a missing, unreadable or foreign file, which a save replaces whole, as it always did."""
    try:
        payload = _read_cache_file(path)
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in payload.items() if k not in _OWN_FIELDS} if _written_here(payload) else {}


def save_algorithm_cache(path) -> int:
    """Write every cached choice to `path` (JSON, replaced atomically), headed by the GPU name and the cuDNN
    version, the least recently used first; returns the number of entries written. When `path` already holds a
    cache of this GPU and cuDNN, its other sections (an InferenceEngine's quantize_from='auto' choices) are
    kept."""
    gpu, cudnn, _ = _device_identity()
    entries = []
    for e in algorithm_cache_entries():
        entries.append({k: e[k] for k in ("key", "engine", "mode", "algo", "algo_name", "math_type", "knobs",
                                          "workspace", "time_ms", "fused_path")})
    payload = {"format": _CACHE_FORMAT, "version": _CACHE_VERSION, "gpu": gpu, "cudnn_version": cudnn,
               "entries": entries, **_kept_sections(path)}
    atomic_write_text(path, json.dumps(payload, indent=1))
    return len(entries)


def load_algorithm_cache(path) -> int:
    """Add the choices saved in `path` to the cache (replacing entries of the same problems) and return how many.

    A file written on another GPU model or cuDNN version is ignored with a warning (returns 0): its timings say
    nothing about this machine. Entries are re-keyed to the current device. A malformed file raises ValueError
    and adds nothing. Other sections are not read here (inference/choice_cache.py reads the engines' choices).

    Entries are inserted in the file's order (save_algorithm_cache writes the least recently used first), so they
    become the most recently used and their order is restored; the count returned is what the file holds, but
    the cache keeps at most algorithm_cache_capacity() entries: of a larger file, the last ones (the most recently
    used when it was saved), and entries cached before the load are evicted first.
    """
    payload = _read_cache_file(path)
    entries = payload.get("entries")
    if not isinstance(entries, list):
        raise ValueError(f"algorithm cache file {path}: 'entries' is not a list")
    gpu, cudnn, device = _device_identity()
    if not _written_here(payload):
        warnings.warn(
            f"algorithm cache {path} ignored: it was written on {payload.get('gpu')!r} with cuDNN "
            f"{payload.get('cudnn_version')!r}, this is {gpu!r} with cuDNN {cudnn}",
            UserWarning,
            stacklevel=2,
        )
        return 0
    for i, entry in enumerate(entries):
        _check_entry(entry, i, path)
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
    "algorithm_cache_capacity",
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
    "plan_cache_capacity",
    "plan_cache_stats",
    "save_algorithm_cache",
    "set_algorithm_cache_capacity",
    "set_default_engine",
    "set_plan_cache_capacity",
    "untimed_search",
]
