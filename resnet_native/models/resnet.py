"""ResNet-18/34/50/101/152 with torchvision's structure, parameter names and shapes, on the native ops.

    model = resnet_native.ResNet50(num_classes=10, stem="cifar", layout="NHWC", precision="fp16")
    logits = model.forward(x, train=False)            # x: (N, 32, 32, 3) float16 cupy array -> (N, 10) fp32

Stems: 'cifar' = 3x3 stride-1 conv 64, BN, ReLU (no max pool);
       'imagenet' = 7x7/2 conv, BN, ReLU, 3x3/2 max pool.
precision: 'fp32' (strict FMA math), 'tf32', 'fp16' or 'bf16' (bf16 activations are uint16 arrays of bf16 bits).
Parameters are fp32 masters; for fp16/bf16 the ops read low-precision copies that the optimizer's fused step
refreshes. Parameters are built on the host (NumPy, torchvision's init) and move to the GPU on first use
or cuda().
"""

import numpy as np

from ..layers import BatchNorm2d, Conv2d, GlobalAvgPool, Linear, MaxPool2d, Sequential
from ..layers._backend import LAYOUTS, PRECISIONS, ops
from ..layers.checks import check_activation, check_choice, positive_int
from ..layers.conv2d import ENGINES
from ..layers.module import Module
from .blocks import BasicBlock, Bottleneck

DEPTHS = {
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)),
    101: (Bottleneck, (3, 4, 23, 3)),
    152: (Bottleneck, (3, 8, 36, 3)),
}
STEMS = ("cifar", "imagenet")


