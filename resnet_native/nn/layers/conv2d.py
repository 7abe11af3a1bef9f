"""Conv2d on resnet_native.ops.conv: forward, and backward to the input and (accumulated) weight gradient."""

import numpy as np

from ..._core.names import ENGINES, LAYOUTS, PRECISIONS, choice, whole_number
from ..._core.placement import low_copy_dtype
from ...ops import conv
from .checks import check_activation
from .module import Module


def kaiming_normal_fan_out(shape, rng) -> np.ndarray:
    """torchvision's ResNet conv init: N(0, 2 / fan_out), fan_out = K * R * S, for a (K, C, R, S) filter."""
    k, _, r, s = shape
    return rng.standard_normal(shape) * np.sqrt(2.0 / (k * r * s))


class Conv2d(Module):
    """A 2-D convolution without bias (as in ResNets).

    The weight is stored in the layout the op reads: (K, C/g, R, S) for NCHW, (K, R, S, C/g) for NHWC;
    state_dict() always shows torch's (K, C/g, R, S). needs_input_grad=False (the stem) skips the
    backward-data convolution; needs_weight_grad=False (a frozen filter bank) skips the filter gradient's, and
    the weight leaves trainable_parameters().
    engine=None takes resnet_native.ops.conv.default_engine() when the spec is first built (the first forward,
    or spec()).
    """

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        *,
        dilation=1,
        groups=1,
        layout="NHWC",
        precision="fp32",
        engine=None,
        algo="find",
        deterministic=False,
        needs_input_grad=True,
        needs_weight_grad=True,
        rng=None,
    ):
        super().__init__()
        self.in_channels = whole_number("in_channels", in_channels, 1)
        self.out_channels = whole_number("out_channels", out_channels, 1)
        self.kernel_size = whole_number("kernel_size", kernel_size, 1)
        self.stride = whole_number("stride", stride, 1)
        self.padding = whole_number("padding", padding, 0)
        self.dilation = whole_number("dilation", dilation, 1)
        self.groups = whole_number("groups", groups, 1)
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"groups: {groups} must divide in_channels={in_channels} and out_channels={out_channels}"
            )
        self.layout = choice("layout", layout, LAYOUTS)
        self.precision = choice("precision", precision, PRECISIONS)
        self.engine = None if engine is None else choice("engine", engine, ENGINES)
        self.algo = algo
        self.deterministic = bool(deterministic)
        self.needs_input_grad = bool(needs_input_grad)
        self.needs_weight_grad = bool(needs_weight_grad)
        rng = rng if rng is not None else np.random.default_rng()
        torch_shape = (out_channels, in_channels // groups, kernel_size, kernel_size)
        self.weight = self.add_parameter(
            "weight", self._from_torch("weight", kaiming_normal_fan_out(torch_shape, rng))
        )
        self._spec = None
        self._output_shapes = {}  # input shape -> output shape
        self._saved_x = None

    # -- layout of the weight --------------------------------------------------------------------------------
    def _torch_shape(self, name, param):
        k, c, r = self.out_channels, self.in_channels // self.groups, self.kernel_size
        return (k, c, r, r)

    def _to_torch(self, name, array):
        return array.transpose(0, 3, 1, 2) if self.layout == "NHWC" else array

    def _from_torch(self, name, array):
        return np.ascontiguousarray(array.transpose(0, 2, 3, 1) if self.layout == "NHWC" else array)

    def _own_low_precision_dtype(self):
        return low_copy_dtype(self.precision)

    # -- ops -------------------------------------------------------------------------------------------------
    def spec(self):
        if self._spec is None:
            self._spec = conv.ConvSpec(
                stride=(self.stride, self.stride),
                padding=(self.padding, self.padding),
                dilation=(self.dilation, self.dilation),
                groups=self.groups,
                layout=self.layout,
                precision=self.precision,
                algo=self.algo,
                engine=self.resolved_engine(),
                deterministic=self.deterministic,
            )
        return self._spec

    def resolved_engine(self) -> str:
        """The engine of its spec: the one given, else conv.default_engine() as of when the spec is built."""
        if self._spec is not None:
            return self._spec.engine
        return conv.default_engine() if self.engine is None else self.engine

    def output_shape(self, x_shape) -> tuple:
        """conv.conv_output_shape of an input of this shape (computed once per shape)."""
        x_shape = tuple(x_shape)
        shape = self._output_shapes.get(x_shape)
        if shape is None:
            shape = self._output_shapes[x_shape] = conv.conv_output_shape(x_shape, self.weight.shape, self.spec())
        return shape

    def _weight_for_ops(self):
        return self.weight.low if self.weight.low is not None else self.weight.data

    def frozen_parameters(self) -> list:
        return [] if self.needs_weight_grad else [self.weight]

    def forward(self, x, train: bool):
        self.ensure_placed()
        check_activation("x", x, self.layout, self.in_channels)
        y = self._buffers.get("y", self.output_shape(x.shape), x.dtype)
        conv.conv2d(x, self._weight_for_ops(), self.spec(), out=y)
        self._saved_x = x if train else None
        return y

    def backward(self, dy, *, accumulate_into=None):
        """dx (None without needs_input_grad), after adding dw into the weight's gradient (with needs_weight_grad).
        accumulate_into: an array of x's shape that the convolution adds dx into (beta = 1) and returns, in place
        of its own buffer: a residual block's other input gradient, summed without a pass of its own."""
        x = self._saved_x
        if x is None:
            raise RuntimeError("Conv2d.backward: nothing saved; call forward(x, train=True) first")
        self._saved_x = None
        spec = self.spec()
        # The filter gradient goes to scratch and is then added: accumulation stays right even when algorithm
        # search (which may use the output as scratch) runs inside this call.
        if self.needs_weight_grad:
            dw = self._buffers.get("dw", self.weight.shape, dy.dtype)
            conv.conv2d_backward_filter(x, dy, spec, self.weight.shape, out=dw)
            self.weight.accumulate_grad(dw)
        if not self.needs_input_grad:
            return None
        if accumulate_into is not None:
            return conv.conv2d_backward_data(dy, self._weight_for_ops(), spec, tuple(x.shape), out=accumulate_into,
                                             accumulate=True)
        dx = self._buffers.get("dx", x.shape, dy.dtype)
        conv.conv2d_backward_data(dy, self._weight_for_ops(), spec, tuple(x.shape), out=dx)
        return dx

    def _forget_own_saved(self):
        self._saved_x = None

    def describe(self):
        k = self.kernel_size
        text = f"{self.in_channels}->{self.out_channels}, {k}x{k}, stride {self.stride}, pad {self.padding}"
        if self.dilation != 1:
            text += f", dilation {self.dilation}"
        if self.groups != 1:
            text += f", groups {self.groups}"
        return text
