"""The inference plan of a ResNet: its forward pass as a flat list of steps over numbered values, built on the host
from the state_dict alone (torchvision names and shapes) plus the stem, so no layer object is consulted and the
engine, the simulation and the ONNX export walk the same list.

Every convolution becomes one ConvStep carrying its BatchNorm folded in (fold.py) and naming the epilogue it fuses:
'bias+relu' (conv-BN-ReLU), 'bias' (a downsample, and the classifier, a 1x1 convolution in fp32 as nn/layers/linear.py
computes it), 'bias+residual+relu' (a block's last conv; z is the shortcut). The architecture is torchvision's
ResNet v1.5 as nn.models builds it (_Builder). Values are per-sample shapes (C, H, W); value 0 is the input and the
last value the fp32 logits (num_classes, 1, 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._core.names import DTYPE_ALIASES, EPILOGUE_PARTS, PRECISIONS, VALUE_DTYPES, choice, whole_numbers
from .fold import BN_FIELDS

STEMS = ("cifar", "imagenet")
# Stem conv (kernel, stride, padding) and, for 'imagenet', the max pool (kernel, stride, padding).
STEM_CONV = {"cifar": (3, 1, 1), "imagenet": (7, 2, 3)}
STEM_POOL = {"imagenet": (3, 2, 1)}
# The classifier's precision whatever the network's: nn/layers/linear.py computes the logits in strict fp32.
CLASSIFIER_PRECISION = "fp32"


@dataclass(frozen=True)
class Value:
    """A per-sample array: shape (C, H, W) and dtype ('fp32', 'fp16' or 'bf16'; 'int8' / 'fp8' in a quantised plan)."""

    shape: tuple
    dtype: str

    @property
    def bytes_per_sample(self) -> int:
        c, h, w = self.shape
        return c * h * w * VALUE_DTYPES[self.dtype].itemsize


@dataclass(frozen=True)
class ConvStep:
    """out = [relu](conv(x, folded weight) + bias [+ z]); weight (K, C, R, S) from state[weight]."""

    name: str
    x: int
    out: int
    weight: str  # state_dict key of the (K, C, R, S) conv weight
    bn: str | None  # prefix of the BatchNorm folded into it, or None (the classifier: its own bias)
    bias: str | None  # state_dict key of a bias of the layer itself (the classifier), else None
    kernel: int
    stride: int
    padding: int
    relu: bool
    precision: str
    z: int | None = None  # the residual added before the ReLU
    kind: str = field(default="conv", init=False)

    @property
    def inputs(self) -> tuple:
        return (self.x,) if self.z is None else (self.x, self.z)

    @property
    def fused(self) -> str:
        """The epilogue the convolution fuses, as resnet_native.ops.conv names it ('bias+residual+relu', ...)."""
        on = {"bias": True, "residual": self.z is not None, "relu": self.relu}
        return "+".join(p for p in EPILOGUE_PARTS if on[p])


@dataclass(frozen=True)
class PoolStep:
    """'maxpool' (kernel, stride, padding) or 'avgpool' (global average: (C, H, W) -> (C, 1, 1))."""

    name: str
    kind: str
    x: int
    out: int
    kernel: int = 0
    stride: int = 0
    padding: int = 0

    @property
    def inputs(self) -> tuple:
        return (self.x,)


@dataclass(frozen=True)
class _OneValueStep:
    """A step that reads one value x and writes out."""

    name: str
    x: int
    out: int

    @property
    def inputs(self) -> tuple:
        return (self.x,)


@dataclass(frozen=True)
class CastStep(_OneValueStep):
    """out = x converted to out's dtype (the pooled features to the classifier's fp32)."""

    kind: str = field(default="cast", init=False)


@dataclass(frozen=True)
class QuantizeStep(_OneValueStep):
    """out = x quantised to out's 8-bit dtype at the calibrated scale of x: where a quantised engine's float
    prefix ends (inference/quantized.py); x is fp16, out the same value in int8 / FP8 for the quantised suffix."""

    kind: str = field(default="quantize", init=False)


@dataclass
class Plan:
    values: list
    steps: list
    stem: str
    precision: str
    num_classes: int
    input: int = 0

    @property
    def output(self) -> int:
        return len(self.values) - 1

    def conv_steps(self) -> list:
        return [s for s in self.steps if s.kind == "conv"]

    def describe(self) -> list:
        """[(step name, kind, what it fuses)]: fused parts for convolutions, '' for the other steps."""
        return [(s.name, s.kind, s.fused if s.kind == "conv" else "") for s in self.steps]

    def conv_flops(self, batch: int) -> int:
        """2*N*K*C*R*S*P*Q summed over the convolutions (the classifier included), for a batch of `batch`."""
        total = 0
        for s in self.conv_steps():
            c = self.values[s.x].shape[0]
            k, p, q = self.values[s.out].shape
            total += 2 * batch * k * c * s.kernel * s.kernel * p * q
        return total


class _Builder:
    """Builds a Plan. The architecture is torchvision's ResNet v1.5: stage i (1-based) block 0 has stride 2 for
    i > 1, on conv1 of a BasicBlock and on conv2 of a Bottleneck; a block has a downsample (1x1 conv with the
    block's stride, then BN) exactly when the state_dict has one. Stems: 'cifar' a 3x3/1 pad-1 conv, 'imagenet' a
    7x7/2 pad-3 conv then a 3x3/2 pad-1 max pool."""

    def __init__(self, state: dict, precision: str):
        self.state = state
        self.precision = precision
        self.dtype = DTYPE_ALIASES[precision]
        self.values = []
        self.steps = []

    def value(self, shape, dtype=None) -> int:
        self.values.append(Value(tuple(int(v) for v in shape), dtype or self.dtype))
        return len(self.values) - 1

    def require(self, key: str):
        if key not in self.state:
            raise ValueError(f"state: missing {key!r} (expected a torchvision-named ResNet state_dict)")
        return self.state[key]

    def conv(self, name, x, weight_key, bn, *, stride, padding, relu, z=None) -> int:
        w_shape = tuple(getattr(self.require(weight_key), "shape", ()))
        c, h, w = self.values[x].shape
        if len(w_shape) != 4 or w_shape[1] != c or w_shape[2] != w_shape[3]:
            raise ValueError(f"state[{weight_key!r}]: expected a square (K, {c}, R, R) filter for a {c}-channel "
                             f"input, got shape {w_shape}")
        k, _, r, _ = w_shape
        for key in (f"{bn}.{f}" for f in BN_FIELDS):
            shape = tuple(getattr(self.require(key), "shape", ()))
            if shape != (k,):
                raise ValueError(f"state[{key!r}]: expected shape ({k},) for the {k} filters of {name}, got {shape}")
        p = (h + 2 * padding - r) // stride + 1
        q = (w + 2 * padding - r) // stride + 1
        if p < 1 or q < 1:
            raise ValueError(f"{name}: a {h}x{w} input is too small for a {r}x{r}/{stride} convolution")
        out = self.value((k, p, q))
        self.steps.append(ConvStep(name, x, out, weight_key, bn, None, r, stride, padding, relu, self.precision, z))
        return out

    def block(self, prefix: str, x: int, stride: int) -> int:
        """One BasicBlock or Bottleneck; returns its output value."""
        bottleneck = f"{prefix}.conv3.weight" in self.state
        convs = ("conv1", "conv2", "conv3") if bottleneck else ("conv1", "conv2")
        strides = (1, stride, 1) if bottleneck else (stride, 1)
        shortcut = x
        if f"{prefix}.downsample.0.weight" in self.state:
            # Before the main path: it is the last conv's residual input, and x is free once both have read it.
            shortcut = self.conv(f"{prefix}.downsample.0", x, f"{prefix}.downsample.0.weight",
                                 f"{prefix}.downsample.1", stride=stride, padding=0, relu=False)
        out = x
        for i, (conv, s) in enumerate(zip(convs, strides, strict=True)):
            key = f"{prefix}.{conv}.weight"
            kernel = getattr(self.require(key), "shape", (0, 0, 0))[2]
            last = i == len(convs) - 1
            out = self.conv(f"{prefix}.{conv}", out, key, f"{prefix}.bn{i + 1}", stride=s, padding=kernel // 2,
                            relu=True, z=shortcut if last else None)
        if self.values[out].shape != self.values[shortcut].shape:
            raise ValueError(f"{prefix}: the residual {self.values[shortcut].shape} does not match the block's "
                             f"output {self.values[out].shape} (a downsample is missing from the state_dict)")
        return out


def build_plan(state: dict, stem: str = "cifar", precision: str = "fp16", image_size=32) -> Plan:
    """The plan of the ResNet whose torchvision-named state_dict is `state`, for (3, H, W) inputs in `precision`."""
    if not isinstance(state, dict):
        raise TypeError(f"state: expected a state_dict (dict), got {type(state).__name__}")
    choice("stem", stem, STEMS)
    choice("precision", precision, PRECISIONS)
    height, width = whole_numbers("image_size", image_size, 1, count=2)
    b = _Builder(state, precision)
    x = b.value((3, height, width))
    kernel, stride, padding = STEM_CONV[stem]
    stem_shape = tuple(getattr(b.require("conv1.weight"), "shape", ()))
    if len(stem_shape) != 4 or stem_shape[1:] != (3, kernel, kernel):
        raise ValueError(f"state['conv1.weight']: the {stem!r} stem is a {kernel}x{kernel} convolution of 3 "
                         f"channels, got shape {stem_shape}")
    out = b.conv("conv1", x, "conv1.weight", "bn1", stride=stride, padding=padding, relu=True)
    if stem in STEM_POOL:
        k, s, p = STEM_POOL[stem]
        c, h, w = b.values[out].shape
        pooled = b.value((c, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1))
        b.steps.append(PoolStep("maxpool", "maxpool", out, pooled, k, s, p))
        out = pooled
    stage = 1
    while f"layer{stage}.0.conv1.weight" in state:
        block = 0
        while f"layer{stage}.{block}.conv1.weight" in state:
            out = b.block(f"layer{stage}.{block}", out, 2 if stage > 1 and block == 0 else 1)
            block += 1
        stage += 1
    if stage == 1:
        raise ValueError("state: no residual stages (expected 'layer1.0.conv1.weight', ...)")
    c = b.values[out].shape[0]
    pooled = b.value((c, 1, 1))
    b.steps.append(PoolStep("avgpool", "avgpool", out, pooled))
    fc_shape = tuple(getattr(b.require("fc.weight"), "shape", ()))
    if len(fc_shape) != 2 or fc_shape[1] != c:
        raise ValueError(f"state['fc.weight']: expected (num_classes, {c}), got shape {fc_shape}")
    num_classes = fc_shape[0]
    if tuple(getattr(b.require("fc.bias"), "shape", ())) != (num_classes,):
        raise ValueError(f"state['fc.bias']: expected shape ({num_classes},)")
    features = pooled
    if b.dtype != DTYPE_ALIASES[CLASSIFIER_PRECISION]:
        features = b.value((c, 1, 1), DTYPE_ALIASES[CLASSIFIER_PRECISION])
        b.steps.append(CastStep("fc.cast", pooled, features))
    # The classifier's (classes, C) weight is a (classes, C, 1, 1) filter (the engine reshapes it).
    logits = b.value((num_classes, 1, 1), DTYPE_ALIASES[CLASSIFIER_PRECISION])
    b.steps.append(ConvStep("fc", features, logits, "fc.weight", None, "fc.bias", 1, 1, 0, False,
                            CLASSIFIER_PRECISION))
    return Plan(b.values, b.steps, stem, precision, num_classes)
