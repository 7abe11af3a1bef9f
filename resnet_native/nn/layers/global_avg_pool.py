"""Global average pooling, (N, C, H, W) or (N, H, W, C) -> (N, C), on the custom kernels (fp32
accumulation)."""

from ..._core.names import LAYOUTS, choice
from ..._core.placement import native_dtype
from ...ops import pool
from .checks import channel_axis, check_activation
from .module import Module


class GlobalAvgPool(Module):
    def __init__(self, *, layout="NHWC"):
        super().__init__()
        self.layout = choice("layout", layout, LAYOUTS)
        self._saved_shape = None

    def forward(self, x, train: bool):
        self.ensure_placed()
        check_activation("x", x, self.layout)
        n, c = x.shape[0], x.shape[channel_axis(self.layout)]
        y = self._buffers.get("y", (n, c), x.dtype)
        pool.global_avg_pool(x, layout=self.layout, out=y, dtype=native_dtype(x))
        self._saved_shape = tuple(x.shape) if train else None
        return y

    def backward(self, dy):
        x_shape = self._saved_shape
        if x_shape is None:
            raise RuntimeError("GlobalAvgPool.backward: nothing saved; call forward(x, train=True) first")
        self._saved_shape = None
        expected = (x_shape[0], x_shape[channel_axis(self.layout)])
        if tuple(dy.shape) != expected:
            raise ValueError(f"dy: expected shape {expected}, got {tuple(dy.shape)}")
        dx = self._buffers.get("dx", x_shape, dy.dtype)
        pool.global_avg_pool_backward(dy, x_shape, layout=self.layout, out=dx, dtype=native_dtype(dy))
        return dx

    def _forget_own_saved(self):
        self._saved_shape = None
