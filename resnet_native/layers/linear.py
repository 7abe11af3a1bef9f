"""Linear (fully connected) layer: y = x W^T + b with cuBLAS through cupy, always in fp32.

fp16/bf16 inputs (the pooled features, (N, C)) are converted to fp32 at this boundary with kernels.cast and
the input gradient is converted back: cupy has no bf16 matmul, and at this size fp32 costs nothing while
keeping the logits exact. The weight and bias are used as fp32 masters.
"""

import numpy as np

from ._backend import ops
from .checks import positive_int
from .module import Module


class Linear(Module):
    def __init__(self, in_features, out_features, *, rng=None):
        super().__init__()
        self.in_features = positive_int("in_features", in_features)
        self.out_features = positive_int("out_features", out_features)
        rng = rng if rng is not None else np.random.default_rng()
        bound = 1.0 / np.sqrt(in_features)  # torch.nn.Linear's default init
        self.weight = self.add_parameter("weight", rng.uniform(-bound, bound, (out_features, in_features)))
        self.bias = self.add_parameter("bias", rng.uniform(-bound, bound, out_features))
        self._saved = None

    def forward(self, x, train: bool):
        self._ensure_device()
        if getattr(x, "ndim", None) != 2 or x.shape[1] != self.in_features:
            raise ValueError(
                f"x: expected shape (N, {self.in_features}), got {tuple(getattr(x, 'shape', ()))}"
            )
        xp = ops.xp
        n = x.shape[0]
        x32 = x
        if x.dtype != ops.master_dtype:
            x32 = self._buffers.get("x32", x.shape, ops.master_dtype)
            ops.kernels.cast(x, x32)
        y = self._buffers.get("y", (n, self.out_features), ops.master_dtype)
        xp.matmul(x32, self.weight.data.T, out=y)
        xp.add(y, self.bias.data, out=y)
        self._saved = (x32, x.dtype) if train else None
        return y

    def backward(self, dy):
        """dy: (N, out_features) fp32 -> dx in the input's dtype; adds into weight.grad and bias.grad."""
        if self._saved is None:
            raise RuntimeError("Linear.backward: nothing saved; call forward(x, train=True) first")
        x32, x_dtype = self._saved
        self._saved = None
        n = x32.shape[0]
        if tuple(dy.shape) != (n, self.out_features) or dy.dtype != ops.master_dtype:
            raise ValueError(
                f"dy: expected {ops.master_dtype.name} of shape {(n, self.out_features)}, got "
                f"{dy.dtype} {tuple(dy.shape)}"
            )
        xp = ops.xp
        dw = self._buffers.get("dw", self.weight.shape, ops.master_dtype)
        xp.matmul(dy.T, x32, out=dw)
        self.weight.accumulate_grad(dw)
        db = self._buffers.get("db", self.bias.shape, ops.master_dtype)
        xp.sum(dy, axis=0, out=db)
        self.bias.accumulate_grad(db)
        dx32 = self._buffers.get("dx32", x32.shape, ops.master_dtype)
        xp.matmul(dy, self.weight.data, out=dx32)
        if x_dtype == ops.master_dtype:
            return dx32
        dx = self._buffers.get("dx", x32.shape, x_dtype)
        ops.kernels.cast(dx32, dx)
        return dx

    def _forget_own_saved(self):
        self._saved = None

    def describe(self):
        return f"{self.in_features}->{self.out_features}"
