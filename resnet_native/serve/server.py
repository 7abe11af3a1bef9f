"""Running an app: on the caller's event loop (the CLI), or on a loop of its own in a thread (tests, benchmarks).

    runner, host, port = await start_server(app, "127.0.0.1", 0)      # port 0: the system picks a free one
    ...
    await runner.cleanup()        # stop listening, let in-flight requests finish (shutdown_timeout), close

    with ServerThread(app) as server:                                 # 127.0.0.1, a free port
        urllib.request.urlopen(server.url + "/health")

Clients talk to http_front.HttpFront (httptools), which answers the v2 infer route itself and relays the rest to
the app's aiohttp handlers. Shutdown stops listening first, then waits up to `shutdown_timeout` for the requests
in flight to be answered, and only then closes the connections and the app (its on_cleanup hooks). The batcher is
not the app's: whoever made it closes it after cleanup, when no handler can submit to it any more.

Limits and timeouts, so that slow or silent clients cannot hold the server:
  read_timeout     a client the server waits on (for a request's headers, its body, or the next request on a
                   kept-alive connection) that sends nothing for this long is closed; a request's headers must
                   all arrive within this long of their first byte (408 then close). Default 30 s.
  body_timeout     a request's body must arrive in whole within this long of its headers (else closed). Default 300 s.
  max_connections  open connections at once; one more is answered 503 (Retry-After) and closed. Default 1024.
"""

from __future__ import annotations

import asyncio

from .app import web  # aiohttp through app's guarded import: its ImportError names the serve extra
from .http_front import HttpFront, Limits
from .loop_thread import LoopThread

DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_BODY_TIMEOUT_S = 300.0
DEFAULT_MAX_CONNECTIONS = 1024


class Runner:
    """A listening server: `addresses` and `cleanup()` (graceful, see the module docstring)."""

    def __init__(self, app_runner, front: HttpFront, server, shutdown_timeout: float):
        self._app_runner, self._front, self._server = app_runner, front, server
        self._shutdown_timeout = shutdown_timeout

    @property
    def addresses(self) -> list:
        return [s.getsockname() for s in self._server.sockets]

    async def cleanup(self) -> None:
        await self._front.shutdown(self._server, self._shutdown_timeout)
        await self._app_runner.cleanup()


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
    limits = Limits(float(read_timeout), float(body_timeout), int(max_connections))
    # handle_signals=False: signals are the caller's (the CLI installs its own), and a thread's loop cannot have them.
    # No site: the app's connections are the front's relays (http_front.py), never clients'.
    app_runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=shutdown_timeout, access_log=None)
    await app_runner.setup()
    front = HttpFront(app, app_runner.server, limits)
    try:
        server = await asyncio.get_running_loop().create_server(front.connection, host, port,
                                                                reuse_port=reuse_port or None)
    except BaseException:
        await app_runner.cleanup()
        raise
    bound_host, bound_port = server.sockets[0].getsockname()[:2]
    return Runner(app_runner, front, server, shutdown_timeout), bound_host, int(bound_port)


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
