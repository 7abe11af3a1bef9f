"""ReLU on the custom elementwise kernels; backward masks with the saved output (y > 0)."""

from ..._core.placement import native_dtype
from ...ops import kernels
from .checks import check_same_shape
from .module import Module


class ReLU(Module):
    def __init__(self):
        super().__init__()
        self._saved_y = None

    def forward(self, x, train: bool):
        self.ensure_placed()
        y = self._buffers.get("y", x.shape, x.dtype)
        kernels.relu(x, out=y, dtype=native_dtype(x))
        self._saved_y = y if train else None
        return y

    def backward(self, dy):
        y = self._saved_y
        if y is None:
            raise RuntimeError("ReLU.backward: nothing saved; call forward(x, train=True) first")
        self._saved_y = None
        check_same_shape("dy", dy, "y", y)
        dx = self._buffers.get("dx", y.shape, y.dtype)
        kernels.relu_backward(dy, y, out=dx, dtype=native_dtype(y))
        return dx

    def _forget_own_saved(self):
        self._saved_y = None
