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

import numpy as np

from .. import reference
from .._core.loader import _C
from .._core.names import (
    ACTIVATIONS,
    DIRECTIONS,
    ENGINES,
    EPILOGUE_PARTS,
    LAYOUTS,
    PRECISIONS,
    canonical_dtype,
    choice,
    finite_number,
    flag,
)
from .._core.runtime import op_stream as _stream
from .algo_cache import (  # noqa: F401  (conv's API: the cache of its choices)
    algorithm_cache_capacity,
    algorithm_cache_entries,
    algorithm_cache_stats,
    clear_algorithm_cache,
    load_algorithm_cache,
    plan_cache_capacity,
    plan_cache_stats,
    save_algorithm_cache,
    set_algorithm_cache_capacity,
    set_plan_cache_capacity,
)
from .conv_spec import (
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
    alpha1, alpha2 = finite_number("alpha1", alpha1), finite_number("alpha2", alpha2)  # for both paths
    if isinstance(x, np.ndarray) and isinstance(w, np.ndarray):  # host arrays: the float64 reference
        return reference.conv.conv2d(x, w, spec, bias=bias, z=z, activation=activation, alpha1=alpha1, alpha2=alpha2,
                                     out=out)
    spec = _check_spec(spec)
    return _C.conv_forward(x, w, out, bias, z, _native_spec(spec, "forward"), activation, alpha1, alpha2,
                           _fusion_enabled, _stream())


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
    """db = sum of dy over N, H and W, of shape (K,) in dy's dtype (fp32, fp16 or bf16): summed in float64 in a
    fixed order (deterministic), rounded to float32 and then to dy's dtype."""
    choice("layout", layout, LAYOUTS)
    if isinstance(dy, np.ndarray):  # a host array: the float64 reference
        return reference.conv.conv2d_backward_bias(dy, layout, out=out)
    return _C.conv_backward_bias(dy, out, _NATIVE_LAYOUT[layout], _storage_dtype_of(dy), _stream())


@contextlib.contextmanager
def fusion_disabled():
    """Within the block, forward epilogues run as separate cuDNN calls: the unfused variant that the inference
    engine's tuning and the benchmarks time against the fused call."""
    global _fusion_enabled
    previous, _fusion_enabled = _fusion_enabled, False
    try:
        yield
    finally:
        _fusion_enabled = previous


# ----------------------------------------------------------------------------------------------------------------
# What the algorithm cache holds for a problem (the cache and its file: algo_cache.py)


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
