"""ResNet residual blocks (torchvision's BasicBlock and Bottleneck, names included) with explicit backward.

The last batch norm of a block takes the shortcut as its residual input and applies the ReLU, so "bn + add +
relu" is one call that resnet_native.ops.norm fuses where cuDNN can (fused_residual=True). With
fused_residual=False the same block runs bn, then the Add(+ReLU) kernel: the reference the fused path is
proven equal to.
"""

from ..._core.placement import native_dtype
from ...ops import kernels
from ..layers import Add, BatchNorm2d, Conv2d, Sequential
from ..layers.module import Module


class _ResidualBlock(Module):
    """Shared by both blocks: the main path is conv/bn pairs, the last bn adds the shortcut and applies
    ReLU."""

    expansion = 1

    def __init__(self, inplanes, planes, stride=1, *, layout="NHWC", precision="fp32", engine=None, algo="find",
                 fused_residual=True, rng=None):
        super().__init__()
        conv_args = dict(layout=layout, precision=precision, engine=engine, algo=algo, rng=rng)
        outplanes = planes * self.expansion
        self._build_main_path(inplanes, planes, stride, conv_args, fused_residual)
        self.fused_residual = bool(fused_residual)
        if not self.fused_residual:
            self.add_module("add", Add(relu=True))
        self.downsample = None
        if stride != 1 or inplanes != outplanes:
            self.downsample = self.add_module(
                "downsample",
                Sequential(
                    Conv2d(inplanes, outplanes, 1, stride, 0, **conv_args),
                    BatchNorm2d(outplanes, layout=layout),
                ),
            )

    def _build_main_path(self, inplanes, planes, stride, conv_args, fused_residual):
        """Add the main path's conv/bn modules (in forward order); the last bn takes the residual."""
        raise NotImplementedError

    def _main_pairs(self):
        """[(conv, bn)] of the main path, in order; the last bn is the residual one."""
        raise NotImplementedError

    def zero_residual_scale(self) -> None:
        """Set the residual batch norm's scale to zero (before placing the model), so the block starts out as its
        shortcut and a deep network trains like a shallow one at first (Goyal et al., 2017)."""
        self._main_pairs()[-1][1].weight.data[...] = 0.0

    def forward(self, x, train: bool):
        pairs = self._main_pairs()
        out = x
        for conv, bn in pairs[:-1]:
            out = bn.forward(conv.forward(out, train), train)
        last_conv, last_bn = pairs[-1]
        shortcut = x if self.downsample is None else self.downsample.forward(x, train)
        out = last_conv.forward(out, train)
        if self.fused_residual:
            return last_bn.forward(out, train, z=shortcut)
        return self._children["add"].forward(last_bn.forward(out, train), shortcut, train)

    def backward(self, dy):
        pairs = self._main_pairs()
        last_conv, last_bn = pairs[-1]
        if self.fused_residual:
            d, d_shortcut = last_bn.backward(dy)
        else:
            d, d_shortcut = self._children["add"].backward(dy)
            d = last_bn.backward(d)
        if self.downsample is not None:
            d_shortcut = self.downsample.backward(d_shortcut)
        # The shortcut's gradient is a buffer of this block's layers (the downsample conv's dx, or the last batch
        # norm's dz / the Add's gradient, already read by that batch norm): the first conv's backward-data adds
        # into it (beta = 1) and the sum needs no pass of its own. The block's input gradient dy is not its own.
        into = None if d_shortcut is dy else d_shortcut
        d = last_conv.backward(d)
        for i in reversed(range(len(pairs) - 1)):
            conv, bn = pairs[i]
            d = conv.backward(bn.backward(d), accumulate_into=into if i == 0 else None)
        if into is None:
            kernels.add(d, d_shortcut, out=d, dtype=native_dtype(d))
        return d


class BasicBlock(_ResidualBlock):
    """3x3 conv, bn, relu, 3x3 conv, bn, + shortcut, relu. The stride is on the first conv."""

    expansion = 1

    def _build_main_path(self, inplanes, planes, stride, conv_args, fused_residual):
        layout = conv_args["layout"]
        self.conv1 = self.add_module("conv1", Conv2d(inplanes, planes, 3, stride, 1, **conv_args))
        self.bn1 = self.add_module("bn1", BatchNorm2d(planes, layout=layout, relu=True))
        self.conv2 = self.add_module("conv2", Conv2d(planes, planes, 3, 1, 1, **conv_args))
        self.bn2 = self.add_module(
            "bn2", BatchNorm2d(planes, layout=layout, relu=fused_residual, residual=fused_residual)
        )

    def _main_pairs(self):
        return [(self.conv1, self.bn1), (self.conv2, self.bn2)]


class Bottleneck(_ResidualBlock):
    """1x1 reduce, 3x3 (carrying the stride, as torchvision's ResNet v1.5), 1x1 expand (x4), + shortcut,
    relu."""

    expansion = 4

    def _build_main_path(self, inplanes, planes, stride, conv_args, fused_residual):
        layout, width = conv_args["layout"], planes
        self.conv1 = self.add_module("conv1", Conv2d(inplanes, width, 1, 1, 0, **conv_args))
        self.bn1 = self.add_module("bn1", BatchNorm2d(width, layout=layout, relu=True))
        self.conv2 = self.add_module("conv2", Conv2d(width, width, 3, stride, 1, **conv_args))
        self.bn2 = self.add_module("bn2", BatchNorm2d(width, layout=layout, relu=True))
        self.conv3 = self.add_module("conv3", Conv2d(width, planes * self.expansion, 1, 1, 0, **conv_args))
        self.bn3 = self.add_module(
            "bn3",
            BatchNorm2d(planes * self.expansion, layout=layout, relu=fused_residual, residual=fused_residual),
        )

    def _main_pairs(self):
        return [(self.conv1, self.bn1), (self.conv2, self.bn2), (self.conv3, self.bn3)]
