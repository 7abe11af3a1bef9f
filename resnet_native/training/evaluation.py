"""Evaluating a model on a fixed device test set: mean cross-entropy (no smoothing) and accuracy, summed on the
device and read back once per evaluation (queue() returns before they are read).

With cuda_graph=True the first evaluation runs eagerly (algorithm searches, the layers' buffers for the evaluation
batch shapes, workspace growth, all allocated from a cupy pool of its own), the second is captured whole (every
batch and both sums) in one CUDA graph, and each later one replays it: one launch instead of a few hundred
Python-driven ops per batch. The replay runs on the legacy default stream, as the eager evaluation does, so it
is ordered after the training step's blocking stream with no events. The graph reads the weights, the batch-norm
running statistics and the test set in place, so it sees each epoch's model; after something replaces those arrays
(rather than writing into them), call reset(). A capture that fails warns, and evaluation stays eager.
"""

from __future__ import annotations

import contextlib
import warnings

from .._core.capture import WorkspaceHold, capture_graph, graph_buffers, launch_ordered
from .._core.readback import DeviceValues
from ..ops.losses import SoftmaxCrossEntropy
from .builders import partial_batch_search


class Evaluation:
    """evaluation() -> (mean loss, accuracy) of `model` over x_all (normalised, the model's layout and dtype) and
    y_all (int32 labels), in batches of batch_size."""

    def __init__(self, model, x_all, y_all, batch_size: int, *, cuda_graph: bool = False):
        self.model, self.x_all, self.y_all, self.batch_size = model, x_all, y_all, int(batch_size)
        self.loss_fn = SoftmaxCrossEntropy()
        self.cuda_graph = bool(cuda_graph) and model.ensure_placed().on_gpu  # a host model evaluates eagerly
        self.capture_error = None  # why capture was abandoned, if it was
        self.reset()

    def reset(self) -> None:
        """Forget the captured graph: the next evaluation warms up again, the one after captures."""
        hold = getattr(self, "_hold", None)
        if hold is not None:
            hold.release()
        self._pool = self._graph = self._sums = self._keep = self._hold = None

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def __call__(self) -> tuple[float, float]:
        return self.queue().result()

    def queue(self):
        """The evaluation queued on the current stream: a DeviceValues whose result() is (mean loss, accuracy),
        read once it has run (without waiting for work queued after it)."""
        import cupy


        self.model.eval()
        if not self.cuda_graph:
            loss_sum, correct_sum = self._device_sums()
        elif self._pool is None:  # warm-up: what the capture will reuse is allocated from its own pool
            self._pool = cupy.cuda.MemoryPool()
            with cupy.cuda.using_allocator(self._pool.malloc):
                loss_sum, correct_sum = self._device_sums()
        else:
            if self._graph is None:
                self._capture()
            if self._graph is None:
                loss_sum, correct_sum = self._device_sums()
            else:
                launch_ordered(self._graph, cupy.cuda.Stream.null)
                loss_sum, correct_sum = self._sums
        n = len(self.y_all)
        with cupy.cuda.Stream.null if self._graph is not None else contextlib.nullcontext():  # where the sums are
            return DeviceValues((loss_sum, correct_sum),
                                lambda loss, correct: (float(loss[0]) / n, float(correct[0]) / n))

    def _device_sums(self):
        """(loss sum, correct sum): float64 device arrays of shape (1,), every batch's work enqueued on the current
        stream (the loss kernel adds each batch's sums to them)."""
        import cupy


        sums = (cupy.zeros((1,), cupy.float64), cupy.zeros((1,), cupy.float64))
        for s in range(0, len(self.y_all), self.batch_size):
            x = self.x_all[s:s + self.batch_size]
            with partial_batch_search(len(x), self.batch_size):
                logits = self.model.forward(x, train=False, copy=False)
            self.loss_fn.forward(logits, self.y_all[s:s + self.batch_size], train=False, totals=sums)
        return sums

    def _capture(self) -> None:
        import cupy

        stream = cupy.cuda.Stream(non_blocking=False)
        try:
            graph, sums, _ = capture_graph(self._device_sums, stream, self._pool)
        except Exception as e:  # an op that cannot be captured: say so, and evaluate eagerly
            self.capture_error = f"{type(e).__name__}: {e}"
            warnings.warn(f"Evaluation: CUDA-graph capture failed, evaluation stays eager ({self.capture_error})",
                          RuntimeWarning, stacklevel=3)
            self.cuda_graph = False
            return
        self._graph, self._sums, self._hold = graph, sums, WorkspaceHold()
        self._keep = graph_buffers(self.model, self.loss_fn)


def evaluate(model, x_all, y_all, batch_size: int) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over a normalised device set, eagerly: Evaluation without a graph."""
    return Evaluation(model, x_all, y_all, batch_size)()
