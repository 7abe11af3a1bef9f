"""The regular files of a tar archive, in one streaming pass without a Python object per member.

`tarfile` builds a TarInfo per member and decodes every header field. For the CIFAR-10 JPEG archive's 60,000
small members that walk costs more than the xz decompression under it. This reader takes only what the CIFAR-10
loaders use, each regular file's name and bytes, from ustar, GNU and pax headers. Every header's checksum is
verified in one vectorised pass once the archive has been read, so a misparse cannot go unnoticed: the caller
uses nothing before the iterator is exhausted. Anything it does not model (sparse files, sizes in base-256,
pre-POSIX headers without the ustar magic, global pax paths) raises Unsupported, and the caller reads the archive
with `tarfile` instead.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import pathlib
import queue
import threading
from collections.abc import Iterator

import numpy as np

BLOCK = 512
_REGULAR = frozenset(b"0\x007")  # regular file, its pre-POSIX spelling, contiguous file
_SKIPPED = frozenset(b"123456K")  # links, devices, directories, FIFOs, a GNU long link target
_XZ = b"\xfd7zXZ\x00"
_COMPRESSED = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open))
_PIECE = 1 << 20  # compressed (xz) or decompressed bytes read at a time on the read-ahead thread
_OUT_PIECE = 8 << 20  # decompressed xz bytes at most per call: a small file may expand without bound
_CHUNK = 1 << 20  # bytes of a skipped member read at a time


class Unsupported(Exception):
    """The archive uses a tar feature this reader does not model; tarfile reads it."""


def open_stream(path):
    """A binary file object of the archive's tar bytes, decompressing xz, gzip or bzip2 by their magic, on a thread
    of its own (ReadAhead) so that the caller's parsing runs beside the decompression."""
    path = pathlib.Path(path)
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic.startswith(_XZ):
        return ReadAhead(_xz_pieces(path))
    for prefix, opener in _COMPRESSED:
        if magic.startswith(prefix):
            return ReadAhead(_pieces(opener(path, "rb")))
    return open(path, "rb")


def _pieces(stream):
    """A stream's bytes in large reads."""
    with stream:
        while piece := stream.read(_PIECE):
            yield piece


def _xz_pieces(path):
    """The decompressed bytes of an .xz file, at most _OUT_PIECE at a time, each from one call of the decompressor
    on a large compressed piece: it releases the GIL for the whole call (lzma.open's reads hand it 8 kB at a time).
    Concatenated streams are read in turn and trailing bytes that start no stream are ignored, as lzma.open does.
    ValueError naming the file for a corrupt or truncated stream."""
    with open(path, "rb") as f:
        decompressor = lzma.LZMADecompressor()
        while True:
            try:
                if decompressor.eof:  # another stream, or trailing bytes
                    data = decompressor.unused_data or f.read(_PIECE)
                    if not data:
                        return
                    decompressor = lzma.LZMADecompressor()
                    try:
                        piece = decompressor.decompress(data, _OUT_PIECE)
                    except lzma.LZMAError:
                        return
                else:
                    data = f.read(_PIECE) if decompressor.needs_input else b""
                    if decompressor.needs_input and not data:
                        raise ValueError(f"{path}: truncated xz stream")
                    piece = decompressor.decompress(data, _OUT_PIECE)
            except lzma.LZMAError as e:
                raise ValueError(f"{path}: corrupt xz stream ({e})") from None
            if piece:
                yield piece


