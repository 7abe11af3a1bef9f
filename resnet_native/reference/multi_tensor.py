"""Float64 NumPy versions of the multi-tensor optimizer kernels, with the signatures of resnet_native.ops.multi_tensor:
SGD and AdamW steps over lists of host arrays, the inf/nan check, zero_, scale_, write_scalars and advance_step.

The formulas are the native kernels' (PyTorch's SGD and AdamW), in float64 (the native kernels compute in fp32).
Scalars the native ops read from the device (lr, momentum, beta1, inv_scale, AdamW's step) are numbers or NumPy
arrays of shape (1,) here; found_inf is a NumPy int32 array of shape (1,), and a nonzero value skips the whole
update. Parameters and optimizer state are float arrays (the model's master dtype); gradients and model copies may
be float32/float64, float16 or bf16 bits (named with dtype='bf16').
"""

import numbers

import numpy as np

from . import storage


class TensorList(tuple):
    """A fixed tuple of host arrays with their dtypes and sizes: what the functions here take, in the shape of
    resnet_native.ops.multi_tensor.TensorList (whose functions hand a TensorList of this class to the reference).

    dtype: None infers each array's dtype (uint16 arrays need 'bf16'), a string applies to every array, a sequence
    gives one per array. Entries may be None only in a list used as model_copies.
    """

    def __new__(cls, arrays, dtype=None):
        arrays = list(arrays)
        if not arrays:
            raise ValueError("arrays: expected at least one array")
        dtypes = list(dtype) if isinstance(dtype, (list, tuple)) else [dtype] * len(arrays)
        if len(dtypes) != len(arrays):
            raise ValueError(f"dtype: expected {len(arrays)} dtypes (one per array), got {len(dtypes)}")
        dtypes = tuple(None if a is None else storage.dtype_of(a, f"arrays[{i}]", d)
                       for i, (a, d) in enumerate(zip(arrays, dtypes, strict=True)))
        self = super().__new__(cls, arrays)
        self.dtypes = dtypes
        self.sizes = tuple(0 if a is None else int(a.size) for a in arrays)
        return self

    def read(self, i: int) -> np.ndarray:
        """The float64 values of the i-th array."""
        return storage.decode(self[i], self.dtypes[i])

    def write(self, i: int, values) -> None:
        """Round float64 `values` to the i-th array's storage and store them there (None entries: nothing)."""
        if self[i] is not None:
            storage.write(self[i], values, self.dtypes[i])

    def __repr__(self):
        return f"reference.TensorList({len(self)} host arrays, {sum(self.sizes)} elements)"


def _lists(**lists) -> int:
    """Check the named TensorLists (None: absent) match the first one in length and sizes; the length."""
    first_name, first = next(iter(lists.items()))
    for name, value in lists.items():
        if value is None:
            continue
        if not isinstance(value, TensorList):
            raise TypeError(f"{name}: expected a resnet_native.reference.multi_tensor.TensorList, got "
                            f"{type(value).__name__}")
        sizes = [s if a is not None else f for s, f, a in zip(value.sizes, first.sizes, value, strict=False)]
        if len(value) != len(first) or sizes != list(first.sizes):
            raise ValueError(f"{name}: expected {len(first)} tensors of the sizes of {first_name} {first.sizes}, got "
                             f"{value.sizes}")
    return len(first)


def _number(value, name: str, low=None, high=None) -> float:
    """A float from a number or a (1,) / 0-d NumPy array. A number is checked to lie in [low, high) where given; an
    array is not, as the native ops leave the values a device array holds (say, a step counter an update the scaler
    skipped left at 0) to the device."""
    checked = not isinstance(value, np.ndarray)
    if not checked:
        if value.shape not in ((1,), ()):
            raise ValueError(f"{name}: expected a number or an array of shape (1,), got shape {value.shape}")
        value = value.reshape(-1)[0]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number or an array of shape (1,), got {type(value).__name__}")
    value = float(value)
    if not checked:
        return value
    if (low is not None and not value >= low) or (high is not None and not value < high):
        bound = f"in [{low:g}, {high:g})" if high is not None else f">= {low:g}"
        raise ValueError(f"{name}: expected a value {bound}, got {value}")
    return value


def _skipped(found_inf) -> bool:
    if found_inf is None:
        return False
    storage.host(found_inf, "found_inf")
    if found_inf.dtype != np.int32 or found_inf.shape != (1,):
        raise TypeError(f"found_inf: expected an int32 array of shape (1,), got {found_inf.dtype} {found_inf.shape}")
    return int(found_inf[0]) != 0


