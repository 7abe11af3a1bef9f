"""Host-only stand-ins for device arrays: every test that checks argument validation without a GPU uses these.

- FakeCudaArray: an object whose __cuda_array_interface__ is a plain dict. Any field can be overridden
  (`FakeCudaArray(shape, typestr=">f4", version=99, mask=m, readonly=True)`) or removed (`drop=("version",)`),
  so malformed interfaces are built the same way as good ones.
- FakeDLPackArray: an object whose __dlpack__ returns a real "dltensor" (or "dltensor_versioned") capsule made
  with ctypes, with every DLTensor field settable: NULL shape or data, any ndim, lanes, strides, byte_offset,
  flags and version.
- cupy_at: a real cupy.ndarray over a fake device address (building one and reading its attributes needs no
  GPU; its __cuda_array_interface__ does, since it names cupy's current stream).
- fake(): a FakeCudaArray at an address no other fake uses; transposed(): one with non-contiguous strides.
- InterfaceOnly / DLPackOnly: a real (device) array seen through one protocol only, as another library's arrays
  are (the GPU tests' way to reach the general parser or the DLPack reader with real memory).

A dtype is a NumPy dtype or a precision name ('fp32', 'tf32', 'fp16', 'bf16': its storage dtype, bf16 as uint16).

Validation must finish before any device access, so ops called with these get as far as the device check:
NoGPUError without a GPU, and a TypeError (the pointer is not device memory) with one.
"""

import ctypes
import itertools

import numpy as np

from resnet_native._core.names import PRECISION_STORAGE

# Fakes live far above any real allocation, 4 GiB apart: distinct fakes never overlap.
FAKE_BASE = 1 << 44
_addresses = itertools.count(FAKE_BASE, 1 << 32)


def next_address() -> int:
    return next(_addresses)


_MISSING = object()


def numpy_dtype(dtype) -> np.dtype:
    """The NumPy dtype of a dtype or of a precision name (its storage dtype)."""
    if isinstance(dtype, str) and dtype in PRECISION_STORAGE:
        return PRECISION_STORAGE[dtype]
    return np.dtype(dtype)


class FakeCudaArray:
    """An array known only through its __cuda_array_interface__ dict (version 3, C-contiguous unless strides).

    Keyword arguments override interface fields (shape, typestr, data, strides, version, mask, stream, descr...):
    the positional `shape` is the array's .shape, a keyword `shape` what the interface claims. `readonly` sets
    the flag in `data`; `drop` removes keys. `dtype` is also exposed as the .dtype attribute."""

    def __init__(self, shape, /, dtype="float32", strides=None, ptr=None, *, readonly=False, drop=(), **fields):
        self.shape = tuple(shape)
        self.dtype = numpy_dtype(dtype)
        self.ptr = next_address() if ptr is None else ptr
        interface = {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, readonly),
            "strides": strides,
            "version": 3,
        }
        interface.update(fields)
        for key in drop:
            interface.pop(key, None)
        self.__cuda_array_interface__ = interface


def fake(shape, dtype="float32", **fields):
    """A FakeCudaArray at its own address."""
    return FakeCudaArray(shape, dtype, **fields)


def expect_device_stage():
    """pytest.raises for arguments that are all valid: the op got as far as the device check (no GPU here, or a
    fake pointer that is not device memory there)."""
    import pytest

    import resnet_native as rn

    if rn.cuda_available():
        return pytest.raises(TypeError, match="host memory|not CUDA memory")
    return pytest.raises(rn.NoGPUError)


def transposed(shape, dtype="float32"):
    """A fake array with the strides of a transposed (non-contiguous) view."""
    contiguous = np.empty(shape[::-1], dtype=numpy_dtype(dtype)).strides
    return FakeCudaArray(shape, dtype, strides=tuple(reversed(contiguous)))


# ---- DLPack (dmlc/dlpack dlpack.h) -----------------------------------------------------------------------------
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_BOOL = 0, 1, 2, 4, 6
FLAG_READ_ONLY, FLAG_IS_COPIED = 1 << 0, 1 << 1


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# A private prototype (setting argtypes on ctypes.pythonapi.PyCapsule_New would change it for everyone).
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_CAPSULE_NAMES = {"dltensor": b"dltensor", "dltensor_versioned": b"dltensor_versioned",
                  "used_dltensor": b"used_dltensor"}  # module constants: a capsule keeps a pointer to its name


