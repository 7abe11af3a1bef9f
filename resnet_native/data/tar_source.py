"""CIFAR-10 from a tar archive, read in one streaming pass with nothing extracted to disk.

Batches (python or binary version) are parsed as they pass. Images are kept encoded until there are enough of them
to be worth a process pool (cifar10._PARALLEL_MIN_IMAGES); from then on they go to the pool in chunks while the
stream goes on, so decoding overlaps reading. For compressed archives a thread decompresses ahead of tarfile's
parsing: lzma, zlib and bz2 release the GIL, so the two share the reading time instead of adding up.
"""

from __future__ import annotations

import bz2
import lzma
import pathlib
import queue
import re
import tarfile
import threading
import zlib

import numpy as np

from . import cifar10
from .cifar10 import (
    _SPLITS,
    _TEST_BATCH,
    _TRAIN_BATCHES,
    CLASSES,
    IMAGE_SHAPE,
    _class_index,
    _concat,
    _decode_listing,
    _fork_pool,
    _image_extensions,
    _resolve_workers,
    decode_image,
    parse_binary_batch,
    parse_python_batch,
)

_BATCH_NAME = re.compile(r"^(data_batch_[1-5]|test_batch)(\.bin)?$")
# Images per task handed to the pool while streaming: big enough that a task's overhead is small next to its
# decoding, small enough that the workers start soon after the threshold is reached.
_CHUNK_IMAGES = 1024
# The images left when the stream ends are split over all workers, in pieces of at least this many.
_TAIL_CHUNK_MIN = 64
# The decompressing thread reads this much compressed input at a time and hands over pieces of at most this much
# output. Large pieces keep its GIL hand-overs rare (small ones made it slower than decompressing inline).
_COMPRESSED_READ = 1 << 20
_PIECE_BYTES = 4 << 20
_QUEUED_PIECES = 8  # at most this many pieces wait for tarfile: bounds the memory ahead of the parser


def read_tar(path: pathlib.Path, workers):
    """A tar archive of python batches, binary batches or train/<class>/* image folders -> [(images, labels) for
    train, test]. Image folders give what _decode_listing gives for them, in its order, with its errors."""
    workers = _resolve_workers(workers)
    exts = _image_extensions()
    batches = {}  # name -> parsed (images, labels)
    reader = _DecompressingReader.open(path)
    # The pool forks; a fork must not happen while the decompressing thread runs (only the forking thread
    # survives in the child, and any lock that thread held stays taken). So the thread starts after the pool's
    # workers exist, or right away when there will be no pool.
    images = _ImageStream(workers, on_pool_started=None if reader is None else reader.start_thread)
    try:
        if reader is not None and workers <= 1:
            reader.start_thread()
        tar = tarfile.open(path, mode="r|*") if reader is None else tarfile.open(fileobj=reader, mode="r|")
        with tar:
            for member in tar:
                if not member.isfile():
                    continue
                parts = _name_parts(member.name)
                base = parts[-1]
                if base.startswith("."):
                    continue
                m = _BATCH_NAME.match(base)
                if m:
                    raw = tar.extractfile(member).read()
                    parse = parse_binary_batch if m.group(2) else parse_python_batch
                    batches[base] = parse(raw, f"{path}:{member.name}")
                elif len(parts) >= 3 and parts[-3] in _SPLITS and _suffix(base).lower() in exts:
                    label = _class_index(parts[-2], f"{path}:{'/'.join(parts[:-1])}")
                    images.add(_SPLITS.index(parts[-3]), label, base, tar.extractfile(member).read())
        if batches:
            suffix = ".bin" if any(k.endswith(".bin") for k in batches) else ""
            split_arrays = []
            for names in (_TRAIN_BATCHES, (_TEST_BATCH,)):
                missing = [n + suffix for n in names if n + suffix not in batches]
                if missing:
                    raise ValueError(f"{path}: archive lacks CIFAR-10 batches {missing}")
                split_arrays.append(_concat([batches[n + suffix] for n in names]))
            return split_arrays
        if not images.items:
            raise ValueError(f"{path}: archive holds neither CIFAR-10 batches nor train/<class>/* image folders")
        return images.result()
    finally:
        images.close()
        if reader is not None:
            reader.close()


