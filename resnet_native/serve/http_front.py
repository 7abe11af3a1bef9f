"""The server's HTTP/1.1 side: connections parsed by httptools (llhttp), the v2 infer route answered here, every
other request relayed to the aiohttp app.

    front = HttpFront(app, runner.server, Limits(30.0, 300.0, 1024))    # app: make_app's, runner: set up
    server = await loop.create_server(front.connection, host, port)
    ...
    await front.shutdown(server, timeout)          # stop listening, answer what is in flight, close the rest

Why two stacks: aiohttp's per-request machinery is most of what a small request costs the server, while the hot
route (POST /v2/models/{m}[/versions/{v}]/infer) needs only its body and one header. That route is answered here
through kserve_http.answer_infer, counted in the app's metrics as the app counts it. The other routes (/predict
with its multipart bodies, /health, /metrics, the v2 metadata) keep aiohttp's handlers: the request, its body
read here in whole under the upload limit, is re-framed with a Content-Length and goes to the app over an
in-process socket pair, one per client connection, and the app's answer is copied back unchanged.

A connection's requests are answered one at a time, in order (pipelined ones wait, up to MAX_PIPELINED, then
reading pauses; so does a client that does not read its answers). Limits, so that no client holds the server:
the URL (MAX_URL_BYTES, 414), the head (MAX_HEAD_BYTES and MAX_HEADERS, 431), the body (the app's
max_upload_bytes, 413), and Limits' read_timeout, body_timeout and max_connections (server.py describes them).
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import json
import logging
import time
from urllib.parse import unquote

try:
    import httptools
except ImportError as e:  # the serve extra; app.py's guarded import has already named aiohttp's absence
    raise ImportError(f'resnet_native.serve: the HTTP server needs httptools ({e.name} is not installed): '
                      f'pip install "resnet_native[serve]"') from e

from .app import STATE, refusal
from .app_relay import AppRelay
from .kserve_http import MODEL, answer_infer

MAX_URL_BYTES = 8190  # aiohttp's limit on a request line
MAX_HEAD_BYTES = 64 * 1024  # a request's line and headers together
MAX_HEADERS = 128
# After a refusal, what the client still sends is read and dropped for a while before closing, so that a client
# that sends its whole body before reading gets the answer instead of a reset connection (a "lingering close").
LINGER_S, LINGER_BYTES = 2.0, 16 << 20
MAX_PIPELINED = 16  # complete requests of one connection waiting for their answers; past it, reading pauses
_REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 413: "Payload Too Large", 414: "URI Too Long",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
# Framing headers of the client's request that the relay sets itself.
_NOT_RELAYED = frozenset((b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"expect",
                          b"upgrade", b"te", b"trailer"))
_INFER_ROUTES = ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer")  # the app's labels
_log = logging.getLogger(__name__)


class Limits:
    """read_timeout, body_timeout (seconds) and max_connections of one listening server; `open` counts."""

    def __init__(self, read_timeout: float, body_timeout: float, max_connections: int):
        self.read_timeout, self.body_timeout, self.max_connections = read_timeout, body_timeout, max_connections
        self.tick = min(max(min(read_timeout, body_timeout) / 4, 0.02), 1.0)
        self.open = 0


_date = [0, b""]


def _date_header() -> bytes:
    now = int(time.time())
    if now != _date[0]:
        _date[:] = [now, b"Date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n"]
    return _date[1]


def http_answer(status: int, body: bytes, content_type: str, headers=None, *, close: bool = False) -> bytes:
    """One whole HTTP/1.1 response."""
    head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nServer: resnet_native\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"]
    head += [f"{k}: {v}\r\n" for k, v in (headers or {}).items()]
    if close:
        head.append("Connection: close\r\n")
    return "".join(head).encode("latin-1") + _date_header() + b"\r\n" + body


def error_answer(status: int, message: str, headers=None, *, close: bool = False) -> bytes:
    """The app's error form, {"error": message}, as a whole response."""
    return http_answer(status, json.dumps({"error": message}).encode(), "application/json", headers, close=close)


