"""The block and convolution shapes bench_block.py times: each block's convs in order, projection first."""

from __future__ import annotations

from dataclasses import dataclass


def out_hw(hw: int, kernel: int, stride: int) -> int:
    return (hw + 2 * (kernel // 2) - kernel) // stride + 1


@dataclass(frozen=True)
class ConvShape:
    name: str
    c_in: int
    c_out: int
    kernel: int
    stride: int
    hw_in: int
    epilogue: str  # 'bias' (projection), 'relu' (bias + ReLU), 'residual' (bias + shortcut + ReLU)

    @property
    def pad(self) -> int:
        return self.kernel // 2

    @property
    def hw_out(self) -> int:
        return out_hw(self.hw_in, self.kernel, self.stride)


@dataclass(frozen=True)
class BlockShape:
    name: str
    kind: str  # 'basic' | 'bottleneck'
    n: int
    c_in: int
    c_mid: int
    c_out: int
    hw: int
    stride: int

    @property
    def hw_out(self) -> int:
        return out_hw(self.hw, 3, self.stride)

    def convs(self) -> list:
        """The projection (if any) first, then the main path in order; the last conv takes the shortcut."""
        convs = []
        if self.stride != 1 or self.c_in != self.c_out:
            convs.append(ConvShape("proj", self.c_in, self.c_out, 1, self.stride, self.hw, "bias"))
        if self.kind == "basic":
            convs.append(ConvShape("conv1", self.c_in, self.c_mid, 3, self.stride, self.hw, "relu"))
            convs.append(ConvShape("conv2", self.c_mid, self.c_out, 3, 1, self.hw_out, "residual"))
        else:
            convs.append(ConvShape("conv1", self.c_in, self.c_mid, 1, 1, self.hw, "relu"))
            convs.append(ConvShape("conv2", self.c_mid, self.c_mid, 3, self.stride, self.hw, "relu"))
            convs.append(ConvShape("conv3", self.c_mid, self.c_out, 1, 1, self.hw_out, "residual"))
        return convs



def _by_name(*blocks: BlockShape) -> dict:
    return {b.name: b for b in blocks}


BLOCKS = _by_name(
    BlockShape("basic_cifar_s1", "basic", 256, 64, 64, 64, 32, 1),
    BlockShape("basic_cifar_s2", "basic", 256, 64, 128, 128, 32, 2),
    BlockShape("bottleneck_in_s1", "bottleneck", 64, 256, 64, 256, 56, 1),
    BlockShape("bottleneck_in_s2", "bottleneck", 64, 256, 128, 512, 56, 2),
)
QUICK_BLOCKS = _by_name(
    BlockShape("basic_quick_s1", "basic", 4, 16, 16, 16, 8, 1),
    BlockShape("basic_quick_s2", "basic", 4, 16, 32, 32, 8, 2),
    BlockShape("bottleneck_quick_s1", "bottleneck", 2, 32, 8, 32, 8, 1),
    BlockShape("bottleneck_quick_s2", "bottleneck", 2, 32, 16, 64, 8, 2),
)