class ReadAhead:
    """read(n) of a stream of byte pieces that a thread produces ahead of the reader: a caller parsing in Python
    runs beside the decompression (which releases the GIL) instead of waiting in each of its small reads. At most
    QUEUED pieces wait unread; an error of the stream is raised by the read that reaches it; close() stops the
    thread."""

    QUEUED = 8

    def __init__(self, pieces):
        self._pieces, self._stop = pieces, threading.Event()
        self._queue = queue.Queue(self.QUEUED)
        self._buf, self._pos, self._done = b"", 0, False
        self._thread = threading.Thread(target=self._fill, name="tar-read-ahead", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            for piece in self._pieces:
                if not self._put(piece):
                    break
            self._put(b"")
        except BaseException as e:  # raised again by the reader's read()
            self._put(e)
        finally:
            self._pieces.close()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n and not self._done:
            piece = self._queue.get()
            if isinstance(piece, BaseException):
                self._done = True
                raise piece
            self._done = not piece
            self._buf, self._pos = self._buf[self._pos:] + piece, 0
        out = self._buf[self._pos:self._pos + n]
        self._pos += len(out)
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def regular_files(path) -> Iterator[tuple[str, bytes]]:
    """Yield (name, bytes) of every regular file of the tar archive at `path`, in archive order. Raises ValueError
    (naming the archive) when it is truncated or a header's checksum is wrong, once the last file has been
    yielded; Unsupported for what only tarfile reads."""
    with open_stream(path) as f:
        headers = bytearray()  # every header block read, checked at the end
        pending = {}  # the next member's name or size from a pax ('x') or GNU long-name ('L') header
        while True:
            h = f.read(BLOCK)
            if len(h) < BLOCK or h.count(0) == BLOCK:
                if 0 < len(h) < BLOCK:
                    raise ValueError(f"{path}: truncated tar archive (a header block of {len(h)} bytes)")
                break  # end of archive: a zero block, or the end of the stream at a header boundary
            if h[257:262] != b"ustar":
                raise Unsupported("a header without the ustar magic")
            headers += h
            kind = h[156]
            size = pending.pop("size", None)
            if size is None:
                size = _octal(h[124:136], path)
            data_blocks = -(-size // BLOCK) * BLOCK
            if kind in _REGULAR:
                name = pending.pop("path", None) or _header_name(h)
                data = _read_data(f, data_blocks, path, repr(name))
                if not (kind == 0 and name.endswith("/")):  # a pre-POSIX directory, as tarfile reads it
                    yield name, data[:size]
            elif kind in (ord("x"), ord("L")):
                data = _read_data(f, data_blocks, path, "an extended header")
                pending.update(_pax(data[:size], path) if kind == ord("x") else {"path": _gnu_name(data[:size])})
            elif kind == ord("g"):
                data = _read_data(f, data_blocks, path, "a global header")
                if {"path", "size"} & _pax(data[:size], path).keys():
                    raise Unsupported("a global pax header that sets a path or size")
            elif kind in _SKIPPED:
                pending.clear()
                _skip(f, data_blocks, path)
            else:  # sparse files and vendor types
                raise Unsupported(f"member type {chr(kind)!r}")
        _check_headers(headers, path)


def _read_data(f, n: int, path, what: str) -> bytes:
    """A member's n bytes of data blocks; ValueError naming `what` when the archive ends first."""
    data = f.read(n)
    if len(data) < n:
        raise ValueError(f"{path}: truncated tar archive in {what}")
    return data


def _skip(f, n: int, path) -> None:
    while n > 0:
        got = len(f.read(min(n, _CHUNK)))
        if got == 0:
            raise ValueError(f"{path}: truncated tar archive")
        n -= got


def _octal(field: bytes, path) -> int:
    if field[0] & 0x80:
        raise Unsupported("a base-256 number")
    digits = field.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise ValueError(f"{path}: corrupt tar header (numeric field {bytes(field)!r})") from None


def _header_name(h: bytes) -> str:
    name = h[0:100].split(b"\0", 1)[0]
    if h[257:263] == b"ustar\x00":  # POSIX: a prefix (the GNU format keeps times there instead)
        prefix = h[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _gnu_name(data: bytes) -> str:
    return data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax(data: bytes, path) -> dict:
    """The 'path' and 'size' records of a pax header ("<length> <key>=<value>\\n" each)."""
    out, pos = {}, 0
    while pos < len(data):
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            length = 0
        end = pos + length
        if space < 0 or length <= 0 or end > len(data) or data[end - 1:end] != b"\n":
            raise ValueError(f"{path}: corrupt pax header")
        key, sep, value = data[space + 1:end - 1].partition(b"=")
        if not sep:
            raise ValueError(f"{path}: corrupt pax header")
        if key == b"path":
            out["path"] = value.decode("utf-8", "surrogateescape")
        elif key == b"size":
            out["size"] = _octal_free_size(value, path)
        elif key.startswith(b"GNU.sparse"):
            raise Unsupported("a pax sparse file")
        pos = end
    return out


def _octal_free_size(value: bytes, path) -> int:
    try:
        size = int(value)
    except ValueError:
        size = -1
    if size < 0:
        raise ValueError(f"{path}: corrupt pax size {bytes(value)!r}")
    return size


def _check_headers(headers: bytearray, path) -> None:
    """Every header's stored checksum against the sum of its bytes with the checksum field as spaces (unsigned,
    or signed as some old writers computed it), all at once."""
    if not headers:
        return
    blocks = np.frombuffer(headers, np.uint8).reshape(-1, BLOCK)
    field = blocks[:, 148:156]
    unsigned = blocks.sum(1, dtype=np.int64) - field.sum(1, dtype=np.int64) + 8 * ord(" ")
    high = (blocks >= 128).sum(1, dtype=np.int64) - (field >= 128).sum(1, dtype=np.int64)
    stored = np.array([_octal(bytes(f), path) for f in field], dtype=np.int64)
    bad = np.flatnonzero((stored != unsigned) & (stored != unsigned - 256 * high))
    if bad.size:
        raise ValueError(f"{path}: corrupt tar header (checksum) at member {int(bad[0]) + 1}")
