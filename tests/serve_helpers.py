"""Shared by the serving tests: engines that fail or wait on cue, and image encodings."""

import io
import threading

import numpy as np
from PIL import Image

from resnet_native.serve import FakeEngine

WAIT_S = 20.0  # how long a test waits for anything a thread should do at once (only a broken build reaches it)
BAD = 255  # an image whose first byte is BAD makes a PickyEngine call fail


class GatedEngine(FakeEngine):
    """A FakeEngine whose calls wait until `gate` is set; `started` is set once a call is waiting."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate, self.started = threading.Event(), threading.Event()

    def __call__(self, images):
        self.started.set()
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        return super().__call__(images)


class PickyEngine(FakeEngine):
    """A FakeEngine that raises for any batch holding an image whose first byte is BAD."""

    def __call__(self, images):
        if (np.asarray(images)[:, 0, 0, 0] == BAD).any():
            super().__call__(images)  # counted in `calls` like a real failing call
            raise ValueError("picky engine: a bad image in this batch")
        return super().__call__(images)


def free_port() -> int:
    """A port nothing listens on now (for a server option where 0 does not mean "any free port")."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def images(rng, n, *, bad=()):
    """n distinct uint8 (32, 32, 3) images (first byte < BAD, unless its index is in `bad`)."""
    x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    x[:, 0, 0, 0] = np.arange(n) % BAD
    for i in bad:
        x[i, 0, 0, 0] = BAD
    return x


def encode(image, fmt="PNG", **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format=fmt, **options)
    return buf.getvalue()


def multipart(parts, boundary="resnet-native-test-boundary"):
    """(body, content type) of a multipart/form-data request with one part per (content type, bytes)."""
    body = b""
    for i, (content_type, data) in enumerate(parts):
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{i}.img"\r\n'
        if content_type is not None:
            head += f"Content-Type: {content_type}\r\n"
        body += (head + "\r\n").encode() + data + b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def request(port, method, path, body=None, headers=None, *, host="127.0.0.1", timeout=WAIT_S, chunked=False):
    """(status, headers, JSON or text) of one request on a fresh connection."""
    import http.client
    import json

    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        r = conn.getresponse()
        data = r.read()
        kind = r.headers.get("Content-Type", "")
        return r.status, r.headers, json.loads(data) if kind.startswith("application/json") else data.decode()
    finally:
        conn.close()
