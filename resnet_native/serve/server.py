"""Running an app: on the caller's event loop (the CLI), or on a loop of its own in a thread (tests, benchmarks).

    runner, host, port = await start_server(app, "127.0.0.1", 0)      # port 0: the system picks a free one
    ...
    await runner.cleanup()        # stop listening, let in-flight requests finish (shutdown_timeout), close

    with ServerThread(app) as server:                                 # 127.0.0.1, a free port
        urllib.request.urlopen(server.url + "/health")

aiohttp's AppRunner.cleanup is the graceful part: it closes the listening socket first, then waits up to
`shutdown_timeout` for every handler still running to answer, and only then closes the connections. The batcher
is not the app's: whoever made it closes it after cleanup, when no handler can submit to it any more.

Limits and timeouts (aiohttp has none for slow clients, so the connections are its RequestHandler with a watchdog):
  read_timeout     a client the server waits on (for a request's headers, its body, or the next request on a
                   kept-alive connection) that sends nothing for this long is closed; a request's headers must
                   all arrive within this long of their first byte (408 then close). Default 30 s.
  body_timeout     a request's body must arrive in whole within this long of its headers (else closed). Default 300 s.
  max_connections  open connections at once; one more is answered 503 (Retry-After) and closed. Default 1024.
On shutdown every connection gets shutdown_timeout in all: a client stalled mid-body is then dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging

from .app import web  # aiohttp through app's guarded import: its ImportError names the serve extra
from .loop_thread import LoopThread

RequestHandler = web.RequestHandler  # aiohttp's connection handler (its web_protocol module)

DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_BODY_TIMEOUT_S = 300.0
DEFAULT_MAX_CONNECTIONS = 1024
_log = logging.getLogger(__name__)


def _raw_response(status: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}"
            "Connection: close\r\n\r\n").encode() + body


class _Limits:
    def __init__(self, read_timeout: float, body_timeout: float, max_connections: int):
        self.read_timeout, self.body_timeout, self.max_connections = read_timeout, body_timeout, max_connections
        self.tick = min(max(min(read_timeout, body_timeout) / 4, 0.02), 1.0)
        self.open = 0


class _GuardedHandler(RequestHandler):
    """aiohttp's connection handler with the read timeouts and the connection cap (see the module docstring).
    Its phase: "headers" (waiting for a request), "body" (a handler runs and the body is still arriving) or
    "server" (the whole request is in: only the server's own work, bounded by shutdown_timeout on shutdown)."""

    def __init__(self, manager, limits: _Limits, **kwargs):
        super().__init__(manager, **kwargs)
        self._limits, self._counted, self._watch = limits, False, None
        self._phase, self._phase_start, self._last_read, self._first_byte = "headers", 0.0, 0.0, None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if self._limits.open >= self._limits.max_connections:
            transport.write(_raw_response("503 Service Unavailable", f"more than {self._limits.max_connections} "
                                          "open connections: try again shortly", "Retry-After: 1\r\n"))
            self.force_close()
            return
        self._limits.open += 1
        self._counted = True
        self._phase_start = self._last_read = self._loop.time()
        self._watch = self._loop.call_later(self._limits.tick, self._check)

    def connection_lost(self, exc) -> None:
        if self._counted:
            self._limits.open -= 1
            self._counted = False
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        if self._phase == "headers" and self._first_byte is None:
            self._first_byte = self._last_read
        super().data_received(data)

    async def _handle_request(self, request, *args, **kwargs):
        self._phase, self._phase_start = "body", self._loop.time()
        try:
            return await super()._handle_request(request, *args, **kwargs)
        finally:
            self._phase, self._phase_start, self._first_byte = "headers", self._loop.time(), None

    def _check(self) -> None:
        self._watch = None
        if self.transport is None:
            return
        now, limits = self._loop.time(), self._limits
        request = self._current_request
        if self._phase == "body" and (request is None or request.content.is_eof()):
            self._phase = "server"
        why = None
        if self._phase != "server" and now - self._last_read > limits.read_timeout:
            why = f"nothing received for {limits.read_timeout:g} s"
        elif self._phase == "headers" and self._first_byte is not None and now - self._first_byte > limits.read_timeout:
            why = f"request headers not complete within {limits.read_timeout:g} s"
        elif self._phase == "body" and now - self._phase_start > limits.body_timeout:
            why = f"request body not complete within {limits.body_timeout:g} s"
        if why is None:
            self._watch = self._loop.call_later(limits.tick, self._check)
            return
        _log.info("resnet_native.serve: closing a connection from %s: %s", self._peer(), why)
        if self._phase == "headers":  # no handler is answering: say why before closing
            self.transport.write(_raw_response("408 Request Timeout", why))
        self.force_close()

    def _peer(self):
        try:
            return self.transport.get_extra_info("peername")
        except Exception:  # noqa: BLE001 - only for the log line
            return None

    async def shutdown(self, timeout: float | None = 15.0) -> None:
        # aiohttp's waits up to timeout for the handler, then up to timeout again once cancelled: bound the whole.
        try:  # wait_for, not asyncio.timeout: the package supports Python 3.10
            await asyncio.wait_for(super().shutdown(timeout), timeout)
        except asyncio.TimeoutError:
            pass
        self.force_close()


class _GuardedSite(web.TCPSite):
    """TCPSite whose connections are _GuardedHandler."""

    def __init__(self, runner, host, port, *, limits: _Limits, **kwargs):
        super().__init__(runner, host, port, **kwargs)
        self._limits = limits

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers with the runner (TCPSite.start would make plain handlers)
        loop = asyncio.get_running_loop()
        server = self._runner.server

        def factory():
            return _GuardedHandler(server, self._limits, loop=loop, **server._kwargs)

        self._server = await loop.create_server(factory, self._host, self._port, backlog=self._backlog,
                                                reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


async def start_server(app: web.Application, host: str = "127.0.0.1", port: int = 0, *,
                       shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S, reuse_port: bool = False,
                       read_timeout: float = DEFAULT_READ_TIMEOUT_S, body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
                       max_connections: int = DEFAULT_MAX_CONNECTIONS):
    """Listen on host:port; returns (runner, host, port) with the port actually bound. reuse_port: SO_REUSEPORT,
    so that several processes listen on one port (the --workers servers; Linux). read_timeout, body_timeout,
    max_connections: see the module docstring."""
    for name, value in (("read_timeout", read_timeout), ("body_timeout", body_timeout),
                        ("max_connections", max_connections)):
        if not value > 0:
            raise ValueError(f"{name}: expected a positive number, got {value!r}")
    limits = _Limits(float(read_timeout), float(body_timeout), int(max_connections))
    # handle_signals=False: signals are the caller's (the CLI installs its own), and a thread's loop cannot have them.
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=shutdown_timeout, access_log=None)
    await runner.setup()
    try:
        site = _GuardedSite(runner, host, port, reuse_port=reuse_port or None, limits=limits)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, bound_host, int(bound_port)


class ServerThread(LoopThread):
    """An app served from a daemon thread with its own event loop, until stop() (graceful, as the CLI's)."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0, *,
                 shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S, start_timeout: float = 30.0, **limits):
        """limits: start_server's read_timeout, body_timeout, max_connections."""
        self._start(start_server(app, host, port, shutdown_timeout=shutdown_timeout, **limits), "resnet_native-serve",
                    start_timeout)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float | None = 60.0) -> None:
        """Stop listening, let in-flight requests finish, stop the loop and join the thread. Idempotent."""
        self._stop(lambda runner: runner.cleanup(), timeout)
