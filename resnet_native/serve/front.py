"""A front process of python -m resnet_native.serve --workers N: HTTP and gRPC over a RemoteBatcher.

The RemoteBatcher stands in for the engine process's Batcher: a request's images go into this front's shared cells
and a request frame goes over its socket (engine_link.py); the answer frame resolves the request's future with
the logits the engine wrote into the same cells. It runs on the front's event loop only, with the app (make_app)
and the gRPC servicer on that loop, so an answer costs no thread hop. workers.py starts the fronts and holds the
engine's side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import signal
import socket
import sys
import time

from .app import make_app
from .batcher import BatcherClosed, BatcherFull, check_array
from .engine_link import FULL, OK, Cells, FrameBuffer, FreeCells, error_of, request_frame
from .kserve_http import MODEL as KSERVE_MODEL
from .loop_thread import run as run_loop
from .server import start_server

_RID_MODULO = 1 << 32


# -- the front's side ----------------------------------------------------------------------------------------


class RemoteBatcher:
    """What make_app and KServeModel need of a Batcher (submit_array, close, closed, queue_depth, counters,
    settings, batch listeners), forwarding requests to the engine process. Used on its event loop's thread only:
    futures are concurrent.futures.Future, resolved there (asyncio.wrap_future awaits them).

    Its requests may hold at most `settings["max_queue"]` images together (its cells); past that it raises
    BatcherFull at once, as the engine's Batcher does past its own queue. Counters are this front's."""

    def __init__(self, worker: int, sock: socket.socket, cells: Cells, settings: dict):
        self.worker, self._sock, self._cells = worker, sock, cells
        self._settings = dict(settings)
        self.max_queue = int(settings["max_queue"])
        self.max_batch = int(settings["max_batch"])
        self._free = FreeCells(cells.count)
        self._ids = itertools.count()
        self._pending = {}  # request id -> (Future, cells)
        self._waiting_images = 0
        self._closed = False
        self._transport = None
        self._outbox = []  # request frames of this loop iteration: one write (one system call) for them all
        self._counts = {"requests": 0, "images": 0, "completed": 0, "errors": 0, "cancelled": 0, "rejected": 0}

    async def connect(self, on_engine_lost) -> None:
        """Start reading answers on this loop; on_engine_lost() is called once the engine process is gone."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._on_lost = on_engine_lost
        self._transport, _ = await loop.create_unix_connection(lambda: _AnswerReader(self), sock=self._sock)

    def submit_array(self, images, callback=None):
        if callback is not None:
            raise TypeError("RemoteBatcher.submit_array: callback is not supported; await the future")
        images = check_array(images, self.max_batch, copy=False)
        if self._closed:
            raise BatcherClosed("Batcher: closed, no new requests are accepted")
        cells = self._free.take(len(images))
        if cells is None:
            self._counts["rejected"] += 1
            raise BatcherFull(f"Batcher: the queue is full ({self._waiting_images} of max_queue={self.max_queue} "
                              f"images waiting in this front); retry later")
        self._cells.images[cells] = images
        rid = next(self._ids) % _RID_MODULO
        future = concurrent.futures.Future()
        self._pending[rid] = (future, cells)
        self._waiting_images += len(cells)
        self._counts["requests"] += 1
        self._counts["images"] += len(cells)
        if not self._outbox:
            self._loop.call_soon(self._flush)
        self._outbox.append(request_frame(rid, cells))
        return future

    def _flush(self) -> None:
        frames, self._outbox = self._outbox, []
        if frames and not self._transport.is_closing():
            self._transport.write(b"".join(frames))

    def _answered(self, rid: int, status: int, message: str) -> None:
        entry = self._pending.pop(rid, None)
        if entry is None:
            return
        future, cells = entry
        result = self._cells.logits[cells] if status == OK else None  # a copy (fancy indexing), before freeing
        self._release(cells)
        self._counts["completed" if status == OK else "rejected" if status == FULL else "errors"] += 1
        if future.cancelled():
            return
        if status == OK:
            future.set_result(result)
        else:
            future.set_exception(error_of(status, message))

    def _release(self, cells) -> None:
        self._free.give(cells)
        self._waiting_images -= len(cells)

    def _engine_lost(self) -> None:
        self._closed = True
        self._fail_all("the engine process is gone")
        self._on_lost()

    def _fail_all(self, why: str) -> None:
        left, self._pending = list(self._pending.values()), {}
        self._counts["cancelled"] += len(left)
        for future, cells in left:
            self._release(cells)
            if not future.done():
                future.set_exception(BatcherClosed(f"Batcher: {why}"))

    def add_batch_listener(self, callback) -> None:  # the batches are the engine process's
        pass

    def remove_batch_listener(self, callback) -> None:
        pass

    @property
    def queue_depth(self) -> int:
        """This front's images awaiting an answer from the engine process."""
        return self._waiting_images

    @property
    def closed(self) -> bool:
        return self._closed

    def counters(self) -> dict:
        return dict(self._counts, in_flight=self._waiting_images, worker=self.worker, pid=os.getpid())

    def settings(self) -> dict:
        return dict(self._settings)

    async def aclose(self, timeout: float) -> None:
        """No new requests; those still unanswered after `timeout` seconds fail with BatcherClosed."""
        self._closed = True
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._fail_all("closed before the engine answered")
        if self._transport is not None:
            self._transport.close()


