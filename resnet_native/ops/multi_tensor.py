"""Multi-tensor optimizer kernels: one kernel launch per call, over every tensor of a model.

A TensorList is built once from a list of device arrays (say, every parameter of a model) and holds a small device
table of their pointers, sizes and dtypes; the functions below take TensorLists and launch one kernel that covers
all their tensors, cut into chunks spread over the GPU. Nothing is allocated per call, and scalars that change per
step (lr, inv_scale, AdamW's step, a schedule's momentum or beta1) may be float32 device arrays of shape (1,) read
on the device, so a captured CUDA graph can replay the calls while a schedule moves them. Parameters and state are
fp32; gradients fp32, fp16 or bf16 (mixed in one list); model copies may have None entries. A nonzero found_inf
(a cupy int32 (1,) array) skips the whole update on the device. The native core checks every argument (numbers
against their ranges; a device scalar cannot be: a captured graph reads its value at each replay).
"""


import math
import numbers

import numpy as np

from .. import reference
from .._core.loader import _C
from .._core.names import finite_number, flag, whole_number
from .kernels import stream

CHUNK_ELEMENTS = int(_C.MULTI_TENSOR_CHUNK)  # a launch's unit of work: one block's share of a tensor at a time


class TensorList:
    """A fixed list of device arrays and its device table (pointers, sizes, dtypes), built once.

    dtype: None infers each array's dtype ('fp32' / 'fp16'; uint16 arrays need 'bf16'), a string applies to
    every array, a sequence gives one per array. Entries may be None only in a list used as model_copies.
    The list keeps references to the arrays, so their memory stays valid while it lives. chunk_elements: how
    the list is cut into blocks of work when it is a launch's first list (default CHUNK_ELEMENTS; a benchmark's
    knob, it changes no result).
    """

    def __init__(self, arrays, dtype=None, *, chunk_elements=None):
        try:
            self._arrays = list(arrays)
        except TypeError:
            raise TypeError(f"arrays: expected a sequence of device arrays, got {type(arrays).__name__}") from None
        chunk = CHUNK_ELEMENTS if chunk_elements is None else whole_number("chunk_elements", chunk_elements, 1)
        self._table = _C.TensorTable(self._arrays, dtype, chunk)
        self.dtypes = tuple(self._table.dtypes)
        self.sizes = tuple(self._table.numels)

    def __len__(self):
        return len(self._arrays)

    def __getitem__(self, index):
        return self._arrays[index]

    def __iter__(self):
        return iter(self._arrays)

    @property
    def num_chunks(self) -> int:
        """How many chunks (blocks of work) one launch over this list has."""
        return self._table.num_chunks

    def __repr__(self):
        total = sum(s for s in self.sizes if s)
        return f"TensorList({len(self)} tensors, {total} elements, dtypes {sorted(set(filter(None, self.dtypes)))})"


def _table(value):
    """A TensorList's device table; anything else goes to the native op as is, which names what it expected."""
    return value._table if isinstance(value, TensorList) else value


def _non_negative(value, name) -> float:
    """The optimizers' own check of a hyperparameter they keep (the ops check what they are called with): a
    finite number >= 0 (not a bool or a string)."""
    return finite_number(name, value, 0.0)


def _bound_text(low, high) -> str:
    if high is not None:
        return f" in [{low:g}, {high:g})"
    return "" if low is None else f" >= {low:g}"


def _number(name: str, value, low=None, high=None) -> float:
    """A hyperparameter the ops take as a number only: checked here, the same for the native and the host path,
    with the native core's messages (a finite value, in [low, high) where given)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name}: expected a finite value{_bound_text(low, high)}, got {number!r}")
    if (low is not None and not number >= low) or (high is not None and not number < high):
        raise ValueError(f"{name}: expected a value{_bound_text(low, high)}, got {number!r}")
    return number


def _scalar(name: str, value, low=None, high=None):
    """A scalar the ops take as a number or as a float32 (1,) array (on the device; a NumPy array on the host path).
    A number is checked here, the same for both paths: finite and in [low, high) where given. An array goes on as
    is: each path checks its dtype and shape, and its value is read when the update runs."""
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name}: expected a number or a float32 device array of shape (1,), got a bool")
    if value is None or isinstance(value, str | bytes):
        raise TypeError(f"{name}: expected a number or a float32 device array of shape (1,), got "
                        f"{type(value).__name__}")
    if not isinstance(value, numbers.Real):
        return value  # an array
    return _number(name, value, low, high)


def _step(value):
    """AdamW's step: a number >= 1 (checked here for both paths) or a (1,) array."""
    value = _scalar("step", value)
    if isinstance(value, numbers.Real) and not float(value) >= 1.0:
        raise ValueError(f"step: expected the 1-based step number, got {value!r}")
    return value


