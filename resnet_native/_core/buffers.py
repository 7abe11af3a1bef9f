"""Per-layer device buffers, allocated once per (role, shape, dtype) and reused on every later call.

Why: a training step then allocates nothing on the device (the precondition for capturing it in a CUDA graph),
and the cupy pool is not churned. Buffers are keyed on their shape, which follows the input shape, so a few
input shapes (training batch, last partial batch, evaluation batch) coexist; the least recently used beyond
`capacity` are dropped. New float buffers start as NaN (bf16 NaN for uint16) so an op that fails to write an
element shows up in tests. The array module is where the owning module lives (its Placement), set when it is placed.
"""

from collections import OrderedDict

import numpy as np

_NAN_BITS = {np.dtype(np.uint16): 0x7FC0}  # bf16 quiet NaN


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
            fill = _NAN_BITS.get(dtype, np.nan if dtype.kind == "f" else 0)
            array = self.xp.full(key[1], fill, dtype=dtype)
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
