"""Batcher: single images from many threads in, batched engine calls on one worker thread out.

    with Batcher(clf.engine, max_batch=256) as batcher:
        future = batcher.submit(image)          # uint8 (32, 32, 3); returns at once
        logits = future.result()                # (classes,) float32, this image's row of its batch's logits
        rows = batcher.submit_array(images).result()   # (N, 32, 32, 3) as one request -> (N, classes)

An engine call costs a fixed overhead plus a little per image, so a GPU serves far more images in batches. The
policy is Triton's default (max_queue_delay_microseconds = 0): when the worker is free and a request is queued, it
takes everything queued (up to max_batch) and calls the engine at once; requests that arrive while the engine runs
queue up and form the next batch. So a lone request on an idle engine pays no wait, and batches grow with the load
by themselves. max_delay_ms > 0 is an opt-in extra wait: the worker then holds a batch until it is full or its
oldest request has waited max_delay_ms (a request that already waited out a busy engine call waits no more).
One worker thread makes every call, since an InferenceEngine is not thread-safe and cupy's current device is per
thread. A failed batch is re-run one request at a time, so only the request that makes the engine fail gets the
exception. Past max_queue waiting images, submit raises BatcherFull at once (503) rather than letting every
latency grow. A request of several images (submit_array) stays one unit: one future (or one callback, for a
caller that forwards answers without a future per request) and always inside one engine call.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import math
import numbers
import sys
import threading
import time

import numpy as np

from .._core.names import bounded_int

IMAGE_SHAPE = (32, 32, 3)
# The largest batch when the engine does not say (a plain callable): a host engine's batch of 32 already amortises
# the per-call overhead, and larger ones only add latency for the first request in them.
DEFAULT_MAX_BATCH = 32

_log = logging.getLogger(__name__)


class BatcherFull(RuntimeError):
    """max_queue requests are already waiting: retry later (an HTTP server answers 503 with Retry-After)."""


class BatcherClosed(RuntimeError):
    """The batcher was closed: it accepts no more requests."""


def _delay_seconds(value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"max_delay_ms: expected a number of milliseconds, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"max_delay_ms: expected a finite number >= 0, got {value}")
    return float(value) / 1000.0


def check_image(image, name: str = "image") -> np.ndarray:
    """A private C-contiguous copy of a uint8 (32, 32, 3) NumPy image (a copy: the caller may reuse its array
    while the request waits), or a TypeError / ValueError naming `name`."""
    if not isinstance(image, np.ndarray):
        raise TypeError(f"{name}: expected a NumPy uint8 array of shape {IMAGE_SHAPE}, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise TypeError(f"{name}: expected a uint8 array, got {image.dtype}")
    if image.shape != IMAGE_SHAPE:
        raise ValueError(f"{name}: expected shape {IMAGE_SHAPE} (H, W, RGB), got {image.shape}")
    return np.array(image, order="C", copy=True)


def check_images(images, max_queue: int) -> list:
    """submit_many's images (a sequence of (32, 32, 3) arrays or an (N, 32, 32, 3) array), each checked by
    check_image; more than max_queue can never be queued: ValueError."""
    if isinstance(images, np.ndarray) and images.ndim == 4:
        images = list(images)
    if isinstance(images, np.ndarray) or not hasattr(images, "__iter__"):
        raise TypeError(f"images: expected a sequence of images or an (N, 32, 32, 3) array, got "
                        f"{type(images).__name__}")
    checked = [check_image(im, f"images[{i}]") for i, im in enumerate(images)]
    if len(checked) > max_queue:
        raise ValueError(f"images: {len(checked)} images are more than max_queue={max_queue} can hold")
    return checked


def check_array(images, max_images: int, name: str = "images", *, copy: bool = True) -> np.ndarray:
    """A private C-contiguous copy (copy=False: the array itself) of a uint8 (N, 32, 32, 3) NumPy array with
    1 <= N <= max_images, or a TypeError / ValueError naming `name`."""
    if not isinstance(images, np.ndarray):
        raise TypeError(f"{name}: expected a NumPy uint8 array of shape (N, {', '.join(map(str, IMAGE_SHAPE))}), got "
                        f"{type(images).__name__}")
    if images.dtype != np.uint8:
        raise TypeError(f"{name}: expected a uint8 array, got {images.dtype}")
    if images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE:
        raise ValueError(f"{name}: expected shape (N, {', '.join(map(str, IMAGE_SHAPE))}), got {images.shape}")
    if not 1 <= len(images) <= max_images:
        raise ValueError(f"{name}: expected 1 to {max_images} images (one engine call), got {len(images)}")
    return np.array(images, order="C", copy=True) if copy else images


def _to_host_logits(out, n: int) -> np.ndarray:
    """An engine's output for a batch of n as a host float32 (n, classes) array (cupy arrays are copied over)."""
    if not isinstance(out, np.ndarray) and hasattr(out, "__cuda_array_interface__") and hasattr(out, "get"):
        out = out.get()
    out = np.asarray(out, dtype=np.float32)
    if out.ndim != 2 or out.shape[0] != n:
        raise ValueError(f"engine: expected logits of shape ({n}, classes) for a batch of {n}, got {out.shape}")
    return out


