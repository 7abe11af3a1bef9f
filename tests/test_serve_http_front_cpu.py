"""The HTTP front (serve/http_front.py: httptools, the v2 infer route answered itself, the rest relayed to the aiohttp
app) on raw sockets: pipelined requests of both kinds answered in order on one connection, HTTP/1.0, HEAD,
Expect: 100-continue, chunked bodies, the limits on the URL, the headers and the body (414, 431, 413, each answered
before closing), malformed HTTP, and the graceful shutdown of a request in flight."""

import json
import socket
import threading
import time

import numpy as np
import pytest
from serve_helpers import WAIT_S, GatedEngine, encode, images, request

pytest.importorskip("aiohttp")
pytest.importorskip("httptools")
pytest.importorskip("prometheus_client")

from resnet_native.serve import Batcher, FakeEngine, make_app  # noqa: E402
from resnet_native.serve.http_front import MAX_HEADERS, MAX_URL_BYTES  # noqa: E402
from resnet_native.serve.server import ServerThread  # noqa: E402

CLASSES = tuple(f"class{i}" for i in range(10))
LIMIT = 64 * 1024
INFER = "/v2/models/resnet_native/infer"


@pytest.fixture
def start():
    running = []

    def start_(engine=None, **kwargs):
        batcher = Batcher(engine or FakeEngine(), max_delay_ms=1.0)
        server = ServerThread(make_app(batcher, CLASSES, max_upload_bytes=LIMIT), shutdown_timeout=2.0, **kwargs)
        running.append((server, batcher))
        return server

    yield start_
    for server, batcher in running:
        server.stop()
        batcher.close()


def _infer_request(x: np.ndarray, *, version: bool = False, extra: str = "") -> bytes:
    body = json.dumps({"inputs": [{"name": "images", "datatype": "UINT8", "shape": list(x.shape),
                                   "data": x.ravel().tolist()}]}).encode()
    path = INFER.replace("/infer", "/versions/1/infer") if version else INFER
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}\r\n").encode() + body


def _read_answers(sock, count: int) -> list:
    """`count` whole answers read off `sock`: [(status, headers (lower-case names), body bytes)]."""
    sock.settimeout(WAIT_S)
    data, answers = b"", []
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(answers)} of {count} answers"
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = dict((k.lower(), v.strip()) for k, v in (line.split(":", 1) for line in lines[1:]))
        length = int(headers.get("content-length", 0))
        while len(data) < length:
            chunk = sock.recv(65536)
            assert chunk, "closed mid-answer"
            data += chunk
        answers.append((int(lines[0].split()[1]), headers, data[:length]))
        data = data[length:]
    return answers


def _closed(sock) -> bool:
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_pipelined_requests_of_both_kinds_answered_in_order(start, rng):
    server = start()
    x = images(rng, 3)
    want = FakeEngine().expected_logits(x)
    wire = (_infer_request(x[:1]) + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + _infer_request(x[1:], version=True)
            + b"GET /v2/models/resnet_native HTTP/1.1\r\nHost: x\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(wire)  # all four at once: the server frames them
        answers = _read_answers(s, 4)
        assert [a[0] for a in answers] == [200, 200, 200, 200]
        first, health, second, meta = (json.loads(a[2]) for a in answers)
        np.testing.assert_allclose(first["outputs"][0]["data"], want[:1].ravel(), rtol=1e-6)
        np.testing.assert_allclose(second["outputs"][0]["data"], want[1:].ravel(), rtol=1e-6)
        assert health["status"] == "ok" and meta["name"] == "resnet_native"
        assert all("date" in a[1] and "connection" not in a[1] for a in answers)
        s.sendall(_infer_request(x[:1]))  # the connection stays open for more
        assert _read_answers(s, 1)[0][0] == 200
    metrics = request(server.port, "GET", "/metrics")[2]
    assert 'handler="/v2/models/{model}/infer"' in metrics and 'handler="/v2/models/{model}/versions/{version}/infer"'
    assert 'resnet_native_http_requests_total{code="200",handler="/health"}' in metrics


def test_http10_head_continue_and_chunked(start, rng):
    server = start()
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # HTTP/1.0 without keep-alive: closed after
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        (status, headers, _), = _read_answers(s, 1)
        assert status == 200 and _closed(s)
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # HEAD: the headers of GET, no body
        s.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(WAIT_S)
        data = b""
        while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"}"):
            data += s.recv(65536)
        assert data.index(b"HTTP/1.1 200", 1) > 0 and data.count(b'"status"') == 1
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # Upgrade is ignored: plain HTTP goes on
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                  b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert [a[0] for a in _read_answers(s, 2)] == [200, 200]
    x = images(rng, 1)
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # Expect: 100-continue, then the body
        wire = _infer_request(x, extra="Expect: 100-continue\r\n")
        head, body = wire.split(b"\r\n\r\n", 1)
        s.sendall(head + b"\r\n\r\n")
        s.settimeout(WAIT_S)
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        assert _read_answers(s, 1)[0][0] == 200
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # a chunked body, in three chunks
        body = _infer_request(x).split(b"\r\n\r\n", 1)[1]
        parts = [body[:10], body[10:500], body[500:]]
        s.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                  + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n")
        (status, _, answer), = _read_answers(s, 1)
        assert status == 200, answer
        np.testing.assert_allclose(json.loads(answer)["outputs"][0]["data"],
                                   FakeEngine().expected_logits(x).ravel(), rtol=1e-6)