class ResNet(Module):
    def __init__(
        self,
        depth=18,
        num_classes=1000,
        *,
        stem="cifar",
        layout="NHWC",
        precision="fp32",
        engine=None,
        algo="find",
        fused_residual=True,
        seed=None,
    ):
        super().__init__()
        if depth not in DEPTHS:
            raise ValueError(f"depth: expected one of {sorted(DEPTHS)}, got {depth!r}")
        self.depth = depth
        self.num_classes = positive_int("num_classes", num_classes)
        self.stem = check_choice("stem", stem, STEMS)
        self.layout = check_choice("layout", layout, LAYOUTS)
        self.precision = check_choice("precision", precision, PRECISIONS)
        if engine is not None:
            check_choice("engine", engine, ENGINES)
        rng = np.random.default_rng(seed)
        block, counts = DEPTHS[depth]
        conv_args = dict(layout=layout, precision=precision, engine=engine, algo=algo, rng=rng)
        if stem == "cifar":
            self.conv1 = Conv2d(3, 64, 3, 1, 1, needs_input_grad=False, **conv_args)
        else:
            self.conv1 = Conv2d(3, 64, 7, 2, 3, needs_input_grad=False, **conv_args)
        self.add_module("conv1", self.conv1)
        self.bn1 = self.add_module("bn1", BatchNorm2d(64, layout=layout, relu=True))
        self.maxpool = (
            self.add_module("maxpool", MaxPool2d(3, 2, 1, layout=layout)) if stem == "imagenet" else None
        )
        inplanes = 64
        self.stages = []
        for i, (planes, count) in enumerate(zip((64, 128, 256, 512), counts, strict=True)):
            blocks = []
            for j in range(count):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(
                    block(
                        inplanes,
                        planes,
                        stride,
                        layout=layout,
                        precision=precision,
                        engine=engine,
                        algo=algo,
                        fused_residual=fused_residual,
                        rng=rng,
                    )
                )
                inplanes = planes * block.expansion
            self.stages.append(self.add_module(f"layer{i + 1}", Sequential(*blocks)))
        self.avgpool = self.add_module("avgpool", GlobalAvgPool(layout=layout))
        self.fc = self.add_module("fc", Linear(inplanes, num_classes, rng=rng))

    def _own_low_precision_dtype(self):
        # Every parameter gets a low-precision copy (those of BN and fc go unused) so the optimizer updates
        # the whole model, masters and copies, in one launch.
        return ops.storage_dtype(self.precision) if self.precision in ("fp16", "bf16") else None

    @property
    def input_dtype(self):
        """The dtype forward() expects (float32, float16, or uint16 holding bf16 bits); others are
        converted."""
        return ops.storage_dtype(self.precision)

    def forward(self, x, train=None):
        """Logits (N, num_classes), fp32, as a new array. train=None follows train()/eval()."""
        return self._forward(x, train).copy()

    def _forward(self, x, train=None):
        """Like forward() but returns the model's own logits buffer, rewritten by the next call (no
        allocation)."""
        train = self.training if train is None else bool(train)
        self._ensure_device()
        x = self._as_input(x)
        if not train:
            self.forget_saved()
        out = self.bn1.forward(self.conv1.forward(x, train), train)
        if self.maxpool is not None:
            out = self.maxpool.forward(out, train)
        for stage in self.stages:
            out = stage.forward(out, train)
        return self.fc.forward(self.avgpool.forward(out, train), train)

    def backward(self, dlogits) -> None:
        """Back-propagate d(loss)/d(logits) (N, num_classes, fp32) through the last training forward, adding
        every parameter's gradient into its .grad."""
        d = self.avgpool.backward(self.fc.backward(dlogits))
        for stage in reversed(self.stages):
            d = stage.backward(d)
        if self.maxpool is not None:
            d = self.maxpool.backward(d)
        self.conv1.backward(self.bn1.backward(d))

    def __call__(self, x, train=None):
        return self.forward(x, train)

    def _as_input(self, x):
        check_activation("x", x, self.layout, 3)
        want = self.input_dtype
        if x.dtype == want:
            return x
        if x.dtype not in (np.float32, np.float16):
            raise TypeError(f"x: expected {want.name} (or float32/float16, converted), got {x.dtype}")
        buf = self._buffers.get("input", x.shape, want)
        ops.kernels.cast(x, buf)
        return buf

    def model_copies(self):
        """The low-precision copies of the parameters, in parameters() order (None for fp32/tf32)."""
        params = self.parameters()
        if self.precision not in ("fp16", "bf16") or not params[0].on_device:
            return None
        return [p.low for p in params]

    def zero_grad(self) -> None:
        """Zero every parameter gradient in place (the optimizer's zero_grad does the same in one launch)."""
        for p in self.parameters():
            if p.grad is not None:
                p.grad.fill(0)

    def describe(self):
        return (
            f"depth={self.depth}, num_classes={self.num_classes}, stem={self.stem}, layout={self.layout}, "
            f"precision={self.precision}"
        )

    def __repr__(self):
        rows = [("name", "layer", "configuration", "parameters")]
        for name, m in self.named_modules():
            own = sum(p.size for p in m._params.values())
            if own or isinstance(m, (MaxPool2d, GlobalAvgPool)):
                rows.append((name.rstrip("."), type(m).__name__, m.describe(), f"{own:,}"))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [
            f"ResNet-{self.depth}({self.describe()}, engine={self.conv1.engine}): "
            f"{self.num_parameters():,} parameters"
        ]
        for row in rows:
            cells = [cell.ljust(w) for cell, w in zip(row[:3], widths, strict=False)]
            lines.append("  " + "  ".join(cells + [row[3].rjust(widths[3])]))
        return "\n".join(lines)


def _constructor(depth):
    def build(num_classes=1000, stem="cifar", layout="NHWC", precision="fp32", engine=None, **kwargs):
        return ResNet(depth, num_classes, stem=stem, layout=layout, precision=precision, engine=engine, **kwargs)

    build.__name__ = build.__qualname__ = f"ResNet{depth}"
    build.__doc__ = (
        f"ResNet-{depth} (torchvision names and shapes). Keyword extras: algo='find', "
        "fused_residual=True, seed=None. See resnet_native.models.resnet.ResNet."
    )
    return build


ResNet18 = _constructor(18)
ResNet34 = _constructor(34)
ResNet50 = _constructor(50)
ResNet101 = _constructor(101)
ResNet152 = _constructor(152)