def sgd_step(params, grads, momentum_bufs, *, lr, momentum=0.9, weight_decay=0.0, nesterov=False, dampening=0.0,
             inv_scale=1.0, found_inf=None, model_copies=None, first_step=False):
    """One PyTorch-SGD update of every parameter (see resnet_native.ops.multi_tensor.sgd_step). As there, the buffers
    are skipped altogether when momentum is the number 0."""
    count = _lists(params=params, grads=grads, momentum_bufs=momentum_bufs, model_copies=model_copies)
    use_buffers = momentum_bufs is not None and (isinstance(momentum, np.ndarray) or momentum != 0)
    lr, inv_scale = _number(lr, "lr"), _number(inv_scale, "inv_scale")
    momentum = _number(momentum, "momentum", 0.0)
    dampening, weight_decay = _number(dampening, "dampening", 0.0), _number(weight_decay, "weight_decay", 0.0)
    if nesterov and (momentum == 0.0 or dampening != 0.0):
        raise ValueError("nesterov: needs momentum > 0 and dampening == 0")
    if _skipped(found_inf):
        return
    for i in range(count):
        p, d = params.read(i), grads.read(i) * inv_scale
        d = d + weight_decay * p
        if use_buffers:
            buf = d if first_step else momentum * momentum_bufs.read(i) + (1.0 - dampening) * d
            momentum_bufs.write(i, buf)
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
        params.write(i, p)
        if model_copies is not None:
            model_copies.write(i, p)


def adamw_step(params, grads, exp_avgs, exp_avg_sqs, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step,
               inv_scale=1.0, found_inf=None, model_copies=None):
    """One PyTorch-AdamW update of every parameter (see resnet_native.ops.multi_tensor.adamw_step); step counts
    from 1."""
    count = _lists(params=params, grads=grads, exp_avgs=exp_avgs, exp_avg_sqs=exp_avg_sqs, model_copies=model_copies)
    lr, inv_scale = _number(lr, "lr"), _number(inv_scale, "inv_scale")
    beta1, beta2 = _number(beta1, "beta1", 0.0, 1.0), _number(beta2, "beta2", 0.0, 1.0)
    eps, weight_decay = _number(eps, "eps", 0.0), _number(weight_decay, "weight_decay", 0.0)
    step = _number(step, "step", 1.0)
    if _skipped(found_inf):
        return
    step_size, bias_correction2_sqrt = lr / (1.0 - beta1**step), np.sqrt(1.0 - beta2**step)
    for i in range(count):
        d = grads.read(i) * inv_scale
        m = beta1 * exp_avgs.read(i) + (1.0 - beta1) * d
        v = beta2 * exp_avg_sqs.read(i) + (1.0 - beta2) * d * d
        exp_avgs.write(i, m)
        exp_avg_sqs.write(i, v)
        p = params.read(i) * (1.0 - lr * weight_decay) - step_size * m / (np.sqrt(v) / bias_correction2_sqrt + eps)
        params.write(i, p)
        if model_copies is not None:
            model_copies.write(i, p)


def check_finite(grads, found_inf):
    """Set found_inf[0] = 1 if any element of any tensor is inf or NaN; it is never reset to 0 here."""
    count = _lists(grads=grads)
    if found_inf is None:
        raise TypeError("found_inf: expected a NumPy int32 array of shape (1,), got None")
    _skipped(found_inf)
    if not all(np.isfinite(grads.read(i)).all() for i in range(count)):
        found_inf[0] = 1


def zero_(tensors):
    """Zero every tensor in place."""
    for i in range(_lists(tensors=tensors)):
        tensors.write(i, 0.0)


def scale_(tensors, factor):
    """Multiply every tensor by factor in place (a number or a (1,) array)."""
    factor = _number(factor, "factor")
    for i in range(_lists(tensors=tensors)):
        tensors.write(i, tensors.read(i) * factor)


def write_scalars(dst, values):
    """dst[:] = values (floats); dst: a float host array of len(values) elements."""
    values = [float(v) for v in values]
    storage.host(dst, "dst")
    if dst.dtype.kind != "f" or dst.shape != (len(values),):
        raise ValueError(f"dst: expected a float array of shape ({len(values)},), got {dst.dtype} {dst.shape}")
    dst[...] = values


def advance_step(step, found_inf=None):
    """step[0] += 1, unless found_inf (an int32 (1,) array) is nonzero: skipped updates are not counted."""
    storage.host(step, "step")
    if not _skipped(found_inf):
        step[0] += 1


__all__ = ["TensorList", "adamw_step", "advance_step", "check_finite", "scale_", "sgd_step", "write_scalars", "zero_"]
