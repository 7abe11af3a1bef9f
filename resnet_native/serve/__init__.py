"""resnet_native.serve: a released model over HTTP, with dynamic batching.

    python -m resnet_native.serve --release cifar10_models/version_A          # README: Serving over HTTP

    from resnet_native.serve import Batcher
    with Batcher(engine, max_batch=256, max_delay_ms=2.0) as batcher:        # engine: InferenceEngine or callable
        logits = batcher.submit(image).result()

Pieces, one per file: batcher (requests from any thread grouped into engine calls on one worker thread), images
(upload bytes -> uint8 32x32 RGB, refusing what must not be decoded), app (the aiohttp application: /predict,
/health, /metrics), server (running an app on a loop or in a thread), cli (the command), fake_engine (a stand-in
engine with a set cost per call and per image, for load tests and tests without a GPU).

Importing this package or the Batcher needs neither aiohttp nor prometheus_client (the serve extra); the app,
the server and the command do, and say `pip install "resnet_native[serve]"` when they are missing.
"""

from .batcher import DEFAULT_MAX_BATCH, Batcher, BatcherClosed, BatcherFull
from .fake_engine import FakeEngine
from .images import ImageError, decode_image


def __getattr__(name):
    if name == "make_app":  # imported on first use: it needs the serve extra
        from .app import make_app

        return make_app
    raise AttributeError(f"module 'resnet_native.serve' has no attribute {name!r}")


__all__ = ["DEFAULT_MAX_BATCH", "Batcher", "BatcherClosed", "BatcherFull", "FakeEngine", "ImageError",
           "decode_image", "make_app"]
