"""Decoding CIFAR-10's encoded images (JPEG, PNG, ... through Pillow), in parallel while the source is still read.

DecodeQueue sends the images to a process pool in chunks as a reader finds them, so for a compressed archive the
decoding runs under the decompression instead of after it. The pool forks (like PyTorch's DataLoader): workers
only run NumPy and Pillow, never CUDA, so a CUDA context in the parent is harmless, and unlike 'spawn' or
'forkserver' nothing re-imports the caller's main module.
"""

from __future__ import annotations

import io
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

IMAGE_SHAPE = (32, 32, 3)
# Below this many images a process pool costs more than it saves.
PARALLEL_MIN_IMAGES = 2000
CHUNK_IMAGES = 1024  # images per task sent to a worker: enough to amortise the transfer, small enough to balance


def image_extensions() -> frozenset:
    from PIL import Image

    Image.init()
    return frozenset(ext.lower() for ext in Image.registered_extensions())


def decode_image(source, name: str = "image") -> np.ndarray:
    """An encoded image (bytes, or a path) -> uint8 (32, 32, 3) RGB; ValueError naming it when it is not 32x32."""
    from PIL import Image

    with Image.open(io.BytesIO(source) if isinstance(source, bytes | bytearray) else source) as im:
        arr = np.asarray(im.convert("RGB"))
    if arr.shape != IMAGE_SHAPE:
        raise ValueError(f"{name}: expected a 32x32 image, got {arr.shape[1]}x{arr.shape[0]}")
    return arr


def _decode_chunk(items):
    """Worker entry: [(source, name), ...] -> uint8 (n, 32, 32, 3)."""
    out = np.empty((len(items), *IMAGE_SHAPE), np.uint8)
    for i, (source, name) in enumerate(items):
        out[i] = decode_image(source, name)
    return out


def default_workers() -> int:
    return min(os.cpu_count() or 1, 16)


class DecodeQueue:
    """add(source, name) each image as it is found; result() gives them all decoded, in the order added.

    With more than one worker, once PARALLEL_MIN_IMAGES images have been added every full chunk goes to the pool
    at once; fewer images are decoded in this process. As a context manager it stops the pool on exit (an error
    while reading cancels what is queued).
    """

    def __init__(self, workers: int | None = None):
        self.workers = default_workers() if workers is None else workers
        self._pending, self._parts, self._added, self._pool = [], [], 0, None

    def add(self, source, name: str) -> int:
        """Queue one image (bytes, or a path); returns its index in result()."""
        self._pending.append((source, name))
        self._added += 1
        if (self.workers > 1 and self._added >= PARALLEL_MIN_IMAGES
                and len(self._pending) >= CHUNK_IMAGES):
            self._submit()
        return self._added - 1

    def _submit(self) -> None:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers,
                                             mp_context=multiprocessing.get_context("fork"))
        while self._pending:
            chunk, self._pending = self._pending[:CHUNK_IMAGES], self._pending[CHUNK_IMAGES:]
            self._parts.append(self._pool.submit(_decode_chunk, chunk))

    def result(self) -> np.ndarray:
        """uint8 (n, 32, 32, 3): every image added, decoded (a decoding error is raised here)."""
        if self._pool is None:
            parts = [_decode_chunk(self._pending)]
        else:
            self._submit()
            parts = [f.result() for f in self._parts]
        self._pending, self._parts = [], []
        return np.concatenate(parts) if parts else np.empty((0, *IMAGE_SHAPE), np.uint8)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

