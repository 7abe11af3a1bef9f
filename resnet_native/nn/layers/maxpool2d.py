"""MaxPool2d on cuDNN pooling (resnet_native.ops.pool); backward needs the saved input and output."""

from ..._core.names import LAYOUTS, choice, whole_number
from ..._core.placement import native_dtype
from ...ops import pool
from .checks import check_activation, check_same_shape
from .module import Module


class MaxPool2d(Module):
    def __init__(self, kernel_size=3, stride=2, padding=1, *, layout="NHWC"):
        super().__init__()
        self.kernel_size = whole_number("kernel_size", kernel_size, 1)
        self.stride = whole_number("stride", stride, 1)
        self.padding = whole_number("padding", padding, 0)
        if 2 * self.padding > self.kernel_size:
            raise ValueError(f"padding: {padding} must be at most half of kernel_size {kernel_size}")
        self.layout = choice("layout", layout, LAYOUTS)
        self._output_shapes = {}  # input shape -> output shape
        self._saved = None

    def output_shape(self, x_shape) -> tuple:
        """pool.max_pool2d_output_shape of an input of this shape (computed once per shape)."""
        x_shape = tuple(x_shape)
        shape = self._output_shapes.get(x_shape)
        if shape is None:
            shape = self._output_shapes[x_shape] = pool.max_pool2d_output_shape(x_shape, **self._window())
        return shape

    def _window(self):
        return dict(kernel=self.kernel_size, stride=self.stride, padding=self.padding, layout=self.layout)

    def forward(self, x, train: bool):
        self.ensure_placed()
        check_activation("x", x, self.layout)
        y = self._buffers.get("y", self.output_shape(x.shape), x.dtype)
        pool.max_pool2d(x, **self._window(), out=y, dtype=native_dtype(x))
        self._saved = (x, y) if train else None
        return y

    def backward(self, dy):
        if self._saved is None:
            raise RuntimeError("MaxPool2d.backward: nothing saved; call forward(x, train=True) first")
        x, y = self._saved
        self._saved = None
        check_same_shape("dy", dy, "y", y)
        dx = self._buffers.get("dx", x.shape, x.dtype)
        pool.max_pool2d_backward(dy, x, y, **self._window(), out=dx, dtype=native_dtype(x))
        return dx

    def _forget_own_saved(self):
        self._saved = None

    def describe(self):
        return f"{self.kernel_size}x{self.kernel_size}, stride {self.stride}, pad {self.padding}"