class _Refuse(Exception):
    """Raised by a parser callback: answer (status, message) and close the connection."""

    def __init__(self, status: int, message: str, headers=None):
        super().__init__(message)
        self.status, self.headers = status, headers


class _Request:
    __slots__ = ("method", "url", "path", "headers", "body", "size", "keep_alive", "infer")

    def __init__(self):
        self.url, self.headers, self.body, self.size, self.infer = bytearray(), [], [], 0, None

    def header(self, name: bytes):
        for k, v in self.headers:
            if k.lower() == name:
                return v.decode("latin-1")
        return None


class HttpFront:
    """One listening server's connections: `connection` is the protocol factory for loop.create_server."""

    def __init__(self, app, app_server, limits: Limits):
        self.app_server, self.limits = app_server, limits  # app_server: aiohttp's, a protocol factory
        self.state, self.model = app[STATE], app[MODEL]
        self.max_body = self.state.max_upload_bytes
        self.connections = set()
        self.closing = False

    def connection(self) -> _Connection:
        return _Connection(self)

    async def shutdown(self, server, timeout: float) -> None:
        """Stop listening; idle connections close now, the others once their requests are answered; whatever is
        left after `timeout` seconds (a client stalled mid-request, a slow answer) is dropped."""
        server.close()
        self.closing = True
        for c in list(self.connections):
            c.close_when_idle()
        deadline = time.monotonic() + timeout
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for c in list(self.connections):
            c.abort()
        try:
            await asyncio.wait_for(server.wait_closed(), 1.0)
        except asyncio.TimeoutError:
            pass


