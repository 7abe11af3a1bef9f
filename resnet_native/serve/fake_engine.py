"""FakeEngine: a stand-in for an InferenceEngine in load tests and CPU tests, where there is no GPU.

    engine = FakeEngine(fixed_ms=20.0, per_image_ms=0.1)   # a call sleeps 20 ms + 0.1 ms per image
    Batcher(engine)                                         # max_batch: engine.batch_sizes[-1]

Its cost model is the one that makes batching pay on a GPU: a large fixed cost per call (launches, copies, the
host synchronisation) and a small one per image. time.sleep releases the GIL like a GPU wait does, so the server's
event loop keeps running during a call. The logits depend on each image (the float values of its first `classes`
bytes, red, green, blue of pixel (0, 0), then pixel (0, 1), ...), so a test can tell every row of a batch apart and
check that each request got its own. Like an InferenceEngine it is not thread-safe: it counts overlapping calls in
`max_concurrent_calls` so a test can check that only one thread ever calls it.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from .batcher import IMAGE_SHAPE


class FakeEngine:
    def __init__(self, fixed_ms: float = 0.0, per_image_ms: float = 0.0, *, classes: int = 10,
                 batch_sizes=(1, 8, 32, 256)):
        if fixed_ms < 0 or per_image_ms < 0:
            raise ValueError(f"fixed_ms, per_image_ms: expected >= 0, got {fixed_ms}, {per_image_ms}")
        if not 1 <= classes <= int(np.prod(IMAGE_SHAPE)):
            raise ValueError(f"classes: expected 1 to {int(np.prod(IMAGE_SHAPE))}, got {classes}")
        self.fixed_s, self.per_image_s, self.num_classes = fixed_ms / 1000.0, per_image_ms / 1000.0, classes
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.calls = []  # the size of every batch it was given, in order
        self.max_concurrent_calls = 0
        self._active = 0
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, text: str, **kwargs) -> FakeEngine:
        """'A,B' (fixed ms, ms per image), as benchmarks/bench_serve.py --fake-engine-ms takes it."""
        try:
            fixed, per_image = (float(v) for v in text.split(","))
        except ValueError:
            raise ValueError(f"fake engine: expected 'FIXED_MS,PER_IMAGE_MS' like '20,0.1', got {text!r}") from None
        return cls(fixed, per_image, **kwargs)

    def expected_logits(self, images) -> np.ndarray:
        """What a call returns for `images` (uint8 (N, 32, 32, 3)), without the wait."""
        x = np.asarray(images)
        return x.reshape(len(x), -1)[:, : self.num_classes].astype(np.float32)

    def __call__(self, images) -> np.ndarray:
        x = np.asarray(images)
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != IMAGE_SHAPE:
            raise ValueError(f"x: expected uint8 (N, {', '.join(map(str, IMAGE_SHAPE))}), got {x.dtype} {x.shape}")
        with self._lock:
            self._active += 1
            self.max_concurrent_calls = max(self.max_concurrent_calls, self._active)
            self.calls.append(len(x))
        try:
            time.sleep(self.fixed_s + self.per_image_s * len(x))
            return self.expected_logits(x)
        finally:
            with self._lock:
                self._active -= 1

    def __repr__(self):
        return f"FakeEngine({self.fixed_s * 1e3:g} ms + {self.per_image_s * 1e3:g} ms/image)"
