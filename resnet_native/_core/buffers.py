"""Per-layer device buffers, allocated once per (role, shape, dtype) and reused on every later call.

Why: a training step then allocates nothing on the device (the precondition for capturing it in a CUDA graph),
and the cupy pool is not churned. Buffers are keyed on their shape, which follows the input shape, so a few
input shapes (training batch, last partial batch, evaluation batch) coexist; the least recently used beyond
`capacity` are dropped. New float buffers (and uint16 ones, which hold bf16) start with every bit set, NaN in each
of those formats, so an op that fails to write an element shows up in tests; the others start as zeros. On the
device both are a memset: no kernel to compile on a fresh machine. The array module is where the owning module
lives (its Placement), set when it is placed.
"""

from collections import OrderedDict

import numpy as np


def _poisoned(dtype: np.dtype) -> bool:
    """Whether a new buffer of this dtype starts as NaN (all bits set) rather than zero."""
    return dtype.kind == "f" or dtype == np.uint16  # uint16: bf16 bits


class BufferCache:
    def __init__(self, capacity: int = 48, xp=None):
        self.capacity = capacity
        self.xp = xp  # numpy or cupy: set by the owner's placement
        self._arrays = OrderedDict()

    def get(self, role: str, shape, dtype):
        """The buffer for `role` with this shape and dtype (allocated on first request)."""
        dtype = np.dtype(dtype)
        key = (role, tuple(int(s) for s in shape), dtype.str)
        array = self._arrays.get(key)
        if array is None:
            if self.xp is None:
                raise RuntimeError(f"BufferCache.get({role!r}): its owner is not placed yet (cuda() or to_host())")
            array = self.xp.empty(key[1], dtype=dtype)
            byte = 0xFF if _poisoned(dtype) else 0
            if isinstance(array, np.ndarray):
                array.view(np.uint8).fill(byte)
            elif array.nbytes:
                array.data.memset_async(byte, array.nbytes)
            self._remember(key, array)
        else:
            self._arrays.move_to_end(key)
        return array

    def find(self, role: str, shape):
        """A buffer stored with store() for `role` and this shape, or None."""
        key = (role, tuple(int(s) for s in shape), None)
        if key in self._arrays:
            self._arrays.move_to_end(key)
            return self._arrays[key]
        return None

    def store(self, role: str, shape, array) -> None:
        """Keep an array an op returned (e.g. batch norm's reserve space) for the next call with this
        shape."""
        self._remember((role, tuple(int(s) for s in shape), None), array)

    def clear(self) -> None:
        self._arrays.clear()

    def arrays(self) -> list:
        return list(self._arrays.values())

    def _remember(self, key, array):
        self._arrays[key] = array
        self._arrays.move_to_end(key)
        while len(self._arrays) > self.capacity:
            self._arrays.popitem(last=False)

    def __len__(self):
        return len(self._arrays)