def sgd_step(params, grads, momentum_bufs, *, lr, momentum=0.9, weight_decay=0.0, nesterov=False, dampening=0.0,
             inv_scale=1.0, found_inf=None, model_copies=None, first_step=False):
    """One PyTorch-SGD update of every parameter, in one launch.

    g = grad * inv_scale + weight_decay * p; buf = momentum * buf + (1 - dampening) * g; g = g + momentum * buf
    (nesterov) or buf; p -= lr * g; model_copies[i] = p (rounded) where present. With zero-initialised buffers
    the first step equals PyTorch's (buf = g) when dampening is 0; with dampening, pass first_step=True on the
    first step. momentum_bufs may be None when momentum is 0.
    """
    # Numbers and flags are checked here, once, for the native and the host path alike.
    momentum = _scalar("momentum", momentum, 0.0)
    dampening, weight_decay = _number("dampening", dampening, 0.0), _number("weight_decay", weight_decay, 0.0)
    lr, inv_scale = _scalar("lr", lr, 0.0), _scalar("inv_scale", inv_scale, 0.0)
    nesterov, first_step = flag("nesterov", nesterov), flag("first_step", first_step)
    if isinstance(params, reference.multi_tensor.TensorList):  # host arrays: the float64 reference
        return reference.multi_tensor.sgd_step(params, grads, momentum_bufs, lr=lr, momentum=momentum,
                                               weight_decay=weight_decay, nesterov=nesterov, dampening=dampening,
                                               inv_scale=inv_scale, found_inf=found_inf, model_copies=model_copies,
                                               first_step=first_step)
    _C.multi_tensor_sgd(_table(params), _table(grads), _table(momentum_bufs), _table(model_copies), lr, inv_scale,
                        found_inf, momentum, dampening, weight_decay, nesterov, first_step, stream())


def adamw_step(params, grads, exp_avgs, exp_avg_sqs, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step,
               inv_scale=1.0, found_inf=None, model_copies=None):
    """One PyTorch-AdamW update of every parameter, in one launch.

    g = grad * inv_scale; p *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
    p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps). step counts from 1 (a number, or a
    float32 (1,) device array so that skipped steps need not be counted on the host).
    """
    # Numbers are checked here, once, for the native and the host path alike.
    beta1, beta2 = _scalar("beta1", beta1, 0.0, 1.0), _number("beta2", beta2, 0.0, 1.0)
    eps, weight_decay = _number("eps", eps, 0.0), _number("weight_decay", weight_decay, 0.0)
    step = _step(step)
    lr, inv_scale = _scalar("lr", lr, 0.0), _scalar("inv_scale", inv_scale, 0.0)
    if isinstance(params, reference.multi_tensor.TensorList):  # host arrays: the float64 reference
        return reference.multi_tensor.adamw_step(params, grads, exp_avgs, exp_avg_sqs, lr=lr, beta1=beta1, beta2=beta2,
                                                 eps=eps, weight_decay=weight_decay, step=step, inv_scale=inv_scale,
                                                 found_inf=found_inf, model_copies=model_copies)
    _C.multi_tensor_adamw(_table(params), _table(grads), _table(exp_avgs), _table(exp_avg_sqs), _table(model_copies),
                          lr, inv_scale, step, found_inf, beta1, beta2, eps, weight_decay, stream())


def write_scalars(dst, values):
    """dst[:] = values (1 to 8 floats) on the device with one kernel launch on the current stream: the values
    travel as kernel arguments, so nothing is read from host memory later (a pinned-buffer copy could be
    overwritten by the next step before it runs). dst: a float32 device array of len(values) elements."""
    if isinstance(dst, np.ndarray):  # host arrays: the float64 reference
        return reference.multi_tensor.write_scalars(dst, values)
    _C.write_scalars(dst, list(values), stream())


def advance_step(step, found_inf=None):
    """step[0] += 1 on the device, unless found_inf (an int32 (1,) device array) is nonzero: an update the loss
    scaler skips is not counted (PyTorch's AdamW bias correction counts applied updates)."""
    if isinstance(step, np.ndarray):  # host arrays: the float64 reference
        return reference.multi_tensor.advance_step(step, found_inf)
    _C.advance_step(step, found_inf, stream())


def check_finite(grads, found_inf):
    """Set found_inf[0] = 1 if any element of any tensor is inf or NaN; it is never reset to 0 here."""
    if isinstance(grads, reference.multi_tensor.TensorList):  # host arrays: the float64 reference
        return reference.multi_tensor.check_finite(grads, found_inf)
    _C.multi_tensor_check_finite(_table(grads), found_inf, stream())


def zero_(tensors):
    """Zero every tensor in place (one launch, no reallocation)."""
    if isinstance(tensors, reference.multi_tensor.TensorList):  # host arrays: the float64 reference
        return reference.multi_tensor.zero_(tensors)
    _C.multi_tensor_zero(_table(tensors), stream())


def scale_(tensors, factor):
    """Multiply every tensor by factor in place (a number or a float32 (1,) device array)."""
    if isinstance(tensors, reference.multi_tensor.TensorList):  # host arrays: the float64 reference
        return reference.multi_tensor.scale_(tensors, factor)
    _C.multi_tensor_scale(_table(tensors), factor, stream())


__all__ = ["TensorList", "adamw_step", "advance_step", "check_finite", "scale_", "sgd_step", "write_scalars", "zero_"]


def reciprocal_scale(scale, inv_scale):
    """inv_scale[0] = 1 / scale[0] on the device (device (1,) float32 arrays): the loss scaler's unscale factor."""
    _C.reciprocal_scale(scale, inv_scale, stream())


def update_loss_scale(scale, tracker, found_inf, growth_factor: float, backoff_factor: float, growth_interval: int):
    """The dynamic loss scale's rule in one kernel launch, on the device (GradScaler.update's native path)."""
    _C.update_loss_scale(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval, stream())
