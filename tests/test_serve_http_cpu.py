"""The HTTP server without a GPU (FakeEngine behind a Batcher, the app on 127.0.0.1 with a free port): predictions
for PNG, JPEG and multipart batches, /health, /metrics, every malformed request answered with its 4xx while the
server keeps serving, clients that disconnect, 503 when the queue is full, and the missing-extra ImportError."""

import asyncio
import io
import logging
import socket
import struct
import zlib

import numpy as np
import pytest
from PIL import Image
from serve_helpers import BAD, WAIT_S, GatedEngine, PickyEngine, encode, images, multipart, request

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from resnet_native.release.classifier import load_image, softmax  # noqa: E402
from resnet_native.serve import Batcher, FakeEngine, make_app  # noqa: E402
from resnet_native.serve.server import ServerThread  # noqa: E402

CLASSES = tuple(f"class{i}" for i in range(10))
LIMIT = 64 * 1024


@pytest.fixture
def start():
    """start(engine=None, batcher=None, **make_app kwargs) -> (ServerThread, Batcher); both closed afterwards."""
    running = []

    def start_(engine=None, batcher=None, **kwargs):
        batcher = batcher or Batcher(engine or FakeEngine(), max_delay_ms=1.0)
        kwargs.setdefault("max_upload_bytes", LIMIT)
        server = ServerThread(make_app(batcher, CLASSES, **kwargs))
        running.append((server, batcher))
        return server, batcher

    yield start_
    for server, batcher in running:
        server.stop()
        batcher.close()


def predict(server, body, content_type="image/png", **kwargs):
    return request(server.port, "POST", "/predict", body, {"Content-Type": content_type}, **kwargs)


def assert_answer(answer, logits):
    k = int(np.argmax(logits))
    assert answer["class"] == k and answer["name"] == CLASSES[k]
    np.testing.assert_allclose(answer["probabilities"], softmax(logits), rtol=1e-6, atol=1e-30)


def assert_serving(server, rng):
    image = images(rng, 1)[0]
    status, _, body = predict(server, encode(image))
    assert status == 200, body
    assert_answer(body, FakeEngine().expected_logits(image[None])[0])


def test_predict_png_and_jpeg(start, rng):
    server, batcher = start()
    engine = FakeEngine()
    image = images(rng, 1)[0]
    status, headers, body = predict(server, encode(image))
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert_answer(body, engine.expected_logits(image[None])[0])
    jpeg = encode(image, "JPEG", quality=90)
    status, _, body = predict(server, jpeg, "image/jpeg")
    decoded = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))  # JPEG is lossy: what the server decoded
    assert status == 200
    assert_answer(body, engine.expected_logits(decoded[None])[0])
    grey = encode(image[..., 0])  # an L-mode PNG: expanded to R = G = B
    status, _, body = predict(server, grey, "image/PNG; charset=binary")
    assert status == 200
    assert_answer(body, engine.expected_logits(np.stack([image[..., 0]] * 3, -1)[None])[0])


def test_multipart_batch_in_order(start, rng):
    server, batcher = start()
    x = images(rng, 5)
    body, content_type = multipart([("image/png", encode(im)) for im in x])
    status, _, answer = predict(server, body, content_type)
    assert status == 200 and len(answer["predictions"]) == 5
    for a, logits in zip(answer["predictions"], FakeEngine().expected_logits(x), strict=True):
        assert_answer(a, logits)

    async def with_aiohttp():  # what a real client library sends
        import aiohttp

        form = aiohttp.FormData()
        for i, im in enumerate(x[:3]):
            form.add_field("image", encode(im), filename=f"{i}.png", content_type="image/png")
        async with aiohttp.ClientSession() as s, s.post(server.url + "/predict", data=form) as r:
            return r.status, await r.json()

    status, answer = asyncio.run(with_aiohttp())
    assert status == 200 and [a["class"] for a in answer["predictions"]] == [
        int(np.argmax(v)) for v in FakeEngine().expected_logits(x[:3])]