def dlpack_dtype(dtype) -> tuple:
    """(code, bits) of a NumPy dtype name, or of 'bfloat16'."""
    if dtype == "bfloat16":
        return KDL_BFLOAT, 16
    dt = np.dtype(dtype)
    code = {"f": KDL_FLOAT, "i": KDL_INT, "u": KDL_UINT, "b": KDL_BOOL}[dt.kind]
    return code, dt.itemsize * 8


class FakeDLPackArray:
    """An array known only through DLPack. The capsule's struct lives in this object, so it stays valid while
    the object does (the ops read it during the call). Fields not given describe a C-contiguous CUDA array.

    shape=None gives a NULL shape pointer; ndim overrides the rank the struct claims; data=None a NULL data
    pointer. versioned=True answers a consumer that passes max_version with a "dltensor_versioned" capsule
    (`flags`, `version`); always_versioned=True does so even when not asked. accepts_max_version=False behaves
    like a producer older than DLPack 1.0 (a TypeError for the keyword). Each call's keyword arguments are kept
    in `calls`."""

    def __init__(self, shape, dtype="float32", *, ptr=None, data=_MISSING, ndim=None, lanes=1, strides=None,
                 byte_offset=0, device=(KDL_CUDA, 0), capsule_device=None, versioned=False, always_versioned=False,
                 flags=0, version=(1, 0), accepts_max_version=True, capsule_name=None):
        self.device = device
        self.calls = []
        self.versioned, self.always_versioned = versioned, always_versioned
        self.accepts_max_version = accepts_max_version
        self.capsule_name = capsule_name
        self.ptr = next_address() if ptr is None else ptr
        self._shape = None if shape is None else (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
        code, bits = dlpack_dtype(dtype)
        tensor = DLTensor()
        tensor.data = None if data is None else (self.ptr if data is _MISSING else data)
        tensor.device = DLDevice(*(capsule_device or device))
        tensor.ndim = (len(shape) if shape is not None else 2) if ndim is None else ndim
        tensor.dtype = DLDataType(code, bits, lanes)
        tensor.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)) if self._shape is not None else None
        tensor.strides = (ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
                          if self._strides is not None else None)
        tensor.byte_offset = byte_offset
        self._managed = DLManagedTensor(tensor, None, None)
        self._versioned = DLManagedTensorVersioned(DLPackVersion(*version), None, None, flags, tensor)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        if "max_version" in kwargs and not self.accepts_max_version:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        asked = kwargs.get("max_version") is not None
        if self.always_versioned or (self.versioned and asked):
            return _capsule_new(ctypes.addressof(self._versioned),
                                _CAPSULE_NAMES[self.capsule_name or "dltensor_versioned"], None)
        return _capsule_new(ctypes.addressof(self._managed), _CAPSULE_NAMES[self.capsule_name or "dltensor"], None)


# ---- cupy arrays over fake memory --------------------------------------------------------------------------------
CUPY_FAKE_BASE = 1 << 40  # an address no allocation has: the device check refuses it (or there is no GPU)


def cupy_at(shape, dtype, offset=0, cls=None):
    """A cupy.ndarray (or subclass) over a fake device address; skips the test when cupy is missing."""
    import pytest

    cupy = pytest.importorskip("cupy")
    memory = cupy.cuda.UnownedMemory(CUPY_FAKE_BASE, 1 << 24, None, device_id=0)
    return (cls or cupy.ndarray)(shape, dtype, memptr=cupy.cuda.MemoryPointer(memory, offset))


def duck_like(array, address=None):
    """A FakeCudaArray describing the same memory as a (fake) cupy array: the general parser's input for it."""
    strides = None if array.flags.c_contiguous else tuple(array.strides)
    return FakeCudaArray(array.shape, array.dtype, strides=strides, ptr=array.data.ptr if address is None else address)


# ---- real arrays through one protocol -----------------------------------------------------------------------------
class InterfaceOnly:
    """A real array seen only through its own __cuda_array_interface__ (the general parser's input); it keeps the
    array alive and exposes its dtype, which error messages name."""

    def __init__(self, array):
        self.__cuda_array_interface__ = array.__cuda_array_interface__
        self.dtype = array.dtype
        self.array = array


class DLPackOnly:
    """A real array seen only through DLPack (as torch or jax arrays are): a DLPack 1.x producer, or with
    versioned=False an older one that does not know max_version."""

    def __init__(self, array, versioned=True):
        self.array, self.versioned = array, versioned

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        if "max_version" in kwargs and not self.versioned:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.array.__dlpack__(**kwargs)
