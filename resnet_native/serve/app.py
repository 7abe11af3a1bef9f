"""The HTTP application: POST /predict, GET /health, GET /metrics, and the Open Inference Protocol's /v2 routes
(kserve_http.py), in front of a Batcher.

    app = make_app(batcher, clf.classes, max_upload_bytes=1 << 20)
    web.run_app(app, host="127.0.0.1", port=8000)          # or resnet_native.serve.server / python -m ...

The event loop never runs the model: a handler awaits the batcher's future (asyncio.wrap_future) and the batcher's
worker thread makes the engine call. Every error is JSON {"error": ...} with its status (400 bad image, 413 over
the upload limit, 415 another content type, 500 an engine failure, 503 with Retry-After when the batcher is full
or closing). Metrics live on a per-app prometheus_client registry, so several apps in one process never share
counters.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

try:
    from aiohttp import BodyPartReader, hdrs, web
    from aiohttp.http_exceptions import HttpProcessingError
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.exposition import choose_encoder
except ImportError as e:  # the server is an optional extra; the Batcher itself needs neither
    raise ImportError(f"resnet_native.serve: the HTTP server needs aiohttp and prometheus_client ({e.name} is not "
                      f'installed): pip install "resnet_native[serve]"') from e

import numpy as np

from .._core.names import flag, whole_number
from ..release.classifier import softmax
from .batcher import BatcherClosed, BatcherFull
from .images import DEFAULT_MAX_PIXELS, ImageError, check_content_type, decode_image, media_type
from .kserve import KServeModel, ProtocolError
from .kserve_http import add_routes

DEFAULT_MODEL_NAME = "resnet_native"  # the v2 protocol's model name when the caller gives none
DEFAULT_MAX_UPLOAD_BYTES = 8 * 1024 * 1024  # a whole request: one image, or every part of a multipart batch
RETRY_AFTER_S = 1  # what a 503 tells a client to wait: a full queue drains within a few batches
_CHUNK = 64 * 1024
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_log = logging.getLogger(__name__)


class Refused(Exception):
    """A request answered with an error status and a JSON {"error": message}; `reason` labels the error metric."""

    def __init__(self, status: int, message: str, reason: str, headers=None):
        super().__init__(message)
        self.status, self.reason, self.headers = status, reason, headers or {}


_IMAGE_REASONS = {400: "bad_image", 413: "too_large", 415: "unsupported_type"}
_PROTOCOL_REASONS = {400: "v2_bad_request", 404: "v2_not_found", 500: "inference", 503: "queue_full"}


def _from_image_error(e: ImageError, prefix: str = "") -> Refused:
    return Refused(e.status, prefix + str(e), _IMAGE_REASONS.get(e.status, "bad_image"))


class Metrics:
    """The app's Prometheus metrics, on its own registry."""

    def __init__(self, registry, batcher):
        self.requests = Counter("resnet_native_http_requests", "HTTP requests answered, by route and status code",
                                ["handler", "code"], registry=registry)
        self.latency = Histogram("resnet_native_http_request_duration_seconds",
                                 "Time from receiving a request to its answer, by route", ["handler"],
                                 buckets=_LATENCY_BUCKETS, registry=registry)
        self.errors = Counter("resnet_native_errors", "Requests refused or failed, by reason", ["reason"],
                              registry=registry)
        self.images = Counter("resnet_native_images", "Images classified", registry=registry)
        self.batch_size = Histogram("resnet_native_batch_size", "Images per engine call", buckets=_BATCH_BUCKETS,
                                    registry=registry)
        self.batch_seconds = Histogram("resnet_native_batch_duration_seconds", "Time of one engine call",
                                       buckets=_LATENCY_BUCKETS, registry=registry)
        self.queue_depth = Gauge("resnet_native_queue_depth", "Requests waiting in the batcher's queue",
                                 registry=registry)
        self.queue_depth.set_function(lambda: batcher.queue_depth)  # read at scrape time, no bookkeeping

    def answered(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_batch(self, size: int, seconds: float) -> None:  # the batcher's listener, on its worker thread
        self.batch_size.observe(size)
        self.batch_seconds.observe(seconds)


class _State:
    def __init__(self, batcher, classes, max_upload_bytes, resize, max_pixels, model, registry):
        self.batcher, self.classes, self.resize, self.max_pixels = batcher, tuple(classes), resize, max_pixels
        self.max_upload_bytes, self.model, self.registry = max_upload_bytes, model, registry
        self.metrics = Metrics(registry, batcher)


STATE = web.AppKey("resnet_native_serve", _State)


def make_app(batcher, classes, *, max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES, resize: bool = False,
             registry=None, model=None, max_pixels: int = DEFAULT_MAX_PIXELS,
             model_name: str = DEFAULT_MODEL_NAME) -> web.Application:
    """The aiohttp application serving `batcher` (a resnet_native.serve.Batcher; the caller owns and closes it).
    classes: the class names, index = class id. max_upload_bytes: the most bytes one request may carry. resize:
    accept images of other sizes and resize them to 32x32 (else 400). registry: the prometheus_client
    CollectorRegistry the metrics go to (default: a new one for this app). model: what /health says the model is
    (a JSON-able value, e.g. the release's name and device). max_pixels: the largest declared image decoded.
    model_name: the model's name on the /v2 routes (the Open Inference Protocol; its one version is "1")."""
    max_upload_bytes = whole_number("max_upload_bytes", max_upload_bytes, 1)
    max_pixels = whole_number("max_pixels", max_pixels, 1)
    resize = flag("resize", resize)
    classes = tuple(classes)
    if not classes:
        raise ValueError("classes: expected the class names, got none")
    state = _State(batcher, classes, max_upload_bytes, resize, max_pixels, model,
                   CollectorRegistry() if registry is None else registry)
    app = web.Application(client_max_size=max_upload_bytes, middlewares=[_answer_and_count])
    app[STATE] = state
    app.router.add_post("/predict", predict)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    batcher.add_batch_listener(state.metrics.observe_batch)
    kserve = KServeModel(batcher, name=model_name, classes=classes, resize=resize, max_pixels=max_pixels)
    add_routes(app, kserve)
    kserve.attach()

    async def _detach(app):  # a batcher outliving this app no longer feeds its metrics
        batcher.remove_batch_listener(state.metrics.observe_batch)
        kserve.detach()

    app.on_cleanup.append(_detach)
    return app


# -- middleware: JSON errors and the request metrics --------------------------------------------------------


def _error(status: int, message: str, headers=None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def refusal(state: _State, e: Exception, method: str, path: str) -> tuple:
    """(status, message, headers) answering what a handler raised, counted in the error metric by reason. Any
    exception: a bug is logged and answered 500, and the server keeps serving."""
    if isinstance(e, Refused):
        reason, status, message, headers = e.reason, e.status, str(e), e.headers
    elif isinstance(e, ProtocolError):  # the /v2 routes' refusals
        reason, status, message = _PROTOCOL_REASONS.get(e.status, "v2_bad_request"), e.status, str(e)
        headers = {hdrs.RETRY_AFTER: str(RETRY_AFTER_S)} if e.status == 503 else {}
    elif isinstance(e, web.HTTPException):  # aiohttp's own: 404, 405, 413 from client_max_size, ...
        reason, status, message = {413: "too_large"}.get(e.status, "http"), e.status, e.text or e.reason
        headers = {k: v for k, v in e.headers.items() if k in (hdrs.ALLOW, hdrs.RETRY_AFTER)}
    else:
        _log.error("resnet_native.serve: %s %s failed", method, path, exc_info=e)
        reason, status, message, headers = "internal", 500, f"internal error: {type(e).__name__}", {}
    state.metrics.errors.labels(reason).inc()
    return status, message, headers


@web.middleware
async def _answer_and_count(request: web.Request, handler):
    state = request.app[STATE]
    start = time.perf_counter()
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"  # bounded label values, never raw paths
    try:
        response = await handler(request)
    except Exception as e:
        response = _error(*refusal(state, e, request.method, request.path))
    state.metrics.answered(route, response.status, time.perf_counter() - start)
    return response


# -- POST /predict -------------------------------------------------------------------------------------------


async def predict(request: web.Request) -> web.Response:
    """One image as the body (image/png or image/jpeg) -> {"class", "name", "probabilities"}; several as
    multipart/form-data parts (each its own Content-Type) -> {"predictions": [...]}, one per part in order. A
    multipart request's images are queued together (all or none), so one request never holds half of the queue
    while the rest is refused. A client that disconnects costs only its own request: an unfinished body ends the
    handler; a queued request still runs (aiohttp does not cancel handlers) and its answer is dropped with the
    connection; were the handler cancelled, the batcher would skip its cancelled future."""
    state = request.app[STATE]
    if request.content_length is not None and request.content_length > state.max_upload_bytes:
        raise Refused(413, f"request body of {request.content_length} bytes: more than the {state.max_upload_bytes} "
                           "bytes allowed", "too_large")
    kind = media_type(request.headers.get(hdrs.CONTENT_TYPE))
    if kind == "multipart/form-data":
        images = await _read_multipart(request, state)
    else:
        try:
            check_content_type(kind)
        except ImageError as e:
            raise _from_image_error(e) from None
        images = [await _decode(state, await _read_body(request), kind)]
    rows = await _classify(state, images)
    state.metrics.images.inc(len(rows))
    answers = [_answer(state.classes, row) for row in rows]
    return web.json_response(answers[0] if kind != "multipart/form-data" else {"predictions": answers})


def _disconnected() -> Refused:
    """The client went away mid-body: nobody is left to answer, but the handler must end."""
    return Refused(400, "the request body ended early (client disconnected)", "disconnected")


async def _read_body(request: web.Request) -> bytes:
    try:
        return await request.read()  # client_max_size: HTTPRequestEntityTooLarge (413) past the limit
    except ConnectionError:
        raise _disconnected() from None


async def _read_multipart(request: web.Request, state: _State) -> list:
    """Every part of a multipart/form-data body, decoded; the parts' bytes together stay under the upload limit
    (counted here: aiohttp's client_max_size limits plain bodies only)."""
    images, total = [], 0
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            n = len(images) + 1
            if not isinstance(part, BodyPartReader):
                raise Refused(400, f"part {n}: a nested multipart body, expected an image", "bad_request")
            try:
                kind = media_type(part.headers.get(hdrs.CONTENT_TYPE))
                check_content_type(kind)
            except ImageError as e:
                raise _from_image_error(e, f"part {n}: ") from None
            chunks = []
            while chunk := await part.read_chunk(_CHUNK):
                total += len(chunk)
                if total > state.max_upload_bytes:
                    raise Refused(413, f"multipart body: more than the {state.max_upload_bytes} bytes allowed",
                                  "too_large")
                chunks.append(chunk)
            try:
                images.append(await _decode(state, b"".join(chunks), kind))
            except Refused as e:
                raise Refused(e.status, f"part {n}: {e}", e.reason) from None
    except ConnectionError:
        raise _disconnected() from None
    except (ValueError, AssertionError) as e:  # aiohttp's parser on a malformed body (no boundary, bad framing)
        raise Refused(400, f"malformed multipart/form-data body ({e})", "bad_request") from None
    except HttpProcessingError as e:
        # aiohttp's own bounds on a part's headers (at most max_headers lines of max_field_size bytes, 128 and
        # 8190 by default) and on every line around the parts (the preamble, the epilogue after the closing
        # boundary): past them, a 400 naming which, never a 500.
        message = " ".join(str(e.message).split(": b'")[0].split())[:200]  # one line, without the client's bytes
        raise Refused(400, f"malformed multipart/form-data body ({type(e).__name__}: {message})",
                      "bad_request") from None
    if not images:
        raise Refused(400, "multipart/form-data body without parts: expected one image per part", "bad_request")
    return images


async def _decode(state: _State, data: bytes, kind: str) -> np.ndarray:
    decode = functools.partial(decode_image, data, kind, resize=state.resize, max_pixels=state.max_pixels)
    try:
        if not state.resize:
            # Only 32x32 images get past the header check: decoding one takes microseconds, less than a hop to a
            # thread, so it stays on the loop.
            return decode()
        # With resize an image may be megapixels: decode and resize off the loop so other requests keep moving.
        return await asyncio.get_running_loop().run_in_executor(None, decode)
    except ImageError as e:
        raise _from_image_error(e) from None


def _unavailable(e: Exception) -> Refused:
    """503 with Retry-After: the queue is full (BatcherFull) or the batcher is closing (BatcherClosed)."""
    if isinstance(e, BatcherFull):
        return Refused(503, str(e), "queue_full", {hdrs.RETRY_AFTER: str(RETRY_AFTER_S)})
    return Refused(503, f"the server is shutting down ({e})", "closing", {hdrs.RETRY_AFTER: str(RETRY_AFTER_S)})


async def _classify(state: _State, images: list) -> list:
    """The images' logit rows, in order: one batcher request per max_batch images (each runs in one engine call)."""
    batcher = state.batcher
    if len(images) > batcher.max_queue:
        raise Refused(413, f"{len(images)} images in one request: more than the server's queue holds "
                           f"(max_queue={batcher.max_queue})", "too_large")
    x, step = np.stack(images), batcher.settings()["max_batch"]
    futures = []
    try:
        for i in range(0, len(x), step):
            futures.append(batcher.submit_array(x[i:i + step]))
    except (BatcherFull, BatcherClosed) as e:
        for f in futures:
            f.cancel()
        raise _unavailable(e) from None
    try:
        # Cancelling this (a cancelled handler) cancels the wrapped futures too: those not yet run are skipped.
        rows = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    except (BatcherFull, BatcherClosed) as e:  # a RemoteBatcher's (--workers) refusal arrives in the future
        raise _unavailable(e) from None
    except Exception as e:
        raise Refused(500, f"inference failed: {type(e).__name__}: {e}", "inference") from None
    return list(np.concatenate(rows))


def _answer(classes: tuple, logits: np.ndarray) -> dict:
    p = softmax(logits)
    k = int(np.argmax(logits))
    return {"class": k, "name": classes[k] if k < len(classes) else str(k), "probabilities": [float(v) for v in p]}


# -- GET /health, GET /metrics -------------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    closing = state.batcher.closed
    body = {"status": "closing" if closing else "ok", "model": state.model, "classes": list(state.classes),
            "batcher": {**state.batcher.settings(), **state.batcher.counters()}}
    return web.json_response(body, status=503 if closing else 200)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    encoder, content_type = choose_encoder(request.headers.get(hdrs.ACCEPT, ""))
    return web.Response(body=encoder(state.registry), headers={hdrs.CONTENT_TYPE: content_type})
