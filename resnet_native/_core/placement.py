"""Where a model lives: on the GPU (cupy arrays, the native ops) or on the host (NumPy arrays, the float64 reference).

    model.cuda()                # cupy: conv.conv2d & co. call the native core
    model.to_host(np.float64)   # NumPy: conv.conv2d & co. hand the arrays to resnet_native.reference

A model is placed once, as a whole. Every module of it, its ParameterArena, its layers' BufferCaches, its optimizer
and loss scaler then take the array module and dtypes from its Placement: nothing global chooses them. Which
implementation of an op runs follows from the arrays alone: each native op function sends NumPy arrays to its
reference in its first line.
"""

from dataclasses import dataclass
from functools import cache

import numpy as np

from .names import MASTER_DTYPE, PRECISION_STORAGE
from .runtime import require_gpu


@dataclass(frozen=True)
class Placement:
    """xp: cupy or numpy. master_dtype: masters, gradients, batch-norm statistics, optimizer state and logits.
    float_storage: the activations and weights of fp32 and tf32 models (fp16 and bf16 store float16 and uint16
    bf16 bits wherever they live)."""

    xp: object
    master_dtype: np.dtype
    float_storage: np.dtype

    @property
    def on_gpu(self) -> bool:
        return self.xp is not np

    def storage_dtype(self, precision: str) -> np.dtype:
        """The dtype of a `precision` model's activations and of the weights its ops read."""
        stored = PRECISION_STORAGE[precision]
        return self.float_storage if stored == MASTER_DTYPE else stored

    def array(self, value, dtype):
        """A new array here holding (host or device) `value` converted to `dtype`."""
        if not isinstance(value, np.ndarray) and hasattr(value, "get"):
            value = value.get()
        return self.xp.asarray(np.array(value, dtype=dtype, order="C"))

    def __str__(self):
        return "the GPU" if self.on_gpu else f"the host ({self.master_dtype.name})"


@cache
def _gpu() -> Placement:
    import cupy

    return Placement(cupy, MASTER_DTYPE, MASTER_DTYPE)


def gpu() -> Placement:
    """The current GPU (NoGPUError, with the reason, when none is usable)."""
    require_gpu()
    return _gpu()


def host(dtype=np.float64) -> Placement:
    """The host, with masters, gradients and fp32/tf32 activations in `dtype` (float64, or float32 as on the GPU)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float64, np.float32):
        raise ValueError(f"dtype: expected float64 or float32, got {dtype.name}")
    return Placement(np, dtype, dtype)


def low_copy_dtype(precision: str):
    """The dtype of the low-precision parameter copies the ops of a `precision` model read (float16, uint16 bf16
    bits), or None when they read the masters (fp32, tf32)."""
    stored = PRECISION_STORAGE[precision]
    return None if stored == MASTER_DTYPE else stored


def array_module(array):
    """numpy for a NumPy array, else cupy (a device array)."""
    if isinstance(array, np.ndarray):
        return np
    import cupy

    return cupy


def host_copy(array) -> np.ndarray:
    """A new NumPy array holding a device or host array's values."""
    return array.copy() if isinstance(array, np.ndarray) else array.get()


def native_dtype(array):
    """The dtype argument the native ops need for `array`: 'bf16' for uint16 (bf16 bits), else None (inferred)."""
    return "bf16" if array.dtype == np.uint16 else None


__all__ = ["Placement", "array_module", "gpu", "host", "host_copy", "low_copy_dtype", "native_dtype"]
