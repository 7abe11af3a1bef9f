"""Several front processes in front of one engine: python -m resnet_native.serve ... --workers N (N > 1).

One interpreter's time per request (HTTP, JSON, protobuf, PNG decoding) caps a single-process server far below
what a GPU engine does, so that work is spread over processes while the engine stays in one. The main process owns
the engine and the one Batcher; N spawned fronts listen on the same host:port (and gRPC port) with SO_REUSEPORT,
so the kernel spreads connections over them, and run the same app (make_app, and the gRPC servicer on the same
loop) over a RemoteBatcher. Pixels and logits travel through shared cells (engine_link.py), never a pickle:

    front i:  handler -> RemoteBatcher.submit_array: images into free cells, request frame -> socket i
              future <- answer frame: logits read from the same cells, the cells freed
    engine:   reader thread (all sockets) -> Batcher.submit_owned(images, callback)
              callback on the batcher's thread: logits into the cells -> writer thread -> answer frame

Only the engine process touches the GPU: fronts never import cupy. A front's /metrics, /health and v2 statistics
count its own requests. A front that dies stops the server (exit 1): its clients' connections close with it and
every other front answers what it has accepted before it exits. When the engine process is gone, each front
answers its waiting requests 503 ("the engine process is gone"), stops listening and exits 1.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import multiprocessing.connection
import os
import queue
import selectors
import signal
import socket
import sys
import threading
import time
from multiprocessing import reduction

import numpy as np

from .engine_link import FAILED, OK, Cells, FrameBuffer, answer_frame, status_of
from .front import worker_main

START_TIMEOUT_S = 60.0  # spawning a front imports aiohttp, NumPy and resnet_native: seconds on a busy machine


class PassFd:
    """A file descriptor handed to a spawned process (multiprocessing duplicates it into the child, as it does a
    socket's); in the child it is a plain int."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _received_fd, (reduction.DupFd(self.fd),)


def _received_fd(dup) -> int:
    return dup.detach()


# -- the engine's side ---------------------------------------------------------------------------------------


class EngineBridge:
    """In the engine process: a reader thread taking request frames from every front's socket into the Batcher
    (images read from the front's cells), and a writer thread sending the answer frames back, several per send.
    The logits are written into the cells on the batcher's thread, before the answer is queued."""

    def __init__(self, batcher, links: list):
        """links: one (socket, Cells) per front, index = the front's number."""
        self.batcher, self._links = batcher, links
        self._out = queue.SimpleQueue()  # (front, answer frame), or None: stop
        self._stopping = False
        self._selector = selectors.DefaultSelector()
        for i, (sock, _) in enumerate(links):  # blocking sockets: recv runs only once select says data is there
            self._selector.register(sock, selectors.EVENT_READ, (i, FrameBuffer(answers=False)))
        self._reader = threading.Thread(target=self._read, name="resnet_native-engine-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name="resnet_native-engine-writer", daemon=True)
        self._reader.start()
        self._writer.start()

    def _read(self) -> None:
        while not self._stopping:
            for key, _ in self._selector.select(timeout=0.2):
                front, frames = key.data
                try:
                    data = key.fileobj.recv(1 << 18)
                except OSError:
                    data = b""
                if not data:  # the front is gone: its answers are dropped by the writer
                    self._selector.unregister(key.fileobj)
                    continue
                for rid, cells in frames.feed(data):
                    self._submit(front, rid, cells)

    def _submit(self, front: int, rid: int, cells: np.ndarray) -> None:
        shared = self._links[front][1]
        if not 1 <= len(cells) <= self.batcher.max_batch or cells.min() < 0 or cells.max() >= shared.count:
            self._out.put((front, answer_frame(rid, FAILED, f"ValueError: a request frame with {len(cells)} bad "
                                                           f"cell indices")))
            return
        try:
            self.batcher.submit_owned(shared.images[cells], functools.partial(self._answered, front, rid, cells))
        except Exception as e:  # BatcherFull, BatcherClosed: the request's answer says which
            self._out.put((front, answer_frame(rid, *status_of(e))))

    def _answered(self, front: int, rid: int, cells: np.ndarray, rows, error) -> None:
        if error is None:
            self._links[front][1].logits[cells] = rows
            self._out.put((front, answer_frame(rid, OK)))
        else:
            self._out.put((front, answer_frame(rid, *status_of(error))))

    def _write(self) -> None:
        dead = set()
        while True:
            item = self._out.get()
            batches, stop = {}, False
            while True:  # everything ready now, one send per front
                if item is None:
                    stop = True
                else:
                    batches.setdefault(item[0], []).append(item[1])
                try:
                    item = self._out.get_nowait()
                except queue.Empty:
                    break
            for front, frames in batches.items():
                if front in dead:
                    continue
                sock = self._links[front][0]
                try:
                    sock.sendall(b"".join(frames))
                except OSError:
                    dead.add(front)
            if stop:
                return

    def close(self, timeout: float | None = None) -> None:
        """After the fronts have exited: stop reading, close the Batcher (its queue drains), send the last answers."""
        self._stopping = True
        self._reader.join(timeout)
        self.batcher.close(timeout)
        self._out.put(None)
        self._writer.join(timeout)
        self._selector.close()


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


def serve_workers(batcher, front: dict, workers: int, url) -> int:
    """Run `workers` front processes in front of `batcher` until SIGTERM/SIGINT (exit code 0) or a front's death
    (1). Prints the listening lines (with the fronts' pids) and the stopped line as the single-process CLI.
    front: host, port, grpc_port (0: none), app (make_app's keyword arguments), server (start_server's:
    shutdown_timeout, read_timeout, body_timeout, max_connections), max_message_bytes (gRPC).

    Shutdown: SIGTERM or SIGINT sends SIGTERM to every front, which stops listening, answers its in-flight
    requests (shutdown_timeout) and exits 0; then the batcher is closed (its queue drains). A front that dies or
    exits on its own is reported on stderr and the others are stopped (exit 1)."""
    host, shutdown_timeout = front["host"], front["server"]["shutdown_timeout"]
    if not hasattr(socket, "SO_REUSEPORT") or not hasattr(os, "memfd_create"):
        print("serve: --workers needs SO_REUSEPORT and memfd_create (Linux)", file=sys.stderr)
        return 1
    reserved = []
    try:
        for key in ("port", "grpc_port") if front["grpc_port"] else ("port",):
            reserved.append(_reserve(host, front[key]))
            front = dict(front, **{key: reserved[-1].getsockname()[1]})
    except OSError as e:
        print(f"serve: cannot listen on {host}:{front[key]}: {e}", file=sys.stderr)
        for r in reserved:
            r.close()
        return 1
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    settings = batcher.settings()
    classes = len(front["app"]["classes"])
    links, children = [], []
    for _ in range(workers):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        links.append((mine, Cells.create(settings["max_queue"], classes)))
        children.append(theirs)
    bridge = EngineBridge(batcher, links)
    stop = threading.Event()
    received = []
    previous = {sig: signal.signal(sig, lambda s, _f: (received.append(signal.Signals(s).name), stop.set()))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    procs = []
    code = 0
    try:
        for i in range(workers):
            cells = links[i][1]
            p = ctx.Process(target=worker_main, name=f"resnet_native-serve-front-{i}",
                            args=(i, front, settings, children[i], (PassFd(cells.fd), cells.count, cells.classes),
                                  ready))
            p.start()
            children[i].close()  # the front's end lives in the front: its exit is the engine's end of file
            procs.append(p)
        code = _wait_ready(procs, ready, stop)
        for r in reserved:
            r.close()
        if code == 0 and not stop.is_set():
            pids = [p.pid for p in procs]
            print(json.dumps({"event": "listening", "host": host, "port": front["port"],
                              "url": url(host, front["port"]), "workers": pids}), flush=True)
            if front["grpc_port"]:
                print(json.dumps({"event": "listening_grpc", "host": host, "port": front["grpc_port"],
                                  "url": grpc_url(host, front["grpc_port"]), "workers": pids}), flush=True)
            code = _supervise(procs, stop)
        print(json.dumps({"event": "stopping", "signal": received[0] if received else None}), file=sys.stderr,
              flush=True)
    finally:
        for r in reserved:
            r.close()
        for c in children:
            c.close()
        for p in procs:
            if p.is_alive():
                p.terminate()  # SIGTERM: the front's graceful stop
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
        for sock, cells in links:
            sock.close()
            cells.close()
        ready.close()
        ready.join_thread()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code == 0:
        print(json.dumps({"event": "stopped", "batcher": batcher.counters()}), flush=True)
    return code


def grpc_url(host: str, port: int) -> str:
    """What tritonclient.grpc takes: host:port, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
