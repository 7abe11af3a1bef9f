"""Linear (fully connected) layer: y = x W^T + b, always in fp32, computed as a 1x1 convolution.

The (N, C) input is an NHWC image of shape (N, 1, 1, C) and the (K, C) weight a (K, 1, 1, C) filter (both are
views: no copy), so the three products go through the same cuDNN convolution engines and algorithm cache as the
rest of the model; the bias is the convolution's epilogue and its gradient conv2d_backward_bias. Why not
cuBLAS through cupy's matmul: cupy refuses cuBLAS calls during CUDA-graph capture, and the training step is
captured whole. fp16/bf16 inputs (the pooled features) are converted to fp32 at this boundary with kernels.cast
and the input gradient is converted back: at this size fp32 costs nothing while keeping the logits exact (strict
fp32 math, no TF32). The weight and bias are used as fp32 masters. (On the host "fp32" is the placement's master
dtype: float64 for model.to_host().)
"""

import numpy as np

from ..._core.names import ENGINES, choice, whole_number
from ...ops import conv, kernels
from .module import Module


class Linear(Module):
    def __init__(self, in_features, out_features, *, engine=None, deterministic=False, rng=None):
        super().__init__()
        # Both read at first use: the convolution engine (None: conv.default_engine() then) and whether only
        # deterministic cuDNN algorithms may run.
        self.engine = None if engine is None else choice("engine", engine, ENGINES)
        self.deterministic = bool(deterministic)
        self.in_features = whole_number("in_features", in_features, 1)
        self.out_features = whole_number("out_features", out_features, 1)
        rng = rng if rng is not None else np.random.default_rng()
        bound = 1.0 / np.sqrt(in_features)  # torch.nn.Linear's default init
        self.weight = self.add_parameter("weight", rng.uniform(-bound, bound, (out_features, in_features)))
        self.bias = self.add_parameter("bias", rng.uniform(-bound, bound, out_features))
        self._saved = None
        self._spec = None

    def spec(self):
        if self._spec is None:
            engine = conv.default_engine() if self.engine is None else self.engine
            self._spec = conv.ConvSpec(layout="NHWC", precision="fp32", algo="find", engine=engine,
                                       deterministic=self.deterministic)
        return self._spec

    def _weight_as_filter(self):
        return self.weight.data.reshape(self.out_features, 1, 1, self.in_features)

    def forward(self, x, train: bool):
        where = self.ensure_placed()
        if getattr(x, "ndim", None) != 2 or x.shape[1] != self.in_features:
            raise ValueError(
                f"x: expected shape (N, {self.in_features}), got {tuple(getattr(x, 'shape', ()))}"
            )
        master = where.master_dtype
        n = x.shape[0]
        x32 = x
        if x.dtype != master:
            x32 = self._buffers.get("x32", x.shape, master)
            kernels.cast(x, x32)
        y = self._buffers.get("y", (n, self.out_features), master)
        conv.conv2d(x32.reshape(n, 1, 1, self.in_features), self._weight_as_filter(), self.spec(), bias=self.bias.data,
                    out=y.reshape(n, 1, 1, self.out_features))
        self._saved = (x32, x.dtype) if train else None
        return y

    def backward(self, dy):
        """dy: (N, out_features) fp32 -> dx in the input's dtype; adds into weight.grad and bias.grad."""
        if self._saved is None:
            raise RuntimeError("Linear.backward: nothing saved; call forward(x, train=True) first")
        x32, x_dtype = self._saved
        self._saved = None
        n = x32.shape[0]
        master = self.placement.master_dtype
        if tuple(dy.shape) != (n, self.out_features) or dy.dtype != master:
            raise ValueError(
                f"dy: expected {master.name} of shape {(n, self.out_features)}, got {dy.dtype} {tuple(dy.shape)}"
            )
        x4 = x32.reshape(n, 1, 1, self.in_features)
        dy4 = dy.reshape(n, 1, 1, self.out_features)
        dw = self._buffers.get("dw", self.weight.shape, master)
        w_shape = (self.out_features, 1, 1, self.in_features)
        conv.conv2d_backward_filter(x4, dy4, self.spec(), w_shape, out=dw.reshape(w_shape))
        self.weight.accumulate_grad(dw)
        db = self._buffers.get("db", self.bias.shape, master)
        self.bias.accumulate_grad(conv.conv2d_backward_bias(dy4, "NHWC", out=db))
        dx32 = self._buffers.get("dx32", x32.shape, master)
        conv.conv2d_backward_data(dy4, self._weight_as_filter(), self.spec(), tuple(x4.shape),
                                  out=dx32.reshape(x4.shape))
        if x_dtype == master:
            return dx32
        dx = self._buffers.get("dx", x32.shape, x_dtype)
        kernels.cast(dx32, dx)
        return dx

    def _forget_own_saved(self):
        self._saved = None

    def describe(self):
        return f"{self.in_features}->{self.out_features}"