def _current_cuda_device():
    """The CUDA device current in this thread, when cupy is already in use; else None (never imports cupy)."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        return cupy.cuda.runtime.getDevice()
    except Exception:  # no driver or no GPU: nothing to carry over
        return None


class _Request:
    """k images answered together: by `future` (single: the row of a one-image request, else the (k, classes)
    rows), or by callback(rows, error) on the worker thread, rows a view into the batch's logits."""

    __slots__ = ("images", "future", "callback", "single", "queued_at")

    def __init__(self, images: np.ndarray, *, single: bool = False, callback=None):
        self.images, self.single, self.callback = images, single, callback
        self.future = None if callback is not None else concurrent.futures.Future()
        self.queued_at = time.monotonic()

    def start(self) -> bool:
        """False when its caller gave up (a cancelled future): then it is not run."""
        return self.future is None or self.future.set_running_or_notify_cancel()

    def resolve(self, rows: np.ndarray) -> None:
        if self.callback is not None:
            self.callback(rows, None)
        else:  # its own copy: not a view keeping the whole batch alive
            self.future.set_result(rows[0].copy() if self.single else rows.copy())

    def fail(self, error: BaseException) -> None:
        if self.callback is not None:
            self.callback(None, error)
        else:
            self.future.set_exception(error)


