"""Custom CUDA kernels for the residual blocks: add, add + ReLU, ReLU and their backward, dtype conversion.

Every function takes cupy arrays (or any __cuda_array_interface__ / DLPack device array), C-contiguous, of one
shape, and runs on cupy's current stream. Storage dtypes are fp32, fp16 and bf16 (a uint16 array holding bf16
bits: cupy has no bfloat16); math is fp32. `dtype=None` infers 'fp32' / 'fp16' from the array, and bf16 must be
named (dtype='bf16'), since a uint16 array could hold anything. `out=None` allocates the output with cupy before
the kernel runs; `out` may be one of the inputs (in place), but must not partially overlap one.

The kernels use 16-byte loads and stores when every pointer is 16-byte aligned (scalar for misaligned views and
for the tail), grid-stride over any size.
"""

import numpy as np

from . import reference
from ._loader import _C
from ._runtime import op_stream

_DTYPE_NAMES = {
    "fp32": "fp32", "float32": "fp32", "tf32": "fp32",
    "fp16": "fp16", "float16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
}
_CUPY_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "uint16"}
_DLPACK_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


# The stream every op wrapper passes (conv.py's too): cupy's current stream, 0 without a GPU.
stream = op_stream


def _element_kind(obj, name):
    """'f4', 'f2', 'u2', 'bf16', ... for a device array; TypeError naming `name` for anything else."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return cai["typestr"][1:]
    if hasattr(obj, "__dlpack_device__"):
        device_type = obj.__dlpack_device__()[0]
        if device_type not in _DLPACK_CUDA_DEVICES:
            raise TypeError(f"{name}: expected a CUDA array, got a {type(obj).__module__}.{type(obj).__qualname__} "
                            "in host memory (copy it with cupy.asarray)")
        kind = str(getattr(obj, "dtype", "")).rsplit(".", 1)[-1]
        return {"float32": "f4", "float16": "f2", "bfloat16": "bf16", "uint16": "u2", "int16": "i2"}.get(kind, kind)
    raise TypeError(f"{name}: expected a CUDA array (cupy.ndarray or any object with __cuda_array_interface__ or "
                    f"DLPack), got {type(obj).__module__}.{type(obj).__qualname__}")


def resolve_dtype(obj, name, dtype=None, *, uint16_is_bf16=False) -> str:
    """The native dtype name ('fp32', 'fp16' or 'bf16') of array argument `name`.

    An explicit `dtype` wins (the op then checks the array against it); otherwise it is inferred, and a uint16
    array needs dtype='bf16' unless `uint16_is_bf16` (cast, whose only 16-bit integer meaning is bf16).
    """
    if dtype is not None:
        if not isinstance(dtype, str) or dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype: expected one of 'fp32', 'fp16', 'bf16', got {dtype!r}")
        _element_kind(obj, name)  # still: is it a device array at all
        return _DTYPE_NAMES[dtype]
    kind = _element_kind(obj, name)
    if kind == "f4":
        return "fp32"
    if kind == "f2":
        return "fp16"
    if kind == "bf16" or (uint16_is_bf16 and kind in ("u2", "i2", "V2")):
        return "bf16"
    if kind in ("u2", "i2", "V2"):
        raise TypeError(f"{name}: a 16-bit integer array is taken as bf16 bits only when asked: pass dtype='bf16'")
    raise TypeError(f"{name}: expected a float32, float16 or bf16 (uint16) array, got element type {kind!r}")


def shape_of(obj) -> tuple:
    cai = getattr(obj, "__cuda_array_interface__", None)
    return tuple(cai["shape"]) if cai is not None else tuple(obj.shape)


def empty(shape, dtype: str):
    """An uninitialised cupy array of `shape` for native dtype `dtype` (bf16: uint16)."""
    import cupy

    return cupy.empty(tuple(shape), dtype=_CUPY_DTYPES[dtype])


def _binary(op, first, second, first_name, out, dtype):
    dt = resolve_dtype(first, first_name, dtype)
    if out is None:
        out = empty(shape_of(first), dt)
    op(first, second, out, dt, stream())
    return out


def add(a, b, *, out=None, dtype=None):
    """out = a + b."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):  # host arrays: the float64 reference
        return reference.kernels.add(a, b, out=out, dtype=dtype)
    return _binary(_C.add, a, b, "a", out, dtype)


def add_relu(a, b, *, out=None, dtype=None):
    """out = max(a + b, 0): the residual join of a ResNet block."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):  # host arrays: the float64 reference
        return reference.kernels.add_relu(a, b, out=out, dtype=dtype)
    return _binary(_C.add_relu, a, b, "a", out, dtype)


def relu(x, *, out=None, dtype=None):
    """out = max(x, 0) (NaN propagates)."""
    if isinstance(x, np.ndarray):  # host arrays: the float64 reference
        return reference.kernels.relu(x, out=out, dtype=dtype)
    dt = resolve_dtype(x, "x", dtype)
    if out is None:
        out = empty(shape_of(x), dt)
    _C.relu(x, out, dt, stream())
    return out


def relu_backward(dy, y, *, out=None, dtype=None):
    """out = dy * (y > 0), with y the saved ReLU output."""
    if isinstance(dy, np.ndarray) and isinstance(y, np.ndarray):  # host arrays: the float64 reference
        return reference.kernels.relu_backward(dy, y, out=out, dtype=dtype)
    return _binary(_C.relu_backward, dy, y, "dy", out, dtype)


def add_relu_backward(dy, y, *, out=None, dtype=None):
    """The gradient of both summands of add_relu: dy * (y > 0), with y the saved add_relu output."""
    if isinstance(dy, np.ndarray) and isinstance(y, np.ndarray):  # host arrays: the float64 reference
        return reference.kernels.add_relu_backward(dy, y, out=out, dtype=dtype)
    return _binary(_C.relu_backward, dy, y, "dy", out, dtype)


def add_tensor_cudnn(a, b, *, out=None, layout="NCHW", dtype=None):
    """out = a + b through cudnnAddTensor (4-D activations; the baseline the custom add is compared with)."""
    dt = resolve_dtype(a, "a", dtype)
    if out is None:
        out = empty(shape_of(a), dt)
    _C.add_tensor_cudnn(a, b, out, layout, dt, stream())
    return out


def cast(x, out):
    """out = x converted to out's dtype (fp32 <-> fp16 <-> bf16, rounding to nearest even). uint16 arrays are
    bf16 here. Same shape; returns out."""
    if isinstance(x, np.ndarray) and isinstance(out, np.ndarray):  # host arrays: the float64 reference
        return reference.kernels.cast(x, out)
    x_dtype = resolve_dtype(x, "x", uint16_is_bf16=True)
    out_dtype = resolve_dtype(out, "out", uint16_is_bf16=True)
    _C.cast(x, out, x_dtype, out_dtype, stream())
    return out


__all__ = ["add", "add_relu", "add_relu_backward", "add_tensor_cudnn", "cast", "relu", "relu_backward"]