class _AnswerReader(asyncio.Protocol):
    def __init__(self, batcher: RemoteBatcher):
        self._batcher, self._frames = batcher, FrameBuffer(answers=True)

    def data_received(self, data: bytes) -> None:
        for rid, status, message in self._frames.feed(data):
            self._batcher._answered(rid, status, message)

    def connection_lost(self, exc) -> None:
        if not self._batcher.closed:
            self._batcher._engine_lost()


def worker_main(index: int, front: dict, settings: dict, sock: socket.socket, cells: tuple, ready) -> None:
    """A front process: the app on host:port and, with a gRPC port, the gRPC servicer on the same loop (both
    SO_REUSEPORT), over a RemoteBatcher, until SIGTERM or the engine process's end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the main process decides
    fd, count, classes = cells
    shared = Cells(fd, count, classes)
    host, port, grpc_port = front["host"], front["port"], front["grpc_port"]

    async def run():
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        engine_gone = []
        # A plain handler, not the loop's: it outlives the loop, so a second SIGTERM (the main process's after the
        # group's, e.g. from `timeout`) while the front is finishing never kills it mid-answer.
        signal.signal(signal.SIGTERM, lambda _s, _f: loop.call_soon_threadsafe(stop.set))
        batcher = RemoteBatcher(index, sock, shared, settings)
        await batcher.connect(lambda: (engine_gone.append(True), stop.set()))
        app = make_app(batcher, **front["app"])
        grpc_server = None
        try:
            runner, _, _ = await start_server(app, host, port, reuse_port=True, **front["server"])
            if grpc_port:
                from .kserve_grpc import start_grpc_server  # lazy: grpcio is needed only with --grpc-port

                grpc_server, _, _ = await start_grpc_server(app[KSERVE_MODEL], host, grpc_port, reuse_port=True,
                                                            max_message_bytes=front["max_message_bytes"])
        except OSError as e:
            ready.put((index, os.getpid(), f"cannot listen on {host}: {e}", ()))
            return 1
        ready.put((index, os.getpid(), None, tuple(m for m in ("cupy", "cupyx") if m in sys.modules)))
        await stop.wait()
        stopping = [runner.cleanup()]  # no new connections; in-flight requests answered (up to the timeout)
        if grpc_server is not None:
            from .kserve_grpc import stop_grpc_server  # lazy: as start_grpc_server above

            stopping.append(stop_grpc_server(grpc_server, front["server"]["shutdown_timeout"]))
        await asyncio.gather(*stopping)
        await batcher.aclose(0.0)
        if engine_gone:
            print(f"serve: front {os.getpid()}: the engine process is gone; exiting", file=sys.stderr, flush=True)
        return 1 if engine_gone else 0

    sys.exit(run_loop(run()))
