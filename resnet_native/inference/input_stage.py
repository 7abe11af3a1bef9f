"""The engine's input stage: a caller's batch -> the static input buffer a captured forward reads.

Three kinds of input, each one kernel into the buffer:
  'copy'       an array already in the engine's storage dtype and layout;
  'cast'       float32 / float16 / bf16 (uint16 bit patterns, as everywhere in this package) in the engine's layout
               but another dtype: kernels.cast (round to nearest even);
  'normalize'  uint8 (N, H, W, 3) images, raw pixels in HWC order whatever the engine's layout: normalize_u8, a
               gather through resnet_native.data.augment.normalization_lut, so the network sees exactly the inputs
               the training pipeline (and the released models' evaluation) produced, bit for bit.

Why not fold the normalisation into the first convolution instead (w' = w / std, b' = -sum(w * mean / std))? The
folded convolution would read raw pixels, so its zero padding would stand for a black pixel, where the network was
trained on zero-padded normalised inputs (a padded zero is a pixel at the mean): exact only where no padding is
read. The CIFAR stem (3x3, pad 1) and the ImageNet stem (7x7, pad 3) both read padding, so the normalisation stays
a separate, bit-exact table lookup fused into the input copy.
"""

from __future__ import annotations

import numpy as np

from .._loader import _C
from .._runtime import op_stream

# kinds of input (see the module docstring)
COPY, CAST, NORMALIZE = "copy", "cast", "normalize"
# Element types a float input may have: uint16 arrays are bf16 bit patterns.
_FLOAT_INPUTS = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16", np.dtype(np.uint16): "bf16"}
_DLPACK_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


def as_device_array(x, name: str = "x"):
    """x as a cupy array on the device, without copying device memory: a cupy array as is, anything with
    __cuda_array_interface__ through cupy.asarray, a CUDA DLPack tensor through cupy.from_dlpack, and a NumPy
    array uploaded (one host-to-device copy)."""
    import cupy

    if isinstance(x, (cupy.ndarray, np.ndarray)):
        return cupy.asarray(x)
    try:
        interface = getattr(x, "__cuda_array_interface__", None)
    except TypeError:  # e.g. a torch bfloat16 tensor, which has no interface typestr: try DLPack
        interface = None
    if interface is not None:
        return cupy.asarray(x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        if x.__dlpack_device__()[0] not in _DLPACK_CUDA_DEVICES:
            raise TypeError(f"{name}: expected a CUDA array, got a {type(x).__module__}.{type(x).__qualname__} in "
                            "host memory (pass a NumPy array, or copy it to the GPU)")
        try:
            return cupy.from_dlpack(x)
        except (TypeError, ValueError, RuntimeError) as e:  # cupy has no bfloat16, for one
            raise TypeError(f"{name}: cupy cannot take this DLPack array ({e}); pass bf16 data as uint16 bit "
                            "patterns") from e
    raise TypeError(f"{name}: expected a cupy array, any __cuda_array_interface__ or DLPack CUDA array, or a NumPy "
                    f"array, got {type(x).__module__}.{type(x).__qualname__}")


def normalize_u8(images, lut, out, *, layout: str, dtype: str):
    """out = lut[c][images[n, h, w, c]] in `layout`, on cupy's current stream (no allocation when out is given, no
    sync); returns out.

    images: a C-contiguous uint8 (N, H, W, 3) device array (cupy, __cuda_array_interface__ or DLPack); lut: (3, 256)
    in the storage dtype `dtype` (data.augment.normalization_lut(dtype) on the device); out: (N, H, W, 3) for NHWC
    or (N, 3, H, W) for NCHW in that dtype.
    """
    return _C.normalize_u8(images, lut, out, layout, dtype, op_stream())


def check_images(x, name: str, height: int, width: int) -> str:
    """NORMALIZE for a uint8 (N, height, width, 3) batch of images; ValueError naming `name` for another shape."""
    shape = tuple(x.shape)
    if len(shape) != 4 or shape[1:] != (height, width, 3):
        raise ValueError(f"{name}: uint8 images must be (N, {height}, {width}, 3) RGB in HWC order (any engine "
                         f"layout), got shape {shape}")
    return NORMALIZE


class InputStage:
    """Checks a batch against the engine's input (storage `dtype`, `layout`, (H, W)) and writes it into a buffer."""

    def __init__(self, dtype: str, layout: str, image_size: tuple, lut):
        self.dtype = dtype  # 'fp32', 'fp16' or 'bf16'
        self.layout = layout
        self.height, self.width = image_size
        self.lut = lut  # the (3, 256) normalisation table on the device
        self.sample_shape = (self.height, self.width, 3) if layout == "NHWC" else (3, self.height, self.width)

    def kind_of(self, x, name: str = "x") -> str:
        """COPY, CAST or NORMALIZE for an accepted batch; TypeError / ValueError naming `name` otherwise."""
        shape = tuple(x.shape)
        if x.dtype == np.uint8:
            return check_images(x, name, self.height, self.width)
        source = _FLOAT_INPUTS.get(np.dtype(x.dtype))
        if source is None:
            raise TypeError(f"{name}: expected uint8 images or a float32 / float16 / bf16 (uint16 bits) batch, got "
                            f"{x.dtype}")
        if len(shape) != 4 or shape[1:] != self.sample_shape:
            want = ", ".join(map(str, self.sample_shape))
            raise ValueError(f"{name}: expected a {self.layout} batch of shape (N, {want}), got {shape}")
        return COPY if source == self.dtype else CAST

    def write(self, x, kind: str, out) -> None:
        """Stage x (already checked by kind_of, same batch as out) into out, on the current stream."""
        import cupy

        if kind == COPY:
            cupy.copyto(out, x)
        elif kind == CAST:
            from ..kernels import cast

            cast(cupy.ascontiguousarray(x), out)
        else:
            normalize_u8(cupy.ascontiguousarray(x), self.lut, out, layout=self.layout, dtype=self.dtype)


class QuantizedInputStage:
    """The int8 / FP8 engines' input: uint8 (N, H, W, 3) images only, through a table of codes (quantized.py's
    input_table: the normalised value quantised at the input's scale), into the zero-padded NHWC input."""

    def __init__(self, dtype: str, image_size: tuple, table):
        self.dtype = dtype  # 'int8' or 'fp8'
        self.height, self.width = image_size
        self.table = table  # (3, 256) codes on the device
        self.sample_shape = (self.height, self.width, 3)

    def kind_of(self, x, name: str = "x") -> str:
        if x.dtype != np.uint8:
            raise TypeError(f"{name}: the {self.dtype} engine takes uint8 (N, {self.height}, {self.width}, 3) images "
                            f"(it quantises them by table), got {x.dtype}")
        return check_images(x, name, self.height, self.width)

    def write(self, x, kind: str, out) -> None:
        import cupy

        _C.normalize_u8_padded(cupy.ascontiguousarray(x), self.table, out, self.dtype == "fp8", int(out.shape[3]),
                               op_stream())

    def codes_of(self, values: np.ndarray) -> np.ndarray:
        """Host float values (about unit scale) as codes of the engine's dtype: the warm-up's stand-in input."""
        from ..quantization.fp8 import encode_e4m3

        if self.dtype == "int8":
            return np.clip(np.rint(values * 32), -127, 127).astype(np.int8)
        return encode_e4m3(values)