class _Connection(asyncio.Protocol):
    def __init__(self, front: HttpFront):
        self.front, self.transport, self.loop = front, None, None
        self.parser = httptools.HttpRequestParser(self)
        self.req = None  # the request being received
        self.queue = collections.deque()  # received, waiting for its answer
        self.task = self.relay = self.watch = self.refused = None
        self.counted = self.reading_paused = False
        self.last = self.first_byte = self.headers_done = None
        self.head_bytes = self.drained = 0
        self.linger_until = None

    # -- the transport's side ------------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport, self.loop, limits = transport, asyncio.get_running_loop(), self.front.limits
        if limits.open >= limits.max_connections or self.front.closing:
            why = (f"more than {limits.max_connections} open connections: try again shortly"
                   if not self.front.closing else "the server is shutting down")
            transport.write(error_answer(503, why, {"Retry-After": "1"}, close=True))
            transport.close()
            return
        limits.open += 1
        self.counted = True
        self.front.connections.add(self)
        self.last = self.loop.time()
        self.watch = self.loop.call_later(limits.tick, self._check)

    def connection_lost(self, exc) -> None:
        if self.counted:
            self.front.limits.open -= 1
            self.counted = False
            self.front.connections.discard(self)
        if self.watch is not None:
            self.watch.cancel()
        if self.req is not None and self.refused is None:  # gone mid-request: counted as the app counts it
            self.front.state.metrics.errors.labels("disconnected").inc()
        # A request being answered still runs (its images may be queued already) and finds no one to answer; the
        # relay to the app closes once it is done.
        self.transport = self.watch = self.req = None
        if self.task is None:
            self._close_relay()

    def _close_relay(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None

    def data_received(self, data: bytes) -> None:
        self.last = self.loop.time()
        if self.linger_until is not None:
            self.drained += len(data)
            if self.drained > LINGER_BYTES:
                self.abort()
            return
        in_head = self.req is None or self.headers_done is None
        if in_head:
            if self.first_byte is None:
                self.first_byte = self.last
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:  # the request was answered as plain HTTP (a server may ignore
            self.parser = httptools.HttpRequestParser(self)  # Upgrade); the connection goes on speaking HTTP/1.1
            rest = data[e.args[0]:] if e.args and isinstance(e.args[0], int) else b""
            if rest:
                self.data_received(rest)
        except httptools.HttpParserError as e:
            cause = e.__context__
            self._refuse(cause if isinstance(cause, _Refuse) else _Refuse(400, f"malformed HTTP request ({e})"))
        else:
            if (self.req is None or self.headers_done is None) and self.head_bytes > MAX_HEAD_BYTES + MAX_URL_BYTES:
                self._refuse(_Refuse(431, f"the request's headers are longer than {MAX_HEAD_BYTES} bytes"))

    def pause_writing(self) -> None:  # a client that does not read its answers: stop reading its requests
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        if not self.reading_paused and self.transport is not None:
            self.transport.resume_reading()

    # -- httptools' callbacks ------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.req = _Request()
        self.headers_done = None
        if self.first_byte is None:
            self.first_byte = self.loop.time()

    def on_url(self, url: bytes) -> None:
        self.req.url += url
        if len(self.req.url) > MAX_URL_BYTES:
            raise _Refuse(414, f"the request's URL is longer than {MAX_URL_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.req.headers.append((name, value))
        if len(self.req.headers) > MAX_HEADERS:
            raise _Refuse(431, f"more than {MAX_HEADERS} request headers")

    def on_headers_complete(self) -> None:
        req, parser = self.req, self.parser
        self.headers_done, self.head_bytes = self.loop.time(), 0
        req.method, req.keep_alive = parser.get_method().decode("latin-1"), parser.should_keep_alive()
        try:
            req.path = unquote(httptools.parse_url(bytes(req.url)).path.decode("latin-1"))
        except (httptools.HttpParserInvalidURLError, UnicodeDecodeError):
            raise _Refuse(400, "the request's URL is malformed") from None
        if req.method == "POST":
            req.infer = _infer_route(req.path)
        length = req.header(b"content-length")
        if length is not None and int(length) > self.front.max_body:
            raise _Refuse(413, f"request body of {int(length)} bytes: more than the {self.front.max_body} bytes "
                               "allowed")
        if (req.header(b"expect") or "").lower() == "100-continue" and self.task is None and not self.queue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        req = self.req
        req.size += len(body)
        if req.size > self.front.max_body:
            raise _Refuse(413, f"request body: more than the {self.front.max_body} bytes allowed")
        req.body.append(body)

    def on_message_complete(self) -> None:
        self.queue.append(self.req)
        self.req = self.first_byte = self.headers_done = None
        self.head_bytes = 0
        if len(self.queue) >= MAX_PIPELINED and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        if self.task is None:
            self.task = self.loop.create_task(self._answer_queue())

    # -- answering -----------------------------------------------------------------------------------------

    async def _answer_queue(self) -> None:
        try:
            while self.queue and self.transport is not None:
                req = self.queue.popleft()
                if req.infer is not None:
                    answer = await self._infer(req)
                    keep = req.keep_alive and not self.front.closing  # closing may have begun meanwhile
                    data = http_answer(*answer, close=not keep)
                else:
                    data, keep = await self._relayed(req, req.keep_alive and not self.front.closing)
                if self.transport is None:
                    self._close_relay()
                    return
                self.transport.write(data)
                self.last = self.loop.time()
                if not keep:
                    self.queue.clear()
                    self.transport.close()
                    return
                if self.reading_paused and len(self.queue) < MAX_PIPELINED // 2:
                    self.reading_paused = False
                    self.transport.resume_reading()
            if self.refused is not None and self.transport is not None:
                self._write_refusal()
            elif self.front.closing and self.req is None:
                self.abort()
        finally:
            self.task = None

    async def _infer(self, req: _Request) -> tuple:
        """http_answer's (status, body, content type, headers) for a v2 infer request."""
        start, state = time.perf_counter(), self.front.state
        name, version, route = req.infer
        try:
            payload, content_type, headers = await answer_infer(
                self.front.model, name, version, b"".join(req.body), req.header(b"inference-header-content-length"))
            status = 200
        except Exception as e:
            status, message, headers = refusal(state, e, req.method, req.path)
            payload, content_type = json.dumps({"error": message}).encode(), "application/json"
        state.metrics.answered(route, status, time.perf_counter() - start)
        return status, payload, content_type, headers

    async def _relayed(self, req: _Request, keep: bool) -> tuple:
        """(the app's answer, whether the connection stays open) for a request of any other route."""
        head = [req.method.encode("latin-1"), b" ", bytes(req.url), b" HTTP/1.1\r\n"]
        for name, value in req.headers:
            if name.lower() not in _NOT_RELAYED:
                head += [name, b": ", value, b"\r\n"]
        if req.header(b"host") is None:  # an HTTP/1.0 request may have none; the relay speaks HTTP/1.1
            head.append(b"Host: localhost\r\n")
        body = b"".join(req.body)
        head.append(b"Content-Length: %d\r\nConnection: %s\r\n\r\n" % (len(body), b"keep-alive" if keep else b"close"))
        try:
            if self.relay is None:
                self.relay = await AppRelay.open(self.front.app_server)
            data, app_keeps = await self.relay.exchange(b"".join(head) + body, head_only=req.method == "HEAD")
        except ConnectionError as e:  # the app's side closed mid-answer: a bug, answered like one
            _log.error("resnet_native.serve: relaying %s %s failed: %s", req.method, req.path, e)
            self.relay = None
            return error_answer(500, "internal error: the app did not answer", close=True), False
        if not app_keeps or req.method == "HEAD":
            self._close_relay()
        return data, keep and app_keeps

    # -- refusals, timeouts, closing -----------------------------------------------------------------------

    def _refuse(self, refusal_: _Refuse) -> None:
        """A request refused while it arrives: no more reading; answered after the answers before it, then closed."""
        if self.refused is not None or self.transport is None:
            return
        self.refused = refusal_
        self.req = None
        self.front.state.metrics.errors.labels({413: "too_large"}.get(refusal_.status, "http")).inc()
        self.transport.pause_reading()
        if self.task is None:
            self._write_refusal()

    def _write_refusal(self) -> None:
        r = self.refused
        self.transport.write(error_answer(r.status, str(r), r.headers, close=True))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.linger_until = self.loop.time() + LINGER_S
        self.transport.resume_reading()

    def close_when_idle(self) -> None:
        if self.task is None and self.req is None and self.transport is not None:
            self.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _check(self) -> None:
        """The watchdog: a client that the server waits on and that sends too little is closed (408 when no
        answer is being written)."""
        self.watch = None
        if self.transport is None:
            return
        limits, now = self.front.limits, self.loop.time()
        if self.linger_until is not None and now > self.linger_until:
            self.abort()
            return
        waiting_on_client = self.req is not None or (self.task is None and not self.queue)
        why = None
        if waiting_on_client and self.refused is None:
            if now - self.last > limits.read_timeout:
                why = f"nothing received for {limits.read_timeout:g} s"
            elif (self.headers_done is None and self.first_byte is not None
                  and now - self.first_byte > limits.read_timeout):
                why = f"request headers not complete within {limits.read_timeout:g} s"
            elif self.headers_done is not None and now - self.headers_done > limits.body_timeout:
                why = f"request body not complete within {limits.body_timeout:g} s"
        if why is None:
            self.watch = self.loop.call_later(limits.tick, self._check)
            return
        _log.info("resnet_native.serve: closing a connection from %s: %s", self.transport.get_extra_info("peername"),
                  why)
        if self.task is None and self.headers_done is None and self.transport.get_write_buffer_size() == 0:
            self.transport.write(error_answer(408, why, close=True))
            self.transport.close()
        else:
            self.transport.abort()


def _infer_route(path: str):
    """(model, version or None, metrics label) when `path` is the v2 infer route, else None."""
    parts = path.split("/")
    if len(parts) == 5 and parts[:3] == ["", "v2", "models"] and parts[4] == "infer" and parts[3]:
        return parts[3], None, _INFER_ROUTES[0]
    if (len(parts) == 7 and parts[:3] == ["", "v2", "models"] and parts[4] == "versions" and parts[6] == "infer"
            and parts[3] and parts[5]):
        return parts[3], parts[5], _INFER_ROUTES[1]
    return None
