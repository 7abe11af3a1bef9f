"""The package's one table of names: precisions, storage dtypes, layouts, engines, directions and their spellings.

Every Python module takes its names from here. The native core's typed enums (resnet_native._C.Precision, Layout,
...) carry the same names; tests/test_names_cpu.py checks that the two tables agree.
"""

import math
import numbers
import warnings
from collections.abc import Sequence

import numpy as np

# Precision modes: the storage dtype of activations and weights plus the math cuDNN may use. fp32 is strict FMA
# math, tf32 lets the tensor cores round inputs to TF32, fp16 and bf16 store 16-bit values and accumulate in fp32.
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
# Element types of op arguments. cupy has no bfloat16: bf16 arrays are uint16 arrays holding bf16 bit patterns.
DTYPES = ("fp32", "fp16", "bf16")
# Accepted spellings of a dtype argument ('tf32' data is fp32 data).
DTYPE_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "tf32": "fp32",
    "fp16": "fp16", "float16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
}
# The NumPy / cupy dtype that stores each dtype and each precision.
ARRAY_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(np.uint16)}
PRECISION_STORAGE = {p: ARRAY_DTYPES[DTYPE_ALIASES[p]] for p in PRECISIONS}
# Quantised inference (forward convolutions only, graph engine, NHWC): int8 arrays, and FP8 E4M3 codes in uint8
# arrays (cupy has no fp8). A quantised convolution writes y in its 8-bit type, or in fp16 / fp32.
QUANT_PRECISIONS = ("int8", "fp8")
QUANT_ARRAY_DTYPES = {"int8": np.dtype(np.int8), "fp8": np.dtype(np.uint8)}
QUANT_OUT_DTYPES = ("int8", "fp8", "fp16", "fp32")
# Every precision a ConvSpec takes, and the array dtype of every value an inference plan holds.
CONV_PRECISIONS = PRECISIONS + QUANT_PRECISIONS
VALUE_DTYPES = {**ARRAY_DTYPES, **QUANT_ARRAY_DTYPES}
# The dtype of master weights, gradients, batch-norm statistics and logits, whatever the precision.
MASTER_DTYPE = np.dtype(np.float32)

# Activation layouts: NCHW arrays are (N, C, H, W), NHWC arrays (N, H, W, C); filters (K, C/g, R, S) and
# (K, R, S, C/g).
LAYOUTS = ("NCHW", "NHWC")

# Test-time augmentation of an evaluation or a prediction: none, the mean logits of each image and its mirror image
# (left to right), or those two and their copies shifted by a pixel (data/tta_views.py defines the views).
TTA_MODES = ("none", "flip", "flip-shift")

# The registered networks (nn/models/registry.py builds them; a release's config.yaml names one).
MODEL_NAMES = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")

# Convolution engines: cuDNN's legacy API, its graph (backend) API, or whichever is faster per problem.
ENGINES = ("auto", "legacy", "graph")
# Convolution directions, with the short spellings the per-direction algorithm syntax and cache keys use.
DIRECTIONS = ("forward", "backward_data", "backward_filter")
DIRECTION_ALIASES = {
    "forward": "forward", "fwd": "forward",
    "backward_data": "backward_data", "bwd_data": "backward_data",
    "backward_filter": "backward_filter", "bwd_filter": "backward_filter",
}
# How an algorithm is chosen: timed on the call's arrays, cuDNN's heuristic ranking, or one named algorithm.
ALGO_MODES = ("find", "heuristic", "fixed")
# A forward convolution's epilogue: y = activation(alpha1 * conv(x, w) + alpha2 * z + bias).
ACTIVATIONS = ("identity", "relu")
EPILOGUE_PARTS = ("bias", "residual", "relu")
# Batch-norm reduction modes ('auto': persistent for NHWC, spatial for NCHW).
BATCH_NORM_MODES = ("auto", "persistent", "spatial")


def choice(name: str, value, allowed):
    """`value` if it is one of `allowed`, else a ValueError naming the argument and the accepted values."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
    return value


def _integral(name: str, value, expected: str) -> int:
    """`value` as an int (NumPy integers too), else a TypeError naming the argument: bools (Python's and NumPy's)
    are refused (True is not a count), and so are floats and strings int() would turn into one."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected {expected}, got {value!r}")
    return int(value)


