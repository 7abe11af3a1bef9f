"""Where the Python graph gets its array module and native ops.

layers/, models/, optim/, losses.py and step.py reach cupy and the native op modules (conv, kernels, norm,
pool, multi_tensor) only through `ops`, which imports them on first use. So importing the package and building
a model need neither a GPU nor cupy, and tests can run the whole graph on NumPy float64 stand-ins
(`ops.use(...)`) to check its wiring on machines without a GPU.
"""

import contextlib
import importlib

import numpy as np

_MODULES = {
    "xp": "cupy",
    "conv": "resnet_native.conv",
    "kernels": "resnet_native.kernels",
    "norm": "resnet_native.norm",
    "pool": "resnet_native.pool",
    "multi_tensor": "resnet_native.multi_tensor",
}

# Storage dtype of activations and conv weights per precision mode (bf16: uint16 arrays holding bf16 bits).
_STORAGE = {"fp32": np.float32, "tf32": np.float32, "fp16": np.float16, "bf16": np.uint16}
PRECISIONS = tuple(_STORAGE)
LAYOUTS = ("NHWC", "NCHW")


class Ops:
    """The array module (`ops.xp`) and native op modules (`ops.conv`, ...) plus the dtypes the graph uses."""

    def __init__(self):
        self.master_dtype = np.dtype(np.float32)  # fp32 master weights, gradients, BN statistics, logits
        self.storage = {name: np.dtype(t) for name, t in _STORAGE.items()}
        self.needs_gpu = True

    def __getattr__(self, name):
        # Only reached when the attribute is not set yet: import once, then it is a plain attribute.
        if name not in _MODULES:
            raise AttributeError(name)
        module = importlib.import_module(_MODULES[name])
        setattr(self, name, module)
        return module

    def storage_dtype(self, precision):
        return self.storage[precision]

    def require_device(self):
        if self.needs_gpu:
            from .._runtime import require_gpu

            require_gpu()

    @contextlib.contextmanager
    def use(self, *, master_dtype=None, storage=None, needs_gpu=None, **modules):
        """Temporarily replace modules (xp=numpy, conv=..., ...) and dtypes; restores everything on exit."""
        unknown = set(modules) - set(_MODULES)
        if unknown:
            raise ValueError(f"unknown op modules {sorted(unknown)}; expected some of {sorted(_MODULES)}")
        saved = dict(self.__dict__)
        try:
            self.__dict__.update(modules)
            if master_dtype is not None:
                self.master_dtype = np.dtype(master_dtype)
            if storage is not None:
                self.storage = {**self.storage, **{k: np.dtype(v) for k, v in storage.items()}}
            if needs_gpu is not None:
                self.needs_gpu = needs_gpu
            yield self
        finally:
            self.__dict__.clear()
            self.__dict__.update(saved)


ops = Ops()


def native_dtype(array):
    """The dtype argument the native ops need for `array`: 'bf16' for uint16 (bf16 bits), else None
    (inferred)."""
    return "bf16" if array.dtype == np.uint16 else None


def to_host(array) -> np.ndarray:
    """A host (NumPy) copy of a device array (or of a NumPy array, under the NumPy stand-ins)."""
    if isinstance(array, np.ndarray):
        return array.copy()
    return array.get()


def upload(value, dtype):
    """A new device array holding the host array `value` converted to `dtype`."""
    return ops.xp.asarray(np.ascontiguousarray(value, dtype=dtype))


def copy_from_host(dst, value) -> None:
    """Overwrite the device array `dst` with the host array `value` (same shape)."""
    ops.xp.copyto(dst, upload(value, dst.dtype))
