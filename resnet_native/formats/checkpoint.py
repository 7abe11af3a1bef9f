"""Training checkpoints: nested state (dicts/lists of arrays and plain values) in one .npz file, written atomically.

No pickle: every array is its own .npz member, and the nesting plus all non-array values are JSON in the member
"__tree__", with {"__array__": "name"} where an array was, so loading cannot run code and plain NumPy opens the file.
Writes go through _core.files (temporary file, fsync, os.replace), so a crash leaves the old checkpoint or the new
one, never half; a temporary left by a killed writer is removed only by a writer that owns its folder
(training/checkpoint_writer.remove_stale_temporaries). Reading trusts nothing in the file: a truncated or foreign
file, a malformed tree or a member whose header claims more data than it holds is a ValueError naming the file,
found before any array is allocated.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
import zlib
from tokenize import TokenError

import numpy as np

from .._core.files import atomic_write_bytes, current_umask, fsync_dir  # noqa: F401  (part of the API)

FORMAT = "resnet_native.checkpoint/1"
_TREE = "__tree__"
_RESERVED = frozenset({"__array__", "__tuple__", "__items__"})


def _to_numpy(x):
    if hasattr(x, "__cuda_array_interface__"):  # a cupy array left in some state dict
        return x.get()
    return x


def _flatten(obj, arrays: dict):
    obj = _to_numpy(obj)
    if isinstance(obj, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = obj
        return {"__array__": key}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not _RESERVED.intersection(obj):
            return {k: _flatten(v, arrays) for k, v in obj.items()}
        # Non-str keys (e.g. an optimizer's per-parameter state keyed by index) keep their type as pairs.
        return {"__items__": [[_flatten(k, arrays), _flatten(v, arrays)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_flatten(v, arrays) for v in obj]}
    if isinstance(obj, list):
        return [_flatten(v, arrays) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"checkpoint: cannot store a {type(obj).__name__}")


def _unflatten(node, arrays, where="tree"):
    """The state a tree node describes; ValueError naming the node for anything save_checkpoint cannot have
    written (KeyError, TypeError and friends would not say which file or node)."""
    if isinstance(node, dict):
        if "__array__" in node:
            name = node["__array__"]
            if len(node) != 1 or not isinstance(name, str):
                raise ValueError(f"{where}: malformed array reference {node!r}")
            if name not in arrays:
                raise ValueError(f"{where}: member {name!r} is missing")
            return arrays[name]()
        if "__tuple__" in node:
            if len(node) != 1 or not isinstance(node["__tuple__"], list):
                raise ValueError(f"{where}: malformed tuple {node!r}")
            return tuple(_unflatten(v, arrays, f"{where}[{i}]") for i, v in enumerate(node["__tuple__"]))
        if "__items__" in node:
            items = node["__items__"]
            if len(node) != 1 or not isinstance(items, list) or not all(
                    isinstance(p, list) and len(p) == 2 for p in items):
                raise ValueError(f"{where}: malformed mapping {node!r}")
            out = {}
            for i, (k, v) in enumerate(items):
                key = _unflatten(k, arrays, f"{where}.__items__[{i}][0]")
                try:
                    out[key] = _unflatten(v, arrays, f"{where}.__items__[{i}][1]")
                except TypeError:  # an unhashable key (a list, a dict)
                    raise ValueError(f"{where}.__items__[{i}]: a key of type {type(key).__name__}") from None
            return out
        return {k: _unflatten(v, arrays, f"{where}.{k}") for k, v in node.items()}
    if isinstance(node, list):
        return [_unflatten(v, arrays, f"{where}[{i}]") for i, v in enumerate(node)]
    return node


def save_checkpoint(path, state: dict) -> None:
    """Write a nested state dict (arrays, numbers, str, bool, None, lists, tuples, dicts) atomically."""
    if not isinstance(state, dict):
        raise TypeError(f"state: expected a dict, got {type(state).__name__}")
    arrays = {}
    tree = _flatten(state, arrays)
    meta = json.dumps({"format": FORMAT, "tree": tree})
    members = dict(arrays)
    members[_TREE] = np.frombuffer(meta.encode(), dtype=np.uint8)
    atomic_write_bytes(path, lambda f: np.savez(f, **members))


_CHUNK = 16 << 20


def _npz_error(path, what: str) -> ValueError:
    return ValueError(f"{path}: {what}")


def _member_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path) -> tuple:
    """(shape, fortran_order, dtype, header bytes) of one .npy member, checked against the member's size."""
    name = info.filename[:-len(".npy")]
    if info.flag_bits & 0x1:
        raise _npz_error(path, f"member {name!r} is encrypted")
    # np.savez stores, np.savez_compressed deflates; another method's decompressor (bzip2, LZMA) raises its own errors.
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise _npz_error(path, f"member {name!r} uses zip compression method {info.compress_type} (np.savez "
                               "writes stored or deflated members)")
    stored = info.compress_type == zipfile.ZIP_STORED
    # Stored members (np.savez) hold their bytes as they are; deflate cannot shrink data more than ~1032:1.
    if (stored and info.compress_size != info.file_size) or info.file_size > 1032 * info.compress_size + 1024:
        raise _npz_error(path, f"member {name!r}: its zip entry claims {info.file_size} bytes of data in "
                               f"{info.compress_size} bytes")
    with zf.open(info) as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy version {version}")
        except (ValueError, SyntaxError, TokenError) as e:  # NumPy's header parser raises all three
            raise _npz_error(path, f"member {name!r} is not a valid .npy array ({type(e).__name__}: {e})") from None
        header = f.tell()
    if dtype.hasobject:
        raise _npz_error(path, f"member {name!r} holds Python objects ({dtype}), which are never loaded")
    if any(n < 0 for n in shape) or dtype.itemsize == 0:
        raise _npz_error(path, f"member {name!r}: its header claims shape {shape} of {dtype}")
    count = math.prod(shape)
    expected = header + count * dtype.itemsize
    if expected != info.file_size:
        raise _npz_error(path, f"member {name!r}: its header claims shape {shape} of {dtype} "
                               f"({count * dtype.itemsize} bytes), but the member holds {info.file_size - header} "
                               f"bytes of data (truncated or corrupt)")
    return shape, fortran, dtype, header


