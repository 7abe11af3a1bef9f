"""BatchNorm2d on cuDNN batch norm (resnet_native.ops.norm), optionally fused with a residual add and ReLU.

    y = [relu](bn(x) [+ z])

The blocks use the fused form for "bn2 + shortcut + relu"; resnet_native.ops.norm runs cuDNN's fused Ex kernels
where cuDNN supports them (NHWC fp16/bf16) and the plain call plus the custom kernels elsewhere, behind this
one layer. gamma, beta and the running statistics stay in the master dtype (fp32 on the GPU) whatever the
activation dtype. PyTorch
semantics: running stats updated with `momentum` (running = (1 - m) * running + m * batch, unbiased
variance), num_batches_tracked counted. synchronize_batch_norms(model, allreduce) makes training use the
statistics of every rank's batch (norm.sync_bn_*), as torch.nn.SyncBatchNorm does.
"""

import numbers

import numpy as np

from ..._core.names import LAYOUTS, choice, whole_number
from ..._core.placement import native_dtype
from ...ops import norm
from .checks import check_activation, check_same_shape
from .module import Module


class BatchNorm2d(Module):
    def __init__(self, num_features, *, layout="NHWC", eps=1e-5, momentum=0.1, relu=False, residual=False):
        super().__init__()
        self.num_features = whole_number("num_features", num_features, 1)
        self.layout = choice("layout", layout, LAYOUTS)
        if not eps > 0:
            raise ValueError(f"eps: expected > 0, got {eps!r}")
        # PyTorch's momentum=None (a cumulative average) is not implemented: say so rather than fail on `None <= 1`.
        if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) or not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum: expected a float in [0, 1] (momentum=None, a cumulative moving average, "
                             f"is not supported), got {momentum!r}")
        self.eps = float(eps)
        self.momentum = float(momentum)
        self.relu = bool(relu)
        self.residual = bool(residual)
        self.weight = self.add_parameter("weight", np.ones(num_features, np.float32))
        self.bias = self.add_parameter("bias", np.zeros(num_features, np.float32))
        self.running_mean = np.zeros(num_features, np.float32)  # arrays of the placement once placed
        self.running_var = np.ones(num_features, np.float32)
        self.num_batches_tracked = 0
        # Synchronized batch norm (synchronize_batch_norms): a GradientAllReduce whose sum_ adds the per-channel
        # sums of every rank; training then normalises with the statistics of all ranks' batches.
        self.sync = None
        self._sync_count = 0
        self._saved = None

    # -- state -----------------------------------------------------------------------------------------------
    def _place_own_state(self, where):
        self.running_mean = where.array(self.running_mean, where.master_dtype)
        self.running_var = where.array(self.running_var, where.master_dtype)

    def _state_items(self):
        c = (self.num_features,)
        return super()._state_items() + [
            ("running_mean", c, np.float32),
            ("running_var", c, np.float32),
            ("num_batches_tracked", (), np.int64),
        ]

    def _state_source(self, name):
        if name == "num_batches_tracked":
            return np.array(self.num_batches_tracked, dtype=np.int64), np.asarray
        if name in ("running_mean", "running_var"):
            return getattr(self, name), lambda a: np.asarray(a, dtype=np.float32)
        return super()._state_source(name)

    def _write_state(self, name, value):
        if name == "num_batches_tracked":
            self.num_batches_tracked = int(value)
        elif name in ("running_mean", "running_var"):
            if self.placement is not None:
                where = self.placement
                where.xp.copyto(getattr(self, name), where.array(value, where.master_dtype))
            else:
                setattr(self, name, np.array(value, dtype=np.float32))
        else:
            super()._write_state(name, value)

    # -- ops -------------------------------------------------------------------------------------------------
    def forward(self, x, train: bool, z=None):
        """y = [relu](bn(x) [+ z]); z (same shape as x) is required exactly when the layer was built
        residual."""
        self.ensure_placed()
        check_activation("x", x, self.layout, self.num_features)
        if self.residual != (z is not None):
            raise ValueError(
                f"z: this BatchNorm2d was built with residual={self.residual}, got z={type(z).__name__}"
            )
        if z is not None:
            check_same_shape("z", z, "x", x)
        y = self._buffers.get("y", x.shape, x.dtype)
        dt = native_dtype(x)
        # The arguments both forwards take: x, the parameters and running statistics, and the settings.
        operands = (x, self.weight.data, self.bias.data, self.running_mean, self.running_var)
        settings = dict(layout=self.layout, eps=self.eps, z=z, relu=self.relu, out=y, dtype=dt)
        if not train:
            norm.batch_norm_infer(*operands, **settings)
            self._saved = None
            return y
        c = (self.num_features,)
        master = self.placement.master_dtype
        save_mean = self._buffers.get("save_mean", c, master)
        save_invstd = self._buffers.get("save_invstd", c, master)
        if self.sync is not None:
            return self._sync_forward(operands, settings, save_mean, save_invstd)
        reserve = self._buffers.find("reserve", x.shape)
        y, save_mean, save_invstd, reserve = norm.batch_norm_train(
            *operands, momentum=self.momentum, save_mean=save_mean, save_invstd=save_invstd, reserve=reserve,
            **settings
        )
        self._buffers.store(
            "reserve", x.shape, reserve
        )  # cuDNN's reserve space: kept for backward and reused
        self.num_batches_tracked += 1
        self._saved = (x, y, save_mean, save_invstd, reserve, z is not None)
        return y

    def _sync_forward(self, operands, settings, save_mean, save_invstd):
        """The training forward of synchronized batch norm: this rank's sums, added over the ranks, then y."""
        x, gamma, beta, running_mean, running_var = operands
        sums = self._buffers.get("sync_sums", (2, self.num_features), self.placement.master_dtype)
        norm.sync_bn_sums(x, running_mean, layout=self.layout, sums=sums, dtype=settings["dtype"])
        self.sync.sum_(sums)
        count = self.sync.world.world_size * (int(np.prod(x.shape)) // self.num_features)
        y, save_mean, save_invstd = norm.sync_bn_forward(
            x, sums, gamma, beta, running_mean, running_var, count=count, momentum=self.momentum,
            save_mean=save_mean, save_invstd=save_invstd, **settings)
        self.num_batches_tracked += 1
        self._saved = (x, y, save_mean, save_invstd, None, settings["z"] is not None)
        self._sync_count = count  # elements per channel over all ranks, for backward
        return y

    def backward(self, dy):
        """dx, or (dx, dz) for a residual layer (dz: the gradient of z, i.e. dy through the ReLU mask)."""
        if self._saved is None:
            raise RuntimeError("BatchNorm2d.backward: nothing saved; call forward(x, train=True) first")
        x, y, save_mean, save_invstd, reserve, has_z = self._saved
        self._saved = None
        check_same_shape("dy", dy, "x", x)
        dx = self._buffers.get("dx", x.shape, x.dtype)
        dz = self._buffers.get("dz", x.shape, x.dtype) if has_z else None
        if self.sync is not None:
            return self._sync_backward(x, dy, y, save_mean, save_invstd, self._sync_count, dx, dz)
        # dgamma and dbeta are added straight into the master-dtype gradients (accumulate=True).
        dx, _, _, dz = norm.batch_norm_backward(
            x,
            dy,
            self.weight.data,
            self.bias.data,
            save_mean,
            save_invstd,
            layout=self.layout,
            eps=self.eps,
            y=y if self.relu else None,
            relu=self.relu,
            has_z=has_z,
            reserve=reserve,
            dx=dx,
            dgamma=self.weight.grad,
            dbeta=self.bias.grad,
            dz=dz,
            dtype=native_dtype(x),
            accumulate=True,
        )
        return (dx, dz) if self.residual else dx

    def _sync_backward(self, x, dy, y, save_mean, save_invstd, count, dx, dz):
        dt = native_dtype(x)
        y = y if self.relu else None
        sums = self._buffers.get("sync_grad_sums", (2, self.num_features), self.placement.master_dtype)
        # dgamma and dbeta from this rank's sums (the gradient all-reduce averages them with the others').
        _, _, _, dz = norm.sync_bn_grad_sums(x, dy, save_mean, save_invstd, layout=self.layout, y=y, relu=self.relu,
                                             has_z=dz is not None, sums=sums, dgamma=self.weight.grad,
                                             dbeta=self.bias.grad, dz=dz, dtype=dt, accumulate=True)
        self.sync.sum_(sums)
        dx = norm.sync_bn_backward(x, dy, self.weight.data, save_mean, save_invstd, sums, count=count,
                                   layout=self.layout, y=y, relu=self.relu, dx=dx, dtype=dt)
        return (dx, dz) if self.residual else dx

    def _forget_own_saved(self):
        self._saved = None

    def describe(self):
        fused = (" + residual" if self.residual else "") + (" + relu" if self.relu else "")
        return f"{self.num_features}{fused}, eps {self.eps:g}, momentum {self.momentum:g}"


def synchronize_batch_norms(model, allreduce) -> int:
    """Make every BatchNorm2d of model train with the statistics of all ranks (synchronized batch norm): its
    per-channel sums are added across the ranks by allreduce.sum_ (a GradientAllReduce; NCCL on the GPU). None
    turns it off again. Returns the number of layers changed. Inference is untouched (running statistics)."""
    if allreduce is not None and not callable(getattr(allreduce, "sum_", None)):
        raise TypeError(f"allreduce: expected a GradientAllReduce (with sum_), got {type(allreduce).__name__}")
    layers = [m for _, m in model.named_modules() if isinstance(m, BatchNorm2d)]
    for m in layers:
        m.sync = allreduce
    return len(layers)
