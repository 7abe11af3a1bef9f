"""Several HTTP front processes in front of one engine: python -m resnet_native.serve ... --workers N (N > 1).

One interpreter's time per request (PNG decode, aiohttp, JSON) caps a single-process server below what a GPU
engine does, so the decoding is spread over processes while the engine stays in one. The main process owns the
engine and the one Batcher; N spawned workers listen on the same host:port (SO_REUSEPORT, Linux) and run the same
app (make_app) with a RemoteBatcher, which sends decoded images over a shared queue and gets answers on its own.

    worker i:  handler -> RemoteBatcher.submit_many -> requests queue --> engine: reader thread -> Batcher.submit_many
               future <- reader thread <- results[i] queue <----------- engine: writer thread <- done futures

Only the engine process touches the GPU: workers never import cupy. A worker's /metrics and /health count its own
requests. A worker that dies stops the server (exit 1): no silent half-service.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import socket
import sys
import threading
import time

import numpy as np

from .app import make_app
from .batcher import BatcherClosed, BatcherFull, check_images
from .server import start_server

START_TIMEOUT_S = 60.0  # spawning a worker imports aiohttp, NumPy and resnet_native: seconds on a busy machine
_PARENT_POLL_S = 0.5


# -- errors over the queues ----------------------------------------------------------------------------------


def _pack_error(e: BaseException) -> tuple:
    kind = "full" if isinstance(e, BatcherFull) else "closed" if isinstance(e, BatcherClosed) else "error"
    return kind, type(e).__name__, str(e)


def _unpack_error(packed: tuple) -> BaseException:
    kind, name, message = packed
    if kind == "full":
        return BatcherFull(message)
    if kind == "closed":
        return BatcherClosed(message)
    # The engine's exception, same name and message (the 500 says "inference failed: Name: message" as before).
    return type(name, (RuntimeError,), {})(message)


# -- the worker's side ---------------------------------------------------------------------------------------


class RemoteBatcher:
    """What make_app needs of a Batcher (submit, submit_many, close, closed, queue_depth, counters, settings, batch
    listeners), forwarding images to the engine process. Futures are concurrent.futures.Future, resolved by a
    reader thread; the app's asyncio.wrap_future hands them to the loop (call_soon_threadsafe).

    The Batcher's refusals travel back as themselves (BatcherFull: 503 with Retry-After, as in the single-process
    app). Its counters are this worker's: requests forwarded, answers, refusals; queue_depth and in_flight are its
    requests awaiting an answer. The batch size and duration histograms stay empty here: batches are the engine
    process's."""

    def __init__(self, worker: int, requests, results, settings: dict):
        self._futures = concurrent.futures
        self.worker, self._requests, self._results = worker, requests, results
        self._settings = dict(settings)
        self.max_queue = int(settings["max_queue"])
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._pending = {}  # request id -> Future
        self._closed = False
        self._counts = {"requests": 0, "completed": 0, "errors": 0, "cancelled": 0, "rejected": 0}
        self._reader = threading.Thread(target=self._read, name="resnet_native-remote-reader", daemon=True)
        self._reader.start()

    def submit(self, image):
        return self.submit_many([image])[0]

    def submit_many(self, images) -> list:
        checked = check_images(images, self.max_queue)
        with self._lock:
            if self._closed:
                raise BatcherClosed("Batcher: closed, no new requests are accepted")
            ids = [next(self._ids) for _ in checked]
            futures = [self._futures.Future() for _ in checked]
            self._pending.update(zip(ids, futures, strict=True))
            self._counts["requests"] += len(ids)
        self._requests.put((self.worker, ids, np.stack(checked)))
        return futures

    def _read(self) -> None:
        while True:
            message = self._results.get()
            if message is None:
                return
            for rid, logits, error in message:
                with self._lock:
                    future = self._pending.pop(rid, None)
                    if future is None:
                        continue
                    if error is None:
                        self._counts["completed"] += 1
                    elif error[0] == "full":
                        self._counts["rejected"] += 1
                    else:
                        self._counts["errors"] += 1
                if future.cancelled():
                    continue
                try:
                    if error is None:
                        future.set_result(logits)
                    else:
                        future.set_exception(_unpack_error(error))
                except self._futures.InvalidStateError:  # cancelled meanwhile (the handler was cancelled)
                    pass

    def add_batch_listener(self, callback) -> None:  # the batches are the engine process's
        pass

    def remove_batch_listener(self, callback) -> None:
        pass

    @property
    def queue_depth(self) -> int:
        """This worker's requests awaiting an answer from the engine process."""
        return len(self._pending)

    @property
    def closed(self) -> bool:
        return self._closed

    def counters(self) -> dict:
        with self._lock:
            return dict(self._counts, in_flight=len(self._pending), worker=self.worker, pid=os.getpid())

    def settings(self) -> dict:
        return dict(self._settings)

    def close(self, timeout=None) -> bool:
        """No new requests; requests still unanswered after `timeout` seconds (None: 0) fail with BatcherClosed."""
        with self._lock:
            self._closed = True
        deadline = time.monotonic() + (timeout or 0.0)
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            left, self._pending = list(self._pending.values()), {}
            self._counts["cancelled"] += len(left)
        for future in left:
            if not future.done():
                try:
                    future.set_exception(BatcherClosed("Batcher: closed before the engine answered"))
                except self._futures.InvalidStateError:
                    pass
        return True


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent:
            print(f"serve: worker {os.getpid()}: the engine process {parent} is gone; exiting", file=sys.stderr,
                  flush=True)
            os._exit(1)