def _name_parts(name: str):
    """pathlib.PurePosixPath(name).parts, without its cost per member when the name needs no normalizing."""
    parts = name.split("/")
    if "" in parts or "." in parts:
        return pathlib.PurePosixPath(name).parts
    return parts


def _suffix(base: str) -> str:
    """pathlib's suffix of a file name that does not start with '.'."""
    i = base.rfind(".")
    return base[i:] if 0 < i < len(base) - 1 else ""


# ----------------------------------------------------------------------------------------------------------------
# Decoding while streaming


def _decode_chunk_noting_failures(items):
    """Worker entry: [(bytes, name), ...] -> (uint8 (n, 32, 32, 3), indices that failed). A failure does not stop
    the chunk: the parent re-decodes the failed image that comes first in the output order, which raises the
    error the serial path would have raised."""
    out = np.zeros((len(items), *IMAGE_SHAPE), np.uint8)
    failed = []
    for i, (source, name) in enumerate(items):
        try:
            out[i] = decode_image(source, name)
        except Exception:
            failed.append(i)
    return out, failed


class _ImageStream:
    """The archive's images in stream order, sent to a pool in chunks once there are enough of them."""

    def __init__(self, workers: int, on_pool_started=None):
        self.workers = workers
        self.on_pool_started = on_pool_started
        self.keys = []  # (split index, class index, file name): what _decode_listing sorts by
        self.items = []  # (encoded bytes, name for errors)
        self.pool = None
        self.futures = []  # (index of the chunk's first image, future)
        self.submitted = 0

    def add(self, split: int, label: int, base: str, raw: bytes) -> None:
        self.keys.append((split, label, base))
        self.items.append((raw, f"{_SPLITS[split]}/{CLASSES[label]}/{base}"))
        if self.pool is None:
            if self.workers > 1 and len(self.items) >= cifar10._PARALLEL_MIN_IMAGES:
                self.pool = _fork_pool(self.workers)
                # Everything so far, also a part chunk: the first submit forks the workers, before the callback
                # may start a thread.
                self._submit_chunks(_CHUNK_IMAGES, whole_only=False)
                if self.on_pool_started is not None:
                    self.on_pool_started()
        elif len(self.items) - self.submitted >= _CHUNK_IMAGES:
            self._submit_chunks(_CHUNK_IMAGES, whole_only=True)

    def _submit_chunks(self, size: int, whole_only: bool) -> None:
        end = len(self.items)
        while self.submitted < end and (not whole_only or end - self.submitted >= size):
            stop = min(self.submitted + size, end)
            future = self.pool.submit(_decode_chunk_noting_failures, self.items[self.submitted:stop])
            self.futures.append((self.submitted, future))
            self.submitted = stop

    def result(self):
        """[(images, labels) for train, test], ordered by (split, class, file name) like _decode_listing."""
        if self.pool is None:  # too few images for a pool, or one worker: the serial path
            listing = {split: [] for split in _SPLITS}
            for (split, label, base), (raw, _) in zip(self.keys, self.items, strict=True):
                listing[_SPLITS[split]].append((label, base, raw))
            return _decode_listing(listing, self.workers)
        n = len(self.items)
        self._submit_chunks(max(_TAIL_CHUNK_MIN, -(-(n - self.submitted) // self.workers)), whole_only=False)
        order = sorted(range(n), key=self.keys.__getitem__)  # stable: equal keys keep their stream order
        position = np.empty(n, np.intp)
        position[order] = np.arange(n)
        images = np.empty((n, *IMAGE_SHAPE), np.uint8)
        failed = []
        for start, future in self.futures:
            decoded, bad = future.result()
            images[position[start:start + len(decoded)]] = decoded
            failed.extend(start + i for i in bad)
        for i in sorted(failed, key=position.__getitem__):
            images[position[i]] = decode_image(*self.items[i])
        split_of = [self.keys[i][0] for i in order]
        n_train = split_of.count(0)
        labels = [self.keys[i][1] for i in order]
        return [(images[:n_train], np.array(labels[:n_train], dtype=np.int32)),
                (images[n_train:], np.array(labels[n_train:], dtype=np.int32))]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


# ----------------------------------------------------------------------------------------------------------------
# Decompression ahead of tarfile


# tarfile's own "r|*" detection: the same magic numbers, so an archive it would read as plain tar stays so.
_MAGICS = ((b"\x1f\x8b\x08", "gz"), (b"BZh91", "bz2"), (b"\x5d\x00\x00\x80\x00", "xz"), (b"\xfd7zXZ", "xz"))
_END = object()


def _inflate(d, data: bytes) -> bytes:
    """d.decompress, its errors turned into the ReadError tarfile's own decompression raises for them."""
    try:
        return d.decompress(data, _PIECE_BYTES)
    except (lzma.LZMAError, zlib.error, EOFError, OSError) as e:
        raise tarfile.ReadError("invalid compressed data") from e


class _DecompressingReader:
    """A read-only file of a compressed archive's decompressed bytes, for tarfile.open(fileobj=..., mode="r|").

    Until start_thread() it decompresses in the caller's thread, as tarfile would; after it a thread decompresses
    ahead into a bounded queue. Decompression errors surface as tarfile's own ReadError, when tarfile reaches the
    bytes concerned.
    """

    @classmethod
    def open(cls, path) -> _DecompressingReader | None:
        """A reader for a gzip, bzip2 or xz/lzma file; None for anything else (left to tarfile's "r|*")."""
        with open(path, "rb") as f:
            head = f.read(8)
        kind = next((k for magic, k in _MAGICS if head.startswith(magic)), None)
        return None if kind is None else cls(path, kind)

    def __init__(self, path, kind: str):
        self._file = open(path, "rb")  # closed by close()
        self._pieces = self._decompress(kind)
        self._queue = None
        self._thread = None
        self._closed = False
        self._done = False
        self._error = None
        self._buf = b""
        self._pos = 0

    def _decompress(self, kind):
        """Decompressed pieces of at most _PIECE_BYTES, ending where the compressed stream or the file does."""
        f = self._file
        if kind == "gz":
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while not d.eof:
                data = d.unconsumed_tail or f.read(_COMPRESSED_READ)
                if not data:
                    break
                out = _inflate(d, data)
                if out:
                    yield out
            return
        d = lzma.LZMADecompressor() if kind == "xz" else bz2.BZ2Decompressor()
        while not d.eof:
            data = f.read(_COMPRESSED_READ) if d.needs_input else b""
            if not data and d.needs_input:
                break
            out = _inflate(d, data)
            if out:
                yield out

    def start_thread(self) -> None:
        if self._thread is not None or self._closed:
            return
        self._queue = queue.Queue(maxsize=_QUEUED_PIECES)
        self._thread = threading.Thread(target=self._run, name="cifar10-decompress", daemon=True)
        self._thread.start()

    def _run(self):
        try:
            for piece in self._pieces:
                if not self._put(piece):
                    return
            self._put(_END)
        except BaseException as e:  # handed to the reader, which raises it in tarfile's thread
            self._put(e)

    def _put(self, item) -> bool:
        while not self._closed:
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _next_piece(self):
        if self._error is not None:
            raise self._error
        try:
            item = next(self._pieces, _END) if self._thread is None else self._queue.get()
            if isinstance(item, BaseException):
                raise item
        except BaseException as e:
            self._error = e  # the decompression has ended: a later read raises again rather than wait or end
            raise
        return item

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(_PIECE_BYTES), b""))
        while self._pos >= len(self._buf):
            if self._done:
                return b""
            piece = self._next_piece()
            if piece is _END:
                self._done = True
                return b""
            self._buf, self._pos = piece, 0
        out = self._buf[self._pos:self._pos + size]
        self._pos += len(out)
        return out

    def close(self) -> None:
        """Stops the thread (it finishes the piece in hand, at most one decompress call) and closes the file."""
        self._closed = True
        if self._thread is not None:
            self._thread.join()
        self._file.close()