def test_health(start, rng):
    server, batcher = start(model={"release": "version_A", "device": "host"})
    assert_serving(server, rng)
    status, _, body = request(server.port, "GET", "/health")
    assert status == 200 and body["status"] == "ok" and body["model"] == {"release": "version_A", "device": "host"}
    assert body["classes"] == list(CLASSES)
    assert body["batcher"]["requests"] == body["batcher"]["completed"] == 1 and body["batcher"]["max_queue"] == 1024


def test_metrics(start, rng):
    from prometheus_client.parser import text_string_to_metric_families

    server, batcher = start()
    for _ in range(3):
        assert_serving(server, rng)
    assert predict(server, b"junk")[0] == 400
    status, headers, text = request(server.port, "GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("resnet_native_http_requests_total", (("code", "200"), ("handler", "/predict")))] == 3
    assert samples[("resnet_native_http_requests_total", (("code", "400"), ("handler", "/predict")))] == 1
    assert samples[("resnet_native_errors_total", (("reason", "bad_image"),))] == 1
    assert samples[("resnet_native_images_total", ())] == 3
    assert samples[("resnet_native_batch_size_count", ())] == batcher.counters()["batches"] == 3
    assert samples[("resnet_native_batch_size_sum", ())] == 3
    assert samples[("resnet_native_http_request_duration_seconds_count", (("handler", "/predict"),))] == 4
    assert samples[("resnet_native_queue_depth", ())] == 0
    assert ("resnet_native_batch_duration_seconds_count", ()) in samples
    # Another app has its own registry: nothing counted twice, nothing shared.
    other, _ = start()
    _, _, text = request(other.port, "GET", "/metrics")
    assert 'resnet_native_http_requests_total{code="200",handler="/predict"}' not in text


def _png_header_only(width, height):
    """A PNG whose header declares width x height pixels and that holds no pixel data (a bomb's first bytes)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IEND", b""))


def test_malformed_requests_get_their_4xx_and_the_server_keeps_serving(start, rng):
    server, batcher = start()
    good = encode(images(rng, 1)[0])
    big = encode(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    cases = [
        (b"hello, not an image", "image/png", 400, "not a PNG image"),
        (good[: len(good) // 2], "image/png", 400, "could not decode"),  # truncated
        (good, "image/jpeg", 400, "not a JPEG image"),  # a PNG labelled JPEG
        (b"", "image/png", 400, "empty body"),
        (good, "text/plain", 415, "unsupported content type 'text/plain'"),
        (good, "image/gif", 415, "image/png, image/jpeg"),
        (big, "image/png", 400, "64x48"),
        (_png_header_only(10000, 5000), "image/png", 400, "10000x5000"),
        (_png_header_only(50000, 50000), "image/png", 400, "more pixels than this server decodes"),
        (b"\0" * (LIMIT + 1), "image/png", 413, f"more than the {LIMIT} bytes"),
        (multipart([("image/png", good), ("text/plain", b"x")])[0], multipart([])[1], 415, "part 2"),
        (multipart([("image/png", good), ("image/png", b"junk")])[0], multipart([])[1], 400, "part 2: not a PNG"),
        (multipart([("image/png", good), (None, good)])[0], multipart([])[1], 415, "part 2"),
        (multipart([])[0], multipart([])[1], 400, "without parts"),
        (b"--x\r\n\r\n", "multipart/form-data", 400, "multipart"),  # no boundary
        (multipart([("image/png", good)] * 40)[0], multipart([])[1], 413, "more than the"),  # by Content-Length
    ]
    for body, content_type, want, message in cases:
        status, headers, answer = predict(server, body, content_type)
        assert (status, set(answer)) == (want, {"error"}), (content_type, message, answer)
        assert message in answer["error"], answer
        assert_serving(server, rng)
    # Chunked bodies have no Content-Length: the server counts what arrives, for a plain body and for a multipart
    # one whose parts each fit while their sum does not.
    status, _, answer = predict(server, iter([b"\0" * 4096] * 32), chunked=True)
    assert status == 413 and "error" in answer
    body, content_type = multipart([("image/png", good)] * 40)
    status, _, answer = predict(server, iter([body]), content_type, chunked=True)
    assert status == 413 and "request body: more than the" in answer["error"]
    assert request(server.port, "GET", "/predict")[:1] == (405,)
    status, _, answer = request(server.port, "GET", "/nope")
    assert status == 404 and "error" in answer
    assert_serving(server, rng)
    assert batcher.counters()["errors"] == 0  # none of them reached the engine


def test_resize_and_the_pixel_limit(start, rng):
    server, _ = start(resize=True, max_pixels=100 * 100)
    picture = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    status, _, answer = predict(server, encode(picture))
    assert status == 200
    assert_answer(answer, FakeEngine().expected_logits(load_image(picture)[None])[0])  # as CIFAR10Classifier
    status, _, answer = predict(server, encode(rng.integers(0, 256, (101, 100, 3), dtype=np.uint8)))
    assert status == 400 and "100x101 pixels: more than the 10000 pixels" in answer["error"]
    assert_serving(server, rng)


def test_an_engine_error_is_a_500_for_that_request_only(start, rng):
    server, batcher = start(PickyEngine())
    x = images(rng, 3, bad=(1,))
    body, content_type = multipart([("image/png", encode(im)) for im in x])
    status, _, answer = predict(server, body, content_type)
    assert status == 500 and "picky" in answer["error"]
    status, _, answer = predict(server, encode(x[0]))
    assert status == 200
    assert BAD == x[1, 0, 0, 0]


def test_503_with_retry_after_when_the_queue_is_full(start, rng):
    engine = GatedEngine()
    batcher = Batcher(engine, max_batch=1, max_delay_ms=0, max_queue=1)
    server, _ = start(batcher=batcher)
    x = images(rng, 2)
    held = [batcher.submit(x[0])]
    assert engine.started.wait(WAIT_S)
    held.append(batcher.submit(x[1]))  # the one place in the queue
    status, headers, answer = predict(server, encode(x[0]))
    assert status == 503 and headers["Retry-After"] == "1" and "queue is full" in answer["error"]
    engine.gate.set()
    for f in held:
        f.result(WAIT_S)
    assert_serving(server, rng)


def _raw_request(port, head: bytes, body: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    s.sendall(head + body)
    return s


def test_clients_that_disconnect_mid_request(start, rng, caplog):
    caplog.set_level(logging.ERROR)
    engine = GatedEngine()
    server, batcher = start(engine)
    good = encode(images(rng, 1)[0])
    # Headers and part of the body, then gone.
    head = (f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: {len(good)}\r\n"
            "\r\n").encode()
    _raw_request(server.port, head, good[:20]).close()
    # A whole request, gone while its image waits in the engine: the answer is dropped.
    s = _raw_request(server.port, head, good)
    assert engine.started.wait(WAIT_S)
    s.close()
    engine.gate.set()
    assert_serving(server, rng)
    assert batcher.counters()["completed"] == 2
    metrics = request(server.port, "GET", "/metrics")[2]
    assert 'resnet_native_errors_total{reason="disconnected"} 1.0' in metrics
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_without_the_serve_extra_the_app_says_what_to_install(tmp_path):
    from conftest import run_child

    script = ("import sys\nsys.modules['aiohttp'] = None\n"
              "from resnet_native.serve import Batcher\n"
              "try:\n    import resnet_native.serve.app\nexcept ImportError as e:\n    print(e)\n")
    stdout = run_child(script, tmp_path)
    assert 'pip install "resnet_native[serve]"' in stdout and "aiohttp" in stdout
