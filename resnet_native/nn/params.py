"""Trainable parameters and the flat storage they live in once their model is placed.

A Parameter starts on the host (a NumPy fp32 array: models are built without a GPU) and moves with its model into a
`ParameterArena` on the model's Placement (the GPU, or NumPy for a model on the host). There it has three arrays:
  data  the master value (fp32 on the GPU; what the optimizer updates and state_dict reads);
  grad  the gradient, in the master dtype, preallocated once; backward passes add into it, optimizer.zero_grad()
        zeroes it in place;
  low   for fp16/bf16 models, the low-precision copy the ops read; the optimizer's fused step rewrites it from the
        master in the same kernel launch (None for fp32/tf32).

While a gradient sink is active (`gradients_into`, which a training step opens around its backward pass), every
accumulate_grad goes to the sink instead: the step's optimizer may then read a layer's low-precision gradient where
the layer wrote it, without the conversion into `grad` (resnet_native.optim.direct_grads).
"""

import contextlib
import contextvars

import numpy as np

from .._core.placement import gpu, host_copy
from ..ops import kernels


class Parameter:
    def __init__(self, value, name: str = ""):
        self.name = name
        self.data = np.array(value, dtype=np.float32, order="C", copy=True)  # host until placed
        self.grad = None
        self.low = None
        self.arena = None  # the ParameterArena it lives in once placed

    @property
    def placement(self):
        """Where it lives (None until its model is placed)."""
        return None if self.arena is None else self.arena.placement

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def numpy(self) -> np.ndarray:
        """The master value as a new fp32 NumPy array (in the layout the ops use)."""
        return np.asarray(host_copy(self.data), dtype=np.float32)

    def assign(self, value) -> None:
        """Overwrite the value (same shape) where it lives; refreshes the low copy."""
        value = np.asarray(value)
        if value.shape != self.shape:
            raise ValueError(f"{self.name or 'parameter'}: expected shape {self.shape}, got {value.shape}")
        if self.arena is None:
            self.data = np.array(value, dtype=np.float32, order="C", copy=True)
            return
        self.arena.xp.copyto(self.data, self.arena.placement.array(value, self.data.dtype))
        if self.low is not None:
            kernels.cast(self.data, self.low)

    def accumulate_grad(self, g) -> None:
        """grad += g, where g has the parameter's shape, in the master dtype or (from low-precision ops)
        fp16/bf16: one kernel (kernels.cast with accumulate), the sum in fp32. Within gradients_into(sink), the
        sink's accumulate(param, g) takes it instead."""
        sink = _SINK.get()
        if sink is not None:
            sink.accumulate(self, g)
            return
        self.add_to_grad(g)

    def add_to_grad(self, g, *, overwrite: bool = False) -> None:
        """grad += g (grad = g with overwrite), as accumulate_grad does without a sink."""
        if overwrite:
            kernels.cast(g, self.grad)
        elif isinstance(self.grad, np.ndarray) and g.dtype == self.grad.dtype:
            np.add(self.grad, g, out=self.grad)
        else:
            kernels.cast(g, self.grad, accumulate=True)

    def __repr__(self):
        where = "unplaced" if self.arena is None else str(self.arena.placement)
        low = f", low={np.dtype(self.low.dtype).name}" if self.low is not None else ""
        return f"Parameter({self.name or '?'}, shape={self.shape}, {where}{low})"


class ParameterArena:
    """Moves parameters to a placement (default: the current GPU) into three flat buffers (masters, grads, optional
    low copies) and makes each parameter's data/grad/low a view into them.

    Why flat: whole-model operations become one launch over one array (unscaling every gradient by a device-side
    loss scale, refreshing every low copy after a load) and the optimizer's tensor lists point into one allocation.
    Offsets are aligned to 256 bytes so every view suits vectorised kernels and cuDNN.
    """

    ALIGN_ELEMENTS = 64

    def __init__(self, params, placement=None, low_dtype=None):
        params = list(params)
        if any(p.arena is not None for p in params):
            raise ValueError("ParameterArena: a parameter is already on the device (placed in an arena)")
        self.placement = gpu() if placement is None else placement
        self.xp = xp = self.placement.xp
        master_dtype = self.placement.master_dtype
        offsets, total = [], 0
        for p in params:
            offsets.append(total)
            total += -(-p.size // self.ALIGN_ELEMENTS) * self.ALIGN_ELEMENTS
        total = max(total, self.ALIGN_ELEMENTS)
        host = np.zeros(total, dtype=master_dtype)
        for p, off in zip(params, offsets, strict=True):
            host[off : off + p.size] = p.data.reshape(-1)
        self.params = params
        self.master = self.placement.array(host, master_dtype)
        self.grad = xp.zeros(total, dtype=master_dtype)
        self.low = xp.zeros(total, dtype=low_dtype) if low_dtype is not None else None
        for p, off in zip(params, offsets, strict=True):
            shape = p.shape
            p.data = self.master[off : off + p.size].reshape(shape)
            p.grad = self.grad[off : off + p.size].reshape(shape)
            p.low = self.low[off : off + p.size].reshape(shape) if self.low is not None else None
            p.arena = self
        self.refresh_low()

    def refresh_low(self) -> None:
        """Rewrite every low-precision copy from the masters (one launch)."""
        if self.low is not None:
            kernels.cast(self.master, self.low)

    def unscale_grads(self, inv_scale) -> None:
        """grad *= inv_scale for every parameter, with inv_scale an array of shape (1,) where the arena lives (one
        launch)."""
        self.xp.multiply(self.grad, inv_scale, out=self.grad)

    def __repr__(self):
        return f"ParameterArena({len(self.params)} parameters, {self.master.size} elements, on {self.placement})"


_SINK = contextvars.ContextVar("gradient_sink", default=None)


@contextlib.contextmanager
def gradients_into(sink):
    """Within the block, Parameter.accumulate_grad(g) calls sink.accumulate(param, g) instead of adding g to
    param.grad (a backward pass's gradients collected by a training step)."""
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


__all__ = ["Parameter", "ParameterArena", "gradients_into"]
