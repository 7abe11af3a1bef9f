"""What a front process and the engine process share: image cells in shared memory and a socket of small frames.

    cells = Cells.create(4096, classes=10)              # in the engine process, before spawning the front
    images, logits = cells.images, cells.logits         # (4096, 32, 32, 3) uint8 and (4096, 10) float32 views
    front: writes a request's images into free cells, sends request_frame(rid, cell_indices)
    engine: reads the images from those cells, writes their logits into the same cells, sends answer_frame(rid, 0)

The pixels and logits never go through a pipe or pickle: a frame carries a request id and cell indices (4 bytes
per image) one way, a request id and a status the other. The memory is a memfd mapped by both processes, so
nothing is left in /dev/shm or in a resource tracker when either dies. A front owns the allocation of its cells;
a cell stays taken until its answer has arrived (or the engine is gone), so the engine never writes into a cell
that a later request already uses.
"""

from __future__ import annotations

import mmap
import os
import struct

import numpy as np

from .batcher import IMAGE_SHAPE, BatcherClosed, BatcherFull

_IMAGE_BYTES = int(np.prod(IMAGE_SHAPE))
REQUEST = struct.Struct("<II")  # request id, images; then that many int32 cell indices
ANSWER = struct.Struct("<IBH")  # request id, status, message bytes; then the UTF-8 message
OK, FULL, CLOSED, FAILED = 0, 1, 2, 3
MAX_MESSAGE = 2000  # bytes of an error message in an answer frame


class Cells:
    """Shared image and logit cells, mapped from a memfd (Linux). `fd` is what a child process maps."""

    def __init__(self, fd: int, count: int, classes: int):
        self.fd, self.count, self.classes = fd, int(count), int(classes)
        images_bytes = self.count * _IMAGE_BYTES
        size = images_bytes + self.count * self.classes * 4
        self._map = mmap.mmap(fd, size)
        self.images = np.frombuffer(self._map, np.uint8, images_bytes).reshape(self.count, *IMAGE_SHAPE)
        self.logits = np.frombuffer(self._map, np.float32, self.count * self.classes, images_bytes) \
            .reshape(self.count, self.classes)

    @classmethod
    def create(cls, count: int, classes: int) -> Cells:
        if not hasattr(os, "memfd_create"):
            raise OSError("shared image cells need memfd_create (Linux)")
        fd = os.memfd_create("resnet_native-serve-cells", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, int(count) * (_IMAGE_BYTES + int(classes) * 4))
            return cls(fd, count, classes)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Unmap and close (views taken from images / logits must be gone first)."""
        self.images = self.logits = None
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with the process
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class FreeCells:
    """A front's free list of cell indices: take(n) -> int32 indices or None when fewer than n are free."""

    def __init__(self, count: int):
        self._free = list(range(count - 1, -1, -1))  # taken from the end: a lone request gets cells 0, 1, 2...

    def take(self, n: int):
        if n > len(self._free):
            return None
        taken = np.array(self._free[-n:], np.int32)
        del self._free[-n:]
        return taken

    def give(self, cells) -> None:
        self._free.extend(cells.tolist())


def request_frame(rid: int, cells: np.ndarray) -> bytes:
    return REQUEST.pack(rid, len(cells)) + cells.tobytes()


def answer_frame(rid: int, status: int, message: str = "") -> bytes:
    data = message.encode("utf-8", "replace")[:MAX_MESSAGE]
    return ANSWER.pack(rid, status, len(data)) + data


class FrameBuffer:
    """Bytes from a stream socket in, whole frames out: requests (rid, cells) or answers (rid, status, message)."""

    def __init__(self, answers: bool):
        self._answers = answers
        self._buf = bytearray()

    def feed(self, data: bytes) -> list:
        self._buf += data
        frames, at, buf = [], 0, self._buf
        if self._answers:
            while len(buf) - at >= ANSWER.size:
                rid, status, n = ANSWER.unpack_from(buf, at)
                end = at + ANSWER.size + n
                if end > len(buf):
                    break
                message = bytes(buf[at + ANSWER.size:end]).decode("utf-8", "replace") if n else ""
                frames.append((rid, status, message))
                at = end
        else:
            while len(buf) - at >= REQUEST.size:
                rid, n = REQUEST.unpack_from(buf, at)
                end = at + REQUEST.size + 4 * n
                if end > len(buf):
                    break
                frames.append((rid, np.frombuffer(bytes(buf[at + REQUEST.size:end]), np.int32)))
                at = end
        del buf[:at]
        return frames


# -- statuses of answer frames--------------------------------------------------------------------------------


def status_of(e: BaseException) -> tuple:
    if isinstance(e, BatcherFull):
        return FULL, str(e)
    if isinstance(e, BatcherClosed):
        return CLOSED, str(e)
    return FAILED, f"{type(e).__name__}: {e}"


def error_of(status: int, message: str) -> BaseException:
    if status == FULL:
        return BatcherFull(message)
    if status == CLOSED:
        return BatcherClosed(message)
    # The engine's exception, same name and message (the 500 says "inference failed: Name: message").
    name, _, text = message.partition(": ")
    return type(name if name.isidentifier() else "EngineError", (RuntimeError,), {})(text)
