"""Rendezvous over TCP: a small key-value store that rank 0 hosts and every rank reaches at MASTER_ADDR:MASTER_PORT.

It carries the few bytes a job exchanges before NCCL exists (the NCCL unique id) and its barriers, each wait under a
deadline, so a rank that never comes, or a rank 0 that never listens, is a TimeoutError naming what is missing
instead of a hang. cupy's store (cupyx.distributed._store.TCPStore) was not wrapped: it is private, forks a server
process, retries for a fixed 25 s, has no timeout on get or barrier, and caps messages at 256 bytes.

Wire format, one persistent connection per rank: a request is (op u8, timeout f64, count u32) and count items
(length u32, bytes); a reply is (status u8, count u32) and its items. Ops: SET [key, value]; GET [key] waits for the
key; WAIT [keys...] waits for all and replies with the keys still missing.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time

from .world import World

OP_SET, OP_GET, OP_WAIT = 1, 2, 3
OK, ABSENT, CLOSED = 0, 1, 2  # replies: done; the timeout passed first; the host closed while the request waited
REQUEST = struct.Struct("!BdI")
REPLY = struct.Struct("!BI")
LENGTH = struct.Struct("!I")
MAX_ITEM_BYTES = 64 << 20  # a bound on what a malformed length can make either side allocate
REPLY_SLACK_S = 2.0  # how much longer than a request's own timeout a client waits for the host's reply
CONNECT_RETRY_S = 0.05  # between attempts to reach a host that is not listening yet
CLOSE_GRACE_S = 0.5  # how long a closing host gives waiting requests to receive their CLOSED reply
# How long a closing host waits for the other ranks to hang up first: a rank whose last barrier has just been
# completed by its SET may not have sent the WAIT that reads the answer yet.
HANGUP_GRACE_S = 5.0
POLL_S = 0.05  # how soon the serving thread notices close()


def _pack(items) -> bytes:
    return b"".join(LENGTH.pack(len(item)) + item for item in items)


class _Handler(socketserver.StreamRequestHandler):
    """One rank's connection: requests answered in order until it closes."""

    def handle(self):
        host = self.server
        with host.cond:
            host.connections.add(self.connection)
        try:
            while (request := self._read_request()) is not None:
                with host.cond:
                    host.in_flight += 1  # until its reply is written: close() waits for it
                try:
                    status, reply = host.answer(*request)
                    self.wfile.write(REPLY.pack(status, len(reply)) + _pack(reply))
                finally:
                    with host.cond:
                        host.in_flight -= 1
                        host.cond.notify_all()
        finally:
            with host.cond:
                host.connections.discard(self.connection)
                host.cond.notify_all()

    def _read_request(self):
        """(op, timeout_s, items), or None at the end of the connection or on a malformed request."""
        header = self.rfile.read(REQUEST.size)
        if len(header) < REQUEST.size:
            return None
        op, timeout_s, count = REQUEST.unpack(header)
        items = []
        for _ in range(count):
            field = self.rfile.read(LENGTH.size)
            length = LENGTH.unpack(field)[0] if len(field) == LENGTH.size else MAX_ITEM_BYTES + 1
            if length > MAX_ITEM_BYTES:
                return None
            item = self.rfile.read(length)
            if len(item) < length:
                return None
            items.append(item)
        if op not in (OP_SET, OP_GET, OP_WAIT) or len(items) < (2 if op == OP_SET else 1 if op == OP_GET else 0):
            return None
        return op, timeout_s, items


