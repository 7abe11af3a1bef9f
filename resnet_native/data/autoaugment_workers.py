"""AutoAugment in forked worker processes, one epoch ahead, into two shared buffers: each worker runs the batched
NumPy ops (autoaugment_batched.py), equal bit for bit to the PIL reference (autoaugment.py)."""

from __future__ import annotations

import mmap
import multiprocessing
import os

import numpy as np

from .._core.names import whole_number
from .autoaugment import sample_autoaugment
from .autoaugment_batched import autoaugment_batch, warm_maps


def autoaugment_images(images: np.ndarray, choices: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Every image with its choice row, batched in NumPy (equal to autoaugment_images_pil)."""
    return autoaugment_batch(images, choices, out)


# ----------------------------------------------------------------------------------------------------------------
# Worker pool

_worker_state = {}  # set in each worker by fork inheritance: source images and the two output buffers


def _worker_chunk(args):
    slot, start, stop, choices = args
    images = _worker_state["images"]
    out = np.frombuffer(_worker_state["buffers"][slot], np.uint8).reshape(images.shape)
    autoaugment_images(images[start:stop], choices, out[start:stop])
    return stop - start


class AutoAugmentWorkers:
    """Produces each epoch's AutoAugmented copy of a uint8 (N, H, W, 3) set in worker processes, one epoch ahead.

        aa = AutoAugmentWorkers(train_images, seed=0)
        aa.prefetch(0)
        images_e = aa.result(0)   # blocks until ready; a read-only view, valid until prefetch(e + 2)
        aa.prefetch(1)            # overlaps epoch 0's training
        ...
        aa.close()

    Two shared-memory buffers alternate (epoch e uses slot e % 2), so epoch e + 1 can be built while epoch e's copy
    is still being uploaded. workers=0 runs in the calling process (no pool).
    The pool forks: its workers inherit the source array and the buffers without copying, and never touch CUDA.
    """

    def __init__(self, images: np.ndarray, *, seed: int = 0, workers: int | None = None, chunk: int | None = None,
                 crop_padding: int = 0, flip: bool = False):
        images = np.ascontiguousarray(images, dtype=np.uint8)
        self.crop_padding, self.flip = whole_number("crop_padding", crop_padding, 0), bool(flip)
        if images.ndim != 4 or images.shape[3] != 3:
            raise ValueError(f"images: expected uint8 (N, H, W, 3), got {images.shape}")
        self.images = images
        self.seed = int(seed)
        self._buffers = [mmap.mmap(-1, max(images.nbytes, 1)) for _ in range(2)]
        self._pending = {}
        if workers is None:
            workers = max(1, min(len(os.sched_getaffinity(0)) - 1, 32))
        self.workers = int(workers)
        # Two tasks per worker by default: large enough groups for the batched ops, some balance between workers.
        self.chunk = int(chunk) if chunk else max(256, -(-len(images) // max(1, 2 * self.workers)))
        self._pool = None
        warm_maps(*images.shape[1:3])  # the geometric maps, made once here and inherited by the forked workers
        if self.workers > 0:
            _worker_state["images"] = images
            _worker_state["buffers"] = self._buffers
            self._pool = multiprocessing.get_context("fork").Pool(self.workers)

    def _view(self, slot):
        return np.frombuffer(self._buffers[slot], np.uint8, count=self.images.size).reshape(self.images.shape)

    def slots(self) -> list:
        """The two shared buffers the epochs alternate between, as read-only arrays (to page-lock them for the
        upload; what a slot holds is only valid between result() and the prefetch that reuses it)."""
        views = [self._view(slot) for slot in range(2)]
        for view in views:
            view.flags.writeable = False
        return views

    def prefetch(self, epoch: int) -> None:
        """Start building epoch's copy (no-op when already started)."""
        if epoch in self._pending:
            return
        slot = epoch % 2
        if any(e % 2 == slot for e in self._pending):
            raise RuntimeError(f"epoch {epoch}: its buffer is still in use by an earlier epoch; call result() first")
        choices = sample_autoaugment(self.seed, epoch, len(self.images), crop_padding=self.crop_padding,
                                     flip=self.flip)
        n = len(self.images)
        tasks = [(slot, s, min(s + self.chunk, n), choices[s:min(s + self.chunk, n)]) for s in range(0, n, self.chunk)]
        if self._pool is None:
            autoaugment_images(self.images, choices, self._view(slot))
            self._pending[epoch] = None
        else:
            self._pending[epoch] = self._pool.map_async(_worker_chunk, tasks)

    def result(self, epoch: int) -> np.ndarray:
        """epoch's augmented images (starting the work first if needed)."""
        self.prefetch(epoch)
        job = self._pending.pop(epoch)
        if job is not None:
            job.get()
        view = self._view(epoch % 2)
        view.flags.writeable = False
        return view

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        self._pending.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