class Batcher:
    """Groups single-image requests into batched calls of `engine`, on one worker thread.

    engine: an InferenceEngine, or any callable taking a uint8 (N, 32, 32, 3) NumPy batch and returning (N, classes)
    logits (cupy or NumPy). max_batch: the most images per engine call (default: the engine's largest captured batch
    size `engine.batch_sizes[-1]`, else DEFAULT_MAX_BATCH). max_delay_ms: 0 (the default) runs whatever is queued
    as soon as the worker is free, up to max_batch; > 0 lets a batch wait for more requests until it is full or its
    oldest request has waited max_delay_ms. max_queue: the most requests waiting (not yet in an engine call);
    submit raises BatcherFull beyond it.
    on_batch: called as on_batch(size, seconds) after every engine call, failed ones included, on the worker thread
    (see add_batch_listener)."""

    def __init__(self, engine, *, max_batch=None, max_delay_ms=0.0, max_queue=1024, on_batch=None):
        if not callable(engine):
            raise TypeError(f"engine: expected an InferenceEngine or a callable, got {type(engine).__name__}")
        if max_batch is None:
            sizes = getattr(engine, "batch_sizes", None)
            max_batch = int(sizes[-1]) if sizes else DEFAULT_MAX_BATCH
        self.engine = engine
        self.max_batch = bounded_int("max_batch", max_batch, 1, sys.maxsize, "images")
        self._delay = _delay_seconds(max_delay_ms)
        self.max_delay_ms = float(max_delay_ms)
        self.max_queue = bounded_int("max_queue", max_queue, 1, sys.maxsize, "requests")
        self._cond = threading.Condition()
        self._listeners = ()  # replaced, never mutated, so the worker iterates a snapshot without the lock
        if on_batch is not None:
            self.add_batch_listener(on_batch)
        self._queue = collections.deque()
        self._queued = 0  # images in the queue
        self._closed = False
        self._in_flight = 0
        self._counts = {"requests": 0, "images": 0, "completed": 0, "errors": 0, "cancelled": 0, "rejected": 0,
                        "batches": 0, "retried_batches": 0}
        self._device = _current_cuda_device()
        self._thread = threading.Thread(target=self._run, name="resnet_native-batcher", daemon=True)
        self._thread.start()

    # -- submitting ------------------------------------------------------------------------------------------
    def submit(self, image) -> concurrent.futures.Future:
        """Queue one uint8 (32, 32, 3) image; the future resolves to its (classes,) float32 logits, or to the
        exception its engine call raised. A bad image raises here (TypeError / ValueError); BatcherFull when
        max_queue requests wait; BatcherClosed after close()."""
        return self._enqueue([_Request(check_image(image)[None], single=True)])[0]

    def submit_many(self, images) -> list:
        """Queue several images at once (a sequence of (32, 32, 3) arrays or an (N, 32, 32, 3) array): all of them
        or, when they do not all fit in the queue, none (BatcherFull). Returns one future per image, in order.
        More images than max_queue can never fit: ValueError."""
        return self._enqueue([_Request(im[None], single=True) for im in check_images(images, self.max_queue)])

    def submit_array(self, images, callback=None):
        """Queue a uint8 (N, 32, 32, 3) array as one request, run in one engine call (1 <= N <= max_batch; a
        private copy is taken). Returns a future resolving to its (N, classes) float32 logits; or, given
        callback, returns None and calls callback(rows, None) or callback(None, exception) on the worker thread
        (rows: a view, valid during the call). BatcherFull / BatcherClosed as submit_many."""
        images = check_array(images, self.max_batch)
        return self.submit_owned(images, callback)

    def submit_owned(self, images: np.ndarray, callback=None):
        """submit_array for a caller that has checked `images` (check_array) and hands it over: no copy."""
        request = _Request(images, callback=callback)
        self._enqueue([request])
        return request.future

    def _enqueue(self, requests: list) -> list:
        n = sum(len(r.images) for r in requests)
        with self._cond:
            if self._closed:
                raise BatcherClosed("Batcher: closed, no new requests are accepted")
            if self._queued + n > self.max_queue:
                self._counts["rejected"] += len(requests)
                raise BatcherFull(f"Batcher: the queue is full ({self._queued} of max_queue={self.max_queue} "
                                  f"images waiting); retry later")
            self._queue.extend(requests)
            self._queued += n
            self._counts["requests"] += len(requests)
            self._counts["images"] += n
            self._cond.notify()
        return [r.future for r in requests]

    # -- observing -------------------------------------------------------------------------------------------
    def add_batch_listener(self, callback) -> None:
        """Call callback(size, seconds) after every engine call (on the worker thread; keep it short). An exception
        it raises is logged and ignored."""
        if not callable(callback):
            raise TypeError(f"on_batch: expected a callable(size, seconds), got {type(callback).__name__}")
        with self._cond:
            self._listeners = (*self._listeners, callback)

    def remove_batch_listener(self, callback) -> None:
        with self._cond:
            self._listeners = tuple(c for c in self._listeners if c is not callback)

    @property
    def queue_depth(self) -> int:
        """Images waiting for an engine call (not those in the one running)."""
        return self._queued

    @property
    def closed(self) -> bool:
        return self._closed

    def counters(self) -> dict:
        """A snapshot: requests (accepted; submit_many counts each image as one), images (in them), completed
        (requests resolved with logits), errors (resolved with an exception), cancelled (dropped before their
        engine call), rejected (BatcherFull), batches (engine calls, the one-at-a-time re-runs included),
        retried_batches (batches re-run one request at a time after an error), queued (images waiting),
        in_flight (images in the running engine call)."""
        with self._cond:
            return dict(self._counts, queued=self._queued, in_flight=self._in_flight)

    def settings(self) -> dict:
        return {"max_batch": self.max_batch, "max_delay_ms": self.max_delay_ms, "max_queue": self.max_queue}

    # -- closing ---------------------------------------------------------------------------------------------
    def close(self, timeout=None) -> bool:
        """Stop accepting requests (submit raises BatcherClosed), finish the queued and running ones, and join the
        worker (at most `timeout` seconds; None: wait). Returns whether the worker has finished. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:  # an on_batch callback closing its own batcher
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"Batcher(max_batch={self.max_batch}, max_delay_ms={self.max_delay_ms}, max_queue={self.max_queue}, "
                f"{'closed' if self._closed else 'open'})")

    # -- the worker ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._device is not None:
                import cupy

                cupy.cuda.Device(self._device).use()
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                try:
                    self._serve(batch)
                finally:
                    with self._cond:
                        self._in_flight = 0
        except BaseException as e:  # a bug here must not leave callers waiting forever on their futures
            _log.exception("Batcher: the worker thread failed")
            with self._cond:
                self._closed = True
                left = list(self._queue)
                self._queue.clear()
                self._queued = 0
            for r in left:
                if r.start():
                    r.fail(BatcherClosed(f"Batcher: the worker thread failed: {e!r}"))
            raise

    def _next_batch(self):
        """Wait for a request, then take queued requests in order while their images fit in max_batch (at least
        one). With max_delay_ms > 0, first wait until max_batch images are queued, the oldest has waited
        max_delay_ms, or the batcher is closing (queued work then runs at once). None: closed and drained."""
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            if self._delay > 0:
                deadline = self._queue[0].queued_at + self._delay
                while self._queued < self.max_batch and not self._closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            batch = [self._queue.popleft()]
            images = len(batch[0].images)
            while self._queue and images + len(self._queue[0].images) <= self.max_batch:
                images += len(self._queue[0].images)
                batch.append(self._queue.popleft())
            self._queued -= images
            self._in_flight = images
        # A request whose caller gave up (future cancelled, e.g. its HTTP client went away) is dropped here;
        # the others are marked running so they can no longer be cancelled halfway through their call.
        live = [r for r in batch if r.start()]
        if len(live) < len(batch):
            with self._cond:
                self._counts["cancelled"] += len(batch) - len(live)
        return live

    def _serve(self, batch: list) -> None:
        if not batch:
            return
        try:
            logits = self._call(batch)
        except Exception as e:
            if len(batch) == 1:
                self._finish(batch[0], None, e)
                return
            # Which request broke the batch is unknown: re-run each alone so only the failing ones fail.
            with self._cond:
                self._counts["retried_batches"] += 1
            for r in batch:
                try:
                    rows = self._call([r])
                except Exception as single:
                    self._finish(r, None, single)
                else:
                    self._finish(r, rows, None)
            return
        start = 0
        for r in batch:
            self._finish(r, logits[start:start + len(r.images)], None)
            start += len(r.images)

    def _call(self, batch: list) -> np.ndarray:
        x = batch[0].images if len(batch) == 1 else np.concatenate([r.images for r in batch])
        start = time.perf_counter()
        try:
            return _to_host_logits(self.engine(x), len(x))
        finally:  # a failed call is reported too: it took the engine's time all the same
            seconds = time.perf_counter() - start
            with self._cond:
                self._counts["batches"] += 1
            for callback in self._listeners:
                try:
                    callback(len(x), seconds)
                except Exception:
                    _log.exception("Batcher: an on_batch callback raised (ignored)")

    # Counted before the request is resolved: a caller that has its answer then always finds it in counters().
    def _finish(self, request: _Request, rows, error) -> None:
        with self._cond:
            self._counts["completed" if error is None else "errors"] += 1
        try:
            if error is None:
                request.resolve(rows)
            else:
                request.fail(error)
        except Exception:  # a caller's callback: its failure must not stop the batcher or its batch
            _log.exception("Batcher: a request's callback raised (ignored)")