def _worker_main(index: int, host: str, port: int, app_kwargs: dict, settings: dict, shutdown_timeout: float,
                 requests, results, ready) -> None:
    """A worker process: the app on host:port (SO_REUSEPORT) over a RemoteBatcher, until SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the main process decides
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    batcher = RemoteBatcher(index, requests, results, settings)

    async def run():
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        # A plain handler, not the loop's: it outlives the loop, so a second SIGTERM (the main process's after the
        # group's, e.g. from `timeout`) while the worker is finishing never kills it mid-answer.
        signal.signal(signal.SIGTERM, lambda _s, _f: loop.call_soon_threadsafe(stop.set))
        app = make_app(batcher, **app_kwargs)
        try:
            runner, _, _ = await start_server(app, host, port, shutdown_timeout=shutdown_timeout, reuse_port=True)
        except OSError as e:
            ready.put((index, os.getpid(), f"cannot listen on {host}:{port}: {e}", ()))
            return 1
        ready.put((index, os.getpid(), None, tuple(m for m in ("cupy", "cupyx") if m in sys.modules)))
        await stop.wait()
        await runner.cleanup()  # no new connections; in-flight requests answered (up to shutdown_timeout)
        return 0

    code = asyncio.run(run())
    batcher.close()
    sys.exit(code)


# -- the engine's side ---------------------------------------------------------------------------------------


class EngineBridge:
    """In the engine process: a reader thread taking (worker, ids, images) from the workers' queue into the Batcher,
    and a writer thread sending every answer (logits or the packed error) to the worker it came from, in lists."""

    def __init__(self, batcher, requests, results: list):
        self.batcher, self._requests, self._results = batcher, requests, results
        self._done = queue.SimpleQueue()  # (worker, id, logits, error), or None: stop
        self._reader = threading.Thread(target=self._read, name="resnet_native-engine-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name="resnet_native-engine-writer", daemon=True)
        self._reader.start()
        self._writer.start()

    def _read(self) -> None:
        while True:
            message = self._requests.get()
            if message is None:
                return
            worker, ids, images = message
            try:
                futures = self.batcher.submit_many(images)
            except Exception as e:  # BatcherFull, BatcherClosed, ValueError: every image of the request gets it
                packed = _pack_error(e)
                for rid in ids:
                    self._done.put((worker, rid, None, packed))
                continue
            for rid, future in zip(ids, futures, strict=True):
                future.add_done_callback(lambda f, w=worker, r=rid: self._done.put(self._answer(w, r, f)))

    @staticmethod
    def _answer(worker: int, rid: int, future) -> tuple:
        error = future.exception()
        return worker, rid, (None if error is not None else np.asarray(future.result())), \
            (None if error is None else _pack_error(error))

    def _write(self) -> None:
        while True:
            item = self._done.get()
            batches, stop = {}, False
            while True:  # everything ready now, one message per worker
                if item is None:
                    stop = True
                else:
                    worker, rid, logits, error = item
                    batches.setdefault(worker, []).append((rid, logits, error))
                try:
                    item = self._done.get_nowait()
                except queue.Empty:
                    break
            for worker, answers in batches.items():
                self._results[worker].put(answers)
            if stop:
                return

    def close(self, timeout: float | None = None) -> None:
        """After the workers have exited: stop reading, close the Batcher (its queue drains), send the last answers."""
        self._requests.put(None)
        self._reader.join(timeout)
        self.batcher.close(timeout)
        self._done.put(None)
        self._writer.join(timeout)


# -- the main process ----------------------------------------------------------------------------------------


def _reserve(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to host:port with SO_REUSEPORT: resolves port 0 to one free port for every
    worker, and fails (OSError) when another program holds the address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, port))
    except BaseException:
        s.close()
        raise
    return s


def serve_workers(batcher, app_kwargs: dict, host: str, port: int, workers: int, shutdown_timeout: float,
                  url) -> int:
    """Run `workers` HTTP worker processes in front of `batcher` until SIGTERM/SIGINT (exit code 0) or a worker's
    death (1). Prints the listening line (with the workers' pids) and the stopped line as the single-process CLI.

    Shutdown: SIGTERM or SIGINT sends SIGTERM to every worker, which stops listening, answers its in-flight
    requests (shutdown_timeout) and exits 0; then the batcher is closed (its queue drains). A worker that dies or
    exits on its own is reported on stderr and the others are stopped (exit 1); a worker whose engine process is
    gone exits too."""
    if not hasattr(socket, "SO_REUSEPORT"):
        print("serve: --workers needs SO_REUSEPORT (Linux)", file=sys.stderr)
        return 1
    try:
        reserved = _reserve(host, port)
    except OSError as e:
        print(f"serve: cannot listen on {host}:{port}: {e}", file=sys.stderr)
        return 1
    port = reserved.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    requests, ready = ctx.Queue(), ctx.Queue()
    results = [ctx.Queue() for _ in range(workers)]
    bridge = EngineBridge(batcher, requests, results)
    stop = threading.Event()
    received = []
    previous = {sig: signal.signal(sig, lambda s, _f: (received.append(signal.Signals(s).name), stop.set()))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    procs = []
    code = 0
    try:
        for i in range(workers):
            p = ctx.Process(target=_worker_main, name=f"resnet_native-serve-worker-{i}",
                            args=(i, host, port, app_kwargs, batcher.settings(), shutdown_timeout, requests,
                                  results[i], ready))
            p.start()
            procs.append(p)
        code = _wait_ready(procs, ready, stop)
        reserved.close()
        if code == 0 and not stop.is_set():
            print(json.dumps({"event": "listening", "host": host, "port": port, "url": url(host, port),
                              "workers": [p.pid for p in procs]}), flush=True)
            code = _supervise(procs, stop)
        print(json.dumps({"event": "stopping", "signal": received[0] if received else None}), file=sys.stderr,
              flush=True)
    finally:
        reserved.close()
        for p in procs:
            if p.is_alive():
                p.terminate()  # SIGTERM: the worker's graceful stop
        deadline = time.monotonic() + shutdown_timeout + 10.0
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                print(f"serve: worker {p.pid} did not stop in time; killed", file=sys.stderr, flush=True)
                p.kill()
                p.join()
                code = code or 1
            elif p.exitcode != 0 and code == 0:
                print(f"serve: worker {p.pid} exited with code {p.exitcode}", file=sys.stderr, flush=True)
                code = 1
        bridge.close()
        for q in (requests, ready, *results):
            q.close()
            q.join_thread()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code == 0:
        print(json.dumps({"event": "stopped", "batcher": batcher.counters()}), flush=True)
    return code


def _wait_ready(procs: list, ready, stop: threading.Event) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    waiting = set(range(len(procs)))
    while waiting and not stop.is_set():
        try:
            index, pid, error, gpu_modules = ready.get(timeout=0.2)
        except queue.Empty:
            dead = [procs[i] for i in waiting if not procs[i].is_alive()]
            if dead:
                print(f"serve: worker {dead[0].pid} exited with code {dead[0].exitcode} while starting",
                      file=sys.stderr, flush=True)
                return 1
            if time.monotonic() > deadline:
                print(f"serve: workers not listening after {START_TIMEOUT_S:g} s", file=sys.stderr, flush=True)
                return 1
            continue
        if error is not None:
            print(f"serve: worker {pid}: {error}", file=sys.stderr, flush=True)
            return 1
        if gpu_modules:
            print(f"serve: worker {pid} imported {', '.join(gpu_modules)}: only the engine process may touch the GPU",
                  file=sys.stderr, flush=True)
            return 1
        waiting.discard(index)
    return 0


def _supervise(procs: list, stop: threading.Event) -> int:
    """Until `stop` (0) or a worker's exit (1, reported)."""
    sentinels = {p.sentinel: p for p in procs}
    while not stop.is_set():
        for s in multiprocessing.connection.wait(list(sentinels), timeout=0.2):
            p = sentinels[s]
            p.join()
            print(f"serve: worker {p.pid} died (exit code {p.exitcode}); stopping the server", file=sys.stderr,
                  flush=True)
            return 1
    return 0
