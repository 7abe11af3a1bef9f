"""The uint8 image kernels: the training augmentation (crop, flip, cutout, normalise in one pass), progressive
resizing's downscale, and the inference input stage (normalise by lookup table, optionally padded to more channels
and quantised)."""

from __future__ import annotations

from .._core.loader import _C
from .._core.runtime import op_stream


def launch_augment(images, params, batch_start: int, batch: int, lut, out, *, layout: str = "NHWC",
                   crop_padding: int = 4, cutout: int = 0, labels=None, labels_out=None):
    """Run the kernel on cupy's current stream: out[b] = augment(images[params[0, batch_start + b]], ...), and
    labels_out[b] = labels[params[0, batch_start + b]] when both are given.

    images: uint8 (N, H, W, 3); params: int32 (6, M) table; lut: (3, 256) in the output's storage dtype; out:
    (batch, H, W, 3) or (batch, 3, H, W); labels int32 (N,), labels_out int32 (batch,); all C-contiguous device
    arrays (the native core checks each, naming it); returns out (allocated when None, the only allocation). No
    sync. A source index outside [0, N) gives a black image and label -1 (a NaN loss), never a read out of bounds.
    """
    return _C.augment_u8(images, params, batch_start, batch, lut, out, layout, crop_padding, cutout, labels,
                         labels_out, op_stream())


def normalize_u8(images, lut, out, *, layout: str, dtype: str):
    """out = lut[c][images[n, h, w, c]] in `layout`, on cupy's current stream (no allocation when out is given, no
    sync); returns out.

    images: a C-contiguous uint8 (N, H, W, 3) device array (cupy, __cuda_array_interface__ or DLPack); lut: (3, 256)
    in the storage dtype `dtype` (data.augment.normalization_lut(dtype) on the device); out: (N, H, W, 3) for NHWC
    or (N, 3, H, W) for NCHW in that dtype.
    """
    return _C.normalize_u8(images, lut, out, layout, dtype, op_stream())


def normalize_u8_padded(images, table, out, *, fp8: bool):
    """out[..., :3] = table codes of images, the remaining channels of out zero: the 8-bit engines' input, its
    channels padded to what their first convolution takes. images: C-contiguous uint8 (N, H, W, 3); out: (N, H, W,
    C) 8-bit codes (int8, or FP8 E4M3 as uint8 when fp8). On cupy's current stream; no allocation, no sync."""
    return _C.normalize_u8_padded(images, table, out, bool(fp8), int(out.shape[3]), op_stream())


def downscale_u8(images, wy, wx, out):
    """out[n, y, x, c] = the float64 sum over (h, w) of wy[y, h] * wx[x, w] * images[n, h, w, c], rounded half up
    and clipped to [0, 255]; on cupy's current stream, no allocation, no sync; returns out.

    images: C-contiguous uint8 (N, H, W, 3); wy, wx: float64 (size, H) and (size, W) weights
    (data.resize.resize_weights); out: uint8 (N, size, size, 3). The native core checks each, naming it."""
    return _C.downscale_u8(images, wy, wx, out, op_stream())
