"""How the reference ops read and write their arrays: NumPy arrays in the native ops' storage dtypes.

The dtype names are the native ops' (_core.names.DTYPES): 'fp32' is float32, or float64 (a model on the host keeps
its fp32 and tf32 activations, masters and gradients in float64 unless asked otherwise); 'fp16' is float16; 'bf16'
is uint16 arrays of bfloat16 bit patterns, taken as bf16 only when asked (dtype='bf16'), as for the native ops.
Every reference op reads its inputs as float64, computes in float64 and rounds once to each output's storage dtype
(bf16: to nearest even, via float32 as the native kernels do). to_storage / from_storage / relative_error are what
a GPU test needs to compare a device result, copied to the host, with the reference.
"""

import numpy as np

from .._core.names import ARRAY_DTYPES, MASTER_DTYPE, canonical_dtype
from .bf16 import from_bf16_bits, to_bf16_bits

_FLOAT64 = np.dtype(np.float64)


def host(array, name: str) -> np.ndarray:
    """`array` if it is a NumPy array, else a TypeError naming the argument."""
    if not isinstance(array, np.ndarray):
        kind = type(array)
        raise TypeError(f"{name}: expected a NumPy array (the reference ops run on the host), got "
                        f"{kind.__module__}.{kind.__qualname__}")
    return array


def host_dtypes(dtype: str) -> tuple:
    """The NumPy dtypes that may hold native dtype `dtype` on the host ('fp32': float32 or float64)."""
    stored = ARRAY_DTYPES[dtype]
    return (stored, _FLOAT64) if stored == MASTER_DTYPE else (stored,)


def dtype_of(array, name: str, dtype=None, *, uint16_is_bf16: bool = False) -> str:
    """The native dtype name ('fp32', 'fp16' or 'bf16') of array argument `name`, resolved as the native ops resolve
    it (resolve_dtype in csrc/bindings/tensor_arg.cpp): an explicit `dtype` is checked against the array, else inferred
    and a uint16 array needs dtype='bf16' unless `uint16_is_bf16`."""
    host(array, name)
    if dtype is not None:
        resolved = canonical_dtype(dtype)
        allowed = host_dtypes(resolved)
        if array.dtype not in allowed:
            raise TypeError(f"{name}: expected a {' or '.join(d.name for d in allowed)} array for dtype={dtype!r}, "
                            f"got {array.dtype}")
        return resolved
    for resolved in ("fp32", "fp16"):
        if array.dtype in host_dtypes(resolved):
            return resolved
    if array.dtype == ARRAY_DTYPES["bf16"]:
        if uint16_is_bf16:
            return "bf16"
        raise TypeError(f"{name}: a 16-bit integer array is taken as bf16 bits only when asked: pass dtype='bf16'")
    raise TypeError(f"{name}: expected a float32, float64, float16 or bf16 (uint16) array, got {array.dtype}")


def decode(array, dtype: str) -> np.ndarray:
    """The float64 values of a host array of native dtype `dtype`: the array itself when it is float64 (so the ops
    never write into what this returns), else a new one."""
    if dtype == "bf16":
        return from_bf16_bits(array).astype(np.float64)
    return np.asarray(array, dtype=np.float64)


def read(array, name: str, dtype=None, **kwargs) -> np.ndarray:
    """dtype_of() then decode(): the float64 values of array argument `name`."""
    return decode(array, dtype_of(array, name, dtype, **kwargs))


def same_shape(a, a_name: str, b, b_name: str) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{a_name} and {b_name} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")


def like(array, name: str, other, other_name: str):
    """Unless `array` is a NumPy array of other's shape and dtype: ValueError / TypeError naming it."""
    host(array, name)
    same_shape(array, name, other, other_name)
    if array.dtype != other.dtype:
        raise TypeError(f"{name}: expected a {other.dtype} array (as {other_name}), got {array.dtype}")
    return array


def output(out, shape, dtype, name: str = "out") -> np.ndarray:
    """`out` checked to be a NumPy array of `shape` and `dtype`, or a new one (out=None), as the native ops allocate."""
    shape = tuple(int(s) for s in shape)
    if out is None:
        return np.empty(shape, dtype=dtype)
    host(out, name)
    if tuple(out.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise TypeError(f"{name}: expected a {np.dtype(dtype).name} array, got {out.dtype}")
    return out


def write(out: np.ndarray, result, dtype: str) -> np.ndarray:
    """Round the float64 `result` to out's storage (native dtype `dtype`) and store it in `out`; returns out. A value
    beyond the storage's range becomes inf, as in the native kernels' rounding."""
    with np.errstate(over="ignore"):
        out[...] = to_bf16_bits(result) if dtype == "bf16" else result
    return out


def to_storage(values, precision: str) -> np.ndarray:
    """float values -> the native storage array of a precision or dtype name: float32 for 'fp32' and 'tf32', float16
    for 'fp16', uint16 bf16 bits for 'bf16'."""
    dtype = canonical_dtype(precision, "precision")
    return to_bf16_bits(values) if dtype == "bf16" else np.asarray(values, dtype=ARRAY_DTYPES[dtype])


def from_storage(array) -> np.ndarray:
    """The float64 values of a host storage array; uint16 arrays are read as bf16 bits."""
    array = np.asarray(array)
    return decode(array, "bf16" if array.dtype == ARRAY_DTYPES["bf16"] else "fp32")


def relative_error(actual, expected) -> float:
    """Norm-wise relative error ||actual - expected|| / ||expected|| in float64 (NaN anywhere gives NaN)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-300))


__all__ = ["decode", "dtype_of", "from_storage", "host", "output", "read", "relative_error", "to_storage", "write"]
