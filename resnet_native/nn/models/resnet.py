"""ResNet-18/34/50/101/152 with torchvision's structure, parameter names and shapes, on the native ops.

    model = resnet_native.ResNet50(num_classes=10, stem="cifar", layout="NHWC", precision="fp16")
    logits = model.forward(x, train=False)            # x: (N, 32, 32, 3) float16 cupy array -> (N, 10) fp32
    host = resnet_native.ResNet18(num_classes=10).to_host()   # NumPy float64, the reference ops: no GPU needed

Stems: 'cifar' = 3x3 stride-1 conv 64, BN, ReLU (no max pool);
       'imagenet' = 7x7/2 conv, BN, ReLU, 3x3/2 max pool.
precision: 'fp32' (strict FMA math), 'tf32', 'fp16' or 'bf16' (bf16 activations are uint16 arrays of bf16 bits).
Parameters are fp32 masters; for fp16/bf16 the ops read low-precision copies that the optimizer's fused step
refreshes. Parameters are built on the host (NumPy, torchvision's init; seed= seeds it, initialize=False draws
nothing and leaves the convolutions' and fc's weights zero, for a copy that is to receive another model's values)
and move to the GPU on first use or cuda(), or stay on the host with to_host() (_core/placement.py).
"""

import numpy as np

from ..._core.names import ENGINES, LAYOUTS, PRECISION_STORAGE, PRECISIONS, choice, whole_number
from ..._core.placement import low_copy_dtype
from ...ops import kernels
from ..layers import BatchNorm2d, Conv2d, GlobalAvgPool, Linear, MaxPool2d, Sequential
from ..layers.checks import check_activation
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


class _ZeroDraws:
    """What the layers draw their initial weights from when a model is built with initialize=False: zeros, without
    the cost of millions of random numbers, for a copy about to receive another model's values."""

    def standard_normal(self, shape):
        return np.zeros(shape)

    def uniform(self, low, high, size):
        return np.zeros(size)


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
        initialize=True,
    ):
        super().__init__()
        if depth not in DEPTHS:
            raise ValueError(f"depth: expected one of {sorted(DEPTHS)}, got {depth!r}")
        self.depth = depth
        self.num_classes = whole_number("num_classes", num_classes, 1)
        self.stem = choice("stem", stem, STEMS)
        self.layout = choice("layout", layout, LAYOUTS)
        self.precision = choice("precision", precision, PRECISIONS)
        if engine is not None:
            choice("engine", engine, ENGINES)
        rng = np.random.default_rng(seed) if initialize else _ZeroDraws()
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
                blocks.append(block(inplanes, planes, stride, fused_residual=fused_residual, **conv_args))
                inplanes = planes * block.expansion
            self.stages.append(self.add_module(f"layer{i + 1}", Sequential(*blocks)))
        self.avgpool = self.add_module("avgpool", GlobalAvgPool(layout=layout))
        self.fc = self.add_module("fc", Linear(inplanes, num_classes, rng=rng))

    def _own_low_precision_dtype(self):
        # Every parameter gets a low-precision copy (those of BN and fc go unused) so the optimizer updates
        # the whole model, masters and copies, in one launch.
        return low_copy_dtype(self.precision)

    @property
    def input_dtype(self):
        """The dtype forward() expects (float32, float16, or uint16 holding bf16 bits; float64 for fp32/tf32 models
        on the host); others are converted."""
        if self.placement is None:
            return PRECISION_STORAGE[self.precision]
        return self.placement.storage_dtype(self.precision)

    def forward(self, x, train=None, *, copy=True):
        """Logits (N, num_classes) in the master dtype (fp32; the host's dtype after to_host()). train=None follows
        train()/eval(). copy=False returns the model's own logits buffer, rewritten by the next call: no allocation
        (what TrainStep and evaluation loops use)."""
        train = self.training if train is None else bool(train)
        self.ensure_placed()
        x = self._as_input(x)
        if not train:
            self.forget_saved()
        out = self.bn1.forward(self.conv1.forward(x, train), train)
        if self.maxpool is not None:
            out = self.maxpool.forward(out, train)
        for stage in self.stages:
            out = stage.forward(out, train)
        logits = self.fc.forward(self.avgpool.forward(out, train), train)
        return logits.copy() if copy else logits

    def backward(self, dlogits, *, on_ready=None) -> None:
        """Back-propagate d(loss)/d(logits) (N, num_classes, fp32) through the last training forward, adding
        every parameter's gradient into its .grad. on_ready(parameters), when given, is called as each group's
        gradients are final (the classifier's, then each block's from the last, then the stem's): what lets a
        data-parallel step start their all-reduce during backward (distributed/overlap.py)."""
        report = on_ready if on_ready is not None else (lambda parameters: None)
        d = self.avgpool.backward(self.fc.backward(dlogits))
        report(self.fc.parameters())
        for stage in reversed(self.stages):
            for block in reversed(list(stage)):
                d = block.backward(d)
                report(block.parameters())
        if self.maxpool is not None:
            d = self.maxpool.backward(d)
        self.conv1.backward(self.bn1.backward(d))
        report(self.conv1.parameters() + self.bn1.parameters())

    def __call__(self, x, train=None):
        return self.forward(x, train)

    def _as_input(self, x):
        check_activation("x", x, self.layout, 3)
        where = self.placement
        if isinstance(x, np.ndarray) == where.on_gpu:
            raise TypeError(f"x: the model is on {where}, so expected a {'device' if where.on_gpu else 'NumPy'} "
                            f"array, got {type(x).__module__}.{type(x).__qualname__}")
        want = where.storage_dtype(self.precision)
        if x.dtype == want:
            return x
        if x.dtype not in (np.float32, np.float16, where.master_dtype):
            raise TypeError(f"x: expected {want.name} (or float32/float16, converted), got {x.dtype}")
        buf = self._buffers.get("input", x.shape, want)
        kernels.cast(x, buf)
        return buf

    def model_copies(self):
        """The low-precision copies of the parameters, in parameters() order (None for fp32/tf32)."""
        params = self.parameters()
        if low_copy_dtype(self.precision) is None or params[0].arena is None:
            return None
        return [p.low for p in params]

    def zero_residual_scales(self) -> None:
        """Start every residual block as its shortcut (BasicBlock/Bottleneck.zero_residual_scale); before placing."""
        for stage in self.stages:
            for _, m in stage.named_modules():
                if isinstance(m, BasicBlock | Bottleneck):
                    m.zero_residual_scale()

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
            f"ResNet-{self.depth}({self.describe()}, engine={self.conv1.resolved_engine()}): "
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
        "fused_residual=True, seed=None, initialize=True. See resnet_native.nn.models.resnet.ResNet."
    )
    return build


ResNet18 = _constructor(18)
ResNet34 = _constructor(34)
ResNet50 = _constructor(50)
ResNet101 = _constructor(101)
ResNet152 = _constructor(152)
