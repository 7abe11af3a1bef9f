"""Trainable parameters and the flat device storage they live in.

A Parameter starts on the host (a NumPy fp32 array: models are built without a GPU) and moves to the
device with its model (`ParameterArena`). On the device it has three arrays:
  data  the fp32 master value (what the optimizer updates and state_dict reads);
  grad  the fp32 gradient, preallocated once; backward passes add into it, optimizer.zero_grad() zeroes
        it in place;
  low   for fp16/bf16 models, the low-precision copy the ops read; the optimizer's fused step rewrites it
        from the master in the same kernel launch (None for fp32/tf32).
"""

import numpy as np

from .layers._backend import ops, to_host, upload


class Parameter:
    def __init__(self, value, name: str = ""):
        self.name = name
        self.data = np.array(value, dtype=np.float32, order="C", copy=True)  # host until moved to the device
        self.grad = None
        self.low = None
        self.arena = None
        self.on_device = False
        self._cast_buffer = None  # fp32 scratch for gradients that arrive in fp16/bf16

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def numpy(self) -> np.ndarray:
        """The master value as a new fp32 NumPy array (in the layout the ops use)."""
        return np.asarray(to_host(self.data), dtype=np.float32)

    def assign(self, value) -> None:
        """Overwrite the value (same shape), on the device if it is there; refreshes the low copy."""
        value = np.asarray(value, dtype=np.float32)
        if value.shape != self.shape:
            raise ValueError(f"{self.name or 'parameter'}: expected shape {self.shape}, got {value.shape}")
        if not self.on_device:
            self.data = np.array(value, order="C", copy=True)
            return
        ops.xp.copyto(self.data, upload(value, self.data.dtype))
        if self.low is not None:
            ops.kernels.cast(self.data, self.low)

    def accumulate_grad(self, g) -> None:
        """grad += g, where g has the parameter's shape, in fp32 or (from low-precision ops) fp16/bf16."""
        if g.dtype != self.grad.dtype:
            if self._cast_buffer is None:
                self._cast_buffer = ops.xp.empty(self.shape, dtype=self.grad.dtype)
            ops.kernels.cast(g, self._cast_buffer)
            g = self._cast_buffer
        ops.xp.add(self.grad, g, out=self.grad)

    def __repr__(self):
        where = "device" if self.on_device else "host"
        low = f", low={np.dtype(self.low.dtype).name}" if self.low is not None else ""
        return f"Parameter({self.name or '?'}, shape={self.shape}, {where}{low})"


class ParameterArena:
    """Moves parameters to the device into three flat buffers (masters, grads, optional low copies) and makes
    each parameter's data/grad/low a view into them.

    Why flat: whole-model operations become one launch over one array (unscaling every gradient by a
    device-side loss scale, refreshing every low copy after a load) and the optimizer's tensor lists point
    into one allocation. Offsets are aligned to 256 bytes so every view suits vectorised kernels and cuDNN.
    """

    ALIGN_ELEMENTS = 64

    def __init__(self, params, low_dtype=None):
        params = list(params)
        if any(p.on_device for p in params):
            raise ValueError("ParameterArena: a parameter is already on the device")
        ops.require_device()
        offsets, total = [], 0
        for p in params:
            offsets.append(total)
            total += -(-p.size // self.ALIGN_ELEMENTS) * self.ALIGN_ELEMENTS
        total = max(total, self.ALIGN_ELEMENTS)
        host = np.zeros(total, dtype=ops.master_dtype)
        for p, off in zip(params, offsets, strict=True):
            host[off : off + p.size] = p.data.reshape(-1)
        xp = ops.xp
        self.params = params
        self.master = upload(host, ops.master_dtype)
        self.grad = xp.zeros(total, dtype=ops.master_dtype)
        self.low = xp.zeros(total, dtype=low_dtype) if low_dtype is not None else None
        for p, off in zip(params, offsets, strict=True):
            shape = p.shape
            p.data = self.master[off : off + p.size].reshape(shape)
            p.grad = self.grad[off : off + p.size].reshape(shape)
            p.low = self.low[off : off + p.size].reshape(shape) if self.low is not None else None
            p.arena = self
            p.on_device = True
        self.refresh_low()

    def refresh_low(self) -> None:
        """Rewrite every low-precision copy from the masters (one launch)."""
        if self.low is not None:
            ops.kernels.cast(self.master, self.low)

    def unscale_grads(self, inv_scale) -> None:
        """grad *= inv_scale for every parameter, with inv_scale a device array of shape (1,) (one launch)."""
        ops.xp.multiply(self.grad, inv_scale, out=self.grad)

    def __repr__(self):
        return f"ParameterArena({len(self.params)} parameters, {self.master.size} elements)"


__all__ = ["Parameter", "ParameterArena"]
