"""The engine's input stage: a caller's batch -> the static input buffer a captured forward reads, in one kernel.

'copy' takes an array already in the engine's storage dtype and layout; 'cast' a float32 / float16 / bf16 batch
in the engine's layout (kernels.cast, round to nearest even); 'normalize' uint8 (N, H, W, 3) pixels whatever the
engine's layout, through data.augment.normalization_lut, so the network sees the inputs the training pipeline
produced, bit for bit. The normalisation is not folded into the first convolution (w' = w / std, ...): the folded
convolution's zero padding would stand for a black pixel where the network was trained with padding at the mean,
and both stems read padding, so it stays a separate, exact table lookup fused into the input copy.
"""

from __future__ import annotations

import numpy as np

from ..ops.images import normalize_u8, normalize_u8_padded  # noqa: F401  (normalize_u8: re-exported)
from ..ops.kernels import cast
from ..quantization.fp8 import encode_e4m3

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

        normalize_u8_padded(cupy.ascontiguousarray(x), self.table, out, fp8=self.dtype == "fp8")

    def codes_of(self, values: np.ndarray) -> np.ndarray:
        """Host float values (about unit scale) as codes of the engine's dtype: the warm-up's stand-in input."""
        if self.dtype == "int8":
            return np.clip(np.rint(values * 32), -127, 127).astype(np.int8)
        return encode_e4m3(values)
