"""resnet_native.serve: a released model over HTTP, with dynamic batching.

    python -m resnet_native.serve --release cifar10_models/version_A          # README: Serving over HTTP

    from resnet_native.serve import Batcher
    with Batcher(engine, max_batch=256) as batcher:        # engine: InferenceEngine or callable
        logits = batcher.submit(image).result()

One piece per file: batcher, images (upload bytes -> uint8 32x32 RGB), app (aiohttp: /predict, /health, /metrics),
kserve (the Open Inference Protocol's model, inputs, outputs, statistics) and kserve_http (its /v2 REST routes),
server and http_front (httptools connections: the v2 infer route answered there, the rest relayed to the app),
workers (several HTTP processes, one engine), cli, fake_engine (a stand-in with a set cost, for load tests
and tests without a GPU). Importing this package or the Batcher needs neither aiohttp nor prometheus_client; the
app, the server and the command do, and say `pip install "resnet_native[serve]"` when they are missing.
"""

from .batcher import DEFAULT_MAX_BATCH, Batcher, BatcherClosed, BatcherFull
from .fake_engine import FakeEngine
from .images import ImageError, decode_image


def __getattr__(name):
    if name == "make_app":
        from .app import make_app  # lazy: the app needs the serve extra (aiohttp); the Batcher does not

        return make_app
    raise AttributeError(f"module 'resnet_native.serve' has no attribute {name!r}")


__all__ = ["DEFAULT_MAX_BATCH", "Batcher", "BatcherClosed", "BatcherFull", "FakeEngine", "ImageError",
           "decode_image", "make_app"]
