"""A server on a daemon thread with its own event loop: started by a coroutine, stopped by another, joined. The
HTTP server (server.ServerThread) and the gRPC server (kserve_grpc.GrpcServerThread) both run this way in tests and
beside the --workers processes, whose engine process has no event loop of its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

try:
    import uvloop
except ImportError:  # the serve extra installs it where it exists (not on Windows); asyncio's loop serves too
    uvloop = None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed, else asyncio's: the servers' socket work is cheaper on uvloop."""
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


def run(main):
    """asyncio.run(main) on new_event_loop()."""
    return uvloop.run(main) if uvloop is not None else asyncio.run(main)


class LoopThread:
    """Subclasses call _start(start, name, start_timeout) with `start` a coroutine returning (handle, host, port),
    and _stop(cleanup, timeout) with `cleanup(handle)` a coroutine that shuts the handle down."""

    def _start(self, start, name: str, start_timeout: float) -> None:
        self.loop = new_event_loop()
        self._handle = None
        started = concurrent.futures.Future()

        def run():
            asyncio.set_event_loop(self.loop)
            try:
                self._handle, self.host, self.port = self.loop.run_until_complete(start)
            except BaseException as e:
                started.set_exception(e)
                return
            started.set_result(None)
            self.loop.run_forever()  # until _stop() stops it, after the handle's cleanup

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()
        try:
            started.result(start_timeout)
        except BaseException:
            self._thread.join(1.0)
            self.loop.close()
            raise

    def _stop(self, cleanup, timeout: float | None) -> None:
        """Run cleanup(handle) on the loop, stop the loop and join the thread. Idempotent."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        asyncio.run_coroutine_threadsafe(cleanup(handle), self.loop).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