def bounded_int(name: str, value, low: int, high: int, unit: str) -> int:
    """`value` as an int (NumPy integers too) in [low, high], else a TypeError / ValueError naming the argument;
    bools are refused (True is not a count)."""
    value = _integral(name, value, f"an int number of {unit}")
    if not low <= value <= high:
        raise ValueError(f"{name}: expected a number of {unit} between {low} and {high}, got {value}")
    return value


def whole_number(name: str, value, minimum: int | None = None) -> int:
    """`value` as an int (NumPy integers too; not a bool, a float or a string), else a TypeError naming the
    argument; with a minimum, a ValueError below it."""
    expected = "an int" if minimum is None else f"an int >= {minimum}"
    value = _integral(name, value, expected)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected {expected}, got {value}")
    return value


def whole_numbers(name: str, value, minimum: int | None = None, count: int | None = None) -> tuple:
    """A tuple of ints, each as whole_number checks it (named name[i]), from a sequence (not a string) or a NumPy
    array; an int alone stands for `count` copies of itself (with no count: a tuple of one). Anything else: a
    TypeError; an empty sequence, or one of another length than count: a ValueError."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_):
        value = (value,) * (count or 1)
    what = "a sequence of ints" if count is None else "a pair of ints" if count == 2 else f"{count} ints"
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | np.ndarray):
        raise TypeError(f"{name}: expected an int or {what}, got {value!r}")
    if len(value) == 0 or (count is not None and len(value) != count):
        raise ValueError(f"{name}: expected {'a non-empty sequence of ints' if count is None else what}, "
                         f"got {value!r}")
    return tuple(whole_number(f"{name}[{i}]", v, minimum) for i, v in enumerate(value))


def finite_number(name: str, value, low: float | None = None, high: float | None = None, *,
                  high_inclusive: bool = False) -> float:
    """`value` as a float if it is a real number (ints and NumPy numbers too; not a bool, a string or None),
    finite and, where given, >= low and < high (<= high with high_inclusive); else a TypeError / ValueError naming
    the argument. The ValueError reads as the native core's ('eps: expected a finite value >= 0, got nan')."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a finite number, got {type(value).__name__} {value!r}")
    value = float(value)
    in_range = math.isfinite(value) and (low is None or value >= low)
    if high is not None:
        in_range = in_range and (value <= high if high_inclusive else value < high)
    if not in_range:
        if low is not None and high is not None:
            bound = f" in [{low:g}, {high:g}{']' if high_inclusive else ')'}"
        elif low is not None:
            bound = f" >= {low:g}"
        elif high is not None:
            bound = f" {'<=' if high_inclusive else '<'} {high:g}"
        else:
            bound = ""
        raise ValueError(f"{name}: expected a finite value{bound}, got {value!r}")
    return value


def flag(name: str, value) -> bool:
    """`value` as a bool if it is True or False (NumPy's bools too), else a TypeError naming the argument: 1, 0,
    None and strings are not flags."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return bool(value)


def canonical_dtype(value, name: str = "dtype") -> str:
    """'fp32', 'fp16' or 'bf16' for any accepted spelling; ValueError naming the argument otherwise."""
    if not isinstance(value, str) or value not in DTYPE_ALIASES:
        raise ValueError(f"{name}: expected one of {', '.join(repr(d) for d in DTYPES)}, got {value!r}")
    return DTYPE_ALIASES[value]


def precision_argument(owner: str, precision, dtype, default=None):
    """`precision`, or the deprecated `dtype=` that named it before. Compute precision is `precision=` across the
    API (layers, engines, the classifier); `dtype` names storage types only."""
    if dtype is None:
        return precision
    if precision is not default:
        raise TypeError(f"{owner}: give precision= only (dtype= is its deprecated name), got both")
    warnings.warn(f"{owner}(dtype=...) is deprecated: the argument is now precision=", DeprecationWarning,
                  stacklevel=3)
    return dtype
