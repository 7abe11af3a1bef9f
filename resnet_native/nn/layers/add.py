"""Residual add, optionally fused with ReLU, on the custom elementwise kernels: y = [relu](a + b).

Backward gives the same gradient to both summands: dy itself, or dy masked by (y > 0) with ReLU; the two
returned arrays are then one array, which callers only read.
"""

from ..._core.placement import native_dtype
from ...ops import kernels
from .checks import check_same_shape
from .module import Module


class Add(Module):
    def __init__(self, relu: bool = False):
        super().__init__()
        self.relu = bool(relu)
        self._saved_y = None
        self._saved = False

    def forward(self, a, b, train: bool):
        self.ensure_placed()
        check_same_shape("b", b, "a", a)
        y = self._buffers.get("y", a.shape, a.dtype)
        if self.relu:
            kernels.add_relu(a, b, out=y, dtype=native_dtype(a))
        else:
            kernels.add(a, b, out=y, dtype=native_dtype(a))
        self._saved = bool(train)
        self._saved_y = y if train and self.relu else None
        return y

    def backward(self, dy):
        """(da, db)."""
        if not self._saved:
            raise RuntimeError("Add.backward: nothing saved; call forward(a, b, train=True) first")
        self._saved = False
        if not self.relu:
            return dy, dy
        y, self._saved_y = self._saved_y, None
        check_same_shape("dy", dy, "y", y)
        g = self._buffers.get("dx", y.shape, y.dtype)
        kernels.add_relu_backward(dy, y, out=g, dtype=native_dtype(y))
        return g, g

    def _forget_own_saved(self):
        self._saved, self._saved_y = False, None

    def describe(self):
        return "relu" if self.relu else ""
