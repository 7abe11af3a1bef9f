"""Host-only stand-ins for device arrays: objects that expose a __cuda_array_interface__ dict.

They let CPU-only machines exercise argument validation, which must finish before any device access.
"""

import numpy as np


class FakeCudaArray:
    def __init__(self, shape, dtype="float32", strides=None, ptr=0x10000):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.__cuda_array_interface__ = {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
        }


def transposed(shape, dtype="float32"):
    """A fake array with the strides of a transposed (non-contiguous) view."""
    itemsize = np.dtype(dtype).itemsize
    contiguous = np.empty(shape[::-1], dtype=dtype).strides
    return FakeCudaArray(shape, dtype, strides=tuple(reversed(contiguous)) if itemsize else None)
