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
from collections.abc import Iterator

import numpy as np

BLOCK = 512
_REGULAR = frozenset(b"0\x007")  # regular file, its pre-POSIX spelling, contiguous file
_SKIPPED = frozenset(b"123456K")  # links, devices, directories, FIFOs, a GNU long link target
_COMPRESSED = ((b"\xfd7zXZ\x00", lzma.open), (b"\x1f\x8b", gzip.open), (b"BZh", bz2.open))
_CHUNK = 1 << 20  # bytes of a skipped member read at a time


class Unsupported(Exception):
    """The archive uses a tar feature this reader does not model; tarfile reads it."""


def open_stream(path):
    """A binary file object of the archive's tar bytes, decompressing xz, gzip or bzip2 by their magic."""
    path = pathlib.Path(path)
    with open(path, "rb") as f:
        magic = f.read(6)
    for prefix, opener in _COMPRESSED:
        if magic.startswith(prefix):
            return opener(path, "rb")
    return open(path, "rb")


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