class NpzReader:
    """An .npz file (np.savez's format) opened for reading, every member's header checked against its stored
    size first, so that a crafted header cannot make NumPy allocate more than the file holds; arrays are read on
    demand (read(name)). ValueError naming the file for anything that is not a well-formed .npz: empty or
    truncated, not a zip archive, a member that is no .npy array, holds Python objects, is encrypted, duplicated
    or damaged. Opening errors of the file itself (FileNotFoundError, PermissionError) pass through. Use it as a
    context manager."""

    def __init__(self, path):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            start = f.read(4)
            size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise _npz_error(self.path, "the file is empty (truncated)")
        try:
            self._zip = zipfile.ZipFile(self.path)
        except zipfile.BadZipFile:
            if start == b"PK\x03\x04":
                raise _npz_error(self.path, "truncated or damaged (a zip archive without its central "
                                            "directory)") from None
            raise _npz_error(self.path, "not an .npz file (not a zip archive)") from None
        except (OSError, EOFError, ValueError, NotImplementedError) as e:
            raise _npz_error(self.path, f"truncated or damaged zip archive ({e})") from None
        try:
            self._members = self._check_members(size)
        except BaseException:
            self._zip.close()
            raise

    def _check_members(self, size) -> dict:
        members = {}
        for info in self._zip.infolist():
            if not info.filename.endswith(".npy"):
                raise _npz_error(self.path, f"member {info.filename!r} is not a .npy array")
            name = info.filename[:-len(".npy")]
            if name in members:
                raise _npz_error(self.path, f"member {name!r} appears twice")
            if info.header_offset + info.compress_size > size:
                raise _npz_error(self.path, f"member {name!r} runs past the end of the file (truncated)")
            try:
                members[name] = (info, _member_header(self._zip, info, self.path))
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError) as e:
                raise _npz_error(self.path, f"member {name!r} is damaged ({e})") from None
        return members

    @property
    def names(self) -> list:
        return list(self._members)

    def __contains__(self, name) -> bool:
        return name in self._members

    def read(self, name) -> np.ndarray:
        """The array of member `name` (KeyError when there is none)."""
        info, (shape, fortran, dtype, header) = self._members[name]
        out = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
        try:
            with self._zip.open(info) as f:
                f.read(header)
                view = memoryview(out.reshape(-1, order="A").view(np.uint8)) if out.nbytes else memoryview(b"")
                got = 0
                while got < len(view):  # in chunks: no second copy of a large member in memory at once
                    n = f.readinto(view[got:got + _CHUNK])
                    if not n:
                        break
                    got += n
                if got != len(view) or f.read(1):
                    raise _npz_error(self.path, f"member {name!r} ends early (truncated)")
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
            raise _npz_error(self.path, f"member {name!r} is damaged ({e})") from None
        return out

    def close(self) -> None:
        self._zip.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def load_checkpoint(path) -> dict:
    """The state dict save_checkpoint wrote (arrays come back as NumPy arrays, tuples as tuples).

    ValueError naming the file for a file that is not such a checkpoint: truncated, not a zip archive, no or a
    malformed tree, a tree that is not an object, another format, a member missing or inconsistent with its
    stored size (see NpzReader). Only the members the tree refers to are read."""
    with NpzReader(path) as z:
        if _TREE not in z:
            raise _npz_error(path, f"not a resnet_native checkpoint (no {_TREE} member)")
        raw = z.read(_TREE)
        try:
            if raw.dtype != np.uint8 or raw.ndim != 1:
                raise ValueError(f"a {raw.dtype} array of shape {raw.shape}")
            meta = json.loads(raw.tobytes().decode())
        except (ValueError, UnicodeDecodeError) as e:
            raise _npz_error(path, f"the {_TREE} member is not UTF-8 JSON ({e})") from None
        except RecursionError:
            raise _npz_error(path, f"the {_TREE} member is nested too deeply") from None
        if not isinstance(meta, dict) or "format" not in meta:
            raise _npz_error(path, f"not a resnet_native checkpoint (unknown format: {_TREE} holds a "
                                   f"{type(meta).__name__} without a 'format')")
        if meta["format"] != FORMAT:
            raise _npz_error(path, f"unsupported checkpoint format {meta['format']!r} (expected {FORMAT})")
        if "tree" not in meta:
            raise _npz_error(path, f"the {_TREE} member has no 'tree'")
        if not isinstance(meta["tree"], dict):
            raise _npz_error(path, f"the checkpoint's tree is not an object (got a {type(meta['tree']).__name__})")
        arrays = {name: (lambda name=name: z.read(name)) for name in z.names if name != _TREE}
        try:
            return _unflatten(meta["tree"], arrays)
        except ValueError as e:
            raise _npz_error(path, str(e)) from None
        except RecursionError:
            raise _npz_error(path, "the checkpoint's tree is nested too deeply") from None