@pytest.mark.parametrize("case", ["url", "headers", "head bytes", "body", "chunked body", "malformed"])
def test_limits_and_malformed_http_answered_then_closed(start, rng, case):
    server = start()
    wire, want = {
        "url": (b"GET /" + b"a" * (MAX_URL_BYTES + 1) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        "headers": (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS + 1))
                    + b"\r\n", 431),
        "head bytes": (b"GET /health HTTP/1.1\r\nX-Long: " + b"a" * (200 << 10), 431),
        "body": (f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMIT + 1}\r\n\r\n".encode()
                 + b"x" * (LIMIT + 1), 413),
        "chunked body": (f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                         + b"%x\r\n%s\r\n" % (LIMIT + 1, b"x" * (LIMIT + 1)), 413),
        "malformed": (b"GET /health HTTP/1.1\r\nHost x\r\n\r\n", 400),
    }[case]
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(wire)
        (status, headers, body), = _read_answers(s, 1)
        assert status == want and headers["connection"] == "close" and "error" in json.loads(body)
        assert b"aaaa" not in body
        assert _closed(s)
    metrics = request(server.port, "GET", "/metrics")[2]
    reason = "too_large" if want == 413 else "http"
    assert f'resnet_native_errors_total{{reason="{reason}"}} 1.0' in metrics
    assert request(server.port, "GET", "/health")[0] == 200


def test_shutdown_answers_the_request_in_flight_and_closes_idle_connections(rng):
    engine = GatedEngine()
    batcher = Batcher(engine, max_delay_ms=1.0)
    server = ServerThread(make_app(batcher, CLASSES), shutdown_timeout=WAIT_S)
    x = images(rng, 1)
    try:
        idle = socket.create_connection(("127.0.0.1", server.port))
        busy = socket.create_connection(("127.0.0.1", server.port))
        busy.sendall(_infer_request(x))
        assert engine.started.wait(WAIT_S)
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        assert _closed(idle)  # at once: no request of its own
        time.sleep(0.2)
        assert stopper.is_alive()  # waiting for the gated request
        engine.gate.set()
        (status, headers, body), = _read_answers(busy, 1)
        assert status == 200 and headers["connection"] == "close"
        np.testing.assert_allclose(json.loads(body)["outputs"][0]["data"], FakeEngine().expected_logits(x).ravel(),
                                   rtol=1e-6)
        stopper.join(WAIT_S)
        assert not stopper.is_alive()
        idle.close()
        busy.close()
    finally:
        engine.gate.set()
        server.stop()
        batcher.close()


def test_png_body_through_the_relay_equals_the_engine(start, rng):
    server = start()
    x = images(rng, 1)
    status, _, answer = request(server.port, "POST", "/predict", encode(x[0]), {"Content-Type": "image/png"})
    assert status == 200 and answer["class"] == int(np.argmax(FakeEngine().expected_logits(x)[0]))
