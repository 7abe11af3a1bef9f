"""Running an app: on the caller's event loop (the CLI), or on a loop of its own in a thread (tests, benchmarks).

    runner, host, port = await start_server(app, "127.0.0.1", 0)      # port 0: the system picks a free one
    ...
    await runner.cleanup()        # stop listening, let in-flight requests finish (shutdown_timeout), close

    with ServerThread(app) as server:                                 # 127.0.0.1, a free port
        urllib.request.urlopen(server.url + "/health")

aiohttp's AppRunner.cleanup is the graceful part: it closes the listening socket first, then waits up to
`shutdown_timeout` for every handler still running to answer, and only then closes the connections. The batcher
is not the app's: whoever made it closes it after cleanup, when no handler can submit to it any more.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from .app import web  # aiohttp through app's guarded import: its ImportError names the serve extra

DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0


async def start_server(app: web.Application, host: str = "127.0.0.1", port: int = 0, *,
                       shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S, reuse_port: bool = False):
    """Listen on host:port; returns (runner, host, port) with the port actually bound. reuse_port: SO_REUSEPORT,
    so that several processes listen on one port (the --workers servers; Linux)."""
    # handle_signals=False: signals are the caller's (the CLI installs its own), and a thread's loop cannot have them.
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=shutdown_timeout, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, bound_host, int(bound_port)


class ServerThread:
    """An app served from a daemon thread with its own event loop, until stop() (graceful, as the CLI's)."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0, *,
                 shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S, start_timeout: float = 30.0):
        self.loop = asyncio.new_event_loop()
        self._runner = None
        started = concurrent.futures.Future()

        def run():
            asyncio.set_event_loop(self.loop)
            try:
                self._runner, self.host, self.port = self.loop.run_until_complete(
                    start_server(app, host, port, shutdown_timeout=shutdown_timeout))
            except BaseException as e:
                started.set_exception(e)
                return
            started.set_result(None)
            self.loop.run_forever()  # until stop() stops it, after the runner's cleanup

        self._thread = threading.Thread(target=run, name="resnet_native-serve", daemon=True)
        self._thread.start()
        try:
            started.result(start_timeout)
        except BaseException:
            self._thread.join(1.0)
            self.loop.close()
            raise

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float | None = 60.0) -> None:
        """Stop listening, let in-flight requests finish, stop the loop and join the thread. Idempotent."""
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        asyncio.run_coroutine_threadsafe(runner.cleanup(), self.loop).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
