"""Custom CUDA kernels for the residual blocks: add, add + ReLU, ReLU and their backward, dtype conversion (and
conversion added into an array: a gradient accumulated into its master); a weighted add and a scale (test-time
augmentation's sum of logits).

Every function takes cupy arrays (or any __cuda_array_interface__ / DLPack device array), C-contiguous, of one
shape, and runs on cupy's current stream. Storage dtypes are fp32, fp16 and bf16 (a uint16 array holding bf16
bits: cupy has no bfloat16); math is fp32. `dtype=None` infers 'fp32' / 'fp16' from the first array, and bf16 must
be named (dtype='bf16'), since a uint16 array could hold anything. `out=None` allocates the output with cupy once
every argument has been validated; `out` may be one of the inputs (in place), but must not partially overlap one.
The native core checks every argument and raises TypeError / ValueError naming it.

The kernels use 16-byte loads and stores when every pointer is 16-byte aligned (scalar for misaligned views and
for the tail), grid-stride over any size.
"""

import numpy as np

from .. import reference
from .._core.loader import _C
from .._core.names import flag
from .._core.runtime import op_stream

# The stream every op wrapper passes (conv.py's too): cupy's current stream, 0 without a GPU.
stream = op_stream


def _elementwise(name: str, native, arrays: tuple, out, dtype):
    """One elementwise op: the float64 reference `name` when every array is on the host, else the native op."""
    if all(isinstance(a, np.ndarray) for a in arrays):  # host arrays: the float64 reference
        return getattr(reference.kernels, name)(*arrays, out=out, dtype=dtype)
    return native(*arrays, out, dtype, stream())


def add(a, b, *, out=None, dtype=None):
    """out = a + b."""
    return _elementwise("add", _C.add, (a, b), out, dtype)


def add_relu(a, b, *, out=None, dtype=None):
    """out = max(a + b, 0): the residual join of a ResNet block."""
    return _elementwise("add_relu", _C.add_relu, (a, b), out, dtype)


def add_scaled(a, b, alpha, *, out=None, dtype=None):
    """out = a + alpha * b, the math in fp32 (float64 on the host) and rounded once; alpha a finite number."""
    if all(isinstance(v, np.ndarray) for v in (a, b)):
        return reference.kernels.add_scaled(a, b, alpha, out=out, dtype=dtype)
    return _C.add_scaled(a, b, alpha, out, dtype, stream())


def scale(x, alpha, *, out=None, dtype=None):
    """out = alpha * x; alpha a finite number."""
    if isinstance(x, np.ndarray):
        return reference.kernels.scale(x, alpha, out=out, dtype=dtype)
    return _C.scale(x, alpha, out, dtype, stream())


def relu(x, *, out=None, dtype=None):
    """out = max(x, 0) (NaN propagates)."""
    return _elementwise("relu", _C.relu, (x,), out, dtype)


def relu_backward(dy, y, *, out=None, dtype=None):
    """out = dy * (y > 0), with y the saved ReLU output."""
    return _elementwise("relu_backward", _C.relu_backward, (dy, y), out, dtype)


def add_relu_backward(dy, y, *, out=None, dtype=None):
    """The gradient of both summands of add_relu: dy * (y > 0), with y the saved add_relu output."""
    return _elementwise("add_relu_backward", _C.relu_backward, (dy, y), out, dtype)


def add_tensor_cudnn(a, b, *, out=None, layout="NCHW", dtype=None):
    """out = a + b through cudnnAddTensor (4-D activations; the baseline the custom add is compared with)."""
    return _C.add_tensor_cudnn(a, b, out, layout, dtype, stream())


def cast(x, out, *, accumulate=False):
    """out = x converted to out's dtype (fp32 <-> fp16 <-> bf16, rounding to nearest even). uint16 arrays are
    bf16 here. Same shape; returns out. accumulate: out += x instead, the sum taken in fp32 and rounded once to
    out's dtype (a low-precision gradient added into its fp32 master in one pass)."""
    accumulate = flag("accumulate", accumulate)
    if isinstance(x, np.ndarray) and isinstance(out, np.ndarray):  # host arrays: the float64 reference
        return reference.kernels.cast(x, out, accumulate=accumulate)
    return _C.cast(x, out, accumulate, stream())


__all__ = ["add", "add_relu", "add_relu_backward", "add_scaled", "add_tensor_cudnn", "cast", "relu", "relu_backward",
           "scale"]