class _Host(socketserver.ThreadingTCPServer):
    """Rank 0's side: the keys, and the condition every waiting request sleeps on."""

    allow_reuse_address = True  # a port a finished job used is free again at once
    daemon_threads = True  # an idle connection never keeps the process alive

    def __init__(self, addr: str, port: int):
        super().__init__((addr, port), _Handler)
        self.cond = threading.Condition()
        self.values: dict[bytes, bytes] = {}
        self.connections: set = set()
        self.in_flight = 0  # requests not answered yet
        self.closing = False
        self.thread = threading.Thread(target=self.serve_forever, args=(POLL_S,), name="resnet_native store",
                                       daemon=True)
        self.thread.start()

    def answer(self, op: int, timeout_s: float, items: list[bytes]):
        with self.cond:
            if op == OP_SET:
                self.values[items[0]] = items[1]
                self.cond.notify_all()
                return OK, []
            wanted = items[:1] if op == OP_GET else items
            missing = lambda: [k for k in wanted if k not in self.values]  # noqa: E731
            self.cond.wait_for(lambda: self.closing or not missing(), max(timeout_s, 0.0))
            left = missing()
            if not left:
                return OK, [self.values[items[0]]] if op == OP_GET else []
            return (CLOSED if self.closing else ABSENT), left

    def close(self):
        """Let the other ranks hang up (HANGUP_GRACE_S at most), answer every request still waiting (CLOSED), then
        drop the connections and stop listening."""
        with self.cond:
            self.cond.wait_for(lambda: not self.connections, HANGUP_GRACE_S)
            self.closing = True
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.in_flight == 0, CLOSE_GRACE_S)
            connections = list(self.connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its rank
        self.shutdown()
        self.server_close()


class Store:
    """One rank's connection to the job's store (from rendezvous()); rank 0's also hosts it. Requests go one at a
    time (a lock), and every rank must make the barrier and exchange calls in the same order."""

    def __init__(self, world: World, sock: socket.socket, host: _Host | None):
        self.world = world
        self._sock = sock
        self._host = host
        self._lock = threading.Lock()
        self._generations: dict[str, int] = {}  # calls per barrier / exchange name: every rank counts the same

    def set(self, key: str, value: bytes) -> None:
        """Store value (bytes) under key; a later set replaces it."""
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"value: expected bytes, got {type(value).__name__}")
        self._request(OP_SET, 0.0, [_key(key), bytes(value)])

    def get(self, key: str, timeout_s: float) -> bytes:
        """The value under key, waiting up to timeout_s for some rank to set it; else a TimeoutError."""
        status, items = self._request(OP_GET, checked_timeout(timeout_s), [_key(key)])
        if status != OK:
            why = "was not set within" if status == ABSENT else "was not set before the store closed, after at most"
            raise TimeoutError(f"store at {self.world.address}: key {key!r} {why} {timeout_s} s")
        return items[0]

    def barrier(self, name: str, timeout_s: float) -> None:
        """Return once every rank has called barrier(name); a TimeoutError naming the missing ranks when they have
        not after timeout_s. Names can repeat: the n-th barrier of a name waits for every rank's n-th."""
        self._barrier(name, checked_timeout(timeout_s), f"barrier {name!r}", timeout_s)

    def _barrier(self, name: str, timeout_s: float, what: str, shown_timeout_s: float) -> None:
        prefix = self.next_key(f"barrier/{name}") + "/"
        self.set(prefix + str(self.world.rank), b"")
        keys = [_key(prefix + str(r)) for r in range(self.world.world_size)]
        status, missing = self._request(OP_WAIT, timeout_s, keys)
        if status != OK:
            ranks = sorted(int(k.decode()[len(prefix):]) for k in missing)
            why = f"within {shown_timeout_s} s" if status == ABSENT else "before rank 0 stopped waiting"
            raise TimeoutError(f"{what} at {self.world.address}: ranks {ranks} of {self.world.world_size} "
                               f"did not arrive {why}")

    def next_key(self, name: str) -> str:
        """A key for the n-th use of name (every rank calls it in the same order, so they agree)."""
        generation = self._generations.get(name, 0)
        self._generations[name] = generation + 1
        return f"{name}/{generation}"

    def close(self) -> None:
        """Close the connection; on rank 0 also stop the store (ranks still waiting get their answer first)."""
        self._sock.close()
        if self._host is not None:
            self._host.close()
            self._host = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, op: int, timeout_s: float, items: list[bytes]):
        with self._lock:
            self._sock.settimeout(timeout_s + REPLY_SLACK_S)  # a host that stopped answering is an error, not a hang
            try:
                self._sock.sendall(REQUEST.pack(op, timeout_s, len(items)) + _pack(items))
                status, count = REPLY.unpack(self._read(REPLY.size))
                return status, [self._read(LENGTH.unpack(self._read(LENGTH.size))[0]) for _ in range(count)]
            except TimeoutError:  # the socket's own; the Store is unusable after it
                raise TimeoutError(f"store at {self.world.address}: no reply within {timeout_s + REPLY_SLACK_S} s"
                                   ) from None
            except ConnectionError as e:
                raise ConnectionError(f"store at {self.world.address}: connection lost ({e}); did rank 0 exit?"
                                      ) from None

    def _read(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = self._sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the host")
            data += chunk
        return bytes(data)


def _key(key: str) -> bytes:
    if not isinstance(key, str) or not key:
        raise TypeError(f"key: expected a non-empty str, got {key!r}")
    return key.encode()


def checked_timeout(timeout_s, *, zero: bool = True) -> float:
    """timeout_s as a float number of seconds, >= 0 (> 0 without `zero`) and below 1e9, else a ValueError."""
    number = not isinstance(timeout_s, bool) and isinstance(timeout_s, int | float)
    if not number or not (timeout_s >= 0 if zero else timeout_s > 0) or not timeout_s < 1e9:
        raise ValueError(f"timeout_s: expected a number of seconds {'>=' if zero else '>'} 0, got {timeout_s!r}")
    return float(timeout_s)


def connect(world: World, deadline: float, timeout_s: float) -> socket.socket:
    """A connection to the store at world's address, retried until time.monotonic() reaches deadline."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"rendezvous: no store at {world.address} within {timeout_s} s (rank 0 has not "
                               f"started, or MASTER_ADDR / MASTER_PORT differ between ranks)")
        try:
            sock = socket.create_connection((world.master_addr, world.master_port), timeout=left)
        except socket.gaierror as e:
            raise OSError(f"rendezvous: MASTER_ADDR {world.master_addr!r} does not resolve: {e}") from None
        except OSError:
            time.sleep(min(CONNECT_RETRY_S, max(left, 0.0)))
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def rendezvous(world: World, timeout_s: float) -> Store:
    """Every rank of world checks in at rank 0's store, which rank 0 starts; returns this rank's Store once all
    have. A TimeoutError names the ranks missing after timeout_s (on every waiting rank), or the address when no
    store listens there in time."""
    timeout_s = checked_timeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    host = None
    if world.is_primary:
        try:
            host = _Host(world.master_addr, world.master_port)
        except OSError as e:
            raise OSError(e.errno, f"rendezvous: rank 0 cannot listen on {world.address}: {e.strerror}") from None
    try:
        store = Store(world, connect(world, deadline, timeout_s), host)
    except BaseException:
        if host is not None:
            host.close()
        raise
    try:
        store._barrier("rendezvous", max(deadline - time.monotonic(), 0.0), "rendezvous", timeout_s)
    except BaseException:
        store.close()
        raise
    return store


def exchange_nccl_id(store: Store, world: World, make_id, timeout_s: float = 60.0) -> bytes:
    """The job's NCCL unique id: rank 0 calls make_id() (cupy.cuda.nccl.get_unique_id on the GPU, as bytes) and
    sets it; every other rank gets it, waiting up to timeout_s. Call it on every rank, in the same order."""
    key = store.next_key("nccl_id")
    if world.is_primary:
        value = make_id()
        if not isinstance(value, bytes | bytearray):
            raise TypeError(f"make_id: expected it to return bytes, got {type(value).__name__}")
        store.set(key, bytes(value))
        return bytes(value)
    return store.get(key, timeout_s)
