"""Hostile clients against the HTTP server (FakeEngine, loopback): malformed multipart bodies answered 400 (never a
500), truncated images with --resize refused, slow or silent clients closed by the read timeouts, the connection
cap, and a client stalled mid-body not holding up shutdown."""

import io
import socket
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image
from serve_helpers import encode, images, request

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from resnet_native.serve import Batcher, FakeEngine, make_app  # noqa: E402
from resnet_native.serve.server import ServerThread  # noqa: E402

CLASSES = tuple(f"class{i}" for i in range(10))
B = "hostile-boundary"
MULTIPART = {"Content-Type": f"multipart/form-data; boundary={B}"}


@pytest.fixture
def start():
    running = []

    def start_(*, resize=False, **limits):
        batcher = Batcher(FakeEngine(), max_delay_ms=1.0)
        server = ServerThread(make_app(batcher, CLASSES, max_upload_bytes=4 << 20, resize=resize),
                              shutdown_timeout=1.0, **limits)
        running.append((server, batcher))
        return server

    yield start_
    for server, batcher in running:
        server.stop()
        batcher.close()


def _part(png, extra=b""):
    return f"--{B}\r\n".encode() + extra + b"Content-Type: image/png\r\n\r\n" + png + b"\r\n"


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("case", ["200 headers", "10 KB header line", "1 MB line after the closing boundary",
                                  "1 MB preamble line"])
def test_malformed_multipart_is_400(start, rng, case, chunked):
    server = start()
    png = encode(images(rng, 1)[0])
    end = f"--{B}--\r\n".encode()
    body = {
        "200 headers": _part(png, b"".join(b"X-H%d: v\r\n" % i for i in range(200))) + end,
        "10 KB header line": _part(png, b"X-Long: " + b"a" * 10240 + b"\r\n") + end,
        "1 MB line after the closing boundary": _part(png) + end + b"z" * (1 << 20) + b"\r\n",
        "1 MB preamble line": b"p" * (1 << 20) + b"\r\n" + _part(png) + end,
    }[case]
    status, _, answer = request(server.port, "POST", "/predict", [body] if chunked else body, MULTIPART,
                                chunked=chunked)
    assert status == 400, answer
    assert answer["error"].startswith("malformed multipart/form-data body") and "zzzz" not in answer["error"]
    status, _, answer = request(server.port, "POST", "/predict", _part(png) + end, MULTIPART)
    assert status == 200 and len(answer["predictions"]) == 1  # still serving


def _png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _big_header_small_data(fmt, rng):
    """A whole file whose header declares 2048x2048 but that holds the pixels of 8x8."""
    small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    if fmt == "png":
        rows = b"".join(b"\0" + small[r].tobytes() + bytes(3 * (2048 - 8)) for r in range(8))
        return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 2048, 2048, 8, 2, 0, 0, 0))
                + _png_chunk(b"IDAT", zlib.compress(rows)) + _png_chunk(b"IEND", b""))
    data = bytearray(encode(small, "JPEG"))
    sof = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, 2048, 2048)
    return bytes(data)


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_truncated_image_with_resize_is_400(start, rng, fmt):
    server = start(resize=True)
    data = _big_header_small_data(fmt, rng)
    assert Image.open(io.BytesIO(data)).size == (2048, 2048)
    status, _, answer = request(server.port, "POST", "/predict", data, {"Content-Type": f"image/{fmt}"})
    assert status == 400 and "truncated" in answer["error"] and "2048x2048" in answer["error"], answer
    whole = encode(rng.integers(0, 256, (300, 200, 3), dtype=np.uint8), fmt.upper())
    status, _, answer = request(server.port, "POST", "/predict", whole, {"Content-Type": f"image/{fmt}"})
    assert status == 200, answer
    status, _, answer = request(server.port, "POST", "/predict", whole[: len(whole) // 2],
                                {"Content-Type": f"image/{fmt}"})
    assert status == 400, answer


def _closed(sock, deadline):
    """True once the server closed sock (reads whatever it answered first), False at the deadline."""
    sock.settimeout(max(deadline - time.monotonic(), 0.01))
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_silent_client_closed(start):
    server = start(read_timeout=0.5)
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        t = time.monotonic()
        assert _closed(s, t + 10)
        assert 0.4 < time.monotonic() - t < 5


def test_byte_at_a_time_clients_closed(start):
    server = start(read_timeout=0.5)
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 10\r\n" + b"X: y\r\n" * 50
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(200)]
    try:
        for s in socks:
            s.setblocking(False)
        start_t, open_ = time.monotonic(), set(range(len(socks)))
        sent = 0
        while open_ and time.monotonic() - start_t < 10:
            for i in list(open_):
                try:
                    socks[i].send(head[sent % len(head):sent % len(head) + 1])
                except OSError:
                    open_.discard(i)
            sent += 1
            time.sleep(0.05)
        assert not open_, f"{len(open_)} connections still open"
        assert time.monotonic() - start_t < 5
    finally:
        for s in socks:
            s.close()
    status, _, _ = request(server.port, "GET", "/health")
    assert status == 200


def test_stalled_body_closed(start, rng):
    server = start(read_timeout=0.5)
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 1000\r\n\r\nab")
        t = time.monotonic()
        assert _closed(s, t + 10)
        assert time.monotonic() - t < 5


def test_slow_body_closed_by_body_timeout(start):
    server = start(read_timeout=0.5, body_timeout=1.0)
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 1000\r\n\r\n")
        t = time.monotonic()
        s.settimeout(0.1)
        closed = False
        while time.monotonic() - t < 8 and not closed:
            try:
                s.send(b"a")
                closed = s.recv(4096) == b""
            except TimeoutError:
                pass
            except OSError:
                closed = True
            time.sleep(0.1)
        assert closed and 0.9 < time.monotonic() - t < 5


def test_connection_cap(start):
    server = start(max_connections=3)
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        time.sleep(0.2)
        status, headers, answer = request(server.port, "GET", "/health")
        assert status == 503 and headers["Retry-After"] == "1" and "connections" in answer["error"]
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if request(server.port, "GET", "/health")[0] == 200:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the cap never freed up")


def test_stalled_client_does_not_delay_shutdown(rng):
    batcher = Batcher(FakeEngine(), max_delay_ms=1.0)
    server = ServerThread(make_app(batcher, CLASSES), shutdown_timeout=0.5, read_timeout=60)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 999\r\n\r\nab")
            time.sleep(0.2)
            t = time.monotonic()
            server.stop(timeout=10)
            assert time.monotonic() - t < 2.0
    finally:
        server.stop()
        batcher.close()
