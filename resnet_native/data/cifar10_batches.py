"""The official CIFAR-10 batches: the python version's pickles, read without running any code a pickle names, and the
binary version's fixed-size records; each parsed to uint8 (N, 32, 32, 3) HWC images and int32 labels, every value
checked before a cast could wrap it."""

from __future__ import annotations

import io
import pickle

import numpy as np

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
_RECORD_BYTES = 1 + 32 * 32 * 3  # binary version: one label byte, then the image in CHW order


class _ArrayOnlyUnpickler(pickle.Unpickler):
    """The official batches hold numpy arrays and lists; refusing every other global keeps a crafted pickle from
    running code."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise _Refused(f"refusing to load {module}.{name}")


class _Refused(pickle.UnpicklingError, ValueError):
    """A pickle that names a global outside the allowed ones: an UnpicklingError, and a ValueError as every other
    malformed batch is."""


def parse_python_batch(raw: bytes, name: str = "batch") -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch of the python version -> (uint8 (N,32,32,3), int32 (N,))."""
    try:
        d = _ArrayOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except _Refused as e:
        raise _Refused(f"{name}: not a CIFAR-10 batch: {e}") from None
    except Exception as e:  # garbage makes the unpickler raise any of a dozen types
        raise ValueError(f"{name}: not a pickled CIFAR-10 batch ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{name}: expected a pickled dict, got {type(d).__name__}")
    # Keys are bytes (b'data') in the official batches; any other key is kept, by its text, for the message.
    d = {(k.decode("utf-8", "replace") if isinstance(k, bytes) else k): v for k, v in d.items()}
    if "data" not in d or "labels" not in d:
        raise ValueError(f"{name}: expected keys 'data' and 'labels', got {sorted(map(repr, d))}")
    data = _integers(d["data"], name, "data", 0, 256, "pixel values", np.uint8)
    labels = _integers(d["labels"], name, "labels", 0, len(CLASSES), "labels", np.int32)
    if data.ndim != 2 or data.shape[1] != 3072 or labels.ndim != 1 or data.shape[0] != labels.shape[0]:
        raise ValueError(f"{name}: data {data.shape} / labels {labels.shape} are not (N, 3072) / (N,)")
    return np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)), _check_labels(labels, name)


def parse_binary_batch(raw: bytes, name: str = "batch") -> tuple[np.ndarray, np.ndarray]:
    """One file of the binary version (records of 1 label byte + 3072 CHW bytes) -> (images, labels)."""
    if len(raw) % _RECORD_BYTES:
        raise ValueError(f"{name}: {len(raw)} bytes is not a whole number of {_RECORD_BYTES}-byte records")
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, _RECORD_BYTES)
    labels = records[:, 0].astype(np.int32)
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), _check_labels(labels, name)


def _integers(values, name: str, field: str, low: int, high: int, what: str, dtype) -> np.ndarray:
    """A batch's field as an array of `dtype` once every value is an integer in [low, high) (a cast would wrap
    -5 to 251 and 2**32 + 3 to 3); else a ValueError naming the batch and the field."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as e:  # ragged nesting, objects NumPy cannot hold
        raise ValueError(f"{name}: {field}: expected an array of integers ({type(e).__name__}: {e})") from None
    if array.size == 0:
        return array.astype(dtype)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name}: {field}: expected integers in [{low}, {high}), got dtype {array.dtype}")
    if array.min() < low or array.max() >= high:
        raise ValueError(f"{name}: {field}: {what} outside [{low}, {high}) (min {array.min()}, max {array.max()})")
    return array.astype(dtype)


def _check_labels(labels, name):
    if labels.size and (labels.min() < 0 or labels.max() >= len(CLASSES)):
        raise ValueError(f"{name}: labels outside 0..9 (min {labels.min()}, max {labels.max()})")
    return labels
