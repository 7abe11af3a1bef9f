"""Evaluating a model on a fixed device test set: mean cross-entropy (no smoothing) and accuracy, summed on the
device and read back once per evaluation (queue() returns before they are read).

With cuda_graph=True the first evaluation runs eagerly (algorithm searches, the layers' buffers for the evaluation
batch shapes, workspace growth, all allocated from a cupy pool of its own), the second is captured whole (every
batch and both sums) in one CUDA graph, and each later one replays it: one launch instead of a few hundred
Python-driven ops per batch. The replay runs on the legacy default stream, as the eager evaluation does, so it
is ordered after the training step's blocking stream with no events. The graph reads the weights, the batch-norm
running statistics and the test set in place, so it sees each epoch's model; after something replaces those arrays
(rather than writing into them), call reset(). A capture that fails warns, and evaluation stays eager.

Test-time augmentation (x_views: the test set's other views, data/tta_views.py, each normalised once up front,
so an evaluation adds forwards and no image work; view_weights: the plain set's weight, then each view's): the
plain pass also keeps every batch's logits in one preallocated (N, classes) buffer; a second pass, captured as a
graph of its own, scales it by the plain weight, adds each view's weighted logits into it, and scores the
weighted mean. The plain figures keep their meaning, and events around the second pass time what the
augmentation costs.
"""

from __future__ import annotations

import contextlib
import time
import warnings

import numpy as np

from .. import reference
from .._core.capture import WorkspaceHold, capture_graph, graph_buffers, launch_ordered
from .._core.readback import DeviceValues
from ..ops import kernels, multi_tensor
from ..ops.losses import SoftmaxCrossEntropy
from .builders import partial_batch_search


