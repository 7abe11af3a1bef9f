"""Linear (fully connected) layer: y = x W^T + b, always in fp32, on our own kernels (ops/linear.py).

fp16/bf16 inputs (the pooled features) are read as they are and their gradient is written back in their dtype: the
products sum in fp32 (strict fp32 math, no TF32), which keeps the logits exact at no cost at this size. The weight
and bias are used as fp32 masters. The bias's gradient is conv2d_backward_bias's per-channel sum. (On the host
"fp32" is the placement's master dtype: float64 for model.to_host().)
"""

import numpy as np

from ..._core.names import whole_number
from ...ops import conv
from ...ops.linear import linear_backward_data, linear_backward_weight, linear_forward
from .module import Module


class Linear(Module):
    def __init__(self, in_features, out_features, *, rng=None):
        super().__init__()
        self.in_features = whole_number("in_features", in_features, 1)
        self.out_features = whole_number("out_features", out_features, 1)
        rng = rng if rng is not None else np.random.default_rng()
        bound = 1.0 / np.sqrt(in_features)  # torch.nn.Linear's default init
        self.weight = self.add_parameter("weight", rng.uniform(-bound, bound, (out_features, in_features)))
        self.bias = self.add_parameter("bias", rng.uniform(-bound, bound, out_features))
        self._saved = None

    def forward(self, x, train: bool):
        where = self.ensure_placed()
        if getattr(x, "ndim", None) != 2 or x.shape[1] != self.in_features:
            raise ValueError(
                f"x: expected shape (N, {self.in_features}), got {tuple(getattr(x, 'shape', ()))}"
            )
        y = self._buffers.get("y", (x.shape[0], self.out_features), where.master_dtype)
        linear_forward(x, self.weight.data, self.bias.data, out=y)
        self._saved = x if train else None
        return y

    def backward(self, dy):
        """dy: (N, out_features) fp32 -> dx in the input's dtype; adds into weight.grad and bias.grad."""
        x = self._saved
        if x is None:
            raise RuntimeError("Linear.backward: nothing saved; call forward(x, train=True) first")
        self._saved = None
        n = x.shape[0]
        master = self.placement.master_dtype
        if tuple(dy.shape) != (n, self.out_features) or dy.dtype != master:
            raise ValueError(
                f"dy: expected {master.name} of shape {(n, self.out_features)}, got {dy.dtype} {tuple(dy.shape)}"
            )
        dw = self._buffers.get("dw", self.weight.shape, master)
        self.weight.accumulate_grad(linear_backward_weight(x, dy, out=dw))
        db = self._buffers.get("db", self.bias.shape, master)
        self.bias.accumulate_grad(conv.conv2d_backward_bias(dy.reshape(n, 1, 1, self.out_features), "NHWC", out=db))
        return linear_backward_data(dy, self.weight.data, self._buffers.get("dx", x.shape, x.dtype))

    def _forget_own_saved(self):
        self._saved = None

    def describe(self):
        return f"{self.in_features}->{self.out_features}"