class Evaluation:
    """evaluation() -> (mean loss, accuracy) of `model` over x_all (normalised, the model's layout and dtype) and
    y_all (int32 labels), in batches of batch_size. With x_views (other views of x_all, each of its shape and
    dtype) and view_weights (x_all's weight, then each view's; default all equal): (mean loss, accuracy, mean loss
    of the weighted mean logits, their accuracy, seconds of the views' pass)."""

    def __init__(self, model, x_all, y_all, batch_size: int, *, cuda_graph: bool = False, x_views=(),
                 view_weights=None):
        self.model, self.x_all, self.y_all, self.batch_size = model, x_all, y_all, int(batch_size)
        self.x_views = tuple(x_views or ())
        for i, x in enumerate(self.x_views):
            if tuple(x.shape) != tuple(x_all.shape) or x.dtype != x_all.dtype:
                raise ValueError(f"x_views[{i}]: expected the test set's shape and dtype {tuple(x_all.shape)} "
                                 f"{x_all.dtype}, got {tuple(x.shape)} {x.dtype}")
        n = len(self.x_views) + 1
        weights = (1.0 / n,) * n if view_weights is None else tuple(float(w) for w in view_weights)
        if len(weights) != n or not all(w > 0 for w in weights) or abs(sum(weights) - 1.0) > 1e-9:
            raise ValueError(f"view_weights: expected {n} positive weights (the plain set's, then each view's) "
                             f"summing to 1, got {view_weights!r}")
        self.view_weights = weights
        self.loss_fn = SoftmaxCrossEntropy()
        self.on_gpu = model.ensure_placed().on_gpu
        self.cuda_graph = bool(cuda_graph) and self.on_gpu  # a host model evaluates eagerly
        self.capture_error = None  # why capture was abandoned, if it was
        self.reset()

    @property
    def tta(self) -> bool:
        return bool(self.x_views)

    def reset(self) -> None:
        """Forget the captured graphs: the next evaluation warms up again, the one after captures."""
        hold = getattr(self, "_hold", None)
        if hold is not None:
            hold.release()
        self._pool = self._graph = self._sums = self._keep = self._hold = None
        self._views_graph = self._views_sums = None
        self._logits = self._logits_list = None  # the plain pass's logits, then the mean of both views

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def __call__(self) -> tuple:
        return self.queue().result()

    def queue(self):
        """The evaluation queued on the current stream: a DeviceValues whose result() is (mean loss, accuracy),
        with TTA followed by (TTA mean loss, TTA accuracy, seconds of the views' pass), read once it has run
        (without waiting for work queued after it)."""
        import cupy

        self.model.eval()
        if self.cuda_graph and self._pool is None:  # warm-up: what the capture will reuse comes from its own pool
            self._pool = cupy.cuda.MemoryPool()
            with cupy.cuda.using_allocator(self._pool.malloc):
                sums = self._eager()
        elif self.cuda_graph and (self._graph is not None or self._capture()):
            stream = cupy.cuda.Stream.null
            launch_ordered(self._graph, stream)
            marks = None
            if self.tta:
                marks = [self._mark(stream)]
                launch_ordered(self._views_graph, stream)
                marks.append(self._mark(stream))
            sums = (*self._sums, *(self._views_sums or ()), marks)
        else:
            sums = self._eager()
        *arrays, marks = sums
        n = len(self.y_all)
        with cupy.cuda.Stream.null if self._graph is not None else contextlib.nullcontext():  # where the sums are
            return DeviceValues(tuple(arrays), lambda *values: self._figures(values, marks, n))

    def _figures(self, values, marks, n: int) -> tuple:
        figures = tuple(float(v[0]) / n for v in values)
        if not self.tta:
            return figures
        return (*figures, self._seconds(*marks))

    def _eager(self) -> tuple:
        """(loss sum, correct sum[, TTA loss sum, TTA correct sum], marks around the views' pass or None), every
        batch's work enqueued on the current stream."""
        plain = self._plain_sums()
        if not self.tta:
            return (*plain, None)
        stream = self._stream()
        start = self._mark(stream)
        views = self._weighted_sums()
        return (*plain, *views, [start, self._mark(stream)])

    def _zeros(self):
        xp = self.model.placement.xp
        return xp.zeros((1,), np.float64), xp.zeros((1,), np.float64)

    def _plain_sums(self):
        """(loss sum, correct sum): float64 arrays of shape (1,) where the model lives, every batch's work enqueued
        on the current stream (the loss kernel adds each batch's sums to them); with TTA each batch's logits are
        also copied into the logits buffer."""
        sums = self._zeros()
        for s in range(0, len(self.y_all), self.batch_size):
            x = self.x_all[s:s + self.batch_size]
            with partial_batch_search(len(x), self.batch_size):
                logits = self.model.forward(x, train=False, copy=False)
            self.loss_fn.forward(logits, self.y_all[s:s + self.batch_size], train=False, totals=sums)
            if self.tta:
                kernels.cast(logits, self._logits_buffer(logits)[s:s + len(x)])
        return sums

    def _weighted_sums(self):
        """The TTA pass: the buffer the plain pass filled scaled by the plain weight (one launch), each view's
        batches' logits scaled by its weight (exact: the weights are powers of two) and added into it, and the
        weighted mean scored in one loss call over the whole set."""
        sums = self._zeros()
        multi_tensor.scale_(self._logits_list, self.view_weights[0])
        for x_view, weight in zip(self.x_views, self.view_weights[1:], strict=True):
            for s in range(0, len(self.y_all), self.batch_size):
                x = x_view[s:s + self.batch_size]
                with partial_batch_search(len(x), self.batch_size):
                    logits = self.model.forward(x, train=False, copy=False)
                rows = self._logits[s:s + len(x)]
                kernels.add_scaled(rows, logits, weight, out=rows)
        self.loss_fn.forward(self._logits, self.y_all, train=False, totals=sums)
        return sums

    def _logits_buffer(self, logits):
        """The (N, classes) buffer, made at the first batch of the first (eager) evaluation, with its tensor list
        (a device table: made outside any capture)."""
        if self._logits is None:
            placement = self.model.placement
            self._logits = placement.xp.empty((len(self.y_all), logits.shape[1]), dtype=logits.dtype)
            lists = multi_tensor.TensorList if placement.on_gpu else reference.multi_tensor.TensorList
            self._logits_list = lists([self._logits])
        return self._logits

    def _stream(self):
        import cupy

        return cupy.cuda.get_current_stream() if self.on_gpu else None

    def _mark(self, stream):
        """A point in the stream's work: a timing event on the GPU, the clock for a host model (done when queued)."""
        if stream is None:
            return time.perf_counter()
        import cupy

        return stream.record(cupy.cuda.Event())

    @staticmethod
    def _seconds(start, end) -> float:
        if isinstance(start, float):
            return end - start
        import cupy

        return cupy.cuda.get_elapsed_time(start, end) / 1e3

    def _capture(self) -> bool:
        """Capture the plain pass (and the views' pass, as a second graph); False (with a warning, evaluation eager
        from then on) when an op cannot be captured."""
        import cupy

        stream = cupy.cuda.Stream(non_blocking=False)
        try:
            graph, sums, _ = capture_graph(self._plain_sums, stream, self._pool)
            views_graph, views_sums = None, None
            if self.tta:
                views_graph, views_sums, _ = capture_graph(self._weighted_sums, stream, self._pool)
        except Exception as e:  # an op that cannot be captured: say so, and evaluate eagerly
            self.capture_error = f"{type(e).__name__}: {e}"
            warnings.warn(f"Evaluation: CUDA-graph capture failed, evaluation stays eager ({self.capture_error})",
                          RuntimeWarning, stacklevel=3)
            self.cuda_graph = False
            return False
        self._graph, self._sums, self._hold = graph, sums, WorkspaceHold()
        self._views_graph, self._views_sums = views_graph, views_sums
        self._keep = graph_buffers(self.model, self.loss_fn)
        return True


def evaluate(model, x_all, y_all, batch_size: int, *, x_views=(), view_weights=None) -> tuple:
    """(mean cross-entropy, accuracy) over a normalised device set, eagerly: Evaluation without a graph; with
    x_views, also the TTA figures (see Evaluation)."""
    return Evaluation(model, x_all, y_all, batch_size, x_views=x_views, view_weights=view_weights)()
